"""The PyTorch path on CUDA gives the CPU's numbers (skipped where no GPU is present).

The same checks as the start of ``bench/gpu.py``: full distribution, per-example log-probs and
their gradient, one training step and exact top-k, on a multi-code tree. (Out-of-range targets are
not tried here: the device-side assert they raise would leave the CUDA context unusable.)
"""

import copy

import numpy as np
import pytest
import torch

from conftest import multi_code_tree
from hlbl.model import LBL, LBLConfig
from hlbl.config import TrainConfig
from hlbl.engine import train_epoch
from hlbl.optim import make_optimizer
from hlbl.tree import random_tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def model_on(device: str, tree, seed: int = 0) -> LBL:
    model = LBL(LBLConfig(tree.num_words, dim=12, context=3), tree, torch.Generator().manual_seed(seed))
    model.init_unigram(np.arange(1, tree.num_words + 1))
    return model.to(device)


@pytest.mark.parametrize("tree", [multi_code_tree(), random_tree(57, 1)], ids=["multi_code", "random"])
def test_log_probs_and_gradients_match_the_cpu(tree):
    cpu = model_on("cpu", tree).double()
    gpu = copy.deepcopy(cpu).to("cuda")
    V, n = tree.num_words, cpu.config.context
    ctx = torch.randint(0, V, (64, n), generator=torch.Generator().manual_seed(2))
    tgt = torch.randint(0, V, (64,), generator=torch.Generator().manual_seed(3))
    full_c, full_g = cpu.log_prob(ctx), gpu.log_prob(ctx.cuda())
    assert torch.allclose(full_c, full_g.cpu(), atol=1e-10)
    assert torch.allclose(full_g.exp().sum(1), torch.ones(64, dtype=torch.float64, device="cuda"), atol=1e-10)
    cpu(ctx, tgt).loss.backward()
    gpu(ctx.cuda(), tgt.cuda()).loss.backward()
    for (name, a), (_, b) in zip(cpu.named_parameters(), gpu.named_parameters()):
        assert torch.allclose(a.grad, b.grad.cpu(), atol=1e-10), name
    values, ids = gpu.topk(ctx.cuda(), 3)
    ref_v, ref_i = cpu.topk(ctx, 3)
    assert torch.equal(ids.cpu(), ref_i) and torch.allclose(values.cpu(), ref_v, atol=1e-10)


def test_one_epoch_of_training_matches_the_cpu():
    tree = random_tree(40, 0)
    stream = np.random.default_rng(0).integers(0, 40, size=700).astype(np.int32)
    models = {}
    for device in ("cpu", "cuda"):
        cfg = TrainConfig(batch_size=100, device=device, engine="torch", progress=False, lr=0.01)
        model = model_on(device, tree)
        train_epoch(model, make_optimizer(model, cfg, cfg.lr), stream, 0, cfg, 1, False)
        models[device] = model
    for (name, a), (_, b) in zip(models["cpu"].named_parameters(), models["cuda"].named_parameters()):
        assert torch.allclose(a, b.cpu(), atol=1e-5), name

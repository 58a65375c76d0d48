import numpy as np
import pytest
import torch

from conftest import multi_code_tree
from hlbl.model import LBL, LBLConfig
from hlbl.tree import random_tree


@pytest.mark.parametrize("full", [False, True])
def test_context_vector_is_the_weighted_sum(full):
    m = LBL(LBLConfig(6, dim=4, context=3, full_context=full), multi_code_tree(), torch.Generator().manual_seed(0))
    ctx = torch.tensor([[1, 2, 3], [5, 5, 0]])
    r = m.R.weight
    expected = []
    for row in ctx.tolist():
        acc = torch.zeros(4)
        for i, w in enumerate(row):
            acc = acc + (m.C[i] @ r[w] if full else m.C[i] * r[w])
        expected.append(acc)
    assert torch.allclose(m.context_vector(ctx), torch.stack(expected), atol=1e-6)


@pytest.mark.parametrize("output", ["tree", "flat", "adaptive"])
def test_forward_agrees_with_log_prob(output):
    V = 40
    tree = random_tree(V, 0) if output == "tree" else None
    m = LBL(LBLConfig(V, dim=8, output=output), tree, torch.Generator().manual_seed(1))
    m.init_unigram(np.arange(1, V + 1)[::-1])
    ctx, tgt = torch.randint(0, V, (16, 5)), torch.randint(0, V, (16,))
    lp = m.log_prob(ctx)
    assert torch.allclose(lp.exp().sum(1), torch.ones(16), atol=1e-5)
    out = m(ctx, tgt)
    assert torch.allclose(out.output, lp[torch.arange(16), tgt], atol=1e-5)
    assert out.loss.item() == pytest.approx(-out.output.mean().item(), rel=1e-6)


def test_same_seed_same_model():
    a = LBL(LBLConfig(30), random_tree(30, 0), torch.Generator().manual_seed(7))
    b = LBL(LBLConfig(30), random_tree(30, 0), torch.Generator().manual_seed(7))
    c = LBL(LBLConfig(30), random_tree(30, 0), torch.Generator().manual_seed(8))
    for (n, p), q, r in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(p, q)
    assert not torch.equal(a.R.weight, c.R.weight)


def test_param_groups_separate_words_others_biases():
    m = LBL(LBLConfig(30), random_tree(30, 0))
    groups = {g["name"]: g for g in m.param_groups(1e-4, 1e-5)}
    assert groups["words"]["params"] == [m.R.weight]
    assert all(p.dim() == 1 and p.shape[0] == 29 for p in groups["biases"]["params"])
    n = sum(p.numel() for g in groups.values() for p in g["params"])
    assert n == m.num_parameters()


def test_topk_and_generate():
    m = LBL(LBLConfig(30, dim=8), random_tree(30, 0), torch.Generator().manual_seed(0))
    ctx = torch.randint(0, 30, (3, 5))
    lp, idx = m.topk(ctx, 4)
    full = m.log_prob(ctx)
    assert torch.allclose(lp, full.sort(1, descending=True).values[:, :4])
    s1 = m.generate([1, 2], 10, 0, torch.Generator().manual_seed(3))
    s2 = m.generate([1, 2], 10, 0, torch.Generator().manual_seed(3))
    assert s1 == s2 and len(s1) == 10 and all(0 <= w < 30 for w in s1)


def test_generate_conditions_each_word_on_the_words_before_it(monkeypatch):
    V, n, pad = 12, 3, 0
    model = LBL(LBLConfig(V, dim=4, context=n), random_tree(V, 1), torch.Generator().manual_seed(0))
    seen = []
    real = model.context_vector

    def spy(ctx):
        seen.append(ctx[0].tolist())
        return real(ctx)

    monkeypatch.setattr(model, "context_vector", spy)
    prompt = [5, 7]
    out = model.generate(prompt, 6, pad, torch.Generator().manual_seed(3))
    ids = [pad] * n + prompt + out
    assert seen == [ids[i - n : i] for i in range(n + len(prompt), len(ids))]


def test_context_weights_start_near_one_but_not_at_one():
    model = LBL(LBLConfig(50, dim=8, context=4), random_tree(50, 0), torch.Generator().manual_seed(0))
    C = model.C.detach()
    assert (C - 1).abs().mean() < 0.5 and not torch.equal(C, torch.ones_like(C))

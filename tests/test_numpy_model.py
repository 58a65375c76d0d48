"""Inference without torch (hlbl.numpy_model): the same numbers as the torch model, to the bit, from
the library and from the command line, the same checks on the weights file, and no torch imported."""

import io
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import multi_code_tree
from hlbl.checkpoint import load_tensors_and_meta, save_tensors
from hlbl.cli import main
from hlbl.config import LBLConfig
from hlbl.errors import CheckpointError
from hlbl.evaluate import token_log_probs
from hlbl.model import LBL
from hlbl.numpy_model import NumpyLBL, unsupported
from hlbl.run import Run
from hlbl.sampling import TorchUniforms
from hlbl.tree import huffman_tree


def _pair(tree, context: int, dim: int, seed: int):
    """A torch LBL with random weights (larger than at initialisation, so decisions are not all
    near 1/2) and its NumpyLBL from the same state."""
    config = LBLConfig(vocab_size=tree.num_words, dim=dim, context=context)
    g = torch.Generator().manual_seed(seed)
    model = LBL(config, tree, g)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    return model.eval(), NumpyLBL.from_state(config, tree, state)


@pytest.mark.parametrize("context,dim", [(1, 8), (3, 16), (5, 50), (8, 7)])
@pytest.mark.parametrize("tree_name", ["huffman", "multi_code"])
def test_scores_and_top_k_are_the_torch_models_bit_for_bit(tree_name, context, dim):
    counts = np.random.default_rng(1).integers(1, 500, size=300)
    tree = huffman_tree(counts) if tree_name == "huffman" else multi_code_tree()
    model, fast = _pair(tree, context, dim, seed=context * 100 + dim)
    V = tree.num_words
    stream = np.random.default_rng(2).integers(0, V, size=2000).astype(np.int32)
    np.testing.assert_array_equal(fast.token_log_probs(stream, 0), token_log_probs(model, stream, 0))
    ctx = np.random.default_rng(3).integers(0, V, size=(300, context))
    for k in (1, 5, V + 3):  # k > V: every word, best first
        values, ids = fast.topk(ctx, k)
        ref_values, ref_ids = model.topk(torch.from_numpy(ctx), k)
        assert values.dtype == np.float32
        np.testing.assert_array_equal(ids, ref_ids.numpy())
        np.testing.assert_array_equal(values, ref_values.numpy())
    h = fast.context_vectors(ctx)
    np.testing.assert_array_equal(h, model.context_vector(torch.from_numpy(ctx)).detach().numpy())


@pytest.mark.parametrize("tree_name", ["huffman", "multi_code"])
def test_samples_and_the_full_distribution_are_the_torch_models(tree_name):
    """generate under one seed gives the same words on both paths: the walk (T = 1, per-node T)
    and the exact tempered draw from the full distribution, whose rows sum to 1."""
    counts = np.random.default_rng(1).integers(1, 500, size=300)
    tree = huffman_tree(counts) if tree_name == "huffman" else multi_code_tree()
    model, fast = _pair(tree, 3, 16, seed=5)
    ctx = np.random.default_rng(3).integers(0, tree.num_words, size=(20, 3))
    lp = fast.log_prob(ctx)
    np.testing.assert_allclose(lp, model.log_prob(torch.from_numpy(ctx)).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.exp(lp.astype(np.float64)).sum(1), 1.0, atol=1e-5)
    for seed, t, per_node in (
        (0, 1.0, False),
        (3, 1.0, False),
        (3, 0.5, True),
        (4, 0.7, False),
        (2**32 + 4, 1.5, False),
    ):
        want = model.generate([1, 2], 40, 0, torch.Generator().manual_seed(seed), t, per_node)
        got = fast.generate([1, 2], 40, 0, TorchUniforms(seed), t, per_node)
        assert got == want, (seed, t, per_node)
    with pytest.raises(ValueError, match="whole number"):
        fast.generate([1], -1, 0, TorchUniforms(0))


def test_a_model_it_does_not_hold_is_named():
    assert unsupported(LBLConfig(vocab_size=10, output="flat")) and unsupported(LBLConfig(10, full_context=True))
    assert unsupported(LBLConfig(vocab_size=10)) is None
    tree = huffman_tree(np.arange(1, 8))
    model, _ = _pair(tree, 2, 4, 0)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    other = huffman_tree(np.arange(7, 0, -1) ** 2)
    with pytest.raises(ValueError, match="another word tree"):
        NumpyLBL.from_state(model.config, other, state)
    with pytest.raises(ValueError, match="shape"):
        NumpyLBL.from_state(model.config, tree, state).topk(np.zeros((1, 3), np.int64), 2)


def _cli(argv, monkeypatch, capsys, stdin=""):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8"))
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out


def test_the_commands_answer_as_the_torch_model_does(tiny_run, monkeypatch, capsys):
    """predict, score, eval and generate through the numpy model, then through the torch model
    (the run's numpy form refused), print the same text: every digit, every sampled word."""
    run, _, _ = tiny_run
    text = "the big cat eats a fish\n\nthe zebra eats\nthe\n" + "a big " * 40 + "\n"
    commands = [
        (["predict", str(run), "--k", "5", "--json"], text),
        (["predict", str(run), "--k", "1000"], "the big\n"),
        (["score", str(run), "--json", "--per-token"], text),
        (["score", str(run), "--device", "cpu"], text),
        (["eval", str(run), "--split", "valid"], ""),
        (["generate", str(run), "--tokens", "30", "--seed", "4", "--prompt", "the big"], ""),
        (["generate", str(run), "--tokens", "30", "--seed", "4", "--temperature", "0.7"], ""),
        (["generate", str(run), "--tokens", "30", "--seed", "4", "--temperature", "0.7", "--per-node-temperature"], ""),
    ]
    used = []
    real = Run.numpy_model

    def spy(self, which="best"):
        used.append(real(self, which))
        return used[-1]

    monkeypatch.setattr(Run, "numpy_model", spy)
    fast = [_cli(argv, monkeypatch, capsys, stdin) for argv, stdin in commands]
    assert len(used) == len(commands) and all(isinstance(m, NumpyLBL) for m in used)
    monkeypatch.setattr(Run, "numpy_model", lambda self, which="best": None)  # the torch model's answers
    slow = [_cli(argv, monkeypatch, capsys, stdin) for argv, stdin in commands]
    assert [rc for rc, _ in fast] == [0] * len(commands)
    for (_, a), (_, b) in zip(fast, slow):
        assert a == b and a
    assert "perplexity" in json.loads(fast[4][1])


PROBE = """
import json, sys
from hlbl.cli import main
argv = json.loads(sys.argv[1])
sys.stdin = open(sys.argv[2], encoding="utf-8")
code = main(argv)
sys.__stderr__.write("PROBE " + json.dumps({"code": code, "torch": "torch" in sys.modules}) + "\\n")
"""


def _probe(argv, stdin_path):
    res = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), str(stdin_path)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stderr.rsplit("PROBE ", 1)[1])


def test_inference_commands_import_no_torch(tiny_run, tmp_path):
    run, _, _ = tiny_run
    stdin = tmp_path / "in.txt"
    stdin.write_text("the big cat\nthe zebra\n", encoding="utf-8")
    for argv in (
        ["predict", str(run), "--k", "5"],
        ["score", str(run), "--per-token"],
        ["eval", str(run), "--split", "valid", "--threads", "1"],
        ["tree", "stats", str(run)],
        ["generate", str(run), "--tokens", "3"],
        ["generate", str(run), "--tokens", "3", "--temperature", "0.5"],
    ):
        assert _probe(argv, stdin) == {"code": 0, "torch": False}, argv
    # The probe sees torch where a command needs it: training.
    assert _probe(["train", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "r")], stdin) == {
        "code": 2,
        "torch": True,
    }


def test_the_numpy_reader_makes_the_torch_readers_checks(tiny_run, tmp_path):
    run, model, _ = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    weights = copy / "best.safetensors"
    tensors, meta = load_tensors_and_meta(weights)

    def rewrite(**changes):
        save_tensors(weights, {**tensors, **changes}, meta={k: v for k, v in meta.items() if k != "sha256"})

    rewrite(C=torch.full_like(tensors["C"], float("nan")))  # checksum right, values not finite
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        Run.open(copy).numpy_model()
    rewrite()
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x40  # a flipped bit in the last tensor's data (out.weight)
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        Run.open(copy).numpy_model()
    save_tensors(weights, tensors, meta={**meta, "tree_sha256": "0" * 64})
    with pytest.raises(CheckpointError, match="another word tree"):
        Run.open(copy).numpy_model()
    rewrite(C=tensors["C"][:1])
    with pytest.raises(CheckpointError, match="shape"):
        Run.open(copy).numpy_model()
    rewrite(C=tensors["C"].double())
    with pytest.raises(CheckpointError, match="float64"):
        Run.open(copy).numpy_model()
    weights.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        Run.open(copy).numpy_model()
    for which in ("best", "last"):  # and a good file reads as the torch model's weights
        fast, ref = Run.open(run).numpy_model(which), Run.open(run).model(which)
        np.testing.assert_array_equal(fast.Q, ref.out.weight.detach().numpy())
        np.testing.assert_array_equal(fast.R, ref.R.weight.detach().numpy())

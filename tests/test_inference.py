"""Exact tree top-k, sampling and scoring (hlbl.inference), checked against brute force."""

import io
import json
import math
import sys

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from conftest import multi_code_tree, tiny_corpus, unbalanced_tree
from hlbl.cli import main
from hlbl.evaluate import perplexity_report, token_log_probs
from hlbl.inference import (ancestral_sample, full_topk, sample_from_log_prob, score_report, score_sentences,
                            topk_matches, tree_topk)
from hlbl.model import LBL, LBLConfig
from hlbl.output import TreeSoftmax
from hlbl.tree import TreeError, WordTree, balanced_tree, huffman_tree, random_tree

from hlbl.treebuild import build_tree_from_features


# ---- trees and references ---------------------------------------------------------------------


def _halve(block):
    """Nested pairs of the recursive halving of a list of word ids (first half left)."""
    if len(block) == 1:
        return int(block[0])
    h = (len(block) + 1) // 2
    return (_halve(block[:h]), _halve(block[h:]))


def duplicated_tree(V: int, extra: int, seed: int) -> WordTree:
    """A random multi-code tree: every word once plus ``extra`` random repeats, shuffled."""
    rng = np.random.default_rng(seed)
    while True:
        slots = rng.permutation(np.concatenate([np.arange(V), rng.choice(V, extra)]))
        try:
            return WordTree.from_nested(_halve(slots), V)
        except TreeError:  # two leaves of one word under one node; draw again
            continue


def x2_tree(V: int, seed: int) -> WordTree:
    """The paper's x2 construction on random trees: two trees under a new root (2 codes per word)."""
    rng = np.random.default_rng(seed)
    return WordTree.from_nested((_halve(rng.permutation(V)), _halve(rng.permutation(V))), V)


def sorted_balanced_tree(V: int, seed: int) -> WordTree:
    """A 'learned-like' BALANCED tree: words sorted along a direction of random word vectors."""
    X = np.random.default_rng(seed).normal(size=(V, 5))
    return balanced_tree(np.argsort(X @ np.ones(5), kind="stable"))


def search_trees() -> dict:
    V = 300
    counts = np.random.default_rng(0).zipf(1.3, V).astype(float)
    trees = {
        "random": random_tree(V, 3),
        "huffman": huffman_tree(counts),
        "sorted_balanced": sorted_balanced_tree(V, 1),
        "duplicated": duplicated_tree(V, 150, 2),
        "x2": x2_tree(V, 4),
        "unbalanced_small": unbalanced_tree(),
        "multi_code_small": multi_code_tree(),
    }
    X = np.random.default_rng(5).normal(size=(V, 8))
    trees["learned_adaptive"] = build_tree_from_features(X, "adaptive", seed=0)
    trees["learned_adaptive0.4_x2"] = build_tree_from_features(X, "adaptive:0.4", seed=0, copies=2,
                                                               max_leaves=450)
    return trees


TREES = search_trees()


def reference_log_prob(tree: WordTree, W: np.ndarray, b: np.ndarray, H: np.ndarray, rows: int = 100) -> np.ndarray:
    """(B, V) float64 log P(w | h) by enumerating every root-to-leaf path (numpy, independent
    of TreeSoftmax): leaf log-prob = sum of log sigmoid(+-s) along its path, word = logsumexp
    over its leaves. Done ``rows`` contexts at a time to bound the (rows, L, D) temporary."""
    sign = np.where(tree.path_bits == 1, 1.0, -1.0)  # (L, D)
    wl = tree.word_leaves  # (V, K), -1 padded
    out = []
    for i in range(0, len(H), rows):
        S = H[i : i + rows] @ W.T + b  # (r, N)
        logsig = -np.logaddexp(0.0, -S[:, tree.path_nodes] * sign)  # (r, L, D)
        leaf = np.where(tree.path_mask, logsig, 0.0).sum(-1)  # (r, L)
        per_word = np.where(wl >= 0, leaf[:, np.maximum(wl, 0)], -np.inf)  # (r, V, K)
        m = per_word.max(-1, keepdims=True)
        out.append((m + np.log(np.exp(per_word - m).sum(-1, keepdims=True)))[..., 0])
    return np.concatenate(out)


def random_layer(tree: WordTree, d: int, seed: int, scale: float, dtype=torch.float32):
    """A TreeSoftmax with N(0, 1) weights and biases, and 1000 contexts (float64) of std ``scale``.

    The search reads float32 weights as they are and computes in float64, so its reference is
    the float64 enumeration over the same (widened) weights: agreement to 1e-10 is expected."""
    g = torch.Generator().manual_seed(seed)
    layer = TreeSoftmax(d, tree).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64))
        layer.bias.copy_(torch.randn(layer.bias.shape, generator=g, dtype=torch.float64))
    H = torch.randn(1000, d, generator=g, dtype=torch.float64) * scale
    return layer, H


def reference_for(layer, H) -> torch.Tensor:
    W = layer.weight.detach().double().numpy()
    b = layer.bias.detach().double().numpy()
    return torch.from_numpy(reference_log_prob(layer.tree, W, b, H.numpy()))


# ---- exact top-k ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.05])  # peaked and nearly flat distributions
@pytest.mark.parametrize("name", list(TREES))
def test_topk_equals_brute_force(name, scale):
    tree = TREES[name]
    layer, H = random_layer(tree, 12, seed=len(name), scale=scale)
    ref = reference_for(layer, H)
    V = tree.num_words
    for k in sorted({1, 3, 10, V}):
        rows = len(H) if k < V else 200  # all V words: the search resolves everything, slower
        res = tree_topk(tree, layer.weight, layer.bias, H[:rows], k)
        kk = min(k, V)
        assert res.values.shape == (rows, kk) and res.indices.shape == (rows, kk)
        assert topk_matches(res.values, res.indices, ref[:rows], atol=1e-10)
        # Ids equal the stable sort of the reference wherever no near-tie blurs the order.
        sv, si = torch.sort(ref[:rows], dim=1, descending=True, stable=True)
        gaps = (sv[:, :-1] - sv[:, 1:])[:, : min(kk, V - 1)]
        clear = (gaps > 1e-9).all(1)
        assert clear.float().mean() > 0.9
        assert torch.equal(res.indices[clear], si[clear, :kk])
        assert (res.nodes >= 1).all() and (res.nodes <= tree.num_nodes).all()
        if k >= V and tree.codes_per_word.max() == 1:
            assert (res.nodes == tree.num_nodes).all()  # all words wanted: every node scored


def test_topk_prunes_on_a_peaked_distribution():
    """With the decisions saturated towards one leaf, top-1 scores exactly that leaf's path."""
    tree = random_tree(257, 0)
    layer = TreeSoftmax(4, tree)
    target_leaf = int(tree.word_leaves[123, 0])
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.fill_(30.0)  # elsewhere: go left confidently
        m = tree.path_mask[target_leaf]
        nodes, bits = tree.path_nodes[target_leaf][m], tree.path_bits[target_leaf][m]
        layer.bias[torch.from_numpy(nodes)] = torch.from_numpy(np.where(bits == 1, 30.0, -30.0)).float()
    res = tree_topk(tree, layer.weight, layer.bias, torch.zeros(3, 4, dtype=torch.float64), 1)
    assert (res.indices[:, 0] == 123).all()
    assert (res.nodes == len(nodes)).all()


@pytest.mark.parametrize("tree", [balanced_tree(np.random.default_rng(0).permutation(16)), x2_tree(16, 1)],
                         ids=["single", "x2"])
def test_ties_rank_the_lower_word_id_first(tree):
    layer = TreeSoftmax(3, tree)  # zero weights and biases: every word has probability 1/16
    with torch.no_grad():
        layer.bias.zero_()
    res = tree_topk(tree, layer.weight, layer.bias, torch.zeros(2, 3), 5)
    assert res.indices.tolist() == [[0, 1, 2, 3, 4]] * 2
    assert torch.allclose(res.values, torch.full((2, 5), -math.log(16)))
    assert full_topk(torch.zeros(1, 16), 3)[1].tolist() == [[0, 1, 2]]


def test_multi_code_word_spread_over_many_small_leaves_wins():
    """Word 0 has 8 leaves of 1/16 each (P = 1/2); no single leaf of it beats the others' leaves,
    so a leaf-level search would rank it last among equals. Ties among 1..8 go to lower ids."""
    tree = WordTree.from_nested(_halve([0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8]), 9)
    layer = TreeSoftmax(2, tree)
    with torch.no_grad():
        layer.bias.zero_()
    res = tree_topk(tree, layer.weight, layer.bias, torch.zeros(1, 2, dtype=torch.float64), 3)
    assert res.indices.tolist() == [[0, 1, 2]]
    assert torch.allclose(res.values.exp(), torch.tensor([[0.5, 1 / 16, 1 / 16]], dtype=torch.float64))


def test_batching_and_threads_do_not_change_results():
    tree = TREES["duplicated"]
    layer, H = random_layer(tree, 12, seed=9, scale=1.0)
    H = H[:150]
    whole = tree_topk(tree, layer.weight, layer.bias, H, 7, threads=1)
    one = tree_topk(tree, layer.weight, layer.bias, H, 7, threads=2)
    rows = [tree_topk(tree, layer.weight, layer.bias, H[i : i + 1], 7) for i in (0, 77, 149)]
    for a, b in ((whole, one),):
        assert torch.equal(a.values, b.values) and torch.equal(a.indices, b.indices) and torch.equal(a.nodes, b.nodes)
    for i, r in zip((0, 77, 149), rows):
        assert torch.equal(r.indices[0], whole.indices[i]) and int(r.nodes[0]) == int(whole.nodes[i])


def test_topk_rejects_bad_arguments():
    tree = random_tree(10, 0)
    layer = TreeSoftmax(4, tree)
    with pytest.raises(ValueError, match="k must be"):
        tree_topk(tree, layer.weight, layer.bias, torch.zeros(1, 4), 0)
    with pytest.raises(ValueError, match="whole number"):
        tree_topk(tree, layer.weight, layer.bias, torch.zeros(1, 4), 2.7)
    with pytest.raises(ValueError, match="features"):
        tree_topk(tree, layer.weight, layer.bias, torch.zeros(1, 5), 1)
    assert tree_topk(tree, layer.weight, layer.bias, torch.zeros(0, 4), 3).values.shape == (0, 3)


@pytest.mark.parametrize("output", ["tree", "flat", "adaptive"])
def test_model_topk_dispatch_matches_the_full_distribution(output):
    tree = duplicated_tree(60, 30, 7) if output == "tree" else None
    model = LBL(LBLConfig(60, dim=10, context=3, output=output, init_std=1.0), tree, torch.Generator().manual_seed(0))
    ctx = torch.randint(0, 60, (300, 3), generator=torch.Generator().manual_seed(1))
    values, idx = model.topk(ctx, 5)
    full = model.log_prob(ctx)
    assert topk_matches(values, idx, full, atol=1e-4)


# ---- full distribution ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["huffman", "duplicated", "x2", "multi_code_small"])
def test_full_log_prob_matches_enumeration_and_normalises(name):
    tree = TREES[name]
    layer, H = random_layer(tree, 12, seed=3, scale=1.0, dtype=torch.float64)
    H = H[:200]
    lp = layer.log_prob(H)
    ref = reference_log_prob(tree, layer.weight.detach().numpy(), layer.bias.detach().numpy(), H.numpy())
    assert np.allclose(lp.detach().numpy(), ref, atol=1e-10)
    assert torch.allclose(lp.exp().sum(1), torch.ones(len(H), dtype=torch.float64), atol=1e-12)
    words = torch.arange(tree.num_words).repeat(3)
    assert torch.allclose(layer.target_log_prob(H[:3].repeat_interleave(tree.num_words, 0), words),
                          lp[:3].reshape(-1), atol=1e-10)


# ---- sampling ---------------------------------------------------------------------------------


def _counts(words: torch.Tensor, V: int) -> np.ndarray:
    return np.bincount(words.numpy(), minlength=V)


def _chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    probs = np.asarray(probs, dtype=np.float64)
    expected = probs / probs.sum() * counts.sum()
    return float(chisquare(counts, expected).pvalue)


@pytest.fixture(scope="module")
def sampling_layer():
    tree = duplicated_tree(30, 20, 11)
    layer, H = random_layer(tree, 6, seed=12, scale=0.7)
    return tree, layer, H[:1].float().repeat(60_000, 1)


def test_ancestral_sampling_matches_the_exact_multi_code_distribution(sampling_layer):
    tree, layer, H = sampling_layer
    assert tree.codes_per_word.max() >= 2
    with torch.no_grad():
        p = layer.log_prob(H[:1])[0].exp().numpy()
        words = ancestral_sample(tree, layer.weight, layer.bias, H, torch.Generator().manual_seed(0))
    counts = _counts(words, tree.num_words)
    assert _chi2_p(counts, p) > 1e-3
    assert 0.5 * np.abs(counts / counts.sum() - p).sum() < 0.01
    # The test can fail: the distribution of the first leaf only (renormalised) is rejected.
    first = np.zeros(tree.num_words)
    for w in range(tree.num_words):
        first[w] = math.exp(float(layer.path_log_probs(H[:1], torch.tensor([w]))[0, 0].detach()))
    assert _chi2_p(counts, first) < 1e-6


def test_temperature_exact_and_per_node_are_different_distributions(sampling_layer):
    tree, layer, H = sampling_layer
    T = 0.5
    with torch.no_grad():
        lp = layer.log_prob(H[:1])[0]
        exact = torch.softmax(lp / T, 0).numpy()
        hot = TreeSoftmax(6, tree)  # per-node T = every score divided by T
        hot.weight.copy_(layer.weight / T)
        hot.bias.copy_(layer.bias / T)
        per_node = hot.log_prob(H[:1])[0].exp().numpy()
        s_exact = _counts(layer.sample(H, torch.Generator().manual_seed(1), T), tree.num_words)
        s_node = _counts(layer.sample(H, torch.Generator().manual_seed(2), T, per_node=True), tree.num_words)
    assert _chi2_p(s_exact, exact) > 1e-3 and _chi2_p(s_node, per_node) > 1e-3
    assert _chi2_p(s_exact, per_node) < 1e-6 and _chi2_p(s_node, exact) < 1e-6


def test_sampling_is_reproducible_and_checks_temperature(sampling_layer):
    tree, layer, H = sampling_layer
    a = ancestral_sample(tree, layer.weight, layer.bias, H[:500], torch.Generator().manual_seed(5))
    b = ancestral_sample(tree, layer.weight, layer.bias, H[:500], torch.Generator().manual_seed(5))
    c = ancestral_sample(tree, layer.weight, layer.bias, H[:500], torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError, match="temperature"):
        sample_from_log_prob(torch.zeros(1, 3), None, 0.0)
    # A tiny temperature is the argmax, not NaN (lp / T alone would be -inf for every word).
    lp = torch.log_softmax(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 1.0]]), dim=1)
    assert sample_from_log_prob(lp, torch.Generator().manual_seed(0), 1e-320).tolist() == [1, 0]


@pytest.mark.parametrize("output", ["tree", "flat"])
def test_generate_is_reproducible(output):
    tree = random_tree(40, 0) if output == "tree" else None
    model = LBL(LBLConfig(40, dim=8, context=3, output=output), tree, torch.Generator().manual_seed(0))
    runs = [model.generate([1, 2], 30, 0, torch.Generator().manual_seed(s), temperature=t)
            for s, t in ((3, 1.0), (3, 1.0), (4, 1.0), (3, 0.7))]
    assert runs[0] == runs[1] and runs[0] != runs[2] and runs[0] != runs[3]
    assert all(len(r) == 30 and all(0 <= w < 40 for w in r) for r in runs)


# ---- scoring ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference")
    data = tiny_corpus(root / "corpus", n_train=200)
    rc = main(["train", "--data", str(data), "--out", str(root / "run"), "--epochs", "1", "--dim", "8",
               "--context", "3", "--tree", "huffman", "--quiet", "--device", "cpu"])
    assert rc == 0
    from hlbl.checkpoint import load_model

    model, vocab, _ = load_model(root / "run")
    return root / "run", model, vocab


def test_score_sentences_follows_the_protocol(tiny_run, capsys):
    capsys.readouterr()
    _, model, vocab = tiny_run
    sents = ["the big cat eats a fish", "the zebra eats", ""]
    scores = score_sentences(model, vocab, sents)
    for sent, sc in zip(sents, scores):
        ids = vocab.encode(sent.split()) + [vocab.eos]
        ref = token_log_probs(model, np.asarray(ids, dtype=np.int32), vocab.eos)  # own stream: <eos> padding
        assert sc.tokens == len(ids)
        assert sc.log10_prob == pytest.approx(ref.sum() / math.log(10), rel=1e-6)  # float32 model
    assert [s.oov for s in scores] == [0, 1, 0]
    rep = score_report(scores)
    lp = np.concatenate([token_log_probs(model, np.asarray(vocab.encode(s.split()) + [vocab.eos], dtype=np.int32),
                                         vocab.eos) for s in sents])
    assert rep["perplexity"] == pytest.approx(perplexity_report(lp)["perplexity"], rel=1e-6)
    assert rep["oov"] == 1 and rep["tokens"] == 7 + 4 + 1


# ---- CLI --------------------------------------------------------------------------------------


def _run(argv, monkeypatch, capsys, stdin=""):
    stdin = stdin.encode() if isinstance(stdin, str) else stdin
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    capsys.readouterr()
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_generate(tiny_run, monkeypatch, capsys):
    run, _, vocab = tiny_run
    base = ["generate", str(run), "--tokens", "25", "--device", "cpu", "--prompt", "the big"]
    rc, a, _ = _run(base + ["--seed", "1"], monkeypatch, capsys)
    _, b, _ = _run(base + ["--seed", "1"], monkeypatch, capsys)
    _, c, _ = _run(base + ["--seed", "2"], monkeypatch, capsys)
    assert rc == 0 and a == b and a != c and a.startswith("the big")
    words = a.split()[2:]
    assert set(words) <= set(vocab.words) and len(words) + a.count("\n") >= 25 - 1
    for extra in (["--temperature", "0.5"], ["--temperature", "0.5", "--per-node-temperature"]):
        assert _run(base + extra, monkeypatch, capsys)[0] == 0
    for bad in ("0", "inf", "nan"):
        rc, _, err = _run(base + ["--temperature", bad], monkeypatch, capsys)
        assert rc == 2 and err.count("\n") == 1 and "temperature" in err


def test_cli_score(tiny_run, monkeypatch, capsys):
    run, model, vocab = tiny_run
    text = "the big cat eats a fish\n\nthe zebra eats\n"
    rc, out, _ = _run(["score", str(run), "--device", "cpu"], monkeypatch, capsys, text)
    lines = out.strip().split("\n")
    assert rc == 0 and len(lines) == 3  # blank line skipped, then the summary
    ref = score_sentences(model, vocab, ["the big cat eats a fish", "the zebra eats"])
    for line, sc in zip(lines[:2], ref):
        lp, n, oov = line.split("\t")
        assert float(lp) == pytest.approx(sc.log10_prob, abs=1e-5) and int(n) == sc.tokens and int(oov) == sc.oov
    summary = json.loads(lines[2])
    assert summary["oov"] == 1 and summary["sentences"] == 2 and summary["tokens"] == 11
    assert summary["perplexity"] == pytest.approx(score_report(ref)["perplexity"], rel=1e-9)
    rc, out, _ = _run(["score", str(run), "--json"], monkeypatch, capsys, text)
    assert [json.loads(x)["tokens"] for x in out.strip().split("\n")] == [7, 4, 11]
    rc, _, err = _run(["score", str(run)], monkeypatch, capsys, "\n")
    assert rc == 2 and "no sentences" in err


def test_cli_predict(tiny_run, monkeypatch, capsys):
    run, model, vocab = tiny_run
    rc, out, _ = _run(["predict", str(run), "--k", "4", "--json"], monkeypatch, capsys, "the big\n\nthe zebra\n")
    rows = [json.loads(x) for x in out.strip().split("\n")]
    assert rc == 0 and len(rows) == 3 and [r["oov"] for r in rows] == [0, 0, 1]
    n = model.config.context
    ctx = torch.tensor([[vocab.eos] * (n - 2) + vocab.encode(["the", "big"])])
    values, idx = model.topk(ctx, 4)
    assert rows[0]["words"] == vocab.decode(idx[0].tolist())
    assert rows[0]["probs"] == pytest.approx(values[0].exp().tolist(), rel=1e-5)
    assert all(r["probs"] == sorted(r["probs"], reverse=True) for r in rows)
    rc, out, _ = _run(["predict", str(run), "--k", "2"], monkeypatch, capsys, "the big\n")
    assert rc == 0 and out.split()[::2] == rows[0]["words"][:2]
    rc, _, err = _run(["predict", str(run), "--k", "0"], monkeypatch, capsys, "the\n")
    assert rc == 2 and err.count("\n") == 1


def test_cli_stdin_is_read_like_a_corpus_file(tiny_run, monkeypatch, capsys):
    """Strict UTF-8 whatever the locale (one error line), and the files' line ends (a lone \\r too)."""
    run, _, _ = tiny_run
    rc, _, err = _run(["score", str(run)], monkeypatch, capsys, b"the big\ncaf\xe9 cat\n")
    assert rc == 2 and err.count("\n") == 1 and "not UTF-8" in err and "0xe9" in err
    _, crlf, _ = _run(["score", str(run), "--json"], monkeypatch, capsys, b"\xef\xbb\xbfthe big\r\nthe cat\rthe fish\n")
    _, lf, _ = _run(["score", str(run), "--json"], monkeypatch, capsys, b"the big\nthe cat\nthe fish\n")
    assert crlf == lf and len(lf.strip().split("\n")) == 4  # 3 sentences and the summary
    rc, _, err = _run(["score", str(run)], monkeypatch, capsys, b"the big\nthe cat\r\nthe caf\xe9\n" + b"a\n" * 5000)
    assert rc == 2 and "line 3: byte 0xe9 at byte 8" in err  # the line itself, not where decoding had got to


class _Trickle(io.RawIOBase):
    """A pipe that delivers one byte per read: every line end falls between two reads somewhere."""

    def __init__(self, data: bytes):
        self.data = data

    def readable(self):
        return True

    def readinto(self, b):
        if not self.data:
            return 0
        b[0], self.data = self.data[0], self.data[1:]
        return 1


def test_cli_stdin_lines_split_across_reads(tiny_run, monkeypatch, capsys):
    run, _, _ = tiny_run
    text = "\ufeffthe big\r\nthe cat\rthe fish\n\nthe zebra".encode()
    _, whole, _ = _run(["score", str(run), "--json"], monkeypatch, capsys, text)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(_Trickle(text)), encoding="utf-8"))
    assert main(["score", str(run), "--json"]) == 0
    assert capsys.readouterr().out == whole and len(whole.strip().split("\n")) == 5


def test_cli_predict_answers_a_line_before_the_next_arrives(tiny_run):
    """A program driving `hlbl predict` through a pipe gets each answer before it sends more."""
    import subprocess
    import threading

    run, _, _ = tiny_run
    proc = subprocess.Popen([sys.executable, "-m", "hlbl", "predict", str(run), "--device", "cpu", "--k", "2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(60, proc.kill)  # an answer that never comes fails the test, not hangs it
    watchdog.start()
    try:
        for context in ("the big", "the cat"):
            proc.stdin.write(context + "\n")
            proc.stdin.flush()
            assert len(proc.stdout.readline().split()) == 4  # two words and their probabilities
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
        watchdog.cancel()
    assert proc.returncode == 0


def test_cli_predict_notes_unknown_context_words(tiny_run, monkeypatch, capsys):
    run, _, _ = tiny_run
    rc, _, err = _run(["predict", str(run)], monkeypatch, capsys, "the zebra\nqqq the\n")
    assert rc == 0 and "2 context word(s) not in the vocabulary" in err


def test_cli_output_into_a_closed_pipe_ends_quietly(tiny_run, tmp_path):
    import subprocess

    run, _, _ = tiny_run
    cmd = f"{sys.executable} -m hlbl generate {run} --tokens 30000 --device cpu | head -c 10"
    res = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True, timeout=120)
    assert res.returncode == 141 and res.stderr == "" and len(res.stdout) == 10


def test_sampling_refuses_a_distribution_without_mass():
    for bad in (torch.full((1, 4), float("nan")), torch.full((1, 4), -float("inf"))):
        with pytest.raises(ValueError, match="cannot sample"):
            sample_from_log_prob(bad, torch.Generator().manual_seed(0), 0.7)


def test_nan_weights_give_nan_or_an_error_never_a_plausible_answer():
    tree = duplicated_tree(12, 5, 0)  # multi-code: top-k resolves words through their several paths
    layer = TreeSoftmax(4, tree)
    with torch.no_grad():
        layer.weight.normal_(generator=torch.Generator().manual_seed(0))
        layer.weight[0, 0] = float("nan")  # the root: every path
    h = torch.ones(3, 4)
    assert torch.isnan(tree_topk(tree, layer.weight, layer.bias, h, 3).values).all()
    with pytest.raises(ValueError, match="cannot sample"):
        ancestral_sample(tree, layer.weight, layer.bias, h, torch.Generator().manual_seed(0))


def test_generate_needs_a_whole_token_count():
    model = LBL(LBLConfig(10, dim=4, context=2), random_tree(10, 0), torch.Generator().manual_seed(0))
    for bad in (3.0, -1, True):
        with pytest.raises(ValueError, match="num_tokens"):
            model.generate([1], bad, 0)

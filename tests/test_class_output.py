"""The class-based output layer (a two-level tree): exact probabilities against enumeration,
gradients, exact top-k, sampling, the structure file, the builders, and the CLI end to end."""

import io
import json
import math
import sys

import numpy as np
import pytest
import torch

from conftest import tiny_corpus, toy_record
from hlbl import checkpoint as ckpt
from hlbl import run as hrun
from hlbl.classes import WordClasses, frequency_classes, kmeans, kmeans_classes
from hlbl.cli import main
from hlbl.data import load_corpus
from hlbl.errors import TreeError
from hlbl.evaluate import evaluate
from hlbl.model import LBL, LBLConfig
from hlbl.output import OUTPUT_KINDS, ClassSoftmax, make_output_layer
from hlbl.search import full_topk, topk_matches

V, D = 13, 4


def structures():
    return {
        # plain classes, one membership each
        "classes": WordClasses(V, [], [[0, 1, 2], [3, 4, 5, 6, 7], [8], [9, 10, 11, 12]]),
        # a shortlist under the root
        "shortlist": WordClasses(V, [0, 5], [[1, 2, 3], [4, 6, 7, 8], [9, 10, 11, 12]]),
        # several memberships: 3 in two classes, 0 in the shortlist and a class, 12 in three places
        "multi": WordClasses(V, [0, 5, 12], [[1, 2, 3], [4, 6, 7, 8, 3, 12], [9, 10, 11, 12, 0]]),
        # a class of one word, and every word in the shortlist but one
        "edge": WordClasses(V, list(range(12)), [[12]]),
    }


def random_layer(classes, seed=0, dtype=torch.float64, member_dim=None):
    g = torch.Generator().manual_seed(seed)
    layer = ClassSoftmax(D, classes, member_dim=member_dim).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
    return layer, torch.randn(9, D, generator=g, dtype=dtype)


def brute_force_log_prob(classes, layer, h):
    """Plain-Python reference from the class lists: sum over memberships of P(root) P(member)."""
    rw, rb = layer.root_weight.tolist(), layer.root_bias.tolist()
    ww, wb = layer.word_weight.tolist(), layer.word_bias.tolist()
    proj = layer.member_proj.weight.tolist() if layer.member_proj is not None else None
    S = len(classes.shortlist)
    out = []
    for x in h.tolist():
        xm = [sum(a * b for a, b in zip(row, x)) for row in proj] if proj else x  # what members read
        root = [sum(a * b for a, b in zip(rw[r], x)) + rb[r] for r in range(len(rw))]
        zr = sum(math.exp(s) for s in root)
        probs = [0.0] * classes.num_words
        for i, w in enumerate(classes.shortlist.tolist()):
            probs[w] += math.exp(root[i]) / zr
        row = 0
        for c, members in enumerate(classes.classes):
            scores = [sum(a * b for a, b in zip(ww[row + j], xm)) + wb[row + j] for j in range(len(members))]
            zc = sum(math.exp(s) for s in scores)
            for j, w in enumerate(members.tolist()):
                probs[w] += math.exp(root[S + c]) / zr * math.exp(scores[j]) / zc
            row += len(members)
        out.append([math.log(p) for p in probs])
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("name", structures())
def test_distribution_sums_to_one_and_matches_enumeration(name):
    classes = structures()[name]
    layer, h = random_layer(classes)
    lp = layer.log_prob(h)
    assert lp.shape == (9, V)
    assert torch.allclose(lp.exp().sum(1), torch.ones(9, dtype=torch.float64), atol=1e-12)
    ref = brute_force_log_prob(classes, layer, h)
    assert torch.allclose(lp, ref, atol=1e-10)
    targets = torch.tensor([0, 3, 12, 5, 1, 9, 12, 8, 3])
    out = layer(h, targets)
    assert torch.allclose(out.output, ref[torch.arange(9), targets], atol=1e-10)
    assert out.loss.item() == pytest.approx(-ref[torch.arange(9), targets].mean().item())
    f32, h32 = random_layer(classes, dtype=torch.float32)
    assert torch.allclose(f32.log_prob(h32).exp().sum(1), torch.ones(9), atol=1e-5)


def test_a_word_in_several_places_sums_its_memberships():
    classes = structures()["multi"]
    layer, h = random_layer(classes)
    leaf = layer.leaf_log_prob(h).exp()  # (B, L)
    word = layer.log_prob(h).exp()
    for w in (0, 3, 12):
        leaves = np.flatnonzero(classes.leaf_word == w)
        assert len(leaves) >= 2
        assert torch.allclose(word[:, w], leaf[:, leaves].sum(1), atol=1e-12)
    assert classes.codes_per_word[12] == 3


@pytest.mark.parametrize("name", structures())
def test_gradients_equal_autograd_and_finite_differences(name):
    """target_log_prob has a hand-written backward (per class); log_prob is plain autograd."""
    classes = structures()[name]
    layer, h = random_layer(classes)
    targets = torch.tensor([0, 3, 12, 5, 1, 9, 12, 8, 3])
    weights = torch.arange(1.0, 10.0, dtype=torch.float64)  # unequal weights per example

    def grads(f):
        layer.zero_grad()
        x = h.clone().requires_grad_(True)
        (f(x) * weights).sum().backward()
        return [p.grad.clone() for p in layer.parameters()] + [x.grad]

    fast = grads(lambda x: layer.target_log_prob(x, targets))
    ref = grads(lambda x: layer.log_prob(x)[torch.arange(9), targets])
    for a, b in zip(fast, ref):
        assert torch.allclose(a, b, atol=1e-10)
    names = [n for n, _ in layer.named_parameters()]

    def f(x, *params):
        out = torch.func.functional_call(layer, dict(zip(names, params)), (x, targets))
        return out.output

    args = (h.clone().requires_grad_(True), *[p.detach().clone().requires_grad_(True) for p in layer.parameters()])
    assert torch.autograd.gradcheck(f, args, fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_numba_kernels_equal_the_pytorch_loop(monkeypatch, dtype):
    classes = structures()["multi"]
    layer, h = random_layer(classes, dtype=dtype)
    targets = torch.tensor([0, 3, 12, 5, 1, 9, 12, 8, 3])
    results = []
    for kernels in (True, False):
        monkeypatch.setattr("hlbl.output.classes.USE_KERNELS", kernels)
        layer.zero_grad()
        x = h.clone().requires_grad_(True)
        lp = layer.target_log_prob(x, targets)
        (lp * torch.arange(1.0, 10.0, dtype=dtype)).sum().backward()
        results.append([lp.detach(), x.grad] + [p.grad.clone() for p in layer.parameters()])
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=tol)


@pytest.mark.parametrize("name", structures())
def test_topk_is_exact(name):
    classes = structures()[name]
    layer, h = random_layer(classes, seed=3)
    lp = layer.log_prob(h)
    for k in (1, 2, 5, V, V + 4):
        values, idx = layer.topk(h, k)
        assert values.shape == (9, min(k, V))
        assert topk_matches(values, idx, lp, atol=1e-10)
        ref_v, ref_i = full_topk(lp, k)
        assert torch.equal(idx, ref_i)  # random weights: no ties
    with pytest.raises(ValueError):
        layer.topk(h, 0)


def test_topk_breaks_ties_by_word_id_and_sees_words_split_over_classes():
    # zero weights and biases: root entries equal, so every word's probability is a sum of shares
    classes = structures()["multi"]
    layer = ClassSoftmax(D, classes).double()
    h = torch.zeros(2, D, dtype=torch.float64)
    values, idx = layer.topk(h, V)
    ref_v, ref_i = full_topk(layer.log_prob(h), V)
    assert torch.allclose(values, ref_v, atol=1e-12)
    assert torch.equal(idx, ref_i)
    assert idx[0, 0] == 12  # word 12: the shortlist and two classes, the largest total


def test_init_unigram_gives_the_unigram_distribution():
    counts = np.arange(1, V + 1) ** 2
    for classes in structures().values():
        layer = ClassSoftmax(D, classes).double()
        layer.init_unigram(counts)
        p = layer.log_prob(torch.randn(3, D, dtype=torch.float64)).exp()
        assert torch.allclose(p, torch.tensor(counts / counts.sum()).expand(3, V), atol=1e-12)


def test_sampling_follows_the_distribution_and_is_reproducible():
    classes = structures()["multi"]
    layer, h = random_layer(classes, seed=1)
    x = h[:1].expand(8000, D)
    a = layer.sample(x, torch.Generator().manual_seed(5))
    b = layer.sample(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=V).double() / len(a)
    p = layer.log_prob(h[:1]).exp()[0]
    assert (freq - p).abs().max() < 0.03
    # tempered: exact distribution p^(1/T) via log_prob; per-node: T at both decisions
    t = layer.sample(x, torch.Generator().manual_seed(5), temperature=0.5)
    pt = p**2 / (p**2).sum()
    assert (torch.bincount(t, minlength=V).double() / len(t) - pt).abs().max() < 0.03
    n = layer.sample(x, torch.Generator().manual_seed(5), temperature=0.5, per_node=True)
    assert n.shape == (8000,) and int(n.min()) >= 0 and int(n.max()) < V
    with pytest.raises(ValueError):
        layer.sample(x, None, temperature=0.0)


# ---- the structure ---------------------------------------------------------------------------


def test_structure_arrays_and_save_load(tmp_path):
    classes = structures()["multi"]
    assert classes.num_root == 6 and classes.num_leaves == 3 + 14
    assert classes.leaf_root.tolist()[:4] == [0, 1, 2, 3]
    assert classes.class_start.tolist() == [0, 3, 9, 14]
    path = tmp_path / "c.json"
    classes.save(path)
    again = WordClasses.load(path)
    assert again.fingerprint() == classes.fingerprint()
    assert again.to_json() == classes.to_json()
    # the order of members is the order of parameter rows: it is part of the fingerprint
    swapped = WordClasses(V, [0, 5, 12], [[2, 1, 3], [4, 6, 7, 8, 3, 12], [9, 10, 11, 12, 0]])
    assert swapped.fingerprint() != classes.fingerprint()
    stats = classes.stats()
    assert stats["classes"] == 3 and stats["shortlist"] == 3 and stats["leaves"] == 17


@pytest.mark.parametrize(
    "obj,message",
    [
        ({"format": "hlbl-word-tree", "version": 1}, "not hlbl word classes"),
        ({"format": "hlbl-word-classes", "version": 9, "num_words": 3, "shortlist": [], "classes": []}, "version"),
        ({"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [0]}, "no 'classes'"),
        ({"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [0], "classes": [[1, 5]]}, "5"),
        (
            {"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [0], "classes": [[1, 1, 2]]},
            "twice",
        ),
        ({"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [0], "classes": [[1]]}, "word 2"),
        (
            {"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [0], "classes": [[1, 2], []]},
            "empty",
        ),
        (
            {"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [0], "classes": [[1, 2.0]]},
            "integer",
        ),
        (
            {"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [], "classes": [[0, 1, 2]]},
            "two entries",
        ),
        (
            {"format": "hlbl-word-classes", "version": 1, "num_words": "3", "shortlist": [], "classes": [[0], [1, 2]]},
            "integer",
        ),
        (
            {"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [True], "classes": [[1, 2]]},
            "integer",
        ),
        ({"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [0], "classes": {"a": 1}}, "list"),
    ],
)
def test_bad_structure_files_give_one_line_errors(tmp_path, obj, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(TreeError) as e:
        WordClasses.load(path)
    assert message in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


def test_unreadable_structure_files(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    for path in (tmp_path / "x.json", tmp_path / "missing.json"):
        with pytest.raises(TreeError) as e:
            WordClasses.load(path)
        assert "\n" not in str(e.value)


def test_make_output_layer_needs_matching_classes():
    assert "classes" in OUTPUT_KINDS
    classes = structures()["classes"]
    assert isinstance(make_output_layer("classes", D, V, classes), ClassSoftmax)
    with pytest.raises(ValueError, match="needs WordClasses"):
        make_output_layer("classes", D, V)
    with pytest.raises(ValueError, match="14"):
        make_output_layer("classes", D, 14, classes)
    with pytest.raises(ValueError, match="WordTree"):
        make_output_layer("tree", D, V, classes)


# ---- builders --------------------------------------------------------------------------------


def test_frequency_classes_bin_by_token_mass():
    counts = np.array([1000, 400, 300, 100, 50, 40, 30, 20, 10, 5, 3, 2, 0, 1])
    c = frequency_classes(counts, 4)
    assert c.num_classes == 4 and c.num_shortlist == 0
    assert np.concatenate(c.classes).tolist() == list(range(12)) + [13, 12]  # by decreasing count, consecutive
    assert c.classes[0].tolist() == [0]  # word 0 alone is over 1/4 of the mass
    s = frequency_classes(counts, 3, shortlist=2)
    assert s.shortlist.tolist() == [0, 1] and s.num_classes == 3
    assert (s.codes_per_word == 1).all()
    # as many classes as words left: one word each
    assert frequency_classes(counts, 14).class_sizes.tolist() == [1] * 14
    for bad in ((counts, 0, 0), (counts, 15, 0), (counts, 3, 14), (counts, 1, 0)):
        with pytest.raises(TreeError):
            frequency_classes(*bad)


def test_kmeans_classes_find_separated_clusters_and_are_reproducible():
    rng = np.random.default_rng(0)
    centres = np.array([[10.0, 0, 0], [0, 10.0, 0], [0, 0, 10.0]])
    truth = np.repeat(np.arange(3), 8)
    X = centres[truth] + rng.normal(scale=0.5, size=(24, 3))
    counts = rng.integers(1, 100, size=24)
    a = kmeans_classes(X, 3, seed=1, counts=counts)
    b = kmeans_classes(X, 3, seed=1, counts=counts)
    assert a.fingerprint() == b.fingerprint()
    groups = sorted(sorted(truth[c].tolist()) for c in a.classes)
    assert groups == [[0] * 8, [1] * 8, [2] * 8]
    for c in a.classes:  # members by decreasing count
        assert (np.diff(counts[c]) <= 0).all()
    s = kmeans_classes(X, 3, seed=1, counts=counts, shortlist=4)
    assert sorted(s.shortlist.tolist()) == sorted(np.argsort(-counts, kind="stable")[:4].tolist())
    assert (s.codes_per_word == 1).all()


def test_kmeans_classes_give_several_memberships_to_words_between_clusters():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(30, 2)), rng.normal(size=(30, 2)) + [10, 0], [[5.0, 0]]])
    one = kmeans_classes(X, 2, seed=0)
    assert (one.codes_per_word == 1).all()
    two = kmeans_classes(X, 2, seed=0, eps=0.1, max_codes=2)
    assert two.codes_per_word[60] == 2  # the point midway joins both
    near = np.minimum(np.abs(X[:, 0]), np.abs(X[:, 0] - 10)) < 2
    assert (two.codes_per_word[near] == 1).all()
    with pytest.raises(TreeError):
        kmeans_classes(X, 2, eps=2.0, max_codes=2)
    with pytest.raises(TreeError):
        kmeans_classes(X, 2, shortlist=2)  # a shortlist needs counts


def test_kmeans_restarts_empty_clusters():
    X = np.zeros((5, 2))
    X[4] = 1.0
    assert np.isfinite(kmeans(X, 3, seed=0)).all()


# ---- the model, files and the CLI ------------------------------------------------------------


def test_model_save_load_gives_identical_log_probs(tmp_path):
    data = tiny_corpus(tmp_path / "corpus")
    corpus = load_corpus(data, splits=("train",))
    Vc = len(corpus.vocab)
    classes = frequency_classes(corpus.vocab.counts, 4, shortlist=2)
    model = LBL(LBLConfig(Vc, dim=6, context=3, output="classes"), classes, torch.Generator().manual_seed(0))
    model.init_unigram(corpus.vocab.counts)
    run = tmp_path / "run"
    hrun.save_run_files(run, model, corpus.vocab, toy_record(model.config))
    ckpt.save_weights(run / "best.safetensors", model, vocab=corpus.vocab)
    loaded, _, _ = hrun.load_model(run)
    assert loaded.structure.fingerprint() == classes.fingerprint()
    assert loaded.tree is None
    ctx = torch.randint(0, Vc, (5, 3), generator=torch.Generator().manual_seed(1))
    assert torch.equal(loaded.log_prob(ctx), model.log_prob(ctx))
    # weights under other classes are refused
    other = frequency_classes(corpus.vocab.counts, 4, shortlist=3)
    WordClasses.save(other, run / "tree.json")
    with pytest.raises(ckpt.CheckpointError, match="word tree"):
        hrun.load_model(run)


def _train(tmp_path, data, out, *extra):
    args = ["train", "--data", str(data), "--out", str(out), "--epochs", "2", "--dim", "8", "--quiet"]
    assert main([*args, "--output", "classes", "--device", "cpu", *extra]) == 0


def test_cli_trains_builds_and_infers_end_to_end(tmp_path, capsys, monkeypatch):
    data = tiny_corpus(tmp_path / "corpus")
    # no structure given: frequency binning into about sqrt(V) classes
    _train(tmp_path, data, tmp_path / "freq")
    result = json.loads(capsys.readouterr().out.splitlines()[0])
    assert 1 < result["test_perplexity"] < 14  # 14 words
    record = hrun.Run.open(tmp_path / "freq").record
    assert record.model.output == "classes" and record.options.tree == "frequency"
    assert WordClasses.load(tmp_path / "freq" / "tree.json").num_classes == 4  # round(sqrt(14 words))
    assert main(["tree", "stats", str(tmp_path / "freq")]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["classes"] == 4 and stats["weighting"] == "unigram"
    # classes from the run's features (k-means), with a shortlist and several memberships
    cfile = tmp_path / "km.json"
    assert (
        main(
            ["tree", "build", "--from", str(tmp_path / "freq"), "--classes", "3", "--shortlist", "2"]
            + ["--eps", "0.2", "--max-codes", "2", "--out", str(cfile)]
        )
        == 0
    )
    built = json.loads(capsys.readouterr().out)
    assert built["method"] == "kmeans" and built["classes"] <= 3 and built["shortlist"] == 2
    # frequency binning from a corpus, no run
    ffile = tmp_path / "f.json"
    assert main(["tree", "build", "--data", str(data), "--classes", "4", "--out", str(ffile)]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "frequency"
    _train(tmp_path, data, tmp_path / "km", "--tree", str(cfile))
    result = json.loads(capsys.readouterr().out.splitlines()[0])
    model, vocab, _ = hrun.load_model(tmp_path / "km")
    test = load_corpus(data, vocab=vocab, splits=("test",))["test"]
    assert evaluate(model, test, vocab.eos)["perplexity"] == pytest.approx(result["test_perplexity"], rel=1e-5)
    run = str(tmp_path / "km")
    assert main(["eval", run, "--split", "test", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["perplexity"] == pytest.approx(result["test_perplexity"], rel=1e-5)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the big\n"), encoding="utf-8"))
    assert main(["predict", run, "--k", "3", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert len(pred["words"]) == 3 and pred["probs"] == sorted(pred["probs"], reverse=True)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the big cat eats a dog\n"), encoding="utf-8"))
    assert main(["score", run]) == 0
    capsys.readouterr()
    for extra in ([], ["--temperature", "0.7"], ["--temperature", "0.7", "--per-node-temperature"]):
        assert main(["generate", run, "--tokens", "5", "--seed", "3", *extra]) == 0
        first = capsys.readouterr().out
        assert main(["generate", run, "--tokens", "5", "--seed", "3", *extra]) == 0
        assert capsys.readouterr().out == first  # a fixed seed gives the same text


def test_cli_fixed_seed_gives_identical_runs(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus", n_train=100)
    _train(tmp_path, data, tmp_path / "a", "--epochs", "1")
    _train(tmp_path, data, tmp_path / "b", "--epochs", "1")
    a = ckpt.load_tensors(tmp_path / "a" / "best.safetensors")
    b = ckpt.load_tensors(tmp_path / "b" / "best.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cli_refuses_bad_structures(tmp_path, capsys):
    data = tiny_corpus(tmp_path / "corpus", n_train=50)
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"format": "hlbl-word-classes", "version": 1, "num_words": 3, "shortlist": [0], "classes": [[1, 2]]})
    )
    base = ["train", "--data", str(data), "--epochs", "1", "--quiet", "--output", "classes"]
    assert main([*base, "--out", str(tmp_path / "x"), "--tree", str(bad)]) == 2  # 3 words, not the vocabulary's
    assert main([*base, "--out", str(tmp_path / "y"), "--tree", "huffman"]) == 2
    assert main([*base, "--out", str(tmp_path / "z"), "--tree", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("hlbl: error:") == 3
    assert main(["tree", "build", "--classes", "3", "--out", str(tmp_path / "c.json")]) == 2  # no --from, no --data
    assert main(["tree", "build", "--data", str(data), "--classes", "3", "--copies", "2", "--out", "c.json"]) == 2
    assert main(["tree", "build", "--data", str(data), "--shortlist", "3", "--out", "c.json"]) == 2


@pytest.mark.parametrize("name", ["shortlist", "multi"])
def test_a_member_projection_keeps_the_layer_exact(name):
    """member_dim: the members' scores read P h (P: member_dim x d, learned); the distribution still
    sums to one and equals enumeration, the hand-written backward equals autograd (P included),
    top-k stays exact, and a bad member_dim is a ValueError."""
    classes = structures()[name]
    layer, h = random_layer(classes, member_dim=3)
    assert layer.word_weight.shape == (classes.num_leaves - len(classes.shortlist), 3)
    assert layer.member_proj.weight.shape == (3, D)
    lp = layer.log_prob(h)
    assert torch.allclose(lp.exp().sum(1), torch.ones(9, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(lp, brute_force_log_prob(classes, layer, h), atol=1e-10)
    targets = torch.tensor([0, 3, 12, 5, 1, 9, 12, 8, 3])

    def grads(f):
        layer.zero_grad()
        x = h.clone().requires_grad_(True)
        (f(x) * torch.arange(1.0, 10.0, dtype=torch.float64)).sum().backward()
        return [p.grad.clone() for p in layer.parameters()] + [x.grad]

    fast = grads(lambda x: layer.target_log_prob(x, targets))
    ref = grads(lambda x: layer.log_prob(x)[torch.arange(9), targets])
    assert len(fast) == 6 and all(torch.allclose(a, b, atol=1e-10) for a, b in zip(fast, ref))
    values, idx = layer.topk(h, 5)
    assert topk_matches(values, idx, lp, atol=1e-10)
    for bad in (0, D + 1, 2.5):
        with pytest.raises(ValueError, match="member_dim"):
            ClassSoftmax(D, classes, member_dim=bad)

"""Learned trees: EM against scikit-learn, split policies, termination, size bound, xK joins,
word features against a brute-force mean, and the ``hlbl tree build`` command."""

import warnings

import numpy as np
import pytest
import torch

from hlbl.model import LBL, LBLConfig
from hlbl.output import TreeSoftmax
from hlbl.tree import TreeError, WordTree, random_tree
from hlbl.treebuild import (
    BuildReport,
    build_learned_tree,
    build_tree_from_features,
    em_reg,
    em_responsibilities,
    join_trees,
    parse_policy,
    sense_features,
    tree_label,
    tree_over_items,
    word_features,
)

POLICIES = ("balanced", "adaptive", "adaptive:0.25", "adaptive:0.4")


def blobs(n=(60, 40), d=5, sep=12.0, seed=0):
    rng = np.random.default_rng(seed)
    X = np.concatenate([rng.normal(size=(n[0], d)), rng.normal(size=(n[1], d)) + sep / np.sqrt(d)])
    return X, np.repeat([0, 1], n)


def subtree_words(tree: WordTree, node: int) -> list[int]:
    """Words of all leaves under internal ``node`` (with repeats for multi-code words)."""
    out, stack = [], [node]
    while stack:
        j = stack.pop()
        for c in tree.children[j]:
            (stack.append(int(c)) if c >= 0 else out.append(int(-1 - c)))
    return out


def root_responsibilities(X, seed, iters=10):
    """The root's EM exactly as the builder runs it: same rng stream, first draw."""
    V = len(X)
    return em_responsibilities(
        X, np.zeros(V, np.int64), np.array([0]), np.random.default_rng(seed), iters, None, em_reg(X)
    )


def random_halves(seg, starts, seed):
    """The builder's initial partition (rank by a uniform key within each node; first half left)."""
    u = np.random.default_rng(seed).random(len(seg))
    order = np.lexsort((u, seg))
    rank = np.empty(len(seg), np.int64)
    rank[order] = np.arange(len(seg)) - starts[seg[order]]
    sizes = np.diff(np.append(starts, len(seg)))
    return rank < (sizes[seg] + 1) // 2


def assert_distribution(tree: WordTree, d=6, seed=0):
    layer = TreeSoftmax(d, tree)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.weight.normal_(0, 1.0, generator=g)
        layer.bias.normal_(0, 1.0, generator=g)
        lp = layer.log_prob(torch.randn(5, d, generator=g, dtype=layer.weight.dtype))
    assert lp.shape == (5, tree.num_words)
    torch.testing.assert_close(lp.double().exp().sum(1), torch.ones(5, dtype=torch.float64), atol=1e-5, rtol=0)


# ---- EM -------------------------------------------------------------------------------------


def test_em_recovers_two_blobs():
    X, labels = blobs()
    r = root_responsibilities(X, seed=1)
    hard = (r > 0.5).astype(int)
    agree = max((hard == labels).mean(), (hard != labels).mean())
    assert agree == 1.0
    assert np.all((r < 1e-6) | (r > 1 - 1e-6))  # well separated: confident


@pytest.mark.parametrize("seed", [0, 3])
def test_em_matches_sklearn_batched_over_nodes(seed):
    """Three nodes run at once equal three independent sklearn fits from the same start."""
    from sklearn.mixture import GaussianMixture

    rng = np.random.default_rng(seed)
    parts = [blobs((30, 20), 4, 2.0, seed)[0], rng.normal(size=(17, 4)) * 3 + 1, rng.normal(size=(9, 4))]
    X = np.concatenate(parts)
    seg = np.repeat(np.arange(3), [len(p) for p in parts])
    starts = np.array([0, 50, 67])
    reg = em_reg(X)
    r = em_responsibilities(X, seg, starts, np.random.default_rng(seed), 10, None, reg)
    left = random_halves(seg, starts, seed)
    for m, p in enumerate(parts):
        idx = seg == m
        h = left[idx]
        mu = np.stack([p[h].mean(0), p[~h].mean(0)])
        var = np.array([((p[h] - mu[0]) ** 2).mean(), ((p[~h] - mu[1]) ** 2).mean()]) + reg
        w = np.array([h.mean(), 1 - h.mean()])
        with warnings.catch_warnings():  # sklearn: "did not converge" in 10 iterations (the paper's)
            warnings.simplefilter("ignore")
            gm = GaussianMixture(
                2,
                covariance_type="spherical",
                max_iter=10,
                tol=0,
                reg_covar=reg,
                weights_init=w,
                means_init=mu,
                precisions_init=1 / var,
            ).fit(p)
        np.testing.assert_allclose(r[idx], gm.predict_proba(p)[:, 0], atol=1e-8)


def test_weights_change_the_split():
    X, _ = blobs((50, 50), 3, 1.0, 2)
    w = np.ones(100)
    w[:5] = 1e4  # five heavy words dominate their component
    t1 = build_learned_tree(X, "adaptive", 0)
    t2 = build_learned_tree(X, "adaptive", 0, weights=w)
    assert not np.array_equal(t1.children, t2.children)
    with pytest.raises(TreeError):
        build_learned_tree(X, "adaptive", 0, weights=-w)


# ---- policies -------------------------------------------------------------------------------


def test_balanced_halves_every_node():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(77, 6))
    tree = build_learned_tree(X, "balanced", 3)
    assert tree.num_nodes == 76 and (tree.codes_per_word == 1).all()
    for j in range(tree.num_nodes):
        sizes = [len(subtree_words(tree, c)) if c >= 0 else 1 for c in tree.children[j]]
        assert abs(sizes[0] - sizes[1]) <= 1


def test_balanced_root_split_follows_responsibilities():
    X, _ = blobs((30, 31), 4, 1.0, 5)
    tree = build_learned_tree(X, "balanced", 7)
    r = root_responsibilities(X, 7)
    left = set(subtree_words(tree, tree.children[0, 0]))
    assert len(left) == 31
    assert min(r[list(left)]) >= max(np.delete(r, list(left)))


def test_adaptive_root_split_is_larger_responsibility():
    X, labels = blobs((40, 25), 4, 3.0, 1)
    tree = build_learned_tree(X, "adaptive", 11)
    r = root_responsibilities(X, 11)
    left = sorted(subtree_words(tree, tree.children[0, 0]))
    assert left == sorted(np.flatnonzero(r > 0.5).tolist())
    assert (tree.codes_per_word == 1).all()


@pytest.mark.parametrize("eps", [0.1, 0.25, 0.4])
def test_adaptive_eps_duplicates_exactly_the_band(eps):
    X, _ = blobs((40, 40), 2, 2.5, 4)  # overlapping blobs: 10, 32, 73 words in the bands
    r = root_responsibilities(X, 2)
    band = np.abs(r - 0.5) < eps
    assert 0 < band.sum() < 80
    tree = build_learned_tree(X, f"adaptive:{eps}", 2, max_leaves=10**6)
    left = set(subtree_words(tree, tree.children[0, 0]))
    right = set(subtree_words(tree, tree.children[0, 1]))
    assert left == set(np.flatnonzero((r > 0.5) | band))
    assert right == set(np.flatnonzero((r <= 0.5) | band))
    assert tree.codes_per_word.max() > 1


def test_wider_band_more_codes_and_adaptive_eps_zero_is_adaptive():
    X = np.random.default_rng(3).normal(size=(300, 8))
    s = [build_learned_tree(X, p, 0).stats()["codes_per_word"] for p in ("adaptive", "adaptive:0.1", "adaptive:0.4")]
    assert s[0] == pytest.approx(1.0) and s[0] < s[1] < s[2]
    assert np.array_equal(
        build_learned_tree(X, "adaptive:0", 0).children, build_learned_tree(X, "adaptive", 0).children
    )


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("copies", [1, 2, 4])
def test_trees_are_valid_distributions(policy, copies):
    X = np.random.default_rng(copies).normal(size=(41, 5))
    tree = build_tree_from_features(X, policy, seed=5, copies=copies)
    WordTree(tree.children, tree.num_words)  # re-validates from scratch
    st = tree.stats()
    assert st["internal_nodes"] == st["leaves"] - 1
    assert (tree.codes_per_word >= copies).all()
    assert_distribution(tree)


@pytest.mark.parametrize("policy", POLICIES)
def test_same_seed_same_tree(policy):
    X = np.random.default_rng(0).normal(size=(120, 7))
    a = build_tree_from_features(X, policy, seed=9, copies=2)
    b = build_tree_from_features(X, policy, seed=9, copies=2)
    c = build_tree_from_features(X, policy, seed=10, copies=2)
    assert np.array_equal(a.children, b.children)
    assert not np.array_equal(a.children, c.children)


# ---- termination and size -------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("V", [2, 3, 4, 65])
def test_identical_vectors_terminate_balanced(policy, V):
    rep = BuildReport()
    tree = build_learned_tree(np.ones((V, 3)), policy, 0, report=rep)
    assert tree.num_words == V and (tree.codes_per_word >= 1).all()
    # Identical vectors give the EM nothing to split on: ADAPTIVE policies fall back to BALANCED.
    assert tree.stats()["max_depth"] == int(np.ceil(np.log2(V)))
    assert policy == "balanced" or V == 2 or rep.fallback_nodes > 0
    assert_distribution(tree)


@pytest.mark.parametrize("policy", POLICIES)
def test_tiny_vocabularies(policy):
    for V in (2, 3):
        X = np.random.default_rng(V).normal(size=(V, 2))
        tree = build_learned_tree(X, policy, 0)
        assert tree.num_nodes == V - 1 and (tree.codes_per_word == 1).all()
    with pytest.raises(TreeError):
        build_learned_tree(np.zeros((1, 2)), policy, 0)


def test_all_to_both_sides_falls_back_to_balanced():
    # eps = 0.5 puts every word in the band: each EM split would send all words both ways.
    rep = BuildReport()
    tree = build_learned_tree(np.ones((16, 2)), "adaptive:0.5", 0, report=rep)
    assert rep.fallback_nodes > 0
    assert tree.stats()["max_depth"] == 4 and (tree.codes_per_word == 1).all()


@pytest.mark.parametrize("max_leaves", [None, 150, 60])
def test_leaf_budget_bounds_tree_size(max_leaves):
    V = 60
    X = np.random.default_rng(1).normal(size=(V, 3))
    rep = BuildReport()
    tree = build_learned_tree(X, "adaptive:0.49", 0, max_leaves=max_leaves, report=rep)
    bound = 4 * V if max_leaves is None else max_leaves
    assert len(tree.leaf_word) <= max(V, bound)
    if max_leaves == V:
        assert (tree.codes_per_word == 1).all() and rep.denied_duplications > 0
    assert_distribution(tree)


# ---- joins ----------------------------------------------------------------------------------


def test_one_progress_display_counts_the_words_of_every_copy(monkeypatch):
    """An xK build shows one line, words placed out of K x V (so it can give the time left), not
    one levels-per-second count a copy; k-means counts distance columns out of a known total."""
    import io

    import hlbl.classes as classes_module
    import hlbl.treebuild as treebuild_module
    from hlbl.progress import LogLines

    shown = []

    def fake(total=None, desc=None, unit="it", **kw):
        shown.append(LogLines(total, desc, unit, every=1e9, file=io.StringIO()))
        return shown[-1]

    monkeypatch.setattr(treebuild_module, "progress", fake)
    monkeypatch.setattr(classes_module, "progress", fake)
    X = np.random.default_rng(0).normal(size=(40, 3))
    build_tree_from_features(X, "adaptive:0.3", seed=1, copies=3)
    assert [(b.desc, b.total, b.n) for b in shown] == [("building tree x3", 120, 120)]
    shown.clear()
    classes_module.kmeans(X, 5, iters=4)
    assert len(shown) == 1 and shown[0].total == 5 * 5 and 5 < shown[0].n <= 25


def test_join_trees_puts_each_tree_under_a_balanced_top():
    trees = [random_tree(9, s) for s in range(4)]
    j2 = join_trees(trees[:2])
    assert j2.num_nodes == 2 * 8 + 1 and (j2.codes_per_word == 2).all()
    # x2: the root's children are the two trees' roots; code lengths are theirs + 1.
    for w in range(9):
        lens = sorted(len(n) for n, _ in j2.codes(w))
        ref = sorted(len(t.codes(w)[0][0]) + 1 for t in trees[:2])
        assert lens == ref
    j4 = join_trees(trees)
    assert j4.num_nodes == 4 * 8 + 3 and (j4.codes_per_word == 4).all()
    assert j4.stats()["mean_code_length"] == pytest.approx(sum(t.stats()["mean_code_length"] + 2 for t in trees))
    assert_distribution(j4)
    with pytest.raises(TreeError):
        join_trees([random_tree(9, 0), random_tree(8, 0)])


def test_policy_parsing_and_labels():
    assert parse_policy("adaptive:0.4").eps == 0.4
    assert tree_label("adaptive:0.4", 4) == "ADAPTIVE(0.4) x4"
    assert tree_label("balanced") == "BALANCED"
    for bad in ("fancy", "adaptive:x", "adaptive:0.7", "balanced:0.1"):
        with pytest.raises(TreeError):
            parse_policy(bad)
    with pytest.raises(TreeError):
        build_learned_tree(np.full((5, 2), np.nan), "adaptive", 0)


# ---- word features --------------------------------------------------------------------------


def test_word_features_are_exact_means_with_fallback():
    V, n = 12, 3
    model = LBL(LBLConfig(V, dim=4, context=n), random_tree(V, 0), torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    stream = rng.integers(0, V - 2, size=200).astype(np.int32)  # words V-2, V-1 never occur
    pad = 0
    X, counts = word_features(model, stream, pad, batch_size=7)
    # brute force: r_hat of every position from its explicit padded context
    padded = np.concatenate([np.full(n, pad), stream]).astype(np.int64)
    ctx = np.stack([padded[i : i + n] for i in range(len(stream))])
    with torch.no_grad():
        rhat = model.context_vector(torch.from_numpy(ctx)).double().numpy()
    for w in range(V):
        m = stream == w
        assert counts[w] == m.sum()
        ref = rhat[m].mean(0) if m.any() else rhat.mean(0)
        np.testing.assert_allclose(X[w], ref, rtol=1e-6, atol=1e-9)


def test_word_features_numba_pass_equals_the_torch_batches():
    """The CPU pass (numba) and the torch batches give the same sums: r_hat in float32 in
    context order, widened, added in stream order. Checked on a stream longer than one chunk
    boundary of neither (positions before the start read the pad)."""
    V, n = 50, 4
    model = LBL(LBLConfig(V, dim=8, context=n), random_tree(V, 0), torch.Generator().manual_seed(1))
    stream = np.random.default_rng(1).integers(0, V, size=5000).astype(np.int32)
    X_fast, c_fast = word_features(model, stream, 3)
    X_torch, c_torch = word_features(model, stream, 3, batch_size=333, engine="torch")
    np.testing.assert_array_equal(c_fast, c_torch)
    np.testing.assert_allclose(X_fast, X_torch, rtol=1e-12, atol=1e-12)
    assert np.abs(X_fast).max() > 1e-3  # not a vacuous comparison of zeros


def test_word_features_read_a_mapped_split_in_pieces_with_the_same_sums(tmp_path, monkeypatch):
    """A memory-mapped split is read through its file in pieces, each with the context tokens
    before it: the same sums, to the bit, as one pass over the tokens in memory, and the pieces'
    ids are checked (a bad id in a later piece is refused)."""
    import hlbl.treebuild as tb

    V, n = 50, 4
    model = LBL(LBLConfig(V, dim=8, context=n), random_tree(V, 0), torch.Generator().manual_seed(1))
    tokens = np.random.default_rng(2).integers(0, V, size=5003).astype("<i4")
    tokens.tofile(tmp_path / "train.bin")
    mapped = np.memmap(tmp_path / "train.bin", dtype="<i4", mode="r")
    X_whole, c_whole = word_features(model, tokens, 3)
    monkeypatch.setattr(tb, "FEATURE_PIECE", 1000)  # 6 pieces, the last of 3 positions
    X_mapped, c_mapped = word_features(model, mapped, 3)
    np.testing.assert_array_equal(c_mapped, c_whole)
    np.testing.assert_array_equal(X_mapped, X_whole)
    tokens[4500] = V
    tokens.tofile(tmp_path / "bad.bin")
    with pytest.raises(TreeError, match="token ids"):
        word_features(model, np.memmap(tmp_path / "bad.bin", dtype="<i4", mode="r"), 3)


def test_tree_build_cli(tmp_path):
    from hlbl.cli import main

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    corpus = tmp_path / "c"
    corpus.mkdir()
    for split, n in (("train", 300), ("valid", 30), ("test", 30)):
        lines = [" ".join(rng.choice(words, size=rng.integers(3, 9))) for _ in range(n)]
        (corpus / f"{split}.txt").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(run), "--dim", "8", "--epochs", "1", "--quiet"]) == 0
    out = tmp_path / "t.json"
    assert (
        main(
            [
                "tree",
                "build",
                "--from",
                str(run),
                "--policy",
                "adaptive:0.4",
                "--copies",
                "2",
                "--seed",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    tree = WordTree.load(out)
    assert (tree.codes_per_word >= 2).all()
    assert (
        main(
            [
                "train",
                "--data",
                str(corpus),
                "--tree",
                str(out),
                "--out",
                str(tmp_path / "run2"),
                "--dim",
                "8",
                "--epochs",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    assert main(["tree", "build", "--from", str(run), "--policy", "nope", "--out", str(out)]) == 2


class _PreviousWord:
    """A stand-in model whose r_hat is a fixed vector of the previous word (context n = 1)."""

    def __init__(self, table: np.ndarray):
        self.table = torch.from_numpy(table)
        self.config = LBLConfig(len(table), dim=table.shape[1], context=1)
        self.training = False
        self.R, self.C = torch.nn.Embedding(1, 1), None  # no LBL weights: word_features takes the torch pass

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def context_vector(self, ctx):
        return self.table[ctx[:, -1]]


def test_sense_features_split_a_word_with_two_kinds_of_context_only():
    V, d = 8, 3
    table = np.zeros((V, d))
    table[1], table[2], table[3] = [10, 0, 0], [0, 10, 0], [0, 0, 10]
    # word 5 follows word 1 and word 2 (two senses, 60/40); word 6 follows word 3 only
    rng = np.random.default_rng(0)
    pairs = [(1, 5)] * 60 + [(2, 5)] * 40 + [(3, 6)] * 100 + [(4, 7)] * 5
    stream = np.array([w for i in rng.permutation(len(pairs)) for w in pairs[i]], dtype=np.int32)
    from hlbl.treebuild import SenseReport

    rep = SenseReport()
    X, owner = sense_features(_PreviousWord(table), stream, 0, min_count=50, report=rep)
    assert rep.candidates == 4 and rep.split_words == 1  # 1, 3, 5 and 6 are frequent; only 5 splits
    assert owner.tolist() == list(range(V)) + [5]
    senses = sorted([tuple(X[5]), tuple(X[V])])
    np.testing.assert_allclose(senses, [(0, 10, 0), (10, 0, 0)])
    np.testing.assert_allclose(X[6], [0, 0, 10])
    # only the first 30 occurrences of a word are kept: the same two senses here
    X2, owner2 = sense_features(_PreviousWord(table), stream, 0, min_count=50, max_occurrences=30)
    assert owner2.tolist() == owner.tolist()
    np.testing.assert_allclose(sorted(map(tuple, X2[[5, V]])), senses)


def test_a_tree_over_items_is_a_word_tree_and_merges_sibling_senses():
    # items 0..3 are words 0..3; item 4 is a second sense of word 1, item 5 of word 3
    owner = np.array([0, 1, 2, 3, 1, 3])
    items = WordTree.from_nested((((0, 4), 1), ((2, 3), 5)), 6)
    tree = tree_over_items(items, owner, 4)
    assert tree.codes_per_word.tolist() == [1, 2, 1, 2]
    assert sorted(len(nodes) for nodes, _ in tree.codes(1)) == [2, 3]
    merged = tree_over_items(WordTree.from_nested(((0, (1, 4)), (2, 3)), 5), owner[:5], 4)
    assert merged.codes_per_word.tolist() == [1, 1, 1, 1]  # word 1's two senses were siblings
    layer = TreeSoftmax(5, tree, init_std=0.5, generator=torch.Generator().manual_seed(0))
    p = layer.log_prob(torch.randn(7, 5)).exp().sum(1)
    torch.testing.assert_close(p, torch.ones(7), rtol=1e-5, atol=1e-5)

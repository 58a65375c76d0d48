"""Exact tree top-k (hlbl.search) and the full distribution, checked against brute force."""

import math

import numpy as np
import pytest
import torch

from conftest import _halve, duplicated_tree, multi_code_tree, random_layer, unbalanced_tree
from hlbl.model import LBL, LBLConfig
from hlbl.output import TreeSoftmax
from hlbl.search import (
    TreeSearch,
    _topk_multi,
    _topk_single,
    full_topk,
    node_weights,
    scratch,
    topk_matches,
    tree_arrays,
    tree_topk,
)
from hlbl.tree import WordTree, balanced_tree, huffman_tree, random_tree
from hlbl.treebuild import build_tree_from_features


# ---- trees and references ---------------------------------------------------------------------


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
    trees["learned_adaptive0.4_x2"] = build_tree_from_features(X, "adaptive:0.4", seed=0, copies=2, max_leaves=450)
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


SINGLE_CODE = [name for name, tree in TREES.items() if tree.codes_per_word.max() == 1]


def both_searches(tree, layer, H, k, floors):
    """(values, ids, nodes) of the single-code search and of the general one for each row of H."""
    a, wt = tree_arrays(tree), node_weights(tree, layer.weight, layer.bias)
    out = []
    for kernel in ("single", "multi"):
        # The general search's scratch as for a tree of several codes a word (K = 2).
        s = scratch(tree.num_nodes, tree.num_words, 1 if kernel == "single" else 2)
        v, w = np.full((len(H), k), -np.inf), np.full((len(H), k), -1, dtype=np.int64)
        n = np.zeros(len(H), dtype=np.int64)
        for i, h in enumerate(H.numpy()):
            if kernel == "single":
                n[i] = _topk_single(h, wt, a.children, k, s, v[i], w[i], floors[i])
                assert (s.bucket_head == -1).all()  # left empty for the next context
            else:
                n[i] = _topk_multi(h, wt, a, k, s, i + 1, v[i], w[i], floors[i])
                assert (s.bucket_head == -1).all()
        out.append((v, w, n))
    return out


@pytest.mark.parametrize("scale", [0.05, 1.0, 40.0])  # flat, peaked, and past the last bucket
@pytest.mark.parametrize("name", SINGLE_CODE)
def test_the_single_code_search_equals_the_general_one_to_the_bit(name, scale):
    """Single-code trees take _topk_single (no score cache, leaves straight into the list, exact
    bucket edges); the general search (_topk_multi, exact for any tree) gives the same values and
    ids to the bit, scoring the same nodes; with floors, the same words at or above each floor."""
    tree = TREES[name]
    layer, H = random_layer(tree, 12, seed=7, scale=scale)
    H = H[:150]
    V = tree.num_words
    for k in (1, 10, V):
        (bv, bw, bn), (hv, hw, hn) = both_searches(tree, layer, H, k, np.full(len(H), -np.inf))
        assert np.array_equal(bv, hv) and np.array_equal(bw, hw)
        assert (bn >= 1).all() and np.array_equal(bn, hn)
        if k == V:
            assert (bn == tree.num_nodes).all()
    kk = min(10, V)
    hv, hw, _ = both_searches(tree, layer, H, kk, np.full(len(H), -np.inf))[1]
    if scale == 40.0:
        assert (hv[:, -1] < -64).mean() > 0.5  # most k-th best words lie past the last bucket's edge
    floors = hv[:, 2].copy()  # rows want their best three (and ties); some rows everything
    floors[::3] = -np.inf
    bv, bw, _ = both_searches(tree, layer, H, kk, floors)[0]
    want = hv >= floors[:, None]
    assert np.array_equal(bv[want], hv[want]) and np.array_equal(bw[want], hw[want])
    assert (bv[~want] < floors[:, None].repeat(kk, 1)[~want]).all()


def test_nan_weights_give_nan_on_a_single_code_tree():
    tree = random_tree(40, 0)
    layer, H = random_layer(tree, 4, seed=0, scale=1.0)
    with torch.no_grad():
        layer.weight[0, 0] = float("nan")  # the root: every path
    assert torch.isnan(tree_topk(tree, layer.weight, layer.bias, H[:5], 3).values).all()


@pytest.mark.parametrize(
    "tree", [balanced_tree(np.random.default_rng(0).permutation(16)), x2_tree(16, 1)], ids=["single", "x2"]
)
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


@pytest.mark.parametrize("name", ["random", "duplicated", "multi_code_small"])
def test_tree_search_reusing_its_scratch_equals_tree_topk(name):
    """TreeSearch keeps its scratch between calls (stamped, not cleared): any sequence of calls,
    batch sizes and k gives tree_topk's answers, bit for bit, in float64."""
    tree = TREES[name]
    layer, H = random_layer(tree, 8, seed=3, scale=1.0, dtype=torch.float64)
    H = H[:60]
    search = TreeSearch(tree, layer.weight, layer.bias)
    for k in (1, 5, tree.num_words + 3):
        whole = tree_topk(tree, layer.weight, layer.bias, H, k)
        for size in (1, 7, 60):
            for i in range(0, len(H), size):
                v, w = search.topk(H[i : i + size].numpy(), k)
                assert np.array_equal(v, whole.values[i : i + size].numpy())
                assert np.array_equal(w, whole.indices[i : i + size].numpy())
    with pytest.raises(ValueError, match="k must be"):
        search.topk(H.numpy(), 0)
    with pytest.raises(ValueError, match="shape"):
        search.topk(np.zeros((1, 9)), 1)


@pytest.mark.parametrize("name", ["huffman", "duplicated", "multi_code_small"])
def test_a_layer_keeps_its_search_scratch_between_calls_and_copies_it_empty(name):
    """TreeSoftmax.topk keeps one scratch per thread on the layer (layer_scratch_pool): calls of
    any size from several threads give tree_topk's fresh answers; a deep copy or a pickle of the
    layer answers the same and shares no scratch."""
    import copy
    import pickle
    import threading

    from hlbl.search import ScratchPool, layer_scratch_pool

    tree = TREES[name]
    layer, H = random_layer(tree, 8, seed=4, scale=1.0, dtype=torch.float64)
    H = H[:120]
    want = tree_topk(tree, layer.weight, layer.bias, H, 5)
    for size in (1, 7, 120):
        for i in range(0, len(H), size):
            v, w = layer.topk(H[i : i + size], 5)
            assert torch.equal(v, want.values[i : i + size]) and torch.equal(w, want.indices[i : i + size])
    pool = layer_scratch_pool(layer)
    assert layer_scratch_pool(layer) is pool  # kept
    got = {}

    def worker(t):
        got[t] = [layer.topk(H[i : i + 1], 5)[1] for i in range(t, len(H), 4)]

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t, ids in got.items():
        assert torch.equal(torch.cat(ids), want.indices[t::4])
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert layer_scratch_pool(other) is not pool
        v, w = other.topk(H, 5)
        assert torch.equal(v, want.values) and torch.equal(w, want.indices)
    with pytest.raises(ValueError, match="scratch pool for a tree of shape"):
        tree_topk(tree, layer.weight, layer.bias, H[:1], 5, pool=ScratchPool(tree.num_nodes + 1, tree.num_words, 1))


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
    assert torch.allclose(
        layer.target_log_prob(H[:3].repeat_interleave(tree.num_words, 0), words), lp[:3].reshape(-1), atol=1e-10
    )


def test_nan_weights_give_nan_not_a_plausible_answer():
    tree = duplicated_tree(12, 5, 0)  # multi-code: top-k resolves words through their several paths
    layer = TreeSoftmax(4, tree)
    with torch.no_grad():
        layer.weight.normal_(generator=torch.Generator().manual_seed(0))
        layer.weight[0, 0] = float("nan")  # the root: every path
    h = torch.ones(3, 4)
    assert torch.isnan(tree_topk(tree, layer.weight, layer.bias, h, 3).values).all()

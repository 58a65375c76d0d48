import json

import numpy as np
import pytest

from conftest import all_trees, multi_code_tree, unbalanced_tree
from hlbl.tree import TreeError, WordTree, balanced_tree, build_tree, huffman_tree, leaf, random_tree


def test_codes_follow_the_documented_layout():
    # The diagram in tree.py: "the"=0, "cat"=1, "a"=2 (two codes), "sat"=3.
    t = WordTree.from_nested(((0, (2, 3)), (1, 2)), 4)
    assert t.children.tolist() == [[1, 2], [leaf(0), 3], [leaf(1), leaf(2)], [leaf(2), leaf(3)]]
    assert t.codes(0) == [([0, 1], [1, 1])]
    assert t.codes(1) == [([0, 2], [0, 1])]
    assert sorted(t.codes(2)) == sorted([([0, 2], [0, 0]), ([0, 1, 3], [1, 0, 1])])
    assert t.codes(3) == [([0, 1, 3], [1, 0, 0])]
    assert t.num_nodes == len(t.leaf_word) - 1


def test_breadth_first_numbering_is_canonical():
    # The same tree given with scrambled ids canonicalises to the same children.
    a = WordTree.from_nested(((0, 1), (2, (3, 4))), 5)
    b = WordTree.from_children([[leaf(3), leaf(4)], [leaf(0), leaf(1)], [1, 3], [leaf(2), 0]], root=2, num_words=5)
    assert np.array_equal(a.children, b.children)
    for level in a.levels:
        assert np.array_equal(level, np.arange(level[0], level[-1] + 1))


@pytest.mark.parametrize("name,tree", all_trees().items())
def test_paths_are_consistent_with_children(name, tree):
    ch = tree.children
    for lf in range(len(tree.leaf_word)):
        nodes = tree.path_nodes[lf][tree.path_mask[lf]]
        bits = tree.path_bits[lf][tree.path_mask[lf]]
        assert nodes[0] == 0
        for j, nxt, b in zip(nodes[:-1], nodes[1:], bits[:-1]):
            assert ch[j, 0 if b == 1 else 1] == nxt
        assert ch[nodes[-1], 0 if bits[-1] == 1 else 1] == leaf(tree.leaf_word[lf])
    assert (tree.codes_per_word >= 1).all()


@pytest.mark.parametrize(
    "children,num_words,message",
    [
        ([[leaf(0), leaf(0)]], 1, "at least 2 words"),
        ([[leaf(0), leaf(0)]], 2, "word 1 has no leaf"),
        ([[1, leaf(0)], [leaf(1), 5]], 3, "node 1 points to internal node 5"),
        ([[1, leaf(0)], [leaf(1), leaf(1)]], 2, "two leaves of word 1"),
        ([[1, leaf(0)], [leaf(1), leaf(2)]], 4, "word 3 has no leaf"),
        ([[1, 1], [leaf(0), leaf(1)]], 2, "node 1 has 2 parents"),
        ([[leaf(0), leaf(1)], [2, leaf(0)], [1, leaf(1)]], 2, "not reachable"),
        ([[1, leaf(0)], [0, leaf(1)]], 2, "root"),
        ([[leaf(0), leaf(9)]], 2, "word 9"),
    ],
)
def test_validation_names_the_problem(children, num_words, message):
    with pytest.raises(TreeError, match=message):
        WordTree(np.array(children), num_words)


def test_random_tree_is_balanced_and_seeded():
    t = random_tree(1000, seed=3)
    assert t.leaf_depth.min() >= 9 and t.leaf_depth.max() == 10
    assert np.array_equal(t.children, random_tree(1000, seed=3).children)
    assert not np.array_equal(t.children, random_tree(1000, seed=4).children)
    assert sorted(t.leaf_word.tolist()) == list(range(1000))


def test_balanced_tree_keeps_order():
    t = balanced_tree([3, 1, 0, 2])
    assert t.codes(3)[0][1] == [1, 1] and t.codes(2)[0][1] == [0, 0]


def test_huffman_is_optimal_on_a_known_case():
    # Counts 1,1,2,4: Huffman code lengths 3,3,2,1.
    t = huffman_tree([1, 1, 2, 4])
    assert [len(t.codes(w)[0][0]) for w in range(4)] == [3, 3, 2, 1]
    assert t.stats([1, 1, 2, 4])["mean_code_length"] == pytest.approx((3 + 3 + 4 + 4) / 8)


def test_stats_follow_table1_definitions():
    t = multi_code_tree()
    counts = np.arange(1, 7, dtype=float)
    p = counts / counts.sum()
    total_len = [sum(len(n) for n, _ in t.codes(w)) for w in range(6)]
    ncodes = [len(t.codes(w)) for w in range(6)]
    s = t.stats(counts)
    assert s["mean_code_length"] == pytest.approx(float(p @ total_len))
    assert s["codes_per_word"] == pytest.approx(float(p @ ncodes))
    assert s["internal_nodes"] == s["leaves"] - 1
    assert s["codes_per_word"] > 1


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_save_load_round_trip(tmp_path, suffix):
    t = multi_code_tree()
    t.save(tmp_path / f"t{suffix}")
    u = WordTree.load(tmp_path / f"t{suffix}")
    assert np.array_equal(t.children, u.children) and u.num_words == t.num_words


def test_load_rejects_damaged_and_foreign_files(tmp_path):
    t = unbalanced_tree()
    t.save(tmp_path / "t.json")
    text = (tmp_path / "t.json").read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(TreeError, match="not a readable word tree"):
        WordTree.load(tmp_path / "cut.json")
    (tmp_path / "foreign.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(TreeError, match="not an hlbl word tree"):
        WordTree.load(tmp_path / "foreign.json")
    bad = t.to_json()
    bad["children"][1][0] = 0  # a cycle back to the root
    (tmp_path / "cycle.json").write_text(json.dumps(bad))
    with pytest.raises(TreeError, match="cycle.json"):
        WordTree.load(tmp_path / "cycle.json")
    (tmp_path / "t.npz").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(TreeError, match="not a readable word tree"):
        WordTree.load(tmp_path / "t.npz")


def test_build_tree_checks_vocabulary_size(tmp_path):
    random_tree(5).save(tmp_path / "t.json")
    with pytest.raises(TreeError, match="5 words"):
        build_tree(str(tmp_path / "t.json"), 6)
    assert build_tree("huffman", 3, [5, 1, 1]).num_words == 3


def test_load_rejects_non_integer_ids(tmp_path):
    good = unbalanced_tree().to_json()
    for damage in (
        {"children": [[1.9 if x == 1 else x for x in row] for row in good["children"]]},
        {"children": [[str(x) for x in row] for row in good["children"]]},
        {"num_words": good["num_words"] + 0.7},
        {"num_words": str(good["num_words"])},
    ):
        (tmp_path / "t.json").write_text(json.dumps({**good, **damage}))
        with pytest.raises(TreeError, match="malformed word tree"):
            WordTree.load(tmp_path / "t.json")
    (tmp_path / "t.json").write_text(json.dumps(good))
    assert WordTree.load(tmp_path / "t.json").fingerprint() == unbalanced_tree().fingerprint()
    assert unbalanced_tree().fingerprint() != multi_code_tree().fingerprint()


def test_huffman_puts_the_more_frequent_side_left():
    counts = np.random.default_rng(0).integers(1, 1000, 300)
    t = huffman_tree(counts)
    mass = np.zeros(t.num_nodes)
    for nodes in reversed(t.levels):  # bottom-up subtree counts
        for j in nodes:
            side = [mass[c] if c >= 0 else counts[-1 - c] for c in t.children[j]]  # leaf(w) = -1 - w
            mass[j] = sum(side)
            assert side[0] >= side[1]


def _heap_huffman(counts) -> WordTree:
    """Huffman coding by a heap of (count, tiebreak): the textbook build that huffman_tree's two
    queues must equal, ties included."""
    import heapq

    heap = [(float(c), i, leaf(i)) for i, c in enumerate(counts)]
    heapq.heapify(heap)
    children, tick = [], len(counts)
    while len(heap) > 1:
        c1, _, a = heapq.heappop(heap)
        c2, _, b = heapq.heappop(heap)
        children.append([b, a])
        heapq.heappush(heap, (c1 + c2, tick, len(children) - 1))
        tick += 1
    return WordTree.from_children(children, len(children) - 1, len(counts))


@pytest.mark.parametrize("seed", range(6))
def test_huffman_is_the_heap_builds_tree_ties_included(seed):
    rng = np.random.default_rng(seed)
    V = int(rng.integers(2, 3000))
    counts = [
        rng.integers(0, 4, V),  # mostly ties, zeros too
        rng.integers(1, 10**6, V),
        rng.zipf(1.3, V).astype(float) / 7.0,  # floats whose sums round
    ][seed % 3]
    assert huffman_tree(counts).fingerprint() == _heap_huffman(counts).fingerprint()


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: balanced_tree([0]), "at least 2 words"),
        (lambda: balanced_tree([]), "at least 2 words"),
        (lambda: balanced_tree([0, -1, 2]), "permutation"),
        (lambda: balanced_tree([0.0, 1.0]), "integer word ids"),
        (lambda: WordTree.from_nested((-1, (0, 1)), 2), "word id -1 is out of range"),
        (lambda: huffman_tree([1, -5, 3]), "non-negative"),
        (lambda: huffman_tree([1, float("nan"), 3]), "finite"),
        (lambda: WordTree(np.array([[-1.7, -2.2]]), 2), "integer ids"),
        (lambda: WordTree(np.array([[-1, -2]]), 2.0), "num_words must be an integer"),
        (lambda: WordTree(np.array([[-1, -2]]), 10**12), "word 2 has no leaf"),
        (lambda: random_tree(2.5), "num_words must be an integer"),
    ],
)
def test_builders_refuse_bad_input_clearly(make, message):
    with pytest.raises(TreeError, match=message):
        make()


def test_npz_suffix_is_case_insensitive(tmp_path):
    tree = random_tree(7, 1)
    tree.save(tmp_path / "t.NPZ")
    assert (tmp_path / "t.NPZ").read_bytes()[:2] == b"PK"  # a zip archive, not JSON
    assert np.array_equal(WordTree.load(tmp_path / "t.NPZ").children, tree.children)


def caterpillar(num_words: int) -> WordTree:
    """Word j (j < V - 2) is the left leaf of node j, whose right child is node j + 1: depth V - 1."""
    children = np.array([[leaf(j), j + 1] for j in range(num_words - 1)], dtype=np.int64)
    children[-1] = [leaf(num_words - 2), leaf(num_words - 1)]
    return WordTree(children, num_words)


def test_the_stats_of_a_deep_tree_are_linear_in_its_size():
    """Statistics need each leaf's depth, not the (leaves, depth) padded paths (quadratic here)."""
    import tracemalloc

    tracemalloc.start()
    try:
        tree = caterpillar(4000)
        stats = tree.stats()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # the padded paths: 4000 x 3999 x 10 bytes = 160 MB
    assert stats["max_depth"] == 3999 and stats["leaves"] == 4000
    assert stats["mean_code_length"] == pytest.approx((sum(range(1, 4000)) + 3999) / 4000)
    small = caterpillar(7)
    np.testing.assert_array_equal(small.leaf_depth, small.path_mask.sum(1))  # the same depths as the paths'


def test_a_tree_whose_padded_paths_exceed_the_memory_bound_is_refused(monkeypatch, tmp_path):
    import hlbl.tree as tree_module
    from hlbl.output import TreeSoftmax

    monkeypatch.setattr(tree_module, "memory_limit", lambda: 64 << 20)  # a quarter: 16 MiB
    deep = caterpillar(1500)  # 1500 x 1499 x 18 bytes = 40 MB
    with pytest.raises(TreeError) as e:
        TreeSoftmax(8, deep)
    msg = str(e.value)
    for words in ("1,500 leaves", "depth 1,499", "GiB", "a quarter of the 0.0625 GiB"):
        assert words in msg, msg
    assert "\n" not in msg
    assert deep.stats()["max_depth"] == 1499  # what needs no paths still works
    path = tmp_path / "deep.json"
    deep.save(path)
    with pytest.raises(TreeError, match=f"^{path}: a tree of 1,500 leaves and depth 1,499"):
        build_tree(str(path), 1500)
    TreeSoftmax(8, random_tree(1500, 0))  # a balanced tree of as many words: 1500 x 11 x 18 bytes


def test_a_huffman_tree_of_a_large_vocabulary_is_within_the_bound(monkeypatch):
    """360k Zipf-distributed words: depth in the twenties, padded paths ~150 MB, under a quarter of 4 GiB."""
    import hlbl.tree as tree_module

    monkeypatch.setattr(tree_module, "memory_limit", lambda: 4 << 30)
    counts = np.maximum(1, (1e8 / np.arange(1, 360_001)).astype(np.int64))
    tree = huffman_tree(counts)
    assert 20 <= int(tree.leaf_depth.max()) <= 45
    tree.check_path_tables()

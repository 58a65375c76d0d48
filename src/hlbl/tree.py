"""Word trees as data: a binary tree whose leaves are words, a word possibly at several leaves.

Layout (node ids are breadth-first: root 0, then level by level, left child before right)::

                      node 0            P(left at j) = sigmoid(h . q_j + b_j)
                  1 /        \\ 0        bit 1 = left, bit 0 = right (the paper's d_j = 1)
              node 1          node 2
             1/    \\0        1/    \\0
           "the"  node 3    "cat"   "a"       codes: "the" = nodes (0, 1)    bits (1, 1)
                 1/    \\0                            "cat" = nodes (0, 2)    bits (0, 1)
               "a"    "sat"                          "a"   = nodes (0, 2) bits (0, 0)
                                                           + nodes (0, 1, 3) bits (1, 0, 1)

Stored as ``children``, an ``(N, 2)`` int array: ``children[j] = (left, right)``, where a value
``c >= 0`` is internal node ``c`` and ``c < 0`` is a leaf for word ``-1 - c``. Leaves are
numbered breadth-first too (the order in which a level-by-level walk meets them); this is the
order ``leaf_word`` and the padded path tensors use, and the order in which the full
distribution is produced level by level.

The padded path tables hold ``L x D`` entries (``D`` the deepest leaf's depth): about
``PATH_STEP_BYTES`` (18) bytes each with their copies in the output layer and the fast engine.
A tree for which they would take more than a quarter of the memory the process may have
(:func:`hlbl.memory.memory_limit`) is refused when they are first needed, with the numbers
(a caterpillar over 15,655 words: 4.1 GiB; a Huffman tree over 360k words, depth 35: 0.2 GiB).
Statistics, depths and leaf words need no padded tables: they cost time and memory linear in
the tree's size, whatever its depth.

Invariants (checked by :meth:`WordTree.validate`): one root (node 0), every other internal node
has exactly one parent, every node reachable from the root (so no cycles), internal ids are
``0..N-1``, every word ``0..V-1`` has at least one leaf, and no internal node has two leaves of
the same word. A tree with ``L`` leaves has ``N = L - 1`` internal nodes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

from .atomic import atomic_path
from .errors import TreeError
from .files import refuse_special
from .memory import memory_limit

TREE_FORMAT = "hlbl-word-tree"
TREE_VERSION = 1
# Bytes a padded path step costs: the tree's nodes (int64), bits (int8) and mask (bool), the
# output layer's signs (float32) and the fast engine's path records (int32).
PATH_STEP_BYTES = 8 + 1 + 1 + 4 + 4
PATH_MEMORY_SHARE = 4  # the padded tables may take a quarter of memory_limit()


def leaf(word: int) -> int:
    """The child value that denotes a leaf of ``word``."""
    return -1 - int(word)


@dataclass(frozen=True, eq=False)
class WordTree:
    """An immutable, validated word tree in canonical breadth-first numbering."""

    children: np.ndarray  # (N, 2) int64
    num_words: int
    _checked: bool = field(default=False, repr=False)

    def __post_init__(self):
        raw = np.asarray(self.children)
        if raw.size and raw.dtype.kind not in "iu":  # a float or string id would be silently truncated
            raise TreeError(f"children must be integer ids, not {raw.dtype}")
        if isinstance(self.num_words, bool) or not isinstance(self.num_words, (int, np.integer)):
            raise TreeError(f"num_words must be an integer, not {self.num_words!r}")
        object.__setattr__(self, "num_words", int(self.num_words))
        ch = np.ascontiguousarray(raw, dtype=np.int64)
        object.__setattr__(self, "children", ch)
        if not self._checked:
            self.validate()
            canon = _canonical(ch)
            object.__setattr__(self, "children", canon)
            object.__setattr__(self, "_checked", True)
        self.children.setflags(write=False)

    # ---- construction -----------------------------------------------------------------------

    @classmethod
    def from_children(cls, children: Sequence[Sequence[int]], root: int, num_words: int) -> "WordTree":
        """Build from ``(left, right)`` pairs with arbitrary internal ids; ``root`` is renumbered 0."""
        ch = np.asarray(children, dtype=np.int64).reshape(-1, 2)
        n = len(ch)
        if not 0 <= root < max(n, 1):
            raise TreeError(f"root {root} is not an internal node id (0..{n - 1})")
        # Swap ids so the root becomes 0; canonical BFS numbering follows in __post_init__.
        perm = np.arange(n)
        perm[[0, root]] = perm[[root, 0]]
        remap = np.where(ch >= 0, perm[np.clip(ch, 0, None)], ch)
        return cls(remap[perm], int(num_words))

    @classmethod
    def from_nested(cls, nested, num_words: int) -> "WordTree":
        """Build from nested pairs: a word id is a leaf, a 2-tuple/list is an internal node."""
        children: list[list[int]] = []

        def visit(x) -> int:
            if isinstance(x, (int, np.integer)):
                if not 0 <= x < num_words:
                    raise TreeError(f"word id {x} is out of range 0..{num_words - 1}")
                return leaf(x)
            if len(x) != 2:
                raise TreeError(f"an internal node needs exactly two children, got {len(x)}")
            j = len(children)
            children.append([0, 0])
            children[j] = [visit(x[0]), visit(x[1])]
            return j

        if isinstance(nested, (int, np.integer)):
            raise TreeError("a tree needs at least two leaves")
        visit(nested)
        return cls(np.asarray(children, dtype=np.int64), num_words)

    # ---- validation -------------------------------------------------------------------------

    def validate(self) -> None:
        ch, V = self.children, self.num_words
        if ch.ndim != 2 or ch.shape[1] != 2:
            raise TreeError(f"children must have shape (N, 2), got {ch.shape}")
        N = len(ch)
        if V < 2:
            raise TreeError(f"a word tree needs at least 2 words, got {V}")
        if N == 0:
            raise TreeError("a tree needs at least one internal node")
        if V > N + 1:  # N internal nodes hold N + 1 leaves: some word has none (found without O(V) memory)
            present = np.unique(-1 - ch[(ch < 0) & (ch >= -V)])
            gaps = np.flatnonzero(present != np.arange(len(present)))
            first = int(gaps[0]) if len(gaps) else len(present)
            raise TreeError(f"word {first} has no leaf ({V - len(present)} words have none)")
        too_big = np.argwhere(ch >= N)
        if len(too_big):
            j, s = too_big[0]
            raise TreeError(f"node {j} points to internal node {ch[j, s]}, but ids stop at {N - 1}")
        bad_word = np.argwhere(ch < -V)
        if len(bad_word):
            j, s = bad_word[0]
            raise TreeError(f"node {j} has a leaf for word {-1 - ch[j, s]}, but the vocabulary has {V} words")
        internal = ch[ch >= 0]
        parents = np.bincount(internal, minlength=N)
        if parents[0] != 0:
            raise TreeError("node 0 (the root) has a parent")
        multi = np.flatnonzero(parents[1:] != 1) + 1
        if len(multi):
            j = int(multi[0])
            raise TreeError(f"node {j} has {parents[j]} parents; every non-root node needs exactly one")
        # N-1 parent links with one parent each: reachability from the root rules out cycles.
        seen = np.zeros(N, dtype=bool)
        seen[_breadth_first_order(ch)] = True
        if not seen.all():
            j = int(np.flatnonzero(~seen)[0])
            raise TreeError(f"node {j} is not reachable from the root (a cycle or a second root)")
        words = -1 - ch[ch < 0]
        have = np.bincount(words, minlength=V)
        missing = np.flatnonzero(have == 0)
        if len(missing):
            raise TreeError(f"word {int(missing[0])} has no leaf ({len(missing)} words have none)")
        dup = np.flatnonzero((ch[:, 0] < 0) & (ch[:, 0] == ch[:, 1]))
        if len(dup):
            j = int(dup[0])
            raise TreeError(f"node {j} has two leaves of word {-1 - ch[j, 0]}")

    # ---- derived arrays ---------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return len(self.children)

    @cached_property
    def levels(self) -> list[np.ndarray]:
        """Internal node ids of each depth (contiguous ranges, as numbering is breadth-first)."""
        return _levels(self.children)

    @cached_property
    def _leaves(self) -> dict[str, np.ndarray]:
        """Per internal node its parent and the bit that leads to it; per leaf (breadth-first) its
        word, depth, parent and bit. Linear in the tree's size, whatever its depth."""
        ch = self.children
        N = len(ch)
        parent = np.full(N, -1, dtype=np.int64)
        pbit = np.zeros(N, dtype=np.int8)
        for s, bit in ((0, 1), (1, 0)):
            m = ch[:, s] >= 0
            parent[ch[m, s]] = np.flatnonzero(m)
            pbit[ch[m, s]] = bit
        depth = np.zeros(N, dtype=np.int64)
        for d, lv in enumerate(self.levels):
            depth[lv] = d
        # Leaves in breadth-first order: level by level, node order, left before right.
        flat = ch.reshape(-1)  # slot 2j = left of j, 2j+1 = right of j; BFS ids keep levels sorted
        slots = np.flatnonzero(flat < 0)
        leaf_parent = slots // 2
        return {
            "parent": parent,
            "pbit": pbit,
            "word": -1 - flat[slots],
            "depth": depth[leaf_parent] + 1,
            "leaf_parent": leaf_parent,
            "leaf_bit": np.where(slots % 2 == 0, 1, 0).astype(np.int8),
        }

    @property
    def path_table_bytes(self) -> int:
        """Bytes the padded path tables take with their copies (leaves x depth x PATH_STEP_BYTES)."""
        return len(self.leaf_word) * int(self.leaf_depth.max()) * PATH_STEP_BYTES

    def check_path_tables(self, name: str | None = None) -> None:
        """Refuse a tree whose padded path tables would take more than a quarter of the memory this
        process may have (module doc); ``name`` (the tree's file) starts the message."""
        limit = memory_limit()
        need = self.path_table_bytes
        if limit is None or need <= limit // PATH_MEMORY_SHARE:
            return
        L, D = len(self.leaf_word), int(self.leaf_depth.max())
        raise TreeError(
            f"{name + ': ' if name else ''}a tree of {L:,} leaves and depth {D:,} needs padded path tables of "
            f"{need / 2**30:.3g} GiB ({L:,} x {D:,} steps x {PATH_STEP_BYTES} bytes), more than a quarter of the "
            f"{limit / 2**30:.3g} GiB of memory this process may have; use a shallower tree (random or huffman)"
        )

    @cached_property
    def _paths(self) -> dict[str, np.ndarray]:
        self.check_path_tables()
        leaves = self._leaves
        parent, pbit, leaf_depth = leaves["parent"], leaves["pbit"], leaves["depth"]
        L, D = len(leaf_depth), int(leaf_depth.max())
        nodes = np.zeros((L, D), dtype=np.int64)
        bits = np.zeros((L, D), dtype=np.int8)
        mask = np.zeros((L, D), dtype=bool)
        cur, cbit = leaves["leaf_parent"].copy(), leaves["leaf_bit"].copy()
        pos = leaf_depth - 1
        alive = np.ones(L, dtype=bool)
        while alive.any():
            idx = np.flatnonzero(alive)
            nodes[idx, pos[idx]] = cur[idx]
            bits[idx, pos[idx]] = cbit[idx]
            mask[idx, pos[idx]] = True
            cbit[idx] = pbit[cur[idx]]
            cur[idx] = parent[cur[idx]]
            pos[idx] -= 1
            alive = cur >= 0
        return {"nodes": nodes, "bits": bits, "mask": mask}

    @property
    def leaf_word(self) -> np.ndarray:
        """(L,) word of each leaf, leaves in breadth-first order."""
        return self._leaves["word"]

    @property
    def path_nodes(self) -> np.ndarray:
        """(L, D) internal nodes from the root to each leaf, 0-padded past the leaf's depth."""
        return self._paths["nodes"]

    @property
    def path_bits(self) -> np.ndarray:
        """(L, D) int8 decisions along each path: 1 = left, 0 = right (and 0 in padding)."""
        return self._paths["bits"]

    @property
    def path_mask(self) -> np.ndarray:
        """(L, D) bool, True on the real steps of each path."""
        return self._paths["mask"]

    @property
    def leaf_depth(self) -> np.ndarray:
        return self._leaves["depth"]

    @cached_property
    def word_leaves(self) -> np.ndarray:
        """(V, K) leaf ids of each word, -1-padded; K = the largest number of codes of a word."""
        order = np.argsort(self.leaf_word, kind="stable")
        w = self.leaf_word[order]
        counts = np.bincount(w, minlength=self.num_words)
        K = int(counts.max())
        start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        rank = np.arange(len(w)) - start[w]
        out = np.full((self.num_words, K), -1, dtype=np.int64)
        out[w, rank] = order
        return out

    @property
    def codes_per_word(self) -> np.ndarray:
        return np.bincount(self.leaf_word, minlength=self.num_words)

    def codes(self, word: int) -> list[tuple[list[int], list[int]]]:
        """The (nodes, bits) of every leaf of ``word``."""
        out = []
        for lf in self.word_leaves[word]:
            if lf >= 0:
                m = self.path_mask[lf]
                out.append((self.path_nodes[lf][m].tolist(), self.path_bits[lf][m].tolist()))
        return out

    # ---- statistics -------------------------------------------------------------------------

    def stats(self, counts: Sequence[float] | None = None) -> dict:
        """Table 1 of the paper: code length and codes per word averaged under ``counts``.

        Mean code length is the *sum* of the lengths of all of a word's codes, averaged under
        the unigram distribution; codes per word likewise. Without counts, words weigh equally.
        """
        p = np.ones(self.num_words) if counts is None else np.asarray(counts, dtype=np.float64)
        if len(p) != self.num_words:
            raise TreeError(f"{len(p)} counts for a tree of {self.num_words} words")
        total_len = np.bincount(self.leaf_word, weights=self.leaf_depth, minlength=self.num_words)
        # Weighted sums divided once (not p / p.sum() first): a single-code tree gives exactly 1.0.
        return {
            "words": self.num_words,
            "internal_nodes": self.num_nodes,
            "leaves": int(len(self.leaf_word)),
            "mean_code_length": float(p @ total_len / p.sum()),
            "codes_per_word": float(p @ self.codes_per_word / p.sum()),
            "max_depth": int(self.leaf_depth.max()),
            "weighting": "uniform" if counts is None else "unigram",  # of the two means above
        }

    # ---- files ------------------------------------------------------------------------------

    def fingerprint(self) -> str:
        """SHA-256 of the canonical structure: equal for equal trees, whatever file they came from."""
        h = hashlib.sha256(np.int64(self.num_words).tobytes())
        h.update(np.ascontiguousarray(self.children, dtype="<i8").tobytes())
        return h.hexdigest()

    def to_json(self) -> dict:
        return {
            "format": TREE_FORMAT,
            "version": TREE_VERSION,
            "num_words": self.num_words,
            "children": self.children.tolist(),
        }

    @classmethod
    def from_json(cls, obj: dict) -> "WordTree":
        if not isinstance(obj, dict) or obj.get("format") != TREE_FORMAT:
            raise TreeError(f"not an hlbl word tree (expected format {TREE_FORMAT!r})")
        if obj.get("version") != TREE_VERSION:
            raise TreeError(f"word tree version {obj.get('version')} is not supported (this hlbl reads {TREE_VERSION})")
        try:
            children, num_words = np.asarray(obj["children"]), obj["num_words"]
            # Ids must be integers as written: a float or string would be silently truncated.
            if children.size and children.dtype.kind not in "iu":
                raise TreeError(f"malformed word tree: children must be integers, not {children.dtype}")
            if isinstance(num_words, bool) or not isinstance(num_words, (int, np.integer)):
                raise TreeError(f"malformed word tree: num_words must be an integer, not {num_words!r}")
            return cls(children.astype(np.int64), int(num_words))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, TreeError):
                raise
            raise TreeError(f"malformed word tree: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON (``.json``) or numpy (``.npz``, no pickle), atomically."""
        path = Path(path)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            if path.suffix.lower() == ".npz":
                np.savez(
                    f,
                    children=self.children,
                    num_words=np.int64(self.num_words),
                    format=np.array(TREE_FORMAT),
                    version=np.int64(TREE_VERSION),
                )
            else:
                f.write(json.dumps(self.to_json()).encode())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WordTree":
        path = Path(path)
        refuse_special(path, TreeError, "a tree file")
        if not path.is_file():
            raise TreeError(f"{path}: no such tree file")
        try:
            if path.suffix.lower() == ".npz":
                with np.load(path, allow_pickle=False) as z:
                    obj = {
                        "format": str(z["format"]),
                        "version": int(z["version"]),
                        "num_words": z["num_words"].item(),
                        "children": z["children"],
                    }
            else:
                obj = json.loads(path.read_text(encoding="utf-8"))
        except TreeError:
            raise
        except Exception as e:  # a damaged or foreign file: zip, JSON or key errors
            raise TreeError(f"{path}: not a readable word tree ({type(e).__name__}: {e})") from None
        try:
            return cls.from_json(obj)
        except TreeError as e:
            raise TreeError(f"{path}: {e}") from None


def _levels(ch: np.ndarray) -> list[np.ndarray]:
    """Internal nodes reachable from node 0, one array per depth, left child before right.

    One numpy step per level; assumes every node has at most one parent (checked before), so
    the walk visits each reachable node once and ends.
    """
    frontier, levels = np.zeros(1, dtype=np.int64), []
    while len(frontier):
        levels.append(frontier)
        kids = ch[frontier].reshape(-1)
        frontier = kids[kids >= 0]
    return levels


def _breadth_first_order(ch: np.ndarray) -> np.ndarray:
    """Internal nodes reachable from node 0, breadth-first, left child before right."""
    return np.concatenate(_levels(ch))


def _canonical(ch: np.ndarray) -> np.ndarray:
    """Renumber internal nodes breadth-first from node 0 (left child before right)."""
    order = _breadth_first_order(ch)
    new_id = np.empty(len(ch), dtype=np.int64)
    new_id[order] = np.arange(len(ch))
    out = ch[order]
    return np.where(out >= 0, new_id[np.clip(out, 0, None)], out)


# ---- builders -------------------------------------------------------------------------------


def _halving(words: np.ndarray) -> np.ndarray:
    """(N, 2) children of the tree that halves ``words`` recursively (the larger half left).

    Built level by level: each level is a set of blocks ``[start, end)`` of ``words``; blocks of
    two or more words are internal nodes, numbered breadth-first as they appear.
    """
    words = np.asarray(words, dtype=np.int64)
    start, end = np.zeros(1, dtype=np.int64), np.array([len(words)], dtype=np.int64)
    next_id, rows = 1, []
    while len(start):
        mid = start + (end - start + 1) // 2
        kid_start = np.stack([start, mid], 1).reshape(-1)  # left, right of each block in order
        kid_end = np.stack([mid, end], 1).reshape(-1)
        single = kid_end - kid_start == 1
        vals = np.empty(len(kid_start), dtype=np.int64)
        vals[single] = -1 - words[kid_start[single]]
        vals[~single] = next_id + np.arange(int((~single).sum()))
        next_id += int((~single).sum())
        rows.append(vals.reshape(-1, 2))
        start, end = kid_start[~single], kid_end[~single]
    return np.concatenate(rows)


def random_tree(num_words: int, seed: int = 0) -> WordTree:
    """The paper's RANDOM tree: a random permutation of the words, halved recursively."""
    if isinstance(num_words, bool) or not isinstance(num_words, (int, np.integer)):
        raise TreeError(f"num_words must be an integer, not {num_words!r}")
    if num_words < 2:
        raise TreeError(f"a word tree needs at least 2 words, got {num_words}")
    perm = np.random.default_rng(seed).permutation(num_words)
    return WordTree(_halving(perm), num_words)


def balanced_tree(order: Sequence[int]) -> WordTree:
    """Recursive halving of the words in the given order (``order`` is a permutation of 0..V-1)."""
    order = np.asarray(order)
    if order.ndim != 1 or (order.size and order.dtype.kind not in "iu"):
        raise TreeError(f"order must be a 1-D sequence of integer word ids, got {order.dtype} of shape {order.shape}")
    if len(order) < 2:
        raise TreeError(f"a word tree needs at least 2 words, got {len(order)}")
    if not np.array_equal(np.sort(order), np.arange(len(order))):
        raise TreeError(f"order must be a permutation of the word ids 0..{len(order) - 1}")
    return WordTree(_halving(order.astype(np.int64)), len(order))


def huffman_tree(counts: Sequence[float]) -> WordTree:
    """The word2vec / fastText tree: Huffman coding of the training counts (ties by word id)."""
    counts = np.asarray(counts, dtype=np.float64)
    V = len(counts)
    if V < 2:
        raise TreeError(f"a word tree needs at least 2 words, got {V}")
    if not np.isfinite(counts).all() or (counts < 0).any():
        raise TreeError("a Huffman tree needs finite, non-negative word counts")
    # Each step joins the two least frequent items, ties by (words by id) < (joined nodes by
    # age): the order of a heap of (count, tiebreak) with joined nodes' tiebreaks from V up. Two
    # queues give it in linear time: the words sorted by (count, id), and the joined nodes in the
    # order they are made, whose counts never decrease (each joins items no lighter than the last
    # join's; float rounding is monotone), so the lighter of the two heads is the heap's minimum.
    order = np.argsort(counts, kind="stable")  # (ties by id)
    word_count, word = counts[order].tolist(), order.tolist()
    joined: list[float] = []  # counts of children[0], children[1], ...
    children: list[list[int]] = []
    i = j = 0

    def take() -> tuple[float, int]:
        nonlocal i, j
        if j == len(joined) or (i < V and word_count[i] <= joined[j]):  # (a word first on a tie)
            i += 1
            return word_count[i - 1], leaf(word[i - 1])
        j += 1
        return joined[j - 1], j - 1

    for _ in range(V - 1):
        c1, a = take()
        c2, b = take()
        children.append([b, a])  # the more frequent side on the left
        joined.append(c1 + c2)
    return WordTree.from_children(children, len(children) - 1, V)


def build_tree(kind: str, num_words: int, counts: Sequence[float] | None = None, seed: int = 0) -> WordTree:
    """``random``, ``huffman``, or a path to a saved tree."""
    if kind == "random":
        return random_tree(num_words, seed)
    if kind == "huffman":
        if counts is None:
            raise TreeError("a Huffman tree needs word counts")
        return huffman_tree(counts)
    tree = WordTree.load(kind)
    if tree.num_words != num_words:
        raise TreeError(f"{kind}: tree has {tree.num_words} words, the vocabulary {num_words}")
    tree.check_path_tables(kind)  # before training needs them, naming the file
    return tree

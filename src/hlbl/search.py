"""Exact top-k next words on a word tree, by branch and bound (and by sorting for other layers).

**Exact top-k on a tree.** Every internal node ``j`` of a word tree carries the probability of
reaching it, ``P(prefix) = prod of the decisions from the root to j``, and every leaf below ``j``
has a probability at most ``P(prefix)`` (it multiplies further factors <= 1). So once k words
are held and the k-th best of them, v_k, beats every open prefix, no word left can enter the
top k. A node is scored (``h . q_j + b_j``, O(d)) only when it is expanded, and the search only
needs to expand the nodes whose prefix probability is at least v_k: a best-first search, which
always expands the most probable open item, expands just those. This does not contradict the
textbook remark (Goodfellow, Bengio & Courville, 12.4.3.2) that the most likely word has no
efficient exact search: in the worst case (flat decisions) the search still scores all N nodes;
on trained models it scores a small fraction of them (``bench/topk.py``).

**The frontier is a bucket queue**, not a heap: exactness needs every node at least as probable
as v_k expanded and the leaves met ranked exactly, not the nodes in strict order, and a heap's
sift costs more than scoring a node. Bucket b holds the open items whose key lies b / _PER_NAT
to (b + 1) / _PER_NAT nats below the best possible key (the last bucket: everything further, and
NaN). The search takes the newest item of the best non-empty bucket (depth first within a
bucket, so leaves come early; the first child that lands in that bucket is taken at once,
without being stored); once k words are held, an item worse than v_k is dropped, and the search ends when v_k
exceeds the best bucket's upper edge. Keys never increase from a node to its children, so the
best non-empty bucket only moves down: one cursor walks the buckets. The search expands the
best-first search's nodes plus at most those in v_k's bucket (~0.3% more nodes on PTB).
Implementation: numba kernels (GIL released) per slice of contexts, slices in parallel threads;
:func:`_topk_single` for trees whose words have one code each, :func:`_topk_multi` for any tree.

**Multi-code trees** (a word's probability is the sum over its leaves). When the search takes
the first leaf of a word, that word is *resolved*: its probability is computed exactly by
evaluating the paths of all its leaves (O(K D d), reusing nodes already scored); leaves of a
resolved word are dropped from the frontier. Bound: let ``c(F)`` be the largest number of codes
of any word with a leaf below frontier item F (a leaf of word w: ``c = codes(w)``). An
unresolved word w has had none of its leaves taken, so each of its ``codes(w)`` leaves lies
below some frontier item, or below an item dropped as worse than v_k; so ``P(w) <= codes(w) *
max P(F) over those items <= max over all frontier items of c(F) * P(F)``, or below v_k. The
buckets order items by this key ``log P(F) + log c(F)`` (it never increases from a node to its
children), and the search ends once the k-th best resolved word exceeds the best bucket's edge
(by a 1e-12 margin in log space, for rounding): no unresolved word can enter the top k, and the
resolved words' values are exact. (If the frontier empties, every word is resolved.) A word of
one code is exact when its leaf is met and goes straight into the list, and on a single-code
tree every key is the plain log-probability: the rule above, with exact bucket edges.

The bound holds in floating point too: a prefix log-probability is a running sum of
``log sigmoid`` terms <= 0, and rounding is monotone, so a child's key never exceeds its
parent's; a path's log-probability is accumulated from the root in the same order, by the same
functions, during expansion and resolution, so both give bit-identical values.

**Ties** are broken deterministically: equal probabilities rank the lower word id first. The
search drops an item only when it is strictly worse than v_k, and ends only when v_k strictly
beats the best bucket's edge, so every subtree that could hold a word as probable as v_k is
opened, and the top list orders equal values by word id.

**Cost accounting.** ``TopK.nodes`` counts the distinct internal nodes whose score was computed
for each context (expansion and resolution together); the full distribution scores all N.

Sampling is in :mod:`hlbl.sampling`, sentence scoring in :mod:`hlbl.scoring`.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

import numba
import numpy as np

from .tree import WordTree

if TYPE_CHECKING:  # the kernels and TreeSearch work on numpy arrays: torch is imported by the
    import torch  # functions that take or give tensors (inference without torch: hlbl.numpy_model)

# Margin (in log space) by which the k-th resolved word must beat the bound on unresolved words
# in multi-code trees; covers rounding in log-sum-exp. Conservative: a larger margin only
# expands more nodes, it never changes the answer.
_LOG_MARGIN = 1e-12

# The frontier's buckets (module docstring): _PER_NAT a nat, a power of two (exact edges on
# single-code trees), 64 nats of them before the last. 16 a nat: ~0.3% more nodes scored than in
# strict best-first order on PTB, and ~1,000 bucket heads (8 KB) that stay in L1.
_PER_NAT = 16.0
_BUCKETS = 16 * 64 + 1


class TopK(NamedTuple):
    values: torch.Tensor  # (B, k) log-probabilities, best first
    indices: torch.Tensor  # (B, k) int64 word ids; ties: lower word id first
    nodes: torch.Tensor  # (B,) int64 internal nodes scored per context


# ---- bundles ----------------------------------------------------------------------------------
# N internal nodes, V words, L leaves, K = the most codes (leaves) of a word, D = the deepest leaf.


class TreeArrays(NamedTuple):
    """The tree in the numpy layout the kernels read (derived from the immutable tree only)."""

    children: np.ndarray  # (N, 2) int64: child node id >= 0, or -1 - word id for a leaf
    ncodes: np.ndarray  # (V,) int64 leaves per word
    log_codes: np.ndarray  # (V,) float64 log ncodes
    log_codes_below: np.ndarray  # (N,) float64 log of the most codes of a word with a leaf below node j
    word_leaves: np.ndarray  # (V, K) int64, -1 padded
    path_nodes: np.ndarray  # (L, D) int64
    path_bits: np.ndarray  # (L, D) int8, 1 = left
    leaf_depth: np.ndarray  # (L,) int64


class NodeWeights(NamedTuple):
    """The internal nodes' weights (:func:`node_weights`): s_j = h . W[j] + b[j]. float32 or
    float64, C-contiguous; read only."""

    W: np.ndarray  # (N, d) node vectors q_j
    b: np.ndarray  # (N,) node biases


class Scratch(NamedTuple):
    """One thread's search scratch for a tree (:func:`scratch`); reused by every context it
    searches without clearing: each context has its own tag (> 0), and ``stamp`` / ``resolved``
    entries equal to that tag are the ones set for it (so entries from earlier contexts, all
    with smaller tags, read as unset)."""

    # (score, stamp, resolved: (0,) where K == 1, see scratch)
    score: np.ndarray  # (N,) float64 node scores, valid where stamp == tag
    stamp: np.ndarray  # (N,) int64 tag of the context whose score[j] is cached
    resolved: np.ndarray  # (V,) int64 tag of the context in which word w was resolved
    buf: np.ndarray  # (K,) float64 the leaves' log-probabilities of the word being resolved
    # The frontier, a bucket queue (_topk_single, _topk_multi): item i is inode[i] (a node id, or
    # _LEAF + a word id) reached with log-probability ilp[i], with bound ikey[i]; bucket_head[b]
    # is the newest item of bucket b (-1: empty), inext[i] the item under i in its bucket. Every
    # bucket is empty between contexts. At most N nodes and N + 1 leaves are items of a context.
    bucket_head: np.ndarray  # (_BUCKETS,) int64
    ikey: np.ndarray  # (2N + 1,) float64; (N + 1,) where K == 1 (see scratch)
    ilp: np.ndarray  # (2N + 1,) float64; unused (0,) where K == 1
    inode: np.ndarray  # (2N + 1,) int64; (N + 1,)
    inext: np.ndarray  # (2N + 1,) int64; (N + 1,)


@numba.njit(cache=True)
def scratch(N: int, V: int, K: int) -> Scratch:
    """Fresh :class:`Scratch` for a tree of N internal nodes, V words and at most K codes a
    word; its stamps are all 0, so it serves contexts tagged 1, 2, ... (jitted: the kernels
    call it too). With K == 1 (:func:`_topk_single`: no score cache, no resolution, no leaf
    items) the O(N + V) arrays that must start at zero are empty, so that a call for one
    context does not pay for zeroing them."""
    cached = 0 if K == 1 else N  # nodes with a score cache
    items = N + 1 if K == 1 else 2 * N + 1
    return Scratch(
        np.empty(cached, dtype=np.float64),
        np.zeros(cached, dtype=np.int64),
        np.zeros(0 if K == 1 else V, dtype=np.int64),
        np.empty(K, dtype=np.float64),
        np.full(_BUCKETS, -1, dtype=np.int64),
        np.empty(items, dtype=np.float64),
        np.empty(0 if K == 1 else items, dtype=np.float64),
        np.empty(items, dtype=np.int64),
        np.empty(items, dtype=np.int64),
    )


class ScratchPool:
    """Search scratch for one tree, one per thread, kept between calls: a search for a few
    contexts then reuses its thread's scratch instead of allocating one, whose fresh pages cost
    more than the search at a large V (each context is stamped with the thread's next tags).
    A copy or a pickle of the pool is an empty pool of the same tree shape: scratch is not state."""

    def __init__(self, N: int, V: int, K: int):
        self.shape = (int(N), int(V), int(K))
        self._local = threading.local()

    @staticmethod
    def shape_of(arrays: TreeArrays) -> tuple[int, int, int]:
        """(N, V, K) of a tree's arrays: what its scratch is sized by."""
        return arrays.children.shape[0], arrays.ncodes.shape[0], arrays.word_leaves.shape[1]

    @classmethod
    def of(cls, arrays: TreeArrays) -> "ScratchPool":
        return cls(*cls.shape_of(arrays))

    def take(self, rows: int) -> tuple[Scratch, int]:
        """This thread's scratch and tag0 for a call on ``rows`` contexts (stamped tag0 + 1 ..
        tag0 + rows); the thread's tag moves past them before the call, so stamps stay unique
        even after an error."""
        local = self._local
        if getattr(local, "scratch", None) is None:
            local.scratch, local.tag = scratch(*self.shape), 0
        tag0 = local.tag
        local.tag += rows
        return local.scratch, tag0

    def __reduce__(self):
        return (ScratchPool, self.shape)


# ---- numba kernels ----------------------------------------------------------------------------
# The kernels take the bundles; the hot inlined helpers (buckets, node score) take arrays: numba
# takes and drops a reference for every read of a tuple's field, so a kernel reads each bundle's
# fields into locals once (per context, per resolved word) and passes those.


@numba.njit(cache=True, inline="always")
def _log_sigmoid_pair(s):
    """(log sigmoid(s), log sigmoid(-s)) with one exp and one log1p: the left and right
    decisions at a node. The only place decisions are computed, so all paths agree bit for bit."""
    t = math.log1p(math.exp(-abs(s)))
    if s >= 0.0:
        return -t, -s - t
    return s - t, -t


# A frontier item's node is a node id, or _LEAF + word id for a leaf of a word of several codes.
_LEAF = np.int64(1) << np.int64(40)


@numba.njit(cache=True, inline="always")
def _file_item(i, bucket, head, inext, cursor, carry, top_used):
    """Item i (its bucket computed) into the frontier: kept as the carry (taken next) if it is
    the first to land in the best bucket, else at the head of its bucket; returns the new
    (carry, top_used), top_used being the last bucket used (to empty them at the end)."""
    if carry < 0 and bucket == cursor:
        return i, top_used
    inext[i] = head[bucket]
    head[bucket] = i
    return carry, max(top_used, bucket)


@numba.njit(cache=True, inline="always")
def _empty_buckets(head, cursor, top_used):
    """Empty the buckets a search left behind (all before the cursor are empty already)."""
    for bucket in range(cursor, top_used + 1):
        head[bucket] = -1


@numba.njit(cache=True, inline="always")
def _bucket_of(x, cursor):
    """The bucket of an item ``x = (top - key) * _PER_NAT`` nats below the best possible key:
    floor(x), the last bucket for everything beyond it (and NaN). Never before ``cursor``, the
    bucket its parent was taken from: keys do not increase from parent to child, so this only
    holds the queue's invariant (a bucket behind the cursor would never be emptied) whatever
    the arithmetic."""
    return max(cursor, np.int64(x) if x < _BUCKETS - 1 else _BUCKETS - 1)


@numba.njit(cache=True, fastmath=True)
def dot64(h, W, j):
    # h is float64; float32 weights are widened, so scores are float64 sums either way. fastmath
    # lets LLVM vectorise the reduction (a fixed, deterministic summation order). Every node
    # score comes from this one function, so expansion and resolution agree bit for bit.
    acc = 0.0
    for e in range(h.shape[0]):
        acc += h[e] * W[j, e]
    return acc


@numba.njit(cache=True, inline="always")
def _node_score(j, h, W, b, score, stamp, tag, counter):
    """s_j = h . q_j + b_j (NodeWeights' W, b), computed once per context: ``stamp[j] == tag``
    marks score[j] cached (Scratch's score, stamp); counter[0] counts the nodes scored."""
    if stamp[j] != tag:
        score[j] = dot64(h, W, j) + b[j]
        stamp[j] = tag
        counter[0] += 1
    return score[j]


@numba.njit(cache=True, inline="always")
def _insert_top(out_v, out_w, n, v, w):
    """Insert word w of log-probability v into the sorted list out_v/out_w (k,) holding n words
    (value descending, then word ascending) if it belongs in its k best; returns the new n."""
    k = out_v.shape[0]
    if n < k:
        pos = n
        n += 1
    elif v > out_v[k - 1] or (v == out_v[k - 1] and w < out_w[k - 1]):
        pos = k - 1
    else:
        return n
    while pos > 0 and (v > out_v[pos - 1] or (v == out_v[pos - 1] and w < out_w[pos - 1])):
        out_v[pos] = out_v[pos - 1]
        out_w[pos] = out_w[pos - 1]
        pos -= 1
    out_v[pos] = v
    out_w[pos] = w
    return n


@numba.njit(cache=True)
def _resolve(w, h, wt, tree, s, tag, counter):
    """Exact log P(w) = log-sum-exp over w's leaves (in tree.word_leaves order, so deterministic)."""
    word_leaves, path_nodes, path_bits, leaf_depth = tree.word_leaves, tree.path_nodes, tree.path_bits, tree.leaf_depth
    W, b, score, stamp, buf = wt.W, wt.b, s.score, s.stamp, s.buf  # buf (K,): the leaves' log-probabilities
    n = 0
    m = -np.inf
    for r in range(word_leaves.shape[1]):
        lf = word_leaves[w, r]
        if lf < 0:
            break
        acc = 0.0  # accumulated from the root, exactly as during expansion
        for t in range(leaf_depth[lf]):
            left, right = _log_sigmoid_pair(_node_score(path_nodes[lf, t], h, W, b, score, stamp, tag, counter))
            acc += left if path_bits[lf, t] == 1 else right
        if acc != acc:  # NaN (non-finite weights or input): reported, as on a single-code tree
            return acc
        buf[n] = acc
        n += 1
        if acc > m:
            m = acc
    if m == -np.inf:
        return m
    tot = 0.0
    for r in range(n):
        tot += math.exp(buf[r] - m)
    return m + math.log(tot)


@numba.njit(cache=True)
def _topk_multi(h, wt, tree, k, s, tag, out_v, out_w, floor):
    """Exact top-k for context h (d,) float64 on ``tree`` (TreeArrays, any number of codes a word)
    weighted by ``wt`` (NodeWeights); fills out_v/out_w (k,), returns the nodes scored. ``s``
    (Scratch) holds no entry stamped ``tag`` and empty buckets (left empty on return).
    ``floor``: words below it are not wanted (-inf: none); the search stops once no unresolved
    word can reach it, leaving the list's rest at -inf / -1 (or words below it met on the way).

    The frontier is :func:`_topk_single`'s bucket queue, on the items' keys (module docstring):
    bucket b holds keys in (top - (b + 1) / _PER_NAT, top - b / _PER_NAT], top = the root's key,
    the largest key there is, up to rounding (which the 1e-12 margin covers). A leaf of a word
    of one code enters the top list when met; a leaf of a word of several codes waits in the
    frontier, and when it is taken, its word is resolved (:func:`_resolve`).
    """
    # The bundles' fields as locals, read once per context (see the note above _log_sigmoid_pair).
    W, b = wt.W, wt.b
    score, stamp, resolved = s.score, s.stamp, s.resolved
    head, ikey, ilp, inode, inext = s.bucket_head, s.ikey, s.ilp, s.inode, s.inext
    children, ncodes, log_codes, log_codes_below = tree.children, tree.ncodes, tree.log_codes, tree.log_codes_below
    counter = np.zeros(1, dtype=np.int64)
    top = log_codes_below[0]
    ikey[0], ilp[0], inode[0], inext[0] = top, 0.0, 0, -1  # the root
    carry = 0  # an item to take next without going through its bucket (-1: none)
    n_items, cursor, top_used = 1, 0, 0
    n_res = 0
    while True:
        if carry < 0:
            while cursor < _BUCKETS and head[cursor] < 0:
                cursor += 1
            if cursor == _BUCKETS:
                break  # every item taken or dropped: every word wanted is resolved
        edge = top - cursor / _PER_NAT  # no frontier key is above it (up to rounding)
        if (n_res == k and out_v[k - 1] > edge + _LOG_MARGIN) or edge + _LOG_MARGIN < floor:
            break  # no unresolved word can enter the list or reach the floor
        if carry >= 0:
            i, carry = carry, -1
        else:
            i = head[cursor]
            head[cursor] = inext[i]
        key, lp, t = ikey[i], ilp[i], inode[i]
        if (n_res == k and out_v[k - 1] > key + _LOG_MARGIN) or key + _LOG_MARGIN < floor:
            continue
        if t >= _LEAF:  # the first leaf taken of a word of several codes
            w = t - _LEAF
            if resolved[w] != tag:
                resolved[w] = tag
                n_res = _insert_top(out_v, out_w, n_res, _resolve(w, h, wt, tree, s, tag, counter), w)
            continue
        left, right = _log_sigmoid_pair(_node_score(t, h, W, b, score, stamp, tag, counter))
        for side in range(2):  # left, right: a fixed order (cheaper than the better child first)
            c = children[t, side]
            p = lp + (left if side == 0 else right)
            if c >= 0:
                ck, ct = p + log_codes_below[c], c
            else:
                w = -1 - c
                if resolved[w] == tag:
                    continue  # a leaf of a word whose value is already exact
                if ncodes[w] == 1:  # its value is exact: into the list (if wanted)
                    if p + _LOG_MARGIN >= floor:
                        resolved[w] = tag
                        n_res = _insert_top(out_v, out_w, n_res, p, w)
                    continue
                ck, ct = p + log_codes[w], _LEAF + w
            if (n_res == k and out_v[k - 1] > ck + _LOG_MARGIN) or ck + _LOG_MARGIN < floor:
                continue
            bucket = _bucket_of((top - ck) * _PER_NAT, cursor)
            ikey[n_items], ilp[n_items], inode[n_items] = ck, p, ct
            carry, top_used = _file_item(n_items, bucket, head, inext, cursor, carry, top_used)
            n_items += 1
    _empty_buckets(head, cursor, top_used)
    return counter[0]


@numba.njit(cache=True)
def _topk_single(h, wt, children, k, s, out_v, out_w, floor):
    """Exact top-k for context h (d,) float64 on a tree whose words have one code each
    (``children``: TreeArrays.children), weighted by ``wt`` (NodeWeights); fills out_v/out_w
    (k,), returns the nodes scored; ``floor`` as :func:`_topk_multi`'s. ``s`` (Scratch): its
    buckets are empty on entry and on return. The bucket queue of the module docstring, on
    log-probabilities: _PER_NAT is a power of two, so -p * _PER_NAT is exact and bucket b's edge
    -b / _PER_NAT is exact too. Every node is scored once (no score cache), a leaf goes straight
    into the top list, and the answer equals :func:`_topk_multi`'s to the bit.
    """
    W, b = wt.W, wt.b
    head, ikey, inode, inext = s.bucket_head, s.ikey, s.inode, s.inext
    ikey[0], inode[0], inext[0] = 0.0, 0, -1  # the root
    carry = 0  # an item to expand next without going through its bucket (-1: none)
    n_items, cursor, top_used = 1, 0, 0
    n_res, vk, count = 0, -np.inf, 0  # vk: the k-th best value once n_res == k
    while True:
        if carry < 0:
            while cursor < _BUCKETS and head[cursor] < 0:
                cursor += 1
            if cursor == _BUCKETS:
                break  # every node expanded or dropped
        edge = -cursor / _PER_NAT  # exact: no frontier item has p > edge
        if (n_res == k and vk > edge) or edge + _LOG_MARGIN < floor:
            break
        if carry >= 0:
            i, carry = carry, -1
        else:
            i = head[cursor]
            head[cursor] = inext[i]
        p0 = ikey[i]
        if (n_res == k and p0 < vk) or p0 + _LOG_MARGIN < floor:
            continue
        j = inode[i]
        left, right = _log_sigmoid_pair(dot64(h, W, j) + b[j])
        count += 1
        for side in range(2):  # left, right: a fixed order (cheaper than the better child first)
            c = children[j, side]
            p = p0 + (left if side == 0 else right)
            if (n_res == k and p < vk) or p + _LOG_MARGIN < floor:
                continue
            if c < 0:  # a leaf: word -1 - c
                n_res = _insert_top(out_v, out_w, n_res, p, -1 - c)
                if n_res == k:
                    vk = out_v[k - 1]
                continue
            bucket = _bucket_of(-p * _PER_NAT, cursor)  # exact: _PER_NAT is a power of two
            ikey[n_items], inode[n_items] = p, c
            carry, top_used = _file_item(n_items, bucket, head, inext, cursor, carry, top_used)
            n_items += 1
    _empty_buckets(head, cursor, top_used)
    return count


@numba.njit(cache=True, nogil=True)
def _topk_range(H, wt, tree, k, start, stop, out_v, out_w, out_nodes, floors):
    """Contexts ``start:stop`` of H (B, d) float64 into rows ``start:stop`` of out_v (B, k),
    out_w (B, k) and out_nodes (B,), with scratch of its own; ``floors`` (B,): each row's floor
    (:func:`_topk_multi`). Releases the GIL, so slices run in parallel threads."""
    s = scratch(wt.W.shape[0], tree.ncodes.shape[0], tree.word_leaves.shape[1])
    _topk_range_scratch(H, wt, tree, k, start, stop, s, 0, out_v, out_w, out_nodes, floors)


@numba.njit(cache=True, nogil=True)
def _topk_range_scratch(H, wt, tree, k, start, stop, s, tag0, out_v, out_w, out_nodes, floors):
    """:func:`_topk_range` with the caller's scratch ``s`` (Scratch, made for this tree's K):
    context i is stamped ``tag0 + i + 1``, so scratch whose stamps are all at most ``tag0``
    needs no clearing. A tree whose words have one code each (K == 1, the K the scratch was
    sized by) takes :func:`_topk_single`."""
    single = tree.word_leaves.shape[1] == 1
    for i in range(start, stop):
        if single:
            out_nodes[i] = _topk_single(H[i], wt, tree.children, k, s, out_v[i], out_w[i], floors[i])
        else:
            out_nodes[i] = _topk_multi(H[i], wt, tree, k, s, tag0 + i + 1, out_v[i], out_w[i], floors[i])


# ---- top-k ------------------------------------------------------------------------------------


def tree_arrays(tree: WordTree) -> TreeArrays:
    ncodes = tree.codes_per_word.astype(np.int64)
    return TreeArrays(
        tree.children,
        ncodes,
        np.log(ncodes),
        np.log(codes_below(tree)),
        tree.word_leaves,
        tree.path_nodes,
        tree.path_bits,
        tree.leaf_depth.astype(np.int64),
    )


def layer_tree_arrays(layer) -> TreeArrays:
    """:func:`tree_arrays` of a :class:`~hlbl.output.TreeSoftmax`'s tree, cached on the layer
    (safe: a WordTree is immutable and a layer's tree is fixed at construction)."""
    cached = layer.__dict__.get("_inference_tree_arrays")
    if cached is None or cached[0] is not layer.tree:
        cached = (layer.tree, tree_arrays(layer.tree))
        layer.__dict__["_inference_tree_arrays"] = cached
    return cached[1]


def layer_scratch_pool(layer) -> ScratchPool:
    """A :class:`ScratchPool` for a :class:`~hlbl.output.TreeSoftmax`'s tree, cached on the layer
    as :func:`layer_tree_arrays` is (a copy or pickle of the layer gets an empty pool)."""
    cached = layer.__dict__.get("_inference_scratch_pool")
    if cached is None or cached[0] is not layer.tree:
        cached = (layer.tree, ScratchPool.of(layer_tree_arrays(layer)))
        layer.__dict__["_inference_scratch_pool"] = cached
    return cached[1]


def node_weights(tree: WordTree, weight: torch.Tensor | np.ndarray, bias: torch.Tensor | np.ndarray) -> NodeWeights:
    """NodeWeights(W (N, d), b (N,)) for the kernels: zero-copy views of contiguous float32 or
    float64 CPU tensors or numpy arrays (other dtypes and devices are copied to float32), so no
    per-call O(N d) or O(N) conversion (generation calls this once a token) and no cache that could
    go stale; scores are accumulated in float64 either way."""

    def view(t) -> np.ndarray:
        if isinstance(t, np.ndarray):
            return np.ascontiguousarray(t if t.dtype in (np.float32, np.float64) else t.astype(np.float32))
        import torch

        t = t.detach()
        if t.dtype not in (torch.float32, torch.float64):
            t = t.float()
        return np.ascontiguousarray(t.cpu().numpy())

    W, b = view(weight), view(bias)
    if W.ndim != 2 or W.shape[0] != tree.num_nodes or b.shape != (tree.num_nodes,):
        raise ValueError(f"weights {W.shape} / biases {b.shape} do not fit a tree of {tree.num_nodes} internal nodes")
    return NodeWeights(W, b)


def codes_below(tree: WordTree) -> np.ndarray:
    """(N,) the largest number of codes of any word with a leaf in node j's subtree (bottom-up)."""
    ncodes = tree.codes_per_word
    out = np.zeros(tree.num_nodes, dtype=np.int64)
    for nodes in reversed(tree.levels):  # children are finished before their parents
        ch = tree.children[nodes]  # (n, 2)
        val = np.where(ch >= 0, out[np.clip(ch, 0, None)], ncodes[np.clip(-1 - ch, 0, None)])
        out[nodes] = val.max(1)
    return out


def tree_topk(
    tree: WordTree,
    weight: torch.Tensor,
    bias: torch.Tensor,
    input: torch.Tensor,
    k: int,
    threads: int | None = None,
    arrays: TreeArrays | None = None,
    floor: torch.Tensor | np.ndarray | None = None,
    pool: ScratchPool | None = None,
) -> TopK:
    """Exact top-k words under the tree softmax for each row of ``input`` (B, d).

    ``floor`` (B,) log-probabilities, optional: a row wants only words at or above its floor
    (e.g. a caller that already holds k candidates that good); its search stops once no word
    left can reach it; the slots it did not fill hold -inf and word -1, or a word below the floor
    that it resolved on the way (with its exact value: a multi-code word's leaf may promise more).

    ``k`` larger than the vocabulary gives all V words, best first (shape (B, V)), as fastText's
    ``predict`` does; ``torch.topk`` would raise instead.

    Scores are computed in float64 on the CPU by a numba kernel; the contexts are split into
    ``threads`` contiguous slices searched in parallel (default ``numba.get_num_threads()``,
    i.e. ``NUMBA_NUM_THREADS``; results do not depend on it). Returns values in ``input``'s dtype
    and everything on ``input``'s device. ``arrays``: :func:`tree_arrays` of ``tree`` if already
    built (see :func:`layer_tree_arrays`); ``pool``: scratch kept between calls for a search
    that runs on the caller's thread (:func:`layer_scratch_pool`).
    """
    import torch

    if input.dim() != 2:
        raise ValueError(f"input must have shape (B, d), got {tuple(input.shape)}")
    k = check_k(k, tree.num_words)
    a = tree_arrays(tree) if arrays is None else arrays
    wt = node_weights(tree, weight, bias)
    if input.shape[1] != wt.W.shape[1]:
        raise ValueError(f"input has {input.shape[1]} features, the tree layer {wt.W.shape[1]}")
    H = np.ascontiguousarray(input.detach().to("cpu", torch.float64).numpy())
    floors = None
    if floor is not None:
        floors = np.ascontiguousarray(torch.as_tensor(floor).detach().to("cpu", torch.float64).numpy())
    out_v, out_w, out_n = search_rows(H, wt, a, k, threads, floors, pool)
    dev = input.device
    return TopK(
        torch.from_numpy(out_v).to(dev, input.dtype), torch.from_numpy(out_w).to(dev), torch.from_numpy(out_n).to(dev)
    )


def search_rows(
    H: np.ndarray,
    wt: NodeWeights,
    a: TreeArrays,
    k: int,
    threads: int | None = None,
    floors: np.ndarray | None = None,
    pool: ScratchPool | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The search of :func:`tree_topk` on numpy arrays: contexts H (B, d) float64 -> log-probs
    (B, k) float64, word ids (B, k) int64 and nodes scored (B,) int64; ``k`` already checked
    (:func:`check_k`), rows in ``threads`` parallel slices (default ``numba.get_num_threads()``);
    ``floors`` (B,) float64 as :func:`tree_topk`'s ``floor`` (None: no floor); ``pool``: this
    tree's :class:`ScratchPool`, used when the rows are one slice (on the caller's thread)."""
    B = H.shape[0]
    out_v = np.full((B, k), -np.inf)
    out_w = np.full((B, k), -1, dtype=np.int64)
    out_n = np.zeros(B, dtype=np.int64)
    if floors is None:
        floors = np.full(B, -np.inf)
    else:
        if floors.shape != (B,):
            raise ValueError(f"floor must have one value per row ({B},), got {floors.shape}")

    threads = numba.get_num_threads() if threads is None else int(threads)
    if pool is not None and row_slices(B, threads) == 1:
        if pool.shape != ScratchPool.shape_of(a):  # (scratch too small would be written out of bounds)
            raise ValueError(f"a scratch pool for a tree of shape {pool.shape}, not {ScratchPool.shape_of(a)}")
        s, tag0 = pool.take(B)
        _topk_range_scratch(H, wt, a, k, 0, B, s, tag0, out_v, out_w, out_n, floors)
        return out_v, out_w, out_n

    def run(start: int, stop: int) -> None:
        _topk_range(H, wt, a, k, start, stop, out_v, out_w, out_n, floors)

    in_row_slices(run, B, threads)
    return out_v, out_w, out_n


class TreeSearch:
    """:func:`tree_topk` for many small calls on weights that stay put (a served model): the
    kernel's arrays, the weights' views and its scratch are taken once, instead of per call,
    which is most of the cost of a call for a few contexts. ``topk`` takes and returns numpy
    arrays and computes exactly what :func:`tree_topk` does. Each thread gets its own scratch.

    The weights are read through :func:`node_weights`, i.e. zero-copy views of contiguous float32
    or float64 CPU tensors: updates in place are seen, a tensor replaced by another is not.
    """

    def __init__(
        self,
        tree: WordTree,
        weight: torch.Tensor | np.ndarray,
        bias: torch.Tensor | np.ndarray,
        arrays: TreeArrays | None = None,
    ):
        self.tree = tree
        self.arrays = tree_arrays(tree) if arrays is None else arrays
        self.weights = node_weights(tree, weight, bias)
        self._pool = ScratchPool.of(self.arrays)

    def topk(self, H: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(log-probs (B, k) float64, word ids (B, k) int64), best first, for contexts H (B, d)
        float64; k > V gives all V words. The same values as :func:`tree_topk` before its cast
        to the input's dtype."""
        k = check_k(k, self.tree.num_words)
        H = np.ascontiguousarray(H, dtype=np.float64)
        d = self.weights.W.shape[1]
        if H.ndim != 2 or H.shape[1] != d:
            raise ValueError(f"H must have shape (B, {d}), got {H.shape}")
        B = H.shape[0]
        out_v = np.full((B, k), -np.inf)
        out_w = np.full((B, k), -1, dtype=np.int64)
        out_n = np.empty(B, dtype=np.int64)
        s, tag0 = self._pool.take(B)
        _topk_range_scratch(H, self.weights, self.arrays, k, 0, B, s, tag0, out_v, out_w, out_n, np.full(B, -np.inf))
        return out_v, out_w


def in_row_slices(run, rows: int, threads: int) -> None:
    """``run(start, stop)`` over ``rows`` rows cut into at most ``threads`` contiguous slices, run
    in parallel threads (``run`` must release the GIL to gain: a nogil numba kernel); a slice of
    fewer than 64 rows is not worth a thread, so small batches run on the caller's thread."""
    threads = row_slices(rows, threads)
    if threads == 1:
        run(0, rows)
        return
    bounds = np.linspace(0, rows, threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, bounds[:-1], bounds[1:]))


def row_slices(rows: int, threads: int) -> int:
    """How many slices :func:`in_row_slices` cuts ``rows`` rows into on ``threads`` threads."""
    return max(1, min(threads, rows // 64))


def check_k(k: int, vocab_size: int) -> int:
    """``k`` of a top-k query over ``vocab_size`` words as an int, checked (ValueError)."""
    if isinstance(k, bool) or int(k) != k:
        raise ValueError(f"k must be a whole number, got {k!r}")
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return min(k, vocab_size)


def full_topk(log_prob: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of a full (B, V) distribution by sorting, ties broken by lower word id (stable sort)."""
    import torch

    k = check_k(k, log_prob.shape[1])
    values, idx = torch.sort(log_prob, dim=1, descending=True, stable=True)
    return values[:, :k], idx[:, :k]


def topk_matches(values: torch.Tensor, indices: torch.Tensor, full_log_prob: torch.Tensor, atol: float = 1e-5) -> bool:
    """Whether (values, indices) is a correct top-k of ``full_log_prob`` (B, V) up to ``atol``.

    Checks what exactness means when probabilities are only known to rounding: the ids are
    distinct, ``values`` are their log-probabilities under ``full_log_prob``, and they equal the
    k largest values of ``full_log_prob``. (Ids may differ from a sort only among near-ties.)
    """
    import torch

    k = values.shape[1]
    ref_values, _ = full_topk(full_log_prob, k)
    own = full_log_prob.gather(1, indices)
    distinct = bool((indices.sort(dim=1).values.diff(dim=1) != 0).all()) if k > 1 else True
    return (
        distinct
        and torch.allclose(own, values.to(own.dtype), atol=atol, rtol=0)
        and torch.allclose(ref_values, values.to(own.dtype), atol=atol, rtol=0)
    )


__all__ = [
    "TopK",
    "TreeSearch",
    "tree_topk",
    "full_topk",
    "topk_matches",
    "TreeArrays",
    "tree_arrays",
    "layer_tree_arrays",
    "layer_scratch_pool",
    "ScratchPool",
    "node_weights",
    "NodeWeights",
    "codes_below",
]

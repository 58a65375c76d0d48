"""Learned word trees: the paper's Section 5 (Mnih & Hinton 2008), end to end.

Pipeline::

    HLBL trained on a RANDOM tree
        |  word_features: for every word w, the exact mean of r_hat over the training
        |  positions where w is the target (one streaming pass, float64 sums)
        v
    X: (V, d) word representations
        |  build_learned_tree: top-down 2-component spherical Gaussian mixtures (EM),
        |  split by a policy (BALANCED / ADAPTIVE / ADAPTIVE(eps)), until sets of two words
        v
    WordTree  (xK: K trees from different seeds joined under new top nodes: join_trees)

EM at one node (words ``x_i``, ``i`` in the node; optional weights ``w_i``, default 1)
-------------------------------------------------------------------------------------
Two components ``k = 0`` (left) and ``1`` (right), each ``N(mu_k, s_k^2 I)`` with weight ``pi_k``.

* Initialisation: a seeded random partition of the node's words into two halves (sizes differ
  by at most one, so both sides are non-empty); ``pi, mu, s^2`` are the M-step of that hard
  assignment ("means initialised from a random partition", as in the paper).
* ``em_iters`` times (10 by default, the paper's number): E-step, then M-step; then a final
  E-step gives the responsibilities used for the split. This is exactly scikit-learn's
  ``GaussianMixture(covariance_type="spherical", max_iter=em_iters, tol=0)`` started from the
  same parameters (the tests check the agreement).
* ``s_k^2 = sum_i r_ik w_i ||x_i - mu_k||^2 / (d N_k) + reg`` with ``reg = 1e-6`` times the mean
  per-dimension variance of all of ``X`` (plus 1e-12 of its mean square; :func:`em_reg`), a
  scale-free version of sklearn's absolute ``reg_covar``,
  so identical vectors cannot make a variance 0.

All the nodes of one depth run their EM together, vectorised: the (word, node) items of a level
are sorted by node and every per-node sum is one sparse (nodes x items) product or ``bincount``.
A level costs O(items x d) per EM iteration, the whole tree O(V d depth) -- and no Python loop
over nodes, which is what would otherwise dominate near the leaves (thousands of tiny nodes).
``bench/treebuild.py`` compares this with a per-node scikit-learn recursion (the same EM,
``GaussianMixture(covariance_type="spherical")`` at every node) and times 33,000-word builds
(``results/treebuild.log``). sklearn's per-call overhead on thousands of tiny nodes is what this
avoids, hence our own EM (checked against sklearn to 1e-8 in the tests).

Split policies (``r`` = responsibility of the left component)
--------------------------------------------------------------
* ``balanced``: sort the node's words by ``r`` (descending, ties by word id) and cut into two
  halves, the left one taking the extra word when the size is odd.
* ``adaptive``: left if ``r > 0.5``, else right.
* ``adaptive:EPS`` (ADAPTIVE(eps)): a word with ``|r - 0.5| < eps`` goes to *both* children (one
  more code); the others as in ``adaptive``. ``adaptive:0`` is ``adaptive``.

Termination and size rules
--------------------------
* A node of two words gets two leaves without EM (the paper stops at sets of two words); a
  child set of one word is a leaf.
* Fallback: if a split would leave a child empty or give a child *every* word of the node (all on
  one side, or all sent to both sides), the node is split BALANCED instead. So every child is
  strictly smaller than its parent and the recursion ends (depth < V).
* A node's words are distinct (the root holds each word once and children take subsets), so a
  node of >= 2 words never has two leaves of the same word, which :class:`WordTree` forbids.
* Size bound: the final number of leaves equals the leaves made so far plus the sizes of the open
  nodes, if no word is duplicated again. Before each level we grant duplications in node order
  (then by word order within a node) only while that total stays within ``max_leaves``
  (default ``4 V`` per tree); the rest of the band's words go to their more likely side. Hence
  a tree never has more than ``max(V, max_leaves)`` leaves, whatever the features (repeated
  duplication of hard-to-separate words deep down would otherwise grow the tree without a
  useful bound). :func:`build_learned_tree` reports whether the budget was hit.

Weighting: by default every word counts once in the EM (the paper does not say; the unweighted
reading is the natural one, and frequency weights would let a few frequent words set every
split). ``weights=`` (e.g. training counts) is available for experiments.

Words never seen as a target in the training stream have no mean context vector; they get the
mean of r_hat over *all* training positions (the centroid of the seen words, weighted by their
frequency). We choose this over the word's own input vector ``R_w``, which lives in a different
space (context words are represented by ``R``, predicted words by the node vectors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .config import DEFAULT_EM_ITERS, DEFAULT_MAX_LEAVES_PER_WORD  # (defaults the CLI shows without torch)
from .data import batches, stream_windows
from .progress import progress
from .tree import TreeError, WordTree

REG_FRACTION = 1e-6

# ---- word representations -------------------------------------------------------------------


@torch.no_grad()
def word_features(
    model,
    stream: np.ndarray,
    pad: int,
    batch_size: int = 8192,
    device: str | torch.device = "cpu",
    engine: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """(X (V, d) float64, n (V,) int64): mean r_hat over each word's occurrences as a target.

    One pass over ``stream`` in order; r_hat of every position is summed into its target's row
    in float64 and divided once, so X is the exact mean. Words with ``n == 0`` get the mean of
    r_hat over all positions (module docstring). ``engine``: ``auto`` takes the numba pass for a
    diagonal-context model on the CPU (:func:`_word_features_cpu`), ``torch`` the batched one.
    """
    if not (hasattr(model, "context_vector") and hasattr(getattr(model, "config", None), "context")):
        raise TypeError(
            f"word_features reads an hlbl LBL model, not a {type(model).__name__}; for any other model use "
            "hlbl.hidden_features (its hidden vectors) or hlbl.embedding_features (an output embedding)"
        )
    V, d = model.config.vocab_size, model.config.dim
    if len(stream) == 0:
        raise TreeError("word features need a non-empty training stream")
    cpu = model.R.weight.device.type == "cpu"
    if engine == "auto" and cpu and not model.config.full_context and getattr(model, "C", None) is not None:
        return _word_features_cpu(model, stream, pad)
    was_training = model.training
    model.eval()
    sums = torch.zeros(V, d, dtype=torch.float64)
    n = torch.zeros(V, dtype=torch.int64)
    bar = progress(len(stream), "word features", "w")
    for ctx, tgt in batches(stream, model.config.context, batch_size, pad):
        rhat = model.context_vector(torch.from_numpy(ctx).to(device)).double().cpu()  # (B, d)
        t = torch.from_numpy(tgt).long()
        sums.index_add_(0, t, rhat)
        n.index_add_(0, t, torch.ones_like(t))
        bar.update(len(tgt))
    bar.close()
    model.train(was_training)
    sums, n = sums.numpy(), n.numpy()
    X = np.empty_like(sums)
    seen = n > 0
    X[seen] = sums[seen] / n[seen, None]
    X[~seen] = sums.sum(0) / n.sum()
    return X, n


FEATURE_PIECE = 1 << 20  # positions a piece of the word-features pass (4 MB of tokens)


def _word_features_cpu(model, stream: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`word_features` for a diagonal-context model on the CPU: one numba pass over the
    stream in pieces of :data:`FEATURE_PIECE` positions (a memory-mapped split through its file),
    about 20x the torch batches' speed on 50M tokens; the same sums (the tests compare the two)."""
    from .kernels import feature_sums

    V, d = model.config.vocab_size, model.config.dim
    R = np.ascontiguousarray(model.R.weight.detach().numpy(), dtype=np.float32)  # (V, d)
    C = np.ascontiguousarray(model.C.detach().numpy(), dtype=np.float32)  # (n, d)
    if not 0 <= pad < V:
        raise TreeError(f"word features: token ids must be in 0..{V - 1}")
    sums = np.zeros((V, d), np.float64)
    counts = np.zeros(V, np.int64)
    bar = progress(len(stream), "word features", "w")
    # Each piece with the n tokens before it: a mapped split is read through its file, not its
    # mapping (data.stream_windows), and the sums are those of one pass over the whole stream.
    for tokens, first in stream_windows(stream, FEATURE_PIECE, model.config.context):
        if int(tokens.min()) < 0 or int(tokens.max()) >= V:
            raise TreeError(f"word features: token ids must be in 0..{V - 1}")
        feature_sums(tokens, first, len(tokens), pad, R, C, sums, counts)
        bar.update(len(tokens) - first)
    bar.close()
    X = np.empty_like(sums)
    seen = counts > 0
    X[seen] = sums[seen] / counts[seen, None]
    X[~seen] = sums.sum(0) / counts.sum()
    return X, counts


def features_from_run(run_dir: str | Path, corpus=None, which: str = "best") -> tuple[np.ndarray, np.ndarray]:
    """Word features of the model in ``run_dir`` over its corpus's training split."""
    from .run import Run

    run = Run.open(run_dir)
    model = run.model(which)
    if corpus is None:
        corpus = run.corpus(("train",))
    if len(corpus.vocab) != model.config.vocab_size:
        raise TreeError(f"{run_dir}: model has {model.config.vocab_size} words, the corpus {len(corpus.vocab)}")
    return word_features(model, corpus["train"], corpus.vocab.eos)


# ---- policies -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """A split rule: ``kind`` is "balanced" or "adaptive"; ``eps`` the duplication band."""

    kind: str
    eps: float = 0.0

    def __post_init__(self):
        if self.kind not in ("balanced", "adaptive"):
            raise TreeError(f"unknown split policy {self.kind!r}; use balanced, adaptive or adaptive:EPS")
        if not 0.0 <= self.eps <= 0.5 or (self.kind == "balanced" and self.eps):
            raise TreeError(f"eps must be in [0, 0.5] and only for adaptive, got {self.eps}")

    @property
    def label(self) -> str:
        """The paper's name: BALANCED, ADAPTIVE, ADAPTIVE(0.4)."""
        if self.kind == "balanced":
            return "BALANCED"
        return "ADAPTIVE" if self.eps == 0 else f"ADAPTIVE({self.eps:g})"


def parse_policy(spec: str | Policy) -> Policy:
    """``balanced``, ``adaptive`` or ``adaptive:EPS`` (e.g. ``adaptive:0.4``)."""
    if isinstance(spec, Policy):
        return spec
    s = str(spec).strip().lower()
    if s in ("balanced", "adaptive"):
        return Policy(s)
    if s.startswith("adaptive:"):
        try:
            eps = float(s.split(":", 1)[1])
        except ValueError:
            raise TreeError(f"bad policy {spec!r}: EPS must be a number, e.g. adaptive:0.4") from None
        return Policy("adaptive", eps)
    raise TreeError(f"unknown split policy {spec!r}; use balanced, adaptive or adaptive:EPS")


def tree_label(policy: str | Policy, copies: int = 1) -> str:
    """Table 3's tree cell: e.g. ``ADAPTIVE(0.4) x4``."""
    lab = parse_policy(policy).label
    return lab if copies == 1 else f"{lab} x{copies}"


# ---- batched EM over the nodes of one level -------------------------------------------------


def _m_step(
    P,
    XW: np.ndarray,
    xxw: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    seg: np.ndarray,
    SX: np.ndarray,
    SXX: np.ndarray,
    SW: np.ndarray,
    d: int,
    reg: float,
):
    """Both components of every node from responsibilities ``r`` (I,) of the left one.

    Items are sorted by node (``seg`` (I,) node index, M nodes); ``P`` is the (M, I) CSR
    node-membership matrix whose data we overwrite with ``r`` (one sparse product = all the
    per-node weighted sums, without an (I, d) temporary; far faster than ``np.add.reduceat``
    along axis 0). Precomputed per level: ``XW = w x`` (I, d), ``xxw = w ||x||^2`` (I,), and
    their node sums ``SX`` (M, d), ``SXX``, ``SW`` (M,). The right component's sums are the node
    totals minus the left one's. Variances use ``sum r ||x - mu||^2 = sum r ||x||^2 - N ||mu||^2``
    (clamped at 0; float64). Returns logpi (M, 2), mu (M, 2, d), var (M, 2).
    """
    M = len(SW)
    tiny = 10 * np.finfo(np.float64).eps
    P.data = r
    S0 = np.asarray(P @ XW)  # (M, d)
    N0 = np.bincount(seg, weights=r * w, minlength=M)
    Q0 = np.bincount(seg, weights=r * xxw, minlength=M)
    S = np.stack([S0, SX - S0], axis=1)  # (M, 2, d)
    N = np.stack([N0, SW - N0], axis=1)  # (M, 2)
    N = np.maximum(N, 0.0) + tiny
    Q = np.stack([Q0, SXX - Q0], axis=1)
    mu = S / N[:, :, None]
    var = np.maximum(Q / N - (mu * mu).sum(2), 0.0) / d + reg
    logpi = np.log(N / N.sum(1, keepdims=True))
    return logpi, mu, var


def _e_step(
    X: np.ndarray, xx: np.ndarray, seg: np.ndarray, logpi: np.ndarray, mu: np.ndarray, var: np.ndarray
) -> np.ndarray:
    """Responsibility of the left component for every item, (I,).

    ``log p0 - log p1`` expands to ``c + x . a - ||x||^2 b / 2`` with per-node ``a = mu0/v0 - mu1/v1``,
    ``b = 1/v0 - 1/v1`` and constant ``c``: one gather and one row-wise dot product per item.
    """
    d = X.shape[1]
    inv = 1.0 / var  # (M, 2)
    a = mu[:, 0] * inv[:, :1] - mu[:, 1] * inv[:, 1:]  # (M, d)
    b = inv[:, 0] - inv[:, 1]
    mm = (mu * mu).sum(2)
    c = (
        logpi[:, 0]
        - logpi[:, 1]
        - 0.5 * d * (np.log(var[:, 0]) - np.log(var[:, 1]))
        - 0.5 * (mm[:, 0] * inv[:, 0] - mm[:, 1] * inv[:, 1])
    )
    # X . a[seg] in chunks: a[seg] whole would be another (I, d) float64 temporary.
    dots = np.empty(len(X))
    for lo in range(0, len(X), 1 << 16):
        hi = lo + (1 << 16)
        dots[lo:hi] = np.einsum("ij,ij->i", X[lo:hi], a[seg[lo:hi]])
    z = c[seg] + dots - 0.5 * xx * b[seg]
    # r = sigmoid(z), computed without overflow
    return 1.0 / (1.0 + np.exp(-np.clip(z, -700.0, 700.0)))


def _ranks_within(seg: np.ndarray, starts: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """Rank of each item inside its node under ``keys`` (last key most significant, as np.lexsort)."""
    order = np.lexsort((*keys, seg))
    rank = np.empty(len(seg), dtype=np.int64)
    rank[order] = np.arange(len(seg)) - starts[seg[order]]
    return rank


def em_responsibilities(
    X: np.ndarray,
    seg: np.ndarray,
    starts: np.ndarray,
    rng: np.random.Generator,
    iters: int = DEFAULT_EM_ITERS,
    weights: np.ndarray | None = None,
    reg: float = 0.0,
) -> np.ndarray:
    """Run the 2-component spherical EM of every node at once; (I,) left responsibilities.

    ``X`` (I, d) holds the items sorted by node, ``seg`` (I,) their node index (0..M-1),
    ``starts`` (M,) the first item of each node. Each node starts from a random halving of its
    items (one M-step on that hard assignment), then ``iters`` E/M rounds and a final E-step.
    """
    from scipy.sparse import csr_matrix

    I, d = X.shape
    M = len(starts)
    sizes = np.diff(np.append(starts, I))
    w = np.ones(I) if weights is None else np.asarray(weights, dtype=np.float64)
    xx = np.einsum("ij,ij->i", X, X)
    XW, xxw = (X, xx) if weights is None else (X * w[:, None], xx * w)  # no (I, d) copy unweighted
    P = csr_matrix((np.ones(I), np.arange(I), np.append(starts, I)), shape=(M, I))
    SX = np.asarray(P @ XW)
    SXX, SW = np.bincount(seg, xxw, M), np.bincount(seg, w, M)
    rank = _ranks_within(seg, starts, rng.random(I))
    r = (rank < (sizes[seg] + 1) // 2).astype(np.float64)  # random halves
    for _ in range(iters + 1):
        r = _e_step(X, xx, seg, *_m_step(P, XW, xxw, w, r, seg, SX, SXX, SW, d, reg))
    return r


def em_reg(X: np.ndarray) -> float:
    """The variance floor added to every component: scale-free, positive even for constant X."""
    X = np.asarray(X, dtype=np.float64)
    return REG_FRACTION * float(X.var(0).mean()) + 1e-12 * float((X * X).mean()) + 1e-300


# ---- the recursive (level-synchronous) builder ----------------------------------------------


@dataclass
class BuildReport:
    """What happened while building: fallbacks and whether the leaf budget was binding.

    Counts add up over every tree built with the same report (all K copies of an xK build).
    """

    em_nodes: int = 0  # nodes split by EM
    fallback_nodes: int = 0  # nodes whose EM split was degenerate -> BALANCED
    duplicated: int = 0  # words sent to both sides (extra leaves)
    denied_duplications: int = 0  # band words kept on one side because of max_leaves
    levels: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _check_features(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or len(X) < 2:
        raise TreeError(f"word features must be a (V, d) array with V >= 2, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise TreeError("word features contain NaN or infinite values")
    return X


@dataclass
class _Level:
    """The open nodes of one depth: their (word, node) items sorted by node, and the nodes' ids."""

    seg: np.ndarray  # (I,) int64 node index of each item, 0 .. n_nodes-1, non-decreasing
    word: np.ndarray  # (I,) int64 the item's word
    n_nodes: int
    first_id: int  # the nodes have ids first_id .. first_id + n_nodes - 1


def _checked_weights(weights: Sequence[float] | None, V: int) -> np.ndarray | None:
    """(V,) float64 EM weights, or None; a zero-weight word gets a tiny one so that it still
    belongs somewhere."""
    if weights is None:
        return None
    wts = np.asarray(weights, dtype=np.float64)
    if wts.shape != (V,) or (wts < 0).any() or not np.isfinite(wts).all():
        raise TreeError(f"weights must be {V} finite non-negative numbers")
    return wts + 1e-12 * max(wts.max(), 1.0)


def _level_em(
    X: np.ndarray,
    level: _Level,
    sizes: np.ndarray,
    rng: np.random.Generator,
    em_iters: int,
    wts: np.ndarray | None,
    reg: float,
    rep: BuildReport,
) -> tuple[np.ndarray, np.ndarray]:
    """(r (I,), big (I,) bool): every item's left responsibility from the EM of its node, for the
    items of nodes of three words or more (``big``); 0.5 for the others, which get two leaves
    without EM."""
    seg, word = level.seg, level.word
    big = sizes[seg] >= 3
    r = np.full(len(seg), 0.5)
    if big.any():
        bseg_raw = seg[big]
        bstarts = np.flatnonzero(np.r_[True, bseg_raw[1:] != bseg_raw[:-1]])
        bseg = np.cumsum(np.r_[0, bseg_raw[1:] != bseg_raw[:-1]])
        r[big] = em_responsibilities(
            X[word[big]], bseg, bstarts, rng, em_iters, None if wts is None else wts[word[big]], reg
        )
        rep.em_nodes += len(bstarts)
    return r, big


def _sides(
    level: _Level,
    starts: np.ndarray,
    sizes: np.ndarray,
    r: np.ndarray,
    big: np.ndarray,
    pol: Policy,
    room: int,
    rep: BuildReport,
) -> tuple[np.ndarray, np.ndarray]:
    """(left (I,), right (I,) bool): the side(s) each item goes to under ``pol``, with at most
    ``room`` duplications granted (in item order) and the BALANCED fallback for a node whose split
    leaves a child empty or gives it every word (module docstring)."""
    seg = level.seg
    # Balanced assignment (also the fallback): top ceil(n/2) responsibilities go left.
    rank = _ranks_within(seg, starts, level.word, -r)
    bal_left = rank < (sizes[seg] + 1) // 2
    if pol.kind == "balanced":
        left, right = bal_left, ~bal_left
    else:
        left = r > 0.5
        right = ~left
        band = big & (np.abs(r - 0.5) < pol.eps) if pol.eps > 0 else np.zeros(len(seg), bool)
        if band.any():
            grant = band & (np.cumsum(band) <= max(room, 0))
            rep.denied_duplications += int(band.sum() - grant.sum())
            left, right = left | grant, right | grant
        nl = np.add.reduceat(left.astype(np.int64), starts)
        nr = np.add.reduceat(right.astype(np.int64), starts)
        bad = (nl == 0) | (nr == 0) | (nl == sizes) | (nr == sizes)
        bad &= sizes >= 3
        rep.fallback_nodes += int(bad.sum())
        if bad.any():
            b = bad[seg]
            left, right = np.where(b, bal_left, left), np.where(b, ~bal_left, right)
    two = sizes[seg] == 2  # pairs: first (by the balanced rank) left, second right
    left, right = np.where(two, bal_left, left), np.where(two, ~bal_left, right)
    rep.duplicated += int((left & right).sum())
    return left, right


def _children(level: _Level, starts: np.ndarray, left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, int, _Level]:
    """(block (M, 2), leaves made, next level): the children of each node of ``level`` (a side
    with one word is a leaf, ``-1 - word``; with more a new internal node) and the items of the
    new internal nodes, sorted by node (stably: words keep their order)."""
    seg, word = level.seg, level.word
    nl = np.add.reduceat(left.astype(np.int64), starts)
    nr = np.add.reduceat(right.astype(np.int64), starts)
    side_sizes = np.stack([nl, nr], axis=1)  # (M, 2)
    internal = side_sizes >= 2
    next_first = level.first_id + level.n_nodes
    new_ids = next_first + np.cumsum(internal.reshape(-1)) - 1  # row-major: left then right
    block = np.where(internal.reshape(-1), new_ids, 0).reshape(-1, 2)
    for s, mask in ((0, left), (1, right)):
        lone = mask & (side_sizes[seg, s] == 1)
        block[seg[lone], s] = -1 - word[lone]
    child_local = np.cumsum(internal.reshape(-1)).reshape(-1, 2) - 1  # (M, 2) index among new nodes
    nxt_seg, nxt_word = [], []
    for s, mask in ((0, left), (1, right)):
        keep = mask & internal[seg, s]
        nxt_seg.append(child_local[seg[keep], s])
        nxt_word.append(word[keep])
    nseg, nword = np.concatenate(nxt_seg), np.concatenate(nxt_word)
    order = np.argsort(nseg, kind="stable")
    return block, int((~internal).sum()), _Level(nseg[order], nword[order], int(internal.sum()), next_first)


def build_learned_tree(
    X: np.ndarray,
    policy: str | Policy = "adaptive",
    seed: int = 0,
    em_iters: int = DEFAULT_EM_ITERS,
    weights: Sequence[float] | None = None,
    max_leaves: int | None = None,
    report: BuildReport | None = None,
    bar=None,
) -> WordTree:
    """A word tree over ``len(X)`` words by top-down 2-Gaussian splits (module docstring).

    X: (V, d) word representations. Same inputs and seed give the same tree. ``bar``: a
    :func:`hlbl.progress.progress` display counting words placed (all their leaves made), shared
    by the copies of an xK build; by default one of this tree's V words.
    """
    X = _check_features(X)
    pol = parse_policy(policy)
    V = len(X)
    if em_iters < 0:
        raise TreeError(f"em_iters must be >= 0, got {em_iters}")
    wts = _checked_weights(weights, V)
    max_leaves = DEFAULT_MAX_LEAVES_PER_WORD * V if max_leaves is None else int(max_leaves)
    rep = report if report is not None else BuildReport()
    rng = np.random.default_rng(seed)
    reg = em_reg(X)

    children: list[np.ndarray] = []  # one (M, 2) block per level, ids assigned level by level
    level = _Level(np.zeros(V, dtype=np.int64), np.arange(V, dtype=np.int64), 1, 0)
    made_leaves = 0
    own_bar = bar is None
    if own_bar:  # (heartbeat: a top level of EM on 10^5 words takes a while without a word placed)
        bar = progress(V, "building tree", "words", heartbeat=True)
    placed = 0
    while level.n_nodes:
        rep.levels += 1
        bar.set_postfix(level=rep.levels, nodes=level.n_nodes, refresh=False)
        starts = np.flatnonzero(np.r_[True, level.seg[1:] != level.seg[:-1]])
        sizes = np.diff(np.append(starts, len(level.seg)))
        r, big = _level_em(X, level, sizes, rng, em_iters, wts, reg, rep)
        # Leaf budget: total leaves if nothing more were duplicated = made + open items.
        room = max_leaves - made_leaves - len(level.seg)
        left, right = _sides(level, starts, sizes, r, big, pol, room, rep)
        block, leaves, level = _children(level, starts, left, right)
        children.append(block)
        made_leaves += leaves
        now = V - len(np.unique(level.word))  # words with no item left to split
        bar.update(now - placed)
        placed = now
    if own_bar:
        bar.close()
    return WordTree(np.concatenate(children).astype(np.int64), V)


def join_trees(trees: Sequence[WordTree]) -> WordTree:
    """One tree holding each of ``trees`` as a subtree under new top nodes.

    K trees get K - 1 new internal nodes arranged as a balanced binary top (recursive halving of
    the list of roots, first half left): x2 = one new root over two trees; x4 = a root over two
    nodes, each over two trees. A word's codes are the union of its codes in all trees, so
    P(w) = sum over the trees of P(reach that tree) * P_tree(w), still a distribution.
    """
    trees = list(trees)
    if not trees:
        raise TreeError("join_trees needs at least one tree")
    V = trees[0].num_words
    if any(t.num_words != V for t in trees):
        raise TreeError("join_trees: all trees must have the same number of words")
    if len(trees) == 1:
        return trees[0]
    K = len(trees)
    top = K - 1  # top nodes get ids 0..K-2; tree k's nodes are offset after them
    blocks, roots, off = [], [], top
    for t in trees:
        ch = t.children
        blocks.append(np.where(ch >= 0, ch + off, ch))
        roots.append(off)  # canonical numbering: each tree's root is its node 0
        off += len(ch)
    top_rows: list[list[int]] = []

    def make(rs: list[int]) -> int:
        if len(rs) == 1:
            return rs[0]
        j = len(top_rows)
        top_rows.append([0, 0])
        half = (len(rs) + 1) // 2
        top_rows[j] = [make(rs[:half]), make(rs[half:])]
        return j

    make(roots)
    return WordTree(np.concatenate([np.asarray(top_rows, dtype=np.int64), *blocks]), V)


def tree_seeds(seed: int, copies: int) -> list[int]:
    """Seeds of the ``copies`` trees of an xK build: distinct, derived from ``seed``."""
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(copies)] if copies > 1 else [seed]


def build_tree_from_features(
    X: np.ndarray,
    policy: str | Policy,
    seed: int = 0,
    copies: int = 1,
    em_iters: int = DEFAULT_EM_ITERS,
    weights: Sequence[float] | None = None,
    max_leaves: int | None = None,
    report: BuildReport | None = None,
) -> WordTree:
    """``copies`` learned trees from different seeds, joined (:func:`join_trees`) when > 1.

    ``max_leaves`` bounds each of the copies (default 4 V each).
    """
    if copies < 1:
        raise TreeError(f"copies must be >= 1, got {copies}")
    # One display for all copies: words placed out of copies x V, and the time left.
    with progress(
        copies * len(X), "building tree" + (f" x{copies}" if copies > 1 else ""), "words", heartbeat=True
    ) as bar:
        trees = [
            build_learned_tree(X, policy, s, em_iters, weights, max_leaves, report, bar)
            for s in tree_seeds(seed, copies)
        ]
    return join_trees(trees)


# ---- several context vectors per word ---------------------------------------------------------


@dataclass
class SenseReport:
    """What :func:`sense_features` found: words given two vectors, and the words it looked at."""

    split_words: int = 0
    candidates: int = 0

    def to_json(self) -> dict:
        return {"split_words": self.split_words, "sense_candidates": self.candidates}


@torch.no_grad()
def sense_features(
    model,
    stream: np.ndarray,
    pad: int,
    min_count: int = 100,
    min_share: float = 0.25,
    max_occurrences: int = 2000,
    seed: int = 0,
    report: SenseReport | None = None,
    features: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Items for tree building with up to two context vectors per word (the paper's Section 7).

    Returns ``(X_items (M, d) float64, item_word (M,) int64)``: every word's mean r_hat (as
    :func:`word_features`), and for each word seen at least ``min_count`` times as a target whose
    occurrences fall into two groups, the two group means instead. The groups are 2-means over
    r_hat of the word's first ``max_occurrences`` occurrences (10 Lloyd iterations, started from a
    split along the direction of largest spread); a word keeps its split when the smaller group
    holds at least ``min_share`` of them. Memory: at most ``max_occurrences`` vectors per word.
    ``features``: this model's ``word_features`` over ``stream``, when already computed.
    """
    rep = report if report is not None else SenseReport()
    X, n = word_features(model, stream, pad) if features is None else (features[0].copy(), features[1])
    V, d = X.shape
    want = np.flatnonzero(n >= min_count)
    rep.candidates = len(want)
    slot = np.full(V, -1, dtype=np.int64)
    slot[want] = np.arange(len(want))
    cap = np.minimum(n[want], max_occurrences)
    base = np.concatenate([[0], np.cumsum(cap)])
    store = np.zeros((int(base[-1]), d), dtype=np.float32)  # the kept r_hat of each candidate word
    filled = np.zeros(len(want), dtype=np.int64)
    was_training = model.training
    model.eval()
    for ctx, tgt in batches(stream, model.config.context, 8192, pad):
        s = slot[tgt]
        keep = np.flatnonzero(s >= 0)
        if not len(keep):
            continue
        s = s[keep]
        # the rank of each position among its word's occurrences so far, in stream order
        order = np.argsort(s, kind="stable")
        ss = s[order]
        first = np.r_[True, ss[1:] != ss[:-1]]
        rank = np.arange(len(ss)) - np.maximum.accumulate(np.where(first, np.arange(len(ss)), 0))
        pos = filled[ss] + rank
        ok = pos < cap[ss]
        rhat = model.context_vector(torch.from_numpy(ctx[keep[order[ok]]])).float().numpy()
        store[base[ss[ok]] + pos[ok]] = rhat
        np.add.at(filled, ss, 1)
    model.train(was_training)
    rng = np.random.default_rng(seed)
    items, owner = [X], [np.arange(V)]
    extra_rows, extra_words = [], []
    for i, w in enumerate(want):
        Y = store[base[i] : base[i + 1]].astype(np.float64)
        mu = Y.mean(0)
        v = rng.standard_normal(d)
        for _ in range(5):  # power iteration: the direction of largest spread
            v = (Y - mu).T @ ((Y - mu) @ v)
            v /= np.linalg.norm(v) + 1e-300
        lab = (Y - mu) @ v > 0
        for _ in range(10):
            if lab.all() or not lab.any():
                break
            c1, c0 = Y[lab].mean(0), Y[~lab].mean(0)
            lab = ((Y - c1) ** 2).sum(1) < ((Y - c0) ** 2).sum(1)
        share = min(lab.mean(), 1 - lab.mean())
        if share >= min_share:
            X[w] = Y[lab].mean(0)
            extra_rows.append(Y[~lab].mean(0))
            extra_words.append(w)
    rep.split_words = len(extra_words)
    if extra_rows:
        items.append(np.asarray(extra_rows))
        owner.append(np.asarray(extra_words, dtype=np.int64))
    return np.concatenate(items), np.concatenate(owner)


def tree_over_items(tree: WordTree, item_word: np.ndarray, num_words: int) -> WordTree:
    """The word tree of a tree built over items (:func:`sense_features`): each item's leaf becomes
    a leaf of its word; a node whose two children become leaves of one word becomes that leaf."""
    ch = tree.children

    def visit(c: int):
        if c < 0:
            return int(item_word[-1 - c])
        a, b = visit(int(ch[c, 0])), visit(int(ch[c, 1]))
        return a if isinstance(a, int) and a == b else (a, b)

    return WordTree.from_nested(visit(0), num_words)

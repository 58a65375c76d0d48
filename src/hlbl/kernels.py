"""The numba kernels of the fast CPU engine (:mod:`hlbl.fast` says what they compute and why).

One training step is ``_step``: ``_gather`` (the rows a batch reads), ``_csr`` (its entries grouped
by row), ``_by_block`` (when each row is first and last read), then per block of examples
``catch_up`` (lazy momentum and decay of the rows the block reads first), ``_forward_backward``
and ``_update_nodes`` / ``_update_words`` (the rows the block reads last); then C's step.
``train_steps`` runs a thread's steps with the GIL released; ``score`` is the parallel scorer.
Shapes are given in each docstring.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from .intrinsics import CACHE_LINE
from .intrinsics import claim as _claim
from .intrinsics import cycles as _cycles
from .intrinsics import prefetch as _prefetch
from .intrinsics import prefetch_row as _prefetch_row

# Vectorised float reductions and FMAs; never approximate functions ('afn') or assume no NaN/inf.
_FM = {"reassoc", "contract", "nsz"}


# ---- bundles and constants -------------------------------------------------------------------


class Params(NamedTuple):
    """The parameters a step updates and their momentum buffers (a buffer is the parameter itself,
    never touched, where its group has no momentum). float32, C-contiguous; shared by threads."""

    R: np.ndarray  # (V, d) context word vectors
    Rbuf: np.ndarray  # (V, d)
    C: np.ndarray  # (n, d) diagonal context weights, one row per context position
    Cbuf: np.ndarray  # (n, d)
    Q: np.ndarray  # (N, d) tree node vectors
    Qbuf: np.ndarray  # (N, d)
    qb: np.ndarray  # (N,) node biases (strided views of the node records, see fast._row_records)
    qbbuf: np.ndarray  # (N,)


class Rates(NamedTuple):
    """One parameter group's SGD hyperparameters (float64)."""

    lr: float  # learning rate
    mu: float  # momentum (0: plain SGD, no buffer)
    wd: float  # L2 weight decay


class OptState(NamedTuple):
    """The optimiser's hyperparameters and lazy-update state (``hlbl.fast`` module docstring)."""

    words: Rates  # R's group
    other: Rates  # C's and Q's group (one group: they share P_other)
    bias: Rates  # the node biases' group
    P_words: np.ndarray  # (steps+1, 2, 2) float64: A^k, the gradient-free step of R's group
    P_other: np.ndarray  # (steps+1, 2, 2): the same for C and Q's group
    P_bias: np.ndarray  # (steps+1, 2, 2): the same for the node biases
    last_w: np.ndarray  # (V,) int32: the step each word row is up to date with (strided view)
    last_n: np.ndarray  # (N,) int32: the same for node rows
    word_rate: np.ndarray  # (V,) float32: each context row's gradient multiplier, or (0,): none (LBL.set_word_rates)


class WordPaths(NamedTuple):
    """The tree's paths as the kernels read them (``hlbl.fast._word_paths``): word w's codes are
    records ``first[w]`` to ``first[w + 1] - 1`` of ``codes``, one 64-byte-aligned record a code.
    Not a (V, K) table padded to the most codes of any word: on a multi-code tree most words have
    far fewer (6.15 on average of at most 32 on a 189,931-word x4 tree)."""

    first: np.ndarray  # (V+1,) int64: word w's first record; first[V] = L, the number of codes
    codes: np.ndarray  # (L, W) int32: codes[r, 0] = the code's length, codes[r, 1 + t] = 2 * node + bit (1: left)
    most: int  # K, the most codes of any word


class Workspace(NamedTuple):
    """One thread's scratch arrays for a step of up to B examples (the kernels allocate nothing per
    step); KD = K * D path slots per example, E = max(B * KD, B * n) (example, row) entries."""

    ctx: np.ndarray  # (B, n) int32: context word ids (_gather)
    keys: np.ndarray  # (B, KD) int32: node ids on the target's paths, -1 where none (_gather)
    plen: np.ndarray  # (B, K) int32: path lengths, -1 where no path (_gather)
    h: np.ndarray  # (B, d) float32: predicted vectors
    dh: np.ndarray  # (B, d) float32: dLoss/dh
    gs: np.ndarray  # (B, KD) float32: node signs, then dLoss/dscore (_forward_backward)
    plp: np.ndarray  # (B, K) float64: log P of each path
    nll: np.ndarray  # (B,) float64: each example's NLL
    gC: np.ndarray  # (n, d) float32: gradient of C
    slot_n: np.ndarray  # (N,) int32: this thread's CSR slots of the nodes (fast._row_records)
    slot_w: np.ndarray  # (V,) int32: the same for the words
    uniq_n: np.ndarray  # (E+1,) int64: _csr's output for the nodes ...
    start_n: np.ndarray  # (E+1,) int64
    ent_n: np.ndarray  # (E+1,) int64
    uniq_w: np.ndarray  # (E+1,) int64: ... and for the context words
    start_w: np.ndarray  # (E+1,) int64
    ent_w: np.ndarray  # (E+1,) int64
    cursor: np.ndarray  # (E+1,) int64: _csr's scratch
    order_n: np.ndarray  # (E+1,) int64: _by_block's output for the nodes ...
    order_w: np.ndarray  # (E+1,) int64: ... and for the words
    first_n: np.ndarray  # (B+2,) int64
    off_n: np.ndarray  # (B+2,) int64
    first_w: np.ndarray  # (B+2,) int64
    off_w: np.ndarray  # (B+2,) int64
    g: np.ndarray  # (d,) float32: one row's summed gradient
    empty: np.ndarray  # (0,) float32: "no bias" for catch_up


# Prefetch distances: how far ahead of the loop's current item the rows it will read are
# prefetched. Far enough that a cold row arrives before it is needed, near enough that it is
# not evicted again (and that the core's miss buffers are not all taken): docs/engine.md.
ROWS_AHEAD = 6  # rows, in the loops over a step's rows (catch-up, updates)
POSITIONS_AHEAD = 16  # examples, for a position's token (_gather: first of two dependent reads)
PATHS_AHEAD = 6  # examples, for the target's path record (_gather: the second read)
ENTRIES_AHEAD = 64  # (example, row) entries, for a row's CSR slot (_csr)
SCORE_CHUNK = 256  # positions per parallel task of score

# A path's log-probability is accumulated as a float64 product of sigmoids, with one log per
# path (and whenever the product gets small), instead of a log1p per node: the same value to
# float64 rounding at half the transcendental cost. Factors below sigmoid(-_LOG_DOMAIN) go
# straight into the log-domain sum, so nothing underflows.
_LOG_DOMAIN = 30.0
_RENORM = 1e-280  # > 1e-308 / sigmoid(-_LOG_DOMAIN): the product stays a normal float64


@njit(inline="always", cache=True)
def _sigmoids(z):
    """(sigmoid(z), sigmoid(-z), exp(-|z|)) for float64 z, from one exp, without overflow."""
    e = math.exp(-abs(z))
    inv = 1.0 / (1.0 + e)
    if z >= 0.0:
        return inv, e * inv, e
    return e * inv, inv, e


@njit(inline="always", cache=True)
def _accumulate(z, sz, e, acc, prod):
    """Add log sigmoid(z) to the path's (log-domain sum acc, product prod); returns both."""
    if z > -_LOG_DOMAIN:
        prod *= sz
        if prod < _RENORM:
            acc += math.log(prod)
            prod = 1.0
    else:
        acc += z - math.log1p(e)  # exact log sigmoid(z) for very negative z
    return acc, prod


@njit(inline="always", cache=True)
def _path_log_prob(zs, dep, grad, b, off, derivative):
    """log P(path) = sum_{t < dep} log sigmoid(zs[t]) for the signed scores zs[t] = sign_t * (h . q_t
    + b_t) (float64) of the path's nodes: the one path log-probability of the engine, for training
    and scoring. If ``derivative`` (a constant at each call site), also grad[b, off + t] *=
    sigmoid(-zs[t]), the derivative of log sigmoid at zs[t]: training holds the node's sign there
    and gets d log P(path) / d score, in the same loop (a second pass over the path would cost
    the step time); scoring passes False, so its code has no such stores. (Arrays and row indices
    rather than row views: a view made per example costs reference counting in the hot loop.)"""
    acc, prod = 0.0, 1.0
    for t in range(dep):
        z = zs[t]
        sz, snz, e = _sigmoids(z)
        acc, prod = _accumulate(z, sz, e, acc, prod)
        if derivative:
            grad[b, off + t] *= snz
    return acc + math.log(prod)


@njit(inline="always", cache=True)
def _log_sum_exp(lp, b, best):
    """log sum_k exp(lp[b, k]) over a target's paths, lp (., K) float64 (-inf: no path k), given
    ``best`` = max_k lp[b, k] (its callers have it from their path loop): log P(word)."""
    tot = 0.0
    for k in range(lp.shape[1]):
        if lp[b, k] > -np.inf:
            tot += math.exp(lp[b, k] - best)  # <= 1 each: no overflow
    return best + math.log(tot)


@njit(inline="always", fastmath=_FM, cache=True)
def _context(stream, p, pad, n, i):
    o = p - n + i
    return stream[o] if o >= 0 else pad


# ---- training kernels (sequential; threads run them side by side, see train_epoch) ----------

# What a step's ``clock`` holds: cycles per phase, then the distinct rows the steps touched.
PHASES = ("gather_group", "catch_up", "forward_backward", "update_nodes", "update_words", "rows")


@njit(inline="always", cache=True)
def _step_of(x):
    """(node, sign) of a path step stored as 2 * node + bit (bit 1 = left: sign +1; 0 = right: -1)."""
    return x >> 1, np.float32(2 * (x & 1) - 1)


@njit(fastmath=_FM, cache=True)
def _gather(stream, pos, pad, paths, ctx, keys, sign, plen):
    """The rows example b reads: context words ctx[b] (n,) and tree nodes keys[b] (K*D,).

    ``paths`` (WordPaths): the paths of each word's codes. ``keys[b, k*D + t]`` is the node at
    step t of the target's path k, -1 where there is none; ``sign[b, k*D + t]`` its direction (+1
    left, -1 right; 0 where there is none); ``plen[b, k]`` the path's length (-1: no path k).
    Gathered here, once, so that the forward pass reads no table (the stream, the paths) whose
    lines the catch-ups have evicted since.
    """
    n = ctx.shape[1]
    B = pos.shape[0]
    K = plen.shape[1]
    W = paths.codes.shape[1]
    D = keys.shape[1] // K
    for b in range(B):
        # Two dependent random reads per example (position -> token -> its records, 64 bytes a
        # code or more): each is fetched a few examples ahead, as the records fill MBs at V = 1M.
        if b + POSITIONS_AHEAD < B:
            _prefetch(stream, pos[b + POSITIONS_AHEAD], 0)
        if b + PATHS_AHEAD < B:
            wa = stream[pos[b + PATHS_AHEAD]]
            r0 = paths.first[wa]
            for off in range(0, (paths.first[wa + 1] - r0) * W * 4, CACHE_LINE):
                _prefetch(paths.codes, r0, off)
        p = pos[b]
        for i in range(n):
            ctx[b, i] = _context(stream, p, pad, n, i)
        for e in range(K * D):
            keys[b, e] = -1
            sign[b, e] = 0.0
        target = stream[p]
        r0, m = paths.first[target], paths.first[target + 1] - paths.first[target]
        for c in range(K):
            dep = paths.codes[r0 + c, 0] if c < m else -1
            plen[b, c] = dep
            for t in range(dep):
                keys[b, c * D + t], sign[b, c * D + t] = _step_of(paths.codes[r0 + c, 1 + t])


@njit(fastmath=_FM, cache=True)
def _forward_backward(R, C, Q, qb, ctx, keys, plen, h, dh, gs, plp, nll, gC):
    """Per example b (its rows and paths from ``_gather``): h (B, d), dh (B, d) = dLoss/dh,
    gs (B, K*D), plp (B, K), nll (B,); gC (n, d).

    On entry ``gs[b, k*D + t]`` holds that node's sign (``_gather``); on return, the loss
    gradient w.r.t. the score of node keys[b, k*D + t]. ``gC[i] += sum_b R[ctx[b, i]] * dh[b]``
    (in example order) adds to the gradient of C_i; summed here, while the rows are in cache,
    rather than from a (B, n, d) array that would not fit in L2.
    """
    n, d = C.shape
    B, K = plen.shape
    D = keys.shape[1] // K
    zs = np.empty(D)  # one path's scores
    for b in range(B):
        if b + 1 < B:  # the next example's rows, while this one computes
            for i in range(n):
                _prefetch_row(R, ctx[b + 1, i])
            for e in range(K * D):
                if keys[b + 1, e] >= 0:
                    _prefetch_row(Q, keys[b + 1, e])
        hb = h[b]
        for k in range(d):
            hb[k] = 0.0
        for i in range(n):
            w = ctx[b, i]
            for k in range(d):
                hb[k] += C[i, k] * R[w, k]
        best = -np.inf
        for c in range(K):
            if plen[b, c] < 0:
                plp[b, c] = -np.inf
                continue
            for t in range(plen[b, c]):  # dot products first: independent, they overlap
                j = keys[b, c * D + t]
                s = np.float32(0.0)
                for k in range(d):
                    s += hb[k] * Q[j, k]
                zs[t] = gs[b, c * D + t] * (np.float64(s) + qb[j])
            # gs[b, c*D + t]: the sign, times sigmoid(-z) = d log P(path) / d score
            lp = _path_log_prob(zs, plen[b, c], gs, b, c * D, True)
            plp[b, c] = lp
            best = max(best, lp)
        one = K == 1 or plen[b, 1] < 0  # a word of one code: log P(word) = its path's, share 1
        logp = best if one else _log_sum_exp(plp, b, best)  # (exactly what the sum gives for one)
        nll[b] = -logp
        dhb = dh[b]
        for k in range(d):
            dhb[k] = 0.0
        for c in range(K):
            if plp[b, c] == -np.inf:
                continue
            share = 1.0 if one else math.exp(plp[b, c] - logp)  # posterior P(path c | target, h)
            for t in range(plen[b, c]):
                j = keys[b, c * D + t]
                g = np.float32(-share * gs[b, c * D + t])  # d loss / d score
                gs[b, c * D + t] = g
                for k in range(d):
                    dhb[k] += g * Q[j, k]
        for i in range(n):
            w = ctx[b, i]
            for k in range(d):
                gC[i, k] += R[w, k] * dhb[k]


@njit(cache=True)
def _csr(keys, slot, uniq, start, cursor, ent):
    """Group entries by key: returns the number of distinct keys ``nu``.

    keys (E,) int32, -1 = no entry; slot (M,) int32, all -1 on entry and on return.
    Out: uniq[:nu] keys in order of first appearance; entries of key uniq[u] are
    ent[start[u]:start[u+1]], in increasing entry order (so sums run in example order).
    """
    nu = 0
    start[0] = 0
    for e in range(keys.shape[0]):
        # slot[] is random access into V or N records
        if e + ENTRIES_AHEAD < keys.shape[0] and keys[e + ENTRIES_AHEAD] >= 0:
            _prefetch(slot, keys[e + ENTRIES_AHEAD], 0)
        key = keys[e]
        if key < 0:
            continue
        s = slot[key]
        if s < 0:
            s = nu
            slot[key] = s
            uniq[nu] = key
            start[nu + 1] = 0
            nu += 1
        start[s + 1] += 1
    for u in range(nu):
        start[u + 1] += start[u]
        cursor[u] = start[u]
    for e in range(keys.shape[0]):
        key = keys[e]
        if key < 0:
            continue
        s = slot[key]
        ent[cursor[s]] = e
        cursor[s] += 1
    for u in range(nu):
        slot[uniq[u]] = -1
    return nu


@njit(inline="always", fastmath=_FM, cache=True)
def _sgd_row(p, buf, g, lr, mu, wd):
    """torch.optim.SGD on one row: buf <- mu*buf + g + wd*p; p <- p - lr*buf (no buf if mu == 0)."""
    lr32, mu32, wd32 = np.float32(lr), np.float32(mu), np.float32(wd)
    if mu != 0.0:
        for k in range(p.shape[0]):
            bk = mu32 * buf[k] + (g[k] + wd32 * p[k])
            buf[k] = bk
            p[k] -= lr32 * bk
    else:
        for k in range(p.shape[0]):
            p[k] -= lr32 * (g[k] + wd32 * p[k])


@njit(inline="always", cache=True)
def _sgd_scalar(p, buf, j, g, lr, mu, wd):
    """:func:`_sgd_row` for the single value p[j] (a node bias), in float64."""
    pj = np.float64(p[j])
    if mu != 0.0:
        bj = mu * buf[j] + (g + wd * pj)
        buf[j] = bj
        pj -= lr * bj
    else:
        pj -= lr * (g + wd * pj)
    p[j] = pj


@njit(inline="always", fastmath=_FM, cache=True)
def _late_row(p, buf, g, lr, mu):
    """Step t's gradient for a row that another Hogwild thread has already taken past step t-1
    (so through step t's decay and momentum): only the gradient's part of an SGD step,
    buf += g, p -= lr g, applied to the row as it stands (a delayed gradient, as in any Hogwild).

    Not the exact in-order result, A^(L-t) (-lr g, g) at the row's step L: that moves the row at
    once as far as momentum would over L-t steps (up to 1/(1-mu) = 10x the step), and made
    training diverge on PTB with 2 threads."""
    lr32 = np.float32(lr)
    if mu != 0.0:
        for k in range(p.shape[0]):
            buf[k] += g[k]
            p[k] -= lr32 * g[k]
    else:
        for k in range(p.shape[0]):
            p[k] -= lr32 * g[k]


@njit(inline="always", cache=True)
def _late_scalar(p, buf, j, g, lr, mu):
    """:func:`_late_row` for the single value p[j] (a node bias), in float64."""
    if mu != 0.0:
        buf[j] += g
    p[j] -= lr * g


@njit(inline="always", fastmath=_FM, cache=True)
def _row_step(p, buf, g, lr, mu, wd, last, j, t):
    """Step t's update of row j with gradient g: the full SGD step when the row is at step t-1,
    only the gradient's part when another thread has taken it further (see _update_words).
    Returns whether the step was the full one (the row's bias, if any, must do the same).
    The stamp is claimed atomically: of two threads, only one takes the row through step t."""
    while True:
        L = last[j]  # >= t-1: this step caught the row up
        if L >= t:
            _late_row(p, buf, g, lr, mu)
            return False
        if _claim(last, j, L, t):
            _sgd_row(p, buf, g, lr, mu, wd)
            return True


@njit(nogil=True, fastmath=_FM, cache=True)
def catch_up(rows, W, Wbuf, bias, bbuf, last, S, P, mu, Pb, mub):
    """Bring ``rows`` of W (and bias, if not empty) up to step S: apply the gradient-free steps
    they skipped, (p, buf) <- A^(S - last) (p, buf). Before a step reads them (S = t-1) and at
    the end of an epoch (all rows). The stamp is claimed atomically before the row changes: with
    Hogwild threads, a thread that reaches the same row then finds nothing left to apply.
    """
    has_bias = bias.shape[0] > 0
    for r in range(min(ROWS_AHEAD, rows.shape[0])):  # the first rows: the loop prefetches ROWS_AHEAD on
        _prefetch_row(W, rows[r])
        if mu != 0.0:
            _prefetch_row(Wbuf, rows[r])
        _prefetch(last, rows[r], 0)
    for r in range(rows.shape[0]):
        if r + ROWS_AHEAD < rows.shape[0]:
            ja = rows[r + ROWS_AHEAD]
            _prefetch_row(W, ja)
            if mu != 0.0:
                _prefetch_row(Wbuf, ja)
            _prefetch(last, ja, 0)
            if has_bias:
                _prefetch(bias, ja, 0)
                if mub != 0.0:
                    _prefetch(bbuf, ja, 0)
        j = rows[r]
        L = last[j]
        while L < S and not _claim(last, j, L, S):  # Hogwild: one thread applies a row's gap
            L = last[j]
        if L >= S:  # up to date (or, with Hogwild threads, already moved on by another thread)
            continue
        gap = S - L
        # A^gap is exact to float64 rounding; its entries are rounded to float32 once per row, as
        # the row is float32 (torch's own steps are float32 too): float64 arithmetic over the row
        # would widen and narrow every element, a cost on the hottest loop for precision that the
        # float32 row cannot keep.
        a00, a01 = np.float32(P[gap, 0, 0]), np.float32(P[gap, 0, 1])
        a10, a11 = np.float32(P[gap, 1, 0]), np.float32(P[gap, 1, 1])
        if mu != 0.0:
            for k in range(W.shape[1]):
                pk = W[j, k]
                bk = Wbuf[j, k]
                W[j, k] = a00 * pk + a01 * bk
                Wbuf[j, k] = a10 * pk + a11 * bk
        else:
            for k in range(W.shape[1]):
                W[j, k] = a00 * W[j, k]
        if has_bias:
            pk = np.float64(bias[j])
            if mub != 0.0:
                bk = np.float64(bbuf[j])
                bias[j] = Pb[gap, 0, 0] * pk + Pb[gap, 0, 1] * bk
                bbuf[j] = Pb[gap, 1, 0] * pk + Pb[gap, 1, 1] * bk
            else:
                bias[j] = Pb[gap, 0, 0] * pk


@njit(fastmath=_FM, cache=True)
def _update_nodes(us, uniq, start, ent, KD, gs, h, Q, Qbuf, qb, qbbuf, nodes, bias, last, t, g):
    """Nodes uniq[us] each sum their gradient (in example order) and take their step (see
    _update_words); ``nodes``, ``bias``: the Rates of Q and of the biases."""
    d = Q.shape[1]
    nu = us.shape[0]
    for x in range(nu):
        if x + ROWS_AHEAD < nu:
            _prefetch_row(Q, uniq[us[x + ROWS_AHEAD]])
            _prefetch_row(Qbuf, uniq[us[x + ROWS_AHEAD]])
        u = us[x]
        j = uniq[u]
        y0 = start[u]
        e = ent[y0]
        gb = gs[e]
        hb = h[e // KD]
        for k in range(d):
            g[k] = gb * hb[k]
        for y in range(y0 + 1, start[u + 1]):
            e = ent[y]
            c = gs[e]
            hb = h[e // KD]
            gb += c
            for k in range(d):
                g[k] += c * hb[k]
        if _row_step(Q[j], Qbuf[j], g, nodes.lr, nodes.mu, nodes.wd, last, j, t):
            _sgd_scalar(qb, qbbuf, j, gb, bias.lr, bias.mu, bias.wd)
        else:
            _late_scalar(qb, qbbuf, j, gb, bias.lr, bias.mu)


@njit(fastmath=_FM, cache=True)
def _update_words(us, uniq, start, ent, C, dh, R, Rbuf, rates, word_rate, last, t, g):
    """Context words uniq[us] each sum their gradient sum_(b,i) C_i * dh_b, times word_rate[j]
    where given, and take their step (``rates``: R's Rates).

    With one thread a row is at step t-1 here (``catch_up``). With Hogwild threads another
    thread's later step may already have caught it up past t-1, through step t's decay and
    momentum; step t then adds only its gradient (``_row_step``), so that no step's decay or
    momentum is applied to a row twice (a plain step here would: a systematic extra decay, not
    just a stale read).
    """
    n, d = C.shape
    nu = us.shape[0]
    for x in range(nu):
        if x + ROWS_AHEAD < nu:
            _prefetch_row(R, uniq[us[x + ROWS_AHEAD]])
            _prefetch_row(Rbuf, uniq[us[x + ROWS_AHEAD]])
        u = us[x]
        j = uniq[u]
        y0 = start[u]
        e = ent[y0]
        b = e // n
        ci = C[e - b * n]
        db = dh[b]
        for k in range(d):
            g[k] = ci[k] * db[k]
        for y in range(y0 + 1, start[u + 1]):
            e = ent[y]
            b = e // n
            ci = C[e - b * n]
            db = dh[b]
            for k in range(d):
                g[k] += ci[k] * db[k]
        if word_rate.shape[0] > 0:
            rate_j = word_rate[j]
            for k in range(d):
                g[k] *= rate_j
        _row_step(R[j], Rbuf[j], g, rates.lr, rates.mu, rates.wd, last, j, t)


@njit(cache=True)
def _by_block(uniq, nu, start, ent, per_block, nb, first, off, order):
    """Schedule a step's rows into ``nb`` blocks of examples.

    A block is ``per_block`` consecutive entries (S examples). Row u (= uniq[u]) is first read in
    block ``fb(u)`` and last read in block ``lb(u)``: it must be caught up before block fb(u)
    and can take its step as soon as block lb(u) is done, as no later example reads it and its
    gradient is then complete. Out: the rows to catch up before block s are uniq[first[s]:
    first[s+1]] (uniq is in order of first appearance, so they are consecutive); the rows to step
    after block s are uniq[order[off[s]:off[s+1]]], in increasing u.
    """
    for s in range(nb + 2):
        first[s] = 0
        off[s] = 0
    for u in range(nu):
        first[ent[start[u]] // per_block + 1] += 1
        off[ent[start[u + 1] - 1] // per_block + 1] += 1
    for s in range(nb):
        first[s + 1] += first[s]
        off[s + 1] += off[s]
    for u in range(nu):
        lb = ent[start[u + 1] - 1] // per_block
        order[off[lb]] = u  # off[lb] is the cursor here ...
        off[lb] += 1
    for s in range(nb, 0, -1):  # ... and back to block starts
        off[s] = off[s - 1]
    off[0] = 0


@njit(fastmath=_FM, cache=True)
def _step(t, pos, stream, pad, params, paths, opt, work, S, clock):
    """One exact minibatch step (step number t >= 1) on the examples at positions ``pos`` (B,) of
    ``stream``, in blocks of S examples; returns the summed NLL. ``params`` (Params) and ``opt``
    (OptState) are updated in place; ``work`` (Workspace) has room for a full batch (rows >= B are
    stale). Adds the cycles spent in each phase to ``clock`` (PHASES; a few dozen cycles per block).

    Every row the batch reads is caught up just before the first block that reads it and takes
    its step just after the last one (``_by_block``). At large V most rows are read by one
    example only, so a row is fetched from memory once and then served from L2 while its
    block computes and steps it, instead of once per phase over the whole batch (whose rows
    fit no per-core cache). The step is the same for any S, to the bit: each row still sums its
    gradient in example order, and no row changes before the last example reading it.
    """
    # The bundles' arrays as locals, each read from its bundle once per step: numba takes and drops
    # a reference for every read of a tuple's field, which the block loop below would otherwise
    # pay on every use.
    R, Rbuf, C, Cbuf, Q, Qbuf, qb, qbbuf = (
        params.R,
        params.Rbuf,
        params.C,
        params.Cbuf,
        params.Q,
        params.Qbuf,
        params.qb,
        params.qbbuf,
    )
    words, other, bias, last_w, last_n = opt.words, opt.other, opt.bias, opt.last_w, opt.last_n
    word_rate = opt.word_rate
    P_words, P_other, P_bias = opt.P_words, opt.P_other, opt.P_bias
    ctx, keys, plen, h, dh, gs, plp, nll, gC = (
        work.ctx,
        work.keys,
        work.plen,
        work.h,
        work.dh,
        work.gs,
        work.plp,
        work.nll,
        work.gC,
    )
    uniq_n, start_n, ent_n, order_n, first_n, off_n = (
        work.uniq_n,
        work.start_n,
        work.ent_n,
        work.order_n,
        work.first_n,
        work.off_n,
    )
    uniq_w, start_w, ent_w, order_w, first_w, off_w = (
        work.uniq_w,
        work.start_w,
        work.ent_w,
        work.order_w,
        work.first_w,
        work.off_w,
    )
    g, empty = work.g, work.empty
    B = pos.shape[0]
    n, d = C.shape
    KD = keys.shape[1]
    c0 = _cycles()
    _gather(stream, pos, pad, paths, ctx, keys, gs, plen)  # gs: the signs, for now
    nu_n = _csr(keys.ravel()[: B * KD], work.slot_n, uniq_n, start_n, work.cursor, ent_n)
    nu_w = _csr(ctx.ravel()[: B * n], work.slot_w, uniq_w, start_w, work.cursor, ent_w)
    nb = (B + S - 1) // S
    _by_block(uniq_n, nu_n, start_n, ent_n, S * KD, nb, first_n, off_n, order_n)
    _by_block(uniq_w, nu_w, start_w, ent_w, S * n, nb, first_w, off_w, order_w)
    gC[:] = 0.0
    c1 = _cycles()
    clock[0] += c1 - c0
    for s in range(nb):
        b0, b1 = s * S, min(B, (s + 1) * S)
        # The rows this block reads first must hold their step t-1 values: decay and momentum
        # moved them while no batch touched them.
        catch_up(
            uniq_n[first_n[s] : first_n[s + 1]],
            Q,
            Qbuf,
            qb,
            qbbuf,
            last_n,
            t - 1,
            P_other,
            other.mu,
            P_bias,
            bias.mu,
        )
        catch_up(
            uniq_w[first_w[s] : first_w[s + 1]], R, Rbuf, empty, empty, last_w, t - 1, P_words, words.mu, P_bias, 0.0
        )
        c2 = _cycles()
        _forward_backward(
            R,
            C,
            Q,
            qb,
            ctx[b0:b1],
            keys[b0:b1],
            plen[b0:b1],
            h[b0:b1],
            dh[b0:b1],
            gs[b0:b1],
            plp[b0:b1],
            nll[b0:b1],
            gC,
        )
        c3 = _cycles()
        _update_nodes(
            order_n[off_n[s] : off_n[s + 1]],
            uniq_n,
            start_n,
            ent_n,
            KD,
            gs.ravel(),
            h,
            Q,
            Qbuf,
            qb,
            qbbuf,
            other,
            bias,
            last_n,
            t,
            g,
        )
        c4 = _cycles()
        _update_words(
            order_w[off_w[s] : off_w[s + 1]], uniq_w, start_w, ent_w, C, dh, R, Rbuf, words, word_rate, last_w, t, g
        )
        c5 = _cycles()
        clock[1] += c2 - c1
        clock[2] += c3 - c2
        clock[3] += c4 - c3
        clock[4] += c5 - c4
        c1 = c5
    for i in range(n):
        _sgd_row(C[i], Cbuf[i], gC[i], other.lr, other.mu, other.wd)
    clock[5] += nu_n + nu_w
    return nll[:B].sum()


@njit(nogil=True, cache=True)
def train_steps(steps, order, first, B, stream, pad, params, paths, opt, work, S, clock):
    """Steps ``steps`` (step t trains on positions (t-1)B .. tB-1 of the epoch's order, in blocks of
    S) in sequence; returns the summed NLL. ``order`` holds the order from its position ``first`` on
    (a window of a long epoch's order, or all of it with ``first`` 0). ``params``, ``opt``, ``work``: see _step. ``clock`` (6,) int64 accumulates the
    cycles of each phase and the rows touched (PHASES).

    Releases the GIL, so several Python threads can run it on disjoint steps (Hogwild).
    """
    total = 0.0
    for x in range(steps.shape[0]):
        t = steps[x]
        total += _step(t, order[(t - 1) * B - first : t * B - first], stream, pad, params, paths, opt, work, S, clock)
    return total


# ---- scoring -------------------------------------------------------------------------------


@njit(parallel=True, fastmath=_FM, cache=True)
def score(stream, pad, R, C, Q, qb, paths, out):
    """out[p] = log P(stream[p] | its n preceding tokens), float64, for every position p;
    ``paths`` as in ``_gather``."""
    N = stream.shape[0]
    n, d = C.shape
    K = paths.most
    chunk = SCORE_CHUNK
    for c in prange((N + chunk - 1) // chunk):
        h = np.empty(d, dtype=np.float32)
        plp = np.empty((1, K))  # 2-d for _log_sum_exp
        zs = np.empty(paths.codes.shape[1])
        for p in range(c * chunk, min(N, (c + 1) * chunk)):
            if p + 1 < N:  # the next target's first path, while this one computes
                w1 = stream[p + 1]
                r1 = paths.first[w1]
                for t in range(paths.codes[r1, 0]):
                    _prefetch_row(Q, paths.codes[r1, 1 + t] >> 1)
            for k in range(d):
                h[k] = 0.0
            for i in range(n):
                w = _context(stream, p, pad, n, i)
                for k in range(d):
                    h[k] += C[i, k] * R[w, k]
            target = stream[p]
            best = -np.inf
            r0, m = paths.first[target], paths.first[target + 1] - paths.first[target]
            for cc in range(K):
                if cc >= m:
                    plp[0, cc] = -np.inf
                    continue
                dep = paths.codes[r0 + cc, 0]
                # All the path's dot products first (independent, so they overlap in the CPU),
                # then the scalar chain: faster than one latency-bound node after the other.
                for t in range(dep):
                    j, sgn = _step_of(paths.codes[r0 + cc, 1 + t])
                    s = np.float32(0.0)
                    for k in range(d):
                        s += h[k] * Q[j, k]
                    zs[t] = sgn * (np.float64(s) + qb[j])
                lp = _path_log_prob(zs, dep, plp, 0, 0, False)  # (plp: a stand-in, never written)
                plp[0, cc] = lp
                best = max(best, lp)
            out[p] = _log_sum_exp(plp, 0, best)


# ---- word features for learned trees ---------------------------------------------------------


@njit(nogil=True, cache=True)
def feature_sums(stream, lo, hi, pad, R, C, sums, counts):
    """Add r_hat of positions lo .. hi-1 of ``stream`` into ``sums[target]`` (float64) and count
    targets. r_hat = sum_i C[i] * R[w_i] in float32, summed in context order as torch's
    ``(R[ctx] * C).sum(1)`` does, then widened: the same numbers as the torch path, without the
    (B, n, d) temporaries. R (V, d) and C (n, d) float32; sums (V, d) float64; counts (V,) int64."""
    n, d = C.shape
    acc = np.empty(d, np.float32)
    for p in range(lo, hi):
        for j in range(d):
            acc[j] = 0.0
        for i in range(n):
            q = p - n + i
            w = stream[q] if q >= 0 else pad
            for j in range(d):
                acc[j] += R[w, j] * C[i, j]
        t = stream[p]
        counts[t] += 1
        for j in range(d):
            sums[t, j] += np.float64(acc[j])

"""numba kernels of the class-based output layer's within-class softmax (:mod:`hlbl.output.classes`).

A minibatch's (example, class membership) pairs are visited class by class (``order``), so a
class's member rows stay in cache while its examples are scored. Per pair p with example row r,
class rows [a, e) and member t::

    s_j = h_r . q_j + b_j  (j in [a, e)),   out_p = s_t - logsumexp_j s_j,   prob_pj = exp(s_j - lse)

and the backward pass, with g_p = d loss / d out_p and G_j = g_p (1[j = t] - prob_pj)::

    d b_j += G_j,   d q_j += G_j h_r,   d h_r += G_j q_j

Sequential (one thread): the same input gives the same bits. float32 or float64 arrays, C-contiguous.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# Vectorised float reductions and FMAs; never approximate functions ('afn') or assume no NaN/inf.
_FM = {"reassoc", "contract", "nsz"}


@njit(cache=True)
def pair_offsets(sizes):
    """(P + 1,) int64 start of each pair's probabilities in the flat buffer; ``sizes`` (P,)."""
    off = np.empty(len(sizes) + 1, dtype=np.int64)
    off[0] = 0
    for p in range(len(sizes)):
        off[p + 1] = off[p] + sizes[p]
    return off


@njit(fastmath=_FM, cache=True)
def within_forward(H, W, bias, rows, member, start, end, order, off, out, prob):
    """H (B, d), W (M, d), bias (M,); per pair p: rows, member (its row of W), start / end (its
    class's rows of W) (P,) int64; order (P,) pairs by class; off (P + 1,) into prob (T,).
    Writes out (P,) log P(member | class, h) and prob (T,) the class softmax of each pair."""
    d = H.shape[1]
    for i in range(len(order)):
        p = order[i]
        r, a, e, o = rows[p], start[p], end[p], off[p]
        best = -np.inf
        for j in range(a, e):
            s = bias[j]
            for k in range(d):
                s += H[r, k] * W[j, k]
            prob[o + j - a] = s
            if s > best:
                best = s
        tot = 0.0
        for j in range(e - a):
            tot += math.exp(prob[o + j] - best)  # <= 1 each: no overflow
        lse = best + math.log(tot)
        out[p] = prob[o + member[p] - a] - lse
        for j in range(e - a):
            prob[o + j] = math.exp(prob[o + j] - lse)


@njit(fastmath=_FM, cache=True)
def within_backward(H, W, grad, rows, member, start, end, order, off, prob, gH, gW, gb, want_h):
    """Adds the gradients of sum_p grad[p] out[p] into gH (B, d) (when ``want_h``), gW (M, d), gb (M,)."""
    d = H.shape[1]
    for i in range(len(order)):
        p = order[i]
        r, a, e, o, g = rows[p], start[p], end[p], off[p], grad[p]
        if g == 0.0:
            continue
        for j in range(a, e):
            G = -g * prob[o + j - a]
            if j == member[p]:
                G += g
            gb[j] += G
            for k in range(d):
                gW[j, k] += G * H[r, k]
            if want_h:
                for k in range(d):
                    gH[r, k] += G * W[j, k]

"""numba kernel of the tree softmax's full distribution on the CPU (:meth:`hlbl.output.TreeSoftmax.log_prob`).

Given every node's score ``S[i, j] = h_i . q_j + b_j`` and ``L[i, j] = log sigmoid(S[i, j])``
(both computed by PyTorch: one matrix product and one vectorised pass), the log-probability of
reaching each node is a running sum from the root, and a leaf's is its parent's plus the edge's::

    left child of j:  pre[j] + L[i, j]            right child:  pre[j] + L[i, j] - S[i, j]

(``log sigmoid(-s) = log sigmoid(s) - s``). Node ids are breadth-first, so a parent precedes its
children and one sweep over j in order fills ``pre`` and every leaf. A row of S, L and the output
stays in cache for the sweep, where the same walk level by level with tensor operations (the
layer's path off the CPU) gathers columns of a (B, 2N) table once a level. A word with several
leaves gets the log-sum-exp of its leaves.

Sequential within a row, rows independent: the same input gives the same bits whatever the
slicing. float32 or float64 arrays, C-contiguous.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _log_add(a, b):
    """log(exp(a) + exp(b)), exact for -inf operands."""
    if a < b:
        a, b = b, a
    if b == -np.inf:
        return a
    return a + math.log1p(math.exp(b - a))


@njit(cache=True, nogil=True)
def descend(L, S, children, multi, start, stop, out):
    """Rows [start, stop) of out (B, V) = log P(word | h_i) from L, S (B, N) and the tree's
    ``children`` (N, 2) int64 (child node id, or -1 - word id for a leaf). ``multi``: some word
    has several leaves (out must then be filled with -inf beforehand); else every word has one
    leaf and each out entry is written once."""
    N = L.shape[1]
    pre = np.empty(N, dtype=L.dtype)  # log P(reaching node j) for the current row
    for i in range(start, stop):
        Li, Si, oi = L[i], S[i], out[i]
        pre[0] = 0.0
        for j in range(N):
            left = pre[j] + Li[j]
            right = left - Si[j]
            for side in range(2):
                edge = left if side == 0 else right
                c = children[j, side]
                if c >= 0:
                    pre[c] = edge
                elif multi:
                    oi[-1 - c] = _log_add(oi[-1 - c], edge)
                else:
                    oi[-1 - c] = edge

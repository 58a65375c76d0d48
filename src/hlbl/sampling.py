"""Sampling next words: ancestral sampling on a word tree, or from a full distribution.

Ancestral sampling walks from the root, going left at node j with probability
``sigmoid(h . q_j + b_j)``: O(depth d) per token, and exact for multi-code trees too (a word is
drawn with the summed probability of its leaves). *Temperature* ``T`` can mean two different
distributions: per-node temperature ``sigmoid(s_j / T)`` at every decision (cheap, O(depth d),
but *not* ``p(w)^(1/T) / Z``: the normaliser does not factor over the tree, and multi-code sums
do not commute with powers), or the exact tempered distribution ``p(w)^(1/T) / Z``, which needs
every word's probability (O(N d) per token, the cost of the full distribution: even for a
single-code tree, where ``p^(1/T)`` factors over the path, the normalisers of the subtrees need
a bottom-up pass over all N nodes). We offer both; exact is the default, per-node is opt-in.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from .search import TreeArrays, dot64, node_weights, tree_arrays  # (dot64: the same float64 dot as the search)
from .tree import WordTree


@numba.njit(cache=True, nogil=True)
def _ancestral_walk(H, W, b, children, U, temperature, out):
    """out[i] = the word reached from the root going left where U[i, t] < sigmoid(s_j / T);
    -1 where a decision is NaN (non-finite weights or input: no word can be drawn)."""
    for i in range(H.shape[0]):
        node = 0
        t = 0
        while True:
            s = (dot64(H[i], W, node) + b[node]) / temperature
            if s != s:
                out[i] = -1
                break
            c = children[node, 0] if U[i, t] < 1.0 / (1.0 + math.exp(-s)) else children[node, 1]
            t += 1
            if c < 0:
                out[i] = -1 - c
                break
            node = c


def ancestral_sample(
    tree: WordTree,
    weight: torch.Tensor,
    bias: torch.Tensor,
    input: torch.Tensor,
    generator: torch.Generator | None = None,
    temperature: float = 1.0,
    arrays: TreeArrays | None = None,
) -> torch.Tensor:
    """(B,) words drawn by walking down the tree from the root, O(depth d) per row (numba, CPU).

    With ``temperature`` T != 1 every decision uses ``sigmoid(s_j / T)`` (per-node temperature,
    which is *not* the tempered word distribution; see the module docstring). One uniform per
    row and level is drawn up front from ``generator``, so a seed fixes the result.
    """
    check_temperature(temperature)
    a = tree_arrays(tree) if arrays is None else arrays
    W, b = node_weights(tree, weight, bias)
    if input.dim() != 2 or input.shape[1] != W.shape[1]:
        raise ValueError(f"input must have shape (B, {W.shape[1]}), got {tuple(input.shape)}")
    B = input.shape[0]
    depth = a.path_nodes.shape[1]  # the deepest leaf (path tables are padded to it): O(1), not O(V)
    U = (
        torch.rand(
            B,
            depth,
            generator=generator,
            dtype=torch.float64,
            device=generator.device if generator is not None else "cpu",
        )
        .cpu()
        .numpy()
    )
    H = np.ascontiguousarray(input.detach().to("cpu", torch.float64).numpy())
    out = np.empty(B, dtype=np.int64)
    _ancestral_walk(H, W, b, a.children, U, float(temperature), out)
    if (out < 0).any():
        raise ValueError("cannot sample: a tree decision is NaN (non-finite weights or input)")
    return torch.from_numpy(out).to(input.device)


def sample_from_log_prob(
    log_prob: torch.Tensor, generator: torch.Generator | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """(B,) words drawn from ``softmax(log_prob / T)``: the exact tempered distribution."""
    check_temperature(temperature)
    lp = log_prob.double()
    # Shift first: with a tiny T, lp / T alone is -inf for every word and softmax gives NaN.
    p = torch.softmax((lp - lp.max(dim=1, keepdim=True).values) / temperature, dim=1)  # (B, V)
    if generator is not None and generator.device != p.device:
        p = p.to(generator.device)
    # Inverse CDF: one uniform per row; O(V) like torch.multinomial, but ~20x cheaper for one
    # draw from a large V. u is scaled by the total so rounding in the cumsum cannot step past it.
    if not torch.isfinite(p).all():  # NaN scores, or every word at -inf: no distribution to draw from
        raise ValueError("cannot sample: the distribution has NaN or no probability mass (a diverged model?)")
    cdf = p.cumsum(dim=1)  # (B, V)
    u = torch.rand(p.shape[0], 1, generator=generator, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
    word = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=p.shape[1] - 1)
    return word.to(log_prob.device)


def check_temperature(t: float) -> None:
    """A sampling temperature must be a positive finite number (ValueError)."""
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"temperature must be a positive number, got {t}")


__all__ = ["ancestral_sample", "sample_from_log_prob"]

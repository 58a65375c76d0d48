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

The draws are numpy functions of given uniforms (:func:`walk`, :func:`inverse_cdf`), so the numpy
model (:mod:`hlbl.numpy_model`) samples without torch. :class:`TorchUniforms` reproduces the
float64 stream of a seeded CPU ``torch.Generator``: a seed gives the same text on either path.
torch itself is imported only by the tensor wrappers.
"""

from __future__ import annotations

import math

from typing import TYPE_CHECKING

import numba
import numpy as np

from .search import NodeWeights, TreeArrays, dot64, node_weights, tree_arrays  # (dot64: the search's float64 dot)
from .tree import WordTree

if TYPE_CHECKING:
    import torch


class TorchUniforms:
    """The float64 uniforms of ``torch.rand(..., generator=torch.Generator().manual_seed(seed),
    dtype=torch.float64)`` on the CPU, in numpy.

    torch's CPU generator is the reference MT19937 seeded by ``init_genrand`` with the seed's low
    32 bits (numpy's legacy seeding, the same); a float64 takes two 32-bit outputs, the first as
    the high half, and keeps the low 53 bits of that 64-bit word, times 2^-53. Seeds equal modulo
    2^32 give the same stream, as in torch. ``tests/test_sampling.py`` compares the two streams,
    so a change in torch shows there, not as different text.
    """

    def __init__(self, seed: int):
        if seed < 0:
            raise ValueError(f"seed must be at least 0, got {seed}")
        self._state = np.random.RandomState(seed & 0xFFFFFFFF)  # (legacy seeding: init_genrand)

    def random(self, shape: tuple[int, ...]) -> np.ndarray:
        """float64 uniforms in [0, 1) of ``shape``: the next ``torch.rand(*shape)``."""
        n = int(np.prod(shape, dtype=np.int64))
        # uint32 over the full range: one raw MT19937 output each, no rejection
        raw = self._state.randint(0, 2**32, size=2 * n, dtype=np.uint32).astype(np.uint64)
        word = ((raw[0::2] << np.uint64(32)) | raw[1::2]) & np.uint64((1 << 53) - 1)
        return (word.astype(np.float64) * 2.0**-53).reshape(shape)


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
    import torch

    check_temperature(temperature)
    a = tree_arrays(tree) if arrays is None else arrays
    W, b = node_weights(tree, weight, bias)
    if input.dim() != 2 or input.shape[1] != W.shape[1]:
        raise ValueError(f"input must have shape (B, {W.shape[1]}), got {tuple(input.shape)}")
    B = input.shape[0]
    U = (
        torch.rand(
            B,
            walk_depth(a),
            generator=generator,
            dtype=torch.float64,
            device=generator.device if generator is not None else "cpu",
        )
        .cpu()
        .numpy()
    )
    H = input.detach().to("cpu", torch.float64).numpy()
    return torch.from_numpy(walk(a, NodeWeights(W, b), H, U, temperature)).to(input.device)


def walk_depth(arrays: TreeArrays) -> int:
    """Uniforms a walk takes per row: the deepest leaf's depth (the path tables are padded to it)."""
    return arrays.path_nodes.shape[1]


def walk(arrays: TreeArrays, weights: NodeWeights, H: np.ndarray, U: np.ndarray, temperature: float) -> np.ndarray:
    """(B,) int64 words reached from the root by rows H (B, d), going left at node j where
    ``U[i, t] < sigmoid(s_j / T)`` at step t; U is (B, :func:`walk_depth`) float64."""
    H = np.ascontiguousarray(H, dtype=np.float64)
    out = np.empty(H.shape[0], dtype=np.int64)
    _ancestral_walk(H, weights.W, weights.b, arrays.children, U, float(temperature), out)
    if (out < 0).any():
        raise ValueError("cannot sample: a tree decision is NaN (non-finite weights or input)")
    return out


def sample_from_log_prob(
    log_prob: torch.Tensor, generator: torch.Generator | None = None, temperature: float = 1.0
) -> torch.Tensor:
    """(B,) words drawn from ``softmax(log_prob / T)``: the exact tempered distribution."""
    import torch

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


def inverse_cdf(log_prob: np.ndarray, u: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """numpy's :func:`sample_from_log_prob`: (B,) words of ``softmax(log_prob / T)`` (B, V) drawn
    with the uniforms ``u`` (B,) float64, by the same steps (shift, scale, cumsum, search)."""
    check_temperature(temperature)
    lp = np.asarray(log_prob, dtype=np.float64)
    z = (lp - lp.max(axis=1, keepdims=True)) / temperature
    with np.errstate(invalid="ignore"):
        e = np.exp(z)
        p = e / e.sum(axis=1, keepdims=True)
    if not np.isfinite(p).all():
        raise ValueError("cannot sample: the distribution has NaN or no probability mass (a diverged model?)")
    cdf = np.cumsum(p, axis=1)
    words = [np.searchsorted(c, x * c[-1], side="right") for c, x in zip(cdf, np.asarray(u, np.float64))]
    return np.minimum(np.asarray(words, dtype=np.int64), p.shape[1] - 1)


def check_temperature(t: float) -> None:
    """A sampling temperature must be a positive finite number (ValueError)."""
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"temperature must be a positive number, got {t}")


__all__ = ["TorchUniforms", "ancestral_sample", "inverse_cdf", "sample_from_log_prob", "walk", "walk_depth"]

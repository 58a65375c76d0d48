"""A trained tree model for inference without PyTorch: numpy weights and the numba kernels.

``import torch`` costs seconds before a command's first answer, and inference on the fast engine's
kind of model (tree output layer, diagonal context weights, float32) needs none of it: scoring is
the fast engine's scorer (``kernels.score``), top-k the tree search (:mod:`hlbl.search`),
both numba kernels on numpy arrays. :class:`NumpyLBL` holds those arrays; ``Run.numpy_model`` reads
them from a run with the checks of :func:`hlbl.checkpoint.load_weights` (format, owner, shapes,
finite values, checksum) through safetensors' numpy reader.

Its numbers are the torch model's, bit for bit: :meth:`NumpyLBL.token_log_probs` is the function
``hlbl.fast.token_log_probs`` calls on the model's own tensors (this module owns the scorer's
driver; :mod:`hlbl.fast` delegates to it), and :meth:`NumpyLBL.topk` computes the context vector
as ``LBL.context_vector`` does (float32 products, summed over the context in order) and then runs
the search ``hlbl.search.tree_topk`` runs. ``tests/test_numpy_model.py`` compares the two paths.
:meth:`NumpyLBL.generate` samples as ``LBL.generate`` does, from the same uniforms
(:class:`hlbl.sampling.TorchUniforms` reproduces a seeded ``torch.Generator``'s stream): the same
seed gives the same words (the exact tempered draw from the full distribution could differ only
where a uniform falls within rounding of a boundary between two words).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from . import data
from .config import LBLConfig
from .kernels import WordPaths, score
from .memory import prefer_huge_pages
from .progress import progress
from .sampling import TorchUniforms, check_temperature, inverse_cdf, walk, walk_depth
from .search import NodeWeights, ScratchPool, TreeArrays, check_k, search_rows, tree_arrays
from .tree import WordTree
from .tree_kernels import descend

SCORE_CHUNK = 1 << 19  # positions per scoring call (a progress update each)


def unsupported(config: LBLConfig) -> str | None:
    """Why a model of ``config`` has no numpy form (None if it has): the fast engine's kinds only."""
    if config.output != "tree":
        return f"the numpy model is a tree model; this one has {config.output} output"
    if config.full_context:
        return "the numpy model has diagonal context weights, not full context matrices"
    return None


def word_paths(tree: WordTree) -> WordPaths:
    """The tree's paths as the kernels read them (:class:`~hlbl.kernels.WordPaths`), by word and code.

    Record ``first[w] + k`` is word w's k-th code: ``codes[r, 0]`` its length and
    ``codes[r, 1 + t] = 2 * node + bit`` its step t (bit 1: left, 0: right). A record is W int32,
    W = the longest path + 1 rounded up to 16 (64-byte records that never straddle a cache line
    more than they must): a step's gather then reads one record a code where separate tables of
    leaves, nodes, bits and depths cost four random memory accesses.
    """
    if tree.num_nodes >= 2**30:
        raise ValueError(f"the fast engine handles trees of fewer than 2**30 nodes, not {tree.num_nodes}")
    leaves = tree.word_leaves  # (V, K), -1 padded
    has = leaves >= 0
    first = np.zeros(leaves.shape[0] + 1, np.int64)
    np.cumsum(has.sum(1), out=first[1:])
    lf = leaves[has]  # (L,) every word's leaves, word by word
    D = int(tree.leaf_depth.max())
    codes = np.zeros((len(lf), -(-(D + 1) // 16) * 16), np.int32)
    for r0 in range(0, len(lf), 1 << 16):  # in slices: whole-table temporaries would double peak memory at V = 1M
        part = lf[r0 : r0 + (1 << 16)]
        codes[r0 : r0 + len(part), 0] = tree.leaf_depth[part]
        steps = 2 * tree.path_nodes[part] + tree.path_bits[part]
        codes[r0 : r0 + len(part), 1 : D + 1] = np.where(tree.path_mask[part], steps, 0)
    return WordPaths(first=first, codes=codes, most=int(leaves.shape[1]))


def check_stream(stream: np.ndarray, pad: int, V: int) -> np.ndarray:
    """The stream as contiguous int32, after checking every id (the kernels do no bounds checks).
    A memory-mapped int32 stream is returned as it is (its ids read through the file, in pieces:
    the check maps none of it; see data.EpochReader)."""
    if not isinstance(stream, np.memmap) or data.mapped_file(stream) is None:
        stream = np.ascontiguousarray(stream, dtype=np.int32)
    lo, hi = 0, 0
    for i, part in enumerate(data.stream_pieces(stream)):
        a, b = int(part.min()), int(part.max())
        lo, hi = (a, b) if i == 0 else (min(lo, a), max(hi, b))
    if len(stream) and (lo < 0 or hi >= V):
        raise ValueError(f"token ids must be in 0..{V - 1}; the stream has {lo}..{hi}")
    if not 0 <= pad < V:
        raise ValueError(f"pad id {pad} is not in 0..{V - 1}")
    return stream


def score_stream(
    weights: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, WordPaths],
    stream: np.ndarray,
    pad: int,
    chunk: int = SCORE_CHUNK,
) -> np.ndarray:
    """(N,) float64 log P of every token of ``stream`` (checked: :func:`check_stream`) given its
    context, by the fast engine's parallel scorer; ``weights`` = (R (V, d), C (n, d), Q (N, d),
    qb (N,), paths), float32 C-contiguous. In pieces of ``chunk`` positions, each with the n tokens
    before it as context (their own scores are dropped): the same numbers as one call, and
    progress on a 2M-token split."""
    n = weights[1].shape[0]
    out = np.empty(len(stream), dtype=np.float64)
    bar = progress(len(stream), "scoring", "w", show=len(stream) > chunk)
    for lo in range(0, len(stream), chunk):
        hi = min(lo + chunk, len(stream))
        start = max(0, lo - n)
        part = np.empty(hi - start, dtype=np.float64)
        score(stream[start:hi], pad, *weights, part)
        out[lo:hi] = part[lo - start :]
        bar.update(hi - lo)
    bar.close()
    return out


def set_numba_threads(threads: int | None) -> None:
    """numba's threads for the parallel kernels: ``threads`` clamped to [1, NUMBA_NUM_THREADS]
    (None: numba's own count). Results do not depend on it."""
    if threads is not None:
        numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


@dataclass(frozen=True, eq=False)
class NumpyLBL:
    """An LBL with a tree output layer and diagonal context weights, as numpy arrays (module
    docstring): what ``hlbl predict``, ``score`` and ``eval`` need of a model, without torch.
    Read-only; the arrays are float32, C-contiguous, and named as the torch model's state."""

    config: LBLConfig
    tree: WordTree
    R: np.ndarray  # (V, d) context word vectors (``R.weight``)
    C: np.ndarray  # (n, d) diagonal context weights
    Q: np.ndarray  # (N, d) node vectors (``out.weight``)
    qb: np.ndarray  # (N,) node biases (``out.bias``)
    paths: WordPaths  # word_paths(tree), for the scorer
    arrays: TreeArrays  # tree_arrays(tree), for the search
    pool: ScratchPool  # the search's scratch, kept between calls

    @staticmethod
    def layout(config: LBLConfig, tree: WordTree) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        """(dtype, shape) of each tensor of the torch model's state: what a weights file must hold."""
        V, d, n, N = config.vocab_size, config.dim, config.context, tree.num_nodes
        f32 = np.dtype(np.float32)
        return {
            "R.weight": (f32, (V, d)),
            "C": (f32, (n, d)),
            "out.weight": (f32, (N, d)),
            "out.bias": (f32, (N,)),
            "out.tree_children": (np.dtype(np.int64), (N, 2)),
        }

    @classmethod
    def from_state(cls, config: LBLConfig, tree: WordTree, state: dict[str, np.ndarray]) -> "NumpyLBL":
        """The model of ``state`` (arrays named as :meth:`layout`; a torch ``state_dict`` converted
        with ``.numpy()`` too). A state of another tree is refused (ValueError), as the torch layer does."""
        why = unsupported(config)
        if why:
            raise ValueError(why)
        children = np.asarray(state["out.tree_children"])
        if children.shape != tree.children.shape or not np.array_equal(children, tree.children):
            raise ValueError("out.tree_children: the weights are of another word tree than this model's")
        R, C, Q, qb = (np.ascontiguousarray(state[k], np.float32) for k in ("R.weight", "C", "out.weight", "out.bias"))
        prefer_huge_pages(R, Q)  # (rows read at random: fewer TLB misses on a large model)
        arrays = tree_arrays(tree)
        return cls(config, tree, R, C, Q, qb, word_paths(tree), arrays, ScratchPool.of(arrays))

    def num_parameters(self) -> int:
        """The torch model's ``num_parameters()``: every weight of R, C and the tree layer."""
        return sum(a.size for a in (self.R, self.C, self.Q, self.qb))

    @property
    def weights(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, WordPaths]:
        """The scorer's arguments (:func:`score_stream`)."""
        return self.R, self.C, self.Q, self.qb, self.paths

    def token_log_probs(self, stream: np.ndarray, pad: int, threads: int | None = None) -> np.ndarray:
        """(N,) float64 natural-log probability of every token of ``stream`` given its context:
        ``hlbl.evaluate.token_log_probs`` of the torch model, the same numbers."""
        set_numba_threads(threads)
        stream = np.asarray(check_stream(stream, pad, self.config.vocab_size))
        return score_stream(self.weights, stream, pad)

    def context_vectors(self, context: np.ndarray) -> np.ndarray:
        """r_hat (B, d) float32 for ``context`` (B, n) word ids, oldest first: ``LBL.context_vector``'s
        order: the products ``C_i * R[w_i]`` rounded to float32, summed in context order."""
        context = np.asarray(context, dtype=np.int64)
        B, n = context.shape
        if n != self.config.context:
            raise ValueError(f"context must have shape (B, {self.config.context}), got {context.shape}")
        V = self.config.vocab_size
        if context.size and (context.min() < 0 or context.max() >= V):
            raise ValueError(f"word ids must be in 0..{V - 1}")
        if n == 0:
            return np.zeros((B, self.config.dim), np.float32)
        h = self.R[context[:, 0]] * self.C[0]
        for i in range(1, n):
            h += self.R[context[:, i]] * self.C[i]
        return h

    def topk(self, context: np.ndarray, k: int, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The k most probable next words of each context (B, n): (log-probs (B, k) float32 as the
        torch model returns them, word ids (B, k) int64), best first, ties by lower word id; k > V
        gives all V words. The exact tree search of ``LBL.topk`` on the CPU."""
        k = check_k(k, self.tree.num_words)
        H = self.context_vectors(context).astype(np.float64)
        values, ids, _ = search_rows(H, NodeWeights(self.Q, self.qb), self.arrays, k, threads, pool=self.pool)
        return values.astype(np.float32), ids

    def log_prob(self, context: np.ndarray) -> np.ndarray:
        """(B, V) float32 log-probabilities of every next word after each context (B, n): the
        node scores by one matrix product, the sweep down the tree by the kernel the torch
        layer's CPU path runs (:func:`hlbl.tree_kernels.descend`). O(B N d)."""
        h = self.context_vectors(context)
        S = h @ self.Q.T + self.qb  # (B, N) float32
        L = -np.logaddexp(np.float32(0), -S)  # log sigmoid(S), exact in the far tails too
        multi = bool(self.tree.word_leaves.shape[1] > 1)
        out = np.full((len(h), self.tree.num_words), -np.inf, np.float32)
        descend(L, S, self.tree.children, multi, 0, len(h), out)
        return out

    def generate(
        self,
        prompt: list[int],
        num_tokens: int,
        pad: int,
        uniforms: TorchUniforms,
        temperature: float = 1.0,
        per_node_temperature: bool = False,
    ) -> list[int]:
        """``num_tokens`` words sampled after ``prompt`` (ids), contexts padded with ``pad``:
        ``LBL.generate`` of the torch model with ``torch.Generator().manual_seed(s)`` given
        ``TorchUniforms(s)``. T == 1 or ``per_node_temperature``: a walk down the tree (O(depth d)
        a word); otherwise the exact ``p(w)^(1/T) / Z`` from the full distribution (O(N d))."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a whole number >= 0, got {num_tokens!r}")
        check_temperature(temperature)
        n = self.config.context
        ids = [pad] * n + list(prompt)
        nodes = NodeWeights(self.Q, self.qb)
        for _ in range(num_tokens):
            ctx = np.asarray([ids[len(ids) - n :]], dtype=np.int64).reshape(1, n)
            if temperature == 1.0 or per_node_temperature:
                U = uniforms.random((1, walk_depth(self.arrays)))
                w = walk(self.arrays, nodes, self.context_vectors(ctx), U, temperature)[0]
            else:
                w = inverse_cdf(self.log_prob(ctx), uniforms.random((1,)), temperature)[0]
            ids.append(int(w))
        return ids[n + len(prompt) :]


def sample_words(model, prompt: list[int], tokens: int, pad: int, seed: int, temperature: float, per_node: bool):
    """``model.generate`` under ``seed`` for a :class:`NumpyLBL` or a torch model: the numpy model
    draws the uniforms a seeded ``torch.Generator`` would (:class:`~hlbl.sampling.TorchUniforms`),
    so both give the same words."""
    if isinstance(model, NumpyLBL):
        return model.generate(prompt, tokens, pad, TorchUniforms(seed), temperature, per_node)
    import torch

    return model.generate(prompt, tokens, pad, torch.Generator().manual_seed(seed), temperature, per_node)


__all__ = [
    "NumpyLBL",
    "check_stream",
    "sample_words",
    "score_stream",
    "set_numba_threads",
    "unsupported",
    "word_paths",
]

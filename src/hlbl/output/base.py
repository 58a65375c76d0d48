"""The interface every output layer implements, and the helpers the layers share.

Every layer subclasses :class:`OutputLayer`, one narrow interface (as fastText's ``Loss`` classes
do), so the model, the training loop and inference never ask which one they hold:

What a layer implements:

* ``log_prob(input (B, d)) -> (B, V)``: the full distribution;
* ``target_log_prob(input (B, d), target (B,)) -> (B,)``: log P(target | input), without the
  full distribution where the layer can (O(depth) for the tree);
* ``init_unigram(counts)``: set biases so that with zero weights the layer predicts the training
  unigram distribution (the paper's appendix; the tree and flat layers; PyTorch's adaptive
  softmax has no biases and keeps its own initialisation).

What :class:`OutputLayer` derives from them (a layer overrides them where it knows better):

* ``forward(input, target) -> LayerOutput(output (B,), loss ())``: the targets'
  log-probabilities and their mean negative log-likelihood, in the spirit of
  ``torch.nn.AdaptiveLogSoftmaxWithLoss``;
* ``topk(input, k)`` and ``sample(input, generator, temperature, per_node)``: by default from
  ``log_prob``; the tree layer overrides both with exact searches that visit few nodes
  (:mod:`hlbl.search`, :mod:`hlbl.sampling`), and only it takes ``per_node`` (temperature applied at each node);
* ``reseed(seed)``: a no-op except for layers whose training loss samples
  (:mod:`hlbl.output.sampled`); ``start_epoch(seed, epoch)`` reseeds with :func:`noise_seed`.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch import nn


class LayerOutput(NamedTuple):
    # (B,) log P(target | input); exact for every layer in eval mode. In training mode a sampled
    # layer (nce, sampled) gives minus its per-example sampled loss here instead.
    output: torch.Tensor
    loss: torch.Tensor  # () mean training loss (the NLL, except for sampled layers in training mode)


def noise_seed(seed: int, epoch: int) -> int:
    """The noise generator's seed for ``epoch`` of a run seeded ``seed`` (a 63-bit integer),
    independent of the example order's stream (``epoch_order`` uses ``default_rng([seed, epoch])``)."""
    return int(np.random.SeedSequence([seed, epoch, 0x5A4D]).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)


def unigram_distribution(counts: Sequence[float], vocab_size: int) -> np.ndarray:
    """(V,) float64 probabilities from the training counts, for ``init_unigram``: every entry
    positive, so that every bias derived from them is finite."""
    # Zero counts (e.g. an unused <unk>) get half a count so every bias stays finite.
    c = np.asarray(counts, dtype=np.float64)
    if c.shape != (vocab_size,):
        raise ValueError(f"init_unigram needs one count per word: {vocab_size} words, counts of shape {c.shape}")
    if not np.isfinite(c).all() or (c < 0).any():
        raise ValueError("init_unigram needs finite, non-negative counts")
    c = np.where(c > 0, c, 0.5)
    c = c / c.max()  # the sum of huge counts (1e308 each) would overflow
    # Counts 300 orders of magnitude apart would underflow to p = 0 (a -inf bias).
    return np.maximum(c / c.sum(), np.finfo(np.float64).tiny)


def gaussian_weights(shape: tuple[int, int], std: float, generator: torch.Generator | None) -> torch.Tensor:
    """N(0, std^2) weights drawn in place (no second V x d temporary); zeros, without drawing, for
    std 0 (the LBL draws its own with its generator)."""
    w = torch.zeros(shape)
    return w.normal_(0.0, std, generator=generator) if std > 0 else w


def check_targets(target: torch.Tensor, vocab_size: int) -> None:
    """Word ids must be int32/int64 in 0..V-1: a negative id would silently index from the end (no
    padding id), and a uint8 or bool tensor would index as a mask."""
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"target word ids must be an int64 or int32 tensor, not {target.dtype}")
    if target.device.type == "cpu" and not torch.compiler.is_compiling():
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= vocab_size):
            raise ValueError(
                f"target word ids must be in 0..{vocab_size - 1}; got {int(target.min())}..{int(target.max())}"
            )
    else:  # no host synchronisation (a GPU step, a compiled graph): the check fails asynchronously
        torch._assert_async(((target >= 0) & (target < vocab_size)).all(), "target word ids out of range")


def same_ids(saved, own: torch.Tensor) -> bool:
    """Whether ``saved`` (a state_dict entry of integer structure, e.g. a tree's children) is the
    integer tensor ``own``: same shape, not floating point, equal values (on any device)."""
    return (
        torch.is_tensor(saved)
        and saved.shape == own.shape
        and not saved.is_floating_point()
        and torch.equal(saved.detach().to("cpu", torch.int64), own.detach().cpu())
    )


def load_prefixed(layer: nn.Module, state_dict, prefix: str, dtype: torch.dtype) -> nn.Module:
    """``layer`` (built on the state's structure) in ``dtype`` with the entries of ``state_dict``
    under ``prefix`` loaded strictly: what a layer's ``from_state_dict`` ends with."""
    layer.to(dtype=dtype)
    layer.load_state_dict({k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)})
    return layer


class OutputLayer(nn.Module):
    """The narrow interface of every output layer (as fastText's ``Loss``): a layer gives
    ``log_prob``, ``target_log_prob`` and ``init_unigram``; ``forward``, ``topk`` and ``sample``
    follow from them here, and a layer overrides them where it knows a faster exact way (the
    tree's best-first top-k and ancestral sampling)."""

    vocab_size: int

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        """(B, d) -> (B, V) log-probabilities of every word."""
        raise NotImplementedError

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(B, d), (B,) -> (B,) log P(target | input)."""
        raise NotImplementedError

    def init_unigram(self, counts: Sequence[float]) -> None:
        raise NotImplementedError

    def reseed(self, seed: int) -> None:
        """Restart the generator of a layer whose training loss samples (:meth:`start_epoch` does
        this every epoch); layers with a deterministic loss have none."""

    def start_epoch(self, seed: int, epoch: int) -> None:
        """Called by the training loop before epoch ``epoch`` of a run seeded ``seed``."""
        self.reseed(noise_seed(seed, epoch))

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> LayerOutput:
        """``(output, loss)``: log P(target | input), (B,) (or () for one vector where the layer
        takes one), and its mean NLL."""
        lp = self.target_log_prob(input, target)
        return LayerOutput(lp, -lp.mean())

    # search and sampling import numba: loaded on the first top-k or sample, not with every layer

    @torch.no_grad()
    def topk(self, input: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k by sorting the full distribution (ties: lower word id first; k > V gives all V)."""
        from ..search import full_topk

        return full_topk(self.log_prob(input), k)

    @torch.no_grad()
    def sample(
        self,
        input: torch.Tensor,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        per_node: bool = False,
    ) -> torch.Tensor:
        """(B,) words from ``softmax(log_prob / T)``; ``per_node`` needs a tree."""
        from ..sampling import sample_from_log_prob

        if per_node:
            raise ValueError(f"per-node temperature needs a tree output layer, not {type(self).__name__}")
        return sample_from_log_prob(self.log_prob(input), generator, temperature)

"""The log-bilinear language model with a swappable output layer.

    context words w_1 .. w_{n-1}  (oldest first)
          |  R: (V, d) word feature vectors
          v
    r_hat = sum_i C_i r_{w_i}       C_i: (d,) diagonal (default) or (d, d) full
          |
          v
    output layer (tree softmax = HLBL, flat softmax = LBL, ...) -> log P(w_n | context)

Context words use the vectors R; predicted words are represented only inside the output layer
(tree node vectors, or the flat layer's output vectors).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from .config import LBLConfig
from .output import LayerOutput, make_output_layer
from .classes import WordClasses
from .tree import WordTree


class LBL(nn.Module):
    """The model of :class:`~hlbl.config.LBLConfig` (re-exported here) over ``tree`` (tree output) or word classes."""

    def __init__(
        self,
        config: LBLConfig,
        tree: WordTree | WordClasses | None = None,
        generator: torch.Generator | None = None,
        *,
        init: bool = True,
    ):
        """``tree``: the output layer's structure (a WordTree for ``tree`` output, WordClasses for
        ``classes``, None otherwise). ``init=False`` leaves the weights unset, for a caller that loads them next (a checkpoint:
        drawing V x d Gaussians first costs seconds at V = 1M)."""
        super().__init__()
        self.config = config
        V, d, n = config.vocab_size, config.dim, config.context
        self.R = nn.Embedding(V, d, _weight=torch.zeros(V, d))  # initialised below, with our generator
        # C_i start at the identity so that r_hat begins as the plain sum of context vectors;
        # small Gaussian noise breaks the symmetry between positions.
        shape = (n, d, d) if config.full_context else (n, d)
        self.C = nn.Parameter(torch.zeros(shape))
        self.out = make_output_layer(
            config.output,
            d,
            V,
            tree,
            samples=config.samples,
            noise_power=config.noise_power,
            noise_share=config.noise_share,
            head=config.head,
        )
        # (V,) multipliers of each context word vector's gradient (set_word_rates), or None; derived
        # from the training counts by the run, so not saved with the weights.
        self.register_buffer("word_rate", None, persistent=False)
        if not init:
            return
        with torch.no_grad():
            for p in (self.R.weight, self.C, *[p for name, p in self.out.named_parameters() if "bias" not in name]):
                p.normal_(0.0, config.init_std, generator=generator)
            if config.full_context:
                self.C += torch.eye(d)
            else:
                self.C += 1.0

    @property
    def tree(self) -> WordTree | None:
        """The output layer's word tree (None for flat and adaptive output): one copy, the layer's."""
        return getattr(self.out, "tree", None)

    @property
    def structure(self) -> WordTree | WordClasses | None:
        """What the output layer is built on and a run saves as tree.json: its word tree, its word
        classes (``classes`` output), the whole-vocabulary tree its tail was cut from (``hybrid``), or None."""
        tree = self.tree
        if tree is None:
            tree = getattr(self.out, "source_tree", None)
        return tree if tree is not None else getattr(self.out, "classes", None)

    def init_unigram(self, counts: Sequence[float]) -> None:
        self.out.init_unigram(counts)

    def set_word_rates(self, rates: np.ndarray | torch.Tensor | None) -> None:
        """From now on, multiply word w's context-vector gradient by ``rates[w]`` ((V,) positive;
        :func:`hlbl.optim.word_rates`), with either engine; None: the plain gradient."""
        if rates is not None:
            rates = torch.as_tensor(rates, dtype=torch.float32, device=self.R.weight.device)
            if rates.shape != (self.config.vocab_size,) or not bool((rates > 0).all() & rates.isfinite().all()):
                raise ValueError(f"word rates must be {self.config.vocab_size} positive finite numbers")
        self.word_rate = rates

    def context_vector(self, context: torch.Tensor) -> torch.Tensor:
        """r_hat (B, d) for ``context`` (B, n-1) word ids, oldest first.

        Diagonal C: the products ``C_i * r_i`` summed in context order, one add at a time, as the
        numba kernels (scorer, feature sums) and :class:`~hlbl.numpy_model.NumpyLBL` sum them:
        ``(r * C).sum(1)`` reduces in an order that depends on the shape (its float32 results
        differ in the last bit for, e.g., n = 5 and d = 50)."""
        r = self.R(context)  # (B, n, d)
        if self.word_rate is not None and r.requires_grad:
            r = _ScaleGrad.apply(r, self.word_rate[context].unsqueeze(-1))
        if self.config.full_context:
            return torch.einsum("bnd,ned->be", r, self.C)
        if r.shape[1] == 0:
            return r.sum(1)  # (B, d) zeros
        h = r[:, 0] * self.C[0]
        for i in range(1, r.shape[1]):
            h = h + r[:, i] * self.C[i]
        return h

    def forward(self, context: torch.Tensor, target: torch.Tensor) -> LayerOutput:
        """Per-example log P(target | context) (B,) and the mean NLL."""
        return self.out(self.context_vector(context), target)

    def log_prob(self, context: torch.Tensor) -> torch.Tensor:
        """(B, V) log-probabilities of every next word."""
        return self.out.log_prob(self.context_vector(context))

    def param_groups(self, weight_decay_words: float, weight_decay_other: float) -> list[dict]:
        """Optimiser groups after Mnih & Hinton 2007: word vectors, other weights, biases (none)."""
        words = [self.R.weight]
        biases = [p for n, p in self.named_parameters() if n.endswith("bias")]
        ids = {id(p) for p in words + biases}
        other = [p for p in self.parameters() if id(p) not in ids]
        return [
            {"params": words, "weight_decay": weight_decay_words, "name": "words"},
            {"params": other, "weight_decay": weight_decay_other, "name": "other"},
            {"params": biases, "weight_decay": 0.0, "name": "biases"},
        ]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- inference ------------------------------------------------------------------------
    # The output layer decides how (OutputLayer.topk / .sample): exact tree search and
    # ancestral sampling on a tree (hlbl.search, hlbl.sampling), the full distribution otherwise.

    @torch.no_grad()
    def topk(self, context: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k most probable next words: (log-probs (B, k), word ids (B, k)), best first;
        ties rank the lower word id first; k > V gives all V words."""
        return self.out.topk(self.context_vector(context), k)

    @torch.no_grad()
    def generate(
        self,
        prompt: Sequence[int],
        num_tokens: int,
        pad: int,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        per_node_temperature: bool = False,
    ) -> list[int]:
        """Sample ``num_tokens`` words after ``prompt`` (word ids); contexts padded with ``pad``.

        ``temperature`` T != 1 samples from ``p(w)^(1/T) / Z`` (O(V d) per token), or with
        ``per_node_temperature`` applies T at every tree decision (O(depth d), a different
        distribution); see :mod:`hlbl.sampling`.
        """
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a whole number >= 0, got {num_tokens!r}")
        n = self.config.context
        device = self.R.weight.device
        ids = [pad] * n + list(prompt)
        out = []
        for _ in range(num_tokens):
            ctx = torch.tensor([ids[-n:]], device=device)
            w = int(self.out.sample(self.context_vector(ctx), generator, temperature, per_node_temperature)[0])
            ids.append(w)
            out.append(w)
        return out


class _ScaleGrad(torch.autograd.Function):
    """The identity forward; backward multiplies the gradient by ``scale`` (broadcast to the input):
    each gathered context row's gradient by its word's rate, so that R's summed gradient is
    rate[w] times the plain one, as the fast engine's ``_update_words`` scales it."""

    @staticmethod
    def forward(ctx, input, scale):
        ctx.save_for_backward(scale)
        return input.view_as(input)

    @staticmethod
    def backward(ctx, grad):
        (scale,) = ctx.saved_tensors
        return grad * scale, None

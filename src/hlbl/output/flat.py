"""Output layers without a tree: the LBL's full softmax and PyTorch's adaptive softmax (a baseline)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .base import OutputLayer, check_targets, gaussian_weights, unigram_distribution


class FlatSoftmax(OutputLayer):
    """The non-hierarchical LBL output: ``P(w | h) = exp(h . q_w + b_w) / Z``."""

    def __init__(
        self, in_features: int, vocab_size: int, init_std: float = 0.0, generator: torch.Generator | None = None
    ):
        super().__init__()
        self.in_features = in_features
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(gaussian_weights((vocab_size, in_features), init_std, generator))
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def init_unigram(self, counts: Sequence[float]) -> None:
        with torch.no_grad():
            self.bias.copy_(torch.from_numpy(np.log(unigram_distribution(counts, self.vocab_size))))

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(F.linear(input, self.weight, self.bias), dim=-1)

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        check_targets(target, self.vocab_size)  # cross_entropy would skip -100 (its ignore_index)
        logits = F.linear(input, self.weight, self.bias)
        return -F.cross_entropy(logits, target.long(), reduction="none")  # cross_entropy takes int64 only


class AdaptiveSoftmax(OutputLayer):
    """PyTorch's ``nn.AdaptiveLogSoftmaxWithLoss`` behind this module's interface (a baseline).

    Word ids must be sorted by decreasing frequency (our vocabularies are). Cutoffs default to
    roughly 2%, 10% and 40% of the vocabulary.
    """

    def __init__(self, in_features: int, vocab_size: int, cutoffs: Sequence[int] | None = None):
        super().__init__()
        self.in_features = in_features
        self.vocab_size = vocab_size
        if cutoffs is None:
            if vocab_size < 3:  # no cluster boundary fits; PyTorch's own error would name no reason
                raise ValueError(f"the adaptive softmax needs at least 3 words, got {vocab_size}")
            cutoffs = sorted(
                {c for c in (vocab_size // 50, vocab_size // 10, vocab_size * 2 // 5) if 0 < c < vocab_size}
            )
        # PyTorch's layer as it is (div_value 4: tail cluster i projects to d // 4^(i+1)
        # dimensions, 1 for the last at d = 100). Below d = 64 that last projection is empty and
        # PyTorch warns; changing div_value would change saved shapes, so the baseline stays as is.
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(in_features, vocab_size, list(cutoffs), div_value=4.0)

    def init_unigram(self, counts: Sequence[float]) -> None:
        """Checks ``counts`` and changes nothing: PyTorch's layer has no biases (``head_bias=False``,
        bias-free tail projections), so it keeps PyTorch's initialisation. Adding a head bias would
        only reach the shortlist and the cluster priors, and would change the baseline's shapes."""
        unigram_distribution(counts, self.vocab_size)

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        return self.asm.log_prob(input)

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.asm(input, target).output

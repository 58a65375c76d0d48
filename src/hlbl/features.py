"""Word features of any model, and a learned word tree from them: the paper's bootstrap for an
LSTM, a Transformer or any network that ends in a hidden vector (``docs/layer.md``).

A tree softmax predicts well when words that occur in similar contexts share long code prefixes.
Mnih & Hinton (2008, Section 5) represent each word by the mean of the model's hidden vector over
the positions where that word is the next word, then split the words top-down by 2-component
Gaussian mixtures (:mod:`hlbl.treebuild`). Nothing in that needs an LBL: any model gives its
hidden vectors ``h`` (B, d) and the words they were trained to predict. Two sources:

* :func:`hidden_features`: the mean ``h`` that predicts each word, over the batches you give (a
  pass over the training data with the model in eval mode), accumulated in float64 on the
  hidden vectors' device (:class:`WordFeatures` does the same step by step, e.g. inside a
  training loop);
* :func:`embedding_features`: the rows of a trained output embedding (V, d), e.g. a full
  softmax's ``decoder.weight``: the vector each word is scored by.

Then :func:`learn_tree` (policies ``balanced``, ``adaptive``, ``adaptive:EPS``, ``copies`` trees
joined) gives a :class:`~hlbl.tree.WordTree` for :class:`~hlbl.output.TreeSoftmax`.

The bootstrap recipe: train the model briefly with any output layer (a Huffman tree softmax is
the cheapest), take its features, learn the tree, and train a fresh model with a tree softmax on
it (``examples/lstm_lm``).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch

from .errors import TreeError
from .tree import WordTree
from .treebuild import BuildReport, build_tree_from_features


class WordFeatures:
    """Running sums of hidden vectors per predicted word: :meth:`add` batches, :meth:`result`.

    Sums are float64 (V, d) on the device of the first batch (or ``device``), so a GPU training
    loop can add its batches without copying them to the CPU.
    """

    def __init__(self, vocab_size: int, device: str | torch.device | None = None):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
            raise ValueError(f"vocab_size must be a whole number >= 2, got {vocab_size!r}")
        self.vocab_size = int(vocab_size)
        self.device = None if device is None else torch.device(device)
        self.sums: torch.Tensor | None = None  # (V, d) float64
        self.counts: torch.Tensor | None = None  # (V,) int64

    @torch.no_grad()
    def add(self, hidden: torch.Tensor, targets: torch.Tensor) -> None:
        """Add hidden vectors (B, d) (or (..., d), e.g. (T, B, d)) and the words they predict (B,)
        (or the matching leading shape)."""
        if not torch.is_tensor(hidden) or not torch.is_tensor(targets):
            raise TypeError("hidden and targets must be tensors: hidden vectors (B, d), word ids (B,)")
        if hidden.dim() < 2 or tuple(hidden.shape[:-1]) != tuple(targets.shape):
            raise ValueError(
                f"hidden must have shape (B, d) with targets (B,) (or matching leading dimensions), got hidden "
                f"{tuple(hidden.shape)} and targets {tuple(targets.shape)}"
            )
        if not hidden.is_floating_point() or targets.is_floating_point() or targets.dtype == torch.bool:
            raise TypeError(f"hidden must be floating point and targets word ids, got {hidden.dtype} / {targets.dtype}")
        h, t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        if self.sums is None:
            dev = self.device if self.device is not None else h.device
            self.sums = torch.zeros(self.vocab_size, h.shape[1], dtype=torch.float64, device=dev)
            self.counts = torch.zeros(self.vocab_size, dtype=torch.int64, device=dev)
        elif h.shape[1] != self.sums.shape[1]:
            raise ValueError(f"hidden vectors have {h.shape[1]} features, earlier batches {self.sums.shape[1]}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.vocab_size):
            raise ValueError(f"targets must be word ids in 0..{self.vocab_size - 1}")
        t = t.to(self.sums.device, torch.int64)
        self.sums.index_add_(0, t, h.to(self.sums.device, torch.float64))
        self.counts.index_add_(0, t, torch.ones_like(t))

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(X (V, d) float64, counts (V,) int64): each word's mean hidden vector; a word never
        predicted gets the mean over all positions (as :func:`hlbl.treebuild.word_features`)."""
        if self.counts is None or int(self.counts.sum()) == 0:
            raise TreeError("word features need at least one (hidden, target) batch")
        sums, n = self.sums.cpu().numpy(), self.counts.cpu().numpy()
        X = np.empty_like(sums)
        seen = n > 0
        X[seen] = sums[seen] / n[seen, None]
        X[~seen] = sums.sum(0) / n.sum()
        return X, n


def hidden_features(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(X (V, d) float64, counts (V,)): the mean hidden vector that predicts each word, over
    ``batches`` of ``(hidden (B, d), targets (B,))`` from any model (see :class:`WordFeatures`).

    Run the model in eval mode (no dropout) and without gradients, e.g.::

        def pairs():
            with torch.no_grad():
                for x, y in loader:
                    yield model.hidden(x), y      # (B, d), (B,)
        X, counts = hlbl.hidden_features(pairs(), vocab_size)
    """
    acc = WordFeatures(vocab_size)
    for item in batches:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError("hidden_features takes an iterable of (hidden (B, d), targets (B,)) pairs")
        acc.add(*item)
    return acc.result()


def embedding_features(weight: torch.Tensor | np.ndarray) -> np.ndarray:
    """(V, d) float64 features from the rows of a trained output embedding (one vector per word,
    e.g. ``nn.Linear(d, V).weight``), on any device."""
    X = weight.detach().to("cpu", torch.float64).numpy() if torch.is_tensor(weight) else np.asarray(weight, float)
    if X.ndim != 2 or len(X) < 2:
        raise TreeError(f"an output embedding has one row per word, (V, d) with V >= 2; got shape {X.shape}")
    return X


def learn_tree(
    features: torch.Tensor | np.ndarray,
    policy: str = "adaptive",
    copies: int = 1,
    seed: int = 0,
    weights: Sequence[float] | None = None,
    report: BuildReport | None = None,
) -> WordTree:
    """A word tree over ``len(features)`` words from their (V, d) features (a tensor on any
    device or an array): top-down 2-Gaussian splits by ``policy`` (``balanced``, ``adaptive``,
    ``adaptive:EPS``: words within EPS of an even split get a code on both sides), ``copies``
    trees from different seeds joined under new top nodes. Same inputs and seed, same tree.
    """
    X = embedding_features(features)
    return build_tree_from_features(X, policy, seed=seed, copies=copies, weights=weights, report=report)


__all__ = ["WordFeatures", "hidden_features", "embedding_features", "learn_tree"]

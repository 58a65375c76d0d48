"""Output layers: from an input vector ``h`` (B, d) to log-probabilities over V words.

Every layer subclasses :class:`~hlbl.output.base.OutputLayer`, one narrow interface (its module
says what a layer implements and what the interface derives from it), so the model, the training
loop and inference never ask which one they hold.

The kinds: ``tree`` (hierarchical softmax, the HLBL; :mod:`hlbl.output.tree`), ``hybrid`` (an
exact softmax over the most frequent words and a tree over the rest, :mod:`hlbl.output.hybrid`), ``classes`` (a
two-level tree with a softmax at each level, :mod:`hlbl.output.classes`), ``flat`` (the LBL's full
softmax) and ``adaptive`` (PyTorch's adaptive softmax; both :mod:`hlbl.output.flat`), and ``nce``
/ ``sampled`` (:mod:`hlbl.output.sampled`): the flat layer's parameters trained by
noise-contrastive estimation or a sampled softmax on k noise words. **Only their training loss
samples**: their ``log_prob``, ``target_log_prob``, ``topk``, ``sample`` and eval-mode ``forward``
are the exact, fully normalised softmax over all V words (they have no tree, so top-k sorts the
full distribution); in training mode their ``forward`` returns the sampled loss, with ``output`` =
minus the per-example loss (not a log-probability).

:func:`make_output_layer` is the one place that chooses a layer.

Example (the tree softmax on any input vectors)::

    from hlbl.tree import huffman_tree
    from hlbl.output import TreeSoftmax
    tree = huffman_tree(word_counts)                  # or random_tree(V), WordTree.load(...)
    layer = TreeSoftmax(512, tree)                    # 512 = size of your hidden vectors
    layer.init_unigram(word_counts)
    out = layer(hidden, targets)                      # hidden (B, 512), targets (B,)
    out.loss.backward()                               # mean NLL; out.output = log P(target)
    logp = layer.log_prob(hidden)                     # (B, V), sums to 1 in probability
"""

from __future__ import annotations

import torch

from ..classes import WordClasses
from ..config import OUTPUT_KINDS, SAMPLED_KINDS, takes_structure, takes_tree
from ..tree import WordTree
from .base import LayerOutput, OutputLayer, noise_seed
from .classes import ClassSoftmax
from .flat import AdaptiveSoftmax, FlatSoftmax
from .hybrid import HybridSoftmax, hybrid_split, restrict_tree
from .sampled import NCEOutput, SampledOutput, SampledSoftmax
from .tree import TreeSoftmax

__all__ = [
    "OUTPUT_KINDS",
    "SAMPLED_KINDS",
    "LayerOutput",
    "OutputLayer",
    "TreeSoftmax",
    "HybridSoftmax",
    "hybrid_split",
    "restrict_tree",
    "ClassSoftmax",
    "FlatSoftmax",
    "AdaptiveSoftmax",
    "SampledOutput",
    "NCEOutput",
    "SampledSoftmax",
    "noise_seed",
    "takes_tree",
    "takes_structure",
    "make_output_layer",
]


def make_output_layer(
    kind: str,
    in_features: int,
    vocab_size: int,
    tree=None,
    init_std: float = 0.0,
    generator: torch.Generator | None = None,
    samples: int = 25,
    noise_power: float = 1.0,
    noise_share: int = 25,
    head: int = 2000,
) -> OutputLayer:
    """The one place that maps an output kind to a layer. ``init_std`` > 0 draws the tree, flat
    and sampled layers' weights from N(0, init_std^2) with ``generator`` (0: zeros); the adaptive
    softmax keeps PyTorch's own initialisation (from torch's global generator). ``samples`` (k),
    ``noise_power`` and ``noise_share`` apply to the ``nce`` and ``sampled`` kinds only
    (:mod:`hlbl.output.sampled`). ``tree``: a :class:`~hlbl.tree.WordTree` for ``tree``, a
    :class:`~hlbl.classes.WordClasses` for ``classes``, None for the others. ``hybrid``: words
    ``0 .. head-1`` (the most frequent, in a vocabulary listed most frequent first) in an exact
    softmax, ``tree`` restricted to the other words under its tail entry
    (:meth:`HybridSoftmax.from_tree`)."""
    if kind == "classes":
        if not isinstance(tree, WordClasses):
            raise ValueError(
                "the classes output layer needs WordClasses (hlbl.classes: frequency_classes, kmeans_classes)"
            )
        if tree.num_words != vocab_size:
            raise ValueError(f"word classes have {tree.num_words} words, vocabulary {vocab_size}")
        return ClassSoftmax(in_features, tree, init_std, generator)
    if takes_tree(kind):
        if not isinstance(tree, WordTree):
            raise ValueError(f"the {kind} output layer needs a WordTree")
        if tree.num_words != vocab_size:
            raise ValueError(f"tree has {tree.num_words} words, vocabulary {vocab_size}")
        if kind == "hybrid":
            return HybridSoftmax.from_tree(in_features, tree, head, init_std, generator)
        return TreeSoftmax(in_features, tree, init_std, generator)
    if tree is not None and kind in OUTPUT_KINDS:  # it would be saved beside a model that ignores it
        raise ValueError(f"the {kind} output layer takes no tree")
    if kind == "flat":
        return FlatSoftmax(in_features, vocab_size, init_std, generator)
    if kind == "adaptive":
        return AdaptiveSoftmax(in_features, vocab_size)
    if kind in SAMPLED_KINDS:
        cls = NCEOutput if kind == "nce" else SampledSoftmax
        return cls(in_features, vocab_size, samples, noise_power, init_std, generator, noise_share=noise_share)
    raise ValueError(f"unknown output layer {kind!r}; choose from {', '.join(OUTPUT_KINDS)}")

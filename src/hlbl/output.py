"""Output layers: from an input vector ``h`` (B, d) to log-probabilities over V words.

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
* ``reseed(seed)``: a no-op except for layers whose training loss samples (below).

The kinds: ``tree`` (hierarchical softmax, the HLBL), ``classes`` (a two-level tree with a
softmax at each level, :mod:`hlbl.class_output`), ``flat`` (the LBL's full softmax),
``adaptive`` (PyTorch's adaptive softmax), and ``nce`` / ``sampled`` (:mod:`hlbl.sampled_output`):
the flat layer's parameters trained by noise-contrastive estimation or a sampled softmax on k
noise words. **Only their training loss samples**: their ``log_prob``, ``target_log_prob``,
``topk``, ``sample`` and eval-mode ``forward`` are the exact, fully normalised softmax over all V
words (they have no tree, so top-k sorts the full distribution); in training mode their
``forward`` returns the sampled loss, with ``output`` = minus the per-example loss (not a
log-probability).

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

from typing import NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .tree import WordTree

OUTPUT_KINDS = ("tree", "flat", "adaptive", "nce", "sampled", "classes")


def takes_tree(kind: str) -> bool:
    """Whether output layers of this kind are built on a :class:`~hlbl.tree.WordTree` (saved as tree.json)."""
    return kind == "tree"


def takes_structure(kind: str) -> bool:
    """Whether output layers of this kind are built on a structure saved as the run's tree.json: a
    :class:`~hlbl.tree.WordTree` (``tree``) or :class:`~hlbl.classes.WordClasses` (``classes``)."""
    return kind in ("tree", "classes")


class LayerOutput(NamedTuple):
    # (B,) log P(target | input); exact for every layer in eval mode. In training mode a sampled
    # layer (nce, sampled) gives minus its per-example sampled loss here instead.
    output: torch.Tensor
    loss: torch.Tensor  # () mean training loss (the NLL, except for sampled layers in training mode)


def _unigram(counts: Sequence[float], vocab_size: int) -> np.ndarray:
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


def _gaussian(shape: tuple[int, int], std: float, generator: torch.Generator | None) -> torch.Tensor:
    """N(0, std^2) weights drawn in place (no second V x d temporary); zeros, without drawing, for
    std 0 (the LBL draws its own with its generator)."""
    w = torch.zeros(shape)
    return w.normal_(0.0, std, generator=generator) if std > 0 else w


def _check_targets(target: torch.Tensor, vocab_size: int) -> None:
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
        """Restart the generator of a layer whose training loss samples (called by the training
        loop every epoch); layers with a deterministic loss have none."""

    def start_epoch(self, seed: int, epoch: int) -> None:
        """Called by the training loop before each epoch (placeholder until the output package lands)."""
        from .sampled_output import noise_seed

        self.reseed(noise_seed(seed, epoch))

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> LayerOutput:
        lp = self.target_log_prob(input, target)
        return LayerOutput(lp, -lp.mean())

    @torch.no_grad()
    def topk(self, input: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k by sorting the full distribution (ties: lower word id first; k > V gives all V)."""
        from .search import full_topk

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
        from .sampling import sample_from_log_prob

        if per_node:
            raise ValueError(f"per-node temperature needs a tree output layer, not {type(self).__name__}")
        return sample_from_log_prob(self.log_prob(input), generator, temperature)


class TreeSoftmax(OutputLayer):
    """Hierarchical softmax over a :class:`~hlbl.tree.WordTree`, exact for multi-code trees.

    Internal node j has a vector ``q_j`` (row j of ``weight``) and a bias ``b_j``;
    ``P(left at j | h) = sigmoid(h . q_j + b_j)``. A word's probability is the sum over its
    leaves of the product of the decisions along each path, computed as a log-sum-exp of path
    log-probabilities, so the gradient weights each path by its posterior share
    ``P(path | word, h)``. (Averaging the paths' log-losses, or picking one path, is a
    different objective.)

    Cost: ``forward`` is O(B K D d) for K codes of depth at most D; ``log_prob`` is O(B N d)
    for N internal nodes, one matrix product and one pass down the levels.
    """

    def __init__(
        self, in_features: int, tree: WordTree, init_std: float = 0.0, generator: torch.Generator | None = None
    ):
        super().__init__()
        self.in_features = in_features
        self._tree = tree
        self.vocab_size = tree.num_words
        self.weight = nn.Parameter(_gaussian((tree.num_nodes, in_features), init_std, generator))
        self.bias = nn.Parameter(torch.zeros(tree.num_nodes))
        # Buffers are derived from the tree; they are rebuilt, not saved (persistent=False).
        sign = (
            np.where(tree.path_bits == 1, np.float32(1.0), np.float32(-1.0)) * tree.path_mask
        )  # float32: no L x D float64 temporary
        self.register_buffer("path_nodes", torch.from_numpy(tree.path_nodes), persistent=False)
        self.register_buffer("path_sign", torch.from_numpy(sign), persistent=False)
        self.register_buffer("word_leaves", torch.from_numpy(tree.word_leaves), persistent=False)
        self.multi_code = tree.word_leaves.shape[1] > 1
        # Per level t: node range [start, end) and, among its 2n children (left, right of each
        # node, in order), the positions of internal children and of leaves. With breadth-first
        # ids the internal children are exactly the next level's nodes in order, and the leaves
        # come out in leaf id order.
        self._level_ranges = []
        for t, nodes in enumerate(tree.levels):
            kids = tree.children[nodes].reshape(-1)
            self._level_ranges.append((int(nodes[0]), int(nodes[-1]) + 1))
            self.register_buffer(f"_internal{t}", torch.from_numpy(np.flatnonzero(kids >= 0)), persistent=False)
            self.register_buffer(f"_leaves{t}", torch.from_numpy(np.flatnonzero(kids < 0)), persistent=False)

    @property
    def tree(self) -> WordTree:
        """The layer's tree, fixed at construction: its buffers and weight rows follow it (build a
        new layer for another tree)."""
        return self._tree

    def extra_repr(self) -> str:
        t = self._tree
        return (
            f"in_features={self.in_features}, vocab_size={self.vocab_size}, nodes={t.num_nodes}, "
            f"max_depth={t.path_nodes.shape[1]}, max_codes={t.word_leaves.shape[1]}"
        )

    def init_unigram(self, counts: Sequence[float]) -> None:
        """Biases so that zero weights give the unigram distribution.

        A word with k codes puts p(w)/k on each of its leaves; node j's bias is
        ``log(mass(left subtree) / mass(right subtree))``.
        """
        tree = self.tree
        p = _unigram(counts, self.vocab_size)
        leaf_mass = p[tree.leaf_word] / tree.codes_per_word[tree.leaf_word]
        mass = np.zeros(tree.num_nodes)
        child_mass = np.zeros((tree.num_nodes, 2))
        leaf_slots = np.flatnonzero(tree.children.reshape(-1) < 0)  # breadth-first leaf order
        child_mass.reshape(-1)[leaf_slots] = leaf_mass
        for nodes in reversed(tree.levels):  # bottom-up: children are finished before parents
            ch = tree.children[nodes]
            for s in (0, 1):
                m = ch[:, s] >= 0
                child_mass[nodes[m], s] = mass[ch[m, s]]
            mass[nodes] = child_mass[nodes].sum(1)
        with torch.no_grad():
            self.bias.copy_(torch.from_numpy(np.log(child_mass[:, 0] / child_mass[:, 1])))

    def path_log_probs(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(B, K) log-probability of each of the targets' paths; -inf where a word has fewer."""
        _check_targets(target, self.vocab_size)
        leaves = self.word_leaves[target]  # (B, K)
        nodes = self.path_nodes[leaves.clamp(min=0)]  # (B, K, D)
        sign = self.path_sign[leaves.clamp(min=0)]  # (B, K, D): +1 left, -1 right, 0 padding
        B, K, D = nodes.shape
        q = self.weight[nodes.reshape(B, K * D)]  # (B, KD, d)
        scores = torch.bmm(q, input.unsqueeze(2)).squeeze(2).view(B, K, D) + self.bias[nodes]
        real = sign != 0
        z = torch.where(real, sign * scores, 0.0)  # padding: 0 x an overflowed score would be NaN
        path = F.logsigmoid(z).masked_fill(~real, 0.0).sum(-1)  # (B, K)
        return path.masked_fill(leaves < 0, float("-inf"))

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        paths = self.path_log_probs(input, target)
        return torch.logsumexp(paths, dim=1) if self.multi_code else paths[:, 0]

    def leaf_log_prob(self, input: torch.Tensor) -> torch.Tensor:
        """(B, L) log-probability of every leaf, in leaf id order."""
        scores = input @ self.weight.t() + self.bias  # (B, N)
        B = input.shape[0]
        above = input.new_zeros(B, 1)  # log-prob of reaching each node of the current level
        leaves = []
        for t, (start, end) in enumerate(self._level_ranges):
            s = scores[:, start:end]
            kids = torch.stack((above + F.logsigmoid(s), above + F.logsigmoid(-s)), dim=2).reshape(B, 2 * (end - start))
            leaves.append(kids[:, getattr(self, f"_leaves{t}")])
            above = kids[:, getattr(self, f"_internal{t}")]
        return torch.cat(leaves, dim=1)

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        leaf_lp = self.leaf_log_prob(input)
        if not self.multi_code:
            return leaf_lp[:, self.word_leaves[:, 0]]
        wl = self.word_leaves
        lp = leaf_lp[:, wl.clamp(min=0)].masked_fill(wl < 0, float("-inf"))  # (B, V, K)
        return torch.logsumexp(lp, dim=2)

    @torch.no_grad()
    def topk(self, input: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k words by best-first search down the tree (see :mod:`hlbl.search`);
        k > V gives all V words, best first."""
        from .search import layer_tree_arrays, tree_topk

        res = tree_topk(self.tree, self.weight, self.bias, input, k, arrays=layer_tree_arrays(self))
        return res.values, res.indices

    @torch.no_grad()
    def sample(
        self,
        input: torch.Tensor,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        per_node: bool = False,
    ) -> torch.Tensor:
        """(B,) sampled words: ancestral O(depth) when ``temperature == 1`` or ``per_node``,
        else the exact tempered distribution via ``log_prob`` (O(N d))."""
        from .sampling import ancestral_sample, sample_from_log_prob
        from .search import layer_tree_arrays

        if temperature == 1.0 or per_node:
            return ancestral_sample(
                self.tree, self.weight, self.bias, input, generator, temperature, arrays=layer_tree_arrays(self)
            )
        return sample_from_log_prob(self.log_prob(input), generator, temperature)


class FlatSoftmax(OutputLayer):
    """The non-hierarchical LBL output: ``P(w | h) = exp(h . q_w + b_w) / Z``."""

    def __init__(
        self, in_features: int, vocab_size: int, init_std: float = 0.0, generator: torch.Generator | None = None
    ):
        super().__init__()
        self.in_features = in_features
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(_gaussian((vocab_size, in_features), init_std, generator))
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def init_unigram(self, counts: Sequence[float]) -> None:
        with torch.no_grad():
            self.bias.copy_(torch.from_numpy(np.log(_unigram(counts, self.vocab_size))))

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(F.linear(input, self.weight, self.bias), dim=-1)

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        _check_targets(target, self.vocab_size)  # cross_entropy would skip -100 (its ignore_index)
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
        _unigram(counts, self.vocab_size)

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        return self.asm.log_prob(input)

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.asm(input, target).output


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
) -> OutputLayer:
    """The one place that maps an output kind to a layer. ``init_std`` > 0 draws the tree, flat
    and sampled layers' weights from N(0, init_std^2) with ``generator`` (0: zeros); the adaptive
    softmax keeps PyTorch's own initialisation (from torch's global generator). ``samples`` (k),
    ``noise_power`` and ``noise_share`` apply to the ``nce`` and ``sampled`` kinds only
    (:mod:`hlbl.sampled_output`). ``tree``: a :class:`~hlbl.tree.WordTree` for ``tree``, a
    :class:`~hlbl.classes.WordClasses` for ``classes``, None for the others."""
    if kind == "classes":
        from .class_output import ClassSoftmax  # it imports this module
        from .classes import WordClasses

        if not isinstance(tree, WordClasses):
            raise ValueError("the classes output layer needs WordClasses (hlbl tree build --classes writes them)")
        if tree.num_words != vocab_size:
            raise ValueError(f"word classes have {tree.num_words} words, vocabulary {vocab_size}")
        return ClassSoftmax(in_features, tree, init_std, generator)
    if takes_tree(kind):
        if not isinstance(tree, WordTree):
            raise ValueError("the tree output layer needs a WordTree")
        if tree.num_words != vocab_size:
            raise ValueError(f"tree has {tree.num_words} words, vocabulary {vocab_size}")
        return TreeSoftmax(in_features, tree, init_std, generator)
    if tree is not None and kind in OUTPUT_KINDS:  # it would be saved beside a model that ignores it
        raise ValueError(f"the {kind} output layer takes no tree")
    if kind == "flat":
        return FlatSoftmax(in_features, vocab_size, init_std, generator)
    if kind == "adaptive":
        return AdaptiveSoftmax(in_features, vocab_size)
    if kind in ("nce", "sampled"):
        from .sampled_output import NCEOutput, SampledSoftmax  # it imports this module

        cls = NCEOutput if kind == "nce" else SampledSoftmax
        return cls(in_features, vocab_size, samples, noise_power, init_std, generator, noise_share=noise_share)
    raise ValueError(f"unknown output layer {kind!r}; choose from {', '.join(OUTPUT_KINDS)}")

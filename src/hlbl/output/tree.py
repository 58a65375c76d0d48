"""The tree softmax (hierarchical softmax, the HLBL's output layer) over a :class:`~hlbl.tree.WordTree`."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..tree import WordTree
from .base import OutputLayer, check_targets, gaussian_weights, unigram_distribution


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
        self.weight = nn.Parameter(gaussian_weights((tree.num_nodes, in_features), init_std, generator))
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
        p = unigram_distribution(counts, self.vocab_size)
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
        check_targets(target, self.vocab_size)
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

    # search and sampling import numba: loaded on the first top-k or sample, not with every layer

    @torch.no_grad()
    def topk(self, input: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k words by best-first search down the tree (see :mod:`hlbl.search`);
        k > V gives all V words, best first."""
        from ..search import layer_tree_arrays, tree_topk

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
        from ..sampling import ancestral_sample, sample_from_log_prob
        from ..search import layer_tree_arrays

        if temperature == 1.0 or per_node:
            return ancestral_sample(
                self.tree, self.weight, self.bias, input, generator, temperature, arrays=layer_tree_arrays(self)
            )
        return sample_from_log_prob(self.log_prob(input), generator, temperature)

"""The hybrid softmax: an exact softmax over the K most frequent words and one tail entry, and a
tree softmax (:class:`~hlbl.output.tree.TreeSoftmax`) under the tail entry over the other words.

Why: in a tree softmax every word, the most frequent included, is a product of about log2(V)
binary decisions, each a hyperplane through all the words below it; a converged model fits that
factorisation less well than the adaptive softmax, whose frequent words (most of the tokens) get
one exact softmax. The hybrid keeps that flat head and puts the rare words, where a softmax row
costs the most per token, under a tree (learned from the model's hidden states, or Huffman).

    P(w | h) = softmax(W h + b)[w]                          for a head word w
    P(w | h) = softmax(W h + b)[K] * P_tree(w | h)          for a tail word w

so rows sum to one exactly. The structure (the head's word ids and the tail's tree) travels in
the ``state_dict``: a state loads only into a layer of the same structure, and
:meth:`HybridSoftmax.from_state_dict` rebuilds the layer from the state alone.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..tree import WordTree, huffman_tree
from .base import (
    OutputLayer,
    check_targets,
    gaussian_weights,
    load_prefixed,
    same_ids,
    unigram_distribution,
)
from .tree import TreeSoftmax, describe_tree, tree_of


def hybrid_split(counts: Sequence[float], head: int) -> tuple[np.ndarray, np.ndarray]:
    """(head word ids (K,), tail word ids (V-K,)), each ascending: the ``head`` most frequent words
    by ``counts`` (ties to the lower id) and the rest. Tail word ``tail[i]`` is word i of the tail
    tree, so a tail tree is built on ``counts[tail]`` or on features ``X[tail]``."""
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 1 or not np.isfinite(c).all() or (c < 0).any():
        raise ValueError("a hybrid softmax needs one finite, non-negative count per word")
    _check_head(head, len(c))
    order = np.argsort(-c, kind="stable")  # descending counts, ties by lower id
    head_words = np.sort(order[:head])
    tail = np.ones(len(c), dtype=bool)
    tail[head_words] = False
    return head_words.astype(np.int64), np.flatnonzero(tail).astype(np.int64)


def _check_head(head, V: int) -> None:
    if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 1 <= head <= V - 2:
        raise ValueError(
            f"head must be a whole number from 1 to V - 2 = {V - 2} (the tail tree needs 2 words), got {head!r}"
        )


def restrict_tree(tree: WordTree, words: Sequence[int]) -> WordTree:
    """The tree over ``words`` only (its word i is ``words[i]``): every other word's leaves cut
    off, and each node left with one child replaced by that child. The order of the remaining
    decisions is kept, so a tree learned over a whole vocabulary serves as a tail tree."""
    words = np.asarray(words, dtype=np.int64)
    local = np.full(tree.num_words, -1, dtype=np.int64)
    local[words] = np.arange(len(words))
    ch = tree.children

    def visit(node: int):  # nested tuples of local word ids, or None where no kept word is below
        kids = []
        for c in ch[node]:
            if c < 0:
                w = local[-1 - c]
                kids.append(int(w) if w >= 0 else None)
            else:
                kids.append(visit(int(c)))
        kids = [k for k in kids if k is not None]
        return None if not kids else kids[0] if len(kids) == 1 else tuple(kids)

    nested = visit(0)
    if not isinstance(nested, tuple):
        raise ValueError(f"a tree over {len(words)} word(s) needs at least two of them")
    return WordTree.from_nested(nested, len(words))


class HybridSoftmax(OutputLayer):
    """A softmax over K head words and one tail entry; a tree softmax over the tail words under it.

    ``head_words``: the K head word ids (any order; kept ascending); the vocabulary is
    ``0 .. K + tail_tree.num_words - 1`` and the tail tree's word i is the i-th smallest id not in
    the head (:func:`hybrid_split` gives both lists from counts). :meth:`from_counts` builds the
    usual layer: the K most frequent words in the head, a Huffman tree over the rest unless a tail
    tree is given.

    Parameters: ``weight`` (K + 1, d) and ``bias`` (K + 1,), the head's rows (row K: the tail
    entry), and ``tail`` (a :class:`TreeSoftmax` over the tail words). Cost per example: O(K d)
    for the head plus O(depth d) for a tail target (``forward``); ``log_prob`` O((K + N) d).

    Inputs are ``(B, in_features)`` or one vector ``(in_features,)``, as for :class:`TreeSoftmax`.
    """

    def __init__(
        self,
        in_features: int,
        head_words: Sequence[int],
        tail_tree: WordTree,
        init_std: float = 0.0,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if not isinstance(tail_tree, WordTree):
            raise TypeError(f"HybridSoftmax needs a hlbl WordTree for its tail, not {type(tail_tree).__name__}")
        head = np.asarray(head_words)
        if head.ndim != 1 or (head.size and head.dtype.kind not in "iu"):
            raise ValueError("head_words must be a 1-D sequence of word ids")
        K = len(head)
        V = K + tail_tree.num_words
        head = np.sort(head.astype(np.int64))
        if K < 1 or head[0] < 0 or head[-1] >= V or (np.diff(head) == 0).any():
            raise ValueError(f"head_words must be at least one distinct word id in 0..{V - 1} (V = head + tail words)")
        self.tail = TreeSoftmax(in_features, tail_tree, init_std, generator)  # checks in_features
        self.in_features, self.vocab_size, self.head_size = self.tail.in_features, V, K
        self.weight = torch.nn.Parameter(gaussian_weights((K + 1, self.in_features), init_std, generator))
        self.bias = torch.nn.Parameter(torch.zeros(K + 1))
        # The structure, saved with the weights (with the tail's tree_children): a state loads only
        # into a layer of the same head and tail tree (_load_from_state_dict).
        self.register_buffer("head_words", torch.from_numpy(head))
        is_tail = np.ones(V, dtype=bool)
        is_tail[head] = False
        tail_words = np.flatnonzero(is_tail)
        # Derived, not saved. "Slots": the columns of cat(head's K log-probs, tail's V-K), head
        # words then tail words, each ascending by id. _slot (V,): word -> slot; _word (V,): slot -> word.
        word = np.concatenate([head, tail_words])
        slot = np.empty(V, dtype=np.int64)
        slot[word] = np.arange(V)
        self.register_buffer("_slot", torch.from_numpy(slot), persistent=False)
        self.register_buffer("_word", torch.from_numpy(word), persistent=False)
        # head = words 0..K-1 (a vocabulary listed most frequent first): slots are word ids
        self._head_first = bool((word == np.arange(V)).all())
        self.source_tree: WordTree | None = None  # the whole-vocabulary tree of from_tree, if any

    @classmethod
    def from_counts(
        cls,
        in_features: int,
        counts: Sequence[float],
        head: int,
        tail_tree: WordTree | None = None,
        init_std: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> "HybridSoftmax":
        """The ``head`` most frequent words (by ``counts``) in the head; ``tail_tree`` over the rest
        (its word i is ``hybrid_split(counts, head)[1][i]``), a Huffman tree of their counts when None."""
        head_words, tail_words = hybrid_split(counts, head)
        if tail_tree is None:
            tail_tree = huffman_tree(np.asarray(counts, dtype=np.float64)[tail_words])
        elif tail_tree.num_words != len(tail_words):
            raise ValueError(f"the tail tree has {tail_tree.num_words} words, the tail {len(tail_words)}")
        return cls(in_features, head_words, tail_tree, init_std, generator)

    @classmethod
    def from_tree(
        cls,
        in_features: int,
        tree: WordTree,
        head: int,
        init_std: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> "HybridSoftmax":
        """Words ``0 .. head-1`` in the head and ``tree`` (over all V words) restricted to the
        others as the tail tree (:func:`restrict_tree`): the LBL's ``hybrid`` output, whose
        vocabulary lists the words most frequent first. The layer keeps ``tree`` as
        :attr:`source_tree` (a run saves it as its tree.json)."""
        if not isinstance(tree, WordTree):
            raise TypeError(f"HybridSoftmax.from_tree needs a hlbl WordTree, not {type(tree).__name__}")
        _check_head(head, tree.num_words)
        layer = cls(
            in_features, np.arange(head), restrict_tree(tree, np.arange(head, tree.num_words)), init_std, generator
        )
        layer.source_tree = tree
        return layer

    @property
    def tail_words(self) -> torch.Tensor:
        """(V-K,) the tail's word ids, ascending: tail tree word i is ``tail_words[i]``."""
        return self._word[self.head_size :]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, vocab_size={self.vocab_size}, head={self.head_size}"

    # ---- the structure in the state_dict ------------------------------------------------------

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor], prefix: str = "") -> "HybridSoftmax":
        """A layer rebuilt from a ``state_dict`` alone (head from ``head_words``, tail tree from
        ``tail.tree_children``), loaded. ``prefix``: the layer's prefix in a model's state."""
        head = state_dict.get(prefix + "head_words")
        children, weight = state_dict.get(prefix + "tail.tree_children"), state_dict.get(prefix + "weight")
        if head is None or children is None or weight is None:
            raise ValueError(f"not a HybridSoftmax state: no {prefix}head_words, {prefix}tail.tree_children or weight")
        layer = cls(int(weight.shape[1]), head.detach().cpu().numpy(), tree_of(children))
        return load_prefixed(layer, state_dict, prefix, weight.dtype)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # The head's rows and the tail's node vectors mean nothing under another structure: one
        # message instead of weights of equal shape loaded silently (the tail refuses its own too).
        head = state_dict.get(prefix + "head_words")
        children = state_dict.get(prefix + "tail.tree_children")
        own = self.head_words
        same_head = head is None or same_ids(head, own)
        if not same_head or (children is not None and not self.tail._same_tree(children)):
            error_msgs.append(
                f"{prefix}head_words / {prefix}tail.tree_children: the state is of a hybrid softmax of another "
                f"structure (head of {_size(head)} words, tail {describe_tree(children)}) than this layer's (head of "
                f"{len(own)} words, tail {describe_tree(self.tail.tree_children)}); build the layer from the state, "
                "e.g. HybridSoftmax.from_state_dict(state)"
            )
            return
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    # ---- the model ----------------------------------------------------------------------------

    def _input(self, input: torch.Tensor) -> tuple[torch.Tensor, bool]:
        h, one = self.tail._batch(input)  # the tree layer's checks and messages: shape, dtype, device
        self.tail._check_dtype(h)
        return h, one

    def _head_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """(B, K + 1) log-softmax of the head: the K head words' log-probabilities, then the tail's mass."""
        return torch.log_softmax(F.linear(h, self.weight, self.bias), dim=1)

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(B, d), (B,) -> (B,) log P(target | input); (d,), () -> () for one vector."""
        h, one = self._input(input)
        t = self.tail._targets(h, target, one)
        check_targets(t, self.vocab_size)
        K = self.head_size
        slot = self._slot[t]
        head = self._head_log_probs(h).gather(1, slot.clamp(max=K).unsqueeze(1)).squeeze(1)  # tail targets: the mass
        is_tail = slot >= K
        local = (slot - K).clamp(min=0)  # tail tree word ids (0 for head targets, masked below)
        if h.device.type == "cpu" and not torch.compiler.is_compiling():
            rows = is_tail.nonzero().squeeze(1)  # the tree only for tail targets (host synchronisation is free here)
            lp = head.index_add(0, rows, self.tail.target_log_prob(h[rows], local[rows]).to(head.dtype))
        else:  # one shape, no host synchronisation: the tree for every row, kept for the tail's
            lp = head + torch.where(is_tail, self.tail.target_log_prob(h, local), 0.0)
        return lp[0] if one else lp

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        """(B, d) -> (B, V) log-probabilities of every word; (d,) -> (V,)."""
        h, one = self._input(input)
        K = self.head_size
        head = self._head_log_probs(h)
        tail = self.tail.log_prob(h).to(head.dtype)  # (B, V-K) log P_tree
        if tail.requires_grad or head.requires_grad:
            tail = tail + head[:, K:]
        else:
            tail += head[:, K:]  # its own fresh tensor: no second (B, V-K) copy
        lp = torch.cat((head[:, :K], tail), 1)
        if not self._head_first:  # slots -> word ids
            lp = lp.index_select(1, self._slot)
        return lp[0] if one else lp

    def init_unigram(self, counts: Sequence[float]) -> None:
        """Biases so that zero weights give the unigram distribution: the head's biases the log
        frequencies of its words and of the whole tail, the tail tree's from the tail's counts."""
        p = unigram_distribution(counts, self.vocab_size)
        head, tail = self.head_words.cpu().numpy(), self.tail_words.cpu().numpy()
        b = np.concatenate([np.log(p[head]), [np.log(p[tail].sum())]])
        with torch.no_grad():
            self.bias.copy_(torch.from_numpy(b))
        self.tail.init_unigram(np.asarray(counts, dtype=np.float64)[tail])

    def scale_node_gradients(self, counts: Sequence[float] | None, power: float = 1.0) -> None:
        """:meth:`TreeSoftmax.scale_node_gradients` for the tail's nodes, with shares of all
        tokens: node j's gradient scaled by ``min(1, (s_max / s_j)^power)``, ``s_j`` the share of
        training tokens through it (the tail's share times its share within the tail), ``s_max``
        the most frequent word's. The head's rows are a softmax's and keep their gradients."""
        if counts is None:
            self.tail.scale_node_gradients(None)
            return
        if not (power >= 0 and np.isfinite(power)):
            raise ValueError(f"power must be a finite number >= 0, got {power!r}")
        p = unigram_distribution(counts, self.vocab_size)
        tail = self.tail_words.cpu().numpy()
        share = self.tail._child_mass(np.asarray(counts, dtype=np.float64)[tail]).sum(1) * p[tail].sum()
        scale = np.minimum(1.0, (p.max() / share) ** power)
        self.tail.node_grad_scale = torch.from_numpy(scale).to(self.weight.device, self.weight.dtype)

    # ---- inference ----------------------------------------------------------------------------

    @torch.no_grad()
    def topk(self, input: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k words, (values, ids) each (B, k) or (k,) for one vector; k > V gives all V,
        best first, ties by lower word id.

        The head first: its words' log-probabilities are exact, and no tail word can beat the
        tail's mass ``m``. A head word above ``m`` is in the top k for sure; where the head's k-th
        best is at or above ``m`` the tree is not searched at all. Other rows take the tail's top
        ``k - c`` (c: their head words above ``m``), shifted by ``m``, merged with the head's: on
        a CPU by the tree's search with a floor (the head's k-th best less ``m``), so
        it stops once no tail word left can beat the head's k-th best; elsewhere from the tail's
        full distribution.
        """
        from ..search import check_k, layer_scratch_pool, layer_tree_arrays, tree_topk

        h, one = self._input(input)
        h = h.to(self.weight.dtype)
        k = check_k(k, self.vocab_size)
        K, V = self.head_size, self.vocab_size
        # (B, K + 1): log_softmax is one vectorised pass, several times torch.logsumexp's speed on a CPU
        head = torch.log_softmax(F.linear(h, self.weight, self.bias), dim=1)
        mass = head[:, K]  # (B,) log-probability of the tail
        hv, hi = _sorted_topk(head[:, :K], min(k, K))  # ties: lower slot = lower word id
        hw = self._word[hi]
        above = (hv > mass[:, None]).sum(1)  # (B,) head words certainly in the top k
        full_head = hv.shape[1] == k
        need = above < k if full_head else torch.ones_like(above, dtype=torch.bool)
        rows = need.nonzero().squeeze(1)
        if len(rows) == 0:
            return (hv[0], hw[0]) if one else (hv, hw)
        kt = min(int((k - above[rows]).max()), V - K)
        hr, m = h[rows], mass[rows, None]
        if h.device.type == "cpu":
            # a tail word enters only at or above the head's k-th best: P_tail >= that / m (with
            # slack for the float32 rounding of both sides; a lower floor only searches more)
            floor = (
                (hv[rows, k - 1 : k] - m).double()[:, 0] - 1e-4 if full_head else torch.full((len(rows),), -math.inf)
            )
            res = tree_topk(
                self.tail.tree,
                self.tail.weight,
                self.tail.bias,
                hr,
                kt,
                arrays=layer_tree_arrays(self.tail),
                floor=floor,
                pool=layer_scratch_pool(self.tail),
            )
            tv, ti = res.values, res.indices  # unfilled slots: -inf, -1
        else:
            tv, ti = self.tail.topk(hr, kt)
        cand_v = torch.cat((hv[rows], tv.to(hv.dtype) + m), 1)
        cand_w = torch.cat((hw[rows], torch.where(ti >= 0, self.tail_words[ti.clamp(min=0)], V)), 1)  # V: no word
        by_id = cand_w.argsort(dim=1)  # then a stable sort by value: ties by lower word id
        cand_v, cand_w = cand_v.gather(1, by_id), cand_w.gather(1, by_id)
        order = torch.sort(cand_v, dim=1, descending=True, stable=True).indices[:, :k]
        values, ids = hv.new_empty(len(h), k), hw.new_empty(len(h), k)
        keep = (~need).nonzero().squeeze(1)
        if len(keep):  # rows the head alone answers (then the head has k columns)
            values[keep], ids[keep] = hv[keep], hw[keep]
        values[rows], ids[rows] = cand_v.gather(1, order), cand_w.gather(1, order)
        return (values[0], ids[0]) if one else (values, ids)

    @torch.no_grad()
    def predict(self, input: torch.Tensor) -> torch.Tensor:
        """The most probable word, exactly: (B,) ids, or () for one vector; ties to the lower id."""
        h, one = self._input(input)
        word = self.topk(h, 1)[1][:, 0]
        return word[0] if one else word

    @torch.no_grad()
    def sample(
        self,
        input: torch.Tensor,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        per_node: bool = False,
    ) -> torch.Tensor:
        """(B,) sampled words (() for one vector). ``temperature == 1`` or ``per_node``: ancestral,
        a head entry from the head's softmax (tempered with ``per_node``), then for the tail entry
        a walk down the tree (tempered at each node with ``per_node``); else the exact tempered
        distribution via ``log_prob``."""
        from ..sampling import check_temperature, sample_from_log_prob

        h, one = self._input(input)
        h = h.to(self.weight.dtype)
        check_temperature(temperature)
        if temperature == 1.0 or per_node:
            slot = sample_from_log_prob(self._head_log_probs(h), generator, temperature)  # (B,) in 0..K
            words = self._word[slot.clamp(max=self.head_size - 1)]
            rows = (slot == self.head_size).nonzero().squeeze(1)
            if len(rows):
                local = self.tail.sample(h[rows], generator, temperature, per_node=per_node)
                words[rows] = self.tail_words[local]
        else:
            words = sample_from_log_prob(self.log_prob(h), generator, temperature)
        return words[0] if one else words


def _sorted_topk(lp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of (B, n) by value, ties by lower index, as a stable sort would give but by
    ``torch.topk`` (a full sort of the head's 2,000 columns costs more than its matrix product):
    rows where the k-th and (k+1)-th values tie, where ``torch.topk`` may keep either, are sorted."""
    from ..search import full_topk

    if k >= lp.shape[1]:
        return full_topk(lp, k)
    v, i = torch.topk(lp, k + 1, dim=1)
    v, i, tie = v[:, :k], i[:, :k], v[:, k - 1] == v[:, k]
    by_id = i.argsort(dim=1)  # equal values inside the k: lower index first
    v, i = v.gather(1, by_id), i.gather(1, by_id)
    order = torch.sort(v, dim=1, descending=True, stable=True).indices
    v, i = v.gather(1, order), i.gather(1, order)
    if bool(tie.any()):
        rows = tie.nonzero().squeeze(1)
        v[rows], i[rows] = full_topk(lp[rows], k)
    return v, i


def _size(head) -> str:
    return str(len(head)) if torch.is_tensor(head) and head.dim() == 1 else "an unreadable"

"""The tree softmax (hierarchical softmax, the HLBL's output layer) over a :class:`~hlbl.tree.WordTree`.

A PyTorch layer in its own right (``docs/layer.md``): its tree travels in its ``state_dict`` (the
``tree_children`` buffer), so a saved state loads only into a layer on the same tree and
:meth:`TreeSoftmax.from_state_dict` rebuilds the layer from the state alone; inputs may be one
vector ``(d,)`` or a batch ``(B, d)``, as for ``nn.AdaptiveLogSoftmaxWithLoss``.
"""

from __future__ import annotations

import hashlib
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import TreeError
from ..tree import WordTree
from .base import (
    OutputLayer,
    check_targets,
    gaussian_weights,
    load_prefixed,
    same_ids,
    unigram_distribution,
)


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

    Inputs are ``(B, in_features)`` or one vector ``(in_features,)`` (then outputs lose their
    batch dimension), as in ``nn.AdaptiveLogSoftmaxWithLoss``.
    """

    def __init__(
        self, in_features: int, tree: WordTree, init_std: float = 0.0, generator: torch.Generator | None = None
    ):
        super().__init__()
        if not isinstance(tree, WordTree):
            raise TypeError(f"TreeSoftmax needs a hlbl WordTree, not {type(tree).__name__}")
        if isinstance(in_features, bool) or not isinstance(in_features, (int, np.integer)) or in_features < 1:
            raise ValueError(f"in_features must be a positive whole number, got {in_features!r}")
        self.in_features = int(in_features)
        self._tree = tree
        self.vocab_size = tree.num_words
        self.weight = nn.Parameter(gaussian_weights((tree.num_nodes, self.in_features), init_std, generator))
        self.bias = nn.Parameter(torch.zeros(tree.num_nodes))
        # The tree itself, saved with the weights: (N, 2) children, leaves as -1 - word. A state
        # loads only into a layer on an equal tree (_load_from_state_dict).
        self.register_buffer("tree_children", torch.from_numpy(tree.children.copy()))
        # The rest is derived from the tree: rebuilt, not saved (persistent=False).
        sign = (
            np.where(tree.path_bits == 1, np.float32(1.0), np.float32(-1.0)) * tree.path_mask
        )  # float32: no L x D float64 temporary
        self.register_buffer("path_nodes", torch.from_numpy(tree.path_nodes), persistent=False)
        self.register_buffer("path_sign", torch.from_numpy(sign), persistent=False)
        self.register_buffer("word_leaves", torch.from_numpy(tree.word_leaves), persistent=False)
        self.multi_code = tree.word_leaves.shape[1] > 1
        self._register_level_tables(tree)
        # (N,) per-node gradient scale, or None: a training setting (scale_node_gradients), not saved
        self.register_buffer("node_grad_scale", None, persistent=False)

    def _register_level_tables(self, tree: WordTree) -> None:
        """Index tables of the level-by-level ``log_prob``.

        Edge log-probabilities live in a (B, 2, N) table, viewed as (B, 2N): column ``s*N + j`` is
        side s (0 left, 1 right) of node j. Per level t (nodes ``[start, end)``, breadth-first so
        contiguous): ``_kid_cols`` lists the columns of the level's internal children in order,
        which are exactly the next level's nodes; ``_kid_local`` the same children as positions
        in the level's own (B, 2n) block ``cat(left, right)``. ``_word_cols`` (V, K): the column of
        each leaf of each word, -1 padded.
        """
        N, ch = tree.num_nodes, tree.children
        self._levels = []  # (start, end, kid_lo, kid_hi) per level; kid_* slice the concatenated tables
        cols, local, lo = [], [], 0
        for nodes in tree.levels:
            start, end = int(nodes[0]), int(nodes[-1]) + 1
            side, j = np.nonzero(ch[start:end].T >= 0)  # (side, node - start) of internal kids, side-major
            order = np.argsort(j * 2 + side, kind="stable")  # back to node order, left before right
            side, j = side[order], j[order]
            cols.append(side * N + start + j)
            local.append(side * (end - start) + j)
            self._levels.append((start, end, lo, lo + len(j)))
            lo += len(j)
        self.register_buffer("_kid_cols", torch.from_numpy(np.concatenate(cols)), persistent=False)
        self.register_buffer("_kid_local", torch.from_numpy(np.concatenate(local)), persistent=False)
        flat = ch.reshape(-1)  # slot 2j + s
        slots = np.flatnonzero(flat < 0)
        slot_col = (slots % 2) * N + slots // 2
        leaf_col = np.empty(len(slots), dtype=np.int64)
        leaf_col[np.argsort(slots)] = slot_col  # leaf ids are breadth-first = slot order
        wl = tree.word_leaves
        self.register_buffer(
            "_word_cols", torch.from_numpy(np.where(wl >= 0, leaf_col[np.clip(wl, 0, None)], -1)), persistent=False
        )

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

    # ---- the tree in the state_dict -----------------------------------------------------------

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor], prefix: str = "") -> "TreeSoftmax":
        """A layer rebuilt from a ``state_dict`` alone (its tree from ``tree_children``), loaded.

        ``prefix``: the layer's prefix in a model's state, e.g. ``"decoder."``.
        """
        children, weight = state_dict.get(prefix + "tree_children"), state_dict.get(prefix + "weight")
        if children is None or weight is None:
            raise ValueError(f"not a TreeSoftmax state: no {prefix}tree_children or {prefix}weight")
        return load_prefixed(cls(int(weight.shape[1]), tree_of(children)), state_dict, prefix, weight.dtype)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        # Node vectors mean nothing under another tree: refuse them with one message (PyTorch raises
        # it from load_state_dict, strict or not) instead of loading weights of equal shape silently.
        saved = state_dict.get(prefix + "tree_children")
        if saved is not None and not self._same_tree(saved):
            error_msgs.append(
                f"{prefix}tree_children: the state is of a tree softmax on another word tree "
                f"({describe_tree(saved)}) than this layer's ({describe_tree(self.tree_children)}); build the layer "
                "on the saved tree, e.g. TreeSoftmax.from_state_dict(state)"
            )
            return
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def _same_tree(self, saved) -> bool:
        return same_ids(saved, self.tree_children)

    # ---- inputs -------------------------------------------------------------------------------

    def _batch(self, input: torch.Tensor, what: str = "input") -> tuple[torch.Tensor, bool]:
        """(input as (B, d), whether it was one vector); a clear error for anything else."""
        d = self.in_features
        if not torch.is_tensor(input):
            raise TypeError(f"{what} must be a tensor of shape (B, {d}) or ({d},), not {type(input).__name__}")
        if input.dim() not in (1, 2) or input.shape[-1] != d:
            raise ValueError(f"{what} must have shape (B, {d}) or ({d},), got {tuple(input.shape)}")
        if not input.is_floating_point():
            raise TypeError(f"{what} must be floating point (hidden vectors), not {input.dtype}")
        if input.device != self.weight.device:
            raise ValueError(f"{what} is on {input.device}, the layer on {self.weight.device}; move one of them")
        return (input.unsqueeze(0), True) if input.dim() == 1 else (input, False)

    def _check_dtype(self, input: torch.Tensor) -> None:
        # Under autocast PyTorch casts for the matrix products itself.
        if input.dtype != self.weight.dtype and not _autocast_on(input.device.type):
            raise ValueError(
                f"input is {input.dtype}, the layer's weights {self.weight.dtype}: convert one (input.to(...) "
                "or layer.to(...))"
            )

    def _targets(self, input: torch.Tensor, target: torch.Tensor, one: bool) -> torch.Tensor:
        if not torch.is_tensor(target):
            raise TypeError(f"target must be a tensor of word ids, not {type(target).__name__}")
        want = () if one else (input.shape[0],)
        if tuple(target.shape) != want:
            raise ValueError(
                f"target must have shape {want} for input of shape {tuple(input.shape[1:] if one else input.shape)}, "
                f"got {tuple(target.shape)}"
            )
        return target.reshape(1) if one else target

    # ---- the model ----------------------------------------------------------------------------

    def _child_mass(self, counts: Sequence[float]) -> np.ndarray:
        """(N, 2) unigram probability mass below each node's left and right child (a word with k
        codes puts p(w)/k on each of its leaves)."""
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
        return child_mass

    def init_unigram(self, counts: Sequence[float]) -> None:
        """Biases so that zero weights give the unigram distribution.

        A word with k codes puts p(w)/k on each of its leaves; node j's bias is
        ``log(mass(left subtree) / mass(right subtree))``.
        """
        child_mass = self._child_mass(counts)
        with torch.no_grad():
            self.bias.copy_(torch.from_numpy(np.log(child_mass[:, 0] / child_mass[:, 1])))

    def scale_node_gradients(self, counts: Sequence[float] | None, power: float = 1.0) -> None:
        """Scale the gradient of node j's vector and bias by ``min(1, (s_max / s_j)^power)``,
        where ``s_j`` is the share of training tokens (unigram ``counts``) whose path passes node
        j and ``s_max`` the most frequent word's share; None removes the scaling.

        Why: node j's loss sums over every token through it, so the root's gradient gathers all
        of a batch and the top nodes' curvature is about ``1 / s_max`` times that of any row of
        a full softmax. Under a step size tuned for a softmax (SGD lr 20, total-norm clipping at
        0.25, PyTorch's word_language_model) the top biases then overshoot and oscillate, their
        gradient fills the clipped norm and the encoder gets almost none of the step
        (``docs/layer.md``). The scaling gives no node a larger effective learning rate than the
        softmax's busiest row. Only gradients change: the forward pass, the gradient reaching
        the input, and the state_dict are as without it. Not saved: set it again to resume.
        """
        if counts is None:
            self.node_grad_scale = None
            return
        if not (power >= 0 and np.isfinite(power)):
            raise ValueError(f"power must be a finite number >= 0, got {power!r}")
        p = unigram_distribution(counts, self.vocab_size)
        share = self._child_mass(counts).sum(1)  # (N,) mass through each node
        scale = np.minimum(1.0, (p.max() / share) ** power)
        self.node_grad_scale = torch.from_numpy(scale).to(self.weight.device, self.weight.dtype)

    def _params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) as the forward pass reads them: with their gradients scaled per node
        when :meth:`scale_node_gradients` asked for it."""
        g = self.node_grad_scale
        if g is None or not torch.is_grad_enabled():
            return self.weight, self.bias
        g = g.to(self.weight.dtype)
        return _ScaleGrad.apply(self.weight, g[:, None]), _ScaleGrad.apply(self.bias, g)

    def path_log_probs(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(B, K) log-probability of each of the targets' paths; -inf where a word has fewer."""
        check_targets(target, self.vocab_size)
        leaves = self.word_leaves[target]  # (B, K), -1 padded
        if leaves.shape[1] == 1:
            return self._leaf_log_probs(input, leaves[:, 0]).unsqueeze(1)
        if input.device.type != "cpu" or torch.compiler.is_compiling():  # one shape, no host synchronisation
            lp = self._leaf_log_probs(input.unsqueeze(1).expand(-1, leaves.shape[1], -1), leaves.clamp(min=0))
            return lp.masked_fill(leaves < 0, float("-inf"))
        # CPU, multi-code: only the real (example, leaf) pairs. Padding every example to the most
        # codes of any word made a step about 3x slower on a tree where 4% of words have two.
        tok, col = (leaves >= 0).nonzero(as_tuple=True)  # (P,) pairs, P = total codes of the targets
        lp = self._leaf_log_probs(input[tok], leaves[tok, col])
        return input.new_full(leaves.shape, float("-inf")).index_put((tok, col), lp)

    def _leaf_log_probs(self, h: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
        """log-probability of reaching ``leaf`` (...,) from ``h`` (..., d): the sum over its path
        of ``log sigmoid(+-(h . q_j + b_j))``."""
        nodes = self.path_nodes[leaf]  # (..., D), 0-padded past the leaf's depth
        sign = self.path_sign[leaf]  # (..., D): +1 left, -1 right, 0 padding
        weight, bias = self._params()
        shape = nodes.shape
        q = weight[nodes.reshape(-1, shape[-1])]  # (M, D, d) for M paths
        scores = torch.bmm(q, h.reshape(-1, h.shape[-1], 1)).view(shape) + bias[nodes]
        real = sign != 0
        z = torch.where(real, sign * scores, 0.0)  # padding: 0 x an overflowed score would be NaN
        return F.logsigmoid(z).masked_fill(~real, 0.0).sum(-1)

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(B, d), (B,) -> (B,) log P(target | input); (d,), () -> () for one vector."""
        h, one = self._batch(input)
        self._check_dtype(h)
        t = self._targets(h, target, one)
        paths = self.path_log_probs(h, t)
        lp = torch.logsumexp(paths, dim=1) if self.multi_code else paths[:, 0]
        return lp[0] if one else lp

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        """(B, d) -> (B, V) log-probabilities of every word; (d,) -> (V,)."""
        h, one = self._batch(input)
        self._check_dtype(h)
        grad = torch.is_grad_enabled() and (h.requires_grad or self.weight.requires_grad or self.bias.requires_grad)
        fast = not grad and h.dtype == self.weight.dtype
        if fast and h.device.type == "cpu" and h.dtype in (torch.float32, torch.float64):
            lp = self._log_prob_cpu(h)
            return lp[0] if one else lp
        edges = self._edge_log_probs_inplace(h) if fast else self._edge_log_probs(h)  # (B, 2N)
        if self.multi_code:
            wc = self._word_cols
            lp = torch.logsumexp(edges[:, wc.clamp(min=0)].masked_fill(wc < 0, float("-inf")), dim=2)
        else:
            lp = edges.index_select(1, self._word_cols[:, 0])
        return lp[0] if one else lp

    def _log_prob_cpu(self, h: torch.Tensor) -> torch.Tensor:
        """(B, V) log-probabilities on the CPU without autograd: the scores and their log sigmoid
        by PyTorch, the sweep down the tree by a numba kernel (:mod:`hlbl.tree_kernels`), rows
        split over ``torch.get_num_threads()`` threads."""
        from ..search import in_row_slices
        from ..tree_kernels import descend  # numba: loaded on the first full distribution on a CPU

        B, V = h.shape[0], self.vocab_size
        S = torch.addmm(self.bias.detach(), h.detach(), self.weight.detach().t())  # (B, N)
        L = _log_sigmoid_cpu(S)
        out = h.new_full((B, V), float("-inf")) if self.multi_code else h.new_empty(B, V)
        Ln, Sn, on, children = L.numpy(), S.numpy(), out.numpy(), self._tree.children

        def run(start: int, stop: int) -> None:
            descend(Ln, Sn, children, self.multi_code, start, stop, on)

        in_row_slices(run, B, torch.get_num_threads())
        return out

    def _edge_log_probs_inplace(self, h: torch.Tensor) -> torch.Tensor:
        """(B, 2N) log-probability of every edge's end, column ``s*N + j`` (see
        :meth:`_register_level_tables`), without autograd: one (B, 2, N) table written in place,
        level by level (off the CPU; a CPU takes :meth:`_log_prob_cpu`). The right side is
        ``log sigmoid(-s) = log sigmoid(s) - s``, computed after the level's prefix is added.
        """
        B, N = h.shape[0], self.weight.shape[0]
        E = h.new_empty(B, 2, N)
        S = E[:, 1]  # the scores (B, N) wait in the right half until the level's right sides replace them
        torch.addmm(self.bias, h, self.weight.t(), out=S)
        E[:, 0] = F.logsigmoid(S)
        flat, above = E.view(B, 2 * N), None
        for start, end, lo, hi in self._levels:
            if above is not None:  # prefix: log-probability of reaching each node of this level
                E[:, 0, start:end] += above
            torch.sub(E[:, 0, start:end], S[:, start:end], out=E[:, 1, start:end])
            above = flat.index_select(1, self._kid_cols[lo:hi])
        return flat

    def _edge_log_probs(self, h: torch.Tensor) -> torch.Tensor:
        """:meth:`_edge_log_probs_inplace` out of place, for autograd (and mixed dtypes)."""
        S = F.linear(h, *self._params())  # (B, N)
        left_all = F.logsigmoid(S)
        lefts, rights, above = [], [], None
        for start, end, lo, hi in self._levels:
            left = left_all[:, start:end]
            right = left - S[:, start:end]  # log sigmoid(-s)
            if above is not None:
                left, right = left + above, right + above
            lefts.append(left)
            rights.append(right)
            above = torch.cat((left, right), 1)[:, self._kid_local[lo:hi]]
        return torch.cat(lefts + rights, 1)

    # ---- inference ----------------------------------------------------------------------------
    # search and sampling import numba: loaded on the first top-k or sample, not with every layer

    @torch.no_grad()
    def topk(self, input: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k words, (values, ids) each (B, k) or (k,) for one vector; k > V gives all V
        words, best first, ties by lower word id.

        CPU input: branch-and-bound search down the tree (:mod:`hlbl.search`), visiting few nodes. Other
        devices: sorting ``log_prob`` there (one matrix product, no copy to the CPU).
        """
        from ..search import full_topk, layer_scratch_pool, layer_tree_arrays, tree_topk

        h, one = self._batch(input)
        if h.device.type == "cpu":
            arrays, pool = layer_tree_arrays(self), layer_scratch_pool(self)
            res = tree_topk(self.tree, self.weight, self.bias, h, k, arrays=arrays, pool=pool)
            values, ids = res.values, res.indices
        else:
            values, ids = full_topk(self.log_prob(h.to(self.weight.dtype)), k)
        return (values[0], ids[0]) if one else (values, ids)

    @torch.no_grad()
    def predict(self, input: torch.Tensor) -> torch.Tensor:
        """The most probable word, exactly: (B,) ids, or () for one vector (as
        ``nn.AdaptiveLogSoftmaxWithLoss.predict``); ties go to the lower word id."""
        h, one = self._batch(input)
        if h.device.type == "cpu":
            word = self.topk(h, 1)[1][:, 0]
        else:  # argmax takes the first of equal maxima: the lower word id, as the search does
            word = self.log_prob(h.to(self.weight.dtype)).argmax(1)
        return word[0] if one else word

    @torch.no_grad()
    def sample(
        self,
        input: torch.Tensor,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        per_node: bool = False,
    ) -> torch.Tensor:
        """(B,) sampled words (() for one vector): ancestral O(depth) when ``temperature == 1`` or
        ``per_node``, else the exact tempered distribution via ``log_prob`` (O(N d)). On the
        input's device: the CPU walk is a numba kernel, elsewhere a walk of tensor operations."""
        from ..sampling import check_temperature, ancestral_sample, sample_from_log_prob
        from ..search import layer_tree_arrays

        h, one = self._batch(input)
        check_temperature(temperature)
        if temperature == 1.0 or per_node:
            if h.device.type == "cpu":
                words = ancestral_sample(
                    self.tree, self.weight, self.bias, h, generator, temperature, arrays=layer_tree_arrays(self)
                )
            else:
                words = self._walk(h, generator, temperature)
        else:
            words = sample_from_log_prob(self.log_prob(h.to(self.weight.dtype)), generator, temperature)
        return words[0] if one else words

    def _walk(self, h: torch.Tensor, generator: torch.Generator | None, temperature: float) -> torch.Tensor:
        """Ancestral sampling by tensor operations on ``h``'s device: every row steps down one
        level per iteration (max depth iterations, no host synchronisation), going left where its
        uniform is below ``sigmoid(s / T)``; the uniforms (B, D) are drawn up front as on the CPU."""
        B, D = h.shape[0], self.path_nodes.shape[1]
        gen_device = generator.device if generator is not None else h.device
        U = torch.rand(B, D, generator=generator, dtype=torch.float64, device=gen_device).to(h.device)
        node = torch.zeros(B, dtype=torch.int64, device=h.device)
        word = torch.full((B,), -1, dtype=torch.int64, device=h.device)
        nan = torch.zeros(B, dtype=torch.bool, device=h.device)
        h = h.to(self.weight.dtype)
        for t in range(D):
            s = (h * self.weight[node]).sum(1) + self.bias[node]  # (B,) scores of the current nodes
            nan |= torch.isnan(s) & (word < 0)
            left = U[:, t] < torch.sigmoid(s.double() / temperature)
            child = torch.where(left, self.tree_children[node, 0], self.tree_children[node, 1])
            open_ = word < 0
            word = torch.where(open_ & (child < 0), -1 - child, word)
            node = torch.where(open_ & (child >= 0), child, node)
        torch._assert_async(~nan.any(), "cannot sample: a tree decision is NaN (non-finite weights or input)")
        return word


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient multiplied by ``scale`` (broadcast to the input's shape)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(scale)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (scale,) = ctx.saved_tensors
        return grad * scale, None


def _log_sigmoid_cpu(S: torch.Tensor) -> torch.Tensor:
    """``log sigmoid(S)`` of a float32/64 CPU tensor as ``log(sigmoid(S))``, about 3x the speed of
    ``F.logsigmoid`` and exact to rounding while sigmoid(s) is a normal float; below that
    (s < -80 in float32, -700 in float64) ``F.logsigmoid`` for the whole tensor."""
    floor = -80.0 if S.dtype == torch.float32 else -700.0
    if S.numel() == 0 or torch.amin(S) >= floor:
        return torch.sigmoid(S).log_()
    return F.logsigmoid(S)


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # PyTorch before 2.4 has no device argument
        return torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled()


def tree_of(children: torch.Tensor) -> WordTree:
    """The WordTree of a saved ``tree_children`` (N, 2) tensor; its words are 0..max word id."""
    ch = children.detach().cpu().numpy()
    if ch.ndim != 2 or ch.shape[1:] != (2,) or (ch.size and ch.dtype.kind not in "iu"):
        raise TreeError(f"tree_children must be an (N, 2) integer tensor, got {children.dtype} {tuple(children.shape)}")
    leaves = ch[ch < 0]
    return WordTree(ch.astype(np.int64), int(-1 - leaves.min()) + 1 if leaves.size else 0)


def describe_tree(children) -> str:
    """A tree in a message: its size and a short fingerprint of its children table."""
    if not torch.is_tensor(children) or children.dim() != 2:
        return "not an (N, 2) table"
    ch = children.detach().to("cpu", torch.int64).contiguous().numpy()
    return f"{len(ch)} internal nodes, fingerprint {hashlib.sha256(ch.astype('<i8').tobytes()).hexdigest()[:12]}"

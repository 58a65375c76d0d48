"""The class-based output layer: a two-level tree with a softmax at each level (``--output classes``).

Over :class:`~hlbl.classes.WordClasses` (S shortlist words and C classes under the root)::

    P(w | h) = sum over memberships m of w:  P(root entry r(m) | h) * P(m | class of m, h)
    P(r | h) = softmax_r(h . u_r + a_r)          over the S + C root entries
    P(m | c, h) = softmax_m(h . q_m + b_m)       over the members m of class c (1 for a shortlist leaf)

Each root entry and each class membership has its own vector and bias, so a word in two classes
has two output vectors, as a word with two codes in a binary tree has two paths. With
``member_dim`` the members' scores read a projection of h instead (``q_m . (P h)``, P of shape
(member_dim, d), shared by every class), as the adaptive softmax's tail clusters do: the members
are the rarer words, and M x member_dim weights cost less to update each step than M x d. The sum over
memberships is a log-sum-exp, so the gradient weights each membership by its posterior share.

Training cost per example: ``S + C`` root scores plus the members of the target's classes, about
``2 sqrt(V)`` against the flat softmax's ``V``. :meth:`ClassSoftmax.target_log_prob` groups a
minibatch by class and scores each class's examples against its members with one matrix product
(a class's member rows are contiguous, so no weight copy), so the work is that of the formula
above with no padding. Top-k is exact best-first over the root entries (a class's probability
bounds each of its members'); sampling is ancestral (root entry, then member).

The fast (numba) engine handles binary trees only; this layer trains on the PyTorch path
(``docs/classes.md`` gives its measured speed).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..classes import WordClasses
from .base import OutputLayer, check_targets, gaussian_weights, unigram_distribution


USE_KERNELS = True  # False: the per-class PyTorch loop on the CPU too (the tests compare the two)
# class_kernels, search and sampling import numba: this module imports them on first use, so that
# building a layer does not load it.


class _WithinClass(torch.autograd.Function):
    """log P(member | class, h) for pairs grouped by class, with a hand-written backward.

    On the CPU the numba kernels of :mod:`hlbl.class_kernels` run it (one pass over the pairs,
    class by class). Elsewhere (a GPU) each class's examples (n_c, d) meet its contiguous member
    rows (|c|, d) in one matrix product (n_c, |c|), a Python loop over classes. Either way the
    backward adds into one (M, d) buffer: autograd over per-class slices would give each slice a
    full (M, d) zero gradient, one per class per step. With g = d loss / d lp and p the class
    softmax, d lp / d scores = onehot(member) - p."""

    @staticmethod
    def forward(ctx, input, weight, bias, rows, member, cls, starts_t, starts):
        # input (B, d), weight (M, d), bias (M,); rows / member / cls (P,); starts_t (C + 1,) and
        # starts (the same as ints)
        order = torch.argsort(cls, stable=True)  # (P,) pairs class by class
        ctx.starts = starts
        ctx.cpu = USE_KERNELS and input.device.type == "cpu" and not torch.compiler.is_compiling()
        if ctx.cpu:
            from ..class_kernels import pair_offsets, within_forward

            start, end = starts_t[cls], starts_t[cls + 1]  # (P,) each pair's class rows
            off = pair_offsets((end - start).numpy())
            H, W, bb = (t.detach().contiguous() for t in (input, weight, bias))
            out = input.new_empty(len(rows))
            prob = input.new_empty(int(off[-1]))  # (T,) class softmax of every pair
            within_forward(
                H.numpy(), W.numpy(), bb.numpy(), rows.numpy(), member.numpy(), start.numpy(), end.numpy(),
                order.numpy(), off, out.numpy(), prob.numpy(),
            )  # fmt: skip
            ctx.kernel = (start, end, order, off, prob)
            ctx.save_for_backward(H, W, rows, member)
            return out
        out = input.new_empty(len(rows))
        saved = []
        counts = torch.bincount(cls, minlength=len(starts) - 1).tolist()
        pos = 0
        for c, n in enumerate(counts):
            if n == 0:
                continue
            idx = order[pos : pos + n]
            pos += n
            a, b = starts[c], starts[c + 1]
            h = input[rows[idx]]  # (n, d)
            scores = torch.addmm(bias[a:b], h, weight[a:b].t())  # (n, |c|)
            target = (member[idx] - a).unsqueeze(1)  # (n, 1) position within the class
            logp = torch.log_softmax(scores, dim=1)
            out[idx] = logp.gather(1, target).squeeze(1)
            saved.append((c, idx, target, logp))
        ctx.saved = saved
        ctx.save_for_backward(input, weight, rows, member)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        input, weight, rows, member = ctx.saved_tensors
        want_h = ctx.needs_input_grad[0]
        g_in = torch.zeros_like(input)
        g_w = torch.zeros_like(weight)
        g_b = weight.new_zeros(len(weight))
        if ctx.cpu:
            from ..class_kernels import within_backward

            start, end, order, off, prob = ctx.kernel
            within_backward(
                input.numpy(), weight.numpy(), grad_out.detach().contiguous().numpy(), rows.numpy(), member.numpy(),
                start.numpy(), end.numpy(), order.numpy(), off, prob.numpy(), g_in.numpy(), g_w.numpy(),
                g_b.numpy(), want_h,
            )  # fmt: skip
            return (g_in if want_h else None), g_w, g_b, None, None, None, None, None
        for c, idx, target, logp in ctx.saved:
            a, b = ctx.starts[c], ctx.starts[c + 1]
            g = grad_out[idx].unsqueeze(1)  # (n, 1)
            G = logp.exp().mul_(-g)  # (n, |c|): -g p (logp kept: a second backward reuses it)
            G.scatter_add_(1, target, g)  # + g at the member
            r = rows[idx]
            g_w[a:b].addmm_(G.t(), input[r])
            g_b[a:b] += G.sum(0)
            if want_h:
                g_in.index_add_(0, r, G @ weight[a:b])
        return (g_in if want_h else None), g_w, g_b, None, None, None, None, None


class ClassSoftmax(OutputLayer):
    """Class-based softmax over :class:`~hlbl.classes.WordClasses`, exact for several memberships.

    Parameters: ``root_weight`` (S + C, d) / ``root_bias`` (S + C): shortlist words then classes;
    ``word_weight`` (M, m) / ``word_bias`` (M): the M class memberships, class by class (leaf
    ``S + i`` is row ``i``), m = ``member_dim`` or d; with ``member_dim``, ``member_proj`` (a
    bias-free ``nn.Linear(d, member_dim)``) maps h to what the members' scores read."""

    def __init__(
        self,
        in_features: int,
        classes: WordClasses,
        init_std: float = 0.0,
        generator: torch.Generator | None = None,
        member_dim: int | None = None,
    ):
        super().__init__()
        if member_dim is not None and not (isinstance(member_dim, int) and 1 <= member_dim <= in_features):
            raise ValueError(f"member_dim must be a whole number in 1..{in_features} (in_features), got {member_dim!r}")
        self.in_features = in_features
        self.member_dim = member_dim
        self._classes = classes
        self.vocab_size = classes.num_words
        S, C = classes.num_shortlist, classes.num_classes
        M = classes.num_leaves - S
        self.root_weight = nn.Parameter(gaussian_weights((S + C, in_features), init_std, generator))
        self.root_bias = nn.Parameter(torch.zeros(S + C))
        self.member_proj = None if member_dim is None else nn.Linear(in_features, member_dim, bias=False)
        self.word_weight = nn.Parameter(gaussian_weights((M, member_dim or in_features), init_std, generator))
        self.word_bias = nn.Parameter(torch.zeros(M))
        # Derived from the structure; rebuilt, not saved (persistent=False).
        self.register_buffer("word_leaves", torch.from_numpy(classes.word_leaves), persistent=False)  # (V, K)
        self.register_buffer("leaf_root", torch.from_numpy(classes.leaf_root), persistent=False)  # (L,)
        self.register_buffer("leaf_word", torch.from_numpy(classes.leaf_word), persistent=False)  # (L,)
        self.register_buffer("class_start", torch.from_numpy(classes.class_start), persistent=False)  # (C+1,)
        self._starts = classes.class_start.tolist()  # host copies for slicing
        self.multi_code = classes.word_leaves.shape[1] > 1

    @property
    def classes(self) -> WordClasses:
        """The layer's structure, fixed at construction (its parameter rows follow it)."""
        return self._classes

    def extra_repr(self) -> str:
        c = self._classes
        return (
            f"in_features={self.in_features}, vocab_size={self.vocab_size}, shortlist={c.num_shortlist}, "
            f"classes={c.num_classes}, leaves={c.num_leaves}, max_codes={c.word_leaves.shape[1]}"
            + (f", member_dim={self.member_dim}" if self.member_dim is not None else "")
        )

    def init_unigram(self, counts: Sequence[float]) -> None:
        """Biases so that zero weights give the unigram distribution: a word with k memberships
        puts p(w)/k on each; a root entry's bias is the log of the mass below it, a member's the
        log of its share of its class."""
        c = self._classes
        p = unigram_distribution(counts, self.vocab_size)
        leaf_mass = p[c.leaf_word] / c.codes_per_word[c.leaf_word]  # (L,)
        root_mass = np.bincount(c.leaf_root, weights=leaf_mass, minlength=c.num_root)
        S = c.num_shortlist
        with torch.no_grad():
            self.root_bias.copy_(torch.from_numpy(np.log(root_mass)))
            self.word_bias.copy_(torch.from_numpy(np.log(leaf_mass[S:] / root_mass[c.leaf_root[S:]])))

    # ---- exact probabilities ----------------------------------------------------------------

    def member_input(self, input: torch.Tensor) -> torch.Tensor:
        """(B, m) what the members' scores read of h (B, d): h itself, or its projection."""
        return input if self.member_proj is None else self.member_proj(input)

    def _within_class(self, input: torch.Tensor, rows: torch.Tensor, leaves: torch.Tensor) -> torch.Tensor:
        """(P,) log P(member | its class, h) for P (example row, class leaf id) pairs; ``input``
        is :meth:`member_input`'s (B, m)."""
        S = self._classes.num_shortlist
        member = leaves - S  # (P,) row of word_weight
        cls = self.leaf_root[leaves] - S  # (P,) class of each pair
        return _WithinClass.apply(
            input, self.word_weight, self.word_bias, rows, member, cls, self.class_start, self._starts
        )

    def target_log_prob(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        check_targets(target, self.vocab_size)
        S = self._classes.num_shortlist
        leaves = self.word_leaves[target]  # (B, K), -1 padded
        valid = leaves >= 0
        safe = leaves.clamp(min=0)
        root_lp = F.log_softmax(F.linear(input, self.root_weight, self.root_bias), dim=-1)  # (B, S + C)
        lp = root_lp.gather(1, self.leaf_root[safe])  # (B, K) log P(root entry of each membership)
        in_class = valid & (leaves >= S)
        if bool(in_class.any()):
            rows, ks = in_class.nonzero(as_tuple=True)
            within = self._within_class(self.member_input(input), rows, leaves[rows, ks])
            lp = lp.index_put((rows, ks), lp[rows, ks] + within)
        if not self.multi_code:
            return lp[:, 0]
        return torch.logsumexp(lp.masked_fill(~valid, float("-inf")), dim=1)

    def leaf_log_prob(self, input: torch.Tensor) -> torch.Tensor:
        """(B, L) log-probability of every membership, in leaf id order."""
        S = self._classes.num_shortlist
        root_lp = F.log_softmax(F.linear(input, self.root_weight, self.root_bias), dim=-1)  # (B, S + C)
        scores = F.linear(self.member_input(input), self.word_weight, self.word_bias)  # (B, M)
        parts = [root_lp[:, :S]]
        for c in range(self._classes.num_classes):
            s = scores[:, self._starts[c] : self._starts[c + 1]]
            parts.append(root_lp[:, S + c : S + c + 1] + F.log_softmax(s, dim=1))
        return torch.cat(parts, dim=1)

    def log_prob(self, input: torch.Tensor) -> torch.Tensor:
        leaf_lp = self.leaf_log_prob(input)  # (B, L)
        wl = self.word_leaves
        if not self.multi_code:
            return leaf_lp[:, wl[:, 0]]
        lp = leaf_lp[:, wl.clamp(min=0)].masked_fill(wl < 0, float("-inf"))  # (B, V, K)
        return torch.logsumexp(lp, dim=2)

    # ---- search and sampling ----------------------------------------------------------------

    @torch.no_grad()
    def topk(self, input: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k by best-first search over the root entries; ties rank the lower word id
        first; k > V gives all V words, best first.

        Root entries are opened in decreasing probability. A word not yet seen has all its
        memberships under unopened entries, so its probability is at most the sum of the K
        largest unopened entries (K = most memberships of a word); words seen get their exact
        probability (all memberships). The search stops when k seen words are at least that bound.
        """
        from ..search import check_k

        k = check_k(k, self.vocab_size)
        c = self._classes
        S, K = c.num_shortlist, self.word_leaves.shape[1]
        root_lp = F.log_softmax(F.linear(input, self.root_weight, self.root_bias), dim=-1)
        values = input.new_empty(len(input), k)
        indices = torch.empty(len(input), k, dtype=torch.int64, device=input.device)
        for i in range(len(input)):
            h = input[i : i + 1]
            r = root_lp[i]
            order = torch.argsort(r, descending=True, stable=True).tolist()
            rl = r[order]  # root log-probs, decreasing
            found: dict[int, float] = {}
            j = 0
            while j < len(order):
                # open root entries in blocks (one class at a time keeps it simple and exact)
                e = order[j]
                if e < S:
                    new = [int(c.shortlist[e])]
                else:
                    new = c.classes[e - S].tolist()
                new = [w for w in new if w not in found]
                j += 1
                if new:
                    ids = torch.tensor(new, device=input.device)
                    exact = self.target_log_prob(h.expand(len(new), -1), ids)
                    found.update(zip(new, exact.tolist()))
                if len(found) >= k and j < len(order):
                    bound = float(torch.logsumexp(rl[j : j + K], 0))
                    kth = sorted(found.values(), reverse=True)[k - 1]
                    if kth > bound:  # strictly: a tie with an unseen word goes to the full sort
                        break
            best = sorted(found.items(), key=lambda x: (-x[1], x[0]))[:k]
            indices[i] = torch.tensor([w for w, _ in best], device=input.device)
            values[i] = torch.tensor([v for _, v in best], dtype=input.dtype, device=input.device)
        return values, indices

    @torch.no_grad()
    def sample(
        self,
        input: torch.Tensor,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        per_node: bool = False,
    ) -> torch.Tensor:
        """(B,) sampled words: ancestral (a root entry, then a member of its class) when
        ``temperature == 1`` or ``per_node`` (T then applies at both decisions); else the exact
        tempered distribution via ``log_prob`` (O(V d))."""
        from ..sampling import sample_from_log_prob

        if not (temperature > 0 and np.isfinite(temperature)):
            raise ValueError(f"temperature must be a positive number, got {temperature}")
        if not (temperature == 1.0 or per_node):
            return sample_from_log_prob(self.log_prob(input), generator, temperature)
        c = self._classes
        S = c.num_shortlist
        root = F.linear(input, self.root_weight, self.root_bias) / temperature  # (B, S + C)
        entry = _draw(F.softmax(root.float(), dim=-1), generator)  # (B,)
        out = torch.empty_like(entry)
        short = entry < S
        out[short] = self.leaf_word[entry[short]]
        cls = entry - S  # (B,) class of each example (negative for a shortlist entry)
        hm = self.member_input(input)  # (B, m)
        for c in torch.unique(cls[~short]).tolist():  # one draw per class, its examples together
            rows = torch.nonzero(cls == c).squeeze(1)
            a, e = self._starts[c], self._starts[c + 1]
            s = torch.addmm(self.word_bias[a:e], hm[rows], self.word_weight[a:e].t()) / temperature  # (n, |c|)
            m = _draw(F.softmax(s.float(), dim=1), generator)  # (n,)
            out[rows] = self.leaf_word[S + a + m]
        return out


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(B,) one index per row of ``probs`` (B, n), drawn by ``torch.multinomial`` on the generator's
    device (a CPU generator may sample a model on a GPU, as with the other layers), returned on
    ``probs``'s device."""
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.to(generator.device), 1, generator=generator).squeeze(1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def carry_output(src_out, dst_out, leaf_map: np.ndarray) -> None:
    """Copy a class layer's parameters into one over the moved classes: root entries unchanged,
    each member row from the old leaf it came from (``leaf_map``)."""
    S = src_out.classes.num_shortlist
    rows = torch.from_numpy(leaf_map[S:] - S)
    with torch.no_grad():
        dst_out.root_weight.copy_(src_out.root_weight)
        dst_out.root_bias.copy_(src_out.root_bias)
        dst_out.word_weight.copy_(src_out.word_weight[rows])
        if src_out.member_proj is not None:
            dst_out.member_proj.weight.copy_(src_out.member_proj.weight)
        dst_out.word_bias.copy_(src_out.word_bias[rows])

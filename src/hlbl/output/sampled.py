"""Output layers trained by sampling: noise-contrastive estimation and the sampled softmax.

Both layers hold the flat LBL's parameters (one output vector ``q_w`` and bias ``b_w`` per word,
score ``s(w, h) = h . q_w + b_w``) and differ from :class:`~hlbl.output.FlatSoftmax` only in the
*training* loss, which touches the targets' rows and k sampled rows instead of all V:

* ``nce`` (Mnih & Teh 2012): logistic regression of data against k noise words, with the
  normaliser fixed to 1 (the scores are trained to be self-normalised)::

      delta(w) = s(w, h) - log(k Pn(w))
      loss     = -[log sigmoid(delta(target)) + sum_j log sigmoid(-delta(noise_j))]

* ``sampled`` (Bengio & Senecal 2003/2008; Jean et al. 2015): a softmax over the target and the k
  samples with the importance correction ``-log Q(w)`` (Q = the noise distribution), samples equal
  to the example's target removed (their logit set to -inf, an "accidental hit")::

      loss = -log_softmax([s(target) - log Q(target), s(noise_j) - log Q(noise_j) ...])[0]

The noise distribution is the training unigram raised to ``noise_power`` (1 = the unigram, 0.75
as in word2vec), set by :meth:`init_unigram` and saved with the weights (a buffer), so a loaded
model samples as it was trained.

**Shared samples.** k words are drawn (with replacement) once for every ``noise_share``
consecutive examples of the minibatch (default 25; 0 = one draw for the whole minibatch, as
TensorFlow's ``sampled_softmax_loss``/``nce_loss`` do), so a step of B examples gathers B target
rows and ceil(B / noise_share) k noise rows, and its noise scores are a batch of small
(share, d) x (d, k) products. Each example's loss is an unbiased NCE / sampled-softmax estimate
either way (sharing only correlates the noise of the examples of a group). Why not one draw per
minibatch: with the recipe's B = 1000 and momentum, every step then pushes down the same k rows
with the weight of 1000 examples, and on PTB NCE k=25 learned far more slowly (valid perplexity
415 after two epochs of 300k tokens, against 302 with groups of 25 and 297 with a draw per
example; docs/sampling.md), while per-example draws (B k rows gathered and scattered through
autograd) made a step several times slower in PyTorch on the CPU than groups of 25.

**Reproducibility.** Each layer owns a ``torch.Generator`` (no module-level state): the training
loop calls :meth:`reseed` at every epoch with a seed derived from the run's seed and the epoch
(:func:`~hlbl.output.base.noise_seed`), so the same ``--seed`` draws the same samples, and a run
resumed after epoch e draws in epoch e+1 what the uninterrupted run drew (no generator state to
save). (Data-parallel ranks draw for their own shards: the same samples as one process only with
``noise_share`` 0.) Samples are drawn on the CPU (k uniforms and a binary search in the noise CDF,
O(k log V), not O(V)) and moved to the weights' device, so a GPU run draws the same words as a CPU
run.

**Evaluation is exact.** Everything but the training loss goes through the full normalised
softmax over V words: ``log_prob``, ``target_log_prob``, ``topk``, ``sample``, and ``forward`` in
eval mode (``model.eval()``, which :func:`hlbl.evaluate.evaluate` sets). In training mode
``forward`` returns minus the per-example sampled loss as ``output`` (so that ``loss ==
-output.mean()`` as for every layer): a training objective, never a log-probability.
:meth:`log_normaliser` and :meth:`score` expose ``log Z(h)`` and the unnormalised scores for the
self-normalisation report (:func:`hlbl.evaluate.self_normalisation`).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .base import LayerOutput, check_targets, unigram_distribution
from .flat import FlatSoftmax


class SampledOutput(FlatSoftmax):
    """The flat LBL's parameters with a sampled training loss (see the module docstring);
    subclasses give :meth:`sampled_loss`."""

    kind = ""

    def __init__(
        self,
        in_features: int,
        vocab_size: int,
        samples: int = 25,
        noise_power: float = 1.0,
        init_std: float = 0.0,
        generator: torch.Generator | None = None,
        seed: int = 0,
        noise_share: int = 25,
    ):
        super().__init__(in_features, vocab_size, init_std, generator)
        if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
            raise ValueError(f"the {self.kind} output layer needs at least 1 sample, got {samples!r}")
        if not 0 <= noise_power < math.inf:
            raise ValueError(f"the noise power must be >= 0, got {noise_power}")
        if isinstance(noise_share, bool) or not isinstance(noise_share, (int, np.integer)) or noise_share < 0:
            raise ValueError(f"noise_share (examples per noise draw) must be >= 0, got {noise_share!r}")
        self.samples = int(samples)
        self.noise_share = int(noise_share)
        self.noise_power = float(noise_power)
        # log Pn(w), (V,): saved with the weights (persistent buffer). Uniform until init_unigram.
        self.register_buffer("noise_log_prob", torch.full((vocab_size,), -math.log(vocab_size)))
        self._generator = torch.Generator().manual_seed(seed)
        self._cdf_key: tuple | None = None
        self._cdf = torch.empty(0, dtype=torch.float64)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, vocab_size={self.vocab_size}, samples={self.samples}, "
            f"noise_power={self.noise_power}, noise_share={self.noise_share}"
        )

    # ---- noise -----------------------------------------------------------------------------

    def init_unigram(self, counts: Sequence[float]) -> None:
        """Biases = log unigram (as the flat layer: the untrained model starts self-normalised,
        log Z = 0 at zero weights) and the noise distribution = unigram ** noise_power, renormalised."""
        super().init_unigram(counts)
        p = unigram_distribution(counts, self.vocab_size)
        logq = self.noise_power * np.log(p)
        logq -= logq.max() + np.log(np.exp(logq - logq.max()).sum())
        with torch.no_grad():
            self.noise_log_prob.copy_(torch.from_numpy(logq))

    def reseed(self, seed: int) -> None:
        """Restart the noise generator at ``seed`` (the training loop does this every epoch)."""
        self._generator.manual_seed(int(seed))

    def _noise_cdf(self) -> torch.Tensor:
        """(V,) float64 CDF of the noise on the CPU, rebuilt only when the buffer changed (an
        in-place copy from init_unigram or load_state_dict bumps its version)."""
        buf = self.noise_log_prob
        key = (buf.data_ptr(), buf._version, buf.device)
        if key != self._cdf_key:
            p = buf.detach().double().cpu().exp()
            cdf = torch.cumsum(p / p.sum(), 0)
            cdf[-1] = 1.0
            self._cdf, self._cdf_key = cdf, key
        return self._cdf

    def draw_noise(self, groups: int = 1) -> torch.Tensor:
        """(k,) int64 word ids drawn with replacement from the noise distribution by this layer's
        generator, on the weights' device; (groups, k) when ``groups`` > 1."""
        k = self.samples
        u = torch.rand(groups * k, generator=self._generator, dtype=torch.float64)
        ids = torch.searchsorted(self._noise_cdf(), u, right=True).clamp_(max=self.vocab_size - 1)
        return ids.view(groups, k).to(self.weight.device) if groups > 1 else ids.to(self.weight.device)

    # ---- training loss ---------------------------------------------------------------------

    def score(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(B, d), (B,) -> (B,) unnormalised scores ``s(target, h)`` (NOT log-probabilities)."""
        check_targets(target, self.vocab_size)
        return (input * self.weight[target]).sum(1) + self.bias[target]

    def log_normaliser(self, input: torch.Tensor) -> torch.Tensor:
        """(B, d) -> (B,) ``log Z(h) = log sum_w exp s(w, h)`` over the whole vocabulary."""
        return torch.logsumexp(F.linear(input, self.weight, self.bias), dim=-1)

    def sampled_loss(self, input: torch.Tensor, target: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """(B, d), (B,), (k,) shared noise ids -> (B,) per-example training loss."""
        raise NotImplementedError

    def _scores(self, input, target, noise):
        """s(target_i, h_i) (B,), s(noise, h_i) (B, k) and the noise ids per example (B, k).

        ``noise`` (k,) is shared by the whole minibatch; (G, k) gives group g the examples
        [g m, (g+1) m), m = ceil(B / G). Only the used rows are gathered: B target rows and G k
        noise rows (G k << V); the noise scores are one (B, d) x (d, k) product, or G of (m, d) x (d, k)."""
        s_t = (input * self.weight[target]).sum(1) + self.bias[target]  # (B,)
        B = input.shape[0]
        if noise.dim() == 1:
            s_n = F.linear(input, self.weight[noise], self.bias[noise])  # (B, k)
            return s_t, s_n, noise.unsqueeze(0).expand(B, -1)
        G, k = noise.shape
        m = -(-B // G)
        h = F.pad(input, (0, 0, 0, G * m - B)).view(G, m, -1)  # zero rows pad the last group
        s_n = torch.baddbmm(self.bias[noise].unsqueeze(1), h, self.weight[noise].transpose(1, 2))  # (G, m, k)
        return s_t, s_n.reshape(G * m, k)[:B], noise.repeat_interleave(m, 0)[:B]

    def forward(self, input: torch.Tensor, target: torch.Tensor, noise: torch.Tensor | None = None) -> LayerOutput:
        """Training mode: the sampled loss (``noise``: (k,) ids to use instead of drawing; tests).
        Eval mode: the exact log-probabilities, as :class:`FlatSoftmax`."""
        if not self.training:
            return super().forward(input, target)
        check_targets(target, self.vocab_size)
        if noise is None:
            B = input.shape[0]
            groups = 1 if self.noise_share == 0 else -(-B // self.noise_share)  # ceil(B / share)
            noise = self.draw_noise(groups)
        per = self.sampled_loss(input, target, noise)
        return LayerOutput(-per, per.mean())


class NCEOutput(SampledOutput):
    """Noise-contrastive estimation with Z fixed to 1 (Mnih & Teh 2012)."""

    kind = "nce"

    def sampled_loss(self, input, target, noise):
        s_t, s_n, ids = self._scores(input, target, noise)
        log_k = math.log(noise.shape[-1])  # k of this draw
        d_t = s_t - (log_k + self.noise_log_prob[target])  # (B,)
        d_n = s_n - (log_k + self.noise_log_prob[ids])  # (B, k)
        return -(F.logsigmoid(d_t) + F.logsigmoid(-d_n).sum(1))


class SampledSoftmax(SampledOutput):
    """Sampled softmax with the -log Q correction and accidental hits removed (Jean et al. 2015)."""

    kind = "sampled"

    def sampled_loss(self, input, target, noise):
        s_t, s_n, ids = self._scores(input, target, noise)
        logits = torch.cat(
            (
                (s_t - self.noise_log_prob[target]).unsqueeze(1),
                (s_n - self.noise_log_prob[ids]).masked_fill(ids == target.unsqueeze(1), float("-inf")),
            ),
            dim=1,
        )  # (B, 1 + k)
        return -F.log_softmax(logits, dim=1)[:, 0]

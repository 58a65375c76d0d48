"""Linear interpolation of two language models' per-token probabilities.

``p(w) = lambda * p_neural(w) + (1 - lambda) * p_ngram(w)`` for every token, in log space:
``log p = logaddexp(log lambda + log p_neural, log(1 - lambda) + log p_ngram)``.

The weight is tuned on validation tokens by maximising their log-likelihood
``L(lambda) = sum_t log(lambda a_t + (1 - lambda) b_t)``. ``L`` is concave in ``lambda``
(a sum of logs of affine functions), so its derivative
``L'(lambda) = sum_t (a_t - b_t) / (lambda a_t + (1 - lambda) b_t)`` is decreasing and the
maximiser is 0 if ``L'(0) <= 0``, 1 if ``L'(1) >= 0``, and otherwise the unique zero of ``L'``,
found by bisection (60 halvings: far below float precision). Unlike EM, which converges slowly
when the optimum is near 0 or 1, this is exact and takes a fixed number of passes.
"""

from __future__ import annotations

import numpy as np


def _check_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(
            f"per-token log-probabilities must be two 1-D arrays of one length, got {a.shape} and {b.shape}"
        )
    if np.any(np.isnan(a)) or np.any(np.isnan(b)) or np.any(a > 1e-5) or np.any(b > 1e-5):
        raise ValueError("per-token log-probabilities must be <= 0 and not NaN")
    # float32 models can round log(1 - tiny) to a tiny positive number: that is log 1.
    a, b = np.minimum(a, 0.0), np.minimum(b, 0.0)
    both = np.isneginf(a) & np.isneginf(b)
    if np.any(both):
        raise ValueError(f"token {int(np.flatnonzero(both)[0])} has probability 0 under both models")
    return a, b


def interpolate(neural_lp: np.ndarray, ngram_lp: np.ndarray, weight: float) -> np.ndarray:
    """(N,) natural-log probability ``log(w p_neural + (1 - w) p_ngram)`` of each token.

    Both inputs are (N,) natural-log probabilities of the same tokens in the same order.
    """
    a, b = _check_pair(neural_lp, ngram_lp)
    w = float(weight)
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"interpolation weight must be in [0, 1], got {weight}")
    if w == 1.0:
        return a.copy()
    if w == 0.0:
        return b.copy()
    return np.logaddexp(np.log(w) + a, np.log1p(-w) + b)


def _slope(a: np.ndarray, b: np.ndarray, w: float) -> float:
    """dL/dlambda at ``w``, with both probabilities scaled by max(a, b) so nothing overflows."""
    m = np.maximum(a, b)
    pa, pb = np.exp(a - m), np.exp(b - m)  # one of the two is 1 per token
    return float(np.sum((pa - pb) / (w * pa + (1.0 - w) * pb)))


def tune_weight(neural_lp_valid: np.ndarray, ngram_lp_valid: np.ndarray) -> float:
    """The neural weight in [0, 1] that maximises the validation log-likelihood of the mixture."""
    a, b = _check_pair(neural_lp_valid, ngram_lp_valid)
    if len(a) == 0:
        raise ValueError("no validation tokens to tune the interpolation weight on")
    if _slope(a, b, 0.0) <= 0.0:
        return 0.0
    if _slope(a, b, 1.0) >= 0.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _slope(a, b, mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def tune_weights(log_probs: np.ndarray, iters: int = 1000, tol: float = 1e-10) -> np.ndarray:
    """(K,) weights on the simplex maximising the validation log-likelihood of a K-model mixture.

    ``log_probs``: (K, N) natural-log probabilities of the same N tokens under K models. The
    objective ``sum_t log sum_k w_k p_kt`` is concave in ``w``; EM (``w_k <- mean_t of the
    posterior share of model k``) increases it at every step and converges to its maximum. Used
    for three or more models, where the bisection of :func:`tune_weight` does not apply.
    """
    L = np.asarray(log_probs, dtype=np.float64)
    if L.ndim != 2 or L.shape[0] < 2 or L.shape[1] == 0:
        raise ValueError(f"need (K >= 2, N >= 1) per-token log-probabilities, got shape {L.shape}")
    if np.isnan(L).any() or (L > 1e-5).any():
        raise ValueError("per-token log-probabilities must be <= 0 and not NaN")
    m = L.max(0)
    if np.isneginf(m).any():
        raise ValueError(f"token {int(np.flatnonzero(np.isneginf(m))[0])} has probability 0 under every model")
    P = np.exp(L - m)  # (K, N): each token scaled by its best model's probability, so nothing underflows
    w = np.full(L.shape[0], 1.0 / L.shape[0])
    for _ in range(iters):
        new = w * (P / (w @ P)).mean(1)
        done = np.abs(new - w).max() < tol
        w = new / new.sum()
        if done:
            break
    return w


def interpolate_many(log_probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(N,) ``log sum_k w_k p_k`` of each token for (K, N) log-probabilities and (K,) weights."""
    L = np.asarray(log_probs, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (L.shape[0],) or (w < 0).any() or not np.isclose(w.sum(), 1.0):
        raise ValueError(f"need {L.shape[0]} non-negative weights summing to 1, got {w.tolist()}")
    keep = w > 0  # a weight of 0 drops its model (0 x a probability of 0 is no -inf)
    with np.errstate(divide="ignore"):
        return np.logaddexp.reduce(np.log(w[keep])[:, None] + L[keep], axis=0)

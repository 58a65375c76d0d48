"""Estimating interpolated modified Kneser-Ney from an integer token stream, with numpy.

See the package docstring (:mod:`hlbl.ngram`) for the formulas. Counting works on the padded
sequence ``<s> w_1 .. w_n </s>`` of every sentence laid end to end (T = N + S positions for N
tokens in S sentences). Per position ``i`` and order ``k`` we keep the table row of the
``k``-gram ending at ``i`` (-1 when that window would reach back past the sentence's ``<s>``);
order ``k``'s keys are ``row_{k-1}[i-1] * V' + seq[i]``, and one ``np.unique`` over them gives
the ``k``-gram types, their raw counts and each position's row. No Python loop runs per n-gram.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data import DataError, Vocab
from ..progress import progress
from .model import BOS_WORD, EOS_WORD, NgramModel, arpa_word

# KenLM's --discount_fallback values, used for an order whose counts of counts cannot give
# discounts (tiny or artificial data).
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


def modified_kn_discounts(adjusted: np.ndarray) -> tuple[tuple[float, float, float], bool]:
    """``((D1, D2, D3+), ok)`` from the adjusted counts of one order (Chen & Goodman eq. 26).

    ``n_j`` = number of n-grams with adjusted count j; ``Y = n1 / (n1 + 2 n2)``;
    ``D_j = j - (j + 1) Y n_{j+1} / n_j``. ``ok`` is False (and the fallback returned) when some
    ``n_j`` (j = 1..3) is 0 or a discount falls outside ``[0, j]``, as KenLM would refuse.
    """
    n = np.bincount(np.minimum(adjusted[adjusted > 0], 5), minlength=6).astype(np.float64)
    if n[1] == 0 or n[2] == 0 or n[3] == 0:
        return FALLBACK_DISCOUNTS, False
    y = n[1] / (n[1] + 2.0 * n[2])
    d = tuple(float(j - (j + 1) * y * n[j + 1] / n[j]) for j in (1, 2, 3))
    if any(not (0.0 <= dj <= j) for j, dj in zip((1, 2, 3), d)):
        return FALLBACK_DISCOUNTS, False
    return d, True  # type: ignore[return-value]


def _discount_vector(d: tuple[float, float, float]) -> np.ndarray:
    """Discount by adjusted count, indexed by min(count, 3): D(0) = 0 (unseen words)."""
    return np.asarray([0.0, d[0], d[1], d[2]], dtype=np.float64)


def check_vocab(vocab) -> None:
    """DataError if ``vocab`` holds a token that ARPA files reserve for sentence boundaries."""
    for reserved in (BOS_WORD, EOS_WORD):
        if reserved in vocab.index:
            raise DataError(f"the vocabulary contains the token {reserved}, which ARPA files reserve")


@dataclass
class _Counts:
    """The n-gram types of every order, as counted from the padded sequence.

    Per order k (list index k-1): ``ctx`` the row of the (k-1)-gram context, ``word`` the last word,
    ``raw`` the raw count, ``suffix`` the row of the suffix (k-1)-gram, ``starts_bos`` whether the
    n-gram starts with ``<s>``. Order 1 is dense over word ids (its ``ctx`` and ``suffix`` are empty).
    """

    ctx: list
    word: list
    raw: list
    suffix: list
    starts_bos: list


def _checked_stream(stream: np.ndarray, vocab: Vocab, order: int) -> np.ndarray:
    """The training stream as an array, after the checks a user's input can fail (DataError)."""
    if not isinstance(order, (int, np.integer)) or order < 1:
        raise DataError(f"n-gram order must be a positive integer, got {order!r}")
    check_vocab(vocab)
    stream = np.asarray(stream)
    if stream.ndim != 1 or len(stream) == 0:
        raise DataError("the training stream is empty")
    if stream.min() < 0 or stream.max() >= len(vocab):
        raise DataError("the training stream has ids outside the vocabulary")
    return stream


def _padded(stream: np.ndarray, bos: int, eos: int, idx) -> tuple[np.ndarray, np.ndarray]:
    """(seq (T,), pos (T,)): every sentence as ``<s> w_1 .. w_n </s>``, and each position's offset
    from its sentence's ``<s>`` (how far back an n-gram ending there may reach)."""
    is_start = np.zeros(len(stream), dtype=bool)
    is_start[0] = True
    is_start[1:] = stream[:-1] == eos
    starts = np.flatnonzero(is_start)
    seq = np.insert(stream, starts, bos)
    bos_at = starts + np.arange(len(starts))
    last_bos = np.zeros(len(seq), dtype=idx)
    last_bos[bos_at] = bos_at
    pos = np.arange(len(seq), dtype=idx) - np.maximum.accumulate(last_bos)
    return seq, pos


def _count(seq: np.ndarray, pos: np.ndarray, order: int, base: int, bos: int, idx) -> _Counts:
    """The n-gram types of orders 1..``order`` and their raw counts: one ``np.unique`` per order
    over the keys ``row_{k-1}[i-1] * V' + seq[i]`` of the windows that stay inside a sentence."""
    counts = _Counts(
        ctx=[np.zeros(0, np.int64)],
        word=[np.arange(base, dtype=np.int64)],
        raw=[np.bincount(seq[pos >= 1], minlength=base).astype(np.int64)],
        suffix=[np.zeros(0, np.int64)],
        starts_bos=[np.arange(base) == bos],
    )
    row_prev = seq  # (T,) row of the unigram ending at each position: the word id itself
    # Each order sorts all T windows (a minute on 50M tokens): the heartbeat keeps the log moving.
    bar = progress(order, "counting n-grams", "order", heartbeat=True)
    bar.update(1)
    for k in range(2, order + 1):
        at = np.flatnonzero(pos >= k - 1)  # windows of length k that stay inside a sentence
        if len(at) == 0:
            raise DataError(f"no sentence is long enough for {k}-grams; lower the order (order={order})")
        key = row_prev[at - 1].astype(np.int64) * base + seq[at]  # int64: rows x V' can pass 2^31
        uniq, first, inv, cnt = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        del key
        counts.ctx.append((uniq // base).astype(idx))
        counts.word.append((uniq % base).astype(idx))
        del uniq
        counts.raw.append(cnt.astype(np.int64))
        counts.suffix.append(row_prev[at[first]].astype(idx))
        counts.starts_bos.append(seq[at[first] - (k - 1)] == bos)
        row = np.full(len(seq), -1, dtype=idx)
        row[at] = inv.reshape(-1)
        row_prev = row
        del at, first, inv, cnt
        bar.update(1)
    bar.close()
    return counts


def _adjusted(counts: _Counts, order: int) -> list[np.ndarray]:
    """Adjusted counts per order: raw at the top order and for n-grams starting with <s> (nothing
    can precede <s>); otherwise the continuation count N1+(. w_1..w_k) = number of distinct
    (k+1)-gram types that end in this k-gram, i.e. distinct words seen to its left."""
    adjusted: list[np.ndarray] = []
    for k in range(1, order + 1):
        if k == order:
            a = counts.raw[k - 1].copy()
        else:
            a = np.bincount(counts.suffix[k], minlength=len(counts.raw[k - 1])).astype(np.int64)
            a[counts.starts_bos[k - 1]] = counts.raw[k - 1][counts.starts_bos[k - 1]]
        adjusted.append(a)
    return adjusted


def _interpolate(
    adjusted: list[np.ndarray], discounts: list, counts: _Counts, bos: int, V: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(probs, backoffs) per order: each order's discounted estimate interpolated with the order
    below, its back-off weight gamma(context) as log10 (0 for a context never seen)."""
    order = len(adjusted)
    bar = progress(order, "estimating", "order", heartbeat=True)
    # Unigrams: interpolate with the uniform distribution over the V predictable words
    # (<s> excluded; words of count 0, such as an unused <unk>, get only the uniform share).
    a1 = adjusted[0]
    a1[bos] = 0
    dv = _discount_vector(discounts[0])
    cap = np.minimum(a1, 3)
    total = float(a1.sum())
    gamma0 = float(np.sum(dv[cap] * (a1 > 0))) / total
    p = (a1 - dv[cap]) / total + gamma0 / V
    probs = [p]
    backoffs: list[np.ndarray] = []
    bar.update(1)
    for k in range(2, order + 1):
        a = adjusted[k - 1]
        ctx = counts.ctx[k - 1]
        n_ctx = len(probs[-1])
        dv = _discount_vector(discounts[k - 1])
        cap = np.minimum(a, 3)
        # Per context c: denominator sum_w a(c w); gamma(c) = sum_w D(a(c w)) / denominator.
        denom = np.bincount(ctx, weights=a, minlength=n_ctx)
        mass = np.bincount(ctx, weights=dv[cap], minlength=n_ctx)
        is_ctx = denom > 0
        gamma = np.ones(n_ctx)
        gamma[is_ctx] = mass[is_ctx] / denom[is_ctx]
        p = (a - dv[cap]) / denom[ctx] + gamma[ctx] * probs[-1][counts.suffix[k - 1]]
        probs.append(p)
        backoffs.append(np.where(is_ctx, np.log10(gamma), 0.0))
        bar.update(1)
    backoffs.append(np.zeros(len(probs[-1])))
    bar.close()
    return probs, backoffs


def train_kneser_ney(stream: np.ndarray, vocab: Vocab, order: int = 5) -> NgramModel:
    """Interpolated modified Kneser-Ney of ``order`` on a training stream of ``vocab`` ids.

    ``stream`` is our split format (each line's tokens then one ``<eos>``); ``<eos>`` becomes
    ``</s>`` and every sentence is padded on the left with one ``<s>``. The model's word ids
    are ``vocab``'s, plus ``<s>`` as id ``len(vocab)``.
    """
    stream = _checked_stream(stream, vocab, order)
    V = len(vocab)
    bos, base = V, V + 1
    # Positions, rows and ids fit int32 below 2^31 padded tokens: half the memory of int64.
    idx = np.int32 if 2 * len(stream) < np.iinfo(np.int32).max else np.int64
    seq, pos = _padded(stream.astype(idx), bos, vocab.eos, idx)
    counts = _count(seq, pos, order, base, bos, idx)
    del seq, pos
    adjusted = _adjusted(counts, order)
    counts.raw = counts.starts_bos = None  # only the adjusted counts are needed from here
    discounts = [modified_kn_discounts(a)[0] for a in adjusted]
    probs, backoffs = _interpolate(adjusted, discounts, counts, bos, V)
    del adjusted
    counts.suffix = None
    log10_prob = [np.log10(p, out=p) for p in probs]  # in place: no second float64 copy per order
    log10_prob[0][bos] = -99.0  # <s> is only ever a context (the ARPA convention)
    keys = [np.arange(base, dtype=np.int64)]
    for k in range(1, order):
        keys.append(counts.ctx[k].astype(np.int64) * base + counts.word[k])
        counts.ctx[k] = counts.word[k] = None  # freed as each order's keys are made
    words = tuple(arpa_word(w) for w in vocab.words) + (BOS_WORD,)
    return NgramModel(words, keys, log10_prob, backoffs, discounts=[tuple(d) for d in discounts])

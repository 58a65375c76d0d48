"""The back-off n-gram model in memory, and scoring with it (ARPA semantics).

Storage, per order ``k`` (list position ``k - 1``):

* ``keys[k-1]``: sorted ``int64`` array, one entry per ``k``-gram. Order 1 is dense: the unigram
  of word id ``w`` is entry ``w`` (``keys[0] = arange(V')``). For ``k >= 2`` the key of
  ``w_1..w_k`` is ``index(w_1..w_{k-1}) * V' + w_k``, where ``index`` is the row of the context
  ``(k-1)``-gram in its own order's table. Keys stay below ``n_{k-1} * V'`` (about 1e10 on PTB),
  so any order fits in int64 where packing all ``k`` word ids in base ``V'`` would not
  (``10001**5 > 2**63``). Because the context rows are themselves sorted lexicographically,
  sorting keys sorts the ``k``-grams lexicographically.
* ``log10_prob[k-1]``, ``log10_backoff[k-1]``: float64, aligned with ``keys``; a back-off of 0
  (weight 1) where the n-gram is not a context.

Values: a log10 probability is at most 0 (or -inf), a log10 back-off within +-MAX_LOG10_BACKOFF,
and the unigram probabilities sum to at most 1 (the readers refuse other values). A back-off can
still make the back-off rule give a probability above 1 (a valid model's weights never do):
scoring refuses that, naming the model and the n-gram, rather than report a perplexity below 1.

Every context of a stored n-gram is itself stored (``read_arpa`` adds "blank" entries where a
file omits one), so looking an n-gram up is a chain of ``k - 1`` binary searches.

Scoring follows the ARPA back-off rule::

    log p(w | h) = log p*(h' w) + sum of log bo(g)  over the contexts g of h that are longer than h'

where ``h' w`` is the longest stored n-gram ending the history ``h w``, and a context that is not
stored has back-off weight 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..data import EOS, UNK, DataError, Vocab
from ..progress import progress

BOS_WORD = "<s>"
EOS_WORD = "</s>"  # the ARPA name of our <eos>
UNK_WORD = UNK
LN10 = float(np.log(10.0))
MAX_LOG10_BACKOFF = 100.0  # beyond any real model's weights, and the -99/-100 "log 0" conventions
UNIGRAM_MASS_SLACK = 1e-3  # unigram probabilities may sum to 1 + this (values are rounded in files)
OVER_ONE_SLACK = 1e-4  # a log10 probability up to this is rounding, read as 0; above it, an error


def arpa_word(word: str) -> str:
    """Our vocabulary word -> its ARPA spelling (only ``<eos>`` changes)."""
    return EOS_WORD if word == EOS else word


@dataclass
class NgramModel:
    """A back-off n-gram model; word ids are positions in ``words`` (which holds ``<s>``)."""

    words: tuple[str, ...]
    keys: list[np.ndarray]
    log10_prob: list[np.ndarray]
    log10_backoff: list[np.ndarray]
    # (D1, D2, D3+) per order when the model was estimated here; None when read from ARPA.
    discounts: list[tuple[float, float, float]] | None = None
    _index: dict[str, int] | None = field(default=None, repr=False, compare=False)
    source: str | None = field(default=None, repr=False, compare=False)  # the file, for messages
    # How the text was read (blank lines, vocabulary rule: hlbl.ngram.protocol); None if unknown.
    protocol: dict | None = field(default=None, compare=False)

    def __post_init__(self):
        if not (len(self.keys) == len(self.log10_prob) == len(self.log10_backoff) >= 1):
            raise ValueError("an n-gram model needs aligned tables for each order >= 1")
        for name in (BOS_WORD, UNK_WORD):
            if name not in self.index:
                raise ValueError(f"n-gram model vocabulary lacks {name}")

    # ---------------------------------------------------------------- vocabulary
    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {w: i for i, w in enumerate(self.words)}
        return self._index

    @property
    def order(self) -> int:
        return len(self.keys)

    @property
    def base(self) -> int:
        """V', the number of word ids (the radix of the keys)."""
        return len(self.words)

    @property
    def bos(self) -> int:
        return self.index[BOS_WORD]

    @property
    def unk(self) -> int:
        return self.index[UNK_WORD]

    @property
    def eos(self) -> int | None:
        return self.index.get(EOS_WORD)

    def sizes(self) -> list[int]:
        """Number of n-grams of each order."""
        return [len(k) for k in self.keys]

    def as_vocab(self) -> Vocab:
        """The model's own vocabulary as one of ours (``</s>`` is our ``<eos>``; ``<s>`` is no
        word of a stream), so that every word the model knows is scored as itself, as KenLM's
        ``query`` does, whatever vocabulary options built it. Counts are unknown: zero."""
        words = [EOS, UNK] + [w for w in self.words if w not in (BOS_WORD, EOS_WORD, UNK, EOS)]
        return Vocab(tuple(words), (0,) * len(words))

    def word_ids(self, tokens: Sequence[str]) -> np.ndarray:
        """ARPA-spelled tokens -> model ids (unknown words -> ``<unk>``)."""
        index, unk = self.index, self.unk
        return np.asarray([index.get(t, unk) for t in tokens], dtype=np.int64)

    def vocab_map(self, vocab_words: Sequence[str]) -> np.ndarray:
        """(V,) model id of each word of one of our vocabularies (``<eos>`` -> ``</s>``).

        A vocabulary word literally spelled ``<s>`` or ``</s>`` is not the ARPA symbol: ``<unk>``.
        """
        index, unk = self.index, self.unk
        out = np.empty(len(vocab_words), dtype=np.int64)
        for i, w in enumerate(vocab_words):
            out[i] = unk if w in (BOS_WORD, EOS_WORD) else index.get(arpa_word(w), unk)
        return out

    # ---------------------------------------------------------------- lookup
    def lookup_rows(self, rows: np.ndarray) -> np.ndarray:
        """(L,) table row of each n-gram in ``rows`` (L, k) of word ids, or -1 if not stored.

        A word id of -1 (padding) never matches.
        """
        rows = np.asarray(rows, dtype=np.int64)
        k = rows.shape[1]
        if k > self.order:
            return np.full(len(rows), -1, dtype=np.int64)
        idx = np.where((rows[:, 0] >= 0) & (rows[:, 0] < self.base), rows[:, 0], -1)
        for j in range(1, k):
            idx = self._extend(idx, rows[:, j], j + 1)
        return idx

    def _extend(self, ctx_idx: np.ndarray, word: np.ndarray, k: int) -> np.ndarray:
        """Rows in the order-``k`` table of ``(context row, word)`` pairs; -1 where absent."""
        if k > len(self.keys) or len(self.keys[k - 1]) == 0:  # nothing stored at this order
            return np.full(len(ctx_idx), -1, dtype=np.int64)
        keys = self.keys[k - 1]
        ok = (ctx_idx >= 0) & (word >= 0)
        key = np.where(ok, ctx_idx, 0) * self.base + np.where(ok, word, 0)
        pos = np.searchsorted(keys, key)
        pos_c = np.minimum(pos, len(keys) - 1)
        found = ok & (pos < len(keys)) & (keys[pos_c] == key)
        return np.where(found, pos_c, -1)

    def lookup(self, ngram: Sequence[str]) -> tuple[float, float] | None:
        """``(log10 prob, log10 backoff)`` stored for an n-gram of ARPA words, or None."""
        ids = [self.index.get(w, -1) for w in ngram]
        if not ids or len(ids) > self.order:
            return None
        i = int(self.lookup_rows(np.asarray([ids]))[0])
        if i < 0:
            return None
        k = len(ids) - 1
        return float(self.log10_prob[k][i]), float(self.log10_backoff[k][i])

    # ---------------------------------------------------------------- scoring
    def score_windows(self, windows: np.ndarray, max_order: int | None = None) -> np.ndarray:
        """(L,) log10 p(last column | the columns before it), by the ARPA back-off rule.

        ``windows`` is (L, n) word ids, the target in the last column and its history to the
        left, -1 where there is no history (left padding). Only the last ``order - 1`` history
        words matter. ``max_order`` scores as a model of that order whose tables above the
        built ones are empty (ARPA loading scores "blank" k-grams with k - 1 tables built).
        """
        top = self.order if max_order is None else max_order
        w = np.asarray(windows, dtype=np.int64)
        if w.shape[1] > top:
            w = w[:, w.shape[1] - top :]
        L, n = w.shape
        target = w[:, -1]
        if np.any((target < 0) | (target >= self.base)):
            raise ValueError("score_windows: every target must be a word id")
        # ctx[j]: row of the length-j context w[:, n-1-j : n-1] (j >= 1); hit[k]: row of the
        # k-gram ending at the target. One chain of binary searches per start column s
        # yields the context of length n-1-s and then the target n-gram of order n-s.
        ctx: dict[int, np.ndarray] = {}
        hit: dict[int, np.ndarray] = {1: target}
        for s in range(n - 1):
            idx = np.where(w[:, s] >= 0, w[:, s], -1)
            for col in range(s + 1, n - 1):
                idx = self._extend(idx, w[:, col], col - s + 1)
            ctx[n - 1 - s] = idx
            hit[n - s] = self._extend(idx, target, n - s)
        out = np.zeros(L, dtype=np.float64)
        done = np.zeros(L, dtype=bool)  # the longest stored n-gram has been found
        # From the longest order down: until a hit, add the back-off of the context we leave.
        for k in range(n, 0, -1):
            h = hit[k]
            new = ~done & (h >= 0)
            if new.any():
                out[new] += self.log10_prob[k - 1][h[new]]
            done |= new
            if k >= 2:
                c = ctx[k - 1]
                miss = ~done & (c >= 0)
                out[miss] += self.log10_backoff[k - 2][c[miss]]
        if len(out) and out.max() > 0:
            self._refuse_over_one(w, out)
            np.minimum(out, 0.0, out=out)
        return out

    def _refuse_over_one(self, windows: np.ndarray, log10_p: np.ndarray) -> None:
        """A probability above 1 (beyond rounding) comes from back-off weights no distribution has."""
        j = int(np.argmax(log10_p))
        if log10_p[j] <= OVER_ONE_SLACK:
            return
        history = " ".join(self.words[x] for x in windows[j, :-1] if x >= 0)
        raise DataError(
            f"{self.source or 'the n-gram model'} gives {self.words[windows[j, -1]]!r} after {history!r} "
            f"log10 probability {log10_p[j]:.6g} (above 0): its back-off weights make no distribution"
        )

    def stream_windows(self, ids: np.ndarray, starts: np.ndarray, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """(hi - lo, order) windows for the targets ``ids[lo:hi]`` of a stream of model ids.

        ``starts`` (N,) is the position of the first token of each token's sentence; that
        token's context is ``<s>``, and nothing before ``<s>`` is seen.
        """
        ids = np.asarray(ids, dtype=np.int64)
        hi = len(ids) if hi is None else hi
        n = self.order
        t = np.arange(lo, hi)
        st = np.asarray(starts[lo:hi])
        win = np.full((hi - lo, n), -1, dtype=np.int64)
        for j in range(n):  # column n-1-j holds the token j places back
            src = t - j
            inside = src >= st
            win[inside, n - 1 - j] = ids[src[inside]]
            win[src == st - 1, n - 1 - j] = self.bos
        return win

    def score_sentences(self, sentences: Sequence[Sequence[str]], eos: bool = True) -> np.ndarray:
        """log10 probability of each sentence (ARPA words), with ``<s>`` context and ``</s>``.

        The same numbers as KenLM's ``Model.score(sentence, bos=True, eos=True)``.
        """
        out = np.zeros(len(sentences), dtype=np.float64)
        parts, owner = [], []
        for i, sent in enumerate(sentences):
            ids = list(self.word_ids(sent))
            if eos:
                if self.eos is None:
                    raise ValueError("this model has no </s>")
                ids.append(self.eos)
            parts.append(np.asarray(ids, dtype=np.int64))
            owner.append(np.full(len(ids), i))
        if not parts:
            return out
        ids = np.concatenate(parts)
        owner = np.concatenate(owner)
        lens = np.asarray([len(p) for p in parts])
        starts = np.repeat(np.cumsum(lens) - lens, lens)
        lp = self.score_windows(self.stream_windows(ids, starts))
        np.add.at(out, owner, lp)
        return out


def unigram_mass(log10_prob: np.ndarray) -> float:
    """The sum of the unigram probabilities (at most 1 in a valid model)."""
    with np.errstate(under="ignore"):
        return float(np.sum(10.0 ** np.asarray(log10_prob, dtype=np.float64)))


def sentence_starts(stream: np.ndarray, eos: int) -> np.ndarray:
    """(N,) position of the first token of each token's sentence (sentences end at ``eos``)."""
    stream = np.asarray(stream)
    n = len(stream)
    is_start = np.zeros(n, dtype=bool)
    if n:
        is_start[0] = True
        is_start[1:] = stream[:-1] == eos
    return np.maximum.accumulate(np.where(is_start, np.arange(n), 0)) if n else np.zeros(0, np.int64)


def stream_log10(model: NgramModel, stream: np.ndarray, vocab_words: Sequence[str], eos: int) -> np.ndarray:
    """(N,) log10 probability of every token of a split stream of our vocabulary's ids.

    The stream is cut into sentences after each ``eos`` id; each sentence is scored from ``<s>``
    and its ``<eos>`` is predicted as ``</s>``, so all N tokens are predicted, in stream order.
    """
    stream = np.asarray(stream)
    if stream.ndim != 1:
        raise DataError("a token stream must be one-dimensional")
    if len(stream) and (stream.min() < 0 or stream.max() >= len(vocab_words)):
        raise DataError("the token stream has ids outside the vocabulary")
    ids = model.vocab_map(vocab_words)[stream.astype(np.int64)]
    starts = sentence_starts(stream, eos)
    out = np.empty(len(stream), dtype=np.float64)
    chunk = 1 << 18  # bounds the (chunk, order) window array
    bar = progress(len(stream), "n-gram scoring", "w", show=len(stream) > 4 * chunk)  # seconds a chunk on 10^8 n-grams
    for lo in range(0, len(stream), chunk):
        hi = min(lo + chunk, len(stream))
        out[lo:hi] = model.score_windows(model.stream_windows(ids, starts, lo, hi))
        bar.update(hi - lo)
    bar.close()
    return out

"""Scoring sentences with a trained model, and encoding contexts from words.

The protocol of :func:`score_sentences`: each sentence is scored independently as its tokens
followed by ``<eos>``; the context of its first token is all ``<eos>`` (as at the start of a
corpus stream), so a sentence's score does not depend on its neighbours. Words outside the
vocabulary are scored as ``<unk>`` and counted. Log-probabilities are reported in base 10, as
KenLM's ``query`` does; perplexity is ``10 ** (-total log10 prob / tokens)``, with every token
(``<eos>`` and ``<unk>`` included) counted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, NamedTuple, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch


class SentenceScore(NamedTuple):
    log10_prob: float  # log10 P(tokens + <eos>) from an all-<eos> context
    tokens: int  # words + 1 for <eos>
    oov: int  # words not in the vocabulary (scored as <unk>)


class TokenScores(NamedTuple):
    """Per-token scores of sentences under the protocol of :func:`score_sentences`."""

    log_probs: np.ndarray  # (T,) natural-log probability of each scored token, sentence after sentence
    lengths: np.ndarray  # (S,) tokens of each sentence: its words + 1 for <eos>
    oov: np.ndarray  # (S,) words of each sentence not in the vocabulary (scored as <unk>)

    def sentences(self) -> list[SentenceScore]:
        """Each sentence's total (log10), tokens and out-of-vocabulary count."""
        owner = np.repeat(np.arange(len(self.lengths)), self.lengths)
        per_sent = np.bincount(owner, weights=self.log_probs, minlength=len(self.lengths)) / math.log(10.0)
        return [SentenceScore(float(p), int(n), int(o)) for p, n, o in zip(per_sent, self.lengths, self.oov)]

    def log10_per_sentence(self) -> list[np.ndarray]:
        """Each sentence's per-token log10 probabilities: its words, then ``<eos>``."""
        return np.split(self.log_probs / math.log(10.0), np.cumsum(self.lengths)[:-1]) if len(self.lengths) else []


def encode_sentences(vocab, sentences: Iterable[str | Sequence[str]]) -> tuple[list[list[int]], np.ndarray]:
    """Each sentence's word ids (strings split on whitespace; unknown words as ``<unk>``) and
    its number of out-of-vocabulary words."""
    ids, oov = [], []
    for sent in sentences:
        toks = sent.split() if isinstance(sent, str) else list(sent)
        i, o = vocab.encode_counting_oov(toks)
        ids.append(i)
        oov.append(o)
    return ids, np.asarray(oov, dtype=np.int64)


def token_scores(
    model,
    vocab,
    sentences: Iterable[str | Sequence[str]],
    batch_size: int = 4096,
    device: str | torch.device | None = None,
    contexts: Sequence[str | Sequence[str] | None] | None = None,
) -> TokenScores:
    """Every token's log-probability under the protocol of :func:`score_sentences`.

    ``contexts`` (one per sentence, or None): text read before a sentence instead of the
    all-``<eos>`` start, as the training stream has it: the text's words then ``<eos>`` (the
    previous line), of which the model sees the last ``n``; those tokens are not scored. None
    (for all, or for one sentence) is the protocol's all-``<eos>`` context."""
    from .evaluate import token_log_probs

    eos = vocab.eos
    n = model.config.context
    if device is None and hasattr(model, "parameters"):  # a torch model's own device (a NumpyLBL has none)
        device = next(model.parameters()).device
    encoded, oov = encode_sentences(vocab, sentences)
    lengths = np.asarray([len(ids) + 1 for ids in encoded], dtype=np.int64)
    if not encoded:
        return TokenScores(np.zeros(0), lengths, oov)
    pads = _pads(vocab, n, contexts, len(encoded))
    # One stream for all sentences, each behind n tokens that are not scored: the stream scorer
    # (the numba one on the CPU, as for `hlbl eval`) then sees every sentence from an all-<eos>
    # context (or its given one), as if it stood alone.  [eos]*n w1 .. wk eos  [eos]*n w1 ..
    stream = np.fromiter((w for pad, ids in zip(pads, encoded) for w in pad + ids + [eos]), dtype=np.int32)
    scored = np.ones(len(stream), dtype=bool)  # False on the n padding tokens before each sentence
    starts = np.concatenate([[0], np.cumsum(lengths + n)[:-1]])
    scored[(starts[:, None] + np.arange(n)).reshape(-1)] = False
    return TokenScores(token_log_probs(model, stream, eos, batch_size, device or "cpu")[scored], lengths, oov)


def _pads(vocab, n: int, contexts, count: int) -> list[list[int]]:
    """The n unscored ids before each sentence: all ``<eos>``, or the last n of a context's words then ``<eos>``."""
    start = [vocab.eos] * n
    if contexts is None:
        return [start] * count
    if len(contexts) != count:
        raise ValueError(f"{len(contexts)} contexts for {count} sentences")
    pads = []
    for ctx in contexts:
        if ctx is None or n == 0:
            pads.append(start)
            continue
        ids = vocab.encode(ctx.split() if isinstance(ctx, str) else list(ctx))
        pads.append((start + ids + [vocab.eos])[-n:])
    return pads


def ngram_token_scores(ngram, vocab, sentences: Iterable[str | Sequence[str]]) -> TokenScores:
    """The same for a back-off n-gram model (:class:`hlbl.ngram.NgramModel`), as KenLM's
    ``query`` scores a line: each sentence from ``<s>``, its ``<eos>`` predicted as ``</s>``.

    Words are read through ``vocab`` (one of ours: the model's own, :meth:`NgramModel.as_vocab`,
    scores every word the model knows as itself); a word of ``vocab`` the model lacks gets its
    ``<unk>`` probability."""
    from .ngram.model import LN10, stream_log10

    encoded, oov = encode_sentences(vocab, sentences)
    lengths = np.asarray([len(ids) + 1 for ids in encoded], dtype=np.int64)
    # Each sentence's ids then <eos>: the stream scorer cuts sentences at <eos> and starts each from <s>.
    stream = np.fromiter((w for ids in encoded for w in ids + [vocab.eos]), dtype=np.int64)
    return TokenScores(stream_log10(ngram, stream, vocab.words, vocab.eos) * LN10, lengths, oov)


def score_sentences(
    model,
    vocab,
    sentences: Iterable[str | Sequence[str]],
    batch_size: int = 4096,
    device: str | torch.device | None = None,
) -> list[SentenceScore]:
    """Score each sentence independently: its tokens, then ``<eos>``, context padded with ``<eos>``.

    ``sentences`` are strings (split on whitespace) or token lists. Blank sentences are scored
    too (just ``<eos>``); the CLI skips blank lines, as corpus loading does. A mixture of runs and
    an n-gram model scores the same way: :meth:`hlbl.mixture.Mixture.score`.
    """
    return token_scores(model, vocab, sentences, batch_size, device).sentences()


def score_report(scores: Sequence[SentenceScore]) -> dict:
    """Totals: ``{"log10_prob", "tokens", "sentences", "oov", "perplexity"}`` (all tokens counted)."""
    total = float(sum(s.log10_prob for s in scores))
    tokens = int(sum(s.tokens for s in scores))
    if tokens == 0:
        raise ValueError("no sentences to score")
    return {
        "log10_prob": total,
        "tokens": tokens,
        "sentences": len(scores),
        "oov": int(sum(s.oov for s in scores)),
        "perplexity": 10.0 ** (-total / tokens),
    }


def is_sentence(line: str, blank_lines: str) -> bool:
    """Whether ``line`` is a sentence to score under the blank-line rule (hlbl.data's module
    docstring): with ``keep`` every line is (a blank one: an empty sentence, scored as ``<eos>``);
    with ``drop`` only a line with a word. ``hlbl score`` and ``hlbl serve`` both read by it."""
    return blank_lines == "keep" or bool(line.strip())


def encode_context(vocab, tokens: Sequence[str], n: int) -> tuple[list[int], int]:
    """The last ``n`` word ids of ``tokens`` left-padded with ``<eos>`` (a sentence start), and
    the number of out-of-vocabulary tokens (mapped to ``<unk>``)."""
    ids, oov = vocab.encode_counting_oov(tokens)
    return ([vocab.eos] * n + ids)[-n:] if n > 0 else [], oov


__all__ = [
    "SentenceScore",
    "TokenScores",
    "encode_context",
    "encode_sentences",
    "is_sentence",
    "ngram_token_scores",
    "score_report",
    "score_sentences",
    "token_scores",
]

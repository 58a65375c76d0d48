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
from typing import Iterable, NamedTuple, Sequence

import numpy as np
import torch


class SentenceScore(NamedTuple):
    log10_prob: float  # log10 P(tokens + <eos>) from an all-<eos> context
    tokens: int  # words + 1 for <eos>
    oov: int  # words not in the vocabulary (scored as <unk>)


def score_sentences(
    model,
    vocab,
    sentences: Iterable[str | Sequence[str]],
    batch_size: int = 4096,
    device: str | torch.device | None = None,
) -> list[SentenceScore]:
    """Score each sentence independently: its tokens, then ``<eos>``, context padded with ``<eos>``.

    ``sentences`` are strings (split on whitespace) or token lists. Blank sentences are scored
    too (just ``<eos>``); the CLI skips blank lines, as corpus loading does.
    """
    from .evaluate import token_log_probs

    eos = vocab.eos
    n = model.config.context
    device = device if device is not None else next(model.parameters()).device
    # One stream for all sentences, each behind n <eos> that are not scored: the stream scorer
    # (the numba one on the CPU, as for `hlbl eval`) then sees every sentence from an all-<eos>
    # context, as if it stood alone.  [eos]*n w1 .. wk eos  [eos]*n w1 ..
    pieces, lengths, result_oov = [], [], []
    for sent in sentences:
        toks = sent.split() if isinstance(sent, str) else list(sent)
        ids, oov = vocab.encode_counting_oov(toks)
        result_oov.append(oov)
        pieces.append([eos] * n + ids + [eos])
        lengths.append(len(ids) + 1)
    if not pieces:
        return []
    stream = np.fromiter((w for p in pieces for w in p), dtype=np.int32)
    lengths = np.asarray(lengths, dtype=np.int64)
    scored = np.ones(len(stream), dtype=bool)  # False on the n padding tokens before each sentence
    starts = np.concatenate([[0], np.cumsum(lengths + n)[:-1]])
    scored[(starts[:, None] + np.arange(n)).reshape(-1)] = False
    lp = token_log_probs(model, stream, eos, batch_size, device)[scored]
    owner = np.repeat(np.arange(len(lengths)), lengths)
    per_sent = np.bincount(owner, weights=lp, minlength=len(lengths)) / math.log(10.0)
    return [SentenceScore(float(per_sent[i]), int(lengths[i]), int(result_oov[i])) for i in range(len(lengths))]


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


def encode_context(vocab, tokens: Sequence[str], n: int) -> tuple[list[int], int]:
    """The last ``n`` word ids of ``tokens`` left-padded with ``<eos>`` (a sentence start), and
    the number of out-of-vocabulary tokens (mapped to ``<unk>``)."""
    ids, oov = vocab.encode_counting_oov(tokens)
    return ([vocab.eos] * n + ids)[-n:] if n > 0 else [], oov


__all__ = ["SentenceScore", "score_sentences", "score_report", "encode_context"]

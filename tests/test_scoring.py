"""Sentence scoring (hlbl.scoring): the protocol, against the stream scorer."""

import math

import numpy as np
import pytest

from hlbl.evaluate import perplexity_report, token_log_probs
from hlbl.scoring import score_report, score_sentences


def test_score_sentences_follows_the_protocol(tiny_run, capsys):
    capsys.readouterr()
    _, model, vocab = tiny_run
    sents = ["the big cat eats a fish", "the zebra eats", ""]
    scores = score_sentences(model, vocab, sents)
    for sent, sc in zip(sents, scores):
        ids = vocab.encode(sent.split()) + [vocab.eos]
        ref = token_log_probs(model, np.asarray(ids, dtype=np.int32), vocab.eos)  # own stream: <eos> padding
        assert sc.tokens == len(ids)
        assert sc.log10_prob == pytest.approx(ref.sum() / math.log(10), rel=1e-6)  # float32 model
    assert [s.oov for s in scores] == [0, 1, 0]
    rep = score_report(scores)
    lp = np.concatenate(
        [
            token_log_probs(model, np.asarray(vocab.encode(s.split()) + [vocab.eos], dtype=np.int32), vocab.eos)
            for s in sents
        ]
    )
    assert rep["perplexity"] == pytest.approx(perplexity_report(lp)["perplexity"], rel=1e-6)
    assert rep["oov"] == 1 and rep["tokens"] == 7 + 4 + 1

"""Ranking candidates (hlbl.ranking, ``hlbl rank``): against brute-force sentence scores, and its rules
for ties, unknown words, multi-word candidates, blanks at either end and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import run_cli as _cli

from hlbl.cli import main
from hlbl.errors import DataError
from hlbl.evaluate import token_log_probs
from hlbl.mixture import Mixture
from hlbl.ngram import read_arpa
from hlbl.ranking import Question, Scorer, best_first, parse_question, rank, read_questions, summarize
from hlbl.scoring import ngram_token_scores, score_sentences, token_scores

CANDS = ["cat", "dog", "bird", "fish", "eats"]


@pytest.fixture(scope="module")
def arpa(tiny_run, tmp_path_factory):
    """A KN3 model of the tiny run's own training text."""
    out = tmp_path_factory.mktemp("rank") / "kn3.arpa"
    data = tiny_run[0].parent / "corpus"
    assert main(["ngram", "train", "--data", str(data), "--order", "3", "--out", str(out)]) == 0
    return out


def _question(sentence, cands, answer=None, **kw):
    return json.dumps({"sentence": sentence, "candidates": cands, **({"answer": answer} if answer else {}), **kw})


@pytest.mark.parametrize("sentence", ["the big ___ eats a fish", "___ big cat eats a fish", "the big cat eats a ___"])
def test_ranking_equals_brute_force_sentence_scores(tiny_run, sentence):
    run, model, vocab = tiny_run
    q = parse_question({"sentence": sentence, "candidates": CANDS})
    r = rank(Scorer.run(model, vocab, "cpu"), [q])[0]
    filled = [sentence.replace("___", c) for c in CANDS]
    brute = [s.log10_prob for s in score_sentences(model, vocab, filled, device="cpu")]
    assert [s.log10_prob for s in r.scores] == pytest.approx(brute, abs=1e-9)  # hlbl score's numbers
    assert list(r.order) == sorted(range(len(CANDS)), key=lambda i: (-brute[i], i))
    per_token = token_scores(model, vocab, filled, device="cpu").log10_per_sentence()
    at = sentence.split().index("___")
    for s, lp in zip(r.scores, per_token):
        assert s.before == pytest.approx(lp[:at].sum(), abs=1e-9)
        assert s.word == pytest.approx(lp[at], abs=1e-9)
        assert s.after == pytest.approx(lp[at + 1 :].sum(), abs=1e-9)
        assert s.before + s.word + s.after == pytest.approx(s.log10_prob, abs=1e-9)
    if at == 0:  # a blank at the start: nothing before it
        assert all(s.before == 0.0 for s in r.scores)
    if at == len(sentence.split()) - 1:  # at the end: after it only <eos>
        eos = [lp[-1] for lp in per_token]
        assert [s.after for s in r.scores] == pytest.approx(eos, abs=1e-9)
    assert len({s.before for s in r.scores}) == 1  # the words before the blank score alike for all


def test_ngram_and_mixture_rank_by_their_own_sentence_scores(tiny_run, arpa, capsys):
    run, model, vocab = tiny_run
    sentence = "the red ___ sees a dog"
    filled = [sentence.replace("___", c) for c in CANDS]
    kn = read_arpa(arpa)
    want = [s.log10_prob for s in ngram_token_scores(kn, kn.as_vocab(), filled).sentences()]
    rc, out, err = _cli(["rank", arpa], capsys, _question(sentence, CANDS, "bird") + "\n")
    assert rc == 0
    got = json.loads(out)
    assert [c["log10_prob"] for c in got["ranking"]] == pytest.approx(sorted(want, reverse=True), abs=1e-9)
    assert got["best"] == CANDS[int(np.argmax(want))] and got["correct"] == (got["best"] == "bird")
    mix = Mixture.load([run], arpa, weights=0.4)
    want_mix = [s.log10_prob for s in mix.score(filled)]
    rc, out, err = _cli(["rank", run, "--interpolate", arpa, "--weight", "0.4"], capsys, _question(sentence, CANDS))
    assert rc == 0
    got = json.loads(out)
    assert {c["candidate"]: c["log10_prob"] for c in got["ranking"]} == pytest.approx(dict(zip(CANDS, want_mix)))


def test_exact_ties_keep_the_given_order_and_unknown_words_are_flagged(tiny_run):
    run, model, vocab = tiny_run
    scorer = Scorer.run(model, vocab, "cpu")
    # Two words the vocabulary lacks both read as <unk>: exactly equal scores, the earlier first.
    for cands in (["zebra", "unicorn", "cat"], ["unicorn", "zebra", "cat"], ["cat", "cat"]):
        r = rank(scorer, [parse_question({"sentence": "the big ___ eats a fish", "candidates": cands})])[0]
        tied = [i for i in range(len(cands)) if r.scores[i].log10_prob == r.scores[0].log10_prob]
        assert len(tied) == 2
        assert [i for i in r.order if i in tied] == sorted(tied)
    unk = rank(scorer, [parse_question({"sentence": "the big ___ eats", "candidates": ["zebra", "<unk>", "cat"]})])[0]
    assert [s.oov for s in unk.scores] == [1, 0, 0]
    assert unk.scores[0].log10_prob == unk.scores[1].log10_prob  # scored as <unk>, as hlbl score does
    assert summarize([unk])["oov_candidates"] == 1
    assert best_first([1.0, 2.0, 2.0, 0.5]) == (1, 2, 0, 3)


def test_a_candidate_of_several_words_fills_the_blank_with_all_of_them(tiny_run):
    run, model, vocab = tiny_run
    q = parse_question({"sentence": "the ___ eats a fish", "candidates": ["big cat", "dog"]})
    r = rank(Scorer.run(model, vocab, "cpu"), [q])[0]
    lp = token_scores(model, vocab, ["the big cat eats a fish"], device="cpu").log10_per_sentence()[0]
    assert r.scores[0].word == pytest.approx(lp[1] + lp[2], abs=1e-9)
    assert r.scores[0].after == pytest.approx(lp[3:].sum(), abs=1e-9)
    assert (r.scores[0].tokens, r.scores[1].tokens) == (7, 6)


def test_alternatives_and_the_accuracy_summary(tiny_run, capsys):
    run, model, vocab = tiny_run
    good, bad = "the big cat eats a fish", "fish a eats cat big the"
    lines = [
        json.dumps({"alternatives": [bad, good], "answer": 1, "id": "q1"}),
        "",  # blank lines are skipped
        _question("the small ___ likes a bird", ["dog", "eats"], "dog", id=2),
        _question("the small ___ likes a bird", ["dog", "eats"]),  # no answer: ranked, not counted
    ]
    rc, out, err = _cli(["rank", run, "--device", "cpu"], capsys, "\n".join(lines) + "\n")
    assert rc == 0
    answers = [json.loads(x) for x in out.splitlines()]
    assert [a.get("id") for a in answers] == ["q1", 2, None] and "correct" not in answers[2]
    assert "word_log10_prob" not in answers[0]["ranking"][0]  # whole sentences: no split
    summary = json.loads(err.strip().splitlines()[-1])["summary"]
    assert summary["questions"] == 3 and summary["answered"] == 2
    assert summary["correct"] == sum(a["correct"] for a in answers[:2])
    assert summary["accuracy"] == summary["correct"] / 2


def test_context_is_read_as_the_previous_line_by_runs_and_ignored_by_ngrams(tiny_run, arpa):
    run, model, vocab = tiny_run
    sent, ctx = "the big cat eats a fish", "a dog sees the red bird"
    n = model.config.context
    got = token_scores(model, vocab, [sent], device="cpu", contexts=[ctx]).log_probs
    stream = np.asarray(vocab.encode(ctx.split()) + [vocab.eos] + vocab.encode(sent.split()) + [vocab.eos])
    want = token_log_probs(model, stream, vocab.eos)[len(ctx.split()) + 1 :]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    plain = token_scores(model, vocab, [sent], device="cpu").log_probs
    assert not np.allclose(got[:n], plain[:n])  # the start is read differently
    none = token_scores(model, vocab, [sent], device="cpu", contexts=[None]).log_probs
    np.testing.assert_array_equal(none, plain)
    q = [parse_question({"sentence": "the ___ eats", "candidates": ["cat", "dog"], "context": ctx})]
    kn = read_arpa(arpa)
    with_ctx = rank(Scorer.ngram(kn), q)[0].scores
    without = rank(Scorer.ngram(kn), [Question(q[0].candidates, q[0].left, q[0].right)])[0].scores
    assert with_ctx == without


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"sentence": "the big cat", "candidates": ["a"]}', "line 2: the sentence has no blank"),
        ('{"sentence": "___ big ___", "candidates": ["a"]}', "line 2: the sentence has 2 blanks"),
        ('{"sentence": "the ___ cat", "candidates": []}', "line 2: no candidates"),
        ('{"sentence": "the ___ cat"}', "line 2: no candidates"),
        ('{"sentence": "the ___ cat", "candidates": ["a", " "]}', "line 2: candidate 1 is empty"),
        ('{"sentence": "the ___ cat", "candidates": ["a"], "answer": "b"}', "line 2: answer 'b' is none"),
        ('{"sentence": "the ___ cat", "candidates": ["a"], "answer": 3}', "line 2: answer 3 is no candidate"),
        ('{"sentence": "the ___ cat", "candidates": ["a"], "alternatives": ["x"]}', "line 2: give either"),
        ('{"sentence": "the ___ cat", "candidates": ["a"], "colour": 1}', "line 2: unknown field 'colour'"),
        ('{"sentence": "the ___ cat", "candidates": [1]}', "line 2: candidate 0 is not a string"),
        ('["the ___ cat"]', "line 2: a question is a JSON object"),
        ('{"sentence": "the ___ cat", "candidates": ["a"]', "line 2: not JSON"),
    ],
)
def test_bad_input_is_one_line_naming_the_line(tiny_run, capsys, line, message):
    good = _question("the ___ cat", ["big"])
    rc, out, err = _cli(["rank", tiny_run[0], "--device", "cpu"], capsys, good + "\n" + line + "\n")
    assert rc == 2
    assert err.startswith("hlbl: error: " + message), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_read_questions_numbers_lines_and_refuses_bad_bytes():
    got = list(read_questions([b"\n", _question("a ___ b", ["x"]).encode(), b""]))
    assert [n for n, _ in got] == [2]
    with pytest.raises(DataError, match=r"^line 1: not UTF-8"):
        list(read_questions([b"\xff\xfe"]))
    assert parse_question({"sentence": "a MASK b", "candidates": ["x"]}, blank="MASK").left == ("a",)
    with pytest.raises(DataError, match="contains the blank"):
        parse_question({"sentence": "a ___ b", "candidates": ["x ___"]})


def test_no_questions_and_a_missing_model_are_one_line_errors(tiny_run, capsys, tmp_path):
    rc, out, err = _cli(["rank", tiny_run[0], "--device", "cpu"], capsys, "\n")
    assert rc == 2 and err.strip() == "hlbl: error: no questions on standard input"
    rc, out, err = _cli(["rank", tmp_path / "nothing"], capsys, _question("a ___", ["b"]))
    assert rc == 2 and "no such run directory or n-gram model file" in err


def test_word_only_and_after_only_accuracies(tiny_run):
    run, model, vocab = tiny_run
    q = parse_question({"sentence": "the big ___ eats a fish", "candidates": CANDS, "answer": "cat"})
    r = rank(Scorer.run(model, vocab, "cpu"), [q])[0]
    s = summarize([r])
    assert s["accuracy_word_only"] == float(int(np.argmax([x.word for x in r.scores])) == 0)
    assert s["accuracy_after_only"] == float(int(np.argmax([x.after for x in r.scores])) == 0)
    assert math.isfinite(r.scores[0].log10_prob)

"""Ranking candidates: which of several words fills a blank in a sentence, or which of several
whole sentences is the likeliest, by a trained run, an n-gram model or a mixture of them.

A question is one JSON object (``hlbl rank`` reads one a line)::

    {"sentence": "He drank a cup of ___ before bed .", "candidates": ["tea", "ink"], "answer": "tea"}
    {"alternatives": ["I saw it there .", "Eye saw it there ."], "answer": 0}

optionally with ``"id"`` (any JSON value, echoed back) and ``"context"`` (text read before the
sentence, as the previous line of the training stream: see below). ``answer`` is a candidate's
text or its position (from 0); without it the question is ranked but not counted for accuracy.

**The blank** is the one whitespace-separated token of ``sentence`` equal to the marker (``___``
by default); a candidate of several words (``"New York"``) fills it with all of them. No blank,
two blanks, no candidates, an empty candidate or an answer that is none of the candidates is a
one-line :class:`~hlbl.errors.DataError` (``hlbl rank`` adds the input's line number).

**The score** of a candidate is the log10 probability of the whole sentence with it filled in,
exactly as ``hlbl score`` scores that sentence (:mod:`hlbl.scoring`): its words then ``<eos>``,
from an all-``<eos>`` context for a run, from ``<s>`` for an n-gram model, per token mixed for a
mixture. It is reported split in three: ``before`` (the words before the blank: the same for
every candidate of a question, as nothing after them changes their context), ``word`` (the
candidate's own words) and ``after`` (the words after it and ``<eos>``: the candidate as
context); ``before + word + after`` is the score. Whole-sentence alternatives have no split.

With ``context``, a run reads that text's words and then ``<eos>`` before the sentence (the last
``n`` of them), as a line follows the previous one in training, instead of the all-``<eos>``
start; those tokens are not scored. An n-gram model starts every sentence from ``<s>`` whatever
precedes it, so for it ``context`` changes nothing.

**Order**: highest score first. Candidates with exactly equal scores (two words both outside the
vocabulary, both read as ``<unk>``; a candidate given twice) keep the order they were given in,
so a ranking is deterministic and an exact tie goes to the earlier candidate.

**Words outside the vocabulary** (of the run, or of the n-gram model's own file) are scored as
``<unk>``, as ``hlbl score`` scores them, and flagged: each candidate's ``oov`` counts its words
the model does not know. Such a candidate's score is ``<unk>``'s, a class of words rather than
the word, so an ``oov`` candidate's rank deserves caution.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import numpy as np

from .errors import DataError

if TYPE_CHECKING:
    from .data import Vocab
    from .scoring import TokenScores

BLANK = "___"
FIELDS = ("sentence", "candidates", "alternatives", "answer", "id", "context")


@dataclass(frozen=True)
class Question:
    """A blank to fill (``left`` and ``right`` are the words around it) or, with ``left`` None,
    alternative whole sentences (``candidates``)."""

    candidates: tuple[str, ...]
    left: tuple[str, ...] | None = None
    right: tuple[str, ...] | None = None
    answer: int | None = None  # position of the right candidate, if known
    id: object = None
    context: str | None = None  # text before the sentence (runs read it; see the module doc)

    @property
    def is_blank(self) -> bool:
        return self.left is not None

    def sentences(self) -> list[list[str]]:
        """Each candidate's whole sentence, as tokens."""
        if not self.is_blank:
            return [c.split() for c in self.candidates]
        return [[*self.left, *c.split(), *self.right] for c in self.candidates]


@dataclass(frozen=True)
class CandidateScore:
    candidate: str
    log10_prob: float  # the whole sentence's, <eos> included
    before: float | None  # the words before the blank (None for alternatives)
    word: float | None  # the candidate's own words
    after: float | None  # the words after the blank and <eos>
    tokens: int  # scored tokens: the sentence's words + 1 for <eos>
    oov: int  # the candidate's words outside the model's vocabulary (scored as <unk>)


@dataclass(frozen=True)
class Ranking:
    question: Question
    scores: tuple[CandidateScore, ...]  # in the order the candidates were given
    order: tuple[int, ...]  # candidate positions, best first (ties: the earlier first)

    @property
    def best(self) -> int:
        return self.order[0]

    @property
    def correct(self) -> bool | None:
        return None if self.question.answer is None else self.best == self.question.answer

    def to_json(self) -> dict:
        """The answer ``hlbl rank`` prints: the best candidate, whether it is the answer, and
        every candidate best first with its position, score, split and unknown-word count."""
        q = self.question
        out = {} if q.id is None else {"id": q.id}
        out["best"] = q.candidates[self.best]
        if q.answer is not None:
            out["answer"] = q.candidates[q.answer]
            out["correct"] = self.correct
        ranking = []
        for rank, i in enumerate(self.order, 1):
            s = self.scores[i]
            item = {"candidate": s.candidate, "index": i, "rank": rank, "log10_prob": s.log10_prob}
            if q.is_blank:
                item.update(before_log10_prob=s.before, word_log10_prob=s.word, after_log10_prob=s.after)
            item.update(tokens=s.tokens, oov=s.oov)
            ranking.append(item)
        out["ranking"] = ranking
        return out


class Scorer:
    """What ranks: ``token_scores(sentences, contexts)`` gives the
    :class:`~hlbl.scoring.TokenScores` of token lists, ``vocab`` the words it knows."""

    def __init__(self, vocab: Vocab, token_scores: Callable[[list, list | None], TokenScores], name: str = ""):
        self.vocab, self.token_scores, self.name = vocab, token_scores, name

    @classmethod
    def run(cls, model, vocab: Vocab, device=None, name: str = "run") -> Scorer:
        """A trained run (:func:`hlbl.load_model`'s model and vocabulary)."""
        from .scoring import token_scores

        return cls(vocab, lambda s, c: token_scores(model, vocab, s, device=device, contexts=c), name)

    @classmethod
    def ngram(cls, model, name: str = "ngram") -> Scorer:
        """An n-gram model (:class:`hlbl.ngram.NgramModel`), over its own words as KenLM's query reads them."""
        from .scoring import ngram_token_scores

        vocab = model.as_vocab()
        return cls(vocab, lambda s, c: ngram_token_scores(model, vocab, s), name)

    @classmethod
    def mixture(cls, mix, name: str = "mixture") -> Scorer:
        """A :class:`hlbl.mixture.Mixture` with its weights."""
        return cls(mix.vocab, lambda s, c: mix.token_scores(s, contexts=c), name)


# ---- questions ------------------------------------------------------------------------------


def _candidate_index(value, candidates: Sequence[str], what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DataError(f"answer must be a {what}'s text or its position, got {json.dumps(value)}")
    if isinstance(value, int):
        if not 0 <= value < len(candidates):
            raise DataError(f"answer {value} is no {what}'s position (0 to {len(candidates) - 1})")
        return value
    if value not in candidates:
        raise DataError(f"answer {value!r} is none of the {what}s")
    return candidates.index(value)  # the first, if given twice


def _texts(value, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise DataError(f"no {what}s: give {what}s as a non-empty list of strings")
    for i, c in enumerate(value):
        if not isinstance(c, str):
            raise DataError(f"{what} {i} is not a string: {json.dumps(c)[:40]}")
        if not c.split():
            raise DataError(f"{what} {i} is empty")
    return tuple(value)


def parse_question(obj, blank: str = BLANK) -> Question:
    """A :class:`Question` from a decoded JSON object; a one-line :class:`DataError` if it is not one."""
    if not isinstance(obj, dict):
        raise DataError(f"a question is a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise DataError(f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    context = obj.get("context")
    if context is not None and not isinstance(context, str):
        raise DataError("context must be a string (the text before the sentence)")
    if ("sentence" in obj) == ("alternatives" in obj):
        raise DataError('give either "sentence" (with a blank) and "candidates", or "alternatives"')
    if "alternatives" in obj:
        if "candidates" in obj:
            raise DataError('"candidates" go with "sentence"; "alternatives" are whole sentences')
        alts = _texts(obj["alternatives"], "alternative")
        answer = None if obj.get("answer") is None else _candidate_index(obj["answer"], alts, "alternative")
        return Question(alts, answer=answer, id=obj.get("id"), context=context)
    sentence = obj["sentence"]
    if not isinstance(sentence, str):
        raise DataError("sentence must be a string")
    tokens = sentence.split()
    where = [i for i, t in enumerate(tokens) if t == blank]
    if not where:
        raise DataError(f"the sentence has no blank (a word {blank!r} on its own)")
    if len(where) > 1:
        raise DataError(f"the sentence has {len(where)} blanks ({blank!r}); a question has one")
    cands = _texts(obj.get("candidates"), "candidate")
    bad = next((c for c in cands if blank in c.split()), None)
    if bad is not None:
        raise DataError(f"candidate {bad!r} contains the blank {blank!r}")
    answer = None if obj.get("answer") is None else _candidate_index(obj["answer"], cands, "candidate")
    i = where[0]
    return Question(cands, tuple(tokens[:i]), tuple(tokens[i + 1 :]), answer, obj.get("id"), context)


def read_questions(lines: Iterable[str | bytes], blank: str = BLANK) -> Iterator[tuple[int, Question]]:
    """``(line number, question)`` for each non-blank line of JSONL text (numbered from 1); a bad
    line is a :class:`DataError` starting with ``line N:``."""
    for number, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"line {number}: not UTF-8 (byte {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise DataError(f"line {number}: not JSON ({e})") from None
        try:
            yield number, parse_question(obj, blank)
        except DataError as e:
            raise DataError(f"line {number}: {e}") from None


# ---- ranking --------------------------------------------------------------------------------


def rank(scorer: Scorer, questions: Sequence[Question]) -> list[Ranking]:
    """Rank every question's candidates (one scoring pass over all their sentences)."""
    sentences, contexts, owner = [], [], []
    for q in questions:
        for s in q.sentences():
            sentences.append(s)
            contexts.append(q.context)
            owner.append(q)
    if not sentences:
        return []
    any_context = any(c is not None for c in contexts)
    per_token = iter(scorer.token_scores(sentences, contexts if any_context else None).log10_per_sentence())
    out = []
    for q in questions:
        scores = []
        for cand, sent in zip(q.candidates, q.sentences()):
            lp = next(per_token)  # (len(sent) + 1,) log10 per token: the words, then <eos>
            oov = scorer.vocab.encode_counting_oov(cand.split())[1]
            if q.is_blank:
                a, b = len(q.left), len(q.left) + len(cand.split())
                split = (float(lp[:a].sum()), float(lp[a:b].sum()), float(lp[b:].sum()))
            else:
                split = (None, None, None)
            scores.append(CandidateScore(cand, float(lp.sum()), *split, tokens=len(lp), oov=oov))
        out.append(Ranking(q, tuple(scores), best_first([s.log10_prob for s in scores])))
    return out


def best_first(values: Sequence[float]) -> tuple[int, ...]:
    """Positions of ``values``, highest first; equal values in their given order (a stable sort)."""
    return tuple(int(i) for i in np.argsort(-np.asarray(values, dtype=np.float64), kind="stable"))


def summarize(rankings: Sequence[Ranking]) -> dict:
    """Totals over rankings: ``questions``; ``answered`` (with an answer); ``correct`` and
    ``accuracy``; ``accuracy_word_only`` and ``accuracy_after_only`` (ranking the blank questions
    by the candidate's own words, or by the words after it, alone); ``oov_candidates``."""
    answered = [r for r in rankings if r.question.answer is not None]
    blanks = [r for r in answered if r.question.is_blank]
    correct = sum(bool(r.correct) for r in answered)

    def by(part: str) -> float | None:
        if not blanks:
            return None
        hits = sum(best_first([getattr(s, part) for s in r.scores])[0] == r.question.answer for r in blanks)
        return hits / len(blanks)

    return {
        "questions": len(rankings),
        "answered": len(answered),
        "correct": correct,
        "accuracy": correct / len(answered) if answered else None,
        "accuracy_word_only": by("word"),
        "accuracy_after_only": by("after"),
        "oov_candidates": sum(s.oov > 0 for r in rankings for s in r.scores),
    }


__all__ = [
    "BLANK",
    "CandidateScore",
    "Question",
    "Ranking",
    "Scorer",
    "best_first",
    "parse_question",
    "rank",
    "read_questions",
    "summarize",
]

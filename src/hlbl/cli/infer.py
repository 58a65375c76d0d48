"""``hlbl generate``, ``hlbl score`` and ``hlbl predict``: a trained run answering on stdin/stdout."""

from __future__ import annotations

import json
import math
import sys

import os
from typing import Callable

from ..config import takes_structure
from ..errors import DataError
from ..lines import read_lines
from .common import (
    SCORE_HEADER,
    blank_lines_arg,
    pick_device,
    run_args,
    run_blank_lines,
    score_output_args,
    seed_arg,
    set_threads,
)
from .mix import add_mixture_args, check_mixture_flags, mixing, ready_mixture


def load_for_inference(args, numpy: bool = True):
    """(model, vocab, device) of the run ``args.run`` (``--which``, ``--device``, ``--threads``).
    On the CPU (``--device cpu`` or ``auto``) a run of the fast engine's kind is read as a
    :class:`~hlbl.numpy_model.NumpyLBL` (``numpy``: where the command can use one), without
    importing torch; any other run, or device, loads the torch model."""
    from ..run import Run

    if args.threads is not None and args.threads < 1:
        set_threads(args.threads)  # (its one-line error, before anything is read)
    run = Run.open(args.run)
    if numpy and args.device in ("auto", "cpu"):
        model = run.numpy_model(args.which)
        if model is not None:
            from ..numpy_model import set_numba_threads

            set_numba_threads(args.threads)
            return model, run.vocab, "cpu"
    set_threads(args.threads)
    device = pick_device(args.device)
    model, vocab = run.model(args.which, device), run.vocab
    model.eval()
    return model, vocab, device


class _LongContext:
    """predict's view of a long line: only its last ``n`` words (and its unknown-word count) are kept."""

    def __init__(self, vocab, n: int):
        self.vocab, self.n, self.words, self.oov = vocab, n, [], 0

    def feed(self, text: str) -> None:
        tokens = text.split()
        self.oov += self.vocab.encode_counting_oov(tokens)[1]
        self.words = (self.words + tokens[-self.n :])[-self.n :] if self.n else []

    def unknown(self) -> None:
        self.oov += 1
        self.words = (self.words + [self.vocab.words[self.vocab.unk]])[-self.n :] if self.n else []

    def finish(self) -> "_LongContext":
        return self


class _LongSentence:
    """score's view of a long line: scored piece by piece, each piece with the last ``n`` ids of the
    previous one as its context, as the whole line would be (up to the order of float sums)."""

    def __init__(self, model, vocab, device):
        self.model, self.vocab, self.device = model, vocab, device
        self.ctx = [vocab.eos] * model.config.context
        self.total, self.tokens, self.oov = 0.0, 0, 0

    def _score(self, ids: list[int]) -> None:
        import numpy as np

        from ..evaluate import token_log_probs

        n = len(self.ctx)
        stream = np.asarray(self.ctx + ids, dtype=np.int32)
        self.total += float(token_log_probs(self.model, stream, self.vocab.eos, device=self.device)[n:].sum())
        self.tokens += len(ids)
        self.ctx = (self.ctx + ids)[len(ids) :] if n else []

    def feed(self, text: str) -> None:
        ids, oov = self.vocab.encode_counting_oov(text.split())
        self.oov += oov
        if ids:
            self._score(ids)

    def unknown(self) -> None:
        self.oov += 1
        self._score([self.vocab.unk])

    def finish(self):
        from ..scoring import SentenceScore

        if self.tokens == 0:
            return None  # a blank line, however long: not a sentence
        self._score([self.vocab.eos])
        return SentenceScore(self.total / math.log(10.0), self.tokens, self.oov)


def cmd_generate(args) -> int:
    from ..data import text_lines
    from ..numpy_model import sample_words

    if args.tokens < 0:
        raise DataError(f"--tokens must be at least 0, got {args.tokens}")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        raise DataError(f"--temperature must be a positive number, got {args.temperature}")
    model, vocab, _ = load_for_inference(args)
    if args.per_node_temperature and not takes_structure(model.config.output):
        raise DataError(f"--per-node-temperature needs a tree model; this one has {model.config.output} output")
    prompt = args.prompt.split() if args.prompt else []
    ids, oov = vocab.encode_counting_oov(prompt)
    if oov:
        print(f"hlbl: {oov} prompt word(s) not in the vocabulary, read as {vocab.words[vocab.unk]}", file=sys.stderr)
    sample = sample_words(model, ids, args.tokens, vocab.eos, args.seed, args.temperature, args.per_node_temperature)
    # The prompt as typed, then the sample; every <eos> ends a line.
    print("\n".join(text_lines(prompt + vocab.decode(sample))))
    return 0


def cmd_score(args) -> int:
    check_mixture_flags(args)  # before the heavy imports: a usage mistake answers at once
    from ..scoring import token_scores

    extra = {}
    if mixing(args):
        set_threads(args.threads)
        mix, protocol = ready_mixture(args, pick_device(args.device))
        scorer, long_line = mix.token_scores, None  # long lines held whole
        extra = {"components": mix.describe()}
    else:
        model, vocab, device = load_for_inference(args)
        scorer = lambda lines: token_scores(model, vocab, lines, device=device)  # noqa: E731
        # A line too long to hold is scored piece by piece, as a total (no per-token scores).
        long_line = None if args.per_token else (lambda: _LongSentence(model, vocab, device))
        protocol = run_blank_lines(args)
    return print_scores(scorer, args, protocol, long_line, extra)


def print_scores(scorer: Callable, args, protocol: str, long_line=None, extra: dict | None = None) -> int:
    """Score stdin's sentences as they come and print each (``args.json``, ``args.per_token``),
    then the totals: ``scorer(lines)`` gives the :class:`hlbl.scoring.TokenScores` of a list of
    lines; a long line (``long_line``, see :func:`hlbl.lines.read_lines`) comes already scored."""
    from ..scoring import is_sentence, score_report

    scores, dropped = [], 0
    if args.header and not args.json:
        print(SCORE_HEADER + ("\tper_token" if args.per_token else ""))
    for chunk in read_lines(sys.stdin.buffer, long_line):
        # drop: blank lines are not sentences; keep: each is an empty sentence, scored as <eos>.
        kept = [line for line in chunk if not isinstance(line, str) or is_sentence(line, protocol)]
        dropped += len(chunk) - len(kept)
        texts = [line for line in kept if isinstance(line, str)]
        scored = scorer(texts) if texts else None
        totals = iter(scored.sentences() if texts else ())
        tokens = iter(scored.log10_per_sentence() if texts and args.per_token else ())
        for line in kept:
            s = next(totals) if isinstance(line, str) else line
            scores.append(s)
            per_token = next(tokens) if isinstance(line, str) and args.per_token else None
            print(_sentence_line(s, line, per_token, args.json))
        sys.stdout.flush()  # a program reading our answers line by line gets them now
    if not scores:
        raise DataError("no sentences on standard input")
    print(
        json.dumps({**score_report(scores), "blank_lines": protocol, "blank_lines_dropped": dropped, **(extra or {})})
    )
    return 0


def _sentence_line(s, line, per_token, as_json: bool) -> str:
    """One sentence's answer: 'log10prob<TAB>tokens<TAB>oov' (then 'word=log10prob ...' with
    ``per_token``), or its JSON object."""
    words = line.split() + ["<eos>"] if per_token is not None else None  # hlbl.data.EOS: no numpy at import
    if as_json:
        obj = {"log10_prob": s.log10_prob, "tokens": s.tokens, "oov": s.oov}
        if per_token is not None:
            obj.update(words=words, log10_probs=[float(x) for x in per_token])
        return json.dumps(obj)
    text = f"{s.log10_prob:.6f}\t{s.tokens}\t{s.oov}"
    if per_token is not None:
        text += "\t" + " ".join(f"{w}={x:.6f}" for w, x in zip(words, per_token))
    return text


def cmd_predict(args) -> int:
    import numpy as np

    from ..scoring import encode_context

    if args.k < 1:
        raise DataError(f"--k must be at least 1, got {args.k}")
    model, vocab, device = load_for_inference(args)
    topk = _topk_function(model, device)
    if sys.stdin.isatty():  # a person at a terminal, who might otherwise take the wait for a hang
        end = "Ctrl-Z then Enter" if os.name == "nt" else "Ctrl-D"
        print(f"hlbl: reading contexts from standard input, one a line (end with {end})", file=sys.stderr)
    n = model.config.context
    unknown = 0
    for chunk in read_lines(sys.stdin.buffer, lambda: _LongContext(vocab, n)):
        # A long line arrives as its last n words; JSON shows those as its context.
        encoded = [
            encode_context(vocab, line.split(), n)
            if isinstance(line, str)
            else (encode_context(vocab, line.words, n)[0], line.oov)
            for line in chunk
        ]
        chunk = [line if isinstance(line, str) else "... " + " ".join(line.words) for line in chunk]
        unknown += sum(oov for _, oov in encoded)
        values, idx = topk(np.asarray([c for c, _ in encoded], dtype=np.int64).reshape(len(chunk), n), args.k)
        probs = np.exp(values.astype(np.float64)).tolist()  # (one exp for both models: the same digits)
        for line, (_, oov), p, w in zip(chunk, encoded, probs, idx.tolist()):
            words = vocab.decode(w)
            if args.json:
                print(json.dumps({"context": line, "oov": oov, "words": words, "probs": p}))
            else:
                print(" ".join(f"{word} {prob:.6g}" for word, prob in zip(words, p)))
        sys.stdout.flush()  # a program reading our answers line by line gets them now
    if unknown:
        print(
            f"hlbl: {unknown} context word(s) not in the vocabulary, read as {vocab.words[vocab.unk]}", file=sys.stderr
        )
    return 0


def _topk_function(model, device) -> Callable:
    """``topk(contexts (B, n) int64, k) -> (log-probs (B, k), ids (B, k))`` as numpy arrays, the
    log-probabilities in the model's float32: the numpy model's, or the torch model's on ``device``."""
    from ..numpy_model import NumpyLBL

    if isinstance(model, NumpyLBL):
        return model.topk
    import torch

    def topk(ctx, k: int):
        values, idx = model.topk(torch.from_numpy(ctx).to(device), k)
        return values.cpu().numpy(), idx.cpu().numpy()

    return topk


def add_commands(sub) -> None:
    g = sub.add_parser("generate", help="sample text from a trained model (reproducible under --seed)")
    run_args(g)
    g.add_argument("--tokens", type=int, default=100, help="number of words to sample (<eos> counts)")
    g.add_argument("--seed", type=seed_arg, default=0, help="the same seed gives the same text")
    g.add_argument("--prompt", default="", help="words to continue (the start of a sentence)")
    g.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sample from p(w)^(1/T)/Z (exact; costs the full distribution when T != 1)",
    )
    g.add_argument(
        "--per-node-temperature",
        action="store_true",
        help="apply the temperature at each tree decision instead (tree and classes output; fast; a different "
        "distribution)",
    )
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser(
        "score",
        help="log10 probability of each sentence on stdin, then perplexity (JSON); of a mixture too",
        description="Each non-blank stdin line is a sentence (each line, blank or not, with "
        "--blank-lines keep), scored independently as its words "
        "plus <eos> from an all-<eos> context; words outside the vocabulary are scored "
        "as <unk> and counted. Prints 'log10prob<TAB>tokens<TAB>oov' per sentence "
        "(tokens include <eos>), then one JSON line with the totals and perplexity. With --interpolate "
        "and/or --with (or --mixture), the per-token mixture of the runs and the n-gram model, the "
        "n-gram model scoring each sentence from <s>.",
    )
    run_args(s, mixture=True)
    blank_lines_arg(s, None, "the run's own")
    score_output_args(s)
    add_mixture_args(s)
    s.add_argument("--data", default=None, help="corpus whose valid split fits --weight auto (default: the run's)")
    s.set_defaults(func=cmd_score)

    pr = sub.add_parser(
        "predict",
        help="the k most probable next words for each context on stdin",
        description="Each stdin line is the start of a sentence (a blank line: the sentence "
        "start itself); its last n words, padded with <eos>, are the context. Prints "
        "'word prob word prob ...' best first (ties: lower word id first), exact "
        "(branch and bound on a tree model).",
    )
    run_args(pr)
    pr.add_argument("--k", type=int, default=10, help="number of words per context")
    pr.add_argument("--json", action="store_true", help="one JSON object per context")
    pr.set_defaults(func=cmd_predict)

"""``hlbl rank``: rank candidate words for a blank (or whole alternative sentences) read as JSONL
on stdin, by a run, an n-gram model file or a mixture; one JSON answer a question on stdout and,
at the end, the accuracy on stderr (:mod:`hlbl.ranking`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import DataError
from .common import pick_device, set_threads
from .mix import add_mixture_args, check_mixture_flags, mixing

CHUNK = 256  # questions scored together: answers come as each chunk is done


def _scorer(args):
    """The :class:`hlbl.ranking.Scorer` the arguments name."""
    from ..ranking import Scorer

    model_path = args.model
    if model_path is not None and Path(model_path).is_file():  # an n-gram model file
        if mixing(args):
            raise DataError(
                f"{model_path} is an n-gram model file: to mix it with a run give the run as MODEL and the file "
                "with --interpolate"
            )
        from ..ngram.cache import NgramFile

        return Scorer.ngram(NgramFile(model_path).model, name=str(model_path))
    args.run = model_path  # the mixture flags' name for it
    check_mixture_flags(args)
    set_threads(args.threads)
    device = pick_device(args.device)
    if mixing(args):
        from .mix import ready_mixture

        mix, _ = ready_mixture(args, device)
        return Scorer.mixture(mix)
    from ..run import load_model

    if not Path(model_path).is_dir():
        raise DataError(f"{model_path}: no such run directory or n-gram model file")
    model, vocab, _ = load_model(model_path, which=args.which, device=device)
    model.eval()
    return Scorer.run(model, vocab, device, name=str(model_path))


def cmd_rank(args) -> int:
    from ..ranking import rank, read_questions, summarize

    if not args.blank.strip() or len(args.blank.split()) != 1:
        raise DataError(f"--blank must be one word without spaces, got {args.blank!r}")
    scorer = _scorer(args)
    rankings, chunk = [], []

    def flush():
        for r in rank(scorer, chunk):
            rankings.append(r)
            print(json.dumps(r.to_json(), ensure_ascii=False))
        sys.stdout.flush()  # a reader waiting for answers gets them now
        chunk.clear()

    for _, q in read_questions(sys.stdin.buffer, args.blank):
        chunk.append(q)
        if len(chunk) >= CHUNK:
            flush()
    flush()
    if not rankings:
        raise DataError("no questions on standard input")
    print(json.dumps({"summary": summarize(rankings), "model": scorer.name}), file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    r = sub.add_parser(
        "rank",
        help="rank candidates for a blank (or whole sentences) by a run, an n-gram model or a mixture (JSONL)",
        description='Each stdin line is a JSON question: {"sentence": "... ___ ...", "candidates": [...]} '
        'or {"alternatives": [sentence, ...]}, with optional "answer" (a candidate or its position), "id" '
        'and "context" (text before the sentence; runs read it, n-gram models start from <s>). Each candidate '
        "is scored as the whole sentence with it filled in, exactly as hlbl score scores it; the answer lists "
        "them best first (exact ties: the order given) with the score split into the words before the blank, "
        "the candidate's own words and the words after it. Words outside the vocabulary are scored as <unk> "
        "and counted (oov). Accuracy over the questions with an answer is printed on stderr at the end. A bad "
        "line stops the command with one error naming its line number.",
    )
    r.add_argument("model", nargs="?", default=None, help="run directory, or an n-gram model file (ARPA or binary)")
    r.add_argument("--blank", default="___", help="the word that marks the blank in a sentence (default: ___)")
    r.add_argument("--which", choices=("best", "last"), default="best", help="a run's weights: best valid or last")
    r.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    r.add_argument("--threads", type=int, default=None, help="CPU threads")
    add_mixture_args(r)
    r.add_argument("--data", default=None, help="corpus whose valid split fits --weight auto (default: the run's)")
    r.set_defaults(func=cmd_rank)

"""``hlbl eval``: the perplexity of a trained run on a split, alone or mixed with an n-gram model."""

from __future__ import annotations

import json

from ..errors import DataError
from .common import blank_lines_arg, pick_device, run_args, set_threads, with_oov


def _check_flags(args) -> None:
    """--with and --weight only mean something for a mixture: say so rather than ignore them."""
    if args.ensemble and not args.interpolate:
        raise DataError("--with adds models to the mixture of --interpolate; give the n-gram model with --interpolate")
    if args.weight != "auto" and not args.interpolate:
        raise DataError("--weight is the mixture weight of --interpolate; give the n-gram model with --interpolate")


def _others(args, vocab, device: str) -> tuple:
    """The models of ``--with``, each checked to share the first run's vocabulary."""
    from ..run import load_model

    others = []
    for run in args.ensemble or ():
        other, other_vocab, _ = load_model(run, which=args.which, device=device)
        if list(other_vocab.words) != list(vocab.words):
            raise DataError(f"--with {run}: its vocabulary differs from {args.run}'s; a mixture needs the same words")
        others.append(other)
    return tuple(others)


def cmd_eval(args) -> int:
    from ..data import load_corpus, run_corpus
    from ..evaluate import evaluate, self_normalisation
    from ..run import load_model

    _check_flags(args)
    set_threads(args.threads)
    device = pick_device(args.device)
    model, vocab, info = load_model(args.run, which=args.which, device=device)
    tune = args.interpolate and str(args.weight).strip().lower() == "auto"
    needed = {args.split} | ({"valid"} if tune else set())  # valid: to tune the mixture weight
    corpus = load_corpus(
        args.data or run_corpus(info),
        vocab=vocab,
        splits=tuple(needed),
        blank_lines=args.blank_lines or info.get("blank_lines", "drop"),
    )  # the run's protocol by default
    if args.interpolate:  # mixture with an n-gram model (hlbl.ngram)
        from .ngram import interpolated_report

        others = _others(args, vocab, device)
        report = interpolated_report(model, corpus, args.split, args.interpolate, args.weight, device, others)
    else:
        report = evaluate(model, corpus[args.split], vocab.eos, device=device)
        norm = self_normalisation(model, corpus[args.split], vocab.eos, device=device)
        if norm is not None:  # nce / sampled: log Z statistics (the perplexity above is exact)
            report["self_normalisation"] = norm
    # What was scored, so that a saved line says which split and which weights it is about.
    print(json.dumps({**with_oov(report, corpus, args.split), "split": args.split, "which": args.which}))
    return 0


def add_commands(sub) -> None:
    e = sub.add_parser("eval", help="perplexity of a trained run on a split (one JSON line)")
    run_args(e)
    e.add_argument("--split", choices=("train", "valid", "test"), default="test", help="split to score")
    e.add_argument("--data", default=None, help="corpus (default: the one the run was trained on)")
    blank_lines_arg(e, None, "the run's own")
    e.add_argument(
        "--interpolate",
        metavar="ARPA",
        default=None,
        help="also mix with this n-gram model: W p_model + (1-W) p_ngram, per token",
    )
    e.add_argument("--weight", default="auto", help="with --interpolate: W in [0, 1], or auto (tuned on valid)")
    e.add_argument(
        "--with",
        dest="ensemble",
        metavar="RUN",
        action="append",
        default=None,
        help="with --interpolate: another trained run (same vocabulary) in the mixture; repeatable; "
        "every model's weight is tuned on valid",
    )
    e.set_defaults(func=cmd_eval)

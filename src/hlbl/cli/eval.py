"""``hlbl eval``: the perplexity of a trained run on a split, alone or mixed with other runs and an n-gram model."""

from __future__ import annotations

import json

from .common import blank_lines_arg, pick_device, run_args, set_threads, with_oov
from .infer import load_for_inference
from .mix import add_mixture_args, check_mixture_flags, load_mixture, mixing, mixture_blank_lines, mixture_report


def cmd_eval(args) -> int:
    check_mixture_flags(args)  # before the heavy imports: a usage mistake answers at once
    from ..evaluate import evaluate, self_normalisation
    from ..run import Run

    mix = None
    if mixing(args):  # runs and an n-gram model mixed per token (hlbl.mixture)
        set_threads(args.threads)
        mix = load_mixture(args, pick_device(args.device))
        run = Run.open(mix.components[0].path)
        vocab = mix.vocab
    else:
        model, vocab, device = load_for_inference(args)  # (numpy on the CPU for a run of the fast engine's kind)
        run = Run.open(args.run)
    blank_lines = args.blank_lines  # None: the run's protocol
    if mix is not None:  # ... or the n-gram model's, which its scores are of
        blank_lines = mixture_blank_lines(mix, args.blank_lines, run.text.blank_lines)
    tune = mix is not None and mix.weights is None
    needed = {args.split} | ({"valid"} if tune else set())  # valid: to fit the mixture weights
    corpus = run.corpus(tuple(needed), args.data, blank_lines)
    if mix is not None:
        report = mixture_report(mix, corpus, args.split, args)
    else:
        report = evaluate(model, corpus[args.split], vocab.eos, device=device)
        norm = self_normalisation(model, corpus[args.split], vocab.eos, device=device)
        if norm is not None:  # nce / sampled: log Z statistics (the perplexity above is exact)
            report["self_normalisation"] = norm
    # What was scored, so that a saved line says which split and which weights it is about.
    which = mix.components[0].which if mix is not None else args.which  # a mixture file's own
    print(json.dumps({**with_oov(report, corpus, args.split), "split": args.split, "which": which}))
    return 0


def add_commands(sub) -> None:
    e = sub.add_parser(
        "eval",
        help="perplexity of a trained run on a split (one JSON line), alone or in a mixture",
        description="The perplexity of a run on a split, scored as one stream. With --interpolate "
        "and/or --with, of the per-token mixture of the runs and the n-gram model, with each model "
        "named beside its weight and its own perplexity.",
    )
    run_args(e, mixture=True)
    e.add_argument("--split", choices=("train", "valid", "test"), default="test", help="split to score")
    e.add_argument("--data", default=None, help="corpus (default: the one the run was trained on)")
    blank_lines_arg(e, None, "the run's own")
    add_mixture_args(e)
    e.set_defaults(func=cmd_eval)

"""The mixture flags of ``hlbl eval`` and ``hlbl score``: ``--interpolate``, ``--with``,
``--weight``, ``--mixture`` and ``--save-mixture``, turned into a :class:`hlbl.mixture.Mixture`.

Light at import, as every command module: the library is imported by the functions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DataError

if TYPE_CHECKING:
    from ..mixture import Mixture

WEIGHT_HELP = (
    "mixture weights: W in [0, 1] (the run's share of a mixture of two models), auto (fitted on the valid "
    "split), or a mixture file from --save-mixture whose models these are (checked by SHA-256)"
)


def add_mixture_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interpolate",
        metavar="NGRAM",
        default=None,
        help="mix with this n-gram model (ARPA, or hlbl's binary form), per token: "
        "W p_run + (1-W) p_ngram; its scores of a split are cached by content",
    )
    p.add_argument(
        "--with",
        dest="ensemble",
        metavar="RUN",
        action="append",
        default=None,
        help="another trained run (same vocabulary) in the mixture; repeatable; with or without --interpolate",
    )
    p.add_argument("--weight", default="auto", help=WEIGHT_HELP)
    p.add_argument(
        "--mixture",
        metavar="FILE",
        default=None,
        help="the runs, n-gram model and weights of a mixture file (from --save-mixture), instead of RUN",
    )
    p.add_argument(
        "--save-mixture",
        metavar="FILE",
        default=None,
        help="write the mixture (its models with their SHA-256, its weights, the valid perplexity they were "
        "fitted on) as JSON, for --mixture or --weight FILE to reuse without fitting again",
    )


def mixing(args) -> bool:
    return bool(args.interpolate or args.ensemble or args.mixture)


def _auto(args) -> bool:
    return str(args.weight).strip().lower() == "auto"


def check_mixture_flags(args) -> None:
    """Refuse flags that would be ignored or contradict one another."""
    if args.mixture and (args.run or args.ensemble or args.interpolate or not _auto(args)):
        raise DataError(
            "--mixture names its runs, n-gram model and weights: give no RUN, --with, --interpolate or --weight"
        )
    if not args.mixture and not args.run:
        raise DataError("give a run directory, or a mixture file with --mixture")
    if not mixing(args) and not _auto(args):
        raise DataError(
            "--weight is the weight of a mixture: give the n-gram model with --interpolate, or a run with --with"
        )
    if not mixing(args) and args.save_mixture:
        raise DataError(
            "--save-mixture saves a mixture: give the n-gram model with --interpolate, or a run with --with"
        )
    if args.save_mixture:
        refuse_output(args.save_mixture)  # before the fitting, not after it


def refuse_output(path) -> None:
    """A one-line error if ``path`` is no file to write (a device, a named pipe: hlbl.atomic)."""
    from ..atomic import output_path

    try:
        output_path(path)
    except OSError as e:
        raise DataError(e.strerror or str(e)) from None


def parse_weight(text: str) -> float | Path | None:
    """``--weight``: a number in [0, 1], ``auto`` (None: fit on the valid split), or a mixture file."""
    text = str(text).strip()
    if text.lower() == "auto":
        return None
    try:
        w = float(text)
    except ValueError:
        if Path(text).is_file():
            return Path(text)
        raise DataError(f"--weight must be a number in [0, 1], auto, or a mixture file; {text!r} is none") from None
    if not 0.0 <= w <= 1.0:
        raise DataError(f"--weight must be a number in [0, 1], auto, or a mixture file; got {text!r}")
    return w


def load_mixture(args, device: str) -> Mixture:
    """The mixture the flags name, with its weights unless they are to be fitted (``--weight auto``)."""
    from ..mixture import Mixture

    if args.mixture:
        return Mixture.from_file(args.mixture, device=device)
    weight = parse_weight(args.weight)  # before any model is read: a bad value answers at once
    mix = Mixture.load([args.run, *(args.ensemble or ())], args.interpolate, which=args.which, device=device)
    if isinstance(weight, Path):
        mix.use_weights_of(weight)
    elif weight is not None:
        mix.set_weights(_two(weight, len(mix.components)))
    return mix


def _two(w: float, k: int) -> list[float]:
    if k != 2:
        raise DataError(
            f"--weight {w} is the run's share of a mixture of two models; this one has {k}: give --weight auto "
            "or a mixture file"
        )
    return [w, 1.0 - w]


def ready_mixture(args, device: str) -> tuple[Mixture, str]:
    """The mixture of ``hlbl score`` and ``hlbl serve``, its weights given, read from a file, or
    fitted (``--weight auto``) on the valid split of the first run's corpus (``--data``: another
    corpus's), as ``hlbl eval`` fits them; written to ``--save-mixture`` if asked. With it, the
    blank-line protocol to read text with (:func:`mixture_blank_lines`)."""
    from ..run import Run

    mix = load_mixture(args, device)
    run = Run.open(mix.components[0].path)
    blank_lines = mixture_blank_lines(mix, getattr(args, "blank_lines", None), run.text.blank_lines)
    if mix.weights is None:
        mix.fit(run.corpus(("valid",), args.data, blank_lines))
    if args.save_mixture:
        mix.save(args.save_mixture)
    return mix, blank_lines


def ngram_blank_lines(source, given: str | None, default: str) -> str:
    """The blank-line protocol to use with an n-gram file: the one it records (a different
    ``--blank-lines`` refused by :meth:`hlbl.data.TextProtocol.check_same`; followed, with a note
    where it is not ``default``, when none was given), else ``given or default`` (a file from
    another tool records none: nothing to check)."""
    if source.protocol is None:
        return given or default
    from ..data import TextProtocol

    # The file's record holds the whole protocol; only its blank-line rule is compared (check_same).
    recorded = TextProtocol(blank_lines=source.protocol["blank_lines"])
    reading = TextProtocol(blank_lines=given or recorded.blank_lines)
    reading.check_same(recorded, "the text", str(source.path), "--blank-lines")
    if given is None and recorded.blank_lines != default:
        print(
            f"note: reading the text with --blank-lines {recorded.blank_lines}, the protocol {source.path} was "
            f"estimated with (not {default})",
            file=sys.stderr,
        )
    return reading.blank_lines


def mixture_blank_lines(mix: Mixture, given: str | None, default: str) -> str:
    """The blank-line protocol to read text with for ``mix``: its n-gram model's recorded one (a
    different ``--blank-lines`` refused; followed, with a note, over the run's ``default`` where
    none was given), else ``given or default``."""
    ngram = next((c.model for c in mix.components if c.kind == "ngram"), None)
    return ngram_blank_lines(ngram, given, default) if ngram is not None else (given or default)


def fit_weights(mix: Mixture, corpus) -> None:
    """Under ``--weight auto`` (weights not given), fit them on ``corpus``'s valid split."""
    if mix.weights is None:
        mix.fit(corpus)


def mixture_fields(mix: Mixture, args) -> dict:
    """What a report says of the weights beside the perplexity: the run's share when an n-gram
    model is mixed in (``weight``), where the weights were fitted and the mixture's perplexity
    there, and the mixture file they were read from or written to."""
    fitted = mix.fitted_on or {}
    out = {}
    if mix.components[-1].kind == "ngram":
        out["weight"] = float(sum(mix.weights[:-1]))
    out["weight_tuned_on"] = fitted.get("split")
    out["valid_perplexity"] = fitted.get("perplexity")
    source = args.save_mixture or (str(mix.source) if mix.source else None)
    if source:
        out["mixture_file"] = str(source)
    return out


def mixture_report(mix: Mixture, corpus, split: str, args) -> dict:
    """``hlbl eval`` of a mixture: the perplexity on ``split``, each model named with its weight and
    its own perplexity, and :func:`mixture_fields`."""
    fit_weights(mix, corpus)
    report = mix.evaluate(corpus[split], split)
    if args.save_mixture:  # once the weights have scored the split
        mix.save(args.save_mixture)
    for c in report["components"]:
        if c["perplexity"] is None:
            print(
                f"note: {c['model']} gives some {split} tokens probability 0: its own perplexity is infinite "
                "(null); the mixture's is finite",
                file=sys.stderr,
            )
    return {**report, **mixture_fields(mix, args)}

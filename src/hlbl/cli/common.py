"""Pieces every command group shares: argument types, the help format, device and thread choice,
and the flag of each library setting.

Light on purpose: every command module imports it while the parser is built, so torch and numpy
are imported inside the functions that need them (``hlbl --help`` answers at once).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import fields
from pathlib import Path

from ..config import BLANK_LINES
from ..errors import ConfigError, DataError

# The library's settings (the fields of LBLConfig, TrainConfig, ReproConfig and the parameters of
# the functions behind the commands) -> the flag that sets each: a ConfigError's ``field`` is
# named by its flag on the command line (flag_message).
FLAGS = {
    # the corpus and vocabulary
    "data": "--data",
    "max_vocab": "--max-vocab",
    "min_count": "--min-count",
    "blank_lines": "--blank-lines",
    # the model (LBLConfig) and where it starts
    "dim": "--dim",
    "context": "--context",
    "full_context": "--full-context",
    "output": "--output",
    "init_std": "--init-std",
    "samples": "--samples",
    "noise_power": "--noise-power",
    "noise_share": "--noise-share",
    "head": "--head",
    "tree": "--tree",
    "init_from": "--init-from",
    "keep_output": "--keep-output",
    # the recipe (TrainConfig)
    "lr": "--lr",
    "lr_final": "--lr-final",
    "lr_schedule": "--lr-schedule",
    "lr_decay": "--lr-decay",
    "lr_decays": "--lr-decays",
    "lr_min_gain": "--lr-min-gain",
    "batch_size": "--batch-size",
    "max_epochs": "--epochs",
    "epoch_tokens": "--epoch-tokens",
    "optimizer": "--optimizer",
    "momentum": "--momentum",
    "weight_decay_words": "--weight-decay-words",
    "weight_decay_other": "--weight-decay",
    "word_rate_power": "--word-rate-power",
    "word_rate_cap": "--word-rate-cap",
    "seed": "--seed",
    "max_train_tokens": "--max-train-tokens",
    # how a run is computed
    "device": "--device",
    "engine": "--engine",
    "hogwild": "--hogwild",
    "sync_every": "--sync-every",
    "sync_overlap": "--sync-overlap",
    "time_budget": "--time-budget",
    "threads": "--threads",
    # the paper's pipeline (ReproConfig)
    "out": "--out",
    "work": "--work",
    "epochs": "--epochs",
    "flat_epochs": "--flat-epochs",
    "em_iters": "--em-iters",
    "skip": "--skip",
    "quick": "--quick",
    # exchange moves (hlbl.refine.RefineConfig) and the n-gram baseline
    "per_word": "--per-word",
    "candidates": "--candidates",
    "max_moves": "--max-moves",
    "sigmas": "--sigmas",
    "into_class": "--into-class",
    "sweeps": "--sweeps",
    "order": "--order",
    # mixtures (hlbl.mixture)
    "weights": "--weight",
    "mixture": "--mixture",
}


def flag_message(e: BaseException) -> str:
    """The error's message for this command line: a :class:`ConfigError` whose message starts with
    its field starts with that field's flag instead (``max_vocab must be ...`` -> ``--max-vocab
    must be ...``); any other message is the library's as it is."""
    text = str(e)
    field = e.field if isinstance(e, ConfigError) else None
    if field in FLAGS and text.startswith(field):
        return FLAGS[field] + text[len(field) :]
    return text


def flag_dest(field: str) -> str:
    """The argparse destination of ``field``'s flag (``max_epochs`` -> ``epochs``)."""
    return FLAGS.get(field, "--" + field)[2:].replace("-", "_")


def settings(cls, args: argparse.Namespace, **fixed):
    """``cls`` (a settings dataclass: LBLConfig, TrainConfig, ...) from the command line: each field
    with a flag (:data:`FLAGS`) that the command has and the user gave (a value other than None: such
    flags default to None, so that the dataclass's default applies and a given flag can be told
    from an unset one); ``fixed``: fields set by the command itself. The dataclass validates."""
    given = {}
    for f in fields(cls):
        value = given_flag(f.name, args)
        if f.name not in fixed and value is not None:
            given[f.name] = value
    return cls(**given, **fixed)


def given_flag(field: str, args: argparse.Namespace):
    """The value the user gave for ``field``'s flag, None where the flag was not given (or the
    command has none, or the setting has no flag)."""
    return getattr(args, flag_dest(field), None) if field in FLAGS else None


def setting_arg(p: argparse.ArgumentParser, field: str, default, help: str, **kwargs) -> None:
    """The flag of setting ``field`` (its name from :data:`FLAGS`), None unless given (see
    :func:`settings`); ``default`` is the setting's own, said in the help (None or False: not said)."""
    if not any(default is x for x in (None, False)) and "default" not in help:
        help += f" (default: {default})"
    p.add_argument(FLAGS[field], dest=flag_dest(field), default=None, help=help, **kwargs)


DATA_HELP = (
    "corpus directory or name (a name is looked up in $HLBL_DATA, the cache, the current directory, "
    "and for ptb downloaded), or one text file (split by line as hlbl data split does)"
)  # the --data flag of every command


def positive_or_auto_arg(text: str) -> int | str:
    """A flag that takes a positive whole number or ``auto``: ``--min-count`` (see
    :meth:`hlbl.data.Vocab.from_counts`), ``--sync-every`` (see ``TrainConfig.sync_steps``)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or auto, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


min_count_arg = sync_every_arg = positive_or_auto_arg


def pick_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(name).type
    except RuntimeError:
        raise DataError(f"--device {name!r}: not a device name (cpu, cuda, cuda:N or auto)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise DataError(f"--device {name}: CUDA is not available on this machine")
    index = torch.device(name).index
    if kind == "cuda" and index is not None and index >= torch.cuda.device_count():
        raise DataError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return name


def corpus_args(p: argparse.ArgumentParser, data_help: str = "") -> None:
    p.add_argument("--data", required=not data_help, help=DATA_HELP + data_help)
    p.add_argument("--max-vocab", type=int, default=None, help="keep at most this many word types (with <eos>, <unk>)")
    p.add_argument(
        "--min-count",
        type=min_count_arg,
        default=None if data_help else "auto",  # train: None unless given (a resume refuses a given one that differs)
        help="training words seen fewer times become <unk>; auto (the default) = 1 if the training text has "
        "<unk> tokens already (PTB), else 2, so that <unk> is learned",
    )
    if data_help:  # train: a new run's choice, or the run's own on --resume
        blank_lines_arg(p, None, "drop for a new run, the run's own with --resume")
    else:
        blank_lines_arg(p, "drop")


def blank_lines_arg(p: argparse.ArgumentParser, default: str | None, default_help: str = "") -> None:
    """--blank-lines: the protocol for blank lines of the corpus files (hlbl.data's module docstring)."""
    p.add_argument(
        "--blank-lines",
        choices=BLANK_LINES,
        default=default,
        help="drop: a blank line is no sentence; keep: every line, blank or not, ends in one <eos>, the "
        "protocol of WikiText's and KenLM's published perplexities"
        + (f" (default: {default_help})" if default_help else ""),
    )


def run_blank_lines(args) -> str:
    """The blank-line rule ``hlbl score`` and ``hlbl serve`` read a run's sentences by (a mixture's:
    :func:`hlbl.cli.mix.ready_mixture`): ``--blank-lines``, else the one the run was trained with."""
    from ..run import Run

    return Run.open(args.run).text.reading(args.blank_lines).blank_lines


def set_threads(threads: int | None) -> None:
    """--threads: PyTorch's and numba's CPU threads (the fast kernels, top-k and scoring)."""
    if threads is not None:
        if threads < 1:
            raise DataError(f"--threads must be at least 1, got {threads}")
        from ..fast import set_cpu_threads  # lazily: numba

        set_cpu_threads(threads)


def with_oov(report: dict, corpus, split: str) -> dict:
    """``report`` plus what :meth:`hlbl.data.Corpus.token_counts` says of ``split``: ``oov`` (words
    not in the vocabulary), ``unk_in_text`` (the text's own ``<unk>`` tokens), the blank-line
    protocol and how many blank lines were dropped. Warns (stderr) when out-of-vocabulary words
    weigh on the perplexity because ``<unk>`` never occurs in the training data."""
    stream, vocab = corpus[split], corpus.vocab
    counts = corpus.token_counts(split)
    oov = counts["oov"]
    if oov and vocab.counts[vocab.unk] == 0:
        print(
            f"note: {oov:,} {split} tokens ({100 * oov / len(stream):.1f}%) are out of the vocabulary, and <unk> "
            "never occurs in training, so each gets a very low probability and they weigh heavily on the "
            "perplexity; --min-count 2 (the auto default where training has no <unk>) or --max-vocab gives <unk> "
            "a training count",
            file=sys.stderr,
        )
    if not math.isfinite(report["perplexity"]):
        raise DataError(
            f"perplexity is {report['perplexity']}: the model gives some token probability 0 (non-finite weights?)"
        )
    return {**report, **counts}


def make_parent(out: str | Path) -> None:
    """Create the directories an output file goes in (as ``train --out`` creates its run directory)."""
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot write {out}: {e.strerror or e}") from None


def seed_arg(text: str) -> int:
    """``--seed``: a whole number in [0, 2^63) (what numpy's and torch's generators take)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be in 0 .. 2^63-1, got {value}")
    return value


class Help(argparse.HelpFormatter):
    """Help lines end in ``(default: X)`` where there is a default worth saying and the text does not give it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default  # identity tests: a default of 0 is worth saying, unlike None/False
        if (
            action.option_strings
            and not any(default is x for x in (None, False, argparse.SUPPRESS))
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """Every (sub)command's parser, so that all help pages share :class:`Help`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Help)
        super().__init__(*args, **kwargs)


def run_args(c: argparse.ArgumentParser, mixture: bool = False) -> None:
    """The arguments of every command that loads a trained run (``mixture``: or the runs a
    mixture file names, given with --mixture instead of RUN)."""
    if mixture:
        c.add_argument("run", nargs="?", default=None, help="run directory (none with --mixture)")
    else:
        c.add_argument("run", help="run directory")
    c.add_argument(
        "--which",
        choices=("best", "last"),
        default="best",
        help="weights with the best valid perplexity, or after the last epoch",
    )
    c.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    c.add_argument("--threads", type=int, default=None, help="CPU threads")


SCORE_HEADER = "log10_prob\ttokens\toov"  # the columns of a sentence's line (--header); --per-token adds per_token


def score_output_args(c: argparse.ArgumentParser) -> None:
    """How ``hlbl score`` and ``hlbl ngram score`` print each sentence."""
    c.epilog = (
        "Columns, one line per sentence (tab-separated): log10_prob (of the sentence, <eos> included), tokens "
        "(its words plus <eos>), oov (words outside the vocabulary, scored as <unk>); with --per-token a fourth, "
        "word=log10prob for each token. Then one JSON line of totals: perplexity, tokens, oov, ..."
    )
    c.add_argument("--json", "--jsonl", dest="json", action="store_true", help="one JSON object per sentence")
    c.add_argument(
        "--header",
        action="store_true",
        help=f"first print a line naming the columns ({SCORE_HEADER.expandtabs(1)}; ignored with --json)",
    )
    c.add_argument(
        "--per-token",
        action="store_true",
        help="also each token's log10 probability: 'word=log10prob' after the sentence's columns "
        "(<eos> last), or words and log10_probs in JSON",
    )


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_arg(text: str) -> float:
    """Seconds of a duration: ``5400``, ``90m``, ``1.5h``, ``1h30m``, ``2d``."""
    import re  # (argparse types run at parse time; re is cheap)

    parts = re.fullmatch(r"\s*((\d+(\.\d+)?[smhd]?)\s*)+", text or "")
    pieces = re.findall(r"(\d+(?:\.\d+)?)([smhd]?)", text or "")
    if not parts or not pieces or (len(pieces) > 1 and not all(u for _, u in pieces)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 5400, 90m, 1.5h, 1h30m)")
    seconds = sum(float(n) * _UNITS[u or "s"] for n, u in pieces)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a time budget must be positive")
    return seconds

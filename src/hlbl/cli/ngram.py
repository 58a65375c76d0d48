"""``hlbl ngram train``, ``hlbl ngram eval`` and ``hlbl ngram score``: registered on the main parser by ``hlbl.cli``.

Mixtures with trained runs (``hlbl eval --interpolate``) are :mod:`hlbl.mixture`, their flags :mod:`.mix`.

Errors are :class:`hlbl.data.DataError` (``ArpaError`` is one), which the CLI prints as one line.
numpy and the n-gram modules are imported by the commands, not while the parser is built.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import BLANK_LINES
from ..errors import DataError
from .common import DATA_HELP, min_count_arg, score_output_args
from .mix import ngram_blank_lines, refuse_output

if TYPE_CHECKING:
    import numpy as np

    from ..data import Vocab

SPLITS = ("train", "valid", "test")
NGRAM_HELP = "ARPA file (from hlbl ngram train, KenLM, SRILM, ...) or hlbl's binary form"
BLANK_HELP = (
    "drop: a blank line is no sentence; keep: every line, blank or not, is a sentence ending in </s> "
    "(as KenLM reads a file); recorded in the model file"
)
BLANK_USE_HELP = (
    "drop or keep, as for train; default: the one the model file records (another is refused), "
    "drop for a file without the record (KenLM's, SRILM's)"
)


def cmd_ngram_train(args) -> int:
    from ..data import load_corpus
    from ..ngram.arpa import write_arpa
    from ..ngram.binary import write_binary
    from ..ngram.kneser_ney import train_kneser_ney
    from ..ngram.protocol import make_protocol

    if args.order < 1:
        raise DataError(f"--order must be at least 1, got {args.order}")
    refuse_output(args.out)  # before the training, not after it
    t0 = time.perf_counter()
    corpus = load_corpus(args.data, args.max_vocab, args.min_count, splits=("train",), blank_lines=args.blank_lines)
    model = train_kneser_ney(corpus["train"], corpus.vocab, args.order)
    model.protocol = make_protocol(corpus.text)  # recorded in the file
    t1 = time.perf_counter()
    try:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        if str(args.out).endswith(".safetensors"):  # the binary form: no text to format
            write_binary(model, args.out)
        else:
            write_arpa(model, args.out)
    except OSError as e:
        msg = e.strerror or str(e)
        raise DataError(msg if msg.startswith("cannot write") else f"cannot write {args.out}: {msg}") from None
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "out": str(args.out),
                "order": model.order,
                "ngrams": model.sizes(),
                **model.protocol,
                "discounts": [[round(d, 6) for d in ds] for ds in model.discounts or []],
                "train_seconds": round(t1 - t0, 3),
                "write_seconds": round(t2 - t1, 3),
            }
        )
    )
    return 0


def arpa_vocab(model) -> Vocab:
    """The n-gram model's own vocabulary (:meth:`hlbl.ngram.NgramModel.as_vocab`)."""
    from ..ngram.model import NgramModel

    return NgramModel.as_vocab(model)


def cmd_ngram_eval(args) -> int:
    from ..data import load_corpus
    from ..evaluate import perplexity_report  # the same JSON line as ``hlbl eval``
    from ..ngram.cache import NgramFile
    from ..ngram.model import LN10

    splits = list(dict.fromkeys(s for group in (args.split or [["test"]]) for s in group))  # in order, once each
    source = NgramFile(args.arpa)
    blank_lines = ngram_blank_lines(source, args.blank_lines, "drop")
    vocab = source.model.as_vocab()  # read once for every split
    corpus = load_corpus(args.data, vocab=vocab, splits=tuple(splits), blank_lines=blank_lines)
    for split in splits:
        stream = corpus[split]
        lp = source.stream_log10(stream, vocab.words, vocab.eos)[0] * LN10
        _refuse_zero_probabilities(lp, stream, vocab, args.arpa, split)
        report = perplexity_report(lp)
        # oov: words the model scores as its <unk>; unk_in_text: the text's own <unk> tokens; the blank-line protocol
        print(json.dumps({**report, **corpus.token_counts(split), "split": split}))
    return 0


def split_list(text: str) -> list[str]:
    """``--split valid,test``: split names, comma-separated."""
    import argparse

    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SPLITS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose splits from {', '.join(SPLITS)} (comma-separated)")
    return names


def cmd_ngram_score(args) -> int:
    from ..ngram.cache import NgramFile
    from ..scoring import ngram_token_scores
    from .infer import print_scores

    source = NgramFile(args.arpa)
    blank_lines = ngram_blank_lines(source, args.blank_lines, "drop")
    model = source.model
    vocab = model.as_vocab()  # every word the model knows scored as itself, as KenLM's query does
    return print_scores(lambda lines: ngram_token_scores(model, vocab, lines), args, blank_lines)


def _refuse_zero_probabilities(lp: np.ndarray, stream, vocab: Vocab, arpa, split: str, why: str = "") -> None:
    """An n-gram model that gives a token probability 0 (an ARPA log10 probability of -inf) has an
    infinite perplexity, which JSON cannot hold: say so in one line, naming the model and a token."""
    import numpy as np

    zero = np.flatnonzero(~np.isfinite(lp))
    if len(zero):
        first = int(zero[0])
        raise DataError(
            f"{arpa} gives {len(zero):,} of the {len(lp):,} {split} tokens probability 0 (log10 -inf), "
            f"the first {vocab.words[int(stream[first])]!r} (token {first + 1:,}){why}: its perplexity "
            "is infinite; the ARPA file's probabilities (or backoff weights) for these words are -inf"
        )


def add_subcommands(subparsers) -> None:
    """Add ``ngram`` with its ``train`` and ``eval`` subcommands to the CLI's subparsers."""
    ng = subparsers.add_parser("ngram", help="Kneser-Ney n-gram baseline: estimate an ARPA file, evaluate one")
    nsub = ng.add_subparsers(dest="ngram_command", required=True)

    t = nsub.add_parser("train", help="estimate interpolated modified Kneser-Ney and write an ARPA file")
    t.add_argument("--data", required=True, help=DATA_HELP)
    t.add_argument("--order", type=int, default=5, help="n-gram order")
    t.add_argument(
        "--out", required=True, help="ARPA file to write; a name ending in .safetensors writes the binary form instead"
    )
    t.add_argument("--max-vocab", type=int, default=None, help="keep at most this many word types (as for hlbl train)")
    t.add_argument("--min-count", type=min_count_arg, default="auto", help="as for hlbl train")
    t.add_argument("--blank-lines", choices=BLANK_LINES, default="drop", help=BLANK_HELP)
    t.set_defaults(func=cmd_ngram_train)

    e = nsub.add_parser("eval", help="perplexity of an ARPA model on splits (one JSON line a split, as hlbl eval)")
    e.add_argument("arpa", help=NGRAM_HELP)
    e.add_argument("--data", required=True, help=DATA_HELP)
    e.add_argument(
        "--split",
        type=split_list,
        action="append",
        default=None,
        help="split(s) to score, comma-separated or repeated (valid,test), the model read once (default: test)",
    )
    e.add_argument("--blank-lines", choices=BLANK_LINES, default=None, help=BLANK_USE_HELP)
    e.set_defaults(func=cmd_ngram_eval)

    s = nsub.add_parser(
        "score",
        help="log10 probability of each sentence on stdin under an n-gram model, then perplexity (JSON)",
        description="As KenLM's query: each non-blank stdin line (each line with --blank-lines keep) is "
        "a sentence, scored from <s> with its </s>; words the model lacks are scored as <unk> and "
        "counted. Prints 'log10prob<TAB>tokens<TAB>oov' per sentence (tokens include </s>), then one "
        "JSON line with the totals and perplexity, as hlbl score does.",
    )
    s.add_argument("arpa", help=NGRAM_HELP)
    s.add_argument("--blank-lines", choices=BLANK_LINES, default=None, help=BLANK_USE_HELP)
    score_output_args(s)
    s.set_defaults(func=cmd_ngram_score)

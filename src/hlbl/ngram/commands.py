"""``hlbl ngram train`` and ``hlbl ngram eval``: registered on the main parser by ``hlbl.cli``.

Errors are :class:`hlbl.data.DataError` (``ArpaError`` is one), which the CLI prints as one line.
"""

from __future__ import annotations

import json
import math
import sys
import time

from ..data import DataError, load_corpus, min_count_arg
from .arpa import read_arpa, write_arpa
from .kneser_ney import train_kneser_ney
from . import token_log_probs
from .mixture import interpolate, tune_weight

SPLITS = ("train", "valid", "test")


def cmd_ngram_train(args) -> int:
    if args.order < 1:
        raise DataError(f"--order must be at least 1, got {args.order}")
    t0 = time.perf_counter()
    corpus = load_corpus(args.data, args.max_vocab, args.min_count)
    model = train_kneser_ney(corpus["train"], corpus.vocab, args.order)
    t1 = time.perf_counter()
    try:
        write_arpa(model, args.out)
    except OSError as e:
        raise DataError(f"cannot write {args.out}: {e.strerror or e}") from None
    t2 = time.perf_counter()
    print(json.dumps({
        "out": str(args.out),
        "order": model.order,
        "ngrams": model.sizes(),
        "discounts": [[round(d, 6) for d in ds] for ds in model.discounts or []],
        "train_seconds": round(t1 - t0, 3),
        "write_seconds": round(t2 - t1, 3),
    }))
    return 0


def cmd_ngram_eval(args) -> int:
    from ..evaluate import perplexity_report  # the same JSON line as ``hlbl eval``

    model = read_arpa(args.arpa)
    corpus = load_corpus(args.data)
    lp = token_log_probs(model, corpus[args.split], corpus.vocab)
    print(json.dumps(perplexity_report(lp)))
    return 0


def parse_weight(text: str) -> float | None:
    """``--weight``: a number in [0, 1], or ``auto`` (None: tune on the valid split)."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        w = float(text)
    except ValueError:
        w = float("nan")
    if not 0.0 <= w <= 1.0:
        raise DataError(f"--weight must be a number in [0, 1] or auto, got {text!r}")
    return w


def interpolated_report(model, corpus, split: str, arpa, weight: str | float = "auto", device="cpu") -> dict:
    """``hlbl eval RUN --interpolate ARPA --weight W|auto``: perplexity of the linear mixture
    ``W p_model + (1 - W) p_ngram`` on ``split``, per token under the stream protocol.

    ``auto`` picks W maximising the likelihood of the valid split (:func:`tune_weight`). The
    JSON has ``hlbl eval``'s keys for the mixture, plus ``weight`` and both models' own
    perplexities. ``corpus`` is encoded with the neural model's vocabulary.
    """
    from ..evaluate import perplexity_report
    from ..evaluate import token_log_probs as neural_log_probs

    w = parse_weight(str(weight))
    auto = w is None
    ngram = read_arpa(arpa)
    vocab = corpus.vocab
    known = set(ngram.words)
    missing = sum(w not in known for w in vocab.words)
    if missing > 0.01 * len(vocab):
        print(f"warning: {missing:,} of the model's {len(vocab):,} words are not in {arpa} (different training "
              "data or vocabulary?); the n-gram model scores them as <unk>", file=sys.stderr)
    scored = {}
    for s in {split, "valid"} if auto else {split}:
        scored[s] = (neural_log_probs(model, corpus[s], vocab.eos, device=device),
                     token_log_probs(ngram, corpus[s], vocab))
    if auto:
        w = tune_weight(*scored["valid"])
    a, b = scored[split]
    report = perplexity_report(interpolate(a, b, w))
    report.update({
        "weight": w,
        "weight_tuned_on": "valid" if auto else None,
        "model_perplexity": math.exp(-float(a.mean())),
        "ngram_perplexity": math.exp(-float(b.mean())),
        "words_missing_from_ngram": missing,
    })
    return report


def add_subcommands(subparsers) -> None:
    """Add ``ngram`` with its ``train`` and ``eval`` subcommands to the CLI's subparsers."""
    ng = subparsers.add_parser("ngram", help="Kneser-Ney n-gram baseline: estimate an ARPA file, evaluate one")
    nsub = ng.add_subparsers(dest="ngram_command", required=True)

    t = nsub.add_parser("train", help="estimate interpolated modified Kneser-Ney and write an ARPA file")
    t.add_argument("--data", required=True, help="corpus directory or name (looked up in $HLBL_DATA, then the cache)")
    t.add_argument("--order", type=int, default=5, help="n-gram order")
    t.add_argument("--out", required=True, help="ARPA file to write")
    t.add_argument("--max-vocab", type=int, default=None, help="keep at most this many word types (as for hlbl train)")
    t.add_argument("--min-count", type=min_count_arg, default="auto", help="as for hlbl train")
    t.set_defaults(func=cmd_ngram_train)

    e = nsub.add_parser("eval", help="perplexity of an ARPA model on a split (one JSON line, as hlbl eval)")
    e.add_argument("arpa", help="ARPA file (from hlbl ngram train, KenLM, SRILM, ...)")
    e.add_argument("--data", required=True, help="corpus directory or name")
    e.add_argument("--split", choices=SPLITS, default="test", help="split to score")
    e.set_defaults(func=cmd_ngram_eval)

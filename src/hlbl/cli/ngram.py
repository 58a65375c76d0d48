"""``hlbl ngram train`` and ``hlbl ngram eval``, and ``hlbl eval --interpolate``: registered on the main parser by ``hlbl.cli``.

Errors are :class:`hlbl.data.DataError` (``ArpaError`` is one), which the CLI prints as one line.
numpy and the n-gram modules are imported by the commands, not while the parser is built.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import BLANK_LINES
from ..errors import DataError
from .common import DATA_HELP, min_count_arg

if TYPE_CHECKING:
    import numpy as np

    from ..data import Vocab

SPLITS = ("train", "valid", "test")
BLANK_HELP = (
    "drop: a blank line is no sentence; keep: every line, blank or not, is a sentence ending in </s> "
    "(as KenLM reads a file); use the same for train and eval"
)


def cmd_ngram_train(args) -> int:
    from ..data import load_corpus
    from ..ngram.arpa import write_arpa
    from ..ngram.binary import write_binary
    from ..ngram.kneser_ney import train_kneser_ney

    if args.order < 1:
        raise DataError(f"--order must be at least 1, got {args.order}")
    t0 = time.perf_counter()
    corpus = load_corpus(args.data, args.max_vocab, args.min_count, splits=("train",), blank_lines=args.blank_lines)
    model = train_kneser_ney(corpus["train"], corpus.vocab, args.order)
    t1 = time.perf_counter()
    try:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        if str(args.out).endswith(".safetensors"):  # the binary form: no text to format
            write_binary(model, args.out)
        else:
            write_arpa(model, args.out)
    except OSError as e:
        raise DataError(f"cannot write {args.out}: {e.strerror or e}") from None
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "out": str(args.out),
                "order": model.order,
                "ngrams": model.sizes(),
                "discounts": [[round(d, 6) for d in ds] for ds in model.discounts or []],
                "train_seconds": round(t1 - t0, 3),
                "write_seconds": round(t2 - t1, 3),
            }
        )
    )
    return 0


def arpa_vocab(model) -> Vocab:
    """The ARPA model's own vocabulary as one of ours (``</s>`` is our ``<eos>``; ``<s>`` is no
    word of a stream), so that every word the model knows is scored as itself, as KenLM's
    ``query`` does, whatever vocabulary flags built it. Counts are unknown: zero."""
    from ..data import EOS, UNK, Vocab
    from ..ngram.model import BOS_WORD, EOS_WORD

    words = [EOS, UNK] + [w for w in model.words if w not in (BOS_WORD, EOS_WORD, UNK, EOS)]
    return Vocab(tuple(words), (0,) * len(words))


def cmd_ngram_eval(args) -> int:
    from ..data import load_corpus
    from ..evaluate import perplexity_report  # the same JSON line as ``hlbl eval``
    from ..ngram import token_log_probs
    from ..ngram.arpa import read_arpa

    model = read_arpa(args.arpa)
    vocab = arpa_vocab(model)
    corpus = load_corpus(args.data, vocab=vocab, splits=(args.split,), blank_lines=args.blank_lines)
    stream = corpus[args.split]
    lp = token_log_probs(model, stream, vocab)
    _refuse_zero_probabilities(lp, stream, vocab, args.arpa, args.split)
    report = perplexity_report(lp)
    # oov: words the model scores as its <unk>; unk_in_text: the text's own <unk> tokens; the blank-line protocol
    report.update(corpus.token_counts(args.split))
    print(json.dumps(report))
    return 0


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


def interpolated_report(
    model, corpus, split: str, arpa, weight: str | float = "auto", device="cpu", others: tuple = ()
) -> dict:
    """``hlbl eval RUN --interpolate ARPA --weight W|auto``: perplexity of the linear mixture
    ``W p_model + (1 - W) p_ngram`` on ``split``, per token under the stream protocol.

    ``auto`` picks W maximising the likelihood of the valid split (:func:`tune_weight`). The
    JSON has ``hlbl eval``'s keys for the mixture, plus ``weight`` and both models' own
    perplexities. ``corpus`` is encoded with the neural model's vocabulary.

    ``others``: more neural models over the same vocabulary (``hlbl eval RUN --with RUN2``); then
    the mixture has one weight per model, all tuned on valid together (:func:`tune_weights`), and
    ``weight`` is the neural models' total.
    """
    if others:
        return _ensemble_report([model, *others], corpus, split, arpa, weight, device)
    import numpy as np

    from ..evaluate import perplexity_report
    from ..evaluate import token_log_probs as neural_log_probs
    from ..ngram import token_log_probs
    from ..ngram.mixture import interpolate, tune_weight

    w = parse_weight(str(weight))
    auto = w is None
    ngram = _mixable_ngram(arpa, corpus.vocab)
    vocab = corpus.vocab
    scored = {}
    for s in {split, "valid"} if auto else {split}:
        scored[s] = (
            neural_log_probs(model, corpus[s], vocab.eos, device=device),
            token_log_probs(ngram, corpus[s], vocab),
        )
    # An n-gram probability of 0 (log -inf) is a valid mixture component: the mixture is then the
    # neural share alone for that token (no warning); log(0) below is meant.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if auto:
            w = tune_weight(*scored["valid"])
        a, b = scored[split]
        mixed = interpolate(a, b, w)
    if not np.isfinite(mixed).all():  # only where both give 0: with weight 0, the n-gram model's zeros
        _refuse_zero_probabilities(
            b if w == 0 else mixed,
            corpus[split],
            vocab,
            arpa,
            split,
            f" and the mixture weight is {w}" if w == 0 else "",
        )
    report = perplexity_report(mixed)
    ngram_ppl = math.exp(-float(b.mean())) if np.isfinite(b).all() else None
    if ngram_ppl is None:
        print(
            f"note: {arpa} gives {int((~np.isfinite(b)).sum()):,} {split} tokens probability 0: its own perplexity "
            "is infinite (ngram_perplexity null); the mixture's is finite",
            file=sys.stderr,
        )
    report.update(
        {
            "weight": w,
            "weight_tuned_on": "valid" if auto else None,
            "model_perplexity": math.exp(-float(a.mean())),
            "ngram_perplexity": ngram_ppl,
        }
    )
    return report


def _mixable_ngram(arpa, vocab: Vocab):
    """The n-gram model in ``arpa``, refused when some of ``vocab``'s words are not in it.

    A word of ours the n-gram model lacks would get its <unk> probability: several such words
    would share <unk>'s mass, the n-gram side would sum to more than 1 over our vocabulary, and
    the mixture's perplexity would mean nothing (it can even beat both models)."""
    import numpy as np

    from ..ngram.arpa import read_arpa

    ngram = read_arpa(arpa)
    as_unk = ngram.vocab_map(vocab.words) == ngram.unk
    as_unk[vocab.unk] = False
    missing = int(as_unk.sum())
    if missing:
        example = vocab.words[int(np.flatnonzero(as_unk)[0])]
        raise DataError(
            f"{missing:,} of the model's {len(vocab):,} words (e.g. {example!r}) are not in {arpa}, so the "
            "mixture would not be a distribution; build the n-gram model on the same training data "
            "and vocabulary (hlbl ngram train --data ... with the run's --min-count / --max-vocab)"
        )
    return ngram


def _ensemble_report(models: list, corpus, split: str, arpa, weight, device) -> dict:
    """:func:`interpolated_report` for several neural models and one n-gram model."""
    import numpy as np

    from ..evaluate import perplexity_report
    from ..evaluate import token_log_probs as neural_log_probs
    from ..ngram import token_log_probs
    from ..ngram.mixture import interpolate_many, tune_weights

    if parse_weight(str(weight)) is not None:
        raise DataError("--with mixes several models with weights tuned on valid: leave --weight at auto")
    ngram = _mixable_ngram(arpa, corpus.vocab)
    vocab = corpus.vocab
    scored = {}
    for s in {split, "valid"}:
        lps = [neural_log_probs(m, corpus[s], vocab.eos, device=device) for m in models]
        scored[s] = np.stack(lps + [token_log_probs(ngram, corpus[s], vocab)])  # (K + 1, N)
    w = tune_weights(scored["valid"])
    mixed = interpolate_many(scored[split], w)
    if not np.isfinite(mixed).all():
        raise DataError(f"{split} has tokens that every model of the mixture gives probability 0")
    report = perplexity_report(mixed)
    report.update(
        {
            "weight": float(w[:-1].sum()),
            "weights": [float(x) for x in w],
            "weight_tuned_on": "valid",
            "model_perplexities": [math.exp(-float(a.mean())) for a in scored[split][:-1]],
            "ngram_perplexity": math.exp(-float(scored[split][-1].mean()))
            if np.isfinite(scored[split][-1]).all()
            else None,
        }
    )
    return report


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

    e = nsub.add_parser("eval", help="perplexity of an ARPA model on a split (one JSON line, as hlbl eval)")
    e.add_argument("arpa", help="ARPA file (from hlbl ngram train, KenLM, SRILM, ...) or hlbl's binary form")
    e.add_argument("--data", required=True, help=DATA_HELP)
    e.add_argument("--split", choices=SPLITS, default="test", help="split to score")
    e.add_argument("--blank-lines", choices=BLANK_LINES, default="drop", help=BLANK_HELP)
    e.set_defaults(func=cmd_ngram_eval)

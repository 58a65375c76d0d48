"""Benchmark of the Kneser-Ney baseline on PTB: times, peak memory, perplexities.

    python bench/ngram.py [--data ptb] [--orders 3 4 5] [--out DIR]
    python bench/ngram.py --quick        # a check of the script: orders 2 and 3 on a tiny synthetic corpus

For each order: estimation time (counting + discounts + probabilities, corpus already
encoded), ARPA write time, test scoring time from the model in memory, and, for the highest
order, the ``hlbl ngram eval`` path (read the ARPA file, score the test split), both parsing
the text and from the binary copy kept in the hlbl cache. Perplexities of
test (every order) and valid (highest order) are printed next to KenLM lmplz's reference
values on PTB. Peak RSS is the whole process's (``getrusage``), so it bounds every step.
The last line is one JSON object with everything, and whether the budgets
(train <= 30 s, score <= 10 s, peak <= 2 GiB; parsing the ARPA text also <= 10 s) were met;
with ``--out DIR`` it is also written to ``DIR/ngram.json``, beside the ARPA files. ``--quick``
writes them all to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from _common import add_common, finish_args, machine, quick_dir, write_json
from hlbl.data import load_corpus
from hlbl.ngram import read_arpa, token_log_probs, train_kneser_ney, write_arpa

# KenLM lmplz on PTB (<unk> an ordinary word, one </s> a line, <s> context).
KENLM_PTB = {("test", 3): 148.28, ("test", 4): 142.72, ("test", 5): 141.19, ("valid", 5): 148.01}
BUDGET = {"train_s": 30.0, "score_s": 10.0, "peak_rss_mb": 2048.0}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def ppl(lp) -> float:
    return math.exp(-float(lp.mean()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, nargs="+", default=[3, 4, 5])
    add_common(ap, data="ptb")
    ap.add_argument(
        "--out", default=None, help="directory for the ARPA files and ngram.json (default: a temporary one)"
    )
    args = finish_args(ap.parse_args(argv), orders=[2, 3])
    if args.quick and args.out is None:
        args.out = str(quick_dir() / "ngram")

    t = time.perf_counter()
    corpus = load_corpus(args.data)
    load_s = time.perf_counter() - t
    train, vocab = corpus["train"], corpus.vocab
    print(
        f"{args.data}: {len(vocab):,} words, train {len(train):,} tokens, test {len(corpus['test']):,}; "
        f"corpus load {load_s:.2f}s",
        file=sys.stderr,
    )
    tmp = tempfile.TemporaryDirectory() if args.out is None else None
    out_dir = Path(args.out or tmp.name)
    if tmp is not None:  # the binary copies of temporary ARPA files go with them, not into the user's cache
        os.environ["HLBL_CACHE"] = str(out_dir / "cache")
    out_dir.mkdir(parents=True, exist_ok=True)

    rows = []
    for order in args.orders:
        t = time.perf_counter()
        model = train_kneser_ney(train, vocab, order)
        train_s = time.perf_counter() - t
        t = time.perf_counter()
        lp = token_log_probs(model, corpus["test"], vocab)
        score_s = time.perf_counter() - t
        row = {
            "order": order,
            "ngrams": model.sizes(),
            "train_s": round(train_s, 3),
            "score_test_s": round(score_s, 3),
            "test_ppl": round(ppl(lp), 3),
        }
        if order == max(args.orders):
            row["valid_ppl"] = round(ppl(token_log_probs(model, corpus["valid"], vocab)), 3)
        path = out_dir / f"kn{order}.arpa"
        t = time.perf_counter()
        write_arpa(model, path, cache=order == max(args.orders))
        row["write_arpa_s"] = round(time.perf_counter() - t, 3)
        row["arpa_mb"] = round(path.stat().st_size / 2**20, 1)
        del model
        if order == max(args.orders):
            # The `hlbl ngram eval` path: read the ARPA file (parsing the text, and from the
            # binary copy that write_arpa left in the cache), then score.
            t = time.perf_counter()
            loaded = read_arpa(path, cache=False)
            row["parse_arpa_s"] = round(time.perf_counter() - t, 3)
            lp2 = token_log_probs(loaded, corpus["test"], vocab)
            row["eval_parsing_arpa_s"] = round(time.perf_counter() - t, 3)
            row["test_ppl_from_arpa"] = round(ppl(lp2), 3)
            del loaded
            t = time.perf_counter()
            lp2 = token_log_probs(read_arpa(path), corpus["test"], vocab)
            row["eval_cached_arpa_s"] = round(time.perf_counter() - t, 3)
        for split in ("test", "valid"):
            ref = KENLM_PTB.get((split, order)) if args.data == "ptb" else None  # (quick: a path, no reference)
            if ref is not None and f"{split}_ppl" in row:
                row[f"{split}_kenlm"] = ref
        rows.append(row)
        refs = ", ".join(
            f"{s} {row[f'{s}_ppl']} (KenLM {row.get(f'{s}_kenlm', '-')})"
            for s in ("test", "valid")
            if f"{s}_ppl" in row
        )
        print(
            f"order {order}: train {train_s:.2f}s, score test {score_s:.2f}s, write ARPA {row['write_arpa_s']:.2f}s"
            + (
                f", eval from ARPA {row['eval_parsing_arpa_s']:.2f}s parsing it, "
                f"{row['eval_cached_arpa_s']:.2f}s from the cached copy"
                if "parse_arpa_s" in row
                else ""
            )
            + f"; {refs}; peak RSS {peak_rss_mb():.0f} MB",
            file=sys.stderr,
        )

    top = rows[-1]
    peak = peak_rss_mb()
    summary = {
        "bench": "ngram",
        "data": args.data,
        "orders": rows,
        "peak_rss_mb": round(peak, 1),
        "within_budget": {
            "train": top["train_s"] <= BUDGET["train_s"],
            # Scoring the test split: from the model in memory and from the ARPA file's cached
            # copy. (Parsing the ARPA text the first time is reported separately: parse_arpa_s.)
            "score": max(top["score_test_s"], top.get("eval_cached_arpa_s", 0.0)) <= BUDGET["score_s"],
            "parse_arpa": top.get("parse_arpa_s", 0.0) <= BUDGET["score_s"],
            "memory": peak <= BUDGET["peak_rss_mb"],
        },
        "matches_kenlm": all(
            abs(r[f"{s}_ppl"] - r[f"{s}_kenlm"]) <= 0.5 for r in rows for s in ("test", "valid") if f"{s}_kenlm" in r
        )
        if args.data == "ptb"
        else None,
    }
    if tmp is not None:
        tmp.cleanup()
    else:
        write_json(out_dir / "ngram.json", {**summary, "machine": machine()})
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

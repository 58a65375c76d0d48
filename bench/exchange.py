"""Exchange moves on word classes: estimated gains against the training NLL measured after them.

    python bench/exchange.py --run runs/exp/freq100 [--out results/ptb/exchange.json]
    python bench/exchange.py --quick     # a check of the script: a tiny class model, JSON in a temporary directory

For a trained ``--output classes`` run, each setting makes sweeps of moves (``hlbl.refine``), each
on the model after the previous sweep's moves (parameters carried, none retrained), and measures
the exact training NLL of the whole split before and after every sweep. Settings:

* ``noisy``: 32 sampled occurrences a word, no standard errors, up to 500 moves anywhere (one sweep);
* ``pile-up``: 256 occurrences a word, ranked by gain less 2 standard errors, up to 500 moves
  and no limit on moves into one class (three sweeps);
* ``default``: the defaults of ``hlbl tree refine`` (at most one move into a class; four sweeps).

``--quick`` trains a class model of one epoch on the synthetic corpus of ``bench/_common.py``
(no ``--run``) and makes one sweep of each setting.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from _common import add_common, finish_args, quick_run, write_json

SETTINGS = {
    "noisy": ({"per_word": 32, "sigmas": 0.0, "into_class": 10**9}, 1),
    "pile-up": ({"per_word": 256, "sigmas": 2.0, "into_class": 10**9}, 3),
    "default": ({}, 4),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a trained run with --output classes")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--sweeps", type=int, default=None, help="at most this many sweeps per setting")
    add_common(ap, out="results/ptb/exchange.json")
    args = finish_args(ap.parse_args(argv), sweeps=1)
    if args.quick and not args.run:
        args.run = str(quick_run("classes", "--output", "classes")[0])
    if not args.run:
        ap.error("--run is required")

    from hlbl.run import Run
    from hlbl.evaluate import evaluate
    from hlbl.model import LBL
    from hlbl.refine import RefineConfig, carry_output, exchange_sweep

    torch.set_num_threads(1)
    source = Run.open(args.run)
    model, vocab = source.model(), source.vocab
    corpus = source.corpus(("train",))
    train = corpus["train"]

    def total_nll(m) -> float:
        return evaluate(m, train, vocab.eos)["nll"] * len(train)

    base = total_nll(model)
    out = {"run": args.run, "train_tokens": len(train), "train_nll_nats": base, "settings": {}}
    for name in args.settings:
        overrides, sweeps = SETTINGS[name]
        sweeps = min(sweeps, args.sweeps or sweeps)
        current, before, rows = model, base, []
        for k in range(sweeps):
            t = time.perf_counter()
            sweep = exchange_sweep(current, train, vocab.eos, RefineConfig(seed=k, **overrides))
            seconds = time.perf_counter() - t
            moved = LBL(current.config, sweep.classes, init=False)
            with torch.no_grad():
                moved.R.weight.copy_(current.R.weight)
                moved.C.copy_(current.C)
            carry_output(current.out, moved.out, sweep.leaf_map)
            after = total_nll(moved)
            rows.append(
                {
                    "sweep": k + 1,
                    "moves": len(sweep.moves),
                    "estimated_gain_nats": sum(m.gain for m in sweep.moves),
                    "measured_gain_nats": before - after,
                    "most_moves_into_one_class": max(
                        (sum(1 for m in sweep.moves if m.dest == c) for c in {m.dest for m in sweep.moves}), default=0
                    ),
                    "sweep_seconds": round(seconds, 1),
                }
            )
            print(name, json.dumps(rows[-1]), file=sys.stderr)
            current, before = moved, after
        out["settings"][name] = {"config": {**RefineConfig(**overrides).__dict__, "sweeps": sweeps}, "sweeps": rows}
    write_json(args.out, out)
    print(json.dumps({"written": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: bootstrap rounds with and without a cap on the tree's size, on PTB.

    python bench/bootstrap_size.py --work runs/bootstrap [--epochs 6] [--round2-epochs 3] [--threads 1]
    python bench/bootstrap_size.py --quick     # a check of the script: tiny synthetic corpus

The iterated bootstrap, as a user runs it with the CLI (each step one ``hlbl`` command):

1. ``r0``: ``hlbl train --tree random`` (``--epochs`` epochs at most, as ``r1``; round 2:
   ``--round2-epochs``);
2. ``r1``: ``hlbl tree build --from r0 --policy adaptive:0.4 --copies 4`` (the default leaf
   budget), then ``hlbl train`` on that tree ``--init-from r0``;
3. round 2, twice from ``r1``: ``r2`` rebuilt with the default budget, and ``r2_capped`` with
   ``--max-leaves-per-word M``, M = round 1's ``leaves / (4 x words)`` (so its codes per word,
   averaged uniformly, stay at most round 1's); each trained ``--init-from r1``.

For each run: the tree's size (``hlbl tree stats RUN``: codes per word and mean code length
averaged by training counts, and leaves / words, the uniform average the cap bounds), the
build's duplicated and denied duplications, the training words/s (mean over the run's epochs, from
its metrics), the best valid perplexity, the test perplexity (``hlbl eval RUN``), the epochs and
what ended the run (early stopping, or the ``--epochs`` cap). Runs go one after another, in
this process, in ``--work``; one already finished there is reused. The machine is shared: words/s are from
separate runs, not side by side, and move with its load.
Writes ``results/ptb/bootstrap_size.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from _common import add_common, finish_args, machine, quick_dir, write_json

COPIES = 4
POLICY = "adaptive:0.4"


def hlbl(*argv: str) -> dict:
    """Run ``hlbl ARGV`` (in this process) and return the JSON object of its first JSON output line."""
    from hlbl.cli import main as hlbl_main

    print("$ hlbl " + " ".join(argv), file=sys.stderr, flush=True)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = hlbl_main(list(argv))
    if rc:
        raise SystemExit(f"hlbl {' '.join(argv)} failed ({rc})")
    for line in buf.getvalue().splitlines():
        if line.startswith("{"):
            return json.loads(line)
    return {}


def train(args, run: Path, tree: str, init_from: Path | None, epochs: int) -> None:
    if (run / "state.json").is_file() and (run / "eval-test.json").is_file():
        return
    argv = ["train", "--data", args.data, "--tree", tree, "--epochs", str(epochs)]
    argv += ["--threads", str(args.threads), "--quiet", "--out", str(run)]
    if init_from is not None:
        argv += ["--init-from", str(init_from)]
    hlbl(*argv)
    test = hlbl("eval", str(run), "--threads", str(args.threads))
    (run / "eval-test.json").write_text(json.dumps(test) + "\n")


def build(args, source: Path, out: Path, cap: float | None) -> dict:
    report = out.with_suffix(".build.json")
    if out.is_file() and report.is_file():
        return json.loads(report.read_text())
    argv = ["tree", "build", "--from", str(source), "--policy", POLICY, "--copies", str(COPIES)]
    argv += ["--threads", str(args.threads), "--out", str(out)]
    if cap is not None:
        argv += ["--max-leaves-per-word", f"{cap:.4f}"]
    got = hlbl(*argv)
    report.write_text(json.dumps(got) + "\n")
    return got


def describe(args, name: str, run: Path, command: str, built: dict | None) -> dict:
    from hlbl.checkpoint import read_metrics, read_state

    stats = hlbl("tree", "stats", str(run))
    state = read_state(run / "state.json")
    lines = read_metrics(run / "metrics.jsonl")
    test = json.loads((run / "eval-test.json").read_text())
    row = {
        "name": name,
        "command": command,
        "words": stats["words"],
        "leaves": stats["leaves"],
        "leaves_per_word": stats["leaves"] / stats["words"],
        "codes_per_word": stats["codes_per_word"],
        "mean_code_length": stats["mean_code_length"],
        "weighting": stats["weighting"],
        "words_per_s": float(np.mean([x["words_per_sec"] for x in lines])),
        "words_per_s_epochs": [x["words_per_sec"] for x in lines],
        "valid_ppl": state["best_valid_ppl"],
        "test_ppl": test["perplexity"],
        "epochs": state["epoch"],
        "stopped_by": "early stopping" if state["done"] else "--epochs cap",
    }
    if built is not None:
        row["duplicated"] = built.get("duplicated")
        row["denied_duplications"] = built.get("denied_duplications")
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common(ap, threads=1, data="ptb", out="results/ptb/bootstrap_size.json")
    ap.add_argument("--epochs", type=int, default=6, help="most epochs of r0 and r1 (default 6)")
    ap.add_argument(
        "--round2-epochs", type=int, default=None, help="most epochs of each round-2 run (default --epochs)"
    )
    ap.add_argument("--work", default=None, help="directory of the runs and trees (default: a temporary one)")
    args = finish_args(ap.parse_args(argv), epochs=1, round2_epochs=1)
    if args.quick:
        args.work = str(quick_dir() / "bootstrap")
    work = Path(args.work or tempfile.mkdtemp(prefix="hlbl-bootstrap-"))
    work.mkdir(parents=True, exist_ok=True)
    E, E2 = args.epochs, args.round2_epochs or args.epochs
    flags = f"--epochs {E} --threads {args.threads}"
    flags2 = f"--epochs {E2} --threads {args.threads}"

    r0, r1, r2, r2c = (work / n for n in ("r0", "r1", "r2", "r2_capped"))
    train(args, r0, "random", None, E)
    rows = [describe(args, "r0", r0, f"hlbl train --data ptb --tree random {flags} --out r0", None)]

    b1 = build(args, r0, work / "t1.json", None)
    train(args, r1, str(work / "t1.json"), r0, E)
    build1 = f"hlbl tree build --from r0 --policy {POLICY} --copies {COPIES} --out t1.json"
    rows.append(describe(args, "r1", r1, f"{build1}; hlbl train --tree t1.json --init-from r0 {flags}", b1))

    cap = rows[-1]["leaves"] / (COPIES * rows[-1]["words"])
    b2 = build(args, r1, work / "t2.json", None)
    train(args, r2, str(work / "t2.json"), r1, E2)
    build2 = f"hlbl tree build --from r1 --policy {POLICY} --copies {COPIES}"
    rows.append(
        describe(args, "r2", r2, f"{build2} --out t2.json; hlbl train --tree t2.json --init-from r1 {flags2}", b2)
    )
    b2c = build(args, r1, work / "t2_capped.json", cap)
    train(args, r2c, str(work / "t2_capped.json"), r1, E2)
    rows.append(
        describe(
            args,
            "r2_capped",
            r2c,
            f"{build2} --max-leaves-per-word {cap:.4f} --out t2_capped.json; "
            f"hlbl train --tree t2_capped.json --init-from r1 {flags2}",
            b2c,
        )
    )

    write_json(
        args.out,
        {
            "what": "iterated bootstrap on PTB, x4 ADAPTIVE(0.4) trees: round 2 rebuilt with the default leaf "
            "budget (4 x V per copy) and with --max-leaves-per-word at round 1's leaves / (4 x words)",
            "command": f"python bench/bootstrap_size.py --epochs {E} --round2-epochs {E2} --threads {args.threads}",
            "epochs_cap": E,
            "round2_epochs_cap": E2,
            "max_leaves_per_word_capped": cap,
            "runs": rows,
            "machine": machine(),
        },
    )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Capacity, context and the paper's regime on a large corpus: what holds HLBL above Kneser-Ney.

    python bench/scale.py dims  --data gutenberg --max-vocab 50000 --tree TREE --work W
    python bench/scale.py grid  --data gutenberg --max-vocab 50000 --tree TREE --cells 300x5 --time-budget 2h --work W
    python bench/scale.py grid  --data gutenberg --max-vocab 0 --tree TREE --cells 300x10 --processes 2 --work W
    python bench/scale.py grid  --data gutenberg --max-vocab 50000 --tree TREE2 --init-from RUN --label b1 --cells 300x10 --work W
    python bench/scale.py paper --data gutenberg --max-train-tokens 14000000 --max-vocab 18000 --work W
    python bench/scale.py --quick

Each stage runs the ``hlbl`` commands a user would, in child processes, and writes one JSON file
under ``--out`` (default ``results/gutenberg``); a run directory that exists is kept and read
(the stages resume: a long training continues with ``--resume`` where a call stops it):

* ``dims`` (``scale_dims.json``): training words/s of feature sizes and context lengths
  (``--cells DxC,...``) on one tree, each a short run of ``--positions`` training positions, the
  cells alternating in each of ``--rounds`` rounds, so that the machine's load falls on all
  alike; per round, words/s of each cell over the first cell's (d = 100, 5 words), and words/s
  times d (the work of a step grows with d).
* ``grid`` (``scale_grid.json``): each cell trained on the tree until its schedule stops it
  (``--epochs`` is only a cap), ``--time-budget`` at a time (a call stops at the first
  checkpoint after it, and the next call resumes); per cell, valid and test perplexity of its
  best weights, epochs, passes, hours of training, words/s, whether the schedule ended it, and
  the peak RSS of the last training call. ``--init-from RUN`` warm-starts every cell from a run
  (with a tree built from that run's features: one round of the iterated bootstrap).
* ``paper`` (``paper_regime.json``): ``hlbl reproduce`` with the paper's sizes (``--skip`` leaves
  rows out), then the x4 tree mixed with its KN5 (weight tuned on valid); the rows of Table 3.

``python bench/gutenberg.py summary`` adds these files' figures to ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import add_common, finish_args, machine, quick_dir, write_json

CELLS = "100x5,300x5,100x10,300x10"


def launcher(processes: int = 1) -> list[str]:
    """How an ``hlbl`` command starts: this Python, or ``processes`` of them under torchrun."""
    if processes <= 1:
        return [sys.executable, "-m", "hlbl"]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    return [torchrun, "--standalone", "--nproc_per_node", str(processes), "-m", "hlbl"]


def shown(argv: list[str], processes: int = 1) -> str:
    """The command as a user types it."""
    start = "hlbl" if processes <= 1 else f"torchrun --standalone --nproc_per_node {processes} -m hlbl"
    return f"{start} {shlex.join(argv)}"


def run(argv: list[str], log: Path, processes: int = 1) -> dict:
    """Run an ``hlbl`` command (stderr to ``log``); its stdout, wall seconds and peak RSS."""
    t = time.perf_counter()
    with open(log, "ab") as err:
        p = subprocess.Popen(launcher(processes) + argv, stdout=subprocess.PIPE, stderr=err)
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"hlbl {shlex.join(argv)} failed (see {log})")
    return {"stdout": out.decode(), "wall_s": round(time.perf_counter() - t, 1), "peak_rss_mb": ru.ru_maxrss // 1024}


def cells(text: str) -> list[tuple[int, int]]:
    """``"100x5,300x10"`` -> [(100, 5), (300, 10)]: feature size by context length."""
    try:
        return [(int(d), int(c)) for d, c in (cell.split("x") for cell in text.split(","))]
    except ValueError:
        raise SystemExit(f"--cells {text!r}: give DxC pairs, e.g. {CELLS}") from None


def corpus_flags(args) -> list[str]:
    flags = ["--data", args.data, "--threads", "1"]
    if args.max_vocab:
        flags += ["--max-vocab", str(args.max_vocab)]
    return flags


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


# ---- dims -------------------------------------------------------------------------------------


def stage_dims(args) -> dict:
    work = Path(args.work) / "dims"
    work.mkdir(parents=True, exist_ok=True)
    rounds = []
    for r in range(1, args.rounds + 1):
        row = {}
        for d, c in cells(args.cells):
            out = work / f"d{d}c{c}_r{r}"
            cmd = ["train", *corpus_flags(args), "--tree", args.tree, "--dim", str(d), "--context", str(c)]
            cmd += ["--epochs", "1", "--epoch-tokens", str(args.positions), "--quiet", "--out", str(out)]
            if not (out / "state.json").exists():
                run(cmd, work / "dims.log")
            wps = metrics(out)[0]["words_per_sec"]
            row[f"{d}x{c}"] = {"words_per_sec": round(wps), "words_per_sec_times_d": round(wps * d)}
        first = next(iter(row.values()))["words_per_sec"]
        for v in row.values():
            v["over_first"] = round(v["words_per_sec"] / first, 4)
        rounds.append(row)
    ratio = [
        x["300x5"]["words_per_sec"] / x["100x5"]["words_per_sec"] for x in rounds if {"300x5", "100x5"} <= x.keys()
    ]
    return {
        "command": "hlbl "
        + shlex.join(cmd[:-2] + ["--out", "DIR"]).replace(f"--dim {d} --context {c}", "--dim D --context C"),
        "positions": args.positions,
        "rounds": rounds,
        "wps_d300_over_d100": round(statistics.median(ratio), 4) if ratio else None,
        "machine": machine(),
    }


# ---- grid -------------------------------------------------------------------------------------


def _train_cell(args, d: int, c: int, out: Path, log: Path) -> tuple[list[str], dict | None]:
    """Train (or resume) one cell for one budget; the command and the call's figures."""
    cmd = ["train", *corpus_flags(args), "--tree", args.tree, "--dim", str(d), "--context", str(c)]
    cmd += ["--init-from", args.init_from] if args.init_from else []
    cmd += ["--epochs", str(args.epochs), "--quiet", "--out", str(out)]
    if args.collect:
        return cmd, None
    again = ["--resume"] if (out / "run.json").exists() else []
    budget = ["--time-budget", args.time_budget] if args.time_budget else []
    return cmd, run(cmd + again + budget, log, args.processes)


def _logged_peak_rss(log: Path) -> int | None:
    """The last peak RSS (MB) that ``/usr/bin/time -v`` wrote into a cell's log, for a run
    trained outside this script with its log there (``--collect``)."""
    if not log.exists():
        return None
    found = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", log.read_text(errors="replace"))
    return int(found[-1]) // 1024 if found else None


def vocab_suffix(max_vocab: int) -> str:
    """What a grid cell's key adds for its vocabulary: nothing at the default 50,000 words (the
    keys written before other vocabularies were run), ``-all`` for the corpus's own vocabulary
    (``--max-vocab 0``), ``-v18000`` for another cut."""
    return "" if max_vocab == 50000 else "-all" if not max_vocab else f"-v{max_vocab}"


def stage_grid(args) -> dict:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    previous = Path(args.out) / "scale_grid.json"
    rows = json.loads(previous.read_text())["cells"] if previous.exists() else {}
    for d, c in cells(args.cells):
        label = f"-{args.label}" if args.label else ""
        out, key = work / f"d{d}c{c}{label}", f"{d}x{c}{label}{vocab_suffix(args.max_vocab)}"
        cmd, call = _train_cell(args, d, c, out, work / f"d{d}c{c}{label}.log")
        lines = metrics(out)
        state = json.loads((out / "state.json").read_text())
        test = json.loads(run(["eval", str(out), "--threads", "1"], work / "eval.log")["stdout"])
        parts = lines[-1]["parts"]
        rows[key] = {
            "command": shown(cmd, args.processes),
            "dim": d,
            "context": c,
            "tree": args.label or Path(args.tree).stem,
            "vocab_size": json.loads((out / "run.json").read_text())["model"]["vocab_size"],
            "processes": args.processes,
            "test_ppl": test["perplexity"],
            "test_tokens": test["tokens"],
            "valid_ppl": min(x["valid_ppl"] for x in lines),
            "valid_curve": [round(x["valid_ppl"], 2) for x in lines],
            "epochs": len(lines),
            "passes": round(len(lines) / parts, 2),
            "stopped_by_schedule": bool(state.get("done")),
            "train_hours": round(sum(x["epoch_minutes"] for x in lines) / 60, 2),
            "words_per_sec": round(statistics.median(x["words_per_sec"] for x in lines)),
            "peak_rss_mb": call["peak_rss_mb"]
            if call
            else _logged_peak_rss(work / f"d{d}c{c}{label}.log") or rows.get(key, {}).get("peak_rss_mb"),
        }
        if args.interpolate:  # the cell mixed with the n-gram model, the weight tuned on valid
            mix = ["eval", str(out), "--interpolate", args.interpolate, "--weight", "auto"]
            mixed = json.loads(run(mix + ["--threads", "1"], work / "eval.log")["stdout"])
            rows[key].update(mixture_command="hlbl " + shlex.join(mix), mixture_test_ppl=mixed["perplexity"])
    return {"cells": rows, "machine": machine()}


# ---- paper ------------------------------------------------------------------------------------


def stage_paper(args) -> dict:
    work, out = Path(args.work) / "paper", Path(args.work) / "paper-out"
    cmd = ["reproduce", "--data", args.data, "--flat-epochs", "0", "--threads", "1", "--quiet"]
    cmd += ["--max-train-tokens", str(args.max_train_tokens), "--max-vocab", str(args.max_vocab)]
    cmd += (["--skip", args.skip] if args.skip else []) + (["--quick"] if args.quick else [])
    run(cmd + ["--work", str(work), "--out", str(out)], Path(args.work) / "paper.log")
    rows = json.loads((out / "results.json").read_text())["rows"]
    tables = {r["name"]: r for r in rows}
    mix = ["eval", str(work / "runs" / "T7"), "--interpolate", str(work / "kn5.safetensors"), "--weight", "auto"]
    mixed = json.loads(run(mix + ["--threads", "1"], Path(args.work) / "paper.log")["stdout"]) if "T7" in tables else {}
    return {
        "command": "hlbl " + shlex.join(cmd),
        "mixture_command": "hlbl " + shlex.join(mix),
        "train_tokens": args.max_train_tokens,
        "vocab_size": args.max_vocab,
        "rows": {n: {k: r.get(k) for k in ("model", "tree", "test_perplexity", "valid_perplexity", "words_per_sec", "epochs")} for n, r in tables.items()},
        "mixture_test_ppl": mixed.get("perplexity"),
        "mixture_weight": mixed.get("weight"),
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", nargs="?", choices=["dims", "grid", "paper"])
    add_common(ap, data="gutenberg")
    ap.add_argument("--work", default="runs/scale", help="run directories (kept: a stage resumes them)")
    ap.add_argument("--out", default="results/gutenberg", help="where the stages' JSON files go")
    ap.add_argument("--max-vocab", type=int, default=50000, help="words kept (0: the corpus's default vocabulary)")
    ap.add_argument("--tree", help="dims, grid: the tree file every cell trains on")
    ap.add_argument("--cells", default=CELLS, help=f"dims, grid: feature size x context words (default {CELLS})")
    ap.add_argument("--rounds", type=int, default=2, help="dims: rounds of the cells, alternating")
    ap.add_argument("--positions", type=int, default=1_000_000, help="dims: training positions a cell's run")
    ap.add_argument("--epochs", type=int, default=100, help="grid: epoch cap (the schedule stops a run first)")
    ap.add_argument("--time-budget", default=None, help="grid: training time of one call (e.g. 2h); then resume")
    ap.add_argument("--collect", action="store_true", help="grid: read the cells' runs as they are, no training")
    ap.add_argument("--interpolate", default=None, help="grid: also mix each cell with this n-gram model")
    ap.add_argument("--label", default=None, help="grid: names the tree in the cells' keys (several trees, one file)")
    ap.add_argument("--init-from", default=None, help="grid: warm-start every cell from this run (a bootstrap round)")
    ap.add_argument("--processes", type=int, default=1, help="grid: train each cell in this many processes (torchrun)")
    ap.add_argument("--max-train-tokens", type=int, default=14_000_000, help="paper: training tokens")
    ap.add_argument("--skip", default=None, help="paper: rows left out, as for hlbl reproduce --skip")
    args = ap.parse_args(argv)
    if args.quick:
        finish_args(args, rounds=1, positions=2000, cells="16x2,24x2", epochs=2, max_vocab=0, max_train_tokens=3000,
                    skip="T2,T3,T4,T5,T6", work=str(quick_dir() / "scale"), out=str(quick_dir() / "scale"))  # fmt: skip
        args.tree = args.tree or "huffman"
    elif args.stage is None:
        ap.error("a stage (dims, grid, paper), or --quick")
    stages = [args.stage] if args.stage else ["dims", "grid", "paper"]
    for stage in stages:
        if stage in ("dims", "grid") and not args.tree:
            ap.error(f"{stage} needs --tree")
        result = {"dims": stage_dims, "grid": stage_grid, "paper": stage_paper}[stage](args)
        name = {"dims": "scale_dims", "grid": "scale_grid", "paper": "paper_regime"}[stage]
        path = write_json(Path(args.out) / f"{name}.json", result)
        print(json.dumps({"stage": stage, "written": str(path)}))
    print(f"peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

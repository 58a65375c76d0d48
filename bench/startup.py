"""How long a command takes to answer, start-up included: ``hlbl predict`` and ``hlbl score`` beside ``hlbl --help``.

    python bench/startup.py                      # a small PTB run (trained once, cached), 5 rounds
    python bench/startup.py --run runs/mine      # a given run
    python bench/startup.py --quick              # a check of the script: a tiny run, one round, 20 sentences

Each round starts, one after the other in fresh processes (``python -m hlbl``, the environment
of this script):

* ``help``: ``hlbl --help``, to its exit: the interpreter and the command line alone (no torch),
  the floor under every command on this machine at this moment;
* ``predict_first``: ``hlbl predict RUN --k 5``, from the start of the process to its first
  answer on stdout (one context written to its stdin, which is then closed);
* ``score``: ``hlbl score RUN`` on 100 sentences (the run's test split, first lines), to its exit;
* ``import_torch``: ``python -c "import torch"``, to its exit: the share of PyTorch's import
  (not in ``--quick``, which checks the script: a tiny run, one round, 20 sentences).

Wall seconds by ``time.perf_counter`` in this process, and the child's CPU seconds (user +
system, from ``RUSAGE_CHILDREN``); the median and range over ``--rounds`` rounds, after ``--warmup``
rounds that are not kept (the first may compile numba's kernels or fill the page cache). The commands of
a round run back to back, so a change in the machine's load touches them alike: compare
``predict_first`` and ``score`` with ``help`` of the same file. The targets (an idle
machine): the first answer of ``predict`` under 1.5 s, ``score`` of 100 sentences under 2 s.

The last line printed is one JSON object; ``--out`` (default ``results/startup.json``) gets it
with the machine and its load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import subprocess
import sys
import time
from pathlib import Path

from _common import add_common, finish_args, machine, quick_run, spread, write_json

HLBL = [sys.executable, "-m", "hlbl"]
TARGETS = {"predict_first": 1.5, "score": 2.0}  # seconds, on an idle machine
TIMEOUT_S = 600


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def to_exit(cmd: list[str], stdin: str = "") -> tuple[float, float]:
    """Wall and CPU seconds of ``cmd`` from its start to its exit (it must exit 0)."""
    cpu, t0 = _child_cpu(), time.perf_counter()
    res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr[-2000:]}")
    return wall, _child_cpu() - cpu


def to_first_line(cmd: list[str], line: str) -> tuple[float, float]:
    """Wall seconds of ``cmd`` from its start to its first line on stdout (``line`` written to its
    stdin), and its CPU seconds to its exit (stdin closed after the answer)."""
    cpu, t0 = _child_cpu(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(TIMEOUT_S)
    answer = proc.stdout.readline() if ready else ""
    wall = time.perf_counter() - t0
    proc.stdin.close()  # end of input: predict answers what it read and exits
    proc.stdout.read()
    err = proc.stderr.read()  # (a few lines at most: no pipe fills while stdout is read)
    proc.wait(TIMEOUT_S)
    if proc.returncode != 0 or not answer.strip():
        raise SystemExit(f"{' '.join(cmd)}: no answer (exit {proc.returncode}): {err[-2000:]}")
    return wall, _child_cpu() - cpu


def default_run(data: str, epochs: int) -> Path:
    """A small run of ``data`` (dim 50, context 3, Huffman tree), trained once into the cache."""
    from hlbl.cli import main as hlbl_main
    from hlbl.data import default_cache_dir

    run = default_cache_dir() / "bench-startup" / f"{Path(data).name}-e{epochs}"
    if not (run / "state.json").is_file():
        argv = ["train", "--data", data, "--out", str(run), "--epochs", str(epochs), "--dim", "50"]
        if hlbl_main([*argv, "--context", "3", "--tree", "huffman", "--quiet"]) != 0:
            raise SystemExit(f"hlbl {' '.join(argv)} failed")
    return run


def sentences(run: Path, n: int) -> str:
    """The first ``n`` non-blank lines of the run's test split (valid if it has none)."""
    from hlbl.data import run_corpus
    from hlbl.run import read_run

    root = run_corpus(read_run(run))
    path = root / "test.txt" if (root / "test.txt").is_file() else root / "valid.txt"
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(line.strip())
                if len(out) == n:
                    break
    return "\n".join(out) + "\n"


def measure(run: Path, rounds: int, n_sentences: int, warmup: int = 1, torch_import: bool = True) -> dict:
    text = sentences(run, n_sentences)
    context = text.split("\n", 1)[0].split()[:3]
    commands = {
        "help": lambda: to_exit([*HLBL, "--help"]),
        "predict_first": lambda: to_first_line([*HLBL, "predict", str(run), "--k", "5"], " ".join(context)),
        "score": lambda: to_exit([*HLBL, "score", str(run)], text),
        "import_torch": lambda: to_exit([sys.executable, "-c", "import torch"]),
    }
    if not torch_import:
        del commands["import_torch"]
    wall: dict[str, list[float]] = {k: [] for k in commands}
    cpu: dict[str, list[float]] = {k: [] for k in commands}
    first = {}
    for r in range(rounds + warmup):
        got = {k: fn() for k, fn in commands.items()}
        if r < warmup:
            first = {k: round(w, 3) for k, (w, _) in got.items()}
        else:
            for k, (w, c) in got.items():
                wall[k].append(w)
                cpu[k].append(c)
        print(
            f"round {r}{' (not kept)' if r < warmup else ''}: "
            + "  ".join(f"{k} {w:.2f} s" for k, (w, _) in got.items()),
            file=sys.stderr,
            flush=True,
        )
    out = {"wall_s": {k: spread(v) for k, v in wall.items()}, "cpu_s": {k: spread(v) for k, v in cpu.items()}}
    if first:
        out["first_round_wall_s"] = first
    out["above_help_s"] = {k: out["wall_s"][k]["median"] - out["wall_s"]["help"]["median"] for k in TARGETS}
    out["targets_s"] = TARGETS
    out["sentences"] = len(text.splitlines())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default=None, help="run directory (default: a small run of --data, trained once)")
    p.add_argument("--epochs", type=int, default=1, help="epochs of the default run")
    p.add_argument("--rounds", type=int, default=5, help="rounds kept")
    p.add_argument("--warmup", type=int, default=1, help="rounds first, not kept (--quick: none)")
    p.add_argument("--sentences", type=int, default=100, help="sentences scored")
    add_common(p, data="ptb", out="results/startup.json")
    args = finish_args(p.parse_args(argv), rounds=1, warmup=0, sentences=20)
    if args.run:
        run = Path(args.run)
    elif args.quick:
        run = quick_run("startup", "--dim", "16", "--context", "3", "--tree", "huffman")[0]
    else:
        run = default_run(args.data, args.epochs)
    result = {"run": str(run), **measure(run, args.rounds, args.sentences, args.warmup, not args.quick)}
    write_json(
        args.out,
        {
            **result,
            "machine": machine(),
            "command": " ".join(["python", "bench/startup.py", *(argv if argv is not None else sys.argv[1:])]),
        },
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

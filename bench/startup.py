"""How long an inference command takes to answer, from the shell: ``hlbl predict``'s first answer,
``hlbl score`` on 100 sentences, ``hlbl eval``, beside ``hlbl --help`` in the same rounds.

    python bench/startup.py                  # a small PTB run (trained once, cached), 5 rounds
    python bench/startup.py --run runs/x     # a given run directory
    python bench/startup.py --quick          # a check of the script: a run of the synthetic corpus, 1 round

Each round starts every command as a new process, in turn (so a loaded machine weighs on all of
them alike): ``hlbl --help`` (the interpreter and the parser: a floor no command goes under),
``hlbl predict RUN --k 5`` with one context on stdin, timed to its first line of output, ``hlbl
score RUN`` on the first 100 sentences of the corpus's test split, and ``hlbl eval RUN --split
test``, ``hlbl serve RUN --port 0`` timed to the line saying it listens (then stopped); then
``predict``, ``score`` and ``serve`` once more on the torch model (``Run.numpy_model`` refused in
the child), what the commands cost before inference without torch (docs/inference.md). Times
are wall-clock seconds, the median and the range over the rounds, and each process's CPU seconds
(user + system, the median), with the load average: on a
shared machine compare each command with ``--help`` in the same file, not across files.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import add_common, finish_args, machine, quick_run, write_json

# The torch path in a child: the run's numpy form refused, so the command loads the torch model.
TORCH_PATH = (
    "import sys; from hlbl.run import Run; Run.numpy_model = lambda self, which='best': None; "
    "from hlbl.cli import main; sys.exit(main(sys.argv[1:]))"
)


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _first_line_seconds(argv: list[str], stdin: str) -> tuple[float, float, float]:
    """(seconds to the first line of stdout, seconds to exit, CPU seconds) of ``argv`` fed ``stdin``."""
    cpu = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(stdin)
    proc.stdin.close()
    first = proc.stdout.readline()
    t_first = time.perf_counter() - start
    proc.stdout.read()
    err = proc.stderr.read()
    if proc.wait() != 0 or not first:
        raise SystemExit(f"{' '.join(argv)} failed: {err[-500:]}")
    return t_first, time.perf_counter() - start, _children_cpu() - cpu


def _serve_ready_seconds(argv: list[str]) -> tuple[float, float]:
    """(seconds until ``hlbl serve`` says it listens, CPU seconds) of ``argv``; the server is then stopped."""
    cpu = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("hlbl: serving"):
            break
    ready = time.perf_counter() - start
    proc.terminate()
    proc.stderr.read()
    proc.wait()
    if not seen or not seen[-1].startswith("hlbl: serving"):
        raise SystemExit(f"{' '.join(argv)} failed: {''.join(seen)[-500:]}")
    return ready, _children_cpu() - cpu


def _commands(run: Path, sentences: str) -> dict[str, tuple[list[str], str]]:
    hlbl = [sys.executable, "-m", "hlbl"]
    torch = [sys.executable, "-c", TORCH_PATH]
    return {
        "help": (hlbl + ["--help"], ""),
        "predict_first_answer": (hlbl + ["predict", str(run), "--k", "5"], "the company said\n"),
        "score_100": (hlbl + ["score", str(run)], sentences),
        "eval_test": (hlbl + ["eval", str(run), "--split", "test"], ""),
        "serve_ready": (hlbl + ["serve", str(run), "--port", "0"], ""),
        "predict_first_answer_torch": (torch + ["predict", str(run), "--k", "5"], "the company said\n"),
        "score_100_torch": (torch + ["score", str(run)], sentences),
        "serve_ready_torch": (torch + ["serve", str(run), "--port", "0"], ""),
    }


def _small_run(data: str) -> Path:
    """A small PTB run (dim 16, context 3, one epoch), trained once into the cache."""
    from hlbl.cli import main
    from hlbl.data import default_cache_dir

    run = default_cache_dir() / "bench-startup" / "run"
    if not (run / "best.safetensors").is_file():
        argv = ["train", "--data", data, "--out", str(run), "--epochs", "1", "--dim", "16", "--context", "3"]
        if main(argv + ["--threads", "1", "--quiet"]) != 0:
            raise SystemExit("training the benchmark's run failed")
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_common(ap, data="ptb", out="results/startup.json")
    ap.add_argument("--run", default=None, help="run directory (default: a small PTB run, trained once)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of all the commands (default 5)")
    args = finish_args(ap.parse_args(), rounds=1)
    if args.quick:
        run = quick_run("startup")[0]
    else:
        run = Path(args.run) if args.run else _small_run(args.data)
    from hlbl.run import Run

    record = Run.open(run).record
    corpus = record.corpus.directory()
    lines = [x for x in (corpus / "test.txt").read_text(encoding="utf-8").splitlines() if x.strip()][:100]
    commands = _commands(run, "\n".join(lines) + "\n")
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, (argv, stdin) in commands.items():
            if name.startswith("serve"):
                ready, cpu = _serve_ready_seconds(argv)
                times[name].append(ready)
            else:
                first, total, cpu = _first_line_seconds(argv, stdin)
                times[name].append(first if name.startswith("predict") else total)
            cpus[name].append(cpu)  # (predict: the whole process, one context)
    summary = {
        name: {
            "median_s": round(statistics.median(t), 3),
            "min_s": round(min(t), 3),
            "max_s": round(max(t), 3),
            "cpu_median_s": round(statistics.median(cpus[name]), 3),
        }
        for name, t in times.items()
    }
    # The run by what it is (its model and corpus), not by where it lies.
    result = {
        "model": asdict(record.model),
        "corpus": record.corpus.spec,
        "sentences": len(lines),
        "rounds": args.rounds,
        "seconds": summary,
        **machine(),
    }
    write_json(args.out, result)
    for name, s in summary.items():
        print(
            f"{name:28s} {s['median_s']:7.3f} s  ({s['min_s']:.3f} .. {s['max_s']:.3f}), CPU {s['cpu_median_s']:.3f} s"
        )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

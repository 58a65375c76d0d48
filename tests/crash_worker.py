"""Crash sweep for tests/test_crash.py (run as a script, not collected by pytest).

    python crash_worker.py CORPUS WORKDIR FLAGS_JSON [N ... | every:K]

Runs ``hlbl train FLAGS --data CORPUS`` once without interruption (the reference), then, for
each kill point N (default: every file operation of the reference run; ``every:K``: every Kth,
from the first, and the last), a training that ends
with ``os._exit`` at its Nth file operation (the HLBL_TEST_CRASH_AFTER hook: no cleanup, as
kill -9), or (``kill:N``) that is paused there (HLBL_TEST_PAUSE_AFTER) and killed with a real
SIGKILL, followed by ``hlbl train --resume`` with the same flags. Prints one JSON object: the
number of file operations of the reference and, per kill point, the resume's outcome.

Each run is a forked child of this process, which imports torch and hlbl once and never runs a
torch operation itself (a fork after one could inherit a thread pool in a bad state); that keeps
a sweep of ~100 runs to seconds. The children use the torch engine and skip the sample lines:
what is tested is the writing and reading of the run directory, not the numba kernels.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
# An optimiser's first construction imports torch._dynamo (seconds): once here, not in each child.
torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

from hlbl import atomic  # noqa: E402
from hlbl.cli import main  # noqa: E402
from hlbl.cli import train as cli_train  # noqa: E402
from hlbl.data import load_corpus  # noqa: E402

CLOCK = {"words_per_sec", "epoch_minutes", "elapsed_s"}


def child(argv: list[str], env: dict[str, str], log: Path, kill_when: str | None = None) -> int:
    """Run ``hlbl argv`` in a forked child; its exit status. ``kill_when``: a line that, once the
    child has written it to its log, makes this process kill the child with SIGKILL."""
    log.touch()  # before the fork: this process may read it before the child writes
    start = log.stat().st_size
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            atomic._ops[0] = 0  # count this run's operations only
            os.environ.update(env)
            cli_train.show_sample = lambda *a, **k: None
            rc = main(argv)
            if env.get("COUNT_TO"):
                Path(env["COUNT_TO"]).write_text(str(atomic.file_operations()))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
        except BaseException:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(99)
    if kill_when is not None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            with open(log, "rb") as f:
                f.seek(start)
                if kill_when.encode() in f.read():
                    os.kill(pid, signal.SIGKILL)
                    break
            time.sleep(0.02)
        else:
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def result(run: Path) -> dict:
    """What must be the same as the reference: the final weights and optimiser bytes, the metrics
    without their clock readings."""
    out = {name: (run / name).read_bytes().hex() for name in ("best.safetensors", "last.safetensors")}
    found = sorted((run / "checkpoints").iterdir())
    out["checkpoints"] = [p.name for p in found]
    out["optimizer"] = (found[-1] / "optimizer.safetensors").read_bytes().hex()
    out["metrics"] = [
        {k: v for k, v in json.loads(x).items() if k not in CLOCK}
        for x in (run / "metrics.jsonl").read_text().splitlines()
    ]
    out["leftovers"] = sorted(
        str(p.relative_to(run)) for p in run.rglob("*") if ".tmp" in p.name or ".partial" in p.name
    )
    return out


def main_() -> None:
    corpus, work, flags = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    points = sys.argv[4:]  # N: os._exit at operation N; kill:N: SIGKILL while paused at operation N
    os.environ["HLBL_CACHE"] = str(work / "cache")
    load_corpus(corpus, splits=("train", "valid"))  # fills the cache before any fork (no torch here)
    args = ["train", "--data", corpus, *flags]
    log = work / "log.txt"
    ops_file = work / "ops"
    env = {"COUNT_TO": str(ops_file)}
    rc = child([*args, "--out", str(work / "ref")], env, log)
    if rc != 0:
        raise SystemExit(f"reference run failed ({rc}): {log.read_text()[-2000:]}")
    reference = result(work / "ref")
    total = int(ops_file.read_text())
    report = {"operations": total, "points": {}}

    def unit(point: str) -> str:
        """Kill a run at ``point``, resume it, compare: the outcome in words."""
        n = int(point.removeprefix("kill:"))
        run = work / f"k{point.replace(':', '')}"
        log = work / f"log-{point.replace(':', '')}.txt"  # one per point: kill_when reads it
        if point.startswith("kill:"):
            crashed = child(
                [*args, "--out", str(run)],
                {"HLBL_TEST_PAUSE_AFTER": str(n)},
                log,
                kill_when=f"paused at file operation {n} ",
            )
            crashed = atomic.CRASH_EXIT_STATUS if crashed == -signal.SIGKILL else crashed
        else:
            crashed = child([*args, "--out", str(run)], {"HLBL_TEST_CRASH_AFTER": str(n)}, log)
        resumed = child([*args, "--out", str(run), "--resume"], {}, log)
        if crashed != atomic.CRASH_EXIT_STATUS:
            return f"the first run ended with {crashed}, not at its kill point"
        if resumed != 0:
            return f"resume exited {resumed}: {log.read_text()[-300:]}"
        got = result(run)
        return (
            "identical"
            if got == reference
            else "differs: " + ", ".join(k for k in reference if got.get(k) != reference[k])
        )

    # Points run JOBS at a time, each in a forked process of its own (which forks the two runs).
    jobs = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2))
    running: dict[int, str] = {}
    if points and points[0].startswith("every:"):  # every:K: operations 1, 1 + K, ... and the last
        points = [str(n) for n in sorted({*range(1, total + 1, int(points[0][6:])), total})]
    todo = list(points or [str(n) for n in range(1, total + 1)])
    while todo or running:
        while todo and len(running) < jobs:
            point = todo.pop(0)
            pid = os.fork()
            if pid == 0:
                try:
                    outcome = unit(point)
                except BaseException as e:
                    outcome = f"the sweep failed: {e!r}"
                (work / f"outcome-{point.replace(':', '')}").write_text(outcome)
                os._exit(0)
            running[pid] = point
        pid, _ = os.wait()
        point = running.pop(pid)
        path = work / f"outcome-{point.replace(':', '')}"
        report["points"][point] = path.read_text() if path.exists() else "the sweep process died"
    report["points"] = dict(sorted(report["points"].items(), key=lambda kv: int(kv[0].removeprefix("kill:"))))
    print(json.dumps(report))


if __name__ == "__main__":
    main_()

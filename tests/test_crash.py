"""Crash safety: a training killed at any file operation of its run resumes to the uninterrupted
run's final weights, bit for bit (finding 2 of the crash-safety issue: a kill during the
end-of-epoch checkpoint used to leave runs that no resume would take, and temporary files that
nothing removed).

The sweep runs in tests/crash_worker.py (forked children of one process, so ~120 runs take
seconds, not minutes of interpreter start-ups)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import write_corpus

HERE = Path(__file__).parent
FLAGS = [
    "--epochs",
    "2",
    "--dim",
    "8",
    "--context",
    "3",
    "--batch-size",
    "64",
    "--engine",
    "torch",
    "--device",
    "cpu",
    "--quiet",
]


def small_corpus(root: Path) -> Path:
    """Train and valid only (no test split: the run ends without the numba test scorer)."""
    rng = np.random.default_rng(0)
    words = ["the", "cat", "dog", "sees", "a", "bird", "red", "big"]
    return write_corpus(
        root, {s: [" ".join(rng.choice(words, 6)) for _ in range(n)] for s, n in (("train", 150), ("valid", 30))}
    )


def sweep(tmp_path: Path, points: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("HLBL_TEST_CRASH_AFTER", None)
    env.pop("HLBL_TEST_PAUSE_AFTER", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "crash_worker.py"),
            str(small_corpus(tmp_path / "corpus")),
            str(tmp_path),
            json.dumps(FLAGS),
            *points,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


STRIDE = 5  # the quicker sweep: every 5th file operation (each step of a checkpoint is a few operations long)


@pytest.mark.slow  # ~120 kill points, each a training and its resume: about 50 CPU-seconds
def test_a_kill_at_every_file_operation_resumes_bit_identically(tmp_path):
    check_sweep(tmp_path, [], every=1)


def test_a_kill_at_every_fifth_file_operation_resumes_bit_identically(tmp_path):
    """The same sweep at a stride (a fifth of the cost), kept in the default suite: kill points in
    every phase of the run (its start, each checkpoint and its publication), and the last one."""
    check_sweep(tmp_path, [f"every:{STRIDE}"], every=STRIDE)


def check_sweep(tmp_path: Path, points: list[str], every: int) -> None:
    start = time.perf_counter()
    report = sweep(tmp_path, points)
    took = time.perf_counter() - start
    points = report["points"]
    # Two epochs: the run's start (vocab, tree, run.json, metrics), two checkpoints and their publication.
    total = report["operations"]
    assert total >= 40, report
    assert [int(n) for n in points] == sorted({*range(1, total + 1, every), total})
    bad = {n: outcome for n, outcome in points.items() if outcome != "identical"}
    assert not bad, bad
    print(f"{len(points)} kill points in {took:.1f} s")


def test_real_sigkills_during_checkpoints_resume_bit_identically(tmp_path):
    """SIGKILL from outside while the writer is paused: inside the first checkpoint, between its
    commit and the publication of the top-level files, and while the second one's files are written."""
    report = sweep(tmp_path, ["kill:5", "kill:22", "kill:33", "kill:45"])
    assert report["points"] == {p: "identical" for p in ["kill:5", "kill:22", "kill:33", "kill:45"]}, report

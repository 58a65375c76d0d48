"""Reading a training file into ids: the single pass against byte ranges on every core.

    python bench/scan.py --file PATH --out results/scan.json   # 3 rounds
    python bench/scan.py --quick                               # a check of the script

``hlbl.data.scan_file`` (count the words, write provisional ids) with ``workers=1`` and with
``--workers`` (default: every core), alternately in each round. Each run reports its wall time,
this process's CPU time and its workers' CPU time (``RUSAGE_CHILDREN``: the child interpreters,
their start-up included), so that a run on a loaded machine still shows how the work divides:
on idle cores the parallel wall time is about the workers' CPU time over the cores plus the
parent's. The two passes' outputs are checked equal (words, counts, ids).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

from _common import add_common, finish_args, machine, quick_dir, spread, tiny_corpus, write_json
from hlbl.data import scan as scan_mod
from hlbl.data import scan_file


def _children_cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def one(path: Path, ids: Path, workers: int):
    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu()
    s = scan_file(path, ids, workers=workers)
    r = {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "workers_cpu_s": _children_cpu() - k0,
    }
    return r, s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", help="the text file to read (a corpus's train.txt)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=scan_mod.workers_available())
    add_common(ap, out="results/scan.json", optional_out=True)
    args = finish_args(ap.parse_args(), rounds=1, workers=2)
    if args.quick:
        args.file = str(tiny_corpus(quick_dir() / "corpus") / "train.txt")
        scan_mod.MIN_RANGE_BYTES = 1 << 10  # (this process cuts the ranges: small ones, to have several)
    if not args.file:
        ap.error("--file PATH, or --quick")
    path = Path(args.file)
    work = Path(args.out).parent if args.out else quick_dir()
    runs: dict[str, list[dict]] = {"1": [], str(args.workers): []}
    for _ in range(args.rounds):
        held = []
        for w in (1, args.workers):
            r, s = one(path, work / f".scan-bench-{w}.i32", w)
            runs[str(w)].append(r)
            held.append(s)
        a, b = held
        same = a.words == b.words and np.array_equal(a.counts, b.counts) and a.ids.read_bytes() == b.ids.read_bytes()
        for s in held:
            s.ids.unlink()
        if not same:
            raise SystemExit("the parallel pass differs from the single pass")
    result = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "workers": args.workers,
        "wall_s": {w: spread([r["wall_s"] for r in v]) for w, v in runs.items()},
        "speedup_wall": float(np.median([x["wall_s"] / y["wall_s"] for x, y in zip(*runs.values())])),
        "rounds": runs,
        "machine": machine(),
    }
    for w, v in runs.items():
        last = v[-1]
        print(
            f"workers {w}: {last['wall_s']:.2f} s wall, {last['cpu_s']:.2f} CPU-s here, "
            f"{last['workers_cpu_s']:.2f} CPU-s in workers",
            file=sys.stderr,
        )
    print(f"wall-time speed-up (median of rounds): {result['speedup_wall']:.2f}x", file=sys.stderr)
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()

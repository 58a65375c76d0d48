"""Reading a training file into ids: the Python pass against the byte kernel, on one core and on every core.

    python bench/scan.py --file PATH --out results/scan.json   # 3 rounds
    python bench/scan.py --quick                               # a check of the script

``hlbl.data.scan_file`` (count the words, write provisional ids) with ``workers=0`` (the Python
pass over the lines, the text rules' reference), ``workers=1`` (the byte kernel in one thread) and
``--workers`` (default: every core), in turn in each round, after one untimed call of the kernel
(its compilation or its load from numba's cache is once per process). Each run reports its wall
time and this process's CPU time (all its threads), so that a run on a loaded machine still shows
the work. The outputs are checked equal (words, counts, ids); ratios are per round, medians.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from _common import add_common, finish_args, machine, quick_dir, spread, tiny_corpus, write_json
from hlbl.data import scan as scan_mod
from hlbl.data import scan_file


def one(path: Path, ids: Path, workers: int):
    t0, c0 = time.perf_counter(), time.process_time()
    s = scan_file(path, ids, workers=workers)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}, s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", help="the text file to read (a corpus's train.txt)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=scan_mod.workers_available())
    add_common(ap, out="results/scan.json", optional_out=True)
    args = finish_args(ap.parse_args(), rounds=1, workers=2)
    if args.quick:
        args.file = str(tiny_corpus(quick_dir() / "corpus") / "train.txt")
        scan_mod.MIN_RANGE_BYTES = 1 << 10  # (small ranges and blocks, to have several)
        scan_mod.BLOCK_BYTES = 1 << 12
    if not args.file:
        ap.error("--file PATH, or --quick")
    path = Path(args.file)
    work = Path(args.out).parent if args.out else quick_dir()
    counts = sorted({0, 1, args.workers})
    one(path, work / ".scan-bench-warm.i32", 1)[1].ids.unlink()  # the kernel, compiled or loaded
    runs: dict[str, list[dict]] = {str(w): [] for w in counts}
    for _ in range(args.rounds):
        held = []
        for w in counts:
            r, s = one(path, work / f".scan-bench-{w}.i32", w)
            runs[str(w)].append(r)
            held.append(s)
        a = held[0]
        same = all(
            b.words == a.words and np.array_equal(b.counts, a.counts) and b.ids.read_bytes() == a.ids.read_bytes()
            for b in held[1:]
        )
        for s in held:
            s.ids.unlink()
        if not same:
            raise SystemExit("the byte kernel's pass differs from the Python pass")

    def speedup(w: int, field: str = "wall_s") -> float:
        return float(np.median([x[field] / y[field] for x, y in zip(runs["0"], runs[str(w)])]))

    result = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "workers": args.workers,
        "wall_s": {w: spread([r["wall_s"] for r in v]) for w, v in runs.items()},
        "cpu_s": {w: spread([r["cpu_s"] for r in v]) for w, v in runs.items()},
        "speedup_wall": {str(w): speedup(w) for w in counts if w},
        "speedup_cpu": {str(w): speedup(w, "cpu_s") for w in counts if w},
        "rounds": runs,
        "machine": machine(),
    }
    for w, v in runs.items():
        last = v[-1]
        what = "the Python pass" if w == "0" else f"the byte kernel, {w} thread(s)"
        print(f"{what}: {last['wall_s']:.3f} s wall, {last['cpu_s']:.3f} CPU-s", file=sys.stderr)
    for w, x in result["speedup_wall"].items():
        print(
            f"{w} thread(s) against the Python pass (median of rounds): {x:.2f}x wall, "
            f"{result['speedup_cpu'][w]:.2f}x CPU",
            file=sys.stderr,
        )
    if args.out:
        write_json(args.out, result)


if __name__ == "__main__":
    main()

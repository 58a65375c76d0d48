"""The machine's cost of touching a cold row: the floor under the fast engine's speed at large V.

    python bench/memfloor.py            # about 1 minute, 1.7 GB of memory
    python bench/memfloor.py --quick    # a check of the script: 20,000 rows, 3 rounds

At V = 1M a training step meets thousands of rows that are in no cache (docs/engine.md). This
times, on one thread, what bringing such a row up to date costs with nothing else going on: V = 1M
rows of d = 100 float32 parameters and their momentum rows (2 x 400 MB, on huge pages where the
kernel allows, as in the engine), 7,700 random rows a round (a step's worth), each row
prefetched ``--ahead`` rows in advance into the L2 cache as the engine's loops do (prefetcht1):

- ``read``: read the parameter row and the momentum row (the least any exact lazy step can do);
- ``update``: the catch-up's read-modify-write of both rows and the row's step stamp;
- ``update_one_record``: the same with parameters, momentum and stamp stored together in one
  832-byte record (a layout the engine does not use: no faster there, see ``hlbl.fast``);
- ``update_prefetchw``, ``update_one_record_prefetchw``: the same two with write prefetches into
  L1 (prefetchw, what the engine used before; each holds an L1 miss buffer until its line comes);
- ``update_second_visit``: ``update`` on rows that the same kind of update touched just before
  (untimed, in another order): what a step's second pass over its rows costs once the first has
  brought them in (they no longer fit the L2 cache, so this is mostly the L3's cost).

Median of ``--rounds`` passes, ns per row. One JSON line at the end; ``--out`` also writes it
to a file (``--quick``: always, in a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from numba import njit

from _common import add_common, finish_args, machine, write_json
from hlbl.intrinsics import prefetch as _prefetch, prefetch_intrinsic, prefetch_row as _prefetch_row
from hlbl.memory import prefer_huge_pages


@njit(fastmath=True, cache=True)
def _read(rows, W, M, ahead):
    acc = np.float32(0.0)
    for r in range(rows.shape[0]):
        if r + ahead < rows.shape[0]:
            _prefetch_row(W, rows[r + ahead])
            _prefetch_row(M, rows[r + ahead])
        j = rows[r]
        for k in range(W.shape[1]):
            acc += W[j, k] + M[j, k]
    return acc


def _kernels(prefetch):
    """(update, update_record) prefetching with ``prefetch`` (an intrinsic of kernels.prefetch_intrinsic)."""

    @njit(fastmath=True)
    def update(rows, W, M, last, step, ahead):
        for r in range(rows.shape[0]):
            if r + ahead < rows.shape[0]:
                ja = rows[r + ahead]
                for off in range(0, W.shape[1] * 4, 64):
                    prefetch(W, ja, off)
                    prefetch(M, ja, off)
                prefetch(last, ja, 0)
            j = rows[r]
            a = np.float32(1.0 - 1e-6 * (step - last[j]))
            for k in range(W.shape[1]):
                p, m = W[j, k], M[j, k]
                W[j, k] = a * p - np.float32(1e-3) * m
                M[j, k] = np.float32(0.9) * m + np.float32(1e-5) * p
            last[j] = step

    @njit(fastmath=True)
    def update_record(rows, X, d, step, ahead):
        for r in range(rows.shape[0]):
            if r + ahead < rows.shape[0]:
                for off in range(0, X.shape[1] * 4, 64):
                    prefetch(X, rows[r + ahead], off)
            j = rows[r]
            a = np.float32(1.0 - 1e-6 * (step - np.int32(X[j, 2 * d])))
            for k in range(d):
                p, m = X[j, k], X[j, d + k]
                X[j, k] = a * p - np.float32(1e-3) * m
                X[j, d + k] = np.float32(0.9) * m + np.float32(1e-5) * p
            X[j, 2 * d] = step

    return update, update_record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=7_700, help="random rows a round (one step's worth at V = 1M)")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--ahead", type=int, default=6, help="prefetch distance in rows (the engine's)")
    add_common(ap, out="memfloor.json", optional_out=True)
    args = finish_args(ap.parse_args(argv), rows=20_000, per_round=500, rounds=3)
    V, d = args.rows, args.dim
    rng = np.random.default_rng(0)
    W = rng.random((V, d), dtype=np.float32)
    M = rng.random((V, d), dtype=np.float32)
    last = np.zeros(V, np.int32)
    X = np.zeros((V, 2 * d + 8), np.float32)  # parameters | momentum | stamp, padded to 64 bytes
    prefer_huge_pages(W, M, X)
    X[:, : 2 * d] = rng.random((V, 2 * d), dtype=np.float32)
    _update, _update_record = _kernels(_prefetch)  # the engine's prefetch: a read into L2
    _update_w, _update_record_w = _kernels(prefetch_intrinsic(write=True, locality=3))  # prefetchw (into L1)
    kinds = {
        "read": lambda rows, s: _read(rows, W, M, args.ahead),
        "update": lambda rows, s: _update(rows, W, M, last, s, args.ahead),
        "update_one_record": lambda rows, s: _update_record(rows, X, d, s, args.ahead),
        "update_prefetchw": lambda rows, s: _update_w(rows, W, M, last, s, args.ahead),
        "update_one_record_prefetchw": lambda rows, s: _update_record_w(rows, X, d, s, args.ahead),
        "update_second_visit": lambda rows, s: _update(rows, W, M, last, s, args.ahead),
    }
    first_visit = {"update_second_visit": lambda rows, s: _update(rng.permutation(rows), W, M, last, s - 1, args.ahead)}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for k, f in kinds.items():  # compile
        f(rng.integers(0, V, 100), 1)
    for s in range(1, args.rounds + 1):
        for k, f in kinds.items():  # interleaved: a burst of load hits every kind alike
            rows = rng.integers(0, V, args.per_round)  # each its own rows: none left in cache by another
            if k in first_visit:
                first_visit[k](rows, s)
            t = time.perf_counter()
            f(rows, s)
            times[k].append((time.perf_counter() - t) / len(rows) * 1e9)
    best = {k: float(np.median(v)) for k, v in times.items()}
    for k, v in best.items():
        print(f"{k:<28} {v:6.1f} ns per row ({v / ((2 * d * 4) / 64):.1f} ns per 64-byte line)", file=sys.stderr)
    result = {"rows": V, "dim": d, "ns_per_row": {k: round(v, 1) for k, v in best.items()}}
    if args.out:
        write_json(args.out, {**result, "machine": machine()})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a step of the fast engine spends its time, phase by phase (one thread), at V = 10k and 1M.

    python bench/phases.py                  # about 1 minute, ~2.5 GB of memory at V = 1M
    python bench/phases.py --sizes 10000

Same setting as ``bench/scaling.py`` (synthetic Zipf(1) corpus, BALANCED tree in frequency order,
d = 100, context 5, batch 1000, SGD with momentum and L2). After ``--warm`` ordinary steps (so the
momentum buffers exist and every page has been touched), ``--batches`` steps are replayed with the
kernels of ``hlbl.kernels._step`` called one at a time and timed: gather + grouping, the catch-up of
the rows the batch touches, forward/backward, and the updates of the node rows and of the word
rows (with C). Milliseconds per batch, median over the steps; one JSON line at the end.

``--fold N`` (default 4096; 0 = off) adds, per size, the same steps with every row id folded into
``id % N`` after gathering: the same arithmetic (paths of the same depth, the same number of
(example, row) pairs), but on rows that stay in the caches. The difference between the two runs is
what memory costs a step; ``folded_ms_per_batch`` is the arithmetic alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

PHASES = ("gather_group", "catch_up", "forward_backward", "update_nodes", "update_words")


def profile(V: int, batches: int, warm: int, tokens: int, fold: int = 0) -> dict:
    import torch

    from hlbl import fast, kernels
    from hlbl.data import epoch_order
    from hlbl.model import LBL, LBLConfig
    from hlbl.train import TrainConfig, make_optimizer
    from hlbl.tree import balanced_tree
    from throughput import zipf_stream

    torch.set_num_threads(1)
    stream = zipf_stream(V, tokens, seed=2)
    model = LBL(LBLConfig(V, dim=100, context=5), balanced_tree(np.arange(V)), torch.Generator().manual_seed(0))
    model.init_unigram(np.bincount(stream, minlength=V).astype(np.float64))
    cfg = TrainConfig(progress=False)
    opt = make_optimizer(model, cfg, cfg.lr)
    fast.train_epoch(model, opt, stream, 0, cfg, 1, False, threads=1, max_batches=warm)

    # The state fast.train_epoch builds for an epoch, then _step's body one kernel at a time.
    o = fast._Optim(model, opt)
    P = o.powers(batches)
    R, C, Q, qb = (fast._np(t) for t in (model.R.weight, model.C, model.out.weight, model.out.bias))
    Rbuf, Cbuf, Qbuf, qbbuf = (o.buf[k] for k in ("R", "C", "Q", "qb"))
    pnodes, psign, pdepth, wleaves = fast._tree_tables(model.out)
    N, n, d, B = Q.shape[0], C.shape[0], R.shape[1], cfg.batch_size
    last_w, last_n = np.zeros(V, np.int32), np.zeros(N, np.int32)
    K, D = wleaves.shape[1], pnodes.shape[1]
    (ctx, keys, h, dh, gs, plp, nll, gC, slot_n, slot_w, uniq_n, start_n, ent_n, uniq_w, start_w, ent_w,
     cursor, g, empty) = fast._workspace(B, n, d, K, D, V, N)
    hyper = o.matrix
    order = epoch_order(cfg.seed, 2, len(stream))
    times = {p: [] for p in PHASES}
    for t in range(1, batches + 1):
        pos = order[(t - 1) * B : t * B]
        c0 = time.perf_counter()
        kernels._gather(stream, pos, 0, pnodes, pdepth, wleaves, ctx, keys)
        if fold:
            np.remainder(keys, fold, out=keys, where=keys >= 0)  # -1 (no node) stays -1
            np.remainder(ctx, fold, out=ctx)
        nu_n = kernels._csr(keys.ravel(), slot_n, uniq_n, start_n, cursor, ent_n)
        nu_w = kernels._csr(ctx.ravel(), slot_w, uniq_w, start_w, cursor, ent_w)
        c1 = time.perf_counter()
        kernels._catch_up(uniq_n[:nu_n], Q, Qbuf, qb, qbbuf, last_n, t - 1, P["Q"], hyper[1, 1], P["qb"], hyper[2, 1])
        kernels._catch_up(uniq_w[:nu_w], R, Rbuf, empty, empty, last_w, t - 1, P["R"], hyper[0, 1], P["qb"], 0.0)
        c2 = time.perf_counter()
        kernels._forward_backward(stream, pos, R, C, Q, qb, psign, pdepth, wleaves, ctx, keys, h, dh, gs, plp, nll, gC)
        c3 = time.perf_counter()
        kernels._update_nodes(uniq_n, nu_n, start_n, ent_n, K * D, gs.ravel(), h, Q, Qbuf, qb, qbbuf, hyper, last_n, t, g)
        c4 = time.perf_counter()
        kernels._update_words(uniq_w, nu_w, start_w, ent_w, C, dh, R, Rbuf, hyper, last_w, t, g)
        for i in range(n):
            kernels._sgd_row(C[i], Cbuf[i], gC[i], hyper[1, 0], hyper[1, 1], hyper[1, 2])
        c5 = time.perf_counter()
        for p, dt in zip(PHASES, (c1 - c0, c2 - c1, c3 - c2, c4 - c3, c5 - c4)):
            times[p].append(dt * 1e3)
    ms = {p: round(float(np.median(v)), 3) for p, v in times.items()}
    return {"V": V, "depth": int(pdepth.max()), "ms_per_batch": ms, "total_ms": round(sum(ms.values()), 3),
            "distinct_rows_per_batch": int(nu_n + nu_w)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,1000000")
    ap.add_argument("--batches", type=int, default=200, help="steps replayed and timed")
    ap.add_argument("--warm", type=int, default=300, help="ordinary steps first")
    ap.add_argument("--tokens", type=int, default=1_500_000)
    ap.add_argument("--fold", type=int, default=4096, help="also time the steps with row ids folded into id %% N (0: no)")
    args = ap.parse_args(argv)
    rows = []
    for V in (int(x) for x in args.sizes.split(",")):
        r = profile(V, args.batches, args.warm, args.tokens)
        runs = [("", r)]
        if args.fold:
            f = profile(V, args.batches, args.warm, args.tokens, args.fold)
            r["folded_ms_per_batch"], r["folded_total_ms"] = f["ms_per_batch"], f["total_ms"]
            r["folded_distinct_rows_per_batch"] = f["distinct_rows_per_batch"]
            runs.append((f" folded %{args.fold}", f))
        for tag, x in runs:
            print(f"V={V:>9,}{tag} depth {x['depth']:>2}  " + "  ".join(f"{p} {v:.2f}" for p, v in x["ms_per_batch"].items())
                  + f"  total {x['total_ms']:.2f} ms/batch, {x['distinct_rows_per_batch']:,} rows", file=sys.stderr)
        rows.append(r)
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a step of the fast engine spends its time, phase by phase (one thread), at V = 10k and 1M.

    python bench/phases.py                  # about 2 minutes, ~2.5 GB of memory at V = 1M
    python bench/phases.py --sizes 10000 --blocks 64
    python bench/phases.py --quick          # a check of the script: V = 1,000, a few steps

Same setting as ``bench/scaling.py`` (synthetic Zipf(1) corpus, BALANCED tree in frequency order,
d = 100, context 5, batch 1000, SGD with momentum and L2). After ``--warm`` ordinary steps (so the
momentum buffers exist and every page has been touched), ``--rounds`` runs of ``--batches`` steps
each are timed by ``hlbl.fast.FastEngine``, whose step counts the CPU cycles of each phase
(``hlbl.kernels.PHASES``): gather + grouping, the catch-up of the rows the batch touches,
forward/backward, and the updates of the node rows and of the word rows. Milliseconds per batch
(the steps' wall time split in proportion to the cycles), fastest round; one JSON line at the end.

``--blocks`` compares block sizes (examples per block of a step, ``hlbl.fast.BLOCK``): 1000, one
block, is the step without blocking (each phase over the whole batch).

``--fold N`` (default 4096; 0 = off) adds, per size, the same runs with every token id of the
stream and every node id of the tree's paths folded into ``id % N``: the same arithmetic (paths
of the same depth, as many (example, row) pairs), but on rows that stay in the caches. The
difference between the two runs is what memory costs a step; the folded total is the arithmetic. ``--out`` also writes the JSON to a file (``--quick``: always, in a temporary
directory).
"""

from __future__ import annotations

import argparse
import json
import sys


from _common import add_common, finish_args, machine, write_json, zipf_model


def profile(V: int, blocks: list[int], batches: int, warm: int, rounds: int, tokens: int, fold: int = 0) -> dict:
    import torch

    from hlbl import fast
    from hlbl.kernels import PHASES

    torch.set_num_threads(1)
    stream, model, cfg, opt = zipf_model(V, tokens)
    engine = fast.FastEngine(threads=1)
    paths = engine.word_paths(model.out.tree)
    if fold:
        stream = stream % fold
        paths = paths._replace(codes=paths.codes.copy())
        steps = paths.codes[:, 1:]  # 2 * node + bit; the paths keep their lengths and directions
        steps[...] = (steps >> 1) % fold * 2 + (steps & 1)
    engine.use_paths(model.out.tree, paths)
    engine.train(model, opt, stream, 0, cfg, 1, False, fast.Probe(max_batches=warm))
    best = {}
    epoch = 2
    for _ in range(rounds):
        for S in blocks:  # interleaved, so that a noisy moment hits every block size
            probe = fast.Probe(max_batches=batches, block=S)
            engine.train(model, opt, stream, 0, cfg, epoch, False, probe)
            epoch += 1
            if S not in best or probe.stats["steps_s"] < best[S]["steps_s"]:
                best[S] = probe.stats
    out = {}
    for S, st in best.items():
        ms = {p: round(st["phases_s"][p] * 1e3 / batches, 3) for p in PHASES[:-1]}
        out[S] = {
            "ms_per_batch": ms,
            "total_ms": round(st["steps_s"] * 1e3 / batches, 3),
            "distinct_rows_per_batch": round(st["rows_per_step"]),
        }
    return {"V": V, "depth": int(paths.codes[:, 0].max()), "blocks": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,1000000")
    from hlbl.fast import BLOCK

    ap.add_argument(
        "--blocks",
        default=f"1000,{BLOCK}",
        help=f"examples per block of a step, comma-separated (default: 1000 = unblocked, and the engine's {BLOCK})",
    )
    ap.add_argument("--batches", type=int, default=100, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per block size (the fastest counts)")
    ap.add_argument("--warm", type=int, default=200, help="ordinary steps first")
    ap.add_argument("--tokens", type=int, default=1_500_000)
    ap.add_argument("--fold", type=int, default=4096, help="also time the steps with ids folded into id %% N (0: no)")
    add_common(ap, out="phases.json", optional_out=True)
    args = finish_args(ap.parse_args(argv), sizes="1000", batches=3, rounds=1, warm=2, tokens=20_000, fold=64)
    blocks = [int(x) for x in args.blocks.split(",")]
    rows = []
    for V in (int(x) for x in args.sizes.split(",")):
        r = profile(V, blocks, args.batches, args.warm, args.rounds, args.tokens)
        runs = [("", r)]
        if args.fold:
            f = profile(V, blocks, args.batches, args.warm, args.rounds, args.tokens, args.fold)
            r["folded"] = f["blocks"]
            runs.append((f" folded %{args.fold}", f))
        for tag, x in runs:
            for S, b in x["blocks"].items():
                print(
                    f"V={V:>9,}{tag} depth {x['depth']:>2} block {S:>4}  "
                    + "  ".join(f"{p} {v:.2f}" for p, v in b["ms_per_batch"].items())
                    + f"  total {b['total_ms']:.2f} ms/batch, {b['distinct_rows_per_batch']:,} rows",
                    file=sys.stderr,
                )
        rows.append(r)
    if args.out:
        write_json(args.out, {"rows": rows, "machine": machine()})
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

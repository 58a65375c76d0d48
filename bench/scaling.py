"""Training cost vs vocabulary size: HLBL fast engine on synthetic Zipf corpora, V = 10k .. 1M.

    python bench/scaling.py                          # about 4 minutes, ~3 GB of memory at V = 1M
    python bench/scaling.py --sizes 10000,100000 --threads 1 --out scaling-small.json  # not over results/
    python bench/scaling.py --quick                  # a check of the script: V = 2,000, seconds

For each V, a child process (so that peak RSS is that size's alone) builds a BALANCED tree
(recursive halving of the words in frequency order; depth ceil(log2 V)), an HLBL with d = 100,
context 5, the default recipe (batch 1000, SGD with momentum 0.9 and L2 decay, exact lazy
updates), and trains ``--epochs`` epochs on ``--tokens`` i.i.d. Zipf(1) tokens with the fast
engine; words/s is that of the last epoch (the first touches every page of the momentum
buffers), including the end-of-epoch catch-up of all rows (O(V d)), by wall time and by process
CPU time; ``steps_wps`` and ``catch_up_s`` split the epoch into steps and the end-of-epoch
catch-up. Each size runs ``--rounds`` times (sizes interleaved) and the fastest run counts: on a
shared machine the slow runs measure the neighbours. Peak RSS is compared with the bytes of
parameters plus optimiser state (one momentum buffer per parameter).

``--threads 2,1`` (the default) measures every size with 2 Hogwild threads, then with 1 thread
(deterministic); the summary's top-level numbers are those of the first count, ``by_threads``
has all.

As a reference for what the machine's memory does to any tree-softmax trainer, fastText
(CBOW + hierarchical softmax, dim 100, ws 5, t 1, maxn 0, epoch 1, minCount 1, same thread
count; ``pip install fasttext``, skipped if absent or with ``--skip-fasttext``) is run on the same
corpora written as text; its rate is its own training-loop words/s (words/sec/thread x threads:
its vocabulary and Huffman-tree setup are excluded, as ours is). It is lighter per row (plain SGD:
no momentum buffer, no weight decay) and its Huffman codes are shorter for frequent words, so
its ratio is a reference, not a target. The last line is one JSON object; results/scaling.json gets it with the per-size
details, and results/scaling.png plots words/s and memory against V (skipped with a message
without matplotlib). ``--quick``: V = 2,000, 20,000 tokens, one thread, one round, the
JSON and plot in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import add_common, finish_args, loadavg, machine, write_json, zipf_model, zipf_stream


def child(V: int, tokens: int, epochs: int, threads: int, optimizer: str) -> dict:
    import torch

    from hlbl import fast

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    stream, model, cfg, opt = zipf_model(V, tokens, optimizer)  # BALANCED tree, ids in frequency order
    tree = model.out.tree
    setup_s = time.perf_counter() - t0
    epochs_wps, losses = [], []
    engine = fast.FastEngine(threads=threads)
    for e in range(1, epochs + 1):
        cpu = time.process_time()
        probe = fast.Probe()
        loss, wps = engine.train(model, opt, stream, 0, cfg, e, False, probe)
        stats = probe.stats
        cpu_wps = len(stream) / (time.process_time() - cpu)  # robust to other load (mostly)
        epochs_wps.append(wps)
        losses.append(loss)
    n_params = sum(p.numel() for p in model.parameters())
    state_bytes = (2 if optimizer == "momentum" else 1) * 4 * n_params  # float32 parameters (+ momentum buffers)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux -> MiB
    return {
        "V": V,
        "wps": epochs_wps[-1],
        "cpu_wps": cpu_wps,
        "epoch_wps": epochs_wps,
        "steps_wps": len(stream) / stats["steps_s"],
        "catch_up_s": stats["catch_up_s"],
        "loss": losses,
        "depth": int(tree.leaf_depth.max()),
        "params": n_params,
        "params_plus_state_mb": state_bytes / 2**20,
        "peak_rss_mb": peak,
        "rss_ratio": peak / (state_bytes / 2**20),
        "setup_s": setup_s,
        "tokens": tokens,
        "threads": threads,
    }


def fasttext_rate(V: int, tokens: int, threads: int) -> dict | None:
    """fastText's training-loop words/s on the child's corpus, written as text; None if not installed."""
    import tempfile

    from throughput import time_fasttext_from_text

    stream = zipf_stream(V, tokens, seed=2)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"zipf{V}.txt"
        words = np.char.add("w", stream.astype(str))
        with open(path, "w") as f:
            for i in range(0, len(words), 20):  # 20-word lines: fastText reads lines of text
                f.write(" ".join(words[i : i + 20]) + "\n")
        r = time_fasttext_from_text(path, threads, "0")
    if r is None:
        print('fastText is not installed (pip install -e ".[bench]"): no reference rate', file=sys.stderr)
        return None
    if r["reported_wps_per_thread"] is None:
        return None
    return {"wps": r["reported_wps_per_thread"] * threads, "wall_wps": r["wps"], "vocab_seen": r["vocab"]}


def plot(by_threads: dict[int, list[dict]], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[plot]')", file=sys.stderr)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for T, rows in by_threads.items():
        V = [r["V"] for r in rows]
        (line,) = a.plot(V, [r["wps"] / 1e3 for r in rows], "o-", label=f"fast engine, {T} thread{'s' * (T > 1)}")
        base = rows[0]["wps"] * rows[0]["depth"]
        a.plot(V, [base / r["depth"] / 1e3 for r in rows], ":", color=line.get_color(), alpha=0.7)
        ft = [(r["V"], r["fasttext"]["wps"]) for r in rows if r.get("fasttext")]
        if ft:
            a.plot(
                *zip(*[(v, w / 1e3) for v, w in ft]),
                "x--",
                color=line.get_color(),
                alpha=0.6,
                label=f"fastText CBOW+HS maxn 0, {T} thread{'s' * (T > 1)}",
            )
    a.plot([], [], ":", color="gray", label=r"if cost were $\propto$ tree depth")
    a.set_xscale("log")
    a.set_ylim(bottom=0)
    a.set_xlabel("vocabulary size V")
    a.set_ylabel("training words/s (thousands)")
    a.legend(fontsize=8)
    rows = next(iter(by_threads.values()))
    V = [r["V"] for r in rows]
    b.plot(V, [r["peak_rss_mb"] / 1024 for r in rows], "o-", label="peak RSS")
    b.plot(V, [r["params_plus_state_mb"] / 1024 for r in rows], "s--", label="parameters + momentum")
    b.set_xscale("log")
    b.set_yscale("log")
    b.set_xlabel("vocabulary size V")
    b.set_ylabel("GiB")
    b.legend(fontsize=8)
    fig.suptitle("HLBL d=100, BALANCED tree, synthetic Zipf(1), shared 2-core machine", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--tokens", type=int, default=1_500_000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument(
        "--optimizer",
        choices=("momentum", "sgd"),
        default="momentum",
        help="sgd: no momentum buffers (half the bytes per touched row)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="runs per size; the best counts (shared machine)")
    ap.add_argument("--skip-fasttext", action="store_true", help="no fastText reference runs")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    add_common(ap, threads="2,1", out="results/scaling.json", out_help="summary JSON; the plot goes beside it (.png)")
    args = ap.parse_args(argv)
    if args.child is None:
        finish_args(args, sizes="2000", tokens=20_000, threads="1", rounds=1)
    if args.child is not None:
        print(json.dumps(child(args.child, args.tokens, args.epochs, int(args.threads), args.optimizer)))
        return 0
    load = loadavg()
    by_threads: dict[int, list[dict]] = {}
    sizes = [int(v) for v in args.sizes.split(",")]
    for T in (int(t) for t in args.threads.split(",")):
        runs: dict[int, list[dict]] = {V: [] for V in sizes}
        for rnd in range(1, args.rounds + 1):  # sizes interleaved, so that a noisy minute hits all of them
            for V in sizes:
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    str(V),
                    "--tokens",
                    str(args.tokens),
                    "--epochs",
                    str(args.epochs),
                    "--threads",
                    str(T),
                    "--optimizer",
                    args.optimizer,
                ]
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent)
                if proc.returncode != 0:
                    raise RuntimeError(f"V={V} failed:\n{proc.stderr[-3000:]}")
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                r["fasttext"] = None if args.skip_fasttext else fasttext_rate(V, args.tokens, T)
                print(
                    f"{T} thread(s) V={V:>9,} round {rnd}  depth {r['depth']:>2}  {r['wps']:>10,.0f} words/s "
                    f"({r['cpu_wps']:,.0f} per CPU-second; epochs: "
                    f"{', '.join(f'{w:,.0f}' for w in r['epoch_wps'])})  peak RSS {r['peak_rss_mb']:,.0f} MiB = "
                    f"{r['rss_ratio']:.2f} x params+state ({r['params_plus_state_mb']:,.0f} MiB)"
                    + (f"; fastText {r['fasttext']['wps']:,.0f}" if r["fasttext"] else ""),
                    file=sys.stderr,
                )
                runs[V].append(r)
        by_threads[T] = []
        for V in sizes:  # the fastest round of each, and fastText's fastest, independently
            best = max(runs[V], key=lambda r: r["wps"])
            ft = [r["fasttext"] for r in runs[V] if r["fasttext"]]
            by_threads[T].append(
                {
                    **best,
                    "rounds_wps": [r["wps"] for r in runs[V]],
                    "fasttext": max(ft, key=lambda x: x["wps"]) if ft else None,
                }
            )

    def summarise(rows: list[dict]) -> dict:
        by = {str(r["V"]): r for r in rows}
        out = {"wps": {k: r["wps"] for k, r in by.items()}}
        out["cpu_wps"] = {k: r["cpu_wps"] for k, r in by.items()}
        if "1000000" in by and "10000" in by:
            out["ratio_1m_vs_10k"] = by["1000000"]["wps"] / by["10000"]["wps"]
            out["cpu_ratio_1m_vs_10k"] = by["1000000"]["cpu_wps"] / by["10000"]["cpu_wps"]
            out["peak_rss_mb_1m"] = by["1000000"]["peak_rss_mb"]
            out["rss_vs_params_plus_state_1m"] = by["1000000"]["rss_ratio"]
            if by["1000000"].get("fasttext") and by["10000"].get("fasttext"):
                out["fasttext_ratio_1m_vs_10k"] = by["1000000"]["fasttext"]["wps"] / by["10000"]["fasttext"]["wps"]
        return out

    first = next(iter(by_threads))
    summary = {
        **summarise(by_threads[first]),
        "threads": first,
        "optimizer": args.optimizer,
        "by_threads": {str(T): summarise(rows) for T, rows in by_threads.items()},
        "load_before": load,
        "load_after": loadavg(),
    }
    out = write_json(
        args.out, {"summary": summary, "sizes": {str(T): rows for T, rows in by_threads.items()}, "machine": machine()}
    )
    plot(by_threads, out.with_suffix(".png"))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

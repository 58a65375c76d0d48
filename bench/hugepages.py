"""What 2 MiB pages (``hlbl.memory``) are worth to the fast engine at V = 1M: A/B in child processes.

    python bench/hugepages.py                 # about 3 minutes, ~2.5 GB of memory
    python bench/hugepages.py --quick         # a check of the script: V = 5,000, a few steps

Each child builds the scaling benchmark's model (BALANCED tree over V Zipf-ordered words, d = 100,
context 5, the default recipe) and trains ``--batches`` steps for 3 epochs with 1 thread, with
the engine's huge-page advice on, or replaced by a no-op (off); words/s is that of the steps
alone (``stats["steps_s"]``), best of the last two epochs. Runs alternate on/off ``--rounds``
times (the machine is shared: compare within a round). Prints one JSON line per run, then a
summary line with the median on/off ratio; ``anon_huge_kb`` shows how much memory the kernel
actually backed with huge pages. ``--out`` also writes the runs and the summary as JSON
(``--quick``: always, in a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from _common import add_common, finish_args, machine, write_json, zipf_model


def child(mode: str, V: int, batches: int, tokens: int) -> dict:
    import torch

    from hlbl import fast

    if mode == "off":
        fast.prefer_huge_pages = lambda *a, **k: 0  # the engine's one call site
    torch.set_num_threads(1)
    stream, model, cfg, opt = zipf_model(V, tokens)
    wps = []
    engine = fast.FastEngine(threads=1)
    for epoch in (1, 2, 3):
        probe = fast.Probe(max_batches=batches)
        engine.train(model, opt, stream, 0, cfg, epoch, False, probe)
        wps.append(batches * cfg.batch_size / probe.stats["steps_s"])
    huge = int(Path("/proc/self/smaps_rollup").read_text().split("AnonHugePages:")[1].split()[0])
    return {"mode": mode, "V": V, "steps_wps": round(max(wps[1:])), "anon_huge_kb": huge}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=1_500_000, help="the Zipf corpus's length")
    p.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    add_common(p, out="hugepages.json", optional_out=True)
    args = finish_args(p.parse_args(), vocab=5_000, batches=3, rounds=1, tokens=20_000)
    if args.child:
        print(json.dumps(child(args.child, args.vocab, args.batches, args.tokens)))
        return
    ratios, runs = [], []
    for _ in range(args.rounds):
        got = {}
        for mode in ("on", "off"):
            argv = ["--child", mode, "--vocab", str(args.vocab), "--batches", str(args.batches)]
            out = subprocess.run(
                [sys.executable, __file__, *argv, "--tokens", str(args.tokens)], capture_output=True, text=True
            )
            if out.returncode:
                raise SystemExit(f"child {mode} failed:\n{out.stderr[-3000:]}")
            got[mode] = json.loads(out.stdout.strip().splitlines()[-1])
            runs.append(got[mode])
            print(json.dumps(got[mode]), flush=True)
        ratios.append(got["on"]["steps_wps"] / got["off"]["steps_wps"])
    summary = {
        "V": args.vocab,
        "on_over_off": [round(r, 3) for r in ratios],
        "median_on_over_off": round(statistics.median(ratios), 3),
    }
    if args.out:
        write_json(args.out, {"summary": summary, "runs": runs, "machine": machine()})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

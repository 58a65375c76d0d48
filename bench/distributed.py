"""The fast engine on several processes (torch.distributed, gloo): words/s and perplexity of one
process, two processes and two Hogwild threads, and the cost model for N machines.

    python bench/distributed.py speed     [--rounds 5] [--sync-every 128,256]
    python bench/distributed.py quality   [--sync-every 128,256]
    python bench/distributed.py gutenberg [--max-vocab 50000] [--rounds 3] [--sync-every 256,1024,1024+overlap]
    python bench/distributed.py summary
    python bench/distributed.py --quick

Every run is the ``hlbl`` command a user would type (``torchrun --standalone --nproc_per_node 2
-m hlbl train ...`` for two processes), one thread a process, the same corpus, seed and recipe;
words/s are the runs' own (metrics.jsonl: training positions over the epoch's training time, all
processes together), so start-up and validation are not counted for any of them.

* ``speed`` (``speed.json``): ``--rounds`` rounds of short runs (``--epochs`` epochs on PTB), the
  kinds in turn within a round, starting each round with another: 1 process, 2 Hogwild threads
  in one process, and 2 processes at each ``--sync-every``; per round, each one's words/s over the
  one process's of the same round (the machine's load falls on all alike).
* ``quality`` (``quality.json``): each kind trained until its schedule stops it; valid perplexity
  after every epoch, test perplexity of the best weights, epochs and words/s.
* ``gutenberg`` (``gutenberg.json``; ``gutenberg190k.json`` for ``--max-vocab 190000``, and so
  on): Gutenberg (``--max-vocab`` words, a Huffman tree) by 1 process and 2 at each
  ``--sync-every``: rounds of words/s side by side over the first ``--gutenberg-tokens``
  positions, then one whole pass of each (words/s, valid perplexity).

A ``--sync-every`` entry ``N+overlap`` runs ``--sync-every N --sync-overlap``: each round's
exchange overlaps the next round's steps (``hlbl.sync.DelayedSync``).
* ``summary`` (``summary.json``): the keys the results README cites, the bytes one
  synchronisation sends (``hlbl.distributed.sync_bytes``) and the cost model's projection.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import add_common, finish_args, machine, quick_dir, write_json

KINDS = ("1proc", "hogwild2")  # and "2proc" at each --sync-every


def launcher(kind: str) -> list[str]:
    """The command that starts ``hlbl`` for a kind of run: one process, or two under torchrun."""
    if kind.startswith("2proc"):
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
        if torchrun is None:
            raise SystemExit("torchrun is not installed beside this Python (it comes with torch)")
        return [torchrun, "--standalone", "--nproc_per_node", "2", "-m", "hlbl"]
    return [sys.executable, "-m", "hlbl"]


def flags(kind: str) -> list[str]:
    """One thread a process; Hogwild runs two threads in its one process."""
    if kind == "hogwild2":
        return ["--hogwild", "2", "--threads", "2"]
    if kind.startswith("2proc"):
        every, overlap = kind.split("@")[1].split("+")[0], kind.endswith("+overlap")
        return ["--threads", "1", "--sync-every", every] + (["--sync-overlap"] if overlap else [])
    return ["--threads", "1"]


def train(args, kind: str, out: Path, more: list[str]) -> dict:
    """Train one run from scratch (its directory replaced); its command, printed result and metrics."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["train", "--data", args.data, *more, *flags(kind), "--quiet", "--out", str(out)]
    started = time.perf_counter()
    done = subprocess.run(launcher(kind) + cmd, capture_output=True, text=True, env=_env())
    if done.returncode != 0:
        raise SystemExit(f"{kind}: hlbl {' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    shown = "torchrun --standalone --nproc_per_node 2 -m hlbl" if kind.startswith("2proc") else "hlbl"
    return {
        "command": f"{shown} {' '.join(cmd[:-1])} RUN",
        "result": json.loads(done.stdout.splitlines()[0]),
        "metrics": lines,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _env() -> dict:
    import os

    # gloo picks its network interface from the host name, which a container may not resolve.
    return {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}


def kinds(args) -> list[str]:
    return [*KINDS, *(f"2proc@{s}" for s in args.sync_every.split(","))]


def stage_speed(args) -> dict:
    every = kinds(args)
    rounds = []
    for i in range(args.rounds):
        order = every[i % len(every) :] + every[: i % len(every)]  # each round starts with another kind
        wps = {}
        for kind in order:
            run = train(args, kind, Path(args.work) / "speed" / kind, ["--epochs", str(args.epochs)])
            wps[kind] = statistics.median(x["words_per_sec"] for x in run["metrics"])
            print(f"round {i + 1} {kind}: {wps[kind]:,.0f} words/s", file=sys.stderr)
        rounds.append({"wps": wps, "vs_1proc": {k: v / wps["1proc"] for k, v in wps.items()}})
    table = {
        kind: {
            "wps": _spread([r["wps"][kind] for r in rounds]),
            "vs_1proc": _spread([r["vs_1proc"][kind] for r in rounds]),
        }
        for kind in every
    }
    return {"epochs_a_run": args.epochs, "rounds": rounds, "kinds": table, "machine": machine()}


def stage_quality(args) -> dict:
    out = {}
    for kind in kinds(args):
        run = train(args, kind, Path(args.work) / "quality" / kind, ["--epochs", str(args.max_epochs)])
        lines = run["metrics"]
        out[kind] = {
            "command": run["command"],
            "test_ppl": run["result"].get("test_perplexity"),
            "test_tokens": run["result"].get("test_tokens"),
            "valid_ppl": run["result"]["valid_perplexity"],
            "valid_curve": [round(x["valid_ppl"], 2) for x in lines],
            "epochs": len(lines),
            "train_minutes": round(sum(x["epoch_minutes"] for x in lines), 2),
            "wps": round(statistics.median(x["words_per_sec"] for x in lines)),
        }
        print(f"{kind}: test {out[kind]['test_ppl']:.2f} after {len(lines)} epochs", file=sys.stderr)
    return {"runs": out, "machine": machine()}


def stage_gutenberg(args) -> dict:
    """Gutenberg (``--max-vocab`` words, a Huffman tree), 1 process against 2 at each
    ``--sync-every``: ``--rounds`` rounds of words/s over the first ``--gutenberg-tokens`` training
    positions (the kinds in turn, each round starting with another), then one whole pass of each
    kind (the pass as one epoch) for its valid perplexity and words/s."""
    every = ["1proc", *(f"2proc@{s}" for s in args.sync_every.split(","))]
    base = ["--tree", "huffman", "--epochs", "1", "--epoch-tokens", "0"]
    base += ["--max-vocab", str(args.max_vocab)] if args.max_vocab else []
    work = Path(args.work) / "gutenberg"
    rounds = []
    for i in range(args.rounds):
        wps, syncs = {}, {}
        for kind in every[i % len(every) :] + every[: i % len(every)]:
            run = train(args, kind, work / "speed" / kind, [*base, "--max-train-tokens", str(args.gutenberg_tokens)])
            wps[kind] = run["metrics"][0]["words_per_sec"]
            if "sync" in run["metrics"][0]:  # rank 0's rounds' ends: seconds, bytes sent a round
                syncs[kind] = run["metrics"][0]["sync"]
            print(f"gutenberg round {i + 1} {kind}: {wps[kind]:,.0f} words/s", file=sys.stderr)
        rounds.append({"wps": wps, "vs_1proc": {k: v / wps["1proc"] for k, v in wps.items()}, "sync": syncs})
    passes = {}
    for kind in every:
        run = train(args, kind, work / "pass" / kind, base)
        (line,) = run["metrics"]
        passes[kind] = {
            "command": run["command"],
            "wps": round(line["words_per_sec"]),
            "valid_ppl_after_one_pass": line["valid_ppl"],
            "train_minutes": round(line["epoch_minutes"], 2),
            **({"sync": line["sync"]} if "sync" in line else {}),
        }
        print(
            f"gutenberg pass {kind}: {line['words_per_sec']:,.0f} words/s, valid {line['valid_ppl']:.2f}",
            file=sys.stderr,
        )
    kinds_table = {
        k: {"wps": _spread([r["wps"][k] for r in rounds]), "vs_1proc": _spread([r["vs_1proc"][k] for r in rounds])}
        for k in every
    }
    return {
        "max_vocab": args.max_vocab,
        "speed_positions": args.gutenberg_tokens,
        "rounds": rounds,
        "kinds": kinds_table,
        "runs": passes,
        "machine": machine(),
    }


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# ---- summary and the cost model ---------------------------------------------------------------


def project(
    wps1: float, wps2: float, nbytes: int, batch: int, every: int, n: int, gbit: float, latency: float
) -> float:
    """Projected words/s of ``n`` processes (one a machine) from what 1 and 2 processes measure.

    A round is ``every`` steps of ``batch`` positions a process: compute ``every * batch / wps1``
    seconds, then a synchronisation. Its local part (catch-up, the copies, the all-reduce's own
    arithmetic and the wait for the slower process) is what 2 processes here spend beyond the
    compute; the network adds a ring all-reduce of ``nbytes``: ``2 (n-1)/n * nbytes`` over
    ``gbit`` Gb/s and ``2 (n-1)`` messages of ``latency`` seconds."""
    compute = every * batch / wps1
    local = max(0.0, every * batch / (wps2 / 2) - compute)
    network = 2 * (n - 1) / n * nbytes / (gbit * 1e9 / 8) + 2 * (n - 1) * latency
    return n * every * batch / (compute + local + network)


def stage_summary(args) -> dict:
    import torch

    from hlbl.config import LBLConfig, TrainConfig
    from hlbl.distributed import sync_bytes
    from hlbl.model import LBL
    from hlbl.tree import random_tree

    res = Path(args.out)
    speed = json.loads((res / "speed.json").read_text())
    quality = json.loads((res / "quality.json").read_text())
    default = f"2proc@{TrainConfig().sync_steps(10_000)}"  # the default at PTB's size, or the first measured
    if default not in speed["kinds"]:
        default = next(k for k in speed["kinds"] if k.startswith("2proc"))
    every = int(default.split("@")[1])
    wps = {k: v["wps"]["median"] for k, v in speed["kinds"].items()}
    model = LBL(LBLConfig(10_000, dim=100, context=5), random_tree(10_000, 0), torch.Generator().manual_seed(0))
    nbytes = sync_bytes(model, momentum=True)
    batch = TrainConfig.batch_size
    summary = {
        "wps_1proc": wps["1proc"],
        "wps_2proc": wps[default],
        "wps_hogwild2": wps["hogwild2"],
        "speedup_2proc": speed["kinds"][default]["vs_1proc"]["median"],
        "speedup_hogwild2": speed["kinds"]["hogwild2"]["vs_1proc"]["median"],
        "speedup_2proc_by_sync_every": {
            k.split("@")[1]: v["vs_1proc"]["median"] for k, v in speed["kinds"].items() if k.startswith("2proc")
        },
        "ptb_test_ppl_1proc": quality["runs"]["1proc"]["test_ppl"],
        "ptb_test_ppl_2proc": quality["runs"][default]["test_ppl"],
        "ptb_test_ppl_hogwild2": quality["runs"]["hogwild2"]["test_ppl"],
        "ptb_epochs": {k: v["epochs"] for k, v in quality["runs"].items()},
        "sync_every": every,
        "bytes_per_sync": nbytes,
        "bytes_per_sync_model": "V = 10,000, d = 100, 5 context words, 9,999 nodes, momentum buffers",
        "cost_model": {
            "network": "10 Gb/s, 50 us a message, ring all-reduce, one process a machine",
            "projected_wps": {
                str(n): round(project(wps["1proc"], wps[default], nbytes, batch, every, n, 10, 50e-6))
                for n in (2, 4, 16, 64)
            },
        },
    }
    gutenberg = res / "gutenberg.json"
    if gutenberg.exists():
        summary |= gutenberg_summary(json.loads(gutenberg.read_text()), every)
    for other in sorted(res.glob("gutenberg?*k.json")):  # other vocabularies: their own keys only
        # (gutenberg190k.json gives gutenberg190k_*; its gutenberg_* keys would replace 50,000 words')
        summary |= {
            k: v
            for k, v in gutenberg_summary(json.loads(other.read_text()), every).items()
            if k.startswith(other.stem + "_")
        }
    return summary


def gutenberg_summary(g: dict, every: int) -> dict:
    """The summary's Gutenberg keys: one pass of 1 process and of 2 at the default interval for
    its vocabulary (``every`` where it has no cut; words/s, valid perplexity) and, with the speed
    rounds, the median ratio of words/s at each."""
    from hlbl.config import TrainConfig

    every = TrainConfig().sync_steps(g["max_vocab"]) if g.get("max_vocab") else every
    runs = g["runs"]
    two = f"2proc@{every}" if f"2proc@{every}" in runs else next(k for k in runs if k.startswith("2proc"))
    out = {}
    for name, kind in (("1proc", "1proc"), ("2proc", two)):
        out[f"gutenberg_wps_{name}"] = runs[kind]["wps"]
        out[f"gutenberg_valid_ppl_{name}"] = runs[kind]["valid_ppl_after_one_pass"]
    if "kinds" in g:
        vocab = f"{round(g['max_vocab'] / 1000)}k" if g.get("max_vocab") else "all"
        ratios = {k.split("@")[1]: v["vs_1proc"]["median"] for k, v in g["kinds"].items() if k.startswith("2proc")}
        out[f"gutenberg{vocab}_speedup_2proc"] = ratios[two.split("@")[1]]
        out[f"gutenberg{vocab}_speedup_2proc_by_sync_every"] = ratios
        out[f"gutenberg{vocab}_valid_ppl_2proc_by_sync_every"] = {
            k.split("@")[1]: v["valid_ppl_after_one_pass"] for k, v in runs.items() if k.startswith("2proc")
        }
    return out


def _file_stem(stage: str, args) -> str:
    """The stage's file: ``gutenberg.json`` at 50,000 words (and the quick check's whole
    vocabulary), ``gutenberg190k.json`` at 190,000."""
    if stage != "gutenberg" or args.max_vocab in (0, 50000):
        return stage
    return f"gutenberg{round(args.max_vocab / 1000)}k"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", nargs="?", choices=["speed", "quality", "gutenberg", "summary"])
    add_common(ap, data="ptb")
    ap.add_argument("--out", default="results/distributed", help="where the stages' JSON files go")
    ap.add_argument("--work", default="runs/distributed", help="run directories (replaced)")
    ap.add_argument("--rounds", type=int, default=5, help="speed: rounds")
    ap.add_argument("--epochs", type=int, default=2, help="speed: epochs a run")
    ap.add_argument("--max-epochs", type=int, default=40, help="quality: epoch cap (the schedule stops first)")
    ap.add_argument("--sync-every", default="128,256", help="steps between synchronisations of 2 processes, a list")
    ap.add_argument("--max-vocab", type=int, default=50000, help="gutenberg: vocabulary")
    ap.add_argument(
        "--gutenberg-tokens", type=int, default=10_000_000, help="gutenberg: training positions of a speed round's runs"
    )
    args = ap.parse_args(argv)
    if args.quick:
        finish_args(
            args, rounds=1, epochs=1, max_epochs=2, sync_every="4,4+overlap", max_vocab=0, gutenberg_tokens=2000
        )
        args.out, args.work = str(quick_dir() / "distributed"), str(quick_dir() / "distributed-runs")
    elif args.stage is None:
        ap.error("a stage (speed, quality, gutenberg, summary), or --quick")
    stages = [args.stage] if args.stage else ["speed", "quality", "gutenberg", "summary"]
    for stage in stages:
        if stage == "gutenberg" and not args.quick:
            args.data = "gutenberg"
        result = {"speed": stage_speed, "quality": stage_quality, "gutenberg": stage_gutenberg}.get(
            stage, stage_summary
        )(args)
        path = write_json(Path(args.out) / f"{_file_stem(stage, args)}.json", result)
        print(json.dumps({"stage": stage, "written": str(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

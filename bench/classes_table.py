"""The table of results/ptb/classes.{md,json}: class-based output layers on PTB.

    python bench/classes_table.py row NAME RUN_DIR "COMMAND" OUTPUT_JSON_LINE   # record one run
    python bench/classes_table.py speed --classes C.json ...                   # flat vs classes, same load
    python bench/classes_table.py table                                         # write the table
    python bench/classes_table.py --quick        # a check of the script: row, speed and table on tiny data

``row`` copies a finished run's metrics.jsonl and its ``hlbl train`` output (the JSON line with
valid and test perplexity) to results/ptb/classes/NAME.*, with the command that made it. Minutes
per epoch and words/s are computed as in results/ptb/table3.md: the mean training time of the
run's epochs (not validation), and the training tokens over it. ``speed`` trains the flat LBL
and each structure for the same tokens one after another on the same machine (seconds apart,
so under the same load), since the runs of the table were measured at other times on a shared
machine. ``--results DIR`` (default results/ptb/classes) is where rows and speeds go; the table is
written beside it (DIR.md, DIR.json).

``--quick`` (no subcommand) trains a class model of one epoch on the synthetic corpus of
``bench/_common.py``, then runs ``row``, ``speed`` (one round of 2,000 positions) and ``table``
on it, all into a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _common import add_common, corpus_spec, finish_args, quick_dir, quick_run, run_subcommand, write_json

RESULTS = Path("results/ptb/classes")
SPEED_NOTE = (
    "training words/s on the same 50,000 seeded random PTB training positions, flat LBL and class models "
    "alternating, 3 rounds each, one thread, median; one measurement per call on a shared 2-core machine"
)
PTB_TRAIN_TOKENS = 929_589


def cmd_row(args) -> None:
    results = Path(args.results)
    run = Path(args.run)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = json.loads(args.output)
    state = json.loads((run / "state.json").read_text())
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{args.name}.metrics.jsonl").write_text((run / "metrics.jsonl").read_text())
    minutes = sum(m["epoch_minutes"] for m in metrics)
    row = {
        "model": "tree",
        "name": args.name,
        "test_ppl": out["test_perplexity"],
        "valid_ppl": out["valid_perplexity"],
        "minutes_per_epoch": minutes / len(metrics),
        "epochs": len(metrics),
        "converged": bool(state["done"]),
        "command": args.command,
        "words_per_sec": PTB_TRAIN_TOKENS * len(metrics) / (60 * minutes),
    }
    write_json(results / f"{args.name}.json", row)
    print(json.dumps(row))


def cmd_speed(args) -> None:
    """Training words/s of flat and classes models on --tokens seeded random PTB positions, alternating."""
    import numpy as np
    import torch

    from hlbl.classes import WordClasses, frequency_classes
    from hlbl.config import TrainConfig
    from hlbl.data import load_corpus
    from hlbl.model import LBL, LBLConfig
    from hlbl.optim import make_optimizer

    torch.set_num_threads(1)
    corpus = load_corpus(corpus_spec(args), splits=("train",))
    V = len(corpus.vocab)
    structures = {"flat": None, "classes (frequency, C=100)": frequency_classes(corpus.vocab.counts, 100)}
    for path in args.classes:
        structures[f"classes ({Path(path).stem})"] = WordClasses.load(path)
    cfg = TrainConfig()
    stream = corpus["train"]
    n, B = 5, cfg.batch_size
    rng = np.random.default_rng(0)
    pos = rng.integers(n, len(stream), size=args.tokens)
    ctx = torch.from_numpy(np.stack([stream[pos - n + i] for i in range(n)], 1).astype(np.int64))
    tgt = torch.from_numpy(stream[pos].astype(np.int64))
    models = {}
    for name, s in structures.items():
        m = LBL(LBLConfig(V, output="flat" if s is None else "classes"), s, torch.Generator().manual_seed(0))
        m.init_unigram(corpus.vocab.counts)
        models[name] = (m, make_optimizer(m, cfg, cfg.lr))
    rates: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(args.rounds):
        for name, (m, opt) in models.items():
            t0 = time.perf_counter()
            for i in range(0, args.tokens, B):
                opt.zero_grad(set_to_none=True)
                out = m(ctx[i : i + B], tgt[i : i + B])
                (out.loss * len(out.output)).backward()
                opt.step()
            rates[name].append(args.tokens / (time.perf_counter() - t0))
    res = {k: {"words_per_sec_median": float(np.median(v)), "rounds": v} for k, v in rates.items()}
    flat = res["flat"]["words_per_sec_median"]
    for v in res.values():
        v["speedup_over_flat"] = v["words_per_sec_median"] / flat
    out = Path(args.out or Path(args.results) / "speed.json")
    # Each call adds a measurement: the machine's load differs from one to the next.
    doc = json.loads(out.read_text()) if out.exists() else {"note": SPEED_NOTE, "measurements": []}
    doc["measurements"].append(res)
    write_json(out, doc)
    print(json.dumps({k: round(v["speedup_over_flat"], 2) for k, v in res.items()}))


def cmd_table(args) -> None:
    results = Path(args.results)
    rows = [json.loads(p.read_text()) for p in sorted(results.glob("*.json")) if p.name != "speed.json"]
    rows = [r for r in rows if "test_ppl" in r]
    order = {name: i for i, name in enumerate(args.order)} if args.order else {}
    rows.sort(key=lambda r: (order.get(r["name"], len(order)), r["name"]))
    write_json(results.with_suffix(".json"), rows)
    lines = [
        "# Class-based output layers on PTB",
        "",
        "Written by `python bench/classes_table.py table` from `results/ptb/classes/*.json`; notes from",
        "`results/ptb/classes/notes.md`. The LBL (d = 100, context 5) with `--output classes`, the default",
        "recipe (momentum SGD, lr 1e-3 then 3e-5, early stopping on validation), seed 0, one thread.",
        "Minutes per epoch and words/s: mean training time of the run's epochs (not validation).",
        "",
        "| name | test perplexity | valid perplexity | minutes per epoch | words/s | epochs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['test_ppl']:.1f} | {r['valid_ppl']:.1f} | {r['minutes_per_epoch']:.3g} "
            f"| {r['words_per_sec']:,.0f} | {r['epochs']}{'' if r['converged'] else ' (cap)'} |"
        )
    lines.append("")
    lines.append("Commands, one per row:")
    lines.append("")
    for r in rows:
        lines.append(f"- {r['name']}: `{r['command']}`")
    notes = results / "notes.md"
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    print("\n".join(lines))
    Path(args.out or results.with_suffix(".md")).write_text("\n".join(lines) + "\n")


def quick(args) -> None:
    """Every subcommand once, on a class model of the synthetic corpus, into quick_dir()."""
    run, printed = quick_run("classes", "--output", "classes")
    output = [line for line in printed.splitlines() if line.startswith("{")][-1]
    results = str(quick_dir() / "classes")
    ns = argparse.Namespace
    cmd_row(ns(results=results, name="quick", run=str(run), command="hlbl train --output classes", output=output))
    cmd_speed(ns(results=results, quick=True, tokens=2_000, rounds=1, classes=[], out=None))
    cmd_table(ns(results=results, order=[], out=None))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common(p)
    p.add_argument("--results", default=str(RESULTS), help=f"rows and speeds (default {RESULTS})")
    sub = p.add_subparsers(dest="cmd")
    r = sub.add_parser("row")
    r.add_argument("name")
    r.add_argument("run")
    r.add_argument("command")
    r.add_argument("output")
    r.set_defaults(func=cmd_row)
    s = sub.add_parser("speed")
    s.add_argument("--tokens", type=int, default=50_000)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--classes", nargs="*", default=[], help="word classes files to time too")
    s.add_argument("--data", default="ptb", help="corpus, as for hlbl train")
    s.add_argument("--out", default=None, help="default: RESULTS/speed.json")
    s.set_defaults(func=cmd_speed)
    t = sub.add_parser("table")
    t.add_argument("--order", nargs="*", default=[])
    t.add_argument("--out", default=None, help="default: RESULTS.md (results/ptb/classes.md)")
    t.set_defaults(func=cmd_table)
    run_subcommand(p, finish_args(p.parse_args()), quick, "row, speed, table")


if __name__ == "__main__":
    main()

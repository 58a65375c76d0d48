"""The quality-vs-time frontier: every output layer and tree of the project on one corpus, side by side.

Subcommands (run from the repository root; PTB is found as ``hlbl train --data ptb`` finds it):

``row``: one finished run (``hlbl train --out RUN``) as a frontier row: exact test and valid
perplexity of its best weights, epochs, whether early stopping (not a cap) ended it, its mean
minutes per epoch and words/s from metrics.jsonl, and the command that made it. The row is added
to (or replaces the row of the same name in) the ``--rows`` JSON list.

    python bench/frontier.py row --run runs/x4 --name "HLBL ADAPTIVE(0.4) x4" \\
        --command "hlbl train --data ptb --tree x4.json --out runs/x4" --rows results/ptb/frontier_runs.json

``mix``: a run (``--with``: and more runs) interpolated with a Kneser-Ney ARPA model (``hlbl eval
--interpolate``; the weights tuned on valid), as a ``mixture`` row in the same list.

``speed``: training words/s of each kind of model **in one process, round robin**: the flat LBL,
NCE and the sampled softmax at k = 5, 25, 100 (torch engine), and HLBL on each tree file given
(the fast engine). Each round trains every model on the same slice of the training stream (the
recipe's momentum SGD, batch 1000, the seeded epoch order); the ratio of each model's words/s to
the flat layer's in the same round is kept, and the medians over rounds are reported. Each model
steps with the implementation its training run used (``hlbl.train.epoch_runner``: the fast engine
for trees, autograd otherwise). Minutes per epoch in the table are the corpus's training tokens
over these side-by-side words/s.

``table``: ``frontier.md``, ``frontier.json`` and ``frontier.png`` from the rows of
``results/ptb/results.json`` (``hlbl reproduce``: the paper's trees, the flat LBL, KN5), the
sampling runs (``results/sampling/sampling.json``), the class-tree runs
(``results/ptb/classes.json``, when present), the rows made by ``row`` / ``mix``, and the speed
file. Every row keeps the words/s and minutes per epoch of its own run (``*_run``); the
``minutes_per_epoch`` and ``words_per_s`` columns are side by side where the speed file has the
row's kind.

``--quick`` (no subcommand): every subcommand once, small, on the synthetic corpus of
``bench/_common.py`` (a RANDOM-tree run of one epoch, a 3-gram, one round of speed), all into a
temporary directory:

    python bench/frontier.py --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from _common import (
    add_common,
    finish_args,
    quick_dir,
    quick_run,
    run_subcommand,
    side_by_side,
    tiny_corpus,
    write_json,
)

PTB_TRAIN_TOKENS = 929_589


def _load_rows(path: Path) -> list[dict]:
    return json.loads(path.read_text()) if path.is_file() else []


def _save_row(path: Path, row: dict) -> None:
    rows = [r for r in _load_rows(path) if r["name"] != row["name"]] + [row]
    write_json(path, rows)
    print(json.dumps(row))


def row(args) -> None:
    from hlbl.evaluate import evaluate
    from hlbl.run import Run

    torch.set_num_threads(args.threads)
    run = Path(args.run)
    source = Run.open(run)
    model, vocab = source.model(), source.vocab
    corpus = source.corpus(("valid", "test"))
    state = source.state().to_json()
    lines = source.metrics()
    test = evaluate(model, corpus["test"], vocab.eos)
    _save_row(
        Path(args.rows),
        {
            "model": args.model,
            "name": args.name,
            "speed_key": args.speed_key,
            "test_ppl": test["perplexity"],
            "test_tokens": test["tokens"],
            "valid_ppl": evaluate(model, corpus["valid"], vocab.eos)["perplexity"],
            "epochs": state["epoch"],
            "converged": bool(state["done"]),
            "minutes_per_epoch_run": float(np.mean([x["epoch_minutes"] for x in lines])),
            "words_per_s_run": float(np.mean([x["words_per_sec"] for x in lines])),
            "command": args.command,
            "note": args.note,
        },
    )


def mix(args) -> None:
    cmd = [sys.executable, "-m", "hlbl", "eval", args.run, "--interpolate", args.arpa, "--split", "test"]
    cmd += ["--threads", str(args.threads)]
    for other in args.ensemble:
        cmd += ["--with", other]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    got = json.loads(out)
    _save_row(
        Path(args.rows),
        {
            "model": "mixture",
            "name": args.name,
            "speed_key": None,
            "test_ppl": got["perplexity"],
            "test_tokens": got["tokens"],
            "valid_ppl": None,
            "weight": got.get("weight"),
            "epochs": None,
            "converged": None,
            "weights": [c["weight"] for c in got.get("components", [])] or None,  # the runs', then the n-gram's
            "command": f"hlbl eval {args.run_name} --interpolate {args.arpa_name} --split test"
            + "".join(f" --with {o}" for o in args.ensemble),
            "note": args.note,
        },
    )


def speed(args) -> None:
    from hlbl.config import TrainConfig
    from hlbl.data import load_corpus
    from hlbl.engine import choose_engine
    from hlbl.model import LBL, LBLConfig
    from hlbl.optim import make_optimizer
    from hlbl.tree import WordTree, build_tree

    torch.set_num_threads(args.threads)
    corpus = load_corpus(args.data, args.max_vocab)
    stream, pad, V = corpus["train"], corpus.vocab.eos, len(corpus.vocab)
    models = {"flat": (LBLConfig(V, output="flat"), None, "torch")}
    for kind in ("nce", "sampled"):
        for k in args.samples:
            models[f"{kind}-{k}"] = (LBLConfig(V, output=kind, samples=k), None, "torch")
    for spec in args.trees:  # NAME=PATH, or NAME=random / NAME=huffman
        name, _, path = spec.partition("=")
        tree = WordTree.load(path) if Path(path).is_file() else build_tree(path, V, corpus.vocab.counts, 0)
        models[f"tree:{name}"] = (LBLConfig(V, output="tree"), tree, "auto")
    for spec in args.classes:  # NAME=PATH of word classes (hlbl tree build --classes)
        from hlbl.classes import WordClasses

        name, _, path = spec.partition("=")
        models[f"classes:{name}"] = (LBLConfig(V, output="classes"), WordClasses.load(path), "auto")
    built = {}
    for name, (mc, tree, engine) in models.items():
        m = LBL(mc, tree, torch.Generator().manual_seed(0))
        m.init_unigram(corpus.vocab.counts)
        cfg = TrainConfig(engine=engine, progress=False, seed=0)
        # (model, optimiser, recipe, the step implementation training would use: fast engine for trees)
        built[name] = (m, make_optimizer(m, cfg, cfg.lr), cfg, choose_engine(m, cfg))
    half = args.flat_tokens // 2  # the flat model trains half before the others and half after

    def flat(i: int) -> float:
        m, opt, cfg, run = built["flat"]
        return run(m, opt, stream[i * half : (i + 1) * half], pad, cfg, 1, False)[1]

    def other(n: str):
        m, opt, cfg, run = built[n]
        return lambda: run(m, opt, stream[: args.tokens], pad, cfg, 1, False)[1]

    wps, ratios = side_by_side(args.rounds, flat, {n: other(n) for n in built if n != "flat"})
    report = {
        "what": "training words/s side by side in one process, momentum SGD, batch 1000, d 100, context 5",
        "data": args.data,
        "max_vocab": args.max_vocab,
        "vocab_size": V,
        "train_tokens": len(stream),
        "threads": args.threads,
        "rounds": args.rounds,
        "tokens_per_round": args.tokens,
        "flat_tokens_per_round": args.flat_tokens,
        "trees": args.trees,
        "words_per_s_median": {n: statistics.median(v) for n, v in wps.items()},
        "words_per_s_range": {n: [min(v), max(v)] for n, v in wps.items()},
        "ratio_to_flat_median": {n: statistics.median(v) for n, v in ratios.items()},
        "words_per_s": wps,
    }
    write_json(args.out, report)
    print(json.dumps(report["ratio_to_flat_median"], indent=1))


# Speed keys of the rows of `hlbl reproduce` (results/ptb/results.json), by tree label.
REPRODUCE_KEYS = {
    "RANDOM": "tree:random",
    "BALANCED": "tree:balanced",
    "ADAPTIVE": "tree:adaptive",
    "ADAPTIVE(0.25)": "tree:adaptive0.25",
    "ADAPTIVE(0.4)": "tree:a04",
    "ADAPTIVE(0.4) x2": "tree:adaptive0.4x2",
    "ADAPTIVE(0.4) x4": "tree:adaptive0.4x4",
}


def _reproduce_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rep = json.loads(path.read_text())
    out = []
    for r in rep["rows"]:
        base = {
            "test_ppl": r["test_perplexity"],
            "valid_ppl": r.get("valid_perplexity"),
            "command": rep["config"]["command"],
            "source": str(path),
        }
        if r["model"] == "KN5":
            out.append({**base, "model": "kn5", "name": "KN5", "speed_key": None, "epochs": None, "converged": None})
            continue
        flat = r["model"] == "LBL"
        out.append(
            {
                **base,
                "model": "flat" if flat else "tree",
                "name": "LBL (flat softmax)" if flat else f"HLBL {r['tree']}",
                "speed_key": "flat" if flat else REPRODUCE_KEYS.get(r["tree"]),
                "epochs": r["epochs"],
                # The flat run met its 14-epoch cap; run on, its validation perplexity rises at
                # epoch 15 (results/ptb/notes.md): early stopping would have ended it there.
                "converged": True if flat else bool(r["stopped_early"]),
                "minutes_per_epoch_run": r["minutes_per_epoch"],
                "words_per_s_run": r["words_per_sec"],
            }
        )
    return out


def _sampling_rows(path: Path) -> list[dict]:
    rows = []
    for r in _load_rows(path):
        if r.get("source"):  # reference rows copied from elsewhere
            continue
        rows.append(
            {
                **{k: r[k] for k in ("model", "name", "test_ppl", "valid_ppl", "epochs", "converged", "command")},
                "speed_key": f"{r['model']}-{r['samples']}" if r.get("samples") else None,
                "minutes_per_epoch_run": r["minutes_per_epoch"],
                "words_per_s_run": r["words_per_s"],
                "source": str(path),
            }
        )
    return rows


def table(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = _reproduce_rows(out / "results.json")
    rows += _sampling_rows(Path(args.sampling))
    for r in _load_rows(out / "classes.json"):  # bench/classes_table.py's rows
        rows.append(
            {
                **r,
                "name": f"LBL, two-level classes: {r['name']}",
                "speed_key": f"classes:{r['name']}",
                "minutes_per_epoch_run": r.get("minutes_per_epoch"),
                "words_per_s_run": r.get("words_per_sec"),
                "source": str(out / "classes.json"),
            }
        )
    for r in _load_rows(Path(args.rows)):
        rows.append({**r, "source": r.get("source", args.rows)})
    sp = json.loads(Path(args.speed).read_text()) if args.speed != "none" and Path(args.speed).is_file() else {}
    med = sp.get("words_per_s_median", {})
    ratio = sp.get("ratio_to_flat_median", {})
    for r in rows:
        key = r.get("speed_key")
        if key in med:
            r["words_per_s"] = med[key]
            r["minutes_per_epoch"] = sp.get("train_tokens", PTB_TRAIN_TOKENS) / med[key] / 60
            r["speed_vs_flat"] = 1.0 if key == "flat" else ratio.get(key)
        else:
            r["words_per_s"] = r.get("words_per_s_run")
            r["minutes_per_epoch"] = r.get("minutes_per_epoch_run")
            r["speed_vs_flat"] = None
    if not med:  # no side-by-side figures: each run's own words/s against the flat run's own (rough)
        own_flat = next((r.get("words_per_s_run") for r in rows if r["model"] == "flat"), None)
        for r in rows:
            if own_flat and r.get("words_per_s_run"):
                r["speed_vs_flat"] = r["words_per_s_run"] / own_flat
    order = {"flat": 0, "tree": 1, "nce": 2, "sampled": 3, "kn5": 4, "mixture": 5}
    rows.sort(key=lambda r: (order.get(r["model"], 9), r["test_ppl"]))
    write_json(out / "frontier.json", rows)
    flat = next((r for r in rows if r["model"] == "flat" and r.get("converged")), None)

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    tokens = next((r["test_tokens"] for r in rows if r.get("test_tokens")), None)
    md = [
        f"# Quality against training time on {args.corpus}",
        "",
        "Produced by `python bench/frontier.py table` from the result files named in each row's source; one run "
        f"per row (seed 0), 100-d features, context 5, exact perplexity over the whole vocabulary "
        f"({tokens or '?':,} test tokens). *Minutes per epoch* and *words/s* are measured "
        "side by side in one process (`bench/frontier.py speed`, `frontier_speed.json`, median of "
        f"{sp.get('rounds', '?')} rounds, {sp.get('threads', '?')} thread) for every row whose kind it times; "
        "*speed vs flat* is the median of the per-round ratios (without a speed file: each run's own words/s over "
        "the flat run's own, rough). The run's own mean minutes per epoch "
        "(training only, measured under whatever else ran on the shared 2-core machine) is the last column. "
        "*Converged*: early stopping ended the run, not an epoch cap.",
        "",
        "| model | test ppl | valid ppl | vs flat (test) | epochs | converged | min/epoch | words/s | speed vs flat "
        "| min/epoch (own run) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rel = f"{100 * (r['test_ppl'] / flat['test_ppl'] - 1):+.1f}%" if flat else "-"
        conv = {True: "yes", False: "no (cap)", None: "-"}[r.get("converged")]
        md.append(
            f"| {r['name']} | {r['test_ppl']:.1f} | {f(r.get('valid_ppl'), '.1f')} | {rel} | "
            f"{f(r.get('epochs'), 'd')} | {conv} | {f(r.get('minutes_per_epoch'), '.3f')} | "
            f"{f(r.get('words_per_s'), ',.0f')} | {f(r.get('speed_vs_flat'), '.1f')}{'x' if r.get('speed_vs_flat') else ''} | "
            f"{f(r.get('minutes_per_epoch_run'), '.3f')} |"
        )
    notes = [r for r in rows if r.get("note")]
    if notes:
        md += ["", "Notes:", ""] + [f"- {r['name']}: {r['note']}" for r in notes]
    md += ["", "Commands:", ""]
    seen = set()
    for r in rows:
        if r.get("command") and r["command"] not in seen:
            same = [x["name"] for x in rows if x.get("command") == r["command"]]
            md.append(f"- {', '.join(same)}: `{r['command']}`")
            seen.add(r["command"])
    (out / "frontier.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    _plot(rows, out / "frontier.png", args.corpus)


def _plot(rows: list[dict], path: Path, corpus: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[plot]')", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(9, 6))
    marks = {
        "flat": ("s", "black"),
        "tree": ("o", "tab:blue"),
        "nce": ("^", "tab:orange"),
        "sampled": ("v", "tab:green"),
    }
    for r in rows:
        if r["model"] in marks and r.get("minutes_per_epoch"):
            m, c = marks[r["model"]]
            ax.scatter(r["minutes_per_epoch"], r["test_ppl"], marker=m, color=c)
            ax.annotate(
                r["name"].replace("HLBL ", ""),
                (r["minutes_per_epoch"], r["test_ppl"]),
                fontsize=7,
                xytext=(3, 2),
                textcoords="offset points",
            )
    for r in rows:
        if r["model"] in ("kn5", "mixture"):
            ax.axhline(r["test_ppl"], color="gray" if r["model"] == "kn5" else "tab:red", lw=0.8, ls="--")
            ax.annotate(
                r["name"], (ax.get_xlim()[0], r["test_ppl"]), fontsize=7, xytext=(2, 2), textcoords="offset points"
            )
    ax.set_xscale("log")
    ax.set_xlabel("minutes per training epoch (1 thread)")
    ax.set_ylabel(f"{corpus} test perplexity (exact)")
    ax.set_title(f"Quality against training time per epoch on {corpus} (lower left is better)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def quick(args) -> None:
    """Every subcommand once, small, on the synthetic corpus, into quick_dir()/frontier."""
    from hlbl.cli import main as hlbl_main

    out, ns = quick_dir() / "frontier", argparse.Namespace
    rows, speed_file, arpa = out / "frontier_runs.json", out / "frontier_speed.json", out / "kn3.arpa"
    run, _ = quick_run("frontier-random", "--tree", "random")
    data = str(tiny_corpus(quick_dir() / "corpus"))
    if hlbl_main(["ngram", "train", "--data", data, "--order", "3", "--out", str(arpa)]):
        raise SystemExit("hlbl ngram train failed")
    row(ns(run=str(run), name="HLBL RANDOM", model="tree", speed_key="tree:random", rows=str(rows), threads=1,
           command="hlbl train --tree random", note=None))  # fmt: skip
    mix(ns(run=str(run), run_name="random", arpa=str(arpa), arpa_name="kn3.arpa", name="HLBL RANDOM + KN3",
           ensemble=[], rows=str(rows), threads=1, note=None))  # fmt: skip
    speed(ns(trees=["random=random", "huffman=huffman"], classes=[], data=data, max_vocab=None, samples=[5],
             threads=1, rounds=1, tokens=2_000, flat_tokens=1_000, out=str(speed_file)))  # fmt: skip
    table(ns(out=str(out), sampling="none", rows=str(rows), speed=str(speed_file), corpus="a synthetic corpus"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap)
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("row")
    r.add_argument("--run", required=True)
    r.add_argument("--name", required=True)
    r.add_argument("--model", default="tree", help="flat, tree, nce, sampled, kn5, mixture")
    r.add_argument("--speed-key", default=None, help="the row's kind in the speed file (e.g. tree:adaptive0.4x4)")
    r.add_argument("--command", required=True, help="the command that made the run")
    r.add_argument("--note", default=None)
    r.add_argument("--rows", default="results/ptb/frontier_runs.json")
    r.add_argument("--threads", type=int, default=1)
    r.set_defaults(func=row)
    m = sub.add_parser("mix")
    m.add_argument("--run", required=True)
    m.add_argument("--run-name", required=True, help="the run as the command line should show it")
    m.add_argument("--arpa", required=True)
    m.add_argument("--arpa-name", required=True, help="the ARPA file as the command line should show it")
    m.add_argument("--name", required=True)
    m.add_argument("--with", dest="ensemble", action="append", default=[], help="more runs in the mixture")
    m.add_argument("--note", default=None)
    m.add_argument("--rows", default="results/ptb/frontier_runs.json")
    m.add_argument("--threads", type=int, default=1)
    m.set_defaults(func=mix)
    s = sub.add_parser("speed")
    s.add_argument("--trees", nargs="*", default=["random=random", "huffman=huffman"], help="NAME=PATH of tree files")
    s.add_argument("--classes", nargs="*", default=[], help="NAME=PATH of word classes files (--output classes)")
    s.add_argument("--data", default="ptb", help="corpus (as for hlbl train)")
    s.add_argument("--max-vocab", type=int, default=None, help="as for hlbl train")
    s.add_argument("--samples", type=int, nargs="+", default=[5, 25, 100])
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--tokens", type=int, default=50_000, help="training positions per round, per model")
    s.add_argument("--flat-tokens", type=int, default=10_000, help="training positions per round for the flat LBL")
    s.add_argument("--out", default="results/ptb/frontier_speed.json")
    s.set_defaults(func=speed)
    t = sub.add_parser("table")
    t.add_argument("--out", default="results/ptb")
    t.add_argument("--sampling", default="results/sampling/sampling.json")
    t.add_argument("--rows", default="results/ptb/frontier_runs.json")
    t.add_argument("--speed", default="results/ptb/frontier_speed.json", help="'none': the runs' own speeds only")
    t.add_argument("--corpus", default="PTB", help="the corpus, for the title")
    t.set_defaults(func=table)
    run_subcommand(ap, finish_args(ap.parse_args()), quick, "row, mix, speed, table")


if __name__ == "__main__":
    main()

"""Training and scoring throughput: HLBL beside fastText (like for like), the flat LBL and the adaptive softmax.

    python bench/throughput.py                          # everything; ~10 minutes on 2 idle cores
    python bench/throughput.py --fasttext-only --out results/fasttext.json  # part 1 only
    python bench/throughput.py --threads 1 --skip-fasttext --out throughput-1t.json
    python bench/throughput.py --quick                  # a check of the script: seconds, synthetic data

1. Like for like with fastText (``fasttext`` package, ``pip install -e ".[bench]"``): each tool
   runs in its own child process, and the child times, with ``time.perf_counter``, the same part
   of the work: from the text file ``ptb/train.txt`` to a model trained for one epoch on it
   (reading the text, building the vocabulary, initialising the model, one training pass).
   Interpreter start-up and imports are outside the clock, and so is numba's compilation of the
   HLBL kernels, the text reader's too (a warm-up on a tiny corpus first: it happens once per
   installation, as compiling fastText does). Each child may run on ``threads`` cores only
   (``sched_setaffinity``), so that with one thread HLBL also reads its text on one core. HLBL: d = 100, context 5, batch 1000, momentum 0.9, L2 as in
   ``hlbl.train``, on a Huffman tree (fastText's) and on a RANDOM tree; ``threads`` lock-free
   threads. fastText 0.9.3: CBOW + hierarchical softmax, dim 100, ws 5, t 1 (no subsampling),
   minCount 1, epoch 1, ``maxn 0`` (no subword features: the word-level model; this row is the
   1x), the same thread count. A row with fastText's default subwords (minn 3, maxn 6), at the
   main thread count only, is labelled as such. Each child measures wall time and its process's
   CPU time (all its threads) over the same span; CPU time depends much less on what else runs
   on the machine. The HLBL child also reports how much of the span was the training call;
   fastText's own words/sec/thread figure (its own clock, training loop only) is kept beside.
2. The rest (in this process, data already in memory, kernels compiled; the clock is around the
   training call only): HLBL's PyTorch engine, the flat-softmax LBL, the LBL with
   ``nn.AdaptiveLogSoftmaxWithLoss``, HLBL on other trees (300 batches each: Huffman, stacks of
   2 and 4 RANDOM trees, learned ADAPTIVE(0.4) and ADAPTIVE(0.4) x2 trees), scoring
   (``hlbl.evaluate.token_log_probs``), and a synthetic Zipf(1) corpus with V = 33,278
   (WikiText-2's vocabulary size): HLBL, flat and adaptive again.

Every measurement runs ``--rounds`` times (default 5), round robin over the whole list, so that a
burst of load from other processes hits one round of everything rather than one contender. The
JSON keeps every round; the summary gives the median and the range, and each HLBL/fastText ratio
is the median of the per-round ratios (both measured in the same round, back to back), by wall
time and by CPU time.

The last line of stdout is the summary as one JSON object; ``--out`` (default
``results/throughput.json``) gets the summary and every measurement, rewritten after every round.
Needs PTB (found as ``hlbl train --data ptb`` finds it; ``--data`` names another corpus).

``--quick``: one round at one thread on the synthetic corpus of ``bench/_common.py``, a few batches
of each, V = 2,000 for the Zipf corpus, and of the from-text children one HLBL (Huffman) and one
fastText (no subwords, skipped with a message when fastText is not installed); the JSON goes to a
temporary directory (``$HLBL_BENCH_OUT``), never over ``results/``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hlbl import fast
from hlbl.config import TrainConfig
from hlbl.data import load_corpus, resolve_corpus
from hlbl.engine import train_epoch
from hlbl.evaluate import token_log_probs
from hlbl.model import LBL, LBLConfig
from hlbl.optim import make_optimizer
from hlbl.tree import WordTree, huffman_tree, random_tree

from _common import Clock, add_common, corpus_spec, finish_args, machine, rate, spread, write_json, zipf_stream


def stacked_random_trees(V: int, copies: int, seed: int) -> WordTree:
    """``copies`` RANDOM trees under a balanced top of copies-1 new nodes (copies a power of 2)."""
    trees = [random_tree(V, seed + k).children for k in range(copies)]
    top = copies - 1
    rows, off, roots = [], top, []
    for ch in trees:
        rows.append(np.where(ch >= 0, ch + off, ch))
        roots.append(off)
        off += len(ch)
    level = roots
    tops: list[list[int]] = []
    while len(level) > 1:  # pair up bottom-up; ids are renumbered canonically by WordTree anyway
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            tops.append([a, b])
            nxt.append(len(tops) - 1)
        level = nxt
    # tops were appended bottom-up; the root (last) must be node 0 for from_children's renumbering
    ch = np.concatenate([np.asarray(tops, dtype=np.int64).reshape(-1, 2), *rows])
    return WordTree.from_children(ch, len(tops) - 1, V)


def make_model(V: int, output: str, tree: WordTree | None, counts: np.ndarray, seed: int = 0) -> LBL:
    model = LBL(LBLConfig(V, dim=100, context=5, output=output), tree, torch.Generator().manual_seed(seed))
    model.init_unigram(counts)
    return model


def time_fast(
    model: LBL, stream: np.ndarray, pad: int, cfg: TrainConfig, threads: int, max_batches: int | None = None
) -> dict:
    """The fast engine, one epoch (or ``max_batches``) from a copy of ``model``."""
    m = copy.deepcopy(model)
    opt = make_optimizer(m, cfg, cfg.lr)
    engine = fast.FastEngine(threads=threads)
    engine.word_paths(m.out.tree)  # built before the clock starts
    with Clock() as c:
        loss, _ = engine.train(m, opt, stream, pad, cfg, 1, False, fast.Probe(max_batches=max_batches))
    n = len(stream) if max_batches is None else min(len(stream), max_batches * cfg.batch_size)
    return {**rate(n, c), "loss": loss}


def time_torch(model: LBL, stream: np.ndarray, pad: int, cfg: TrainConfig, batches: int, threads: int) -> dict:
    """The PyTorch path (autograd + torch.optim) on the first ``batches`` batches' worth of tokens.

    Run with ``threads`` intra-op threads and with 1, keeping the faster: on an oversubscribed
    machine PyTorch's thread pool can lose a lot to waiting for descheduled workers, and the
    baselines should not be handicapped by that.
    """
    best = None
    for t in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(t)
        m = copy.deepcopy(model)
        opt = make_optimizer(m, cfg, cfg.lr)
        part = stream[: batches * cfg.batch_size]
        train_epoch(m, opt, stream[: 2 * cfg.batch_size], pad, cfg, 1, False)  # warm-up (allocator, kernels)
        with Clock() as c:
            loss, _ = train_epoch(m, opt, part, pad, cfg, 1, False)
        r = {**rate(len(part), c), "loss": loss, "torch_threads": t}
        if best is None or r["wps"] > best["wps"]:
            best = r
    torch.set_num_threads(threads)
    return best


# Each child runs on ``threads`` cores only (its first lines): a tool then reads its text and
# trains with the cores it is given, like for like.
PIN = """
import os
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: int(os.environ["HLBL_BENCH_CORES"])])
"""

HLBL_CHILD = (
    PIN
    + """
import json, sys, tempfile, time
from pathlib import Path
import numpy as np, torch
from hlbl import fast
from hlbl.data import load_corpus, scan_file
from hlbl.model import LBL, LBLConfig
from hlbl.config import TrainConfig
from hlbl.optim import make_optimizer
from hlbl.tree import huffman_tree, random_tree

corpus_dir, kind, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
cfg = TrainConfig(progress=False)

def build(vocab):
    counts = np.asarray(vocab.counts, np.float64)
    tree = huffman_tree(counts) if kind == "huffman" else random_tree(len(vocab), 0)
    model = LBL(LBLConfig(len(vocab), dim=100, context=5, output="tree"), tree, torch.Generator().manual_seed(0))
    model.init_unigram(counts)
    return model

def epoch(model, stream, pad):
    return fast.FastEngine(threads=threads)(model, make_optimizer(model, cfg, cfg.lr), stream, pad, cfg, 1, False)

with tempfile.TemporaryDirectory() as tiny, tempfile.TemporaryDirectory() as cache:
    with open(tiny + "/train.txt", "w") as f:  # warm-up: numba loads (or compiles) the kernels
        f.write("the cat sat on the mat\\n" * 200)
    scan_file(Path(tiny) / "train.txt", Path(tiny) / "warm.i32", workers=1)  # (the text reader's)
    c = load_corpus(tiny, splits=("train",), cache_dir=cache + "/warm")
    epoch(build(c.vocab), c["train"], c.vocab.eos)
    t0, c0 = time.perf_counter(), time.process_time()
    corpus = load_corpus(corpus_dir, splits=("train",), cache_dir=cache + "/run")  # count, encode
    model = build(corpus.vocab)
    t1 = time.perf_counter()
    loss, _ = epoch(model, corpus["train"], corpus.vocab.eos)
    t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"wall": t2 - t0, "cpu": c2 - c0, "train_s": t2 - t1, "tokens": len(corpus["train"]),
                  "vocab": len(corpus.vocab), "loss": loss}))
"""
)

FASTTEXT_CHILD = (
    PIN
    + """
import json, sys, time
import fasttext

path, threads, maxn = sys.argv[1], int(sys.argv[2]), sys.argv[3]
extra = {} if maxn == "default" else {"maxn": int(maxn)}
t0, c0 = time.perf_counter(), time.process_time()
m = fasttext.train_unsupervised(path, model="cbow", loss="hs", dim=100, ws=5, t=1, thread=threads, epoch=1,
                                minCount=1, verbose=2, **extra)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
words, freq = m.get_words(include_freq=True)
print(json.dumps({"wall": wall, "cpu": cpu, "tokens": int(sum(freq)), "vocab": len(words)}))
"""
)


def run_child(code: str, args: list[str], cores: int) -> tuple[dict, str] | None:
    """Run ``code`` in a child Python on ``cores`` cores; its last stdout line (JSON) and its whole
    output. None: fastText missing."""
    cores = min(cores, len(os.sched_getaffinity(0)))
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HLBL_BENCH_CORES": str(cores)},
    )
    if proc.returncode != 0:
        if "No module named 'fasttext'" in proc.stderr:
            return None
        raise RuntimeError(f"child failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr


def from_text(res: dict, **extra) -> dict:
    """A child's report (tokens, wall and CPU seconds, vocabulary) as words/s by wall and by CPU time."""
    return {
        "wps": res["tokens"] / res["wall"],
        "cpu_wps": res["tokens"] / max(res["cpu"], 1e-9),
        "tokens": res["tokens"],
        "wall_s": res["wall"],
        "cpu_s": res["cpu"],
        "vocab": res["vocab"],
        **extra,
    }


def time_hlbl_from_text(corpus_dir: Path, kind: str, threads: int) -> dict:
    """HLBL, text file to a model trained one epoch (see the module's docstring)."""
    res, _ = run_child(HLBL_CHILD, [str(corpus_dir), kind, str(threads)], threads)
    return from_text(res, train_s=res["train_s"], loss=res["loss"])


def time_fasttext_from_text(path: Path, threads: int, maxn: str) -> dict | None:
    """fastText CBOW + HS, text file to a model trained one epoch; None when fasttext is not installed."""
    out = run_child(FASTTEXT_CHILD, [str(path), str(threads), maxn], threads)
    if out is None:
        return None
    res, text = out
    own = re.findall(r"words/sec/thread:\s*(\d+)", text)
    return from_text(res, reported_wps_per_thread=int(own[-1]) if own else None)


def time_eval(model: LBL, stream: np.ndarray, pad: int) -> dict:
    token_log_probs(model, stream[:5000], pad)  # warm-up
    with Clock() as c:
        token_log_probs(model, stream, pad)
    return rate(len(stream), c)


def mean_code_length(tree: WordTree, counts: np.ndarray) -> float:
    """Sum of the lengths of a word's codes, averaged over the unigram distribution (Table 1)."""
    per_word = np.zeros(tree.num_words)
    np.add.at(per_word, tree.leaf_word, tree.leaf_depth)
    p = counts / counts.sum()
    return float((p * per_word).sum())


def warm_up(threads: int) -> None:
    """Compile (or load from numba's cache) the fast kernels outside the timings."""
    tree = random_tree(50, 0)
    m = make_model(50, "tree", tree, np.ones(50))
    s = np.arange(400, dtype=np.int32) % 50
    cfg = TrainConfig(batch_size=100, progress=False)
    fast.FastEngine(threads=threads)(m, make_optimizer(m, cfg, cfg.lr), s, 0, cfg, 1, False)
    token_log_probs(m, s, 0)


def in_process_plan(args, cfg: TrainConfig, out: dict, other_trees: dict) -> list:
    """Part 2 of the module's docstring: what runs in this process, data in memory, kernels compiled."""
    T = args.threads
    warm_up(T)
    corpus = load_corpus(corpus_spec(args))
    V, pad, counts = len(corpus.vocab), corpus.vocab.eos, np.asarray(corpus.vocab.counts, np.float64)
    train = corpus["train"]
    tree = random_tree(V, 0)
    hlbl = make_model(V, "tree", tree, counts)
    plan: list[tuple[str, str, Callable[[], dict | None]]] = []
    plan += [
        ("ptb_hlbl_fast", f"HLBL fast engine, {T} threads", lambda: time_fast(hlbl, train, pad, cfg, T)),
        (
            "ptb_hlbl_fast_1thread",
            "HLBL fast engine, 1 thread (deterministic)",
            lambda: time_fast(hlbl, train, pad, cfg, 1),
        ),
        ("ptb_hlbl_torch", "HLBL PyTorch engine", lambda: time_torch(hlbl, train, pad, cfg, args.torch_batches, T)),
        (
            "ptb_flat",
            "flat LBL (PyTorch)",
            lambda: time_torch(make_model(V, "flat", None, counts), train, pad, cfg, args.flat_batches, T),
        ),
        (
            "ptb_adaptive",
            "LBL + AdaptiveLogSoftmaxWithLoss",
            lambda: time_torch(make_model(V, "adaptive", None, counts), train, pad, cfg, args.adaptive_batches, T),
        ),
        ("ptb_eval", "scoring (evaluate.token_log_probs)", lambda: time_eval(hlbl, train, pad)),
    ]
    other_trees["huffman"] = huffman_tree(counts)
    for copies in (2, 4):
        other_trees[f"x{copies}_random"] = stacked_random_trees(V, copies, 1)
    from hlbl.treebuild import build_tree_from_features, word_features  # learned trees (the paper's Section 5)

    trained = copy.deepcopy(hlbl)  # features from an HLBL trained one epoch
    fast.train_epoch(trained, make_optimizer(trained, cfg, cfg.lr), train, pad, cfg, 1, False)
    X, _ = word_features(trained, train, pad)
    for copies in (1, 2):
        other_trees[f"adaptive0.4_x{copies}"] = build_tree_from_features(X, "adaptive:0.4", seed=0, copies=copies)
    for name, mt in other_trees.items():
        m = make_model(V, "tree", mt, counts)
        out[f"tree_{name}"] = {
            "mean_code_length": mean_code_length(mt, counts),
            "codes_per_word": float((counts / counts.sum() * mt.codes_per_word).sum()),
        }
        plan.append(
            (
                f"ptb_hlbl_fast_{name}",
                f"HLBL fast, {name} (code length {out[f'tree_{name}']['mean_code_length']:.1f})",
                lambda m=m: time_fast(m, train, pad, cfg, T, max_batches=300),
            )
        )
    out["ptb_mean_code_length_single"] = mean_code_length(tree, counts)

    V2 = args.zipf_vocab  # synthetic Zipf
    zs = zipf_stream(V2, args.zipf_tokens, seed=1)
    zc = np.bincount(zs, minlength=V2).astype(np.float64)
    h2 = make_model(V2, "tree", random_tree(V2, 0), zc)
    plan += [
        ("v33k_hlbl_fast", f"V={V2:,} HLBL fast engine, {T} threads", lambda: time_fast(h2, zs, 0, cfg, T)),
        ("v33k_hlbl_torch", f"V={V2:,} HLBL PyTorch engine", lambda: time_torch(h2, zs, 0, cfg, args.torch_batches, T)),
        (
            "v33k_flat",
            f"V={V2:,} flat LBL",
            lambda: time_torch(make_model(V2, "flat", None, zc), zs, 0, cfg, args.flat_batches_33k, T),
        ),
        (
            "v33k_adaptive",
            f"V={V2:,} adaptive softmax",
            lambda: time_torch(make_model(V2, "adaptive", None, zc), zs, 0, cfg, args.adaptive_batches, T),
        ),
    ]

    return plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common(ap, threads=2, out="results/throughput.json", out_help="JSON with every measurement")
    ap.add_argument("--torch-batches", type=int, default=40, help="batches for the PyTorch HLBL path")
    ap.add_argument("--flat-batches", type=int, default=8, help="batches for the flat LBL at V=10k")
    ap.add_argument("--adaptive-batches", type=int, default=30)
    ap.add_argument("--flat-batches-33k", type=int, default=4)
    ap.add_argument("--zipf-tokens", type=int, default=1_000_000)
    ap.add_argument("--zipf-vocab", type=int, default=33_278, help="the synthetic corpus's vocabulary (WikiText-2's)")
    ap.add_argument("--skip-fasttext", action="store_true")
    ap.add_argument("--fasttext-only", action="store_true", help="only part 1: HLBL and fastText from the text file")
    ap.add_argument("--rounds", type=int, default=5, help="rounds over all measurements (median and range reported)")
    args = ap.parse_args(argv)
    if args.rounds < 3 and not args.quick:
        ap.error("--rounds must be at least 3 (a median and a spread)")
    # quick: one round of everything at tiny sizes, and of the from-text children only the two
    # kinds of child (HLBL on a Huffman tree, fastText without subwords) at one thread
    finish_args(
        args, threads=1, rounds=1, torch_batches=2, flat_batches=2, adaptive_batches=2, flat_batches_33k=2,
        zipf_tokens=20_000, zipf_vocab=2_000,
    )  # fmt: skip
    T = args.threads
    torch.set_num_threads(T)
    torch.manual_seed(0)
    host = machine()
    load = host["loadavg"] or [0.0, 0.0, 0.0]
    print(
        f"threads {T}; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {host['cpus']} CPUs",
        file=sys.stderr,
    )
    cfg = TrainConfig(progress=False)
    ptb_dir = resolve_corpus(corpus_spec(args))
    out: dict = {"threads": T, "rounds": args.rounds, "load_before": load, "machine": host}

    def show(name, r):
        extra = "" if "loss" not in r else f"  loss {r['loss']:.3f}"
        extra += f"  (torch threads {r['torch_threads']})" if "torch_threads" in r else ""
        extra += f"  ({r['wall_s']:.2f} s, of which training {r['train_s']:.2f} s)" if "train_s" in r else ""
        extra += f"  (CPU {r['cpu_s']:.2f} s: {r['cpu_wps']:,.0f} words per CPU-second)" if "cpu_s" in r else ""
        if r.get("reported_wps_per_thread"):
            extra += f"  (its own words/sec/thread {r['reported_wps_per_thread']:,})"
        print(f"{name:<52} {r['wps']:>12,.0f} words/s{extra}", file=sys.stderr)

    # ---- what to measure ------------------------------------------------------------------
    plan: list[tuple[str, str, Callable[[], dict | None]]] = []
    for t in sorted({T, 1}):
        plan += [
            (
                f"text_hlbl_huffman_t{t}",
                f"from text: HLBL, Huffman tree, {t} thread(s)",
                lambda t=t: time_hlbl_from_text(ptb_dir, "huffman", t),
            ),
            (
                f"text_hlbl_random_t{t}",
                f"from text: HLBL, RANDOM tree, {t} thread(s)",
                lambda t=t: time_hlbl_from_text(ptb_dir, "random", t),
            ),
        ][: 1 if args.quick else 2]
        if not args.skip_fasttext:
            plan.append(
                (
                    f"text_fasttext_maxn0_t{t}",
                    f"from text: fastText CBOW+HS, maxn 0, {t} thread(s)",
                    lambda t=t: time_fasttext_from_text(ptb_dir / "train.txt", t, "0"),
                )
            )
            if t == T and not args.quick:  # the subword model only at the main thread count: it is ~4x slower
                plan.append(
                    (
                        f"text_fasttext_subwords_t{t}",
                        f"from text: fastText CBOW+HS, subwords, {t} thread(s)",
                        lambda t=t: time_fasttext_from_text(ptb_dir / "train.txt", t, "default"),
                    )
                )
    other_trees: dict[str, WordTree] = {}
    if not args.fasttext_only:
        plan += in_process_plan(args, cfg, out, other_trees)
    # ---- measure: the whole plan, round robin -----------------------------------------------
    rounds: dict[str, list[dict]] = {}
    for rnd in range(1, args.rounds + 1):
        for key, label, fn in plan:
            r = fn()
            if r is None:
                print(f'{label}: fasttext is not installed (pip install -e ".[bench]"), skipped', file=sys.stderr)
                continue
            rounds.setdefault(key, []).append(r)
            show(f"[{rnd}] {label}", r)
        summary = write_summary(
            args, out, rounds, other_trees, load
        )  # after every round: a stopped run keeps its rounds
    print(json.dumps(summary))
    return 0


def write_summary(args, out: dict, rounds: dict, other_trees: dict, load) -> dict:
    """Medians, ranges and per-round ratios of the rounds so far, into ``args.out``."""
    T = args.threads
    out["load_after"] = list(os.getloadavg())
    out["measurements"] = rounds

    def wps(key: str) -> dict | None:
        return spread([r["wps"] for r in rounds[key]]) if key in rounds else None

    def ratio(key: str, base: str, field: str = "wps") -> dict | None:
        """Median and range of the per-round ratios of two measurements (same round: back to back)."""
        if key not in rounds or base not in rounds:
            return None
        return spread([a[field] / b[field] for a, b in zip(rounds[key], rounds[base])])

    like = {}
    for t in sorted({T, 1}):
        base = f"text_fasttext_maxn0_t{t}"
        for name in ("hlbl_huffman", "hlbl_random", "fasttext_maxn0", "fasttext_subwords"):
            key = f"text_{name}_t{t}"
            if key in rounds:
                like[f"{name}_t{t}"] = {
                    "wps": wps(key),
                    "vs_fasttext_maxn0": ratio(key, base),
                    "cpu_wps": spread([r["cpu_wps"] for r in rounds[key]]),
                    "vs_fasttext_maxn0_cpu": ratio(key, base, "cpu_wps"),
                }
                if name.startswith("hlbl"):
                    like[f"{name}_t{t}"]["training_share"] = spread([r["train_s"] / r["wall_s"] for r in rounds[key]])
    summary = {
        "like_for_like_from_text": like,
        "hlbl_fast_wps": wps("ptb_hlbl_fast"),
        "hlbl_fast_1thread_wps": wps("ptb_hlbl_fast_1thread"),
        "hlbl_torch_wps": wps("ptb_hlbl_torch"),
        "flat_wps": wps("ptb_flat"),
        "adaptive_wps": wps("ptb_adaptive"),
        "eval_wps": wps("ptb_eval"),
        "eval_vs_train": ratio("ptb_eval", "ptb_hlbl_fast"),
        "hlbl_vs_adaptive": ratio("ptb_hlbl_fast", "ptb_adaptive"),
        "hlbl_vs_flat": ratio("ptb_hlbl_fast", "ptb_flat"),
        "hlbl_wps_by_tree": {
            name: {
                "wps": wps(f"ptb_hlbl_fast_{name}"),
                "mean_code_length": round(out[f"tree_{name}"]["mean_code_length"], 1),
            }
            for name in other_trees
        },
        "v33k_hlbl_wps": wps("v33k_hlbl_fast"),
        "v33k_flat_wps": wps("v33k_flat"),
        "v33k_adaptive_wps": wps("v33k_adaptive"),
        "v33k_hlbl_vs_flat": ratio("v33k_hlbl_fast", "v33k_flat"),
        "v33k_hlbl_vs_adaptive": ratio("v33k_hlbl_fast", "v33k_adaptive"),
        "threads": T,
        "rounds": len(next(iter(rounds.values()))) if rounds else 0,
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in out["load_after"]],
    }
    write_json(args.out, {"summary": summary, "details": out})
    return summary


if __name__ == "__main__":
    sys.exit(main())

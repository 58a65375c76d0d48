"""Training and scoring throughput: HLBL (fast and PyTorch engines) vs flat LBL, adaptive softmax, fastText.

    python bench/throughput.py                 # about 3-8 minutes; needs $HLBL_DATA with ptb/
    python bench/throughput.py --threads 1 --skip-fasttext --out /tmp/throughput.json  # not over results/

All in one process (fastText in a child process), on the same data, with the same thread
count (default 2); words/s = training tokens / wall time of the training call (data already in
memory, kernels compiled by a warm-up). The machine is shared, so every measurement runs
``--repeats`` times (default 2), round robin over the whole list so that a burst of load hits
one round of everything rather than one contender, and the best is kept (all are in the JSON).
Each measurement also reports words per CPU-second (process CPU time, the child's for
fastText), which depends much less on what else runs.

1. PTB (V = 10,000, d = 100, context 5, batch 1000, lr 1e-3, momentum 0.9, L2 as in train.py):
   (a) HLBL on a single-code RANDOM tree: the fast engine (Hogwild threads; and one thread,
       deterministic) for a full epoch; the PyTorch engine (autograd) on ``--torch-batches``;
   (b) flat-softmax LBL (PyTorch) on ``--flat-batches`` (every PyTorch measurement runs with
       the thread count and with one thread, and keeps the faster);
   (c) the same LBL encoder with ``nn.AdaptiveLogSoftmaxWithLoss`` (output "adaptive");
   (d) fastText 0.9.3 CBOW + hierarchical softmax: dim 100, ws 5, t 1 (no subsampling), epoch 1,
       minCount 1, same threads, otherwise defaults (so with character n-grams, minn 3 / maxn 6),
       timed around ``train_unsupervised`` (which includes its vocabulary pass over the file);
       fastText's own words/sec/thread is printed beside it, and a run with maxn 0 (no
       subwords: the word2vec-style model) as well;
   (e) scoring: ``hlbl.evaluate.token_log_probs`` over the training stream;
   (f) other trees with the fast engine (300 batches each), with their mean code length: Huffman
       (fastText's tree), x2 and x4 stacks of RANDOM trees (every word 2 / 4 codes, the shape of
       the paper's T6/T7), and, when ``hlbl.treebuild`` is there, learned ADAPTIVE(0.4) and
       ADAPTIVE(0.4) x2 trees built from the word features of the model trained in (a).
2. A synthetic Zipf(1) corpus with V = 33,278 (WikiText-2's vocabulary size), ``--zipf-tokens``
   tokens: (a), (b), (c) again.

The last line is one JSON object; results/throughput.json gets the same object.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hlbl import fast
from hlbl.data import load_corpus, resolve_corpus
from hlbl.evaluate import token_log_probs
from hlbl.model import LBL, LBLConfig
from hlbl.train import TrainConfig, make_optimizer, train_epoch
from hlbl.tree import WordTree, huffman_tree, random_tree

ROOT = Path(__file__).resolve().parent.parent


def zipf_stream(V: int, n_tokens: int, seed: int, s: float = 1.0) -> np.ndarray:
    """(n_tokens,) int32 i.i.d. tokens with P(word r) proportional to 1/(r+1)^s (id 0 most frequent)."""
    p = 1.0 / np.arange(1, V + 1, dtype=np.float64) ** s
    cdf = np.cumsum(p / p.sum())
    u = np.random.default_rng(seed).random(n_tokens)
    return np.minimum(np.searchsorted(cdf, u), V - 1).astype(np.int32)


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


class Clock:
    """Wall and process-CPU seconds of a block."""

    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def rate(tokens: int, clock: Clock) -> dict:
    return {"wps": tokens / clock.wall, "cpu_wps": tokens / max(clock.cpu, 1e-9), "tokens": tokens, "wall_s": clock.wall}


def time_fast(model: LBL, stream: np.ndarray, pad: int, cfg: TrainConfig, threads: int,
              max_batches: int | None = None) -> dict:
    """The fast engine, one epoch (or ``max_batches``) from a copy of ``model``."""
    m = copy.deepcopy(model)
    opt = make_optimizer(m, cfg, cfg.lr)
    with Clock() as c:
        loss, _ = fast.train_epoch(m, opt, stream, pad, cfg, 1, False, threads=threads, max_batches=max_batches)
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
        train_epoch(m, opt, stream[: 2 * cfg.batch_size], pad, cfg, 0, False)  # warm-up (allocator, kernels)
        with Clock() as c:
            loss, _ = train_epoch(m, opt, part, pad, cfg, 1, False)
        r = {**rate(len(part), c), "loss": loss, "torch_threads": t}
        if best is None or r["wps"] > best["wps"]:
            best = r
    torch.set_num_threads(threads)
    return best


def time_fasttext(path: Path, threads: int, maxn: int | None = None) -> dict | None:
    """fastText CBOW + HS in a child process; None when fasttext is not installed."""
    extra = "" if maxn is None else f", maxn={maxn}"
    code = (
        "import fasttext, json, time\n"
        "t = time.perf_counter()\n"
        f"m = fasttext.train_unsupervised({str(path)!r}, model='cbow', loss='hs', dim=100, ws=5, t=1, "
        f"thread={threads}, epoch=1, minCount=1, verbose=2{extra})\n"
        "wall = time.perf_counter() - t\n"
        "words, freq = m.get_words(include_freq=True)\n"
        "print(json.dumps({'wall': wall, 'tokens': int(sum(freq)), 'vocab': len(words)}))\n"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        if "No module named 'fasttext'" in proc.stderr:
            return None
        raise RuntimeError(f"fastText failed: {proc.stderr[-2000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    own = re.findall(r"words/sec/thread:\s*(\d+)", proc.stdout + proc.stderr)
    return {"wps": res["tokens"] / res["wall"], "cpu_wps": res["tokens"] / max(cpu, 1e-9), "tokens": res["tokens"],
            "wall_s": res["wall"], "vocab": res["vocab"],
            "reported_wps_per_thread": int(own[-1]) if own else None}


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
    fast.train_epoch(m, make_optimizer(m, cfg, cfg.lr), s, 0, cfg, 1, False, threads=threads)
    token_log_probs(m, s, 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch-batches", type=int, default=40, help="batches for the PyTorch HLBL path")
    ap.add_argument("--flat-batches", type=int, default=8, help="batches for the flat LBL at V=10k")
    ap.add_argument("--adaptive-batches", type=int, default=30)
    ap.add_argument("--flat-batches-33k", type=int, default=4)
    ap.add_argument("--zipf-tokens", type=int, default=1_000_000)
    ap.add_argument("--skip-fasttext", action="store_true")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over all measurements; the best of each is kept")
    ap.add_argument("--out", default=str(ROOT / "results" / "throughput.json"), help="JSON with every measurement")
    args = ap.parse_args(argv)
    T = args.threads
    torch.set_num_threads(T)
    torch.manual_seed(0)
    load = os.getloadavg()
    print(f"threads {T}; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs", file=sys.stderr)
    cfg = TrainConfig(progress=False)
    warm_up(T)

    corpus = load_corpus("ptb")
    V, pad, counts = len(corpus.vocab), corpus.vocab.eos, np.asarray(corpus.vocab.counts, np.float64)
    train = corpus["train"]
    out: dict = {"threads": T, "load_before": load}

    def show(name, r):
        extra = "" if "loss" not in r else f"  loss {r['loss']:.3f}"
        extra += f"  (torch threads {r['torch_threads']})" if "torch_threads" in r else ""
        print(f"{name:<48} {r['wps']:>12,.0f} words/s  ({r['cpu_wps']:>12,.0f} per CPU-second){extra}", file=sys.stderr)

    # ---- what to measure ------------------------------------------------------------------
    plan: list[tuple[str, str, Callable[[], dict | None]]] = []
    tree = random_tree(V, 0)
    hlbl = make_model(V, "tree", tree, counts)
    plan += [
        ("ptb_hlbl_fast", f"HLBL fast engine, {T} Hogwild threads", lambda: time_fast(hlbl, train, pad, cfg, T)),
        ("ptb_hlbl_fast_1thread", "HLBL fast engine, 1 thread (deterministic)", lambda: time_fast(hlbl, train, pad, cfg, 1)),
        ("ptb_hlbl_torch", "HLBL PyTorch engine", lambda: time_torch(hlbl, train, pad, cfg, args.torch_batches, T)),
        ("ptb_flat", "flat LBL (PyTorch)",
         lambda: time_torch(make_model(V, "flat", None, counts), train, pad, cfg, args.flat_batches, T)),
        ("ptb_adaptive", "LBL + AdaptiveLogSoftmaxWithLoss",
         lambda: time_torch(make_model(V, "adaptive", None, counts), train, pad, cfg, args.adaptive_batches, T)),
    ]
    if not args.skip_fasttext:
        path = resolve_corpus("ptb") / "train.txt"
        plan += [("fasttext", "fastText CBOW+HS (defaults, subwords)", lambda: time_fasttext(path, T)),
                 ("fasttext_maxn0", "fastText CBOW+HS, maxn 0 (no subwords)", lambda: time_fasttext(path, T, maxn=0))]
    plan.append(("ptb_eval", "scoring (evaluate.token_log_probs)", lambda: time_eval(hlbl, train, pad)))
    other_trees = {"huffman": huffman_tree(counts)}
    for copies in (2, 4):
        other_trees[f"x{copies}_random"] = stacked_random_trees(V, copies, 1)
    try:  # learned trees (the paper's Section 5), from the features of an HLBL trained one epoch
        from hlbl.treebuild import build_tree_from_features, word_features

        with Clock() as c:
            trained = copy.deepcopy(hlbl)
            fast.train_epoch(trained, make_optimizer(trained, cfg, cfg.lr), train, pad, cfg, 1, False)
            X, _ = word_features(trained, train, pad)
            for copies in (1, 2):
                other_trees[f"adaptive0.4_x{copies}"] = build_tree_from_features(X, "adaptive:0.4", seed=0, copies=copies)
        print(f"(learned ADAPTIVE(0.4) trees: one epoch of training and the builds took {c.wall:.0f} s)", file=sys.stderr)
    except ImportError:
        print("hlbl.treebuild not available: learned trees skipped", file=sys.stderr)
    for name, mt in other_trees.items():
        m = make_model(V, "tree", mt, counts)
        out[f"tree_{name}"] = {"mean_code_length": mean_code_length(mt, counts),
                               "codes_per_word": float((counts / counts.sum() * mt.codes_per_word).sum())}
        plan.append((f"ptb_hlbl_fast_{name}", f"HLBL fast, {name} (code length {out[f'tree_{name}']['mean_code_length']:.1f})",
                     lambda m=m: time_fast(m, train, pad, cfg, T, max_batches=300)))
    out["ptb_mean_code_length_single"] = mean_code_length(tree, counts)

    # synthetic Zipf, V = 33,278
    V2 = 33_278
    zs = zipf_stream(V2, args.zipf_tokens, seed=1)
    zc = np.bincount(zs, minlength=V2).astype(np.float64)
    h2 = make_model(V2, "tree", random_tree(V2, 0), zc)
    plan += [
        ("v33k_hlbl_fast", f"V=33k HLBL fast engine, {T} threads", lambda: time_fast(h2, zs, 0, cfg, T)),
        ("v33k_hlbl_torch", "V=33k HLBL PyTorch engine", lambda: time_torch(h2, zs, 0, cfg, args.torch_batches, T)),
        ("v33k_flat", "V=33k flat LBL",
         lambda: time_torch(make_model(V2, "flat", None, zc), zs, 0, cfg, args.flat_batches_33k, T)),
        ("v33k_adaptive", "V=33k adaptive softmax",
         lambda: time_torch(make_model(V2, "adaptive", None, zc), zs, 0, cfg, args.adaptive_batches, T)),
    ]

    # ---- measure: the whole plan ``--repeats`` times, round robin; keep each one's best -----
    for rnd in range(1, args.repeats + 1):
        for key, label, fn in plan:
            r = fn()
            if r is None:
                print(f"{label}: not installed (pip install fasttext==0.9.3), skipped", file=sys.stderr)
                continue
            runs = out.get(key, {}).get("all_wps", []) + [r["wps"]]
            if key not in out or r["wps"] > out[key]["wps"]:
                out[key] = r
            out[key]["all_wps"] = runs
            show(f"[{rnd}] {label}", r)
            if key.startswith("fasttext"):
                print(f"{'':<48} fastText's own figure: {r['reported_wps_per_thread']} words/sec/thread, "
                      f"{r['tokens']:,} tokens", file=sys.stderr)
    for name in other_trees:
        out[f"ptb_hlbl_fast_{name}"].update(out[f"tree_{name}"])

    out["load_after"] = os.getloadavg()
    ft = out.get("fasttext")
    summary = {
        "hlbl_wps": out["ptb_hlbl_fast"]["wps"],
        "fasttext_wps": ft["wps"] if ft else None,
        "ratio_vs_fasttext": out["ptb_hlbl_fast"]["wps"] / ft["wps"] if ft else None,
        "hlbl_wps_v33k": out["v33k_hlbl_fast"]["wps"],
        "flat_wps_v33k": out["v33k_flat"]["wps"],
        "adaptive_wps_v33k": out["v33k_adaptive"]["wps"],
        "ratio_vs_flat_v33k": out["v33k_hlbl_fast"]["wps"] / out["v33k_flat"]["wps"],
        "ratio_vs_adaptive_v33k": out["v33k_hlbl_fast"]["wps"] / out["v33k_adaptive"]["wps"],
        "eval_wps": out["ptb_eval"]["wps"],
        "eval_vs_train": out["ptb_eval"]["wps"] / out["ptb_hlbl_fast"]["wps"],
        "hlbl_wps_1thread": out["ptb_hlbl_fast_1thread"]["wps"],
        "torch_hlbl_wps": out["ptb_hlbl_torch"]["wps"],
        "flat_wps": out["ptb_flat"]["wps"],
        "adaptive_wps": out["ptb_adaptive"]["wps"],
        "fasttext_maxn0_wps": out["fasttext_maxn0"]["wps"] if out.get("fasttext_maxn0") else None,
        "fasttext_reported_wps_per_thread": ft["reported_wps_per_thread"] if ft else None,
        "hlbl_wps_by_tree": {k[len("ptb_hlbl_fast_"):]: {"wps": round(v["wps"]), "mean_code_length": round(v["mean_code_length"], 1)}
                             for k, v in out.items() if k.startswith("ptb_hlbl_fast_") and "mean_code_length" in v},
        "cpu_ratio_vs_fasttext": out["ptb_hlbl_fast"]["cpu_wps"] / ft["cpu_wps"] if ft else None,
        "threads": T,
        "load_before": [round(x, 2) for x in load],
        "load_after": [round(x, 2) for x in out["load_after"]],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "details": out}, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

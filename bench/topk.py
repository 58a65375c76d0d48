"""Exact top-k on the tree vs the full distribution vs a fastText-style depth-first search.

    python bench/topk.py                       # trains (or reuses) small PTB models, a few minutes
    python bench/topk.py --run runs/hlbl       # a given run directory (tree output)
    python bench/topk.py --trees huffman,random,learned --contexts 20000
    python bench/topk.py --quick               # a check of the script: tiny models of a synthetic corpus

For each model (by default a Huffman-tree HLBL and, when ``hlbl.treebuild`` is available, one on
a learned ADAPTIVE tree built from the Huffman model's word features; each trained for
``--epochs`` epochs on PTB and cached under ``$HLBL_CACHE/bench-topk``), on ``--contexts`` PTB
test contexts spread evenly over the split:

* node fractions: internal nodes scored per context by the exact branch-and-bound search
  (``hlbl.search.tree_topk``) for k = 1 and k = 10, divided by the number of internal nodes;
* the same for a fastText-style search (``FastText::dfs``): depth-first in fixed left-first order,
  pruning a subtree once k leaves are held and its prefix score is below the k-th best. It is
  exact for single-code trees too; it only visits more nodes. (fastText has no multi-code trees;
  for those the DFS is skipped, as a leaf-level DFS would not be exact.)
* time per context: the search vs ``TreeSoftmax.log_prob`` (the full distribution: one matrix
  product and a sweep down the tree, float32, batches of 1000), both on ``--threads`` threads
  (default 1, reported), CPU time of this process, after a warm-up outside the timing, in
  ``--rounds`` rounds measured side by side (:func:`time_rounds`); the speed-up is the median of
  the rounds' ratios (each round's ratio is listed). The machine is shared, so only the ratio is
  meaningful;
* exactness: the search's top-10 is checked against the float64 full distribution (values to
  1e-9 and equal to the 10 largest values) on every context.

The last line is one JSON object; its top-level numbers are those of the first model listed,
``per_tree`` has all of them. ``--out`` also writes it to a file. ``--quick``: models of one epoch
on the synthetic corpus of ``bench/_common.py``, 200 contexts, two rounds, everything (models
and JSON) in a temporary directory.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numba
import numpy as np
import torch

from _common import add_common, finish_args, machine, write_json
from hlbl.data import contexts, default_cache_dir
from hlbl.output import TreeSoftmax
from hlbl.run import Run
from hlbl.search import layer_tree_arrays, topk_matches, tree_topk


# ---- the fastText-style baseline ----------------------------------------------------------


@numba.njit(cache=True)
def _log_sigmoid(x):
    if x >= 0.0:
        return -math.log1p(math.exp(-x))
    return x - math.log1p(math.exp(x))


@numba.njit(cache=True)
def _dfs_one(h, W, b, children, k, stack_node, stack_lp, heap_v, heap_w):
    """fastText's ``dfs``: left-first, prune when k leaves are held and the prefix is worse.

    Child values as in WordTree (>= 0 internal, < 0 leaf of word -1-c). The held leaves form a
    size-k min-heap on log-prob (heap_v[0] is the k-th best). Returns internal nodes scored.
    """
    count = 0
    held = 0
    sp = 1
    stack_node[0] = 0
    stack_lp[0] = 0.0
    while sp > 0:
        sp -= 1
        node = stack_node[sp]
        lp = stack_lp[sp]
        if held == k and lp < heap_v[0]:
            continue  # fastText: if (heap.size() == k && score < heap.front().first) return;
        if node < 0:
            w = -1 - node
            if held < k:  # sift up
                pos = held
                held += 1
                while pos > 0 and heap_v[(pos - 1) >> 1] > lp:
                    heap_v[pos] = heap_v[(pos - 1) >> 1]
                    heap_w[pos] = heap_w[(pos - 1) >> 1]
                    pos = (pos - 1) >> 1
                heap_v[pos] = lp
                heap_w[pos] = w
            else:  # replace the minimum, sift down
                pos = 0
                while True:
                    c = 2 * pos + 1
                    if c >= k:
                        break
                    if c + 1 < k and heap_v[c + 1] < heap_v[c]:
                        c += 1
                    if heap_v[c] < lp:
                        heap_v[pos] = heap_v[c]
                        heap_w[pos] = heap_w[c]
                        pos = c
                    else:
                        break
                heap_v[pos] = lp
                heap_w[pos] = w
            continue
        acc = 0.0
        for e in range(h.shape[0]):
            acc += h[e] * W[node, e]
        s = acc + b[node]
        count += 1
        # Push right first so that the left child is explored first.
        stack_node[sp] = children[node, 1]
        stack_lp[sp] = lp + _log_sigmoid(-s)
        stack_node[sp + 1] = children[node, 0]
        stack_lp[sp + 1] = lp + _log_sigmoid(s)
        sp += 2
    return count


@numba.njit(cache=True)
def dfs_topk(H, W, b, children, k, out_v, out_w):
    B, N = H.shape[0], W.shape[0]
    nodes = np.zeros(B, dtype=np.int64)
    stack_node = np.empty(N + 2, dtype=np.int64)
    stack_lp = np.empty(N + 2, dtype=np.float64)
    for i in range(B):
        nodes[i] = _dfs_one(H[i], W, b, children, k, stack_node, stack_lp, out_v[i], out_w[i])
    return nodes


# ---- models ---------------------------------------------------------------------------------


def ensure_run(out: Path, data: str, tree: str, epochs: int, seed: int) -> Path:
    """Train HLBL into ``out`` with the CLI unless a finished run is already there."""
    from hlbl.cli import main

    if (out / "best.safetensors").is_file() and (out / "state.json").is_file():
        return out
    if out.exists():
        shutil.rmtree(out)  # left by an interrupted run
    print(f"training {out.name} ({epochs} epochs)...", file=sys.stderr, flush=True)
    rc = main(
        [
            "train",
            "--data",
            data,
            "--tree",
            tree,
            "--out",
            str(out),
            "--epochs",
            str(epochs),
            "--threads",
            "1",
            "--quiet",
            "--device",
            "cpu",
            "--seed",
            str(seed),
        ]
    )
    if rc != 0:
        raise SystemExit(f"training {out} failed")
    return out


def learned_tree_file(cache: Path, feature_run: Path, policy: str) -> Path:
    """A learned tree (paper Section 5, ``policy`` e.g. adaptive or adaptive:0.4) from the word
    features of a trained model."""
    from hlbl.treebuild import build_tree_from_features, features_from_run

    path = cache / f"tree-{policy.replace(':', '')}-from-{feature_run.name}.json"
    if not path.is_file():
        print(f"building a learned {policy} tree...", file=sys.stderr, flush=True)
        X, _ = features_from_run(feature_run)
        build_tree_from_features(X, policy, seed=0).save(path)
    return path


def default_runs(trees: list[str], data: str, epochs: int, seed: int) -> list[tuple[str, Path]]:
    cache = Path(os.environ.get("HLBL_CACHE") or default_cache_dir()) / "bench-topk"
    cache.mkdir(parents=True, exist_ok=True)
    runs = []
    data_name = Path(data).name  # (a corpus directory, or a name)
    for t in trees:
        if t == "learned" or t.startswith("learned:"):
            base = ensure_run(cache / f"{data_name}-huffman-d100-e{epochs}", data, "huffman", epochs, seed)
            spec = str(learned_tree_file(cache, base, t.partition(":")[2] or "adaptive"))
            name = t.replace(":", "")
        else:
            spec = t
            name = t if t in ("random", "huffman") else Path(t).stem
        runs.append((t, ensure_run(cache / f"{data_name}-{name}-d100-e{epochs}", data, spec, epochs, seed)))
    return runs


# ---- measurement --------------------------------------------------------------------------


def measure(run: Path, n_contexts: int, rounds: int, threads: int) -> dict:
    source = Run.open(run)
    model, vocab = source.model(), source.vocab
    model.eval()
    layer = model.out
    if not isinstance(layer, TreeSoftmax):
        raise SystemExit(f"{run}: not a tree-output model")
    tree = layer.tree
    corpus = source.corpus()
    test = corpus["test"]
    pos = np.unique(np.linspace(0, len(test) - 1, min(n_contexts, len(test))).astype(np.int64))
    ctx = torch.from_numpy(contexts(test, pos, model.config.context, vocab.eos))
    with torch.no_grad():
        H = model.context_vector(ctx)  # (B, d) float32
    B, N = len(H), tree.num_nodes
    res = {k: tree_topk(tree, layer.weight, layer.bias, H, k) for k in (1, 10)}

    # Exactness on every context, against the float64 full distribution.
    exact = True
    ref_layer = copy.deepcopy(layer).double()
    with torch.no_grad():
        for s in range(0, B, 1000):
            ref = ref_layer.log_prob(H[s : s + 1000].double())
            for k, r in res.items():
                v64 = tree_topk(tree, layer.weight, layer.bias, H[s : s + 1000].double(), k)
                exact &= topk_matches(v64.values, v64.indices, ref, atol=1e-9)
                exact &= torch.equal(v64.indices, r.indices[s : s + 1000])

    out = {
        "tree": str(run),
        "contexts": B,
        "internal_nodes": N,
        "codes_per_word": float(tree.codes_per_word.mean()),
        "top1_node_fraction": float(res[1].nodes.double().mean() / N),
        "top10_node_fraction": float(res[10].nodes.double().mean() / N),
        "top1_nodes_median": float(res[1].nodes.double().median()),
        "top10_nodes_median": float(res[10].nodes.double().median()),
    }

    W = np.ascontiguousarray(layer.weight.detach().double().numpy())
    b = np.ascontiguousarray(layer.bias.detach().double().numpy())
    Hn = np.ascontiguousarray(H.double().numpy())
    if tree.codes_per_word.max() == 1:
        dv, dw = np.empty((B, 10)), np.empty((B, 10), dtype=np.int64)
        dn = dfs_topk(Hn, W, b, tree.children, 10, dv, dw)
        same = np.array_equal(np.sort(dw, 1), np.sort(res[10].indices.numpy(), 1))
        out["dfs_top10_node_fraction"] = float(dn.mean() / N)
        dn1 = dfs_topk(Hn, W, b, tree.children, 1, np.empty((B, 1)), np.empty((B, 1), dtype=np.int64))
        out["dfs_top1_node_fraction"] = float(dn1.mean() / N)
        out["dfs_same_words"] = bool(same)
    else:
        out["dfs_top10_node_fraction"] = None

    out.update(time_rounds(layer, tree, H, rounds, threads))
    out["exact"] = bool(exact)
    return out


def _cpu_seconds(fn, times: int) -> float:
    """CPU seconds of this process for ``times`` calls of ``fn`` (one thread does all the work, so
    CPU time is the work's own time; on a shared machine it is disturbed less than wall time)."""
    t0 = time.process_time()
    for _ in range(times):
        fn()
    return time.process_time() - t0


def time_rounds(layer, tree, H: torch.Tensor, rounds: int, threads: int) -> dict:
    """Time per context of the full distribution and of the exact top-1 and top-10 search.

    Held still: both sides run with ``threads`` threads (torch's, numba's, the search's), set here
    and reported; every way runs once outside the timing first (numba's cache load, first-touch
    of the weights and buffers); each round times the three ways one after another, in an order
    that rotates from round to round, and a search is repeated within its round until it has run
    about as long as the full distribution (a block of a few milliseconds would be mostly noise);
    the speed-up is the median over rounds of the ratio within a round, so a slow spell of the
    machine that hits a whole round cancels out."""
    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    B = len(H)
    arrays = layer_tree_arrays(layer)

    def full():
        for s in range(0, B, 1000):
            layer.log_prob(H[s : s + 1000])

    ways = {"full": full}
    for k in (1, 10):
        ways[f"top{k}"] = lambda k=k: tree_topk(tree, layer.weight, layer.bias, H, k, threads=threads, arrays=arrays)
    with torch.no_grad():
        for fn in ways.values():  # the warm-up
            fn()
        warm = {name: _cpu_seconds(fn, 1) for name, fn in ways.items()}
        times = {name: max(1, round(warm["full"] / max(warm[name], 1e-6))) for name in ways}
        per_context: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for r in range(rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                per_context[name].append(_cpu_seconds(ways[name], times[name]) / (times[name] * B))
    ratio10 = [f / t for f, t in zip(per_context["full"], per_context["top10"])]
    ratio1 = [f / t for f, t in zip(per_context["full"], per_context["top1"])]
    med = {name: float(np.median(v)) for name, v in per_context.items()}
    return {
        "full_us_per_context": 1e6 * med["full"],
        "top1_us_per_context": 1e6 * med["top1"],
        "top10_us_per_context": 1e6 * med["top10"],
        "speedup_vs_full": float(np.median(ratio10)),
        "speedup_vs_full_rounds": [round(x, 3) for x in ratio10],
        "speedup_top1_vs_full": float(np.median(ratio1)),
        "timing": {"rounds": rounds, "threads": threads, "clock": "process CPU time", "search_repeats": times},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", default=[], help="run directory of a tree-output model (repeatable)")
    p.add_argument(
        "--trees",
        default=None,
        help="models to train/reuse when no --run: comma list of huffman, random, learned or tree files "
        "(learned = ADAPTIVE tree from the Huffman model's features; learned:adaptive:0.4 etc. "
        "for other policies; default learned,huffman)",
    )
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--contexts", type=int, default=10000, help="PTB test contexts, spread evenly")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds; the speed-up is their median")
    add_common(p, threads=1, data="ptb", out="topk.json", optional_out=True)
    args = finish_args(p.parse_args(argv), epochs=1, contexts=200, rounds=2)
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    if args.run:
        runs = [(Path(r).name, Path(r)) for r in args.run]
    else:
        if args.trees is None:
            args.trees = "learned,huffman"
        runs = default_runs(args.trees.split(","), args.data, args.epochs, args.seed)
    per_tree = {}
    for name, run in runs:
        per_tree[name] = measure(run, args.contexts, args.rounds, args.threads)
        print(json.dumps({name: per_tree[name]}), file=sys.stderr, flush=True)
    first = per_tree[runs[0][0]]
    summary = {
        k: first[k] for k in ("top1_node_fraction", "top10_node_fraction", "speedup_vs_full", "dfs_top10_node_fraction")
    }
    summary["speedup_vs_full_rounds"] = first["speedup_vs_full_rounds"]
    summary["timing"] = first["timing"]
    summary["exact"] = all(r["exact"] for r in per_tree.values())
    summary["model"] = runs[0][0]
    summary["per_tree"] = per_tree
    if args.out:
        write_json(args.out, {**summary, "machine": machine()})
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

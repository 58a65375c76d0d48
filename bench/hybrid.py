"""The hybrid softmax's inference against PyTorch's adaptive softmax: ``log_prob`` (the full
distribution) and exact top-10, at V = 10,000 and 50,000.

    python bench/hybrid.py                 # writes results/hybrid/speed.json
    python bench/hybrid.py --rounds 15     # more rounds
    python bench/hybrid.py --quick         # seconds: small vocabularies, a temporary directory

Zipf counts (count of rank r = 1e7 / r + 1), (700, 200) float32 hidden vectors (N(0, 1)), one
thread, no autograd. ``hlbl.HybridSoftmax.from_counts(200, counts, head=2000)`` (a Huffman tail;
unigram biases, N(0, 0.1^2) weights, so the tail's mass is the tail's share of the counts, as in
a trained model) against ``nn.AdaptiveLogSoftmaxWithLoss(200, V, cutoffs, div_value=4)`` with
cutoffs (2000, 5000) at 10k and (2000, 10000) at 50k, and hlbl's TreeSoftmax on a Huffman tree.
The adaptive softmax's top-10 is ``torch.topk`` of its ``log_prob`` (it has no other exact way);
the hybrid's is its own (the head, then the tree's search under the tail's mass), the
tree's its tree search. The calls take turns for ``--rounds`` rounds after a warm-up; each
ratio is the median over rounds of adaptive time / other time (> 1: faster than the adaptive
softmax). On a shared machine the times move with the load: the ratios, measured in the same
rounds, move less.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from torch import nn

from _common import add_common, finish_args, machine, write_json

import hlbl
from hlbl.search import topk_matches


def zipf_counts(V: int) -> np.ndarray:
    return np.floor(1e7 / np.arange(1, V + 1)) + 1


def layers(V: int, d: int, head: int, cutoffs: list[int]) -> dict[str, nn.Module]:
    counts = zipf_counts(V)
    hybrid = hlbl.HybridSoftmax.from_counts(
        d, counts, head=head, init_std=0.1, generator=torch.Generator().manual_seed(0)
    )
    hybrid.init_unigram(counts)
    tree = hlbl.TreeSoftmax(d, hlbl.huffman_tree(counts), init_std=0.1, generator=torch.Generator().manual_seed(0))
    tree.init_unigram(counts)
    torch.manual_seed(0)
    adaptive = nn.AdaptiveLogSoftmaxWithLoss(d, V, cutoffs, div_value=4.0)
    return {"hybrid": hybrid, "tree": tree, "adaptive": adaptive}


def measure(V: int, d: int, batch: int, head: int, cutoffs: list[int], rounds: int, k: int) -> dict:
    """Median times (ms) of each call and the median ratios adaptive / other, over interleaved rounds."""
    L = layers(V, d, head, cutoffs)
    h = torch.randn(batch, d, generator=torch.Generator().manual_seed(1))
    calls = {
        "hybrid_log_prob": lambda: L["hybrid"].log_prob(h),
        "adaptive_log_prob": lambda: L["adaptive"].log_prob(h),
        "tree_log_prob": lambda: L["tree"].log_prob(h),
        "hybrid_topk": lambda: L["hybrid"].topk(h, k),
        "adaptive_topk": lambda: torch.topk(L["adaptive"].log_prob(h), k, dim=1),
        "tree_topk": lambda: L["tree"].topk(h, k),
    }
    times = {name: [] for name in calls}
    with torch.no_grad():
        # the hybrid's top-k is exact: the same words as sorting its own full distribution
        v, ids = L["hybrid"].topk(h, k)
        if not topk_matches(v, ids, L["hybrid"].log_prob(h), atol=1e-4):
            raise SystemExit("the hybrid's top-k disagrees with its full distribution")
        for call in calls.values():  # warm-up (numba's compilation)
            call()
        for _ in range(rounds):
            for name, call in calls.items():
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
        tail_mass = float(L["hybrid"]._head_log_probs(h)[:, head].exp().mean())
    t = {name: np.array(v) for name, v in times.items()}
    out = {
        "vocab": V,
        "head": head,
        "adaptive_cutoffs": cutoffs,
        "mean_tail_mass": tail_mass,
        "ms": {name: float(np.median(v) * 1e3) for name, v in t.items()},
    }
    for what in ("log_prob", "topk"):
        a = t[f"adaptive_{what}"]
        for name in ("hybrid", "tree"):
            out[f"{name}_{what}_speed_vs_adaptive"] = float(np.median(a / t[f"{name}_{what}"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--head", type=int, default=2000, help="the hybrid's head words (K)")
    ap.add_argument("--k", type=int, default=10, help="top-k")
    add_common(ap, out="results/hybrid/speed.json")
    args = finish_args(ap.parse_args(argv), rounds=2, head=100)
    torch.set_num_threads(1)
    sizes = (
        ((2000, [100, 500]), (5000, [100, 1000])) if args.quick else ((10_000, [2000, 5000]), (50_000, [2000, 10_000]))
    )
    d, batch = (32, 50) if args.quick else (200, 700)
    result = {"d": d, "batch": batch, "k": args.k, "rounds": args.rounds, "threads": 1, "machine": machine()}
    for V, cutoffs in sizes:
        r = measure(V, d, batch, args.head, cutoffs, args.rounds, args.k)
        result[f"V{V // 1000}k"] = r
        print(
            f"V={V}: log_prob hybrid {r['ms']['hybrid_log_prob']:.1f} ms, adaptive {r['ms']['adaptive_log_prob']:.1f} ms "
            f"({r['hybrid_log_prob_speed_vs_adaptive']:.2f}x); top-{args.k} hybrid {r['ms']['hybrid_topk']:.1f} ms, "
            f"adaptive {r['ms']['adaptive_topk']:.1f} ms ({r['hybrid_topk_speed_vs_adaptive']:.2f}x)",
            file=sys.stderr,
        )
    result["machine"] = machine()  # the load average at the end too
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

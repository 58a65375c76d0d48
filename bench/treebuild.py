"""Benchmark: learned-tree building, our level-batched EM against a per-node scikit-learn recursion.

    python bench/treebuild.py [--words 33000] [--dim 100] [--sklearn-words 4000] [--clusters 200]
    python bench/treebuild.py --quick     # a check of the script: 400 words, seconds

Synthetic clustered vectors (Gaussian clusters in d dimensions, like mean context vectors: a
few hundred loose groups). Both builders do the same thing: the ADAPTIVE rule, 10 EM iterations
per node from a random halving, spherical covariances, stopping at two words; sklearn runs one
``GaussianMixture(covariance_type="spherical")`` per node (the straightforward implementation).
They are timed side by side in one process on the same data (the machine is shared: compare the
ratio, not the absolute numbers). Then our builder alone on ``--words`` words for each policy,
the target being under 60 s for 33,000 words with 100-d vectors on 2 cores.
Prints one JSON line per measurement; ``--out`` also writes them to a file as one JSON list
(``--quick``: always, in a temporary directory). Without scikit-learn the comparison is skipped
with a message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

import numpy as np

from _common import add_common, finish_args, machine, write_json
from hlbl.tree import WordTree
from hlbl.treebuild import BuildReport, build_learned_tree, em_reg


def clustered(V: int, d: int, clusters: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, d)) * 2.0
    return centres[rng.integers(0, clusters, V)] + rng.normal(size=(V, d))


def sklearn_adaptive_tree(X: np.ndarray, seed: int, iters: int = 10) -> WordTree:
    """The per-node recursion with scikit-learn's GaussianMixture (ADAPTIVE, balanced fallback)."""
    from sklearn.mixture import GaussianMixture

    rng = np.random.default_rng(seed)
    reg = em_reg(X)
    children: list[list[int]] = []
    stack = [(np.arange(len(X)), -1, 0)]
    while stack:
        words, parent, slot = stack.pop()
        if len(words) == 1:
            children[parent][slot] = -1 - int(words[0])
            continue
        j = len(children)
        children.append([0, 0])
        if parent >= 0:
            children[parent][slot] = j
        if len(words) == 2:
            left = np.array([True, False])
        else:
            P = X[words]
            h = rng.permutation(len(words)) < (len(words) + 1) // 2
            mu = np.stack([P[h].mean(0), P[~h].mean(0)])
            var = np.array([((P[h] - mu[0]) ** 2).mean(), ((P[~h] - mu[1]) ** 2).mean()]) + reg
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gm = GaussianMixture(
                    2,
                    covariance_type="spherical",
                    max_iter=iters,
                    tol=0,
                    reg_covar=reg,
                    weights_init=[h.mean(), 1 - h.mean()],
                    means_init=mu,
                    precisions_init=1 / var,
                ).fit(P)
            r = gm.predict_proba(P)[:, 0]
            left = r > 0.5
            if left.all() or not left.any():
                left = np.zeros(len(words), bool)
                left[np.argsort(-r, kind="stable")[: (len(words) + 1) // 2]] = True
        stack.append((words[~left], j, 1))
        stack.append((words[left], j, 0))
    return WordTree(np.asarray(children, dtype=np.int64), len(X))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, default=33000)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--sklearn-words", type=int, default=4000, help="size for the side-by-side comparison")
    ap.add_argument("--clusters", type=int, default=200)
    ap.add_argument("--policies", default="balanced,adaptive,adaptive:0.4")
    add_common(ap, out="treebuild.json", optional_out=True)
    args = finish_args(ap.parse_args(), words=400, dim=16, sklearn_words=150, clusters=8)
    rows = []

    def show(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("scikit-learn is not installed: the side-by-side comparison is skipped", file=sys.stderr)
    else:
        X = clustered(args.sklearn_words, args.dim, args.clusters)
        t0 = time.perf_counter()
        ours = build_learned_tree(X, "adaptive", 0)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = sklearn_adaptive_tree(X, 0)
        t_sk = time.perf_counter() - t0
        show(
            {
                "compare": "adaptive",
                "words": len(X),
                "dim": args.dim,
                "ours_s": round(t_ours, 2),
                "sklearn_s": round(t_sk, 2),
                "speedup": round(t_sk / t_ours, 1),
                "ours_code_length": round(ours.stats()["mean_code_length"], 2),
                "sklearn_code_length": round(ref.stats()["mean_code_length"], 2),
            }
        )

    X = clustered(args.words, args.dim, args.clusters)
    for pol in args.policies.split(","):
        rep = BuildReport()
        t0 = time.perf_counter()
        tree = build_learned_tree(X, pol, 0, report=rep)
        dt = time.perf_counter() - t0
        st = tree.stats()
        show(
            {
                "policy": pol,
                "words": args.words,
                "dim": args.dim,
                "seconds": round(dt, 2),
                "levels": rep.levels,
                "em_nodes": rep.em_nodes,
                "fallback_nodes": rep.fallback_nodes,
                "codes_per_word": round(st["codes_per_word"], 3),
                "mean_code_length": round(st["mean_code_length"], 2),
                "denied_duplications": rep.denied_duplications,
            }
        )
    if args.out:
        write_json(args.out, {"rows": rows, "machine": machine()})


if __name__ == "__main__":
    main()

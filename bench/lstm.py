"""TreeSoftmax inside an LSTM language model: perplexity against the full and adaptive softmax,
training time, and the speed of the full distribution (``log_prob``).

    python bench/lstm.py                          # PTB, the word_language_model recipe, 1 epoch each
    python bench/lstm.py --nhid 100 --epochs 1    # a cheaper model
    python bench/lstm.py --speed-only             # only the log_prob measurement
    python bench/lstm.py --quick                  # seconds: a synthetic corpus, a tiny model
    python bench/lstm.py --epochs 4 --bootstrap-epochs 1 --no-speed --out results/lstm/epochs4
    python bench/lstm.py --optimizer adam --outputs adaptive,tree,learned-tree --no-speed --out results/lstm/adam
    python bench/lstm.py --epochs 40 --stop-lr 1 --bootstrap-epochs 1 --no-speed --checkpoint runs/lstm --out results/lstm/converged
    python bench/lstm.py --epochs 40 --stop-lr 1 --bootstrap-epochs 1 --no-speed --outputs hybrid --head 2000 \
        --checkpoint runs/lstm-converged --out results/lstm/converged
    python bench/lstm.py --epochs 40 --stop-lr 1 --bootstrap-epochs 1 --no-speed --outputs classes \
        --checkpoint runs/lstm-converged --out results/lstm/converged
    python bench/lstm.py --epochs 40 --stop-lr 1 --bootstrap-epochs 1 --no-speed --outputs learned-tree \
        --rebuild-at 4,8 --variant rebuild --checkpoint runs/lstm-rebuild --out results/lstm/converged
    python bench/lstm.py --data gutenberg --max-vocab 50000 --train-tokens 10000000 --epochs 1 --no-speed \
        --cutoffs 2000,10000 --outputs adaptive,tree --checkpoint runs/lstm-g50k --out results/lstm/gutenberg50k

Training (``examples/lstm_lm``): 2-layer LSTM, bptt 35, batch 20, SGD lr 20, clip 0.25, dropout
0.2, one thread, the same seed for every output layer: ``full`` (Linear + softmax), ``adaptive``
(``nn.AdaptiveLogSoftmaxWithLoss``, cutoffs 2000, 5000), ``huffman`` (TreeSoftmax on a Huffman
tree), ``learned_tree`` (the bootstrap: a Huffman model trained for as many epochs, the mean
hidden state before each word, an ADAPTIVE(0.25) tree learned from those, a fresh model on it)
``sampled`` (hlbl's sampled softmax: 100 noise words in training, exact in evaluation),
``hybrid`` (``HybridSoftmax``: an exact softmax over the ``--head`` most frequent words and one
tail entry, a tree over the other words learned by the same bootstrap from a hybrid model with a
Huffman tail), ``hybrid-huffman`` (its Huffman-tail model, no bootstrap) and ``classes``
(``ClassSoftmax``: two-level classes, k-means on the same bootstrap's hidden states into
``--classes`` classes, default round(sqrt(V)), with the ``--class-shortlist`` most frequent words
under the root). Test perplexity is exact for every layer. ``--quick`` runs every output layer.

Speed: ``log_prob`` of (700, 200) hidden vectors at V = 10,000 (PTB's counts) and V = 33,278
(WikiText-2's size, Zipf counts; adaptive cutoffs 2000, 10000), one thread, float32, no autograd:
TreeSoftmax on a Huffman tree and the adaptive softmax called alternately for ``--rounds``
rounds; the ratio is the median over rounds of adaptive time / tree time (> 1: the tree is faster).
The same rounds time the tree's node scores alone (one (B, d) x (d, N) product): no exact tree
with full-rank node vectors can be faster than that.

``--max-vocab V --train-tokens N`` train on a cut of ``--data``: its first training lines up to N
tokens, every split's words outside the V - 1 most frequent of those lines (the vocabulary
``hlbl train --max-vocab V`` would keep) written as ``<unk>``; made once into the cache as the
corpus ``NAME-Vw-Nt`` (see :func:`cut_corpus`).

Writes ``results/lstm/summary.json`` (and ``runs.json``, every run's epochs); ``--quick`` writes
under a temporary directory instead and checks the pipeline only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch
from torch import nn

from _common import add_common, quick_dir

import hlbl
from hlbl.atomic import write_text

ROOT = Path(__file__).resolve().parents[1]


def example_module():
    """examples/lstm_lm/lstm_lm.py, imported by path (examples are not a package)."""
    path = ROOT / "examples" / "lstm_lm" / "lstm_lm.py"
    spec = importlib.util.spec_from_file_location("lstm_lm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def log_prob_speed(
    counts: np.ndarray, cutoffs: list[int], d: int, batch: int, rounds: int, device: str | torch.device = "cpu"
) -> dict:
    """Median over interleaved rounds of adaptive time / tree time for ``log_prob`` (and each
    median time), float32, without autograd, on ``device`` (synchronised around each call)."""
    V = len(counts)
    tree_layer = hlbl.TreeSoftmax(
        d, hlbl.huffman_tree(counts), init_std=0.1, generator=torch.Generator().manual_seed(0)
    ).to(device)
    torch.manual_seed(0)
    adaptive = nn.AdaptiveLogSoftmaxWithLoss(d, V, cutoffs, div_value=4.0).to(device)
    h = torch.randn(batch, d, generator=torch.Generator().manual_seed(1)).to(device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    W, b = tree_layer.weight.detach(), tree_layer.bias.detach()
    calls = {
        "tree": lambda: tree_layer.log_prob(h),
        "adaptive": lambda: adaptive.log_prob(h),
        # the floor of any exact full-rank tree: the (B, N) node scores alone, one matrix product
        "tree_scores_only": lambda: torch.addmm(b, h, W.t()),
    }
    times = {name: [] for name in calls}
    with torch.no_grad():
        for call in calls.values():  # warm-up (and numba's compilation)
            call()
        for _ in range(rounds):
            for name, call in calls.items():
                sync()
                t0 = time.perf_counter()
                call()
                sync()
                times[name].append(time.perf_counter() - t0)
    t, a, m = (np.array(times[k]) for k in ("tree", "adaptive", "tree_scores_only"))
    return {
        "vocab": V,
        "tree_ms": float(np.median(t) * 1e3),
        "adaptive_ms": float(np.median(a) * 1e3),
        "tree_scores_only_ms": float(np.median(m) * 1e3),
        "speed_vs_adaptive": float(np.median(a / t)),
        "scores_only_speed_vs_adaptive": float(np.median(a / m)),
    }


def zipf_counts(V: int) -> np.ndarray:
    return np.floor(1e7 / np.arange(1, V + 1)) + 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="ptb")
    p.add_argument("--epochs", type=int, default=1, help="epochs of each output layer (a cap with --stop-lr)")
    p.add_argument("--stop-lr", type=float, default=0.0, help="stop a run once its annealed lr falls below this")
    p.add_argument("--bootstrap-epochs", type=int, help="epochs of the learned tree's Huffman model (default --epochs)")
    p.add_argument("--emsize", type=int, default=200)
    p.add_argument("--nhid", type=int, default=200)
    p.add_argument("--max-steps", type=int, default=0, help="steps per epoch (0: the whole epoch)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="as the example's --optimizer")
    p.add_argument("--lr", type=float, help="as the example's --lr (default: the optimiser's)")
    p.add_argument("--device", default="cpu", help="as the example's --device (the speed stage stays on the CPU)")
    p.add_argument(
        "--outputs", help="comma-separated (default full,adaptive,tree,learned-tree,sampled; --quick: every one)"
    )
    p.add_argument("--max-vocab", type=int, help="train on a cut of --data: this vocabulary (with <eos>, <unk>)")
    p.add_argument("--train-tokens", type=int, help="train on a cut of --data: its first lines up to these tokens")
    p.add_argument(
        "--rounds", type=int, default=9, help="timed rounds of the speed measurements (log_prob, --step-speed)"
    )
    p.add_argument("--speed-only", action="store_true")
    p.add_argument("--no-speed", action="store_true", help="train and test only (the log_prob speed on its own)")
    p.add_argument("--step-speed", action="store_true", help="only the training-step speed, side by side")
    p.add_argument("--grad-study", type=int, metavar="STEPS", default=0, help="only the gradient-norm study")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "lstm")
    p.add_argument("--checkpoint", type=Path, help="as the example's --checkpoint: a stopped call goes on from there")
    p.add_argument("--tree-policy", default="adaptive:0.25", help="as the example's: the learned tree's policy")
    p.add_argument("--head", type=int, default=2000, help="as the example's: the hybrid's flat head (K words)")
    p.add_argument("--cutoffs", default="2000,5000", help="as the example's: the adaptive softmax's cutoffs")
    p.add_argument("--tree-copies", type=int, default=1, help="as the example's: the learned tree's K of xK")
    p.add_argument("--classes", type=int, help="as the example's: the classes' number (default round(sqrt(V)))")
    p.add_argument(
        "--class-shortlist", type=int, default=0, help="as the example's: the classes' shortlist (most frequent words)"
    )
    p.add_argument("--class-dim", type=int, help="as the example's: the class members' vector size")
    p.add_argument("--bootstrap-from", help="as the example's: the learned tree from this trained run's model")
    p.add_argument(
        "--rebuild-at", default="", help="as the example's: relearn the learned structure after these epochs (2,4)"
    )
    p.add_argument(
        "--variant",
        default="",
        help="a name for runs of other settings: their keys become e.g. learned_tree_NAME_test_ppl, beside the "
        "default runs' in the same summary",
    )
    add_common(p)  # --quick: a synthetic corpus and a tiny model, outputs under quick_dir()
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    ex = example_module()
    if args.grad_study:
        return grad_study(ex, args)
    if args.quick:
        args.out, args.data, args.rounds = quick_dir() / "lstm", ex.synthetic_corpus(quick_dir() / "toy"), 2
    if args.max_vocab or args.train_tokens:
        args.data = cut_corpus(args.data, args.max_vocab, args.train_tokens)
    if args.step_speed:
        return step_speed(ex, args, *((2, 2) if args.quick else (10, args.rounds)))
    if args.outputs is None:
        args.outputs = ",".join(ex.OUTPUTS) if args.quick else "full,adaptive,tree,learned-tree,sampled"
    args.out.mkdir(parents=True, exist_ok=True)
    summary, runs = train_all(ex, args) if not args.speed_only else ({}, [])
    speed_vocab = () if args.no_speed else (2000, 5000) if args.quick else (10_000, 33_278)
    batch, d = (50, 32) if args.quick else (700, 200)
    for V, key in zip(speed_vocab, ("10k", "33k")):
        counts = ex.Corpus(args.data).counts if (V == 10_000 and not args.quick) else zipf_counts(V)
        cut = [2000, 5000] if V == 10_000 else [2000, 10_000]
        cut = [c for c in cut if c < V - 1] if not args.quick else [200, 1000]
        res = log_prob_speed(counts, cut, d, batch, args.rounds)
        summary[f"logprob_speed_vs_adaptive_{key}"] = res["speed_vs_adaptive"]
        summary[f"logprob_ms_{key}"] = {
            "tree": res["tree_ms"],
            "adaptive": res["adaptive_ms"],
            "tree_scores_only": res["tree_scores_only_ms"],
        }
        summary[f"logprob_scores_only_speed_vs_adaptive_{key}"] = res["scores_only_speed_vs_adaptive"]
        print(
            f"log_prob at V={V}: tree {res['tree_ms']:.0f} ms (its node scores alone "
            f"{res['tree_scores_only_ms']:.0f} ms), adaptive {res['adaptive_ms']:.0f} ms",
            file=sys.stderr,
        )
    # A rerun of some outputs (--outputs) or of the speeds alone replaces their keys and runs only.
    if (args.out / "summary.json").is_file():
        summary = {**json.loads((args.out / "summary.json").read_text()), **summary}
    if (args.out / "runs.json").is_file() and runs:
        redone = {(kind, args.variant) for kind in args.outputs.split(",")}
        kept = [
            r
            for r in json.loads((args.out / "runs.json").read_text())
            if (r["output"], r.get("variant", "")) not in redone
        ]
        runs = kept + runs
    if runs:
        write_text(args.out / "runs.json", json.dumps(runs, indent=1) + "\n")
    summary = family_keys(summary)
    if not args.speed_only:  # the best hierarchy over every run the summary holds, this call's included
        trained = {run_name(kind, args.variant) for kind in args.outputs.split(",")}
        command = "python bench/lstm.py " + " ".join(sys.argv[1:] if argv is None else argv)
        summary = with_best_hierarchy(summary, trained, command)
    write_text(args.out / "summary.json", json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


# the summary's name of each output layer's runs (a variant's: NAME_VARIANT)
RUN_NAMES = {
    "full": "full",
    "adaptive": "adaptive",
    "tree": "huffman",
    "learned-tree": "learned_tree",
    "sampled": "sampled",
    "hybrid": "hybrid",
    "hybrid-huffman": "hybrid_huffman",
    "classes": "classes",
}
HIERARCHIES = ("huffman", "learned_tree", "hybrid", "classes")  # the runs best_hierarchy chooses from


def run_name(kind: str, variant: str = "") -> str:
    return f"{RUN_NAMES[kind]}_{variant}" if variant else RUN_NAMES[kind]


def with_best_hierarchy(summary: dict, trained: set[str], command: str) -> dict:
    """``summary`` with ``best_hierarchy``: the tree, hybrid or classes run of the lowest test
    perplexity (name, test ppl, settings, command) and, for it, ``NAME_test_ppl_vs_adaptive``.
    The command is this call's when it trained that run, else the one the summary recorded."""
    names = [
        k[: -len("_test_ppl")]
        for k in summary
        if k.endswith("_test_ppl") and k.startswith(HIERARCHIES) and f"{k[: -len('_test_ppl')]}_s_per_epoch" in summary
    ]
    names = [n for n in names if summary.get(f"{n}_name", n) == n]  # not a family's copy of another run's keys
    if not names:
        return summary
    best = min(names, key=lambda n: summary[f"{n}_test_ppl"])
    before = summary.get("best_hierarchy") or {}
    out = dict(summary)
    out["best_hierarchy"] = {
        "name": best,
        "test_ppl": summary[f"{best}_test_ppl"],
        "settings": summary.get(f"{best}_settings", {}),
        "command": command if best in trained else before.get("command") if before.get("name") == best else None,
    }
    if "adaptive_test_ppl" in summary:
        out[f"{best}_test_ppl_vs_adaptive"] = summary[f"{best}_test_ppl"] / summary["adaptive_test_ppl"] - 1.0
    return out


def family_keys(summary: dict) -> dict:
    """``summary`` with ``tree_*`` keys (test_ppl, tokens_per_s, s_per_epoch, valid_ppl, and
    ``tree_name``): those of the tree run of lowest test perplexity (Huffman or learned, any
    variant); ``hybrid_*`` from the Huffman-tail hybrid where no learned-tail hybrid ran; and
    ``classes_*`` from the best classes variant where no default classes run did: the tables'
    columns, whichever runs a summary has."""
    figures = ("test_ppl", "tokens_per_s", "s_per_epoch", "valid_ppl")
    out = dict(summary)
    families = (("tree", ("huffman", "learned_tree")), ("hybrid", ("hybrid_huffman",)), ("classes", ("classes_",)))
    for family, prefixes in families:
        if family in ("hybrid", "classes") and f"{family}_test_ppl" in summary and f"{family}_name" not in summary:
            continue  # a run of that name: its own keys (a family's copy names its run in FAMILY_name)
        names = [
            k[: -len("_test_ppl")]
            for k in summary
            if k.endswith("_test_ppl") and k.startswith(prefixes) and "_vs_" not in k
        ]
        if names:
            best = min(names, key=lambda n: summary[f"{n}_test_ppl"])
            out |= {f"{family}_{f}": summary[f"{best}_{f}"] for f in figures if f"{best}_{f}" in summary}
            out[f"{family}_name"] = best
    return out


def cut_corpus(data: str, max_vocab: int | None, train_tokens: int | None) -> str:
    """The name of ``data`` cut to its first ``train_tokens`` training tokens (whole lines; the
    last line may cross the limit) and the ``max_vocab`` words of that cut's vocabulary (``hlbl
    train --max-vocab``'s rule over the cut, so every word kept occurs in training), made once
    under the cache's ``data/`` (where a corpus name is looked up) and written atomically: the
    directory appears complete or not at all. Other words are ``<unk>`` in every split; valid and
    test are whole."""
    from collections import Counter

    from hlbl.data.corpus import default_cache_dir
    from hlbl.data.vocab import EOS, UNK, Vocab

    src = hlbl.resolve_corpus(data)
    name = f"{src.name}-{max_vocab or 'all'}w-{train_tokens or 'all'}t"
    dst = default_cache_dir() / "data" / name
    if dst.is_dir():
        return name
    print(f"cutting {src} into the corpus {name} (once)", file=sys.stderr)
    train, left = [], train_tokens or float("inf")
    with open(src / "train.txt", encoding="utf-8") as f:
        for line in f:
            if left <= 0:
                break
            train.append(line.split())
            left -= len(train[-1]) + 1  # and its <eos>
    counts = Counter(w for words in train for w in words)
    counts[EOS] = len(train)
    keep = set(Vocab.from_counts(counts, max_vocab=max_vocab).words) - {EOS}
    tmp = dst.with_name(f".{name}.{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        with ExitStack() as files:
            lines = train if split == "train" else files.enter_context(open(src / f"{split}.txt", encoding="utf-8"))
            g = files.enter_context(open(tmp / f"{split}.txt", "w", encoding="utf-8"))
            for line in lines:
                words = line if split == "train" else line.split()
                g.write(" ".join(w if w in keep else UNK for w in words) + "\n")
    os.replace(tmp, dst)
    return name


def train_all(ex, args) -> tuple[dict, list]:
    """Every output layer of ``--outputs`` trained and tested with the example's recipe."""
    argv = ["--epochs", str(args.epochs), "--emsize", str(args.emsize), "--nhid", str(args.nhid)]
    argv += ["--optimizer", args.optimizer, "--device", args.device] + (
        [] if args.lr is None else ["--lr", str(args.lr)]
    )
    boot = args.epochs if args.bootstrap_epochs is None else args.bootstrap_epochs
    argv += ["--max-steps", str(args.max_steps), "--bootstrap-epochs", str(boot), "--stop-lr", str(args.stop_lr)]
    tree_file = f"learned_tree_{args.variant}.npz" if args.variant else "learned_tree.npz"
    argv += ["--quick"] if args.quick else ["--save-tree", str(args.out / tree_file)]
    argv += ["--checkpoint", str(args.checkpoint)] if args.checkpoint else []
    argv += ["--tree-policy", args.tree_policy, "--tree-copies", str(args.tree_copies)]
    argv += ["--bootstrap-from", args.bootstrap_from] if args.bootstrap_from else []
    argv += ["--rebuild-at", args.rebuild_at] if args.rebuild_at else []
    argv += ["--head", str(args.head), "--class-shortlist", str(args.class_shortlist), "--cutoffs", args.cutoffs]
    argv += ["--classes", str(args.classes)] if args.classes is not None else []
    argv += ["--class-dim", str(args.class_dim)] if args.class_dim is not None else []
    ex_args = ex.parse_args(argv)
    corpus = ex.Corpus(args.data)
    # a variant's summary holds its own keys only: the shared ones stay those of the default runs
    summary = (
        {}
        if args.variant
        else {
            "recipe": {
                k: getattr(ex_args, k)
                for k in (
                    "emsize",
                    "nhid",
                    "nlayers",
                    "dropout",
                    "bptt",
                    "batch_size",
                    "optimizer",
                    "lr",
                    "clip",
                    "cutoffs",
                )
            },
            "epochs": args.epochs,
            "stop_lr": args.stop_lr,
            "bootstrap_epochs": boot,
            "max_steps": args.max_steps,
            "threads": 1,
            "device": str(ex_args.device),
            "data": str(args.data) if not args.quick else "synthetic",
        }
    )
    runs = []
    for kind in args.outputs.split(","):
        name = run_name(kind, args.variant)
        if kind == "hybrid" and not args.quick:  # its tail tree beside, not over, the learned tree's
            ex_args.save_tree = args.out / f"{name}_tail_tree.npz"
        elif not args.quick:
            ex_args.save_tree = args.out / tree_file
        ex_args.save_classes = None if args.quick else args.out / f"{name}.json"
        r = ex.run(corpus, kind, ex_args, log=lambda m: print(m, file=sys.stderr))
        if args.variant:
            r["variant"] = args.variant
        settings = settings_of(ex, kind, args, ex_args, len(corpus))
        if settings:
            summary[f"{name}_settings"] = r["settings"] = settings
        runs.append(r)
        summary[f"{name}_test_ppl"] = r["test_ppl"]
        summary[f"{name}_s_per_epoch"] = r["s_per_epoch"]
        summary[f"{name}_tokens_per_s"] = r["tokens_per_s"]
        summary[f"{name}_valid_ppl"] = r["valid_ppl"]  # of the best validation epoch, the one tested
        summary[f"{name}_best_epoch"] = r["best_epoch"]
        summary[f"{name}_epochs_run"] = len(r["epochs"])
        summary[f"{name}_head_over_encoder_grad"] = float(np.median([e["head_over_encoder"] for e in r["epochs"]]))
        if "bootstrap_s" in r:  # the Huffman model, its features and the tree, before the timed epochs
            summary[f"{name}_bootstrap_s"] = r["bootstrap_s"]
        if "rebuilds" in r:  # the structure learned again within the run: its features and tree, not timed
            summary[f"{name}_rebuild_s"] = sum(b["seconds"] for b in r["rebuilds"])
    return summary, runs


def settings_of(ex, kind: str, args, ex_args, vocab_size: int) -> dict:
    """The settings a run of ``kind`` was made with, kept beside its figures (``NAME_settings``):
    a variant's learned-tree settings; the hybrid's head (and its tree's); the classes' number,
    shortlist and bootstrap."""
    boot = ex_args.bootstrap_epochs
    out = {}
    if args.variant and kind != "classes":
        out |= {"tree_policy": args.tree_policy, "tree_copies": args.tree_copies, "bootstrap_epochs": boot}
    if kind.startswith("hybrid"):
        out["head"] = ex_args.head
        if kind == "hybrid":
            out |= {"tree_policy": args.tree_policy, "bootstrap_epochs": boot}
    if kind == "classes":
        out |= {"classes": ex.num_classes(ex_args, vocab_size), "class_shortlist": ex_args.class_shortlist}
        out |= {"class_dim": ex_args.class_dim} if ex_args.class_dim is not None else {}
        out["bootstrap_epochs"] = boot
    if args.bootstrap_from and (args.variant or kind == "classes"):
        out["bootstrap_from"] = args.bootstrap_from
    if args.rebuild_at and kind in ex.LEARNED:
        out["rebuild_at"] = ex_args.rebuild_at
    return out


def step_speed(ex, args, steps: int = 10, rounds: int = 5) -> int:
    """``--step-speed``: training steps (forward, backward, clipping, SGD) of the whole model with
    each output layer, ``steps`` at a time in turn for ``rounds`` rounds, on the same batches, one
    thread: the medians over rounds of each layer's seconds per step and of adaptive / each (the
    hybrid with K = 2000 and 5000 head words where the vocabulary has them). The
    learned tree is the one the full benchmark saved (learned_tree.npz), rebuilt by the bootstrap
    (of ``--bootstrap-from``'s model, if given) when missing; the classes those of
    :func:`step_speed_classes`, with the members' vectors of
    size nhid and nhid / 4 (``classes_s2000_d4``, ``--class-dim``). Writes step_speed.json and adds
    its ratios to summary.json."""
    corpus = ex.Corpus(args.data)
    argv = ["--emsize", str(args.emsize), "--nhid", str(args.nhid), "--log-every", "1000000", "--cutoffs", args.cutoffs]
    argv += ["--bootstrap-from", args.bootstrap_from] if args.bootstrap_from else []
    ex_args = ex.parse_args(argv)
    train = ex.batchify(corpus.splits["train"], ex_args.batch_size)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "learned_tree.npz"
    if path.is_file():
        learned = hlbl.WordTree.load(path)
    else:
        learned, _ = ex.learn_tree(corpus, train, ex_args, log=lambda m: print(m, file=sys.stderr))
        learned.save(path)
    classes = step_speed_classes(ex, args, corpus, train, ex_args)
    models = {}
    layers = [("full", "full", None), ("adaptive", "adaptive", None), ("huffman", "tree", None)]
    layers += [("learned_tree", "tree", learned), ("classes_s2000", "classes", classes)]
    layers += [("classes_s2000_d4", ("classes", ex_args.nhid // 4), classes)]
    # the hybrid at both head sizes, each with a Huffman tail (a learned tail trains at the same cost)
    heads = (len(corpus) // 4, len(corpus) // 2) if args.quick else (2000, 5000)
    layers += [(f"hybrid_k{k}", ("hybrid-huffman", k), None) for k in heads if 0 < k < len(corpus) - 1]
    for name, kind, tree in layers:
        ex_args.class_dim = None
        if isinstance(kind, tuple) and kind[0] == "classes":
            kind, ex_args.class_dim = kind
        elif isinstance(kind, tuple):
            kind, ex_args.head = kind
        torch.manual_seed(ex_args.seed)
        models[name] = ex.build_model(corpus, kind, ex_args, tree)
    ex_args.max_steps = steps
    times = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            times[name].append(ex.train_epoch(model, train, ex_args, ex_args.lr)["seconds"] / steps)
    a = np.array(times["adaptive"])
    out = {
        "steps_per_round": steps,
        "rounds": rounds,
        "s_per_step": {n: float(np.median(t)) for n, t in times.items()},
        **{
            f"{n}_step_speed_vs_adaptive": float(np.median(a / np.array(t)))
            for n, t in times.items()
            if n != "adaptive"
        },
        "learned_tree": learned.stats(corpus.counts),
        "classes_s2000": classes.stats(corpus.counts),
    }
    write_text(args.out / "step_speed.json", json.dumps(out, indent=1) + "\n")
    if (args.out / "summary.json").is_file():
        old = json.loads((args.out / "summary.json").read_text())
        ratios = {k: v for k, v in out.items() if k.endswith("_vs_adaptive")}
        write_text(args.out / "summary.json", json.dumps({**old, **ratios}, indent=1) + "\n")
    print(json.dumps(out))
    return 0


def step_speed_classes(ex, args, corpus, train, ex_args):
    """The word classes of the step-speed stage: ``classes_s2000.json`` under ``--out`` (on PTB the
    converged run's, 100 classes under a 2,000-word shortlist), learned by the example's bootstrap
    and saved there when missing (--quick: sqrt(V) classes under a V/4 shortlist). The step's cost
    depends on the class sizes, so the structure timed is the one trained."""
    path = args.out / "classes_s2000.json"
    if path.is_file():
        return hlbl.WordClasses.load(path)
    ex_args.classes, ex_args.class_shortlist = None, len(corpus) // 4 if args.quick else 2000
    classes, _ = ex.learn_classes(corpus, train, ex_args, log=lambda m: print(m, file=sys.stderr))
    classes.save(path)
    return classes


GRAD_STUDY = [("full", "scaled"), ("adaptive", "scaled")] + [
    ("tree", init) for init in ("zero", "uniform", "unigram", "frozen", "scaled")
]


def grad_study(ex, args) -> int:
    """``--grad-study STEPS``: the first STEPS steps of the recipe for each output layer and each
    tree initialisation; the median ratio of the output layer's gradient norm to the encoder's
    (before clipping) and the validation perplexity after them. Writes grad_study.json."""
    corpus = ex.Corpus(args.data)
    rows = []
    for kind, init in GRAD_STUDY:
        argv = ["--emsize", str(args.emsize), "--nhid", str(args.nhid), "--max-steps", str(args.grad_study)]
        r = ex.run(corpus, kind, ex.parse_args(argv + ["--tree-init", init, "--log-every", "10"]), log=lambda m: None)
        e = r["epochs"][0]
        rows.append({"output": kind, "tree_init": init if kind == "tree" else None, "valid_ppl": r["valid_ppl"], **e})
        print(json.dumps(rows[-1]), file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "grad_study.json", json.dumps({"steps": args.grad_study, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

"""Training and scoring words/s of the PyTorch path on a GPU: the run prepared for a lent device.

    python bench/gpu.py                      # on a CUDA machine: about 3 minutes
    python bench/gpu.py --quick              # a check of the script: seconds, on the CPU when there is no GPU

First it checks that the device computes what the CPU does on a small multi-code model (full
distribution, one autograd training step, top-k, scoring: ``agreement_with_cpu`` in the JSON,
``ok`` false if any differs beyond float32 tolerance). Then what it measures, each after a
warm-up of 2 batches, with ``torch.cuda.synchronize`` around the
clock (``hlbl.train.train_epoch``, the autograd path, on a prefix of the stream):

- PTB (from $HLBL_DATA or the cache; a synthetic Zipf corpus with V = 10k if PTB is not there):
  HLBL on a RANDOM tree at batch 1000 and ``--batch`` (default 4096), the flat-softmax LBL and
  LBL + ``nn.AdaptiveLogSoftmaxWithLoss`` at ``--batch``;
- synthetic Zipf corpora: V = 33,278 (HLBL, flat, adaptive) and V = 1M (HLBL, BALANCED tree);
- scoring (``hlbl.evaluate.token_log_probs``, batch 4096) of the PTB HLBL;
- the LSTM example (``examples/lstm_lm``, its recipe unchanged, on the PTB stream written out as
  text): training tokens/s with the full softmax, the adaptive softmax and the tree layer, and
  ``log_prob`` of 700 hidden vectors, tree against adaptive (``lstm`` in the JSON).

The learning rate stays the recipe's per-example rate whatever the batch: these are speed
measurements, not training runs. The last line is one JSON object; ``--out`` (default
results/gpu.json, or $OUT/gpu.json when $OUT is set, as on the device machine) gets it too.
``--quick`` is a dry run of the script itself: a few batches of 256 of each on the synthetic corpus
of ``bench/_common.py``, V = 2,000 and 20,000 for the Zipf corpora (``v_mid`` and ``v_large`` in
the JSON say which), on the CPU (with a message) when there is no CUDA device, the JSON in a
temporary directory, never over results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import add_common, corpus_spec, finish_args, machine, write_json, zipf_stream
from hlbl.config import TrainConfig
from hlbl.data import load_corpus
from hlbl.engine import train_epoch
from hlbl.evaluate import token_log_probs
from hlbl.model import LBL, LBLConfig
from hlbl.optim import make_optimizer
from hlbl.tree import balanced_tree, random_tree


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_for(V: int, output: str, tree, counts: np.ndarray, device: torch.device) -> LBL:
    m = LBL(LBLConfig(V, dim=100, context=5, output=output), tree, torch.Generator().manual_seed(0))
    m.init_unigram(counts)
    return m.to(device)


def time_train(model: LBL, stream: np.ndarray, pad: int, batch: int, batches: int, device: torch.device) -> dict:
    """words/s of the autograd path over ``batches`` batches (after 2 warm-up batches)."""
    cfg = TrainConfig(progress=False, batch_size=batch, device=str(device), engine="torch")
    opt = make_optimizer(model, cfg, cfg.lr)
    train_epoch(model, opt, stream[: 2 * batch], pad, cfg, 1, False)  # allocator, kernels, cuBLAS handles
    part = stream[: batch * batches]
    sync(device)
    t = time.perf_counter()
    loss, _ = train_epoch(model, opt, part, pad, cfg, 1, False)
    sync(device)
    wall = time.perf_counter() - t
    out = {"wps": len(part) / wall, "tokens": len(part), "batch": batch, "loss": loss}
    if device.type == "cuda":
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        torch.cuda.reset_peak_memory_stats(device)
    return out


def time_score(model: LBL, stream: np.ndarray, pad: int, device: torch.device) -> dict:
    token_log_probs(model, stream[:8192], pad, device=device, engine="torch")  # warm-up
    sync(device)
    t = time.perf_counter()
    lp = token_log_probs(model, stream, pad, device=device, engine="torch")
    sync(device)
    wall = time.perf_counter() - t
    return {"wps": len(stream) / wall, "tokens": len(stream), "ppl": float(np.exp(-lp.mean()))}


def lstm_stage(device: torch.device, stream: np.ndarray, steps: int, quick: bool) -> dict:
    """The LSTM example on ``device``: training tokens/s of its recipe with each output layer over
    ``steps`` steps (after 2 warm-up steps; every step reads its loss, so the clock needs no other
    synchronisation), and ``log_prob`` of 700 hidden vectors, tree against adaptive, as
    ``bench/lstm.py`` measures it on the CPU (its :func:`log_prob_speed`, here on the device)."""
    from lstm import example_module, log_prob_speed

    ex = example_module()
    held_out = stream[:4_000]  # valid and test: words the training text has, whole
    with tempfile.TemporaryDirectory() as tmp:
        for split, part in (("train", stream), ("valid", held_out), ("test", held_out)):
            Path(tmp, f"{split}.txt").write_text(" ".join(f"w{i}" for i in part) + "\n")
        corpus = ex.Corpus(tmp)
    dims = ["--emsize", "32", "--nhid", "32"] if quick else []
    args = ex.parse_args(["--device", str(device), "--log-every", "1000000", *dims])
    train = ex.batchify(corpus.splits["train"], args.batch_size).to(device)
    out: dict = {"vocab": len(corpus), "steps": steps}
    for kind in ("full", "adaptive", "tree"):
        torch.manual_seed(args.seed)
        model = ex.build_model(corpus, kind, args)
        args.max_steps = 2
        ex.train_epoch(model, train, args, args.lr)  # warm-up: allocator, kernels
        args.max_steps = steps
        out[f"{kind}_tokens_per_s"] = ex.train_epoch(model, train, args, args.lr)["tokens_per_s"]
    out["tree_step_speed_vs_adaptive"] = out["tree_tokens_per_s"] / out["adaptive_tokens_per_s"]
    cutoffs = [c for c in args.cutoffs if c < len(corpus) - 1] or [len(corpus) // 2]
    out["log_prob"] = log_prob_speed(corpus.counts, cutoffs, args.nhid, 700, 9, device)
    return out


def agreement(device: torch.device) -> dict:
    """Before any timing: the device gives the CPU's numbers (float32 tolerance) on a small
    multi-code model: the full distribution, one training step of the autograd path (momentum
    and L2), exact top-k, and scoring. The CUDA path has no other test (CI has no GPU)."""
    import copy

    from hlbl.tree import WordTree

    V = 300
    base = random_tree(V, 0)
    off = base.num_nodes  # a second copy of the tree under a new root: every word has two codes
    children = (
        [[1, 1 + off]]
        + [[c + 1 if c >= 0 else c for c in row] for row in base.children]
        + [[c + 1 + off if c >= 0 else c for c in row] for row in base.children]
    )
    tree = WordTree(np.asarray(children, dtype=np.int64), V)
    stream = zipf_stream(V, 4000, seed=5)
    cpu = LBL(LBLConfig(V, dim=32, context=4), tree, torch.Generator().manual_seed(1))
    cpu.init_unigram(np.bincount(stream, minlength=V) + 1.0)
    dev = copy.deepcopy(cpu).to(device)
    ctx = torch.randint(0, V, (64, 4), generator=torch.Generator().manual_seed(2))
    out = {"log_prob_max_abs_diff": (cpu.log_prob(ctx) - dev.log_prob(ctx.to(device)).cpu()).abs().max().item()}
    topk_cpu, topk_dev = cpu.topk(ctx, 5), dev.topk(ctx.to(device), 5)
    out["topk_same_words"] = bool(torch.equal(topk_cpu[1], topk_dev[1].cpu()))
    for m, d in ((cpu, "cpu"), (dev, str(device))):
        cfg = TrainConfig(progress=False, batch_size=4000, device=d, engine="torch", lr=0.01)
        train_epoch(m, make_optimizer(m, cfg, cfg.lr), stream, 0, cfg, 1, False)
    out["step_param_max_abs_diff"] = max(
        (a - b.cpu()).abs().max().item() for a, b in zip(cpu.parameters(), dev.parameters())
    )
    a = token_log_probs(cpu, stream, 0, device="cpu", engine="torch")
    b = token_log_probs(dev, stream, 0, device=device, engine="torch")
    out["score_max_abs_diff"] = float(np.abs(a - b).max())
    out["ok"] = (
        out["log_prob_max_abs_diff"] < 1e-4
        and out["topk_same_words"]
        and out["step_param_max_abs_diff"] < 1e-4
        and out["score_max_abs_diff"] < 1e-4
    )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=4096)
    add_common(
        ap, out="results/gpu.json", out_help="JSON file (default: $OUT/gpu.json if $OUT is set, else results/gpu.json)"
    )
    args = ap.parse_args(argv)
    if args.out is None and not args.quick and os.environ.get("OUT"):
        args.out = str(Path(os.environ["OUT"]) / "gpu.json")
    finish_args(args, batch=256)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        if not args.quick:
            print("no CUDA device here (use --device cpu, or --quick for a dry run)", file=sys.stderr)
            return 2
        print("no CUDA device here: the quick run goes on on the CPU", file=sys.stderr)
        device = torch.device("cpu")
    if args.quick and device.type == "cpu":
        torch.set_num_threads(1)
    scale = 0.01 if args.quick else 1.0
    n = lambda k: max(2, int(k * scale))  # noqa: E731 (batches per measurement)
    B = args.batch
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "batch": B,
        "machine": machine(),
    }
    print(json.dumps(info), file=sys.stderr)
    info["agreement_with_cpu"] = agreement(device)
    print(f"agreement with the CPU: {json.dumps(info['agreement_with_cpu'])}", file=sys.stderr, flush=True)

    try:
        corpus = load_corpus(corpus_spec(args))
        V, pad, train = len(corpus.vocab), corpus.vocab.eos, corpus["train"]
        counts = np.asarray(corpus.vocab.counts, np.float64)
        info["ptb"] = not args.quick  # quick: the synthetic corpus
    except Exception as e:  # no PTB on this machine: the same sizes on a synthetic corpus
        print(f"PTB not available ({e}); using Zipf V=10k", file=sys.stderr)
        V, pad, train = 10_000, 0, zipf_stream(10_000, 1_000_000, seed=1)
        counts = np.bincount(train, minlength=V).astype(np.float64)
        info["ptb"] = False
    results: dict = {}

    def run(key: str, label: str, fn) -> None:
        r = fn()
        results[key] = r
        print(
            f"{label:<44} {r['wps']:>12,.0f} words/s  {json.dumps({k: v for k, v in r.items() if k != 'wps'})}",
            file=sys.stderr,
            flush=True,
        )

    tree = random_tree(V, 0)
    run(
        "hlbl_b1000",
        "PTB HLBL RANDOM, batch 1000",
        lambda: time_train(model_for(V, "tree", tree, counts, device), train, pad, 1000, n(300), device),
    )
    run(
        "hlbl",
        f"PTB HLBL RANDOM, batch {B}",
        lambda: time_train(model_for(V, "tree", tree, counts, device), train, pad, B, n(200), device),
    )
    run(
        "flat",
        f"PTB flat LBL, batch {B}",
        lambda: time_train(model_for(V, "flat", None, counts, device), train, pad, B, n(100), device),
    )
    run(
        "adaptive",
        f"PTB LBL + adaptive softmax, batch {B}",
        lambda: time_train(model_for(V, "adaptive", None, counts, device), train, pad, B, n(100), device),
    )
    run(
        "score",
        "PTB HLBL scoring",
        lambda: time_score(
            model_for(V, "tree", tree, counts, device), train[: int(len(train) * max(scale, 0.1))], pad, device
        ),
    )

    V2, n_zipf = (2_000, 20_000) if args.quick else (33_278, 2_000_000)
    z = zipf_stream(V2, n_zipf, seed=2)
    zc = np.bincount(z, minlength=V2).astype(np.float64)
    run(
        "hlbl_v33k",
        f"V={V2:,} HLBL RANDOM, batch {B}",
        lambda: time_train(model_for(V2, "tree", random_tree(V2, 0), zc, device), z, 0, B, n(200), device),
    )
    run(
        "flat_v33k",
        f"V={V2:,} flat LBL, batch {B}",
        lambda: time_train(model_for(V2, "flat", None, zc, device), z, 0, B, n(50), device),
    )
    run(
        "adaptive_v33k",
        f"V={V2:,} LBL + adaptive softmax, batch {B}",
        lambda: time_train(model_for(V2, "adaptive", None, zc, device), z, 0, B, n(100), device),
    )
    V1 = 1_000_000 if not args.quick else 20_000
    z1 = zipf_stream(V1, n_zipf, seed=2)
    z1c = np.bincount(z1, minlength=V1).astype(np.float64)
    run(
        "hlbl_vlarge",
        f"V={V1:,} HLBL BALANCED, batch {B}",
        lambda: time_train(model_for(V1, "tree", balanced_tree(np.arange(V1)), z1c, device), z1, 0, B, n(200), device),
    )

    info["lstm"] = lstm_stage(device, train[: 400_000 if not args.quick else 20_000], n(200), args.quick)
    print(f"LSTM example: {json.dumps(info['lstm'])}", file=sys.stderr, flush=True)

    summary = {
        **info,
        "v_mid": V2,
        "v_large": V1,
        **{f"{k}_wps": r["wps"] for k, r in results.items()},
        "ratio_vs_flat": results["hlbl"]["wps"] / results["flat"]["wps"],
        "ratio_vs_flat_v33k": results["hlbl_v33k"]["wps"] / results["flat_v33k"]["wps"],
        "ratio_vs_adaptive_v33k": results["hlbl_v33k"]["wps"] / results["adaptive_v33k"]["wps"],
        "details": results,
    }
    if args.out:
        write_json(args.out, summary)
    print(json.dumps({k: v for k, v in summary.items() if k != "details"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

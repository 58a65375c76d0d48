"""The ``hlbl`` command line: a thin layer over the library.

Each command is a small function; ``build_parser`` is the one place commands are registered.
User errors (bad data, trees, checkpoints, arguments) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

import torch

from .checkpoint import CheckpointError, load_model
from .data import DataError, load_corpus
from .evaluate import evaluate
from .model import LBL, LBLConfig
from .output import OUTPUT_KINDS
from .train import OPTIMIZERS, TrainConfig, fit
from .tree import TreeError, WordTree, build_tree

USER_ERRORS = (DataError, TreeError, CheckpointError, FloatingPointError)


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DataError(f"--device {name}: CUDA is not available on this machine")
    return name


def _corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="corpus directory or name (looked up in $HLBL_DATA, then the cache)")
    p.add_argument("--max-vocab", type=int, default=None, help="keep at most this many word types (with <eos>, <unk>)")
    p.add_argument("--min-count", type=int, default=1, help="drop training words seen fewer times")


# ---- train ----------------------------------------------------------------------------------


def cmd_train(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise DataError(f"{out} is not empty; choose a new --out or pass --resume")
    corpus = load_corpus(args.data, args.max_vocab, args.min_count)
    V = len(corpus.vocab)
    if args.resume and (out / "run.json").exists():
        model, _, info = load_model(out, which="last")
        cfg = TrainConfig(**{**info["train"], "max_epochs": args.epochs or info["train"]["max_epochs"]})
    else:
        torch.manual_seed(args.seed)
        mcfg = LBLConfig(V, dim=args.dim, context=args.context, full_context=args.full_context,
                         output=args.output, init_std=args.init_std)
        tree = build_tree(args.tree, V, corpus.vocab.counts, args.seed) if args.output == "tree" else None
        model = LBL(mcfg, tree, torch.Generator().manual_seed(args.seed))
        model.init_unigram(corpus.vocab.counts)
        cfg = TrainConfig(lr=args.lr, lr_final=args.lr_final, batch_size=args.batch_size,
                          max_epochs=args.epochs or TrainConfig.max_epochs, optimizer=args.optimizer,
                          seed=args.seed, device=device, max_train_tokens=args.max_train_tokens,
                          progress=not args.quiet)
    cfg.device = device
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    print(f"{model.config.output} output, {V:,} words, {model.num_parameters():,} parameters, "
          f"{min(len(corpus['train']), cfg.max_train_tokens or len(corpus['train'])):,} training tokens, device {device}", file=sys.stderr)
    fit(model, corpus, cfg, out, resume=args.resume, corpus_spec=str(args.data), log=log)
    pad = corpus.vocab.eos
    result = {s: evaluate(model, corpus[s], pad, device=device) for s in ("valid", "test")}
    print(json.dumps({"valid_perplexity": result["valid"]["perplexity"], "test_perplexity": result["test"]["perplexity"],
                      "test_tokens": result["test"]["tokens"], "run": str(out)}))
    show_sample(model, corpus, device, args.seed)
    return 0


def show_sample(model: LBL, corpus, device: str, seed: int) -> None:
    """Print the top next words for a test context and a short sample continuing it."""
    vocab, n = corpus.vocab, model.config.context
    test = corpus["test"]
    prompt = [int(i) for i in test[:n]]
    lp, idx = model.topk(torch.tensor([prompt], device=device), 5)
    nxt = ", ".join(f"{vocab.words[i]} {p:.3f}" for p, i in zip(lp[0].exp().tolist(), idx[0].tolist()))
    print(f"context: {' '.join(vocab.decode(prompt))} -> {nxt}")
    sample = model.generate(prompt, 20, vocab.eos, torch.Generator().manual_seed(seed))
    print(f"sample: {' '.join(vocab.decode(prompt))} | {' '.join(vocab.decode(sample))}")


# ---- eval -----------------------------------------------------------------------------------


def cmd_eval(args) -> int:
    device = pick_device(args.device)
    model, vocab, info = load_model(args.run, which=args.which, device=device)
    corpus = load_corpus(args.data or info["corpus"], vocab=vocab)
    print(json.dumps(evaluate(model, corpus[args.split], vocab.eos, device=device)))
    return 0


# ---- tree -----------------------------------------------------------------------------------


def cmd_tree_stats(args) -> int:
    tree = WordTree.load(args.tree)
    counts = None
    if args.data:
        corpus = load_corpus(args.data, args.max_vocab, args.min_count)
        if len(corpus.vocab) != tree.num_words:
            raise TreeError(f"{args.tree}: tree has {tree.num_words} words, the corpus vocabulary {len(corpus.vocab)}")
        counts = corpus.vocab.counts
    print(json.dumps(tree.stats(counts)))
    return 0


def cmd_tree_make(args) -> int:
    corpus = load_corpus(args.data, args.max_vocab, args.min_count)
    tree = build_tree(args.kind, len(corpus.vocab), corpus.vocab.counts, args.seed)
    tree.save(args.out)
    print(json.dumps({"out": args.out, **tree.stats(corpus.vocab.counts)}))
    return 0


# ---- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hlbl", description="Hierarchical log-bilinear language models.")
    sub = p.add_subparsers(dest="command", required=True)

    d = TrainConfig()
    m = {f.name: f.default for f in fields(LBLConfig) if f.name != "vocab_size"}
    t = sub.add_parser("train", help="train a model and report valid/test perplexity",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _corpus_args(t)
    t.add_argument("--out", required=True, help="run directory (checkpoints, metrics.jsonl)")
    t.add_argument("--output", choices=OUTPUT_KINDS, default="tree", help="output layer: tree = HLBL, flat = LBL")
    t.add_argument("--tree", default="random", help="random, huffman, or a tree file (JSON/npz)")
    t.add_argument("--dim", type=int, default=m["dim"], help="feature vector size")
    t.add_argument("--context", type=int, default=m["context"], help="number of context words (n-1)")
    t.add_argument("--full-context", action="store_true", help="full d x d context matrices C_i")
    t.add_argument("--init-std", type=float, default=m["init_std"])
    t.add_argument("--epochs", type=int, default=None, help=f"maximum epochs (default {d.max_epochs}; early stopping ends sooner)")
    t.add_argument("--batch-size", type=int, default=d.batch_size)
    t.add_argument("--lr", type=float, default=d.lr, help="learning rate per example (gradients are summed over a batch)")
    t.add_argument("--lr-final", type=float, default=d.lr_final, help="learning rate after validation perplexity first rises")
    t.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    t.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch")
    t.add_argument("--max-train-tokens", type=int, default=None, help="train on this many tokens only")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    t.add_argument("--quiet", action="store_true", help="no progress bar or epoch lines")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="perplexity of a trained run on a split (one JSON line)")
    e.add_argument("run", help="run directory")
    e.add_argument("--split", choices=("train", "valid", "test"), default="test")
    e.add_argument("--data", default=None, help="corpus (default: the one the run was trained on)")
    e.add_argument("--which", choices=("best", "last"), default="best")
    e.add_argument("--device", default="auto")
    e.set_defaults(func=cmd_eval)

    tr = sub.add_parser("tree", help="word trees: statistics, builders")
    tsub = tr.add_subparsers(dest="tree_command", required=True)
    ts = tsub.add_parser("stats", help="Table 1 statistics of a tree (one JSON line)")
    ts.add_argument("tree", help="tree file (JSON or npz)")
    ts.add_argument("--data", default=None, help="corpus whose training counts weight the averages")
    ts.add_argument("--max-vocab", type=int, default=None)
    ts.add_argument("--min-count", type=int, default=1)
    ts.set_defaults(func=cmd_tree_stats)
    tm = tsub.add_parser("make", help="build a RANDOM or Huffman tree for a corpus")
    _corpus_args(tm)
    tm.add_argument("--kind", choices=("random", "huffman"), default="random")
    tm.add_argument("--seed", type=int, default=0)
    tm.add_argument("--out", required=True)
    tm.set_defaults(func=cmd_tree_make)
    from .ngram import add_subcommands as add_ngram_commands  # hlbl ngram train|eval
    add_ngram_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"hlbl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hlbl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

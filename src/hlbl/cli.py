"""The ``hlbl`` command line: a thin layer over the library.

Each command is a small function; ``build_parser`` is the one place commands are registered.
User errors (bad data, trees, checkpoints, arguments) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import distributed
from .checkpoint import CheckpointError, load_model, read_run, read_state, read_vocab
from .data import DATA_HELP, Corpus, DataError, corpus_record, load_corpus, min_count_arg, resolve_corpus, stream_fingerprint
from .evaluate import evaluate
from .model import LBL, LBLConfig
from .output import OUTPUT_KINDS, takes_tree
from .reproduce import ReproConfig
from .train import ENGINES, OPTIMIZERS, TrainConfig, fit
from .tree import TreeError, WordTree, build_tree
from .treebuild import DEFAULT_EM_ITERS, DEFAULT_MAX_LEAVES_PER_WORD

USER_ERRORS = (DataError, TreeError, CheckpointError, FloatingPointError)


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(name).type
    except RuntimeError:
        raise DataError(f"--device {name!r}: not a device name (cpu, cuda, cuda:N or auto)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise DataError(f"--device {name}: CUDA is not available on this machine")
    index = torch.device(name).index
    if kind == "cuda" and index is not None and index >= torch.cuda.device_count():
        raise DataError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return name


def _corpus_args(p: argparse.ArgumentParser, data_help: str = "") -> None:
    p.add_argument("--data", required=not data_help, help=DATA_HELP + data_help)
    p.add_argument("--max-vocab", type=int, default=None, help="keep at most this many word types (with <eos>, <unk>)")
    p.add_argument("--min-count", type=min_count_arg, default="auto",
                   help="training words seen fewer times become <unk>; auto = 1 if the training text has "
                        "<unk> tokens already (PTB), else 2, so that <unk> is learned")


# ---- train ----------------------------------------------------------------------------------


def _set_threads(threads: int | None) -> None:
    """--threads: PyTorch's and numba's CPU threads (the fast kernels, top-k and scoring)."""
    if threads is not None:
        if threads < 1:
            raise DataError(f"--threads must be at least 1, got {threads}")
        from .fast import set_cpu_threads  # lazily: numba

        set_cpu_threads(threads)


def _differing_split(corpus, vocab, info: dict) -> str | None:
    """Which split of ``corpus`` is not the text the run was trained on (None: both match).

    Paths may move; the text is what must match. Runs record fingerprints of their encoded train
    and valid splits; for older runs the vocabulary's exact training counts (cut words summed
    into ``<unk>``) are compared with the encoded train split instead."""
    recorded = info.get("data_sha256")
    if recorded:
        return next((s for s in ("train", "valid") if stream_fingerprint(corpus[s]) != recorded.get(s)), None)
    same = np.array_equal(np.bincount(corpus["train"], minlength=len(vocab)), np.asarray(vocab.counts))
    return None if same else "train"


def cmd_train(args) -> int:
    """Train (under torchrun: one data-parallel process of several; see hlbl.distributed)."""
    _set_threads(args.threads)
    # 0 is a value, not "unset": --epochs 0 must not mean the default.
    for flag, value in (("--epochs", args.epochs), ("--max-train-tokens", args.max_train_tokens),
                        ("--hogwild", args.hogwild)):
        if value is not None and value < 1:
            raise DataError(f"{flag} must be at least 1, got {value}")
    if args.hogwild is not None and args.hogwild > 1 and args.engine == "torch":
        raise DataError("--hogwild runs threads of the fast engine; --engine torch has none (use --threads)")
    device = distributed.init_from_env(pick_device(args.device))  # torchrun: join the group, one GPU each
    if distributed.world_size() > 1 and args.hogwild is not None and args.hogwild > 1:
        distributed.cleanup(finished=False)
        raise DataError("--hogwild runs threads of the fast engine, which trains in one process; under torchrun the "
                        "torch engine runs (use --threads)")
    try:
        rc = _train(args, device)
    except BaseException:
        distributed.cleanup(finished=False)
        raise
    distributed.cleanup()
    return rc


def _resumed_run(args, out: Path, splits: tuple[str, ...], first: bool) -> tuple[LBL, Corpus, TrainConfig]:
    """The run's own model (last weights), vocabulary and recipe; only --epochs may change."""
    model, vocab, info = load_model(out, which="last")
    corpus = load_corpus(args.data, vocab=vocab, splits=splits)  # the run's own vocabulary, whatever the flags say now
    differs = _differing_split(corpus, vocab, info)
    if differs:
        raise DataError(f"the {differs} split of --data {args.data} is not the one {out} was trained on "
                        f"({info['corpus']}); resume with the same corpus")
    try:
        cfg = TrainConfig.from_json(info["train"], **({"max_epochs": args.epochs} if args.epochs else {}))
    except ValueError as e:
        raise DataError(f"{out / 'run.json'}: bad training config ({e})") from None
    done = read_state(out / "state.json")
    if first and done["done"]:
        print(f"note: {out} had already stopped early (after epoch {done['epoch']}): nothing to train; "
              "reporting its best weights", file=sys.stderr)
    elif first and done["epoch"] >= cfg.max_epochs:
        print(f"note: {out} has {done['epoch']} epochs and --epochs is {cfg.max_epochs}: nothing to train; "
              "pass a larger --epochs to continue", file=sys.stderr)
    if first:
        print(f"resuming {out}: the model, vocabulary and recipe are the run's own (only --epochs, --engine, "
              "--hogwild, --device and --threads apply)", file=sys.stderr)
    return model, corpus, cfg


def _new_run(args, splits: tuple[str, ...], device: str) -> tuple[LBL, Corpus, TrainConfig]:
    """A new model and recipe from the flags; the vocabulary comes from the training split."""
    if args.tree is not None and not takes_tree(args.output):
        raise DataError(f"--tree applies to the tree output layer only, not --output {args.output}")
    if args.momentum is not None and args.optimizer != "momentum":
        raise DataError(f"--momentum applies to --optimizer momentum only, not {args.optimizer}")
    corpus = load_corpus(args.data, args.max_vocab, args.min_count, splits=splits)
    V = len(corpus.vocab)
    try:
        mcfg = LBLConfig(V, dim=args.dim, context=args.context, full_context=args.full_context,
                         output=args.output, init_std=args.init_std)
        cfg = TrainConfig(lr=args.lr, lr_final=args.lr_final, batch_size=args.batch_size,
                          max_epochs=args.epochs or TrainConfig.max_epochs, optimizer=args.optimizer,
                          momentum=TrainConfig.momentum if args.momentum is None else args.momentum,
                          weight_decay_words=args.weight_decay_words,
                          weight_decay_other=args.weight_decay, hogwild=args.hogwild,
                          seed=args.seed, device=device, max_train_tokens=args.max_train_tokens,
                          progress=not args.quiet)
    except ValueError as e:
        raise DataError(str(e)) from None
    tree = build_tree(args.tree or "random", V, corpus.vocab.counts, args.seed) if takes_tree(args.output) else None
    model = LBL(mcfg, tree, torch.Generator().manual_seed(args.seed))
    model.init_unigram(corpus.vocab.counts)
    return model, corpus, cfg


def _train(args, device: str) -> int:
    first = distributed.rank() == 0  # under torchrun only process 0 prints
    if args.data is None:
        if not (args.resume and (Path(args.out) / "run.json").is_file()):
            raise DataError("--data is needed (it may be left out to --resume a run, which records its corpus)")
        args.data = read_run(args.out)["corpus"]
    # A corpus without a test split can still be trained on (the final report skips test).
    splits = ("train", "valid") + (("test",) if (resolve_corpus(args.data) / "test.txt").exists() else ())
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file, not a run directory")
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise DataError(f"{out} is not empty; choose a new --out, pass --resume, or delete it")
    resuming = args.resume and (out / "run.json").exists() and (out / "state.json").exists()
    if args.resume and not resuming and first:
        why = "has no finished epoch" if (out / "run.json").exists() else "holds no run"
        print(f"note: {out} {why}: nothing to resume, starting a new run", file=sys.stderr)
    if resuming:
        model, corpus, cfg = _resumed_run(args, out, splits, first)
    else:
        model, corpus, cfg = _new_run(args, splits, device)
    cfg.device = device
    cfg.engine = args.engine  # like the device, a choice of how to run, not of what is learned
    cfg.hogwild = args.hogwild
    if cfg.hogwild > 1:
        from .fast import unsupported  # lazily: numba

        why = unsupported(model, cfg=cfg)
        if why:  # --engine auto would train on the torch engine, which has no Hogwild threads
            raise DataError(f"--hogwild runs threads of the fast engine, which cannot train this model: {why}")
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    if first:
        print(f"{model.config.output} output, {len(corpus.vocab):,} words, {model.num_parameters():,} parameters, "
              f"{min(len(corpus['train']), cfg.max_train_tokens or len(corpus['train'])):,} training tokens, "
              f"device {device}", file=sys.stderr)
    state = fit(model, corpus, cfg, out, resume=resuming, corpus_spec=corpus_record(args.data), log=log)
    if not first:
        return 0
    report = {"valid_perplexity": state["best_valid_ppl"]}
    if "test" in corpus.splits:
        test = evaluate(model, corpus["test"], corpus.vocab.eos, device=device)  # fit left the best weights in
        test = with_oov(test, corpus["test"], corpus.vocab, "test")
        report.update(test_perplexity=test["perplexity"], test_tokens=test["tokens"], test_oov=test["oov"])
    else:
        print("note: the corpus has no test.txt: no test perplexity", file=sys.stderr)
    print(json.dumps({**report, "run": str(out)}))
    show_sample(model, corpus, device, args.seed)
    return 0


def show_sample(model: LBL, corpus, device: str, seed: int) -> None:
    """Print the top next words for a test (else valid) context and a short sample continuing it."""
    vocab, n = corpus.vocab, model.config.context
    test = corpus["test" if "test" in corpus.splits else "valid"]
    prompt = [vocab.eos] * max(0, n - len(test)) + [int(i) for i in test[:n]]  # a test split may be shorter
    lp, idx = model.topk(torch.tensor([prompt], device=device), 5)
    nxt = ", ".join(f"{vocab.words[i]} {p:.3f}" for p, i in zip(lp[0].exp().tolist(), idx[0].tolist()))
    print(f"context: {' '.join(vocab.decode(prompt))} -> {nxt}")
    sample = model.generate(prompt, 20, vocab.eos, torch.Generator().manual_seed(seed))
    print(f"sample: {' '.join(vocab.decode(prompt))} | {' '.join(vocab.decode(sample))}")


# ---- eval -----------------------------------------------------------------------------------


def with_oov(report: dict, stream, vocab, split: str) -> dict:
    """``report`` plus ``oov``, the tokens of ``stream`` that are ``<unk>``; warns (stderr) when they
    weigh on the perplexity because ``<unk>`` never occurs in the training data."""
    oov = int(np.count_nonzero(np.asarray(stream) == vocab.unk))
    if oov and vocab.counts[vocab.unk] == 0:
        print(f"note: {oov:,} {split} tokens ({100 * oov / len(stream):.1f}%) are out of the vocabulary, and <unk> "
              "never occurs in training, so each gets a very low probability and they weigh heavily on the "
              "perplexity; --min-count 2 (the auto default where training has no <unk>) or --max-vocab gives <unk> "
              "a training count", file=sys.stderr)
    if not math.isfinite(report["perplexity"]):
        raise DataError(f"perplexity is {report['perplexity']}: the model gives some token probability 0 "
                        "(non-finite weights?)")
    return {**report, "oov": oov}


def cmd_eval(args) -> int:
    _set_threads(args.threads)
    device = pick_device(args.device)
    model, vocab, info = load_model(args.run, which=args.which, device=device)
    if args.weight != "auto" and not args.interpolate:
        raise DataError("--weight is the mixture weight of --interpolate; give the n-gram model with --interpolate")
    tune = args.interpolate and str(args.weight).strip().lower() == "auto"
    needed = {args.split} | ({"valid"} if tune else set())  # valid: to tune the mixture weight
    corpus = load_corpus(args.data or info["corpus"], vocab=vocab, splits=tuple(needed))
    if args.interpolate:  # mixture with an n-gram model (hlbl.ngram)
        from .ngram.commands import interpolated_report

        report = interpolated_report(model, corpus, args.split, args.interpolate, args.weight, device)
    else:
        report = evaluate(model, corpus[args.split], vocab.eos, device=device)
    print(json.dumps(with_oov(report, corpus[args.split], vocab, args.split)))
    return 0


# ---- tree -----------------------------------------------------------------------------------


def _make_parent(out: str | Path) -> None:
    """Create the directories an output file goes in (as ``train --out`` creates its run directory)."""
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot write {out}: {e.strerror or e}") from None


def cmd_tree_stats(args) -> int:
    path = Path(args.tree)
    if path.is_dir():  # a run directory: its own tree (and, without --data, its own counts)
        if not (path / "tree.json").is_file():
            raise TreeError(f"{path} is a directory without a tree.json; give a tree file or a run directory")
        path = path / "tree.json"
    tree = WordTree.load(path)
    counts = None
    if args.data:
        corpus = load_corpus(args.data, args.max_vocab, args.min_count, splits=("train",))
        if len(corpus.vocab) != tree.num_words:
            raise TreeError(f"{args.tree}: tree has {tree.num_words} words, the corpus vocabulary {len(corpus.vocab)} "
                            "(build the vocabulary as for the tree: --min-count / --max-vocab)")
        counts = corpus.vocab.counts
    elif path != Path(args.tree):  # a run directory: its vocabulary's training counts
        counts = read_vocab(path.parent).counts
        if len(counts) != tree.num_words:
            raise TreeError(f"{path}: tree has {tree.num_words} words, the run's vocabulary {len(counts)}")
    print(json.dumps(tree.stats(counts)))
    return 0


def cmd_tree_make(args) -> int:
    corpus = load_corpus(args.data, args.max_vocab, args.min_count, splits=("train",))
    tree = build_tree(args.kind, len(corpus.vocab), corpus.vocab.counts, args.seed)
    _make_parent(args.out)
    tree.save(args.out)
    print(json.dumps({"out": args.out, **tree.stats(corpus.vocab.counts)}))
    return 0


def cmd_tree_build(args) -> int:
    """A learned tree (the paper's Section 5) from the word features of a trained run."""
    import time

    from .treebuild import BuildReport, build_tree_from_features, features_from_run, parse_policy

    _set_threads(args.threads)
    if args.max_leaves_per_word is not None and not args.max_leaves_per_word >= 1:
        raise DataError(f"--max-leaves-per-word must be at least 1 (every word has a leaf), got {args.max_leaves_per_word}")
    parse_policy(args.policy)  # fail on a bad policy before the feature pass
    vocab, info = read_vocab(args.run), read_run(args.run)  # the model itself is loaded once, below
    corpus = load_corpus(args.data or info["corpus"], vocab=vocab, splits=("train",))
    t0 = time.perf_counter()
    X, n = features_from_run(args.run, corpus)
    t1 = time.perf_counter()
    if (n == 0).mean() > 0.5:
        print(f"hlbl: warning: {int((n == 0).sum()):,} of {len(n):,} words never occur as a target in the training "
              "text, so they share one feature vector (the overall mean): is --data the run's corpus?", file=sys.stderr)
    rep = BuildReport()
    tree = build_tree_from_features(X, args.policy, args.seed, args.copies, args.em_iters,
                                    weights=corpus.vocab.counts if args.weighted else None,
                                    max_leaves=None if args.max_leaves_per_word is None
                                    else int(args.max_leaves_per_word * len(X)), report=rep)
    _make_parent(args.out)
    tree.save(args.out)
    print(json.dumps({"out": args.out, "feature_seconds": round(t1 - t0, 2),
                      "build_seconds": round(time.perf_counter() - t1, 2), "unseen_words": int((n == 0).sum()),
                      **rep.to_json(), **tree.stats(corpus.vocab.counts)}))
    return 0


# ---- reproduce ------------------------------------------------------------------------------


def _reproduce_command(args) -> str:
    """The full command line with every option spelled out (defaults included), for the tables."""
    parts = ["hlbl reproduce"]
    for k in ("data", "out", "work", "epochs", "flat_epochs", "dim", "seed", "threads", "max_train_tokens",
              "max_vocab", "em_iters", "skip"):
        v = getattr(args, k)
        if v is not None:
            parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts + (["--quick"] if args.quick else []))


def cmd_reproduce(args) -> int:
    from .reproduce import reproduce

    _set_threads(args.threads)
    try:
        cfg = ReproConfig(data=args.data, out=args.out, work=args.work, epochs=args.epochs,
                          flat_epochs=args.flat_epochs, dim=args.dim, seed=args.seed, threads=args.threads,
                          max_train_tokens=args.max_train_tokens, max_vocab=args.max_vocab, em_iters=args.em_iters,
                          skip=tuple(x for x in (args.skip or "").split(",") if x), quick=args.quick,
                          command=_reproduce_command(args))
    except ValueError as e:
        raise DataError(str(e)) from None
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    res = reproduce(cfg, log)
    print(json.dumps({"out": res["out"], "rows": [{k: r.get(k) for k in ("model", "tree", "test_perplexity")}
                                                  for r in res["rows"]]}))
    return 0


# ---- parser ---------------------------------------------------------------------------------


def seed_arg(text: str) -> int:
    """``--seed``: a whole number in [0, 2^63) (what numpy's and torch's generators take)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be in 0 .. 2^63-1, got {value}")
    return value


class _Help(argparse.HelpFormatter):
    """Help lines end in ``(default: X)`` where there is a default worth saying and the text does not give it."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default  # identity tests: a default of 0 is worth saying, unlike None/False
        if (action.option_strings and not any(default is x for x in (None, False, argparse.SUPPRESS))
                and "default" not in text):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """Every (sub)command's parser, so that all help pages share :class:`_Help`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hlbl", description="Hierarchical log-bilinear language models.")
    sub = p.add_subparsers(dest="command", required=True)

    d = TrainConfig()
    m = {f.name: f.default for f in fields(LBLConfig) if f.name != "vocab_size"}
    t = sub.add_parser("train", help="train a model and report valid/test perplexity")
    _corpus_args(t, "; with --resume, the run's own by default")
    t.add_argument("--out", required=True, help="run directory (checkpoints, metrics.jsonl)")
    t.add_argument("--output", choices=OUTPUT_KINDS, default="tree", help="output layer: tree = HLBL, flat = LBL")
    t.add_argument("--tree", default=None, help="random (the default), huffman, or a tree file (JSON/npz); tree output only")
    t.add_argument("--dim", type=int, default=m["dim"], help="feature vector size")
    t.add_argument("--context", type=int, default=m["context"], help="number of context words (n-1)")
    t.add_argument("--full-context", action="store_true", help="full d x d context matrices C_i")
    t.add_argument("--init-std", type=float, default=m["init_std"], help="std of the Gaussian initial weights")
    t.add_argument("--epochs", type=int, default=None, help=f"maximum epochs (default {d.max_epochs}; early stopping ends sooner)")
    t.add_argument("--batch-size", type=int, default=d.batch_size, help="examples per SGD step")
    t.add_argument("--lr", type=float, default=d.lr, help="learning rate per example (gradients are summed over a batch)")
    t.add_argument("--lr-final", type=float, default=d.lr_final, help="learning rate after validation perplexity first rises")
    t.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer,
                   help="momentum = SGD with momentum (the recipe), sgd = plain SGD; adam/adagrad use the torch engine")
    t.add_argument("--momentum", type=float, default=None, help=f"with --optimizer momentum (default {d.momentum})")
    t.add_argument("--weight-decay-words", type=float, default=d.weight_decay_words,
                   help="L2 penalty per example on the word feature vectors R")
    t.add_argument("--weight-decay", type=float, default=d.weight_decay_other,
                   help="L2 penalty per example on the other weights (C, node vectors; never biases)")
    t.add_argument("--engine", choices=ENGINES, default=d.engine,
                   help="fast = numba CPU kernels (tree output, SGD/momentum), torch = autograd (GPU, any model); auto picks fast where it applies")
    t.add_argument("--hogwild", type=int, default=d.hogwild,
                   help="threads of the fast engine; 1 is bit-reproducible, more run lock-free Hogwild steps")
    t.add_argument("--seed", type=seed_arg, default=0, help="initial weights and example order")
    t.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    t.add_argument("--threads", type=int, default=None, help="CPU threads (PyTorch and numba)")
    t.add_argument("--max-train-tokens", type=int, default=None, help="train on this many tokens only")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint "
                   "(a new run if it has no finished epoch yet)")
    t.add_argument("--quiet", action="store_true", help="no progress bar or epoch lines")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="perplexity of a trained run on a split (one JSON line)")
    _run_args(e)
    e.add_argument("--split", choices=("train", "valid", "test"), default="test", help="split to score")
    e.add_argument("--data", default=None, help="corpus (default: the one the run was trained on)")
    e.add_argument("--interpolate", metavar="ARPA", default=None,
                   help="also mix with this n-gram model: W p_model + (1-W) p_ngram, per token")
    e.add_argument("--weight", default="auto", help="with --interpolate: W in [0, 1], or auto (tuned on valid)")
    e.set_defaults(func=cmd_eval)

    tr = sub.add_parser("tree", help="word trees: statistics, builders")
    tsub = tr.add_subparsers(dest="tree_command", required=True)
    ts = tsub.add_parser("stats", help="Table 1 statistics of a tree (one JSON line)")
    ts.add_argument("tree", help="tree file (JSON or npz), or a run directory (its tree and training counts)")
    ts.add_argument("--data", default=None, help="corpus whose training counts weight the averages")
    ts.add_argument("--max-vocab", type=int, default=None, help="as for hlbl train")
    ts.add_argument("--min-count", type=min_count_arg, default="auto", help="as for hlbl train")
    ts.set_defaults(func=cmd_tree_stats)
    tm = tsub.add_parser("make", help="build a RANDOM or Huffman tree for a corpus")
    _corpus_args(tm)
    tm.add_argument("--kind", choices=("random", "huffman"), default="random",
                    help="random permutation halved recursively, or Huffman codes from the training counts")
    tm.add_argument("--seed", type=seed_arg, default=0, help="the random tree's permutation")
    tm.add_argument("--out", required=True, help="tree file (.json or .npz)")
    tm.set_defaults(func=cmd_tree_make)
    tb = tsub.add_parser("build", help="learned tree from a trained run's word features (paper, Section 5)")
    tb.add_argument("--from", dest="run", required=True, help="run directory of a trained model (normally HLBL on a RANDOM tree)")
    tb.add_argument("--policy", default="adaptive", help="balanced, adaptive, or adaptive:EPS (e.g. adaptive:0.4)")
    tb.add_argument("--copies", type=int, default=1, help="K trees from different seeds joined under new top nodes (xK)")
    tb.add_argument("--seed", type=seed_arg, default=0, help="EM initialisation (trees differ run to run)")
    tb.add_argument("--em-iters", type=int, default=DEFAULT_EM_ITERS, help="EM iterations per split")
    tb.add_argument("--weighted", action="store_true", help="weight words by training frequency in the EM")
    tb.add_argument("--max-leaves-per-word", type=float, default=None, help=f"leaf budget per tree, in units of V (default {DEFAULT_MAX_LEAVES_PER_WORD})")
    tb.add_argument("--data", default=None, help="corpus (default: the one the run was trained on)")
    tb.add_argument("--threads", type=int, default=None, help="CPU threads")
    tb.add_argument("--out", required=True, help="tree file (.json or .npz)")
    tb.set_defaults(func=cmd_tree_build)
    rp = sub.add_parser("reproduce", help="the paper's Tables 1 and 3 on a corpus, resumable")
    rp.add_argument("--data", default="ptb", help=DATA_HELP)
    rp.add_argument("--out", default=None,
                    help="tables, plot, results.json (default results/NAME, NAME the corpus's; --quick: in its --work)")
    rp.add_argument("--work", default=None,
                    help="checkpoints, features, trees, ~300 MB for PTB (default: runs/reproduce-NAME, -quick added for --quick)")
    rp.add_argument("--epochs", type=int, default=ReproConfig.epochs,
                    help="epoch cap of every HLBL run (early stopping ends sooner)")
    rp.add_argument("--flat-epochs", type=int, default=ReproConfig.flat_epochs,
                    help="epoch cap of the flat LBL, ~4 min an epoch on PTB (0 = skip it)")
    rp.add_argument("--dim", type=int, default=ReproConfig.dim, help="feature vector size")
    rp.add_argument("--seed", type=seed_arg, default=ReproConfig.seed, help="initial weights, example order, tree seeds")
    rp.add_argument("--threads", type=int, default=None, help="CPU threads (PyTorch and numba)")
    rp.add_argument("--max-train-tokens", type=int, default=None, help="train on this many tokens only")
    rp.add_argument("--em-iters", type=int, default=ReproConfig.em_iters, help="EM iterations per split")
    rp.add_argument("--max-vocab", type=int, default=None, help="keep at most this many word types")
    rp.add_argument("--skip", default=None, help="comma-separated steps to leave out: T2..T7, flat, KN5")
    rp.add_argument("--quick", action="store_true",
                    help="smoke test: 2000 words, 3000 training tokens, 5000 eval tokens, 16-d, 2 epochs (1 flat)")
    rp.add_argument("--quiet", action="store_true", help="no progress lines")
    rp.set_defaults(func=cmd_reproduce)
    _add_inference_commands(sub)
    from .ngram import add_subcommands as add_ngram_commands  # hlbl ngram train|eval
    add_ngram_commands(sub)
    return p


# ---- generate / score / predict --------------------------------------------------------------


def _load_for_inference(args):
    _set_threads(args.threads)
    device = pick_device(args.device)
    model, vocab, _ = load_model(args.run, which=args.which, device=device)
    model.eval()
    return model, vocab, device


def _more_input_waiting(buf) -> Callable[[], bool]:
    """A test of whether more of ``buf`` (stdin's bytes) can be read without waiting."""
    try:
        fd = buf.fileno()
    except (OSError, ValueError):  # in memory (io.UnsupportedOperation): all of it is there
        return lambda: True
    if os.name != "posix":  # select() cannot watch pipes there: answer per line only to a terminal
        tty = os.isatty(fd)
        return lambda: not tty
    import select

    return lambda: bool(select.select([fd], [], [], 0)[0])


def _stdin_chunks(size: int = 1024):
    """Lines of stdin (line end removed) in lists of at most ``size``. A list goes out when it is
    full or when no more input is waiting, so a person typing, or a program that writes a line and
    waits for the answer, gets it at once, while a file still goes through in large batches.

    Read as corpus files are, whatever the locale: UTF-8, strictly (an error names the line), a
    leading byte-order mark dropped, line ends \\n, \\r\\n or a lone \\r."""
    buf = sys.stdin.buffer
    waiting = _more_input_waiting(buf)
    chunk, number, unended = [], 0, []  # unended: the pieces of a line whose end has not come yet
    while True:
        block = buf.read1(1 << 16)  # what is there, waiting only when nothing is
        if block:
            *complete, rest = block.split(b"\n")
            if complete:
                complete[0] = b"".join(unended) + complete[0]
                unended = []
            unended.append(rest)
        else:  # end of input: what is left is the last line
            last = b"".join(unended)
            complete = [last] if last else []
        for raw in complete:
            for piece in raw.removesuffix(b"\r").split(b"\r"):  # \r\n, or a lone \r, ends a line
                number += 1
                try:
                    line = piece.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"standard input is not UTF-8 text (line {number}: byte 0x{piece[e.start]:02x} "
                                    f"at byte {e.start + 1} of the line)") from None
                chunk.append(line.removeprefix("\ufeff") if number == 1 else line)
                if len(chunk) == size:
                    yield chunk
                    chunk = []
        if not block:
            break
        if chunk and not waiting():
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def cmd_generate(args) -> int:
    from .data import EOS

    if args.tokens < 0:
        raise DataError(f"--tokens must be at least 0, got {args.tokens}")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        raise DataError(f"--temperature must be a positive number, got {args.temperature}")
    model, vocab, _ = _load_for_inference(args)
    if args.per_node_temperature and not takes_tree(model.config.output):
        raise DataError(f"--per-node-temperature needs a tree model; this one has {model.config.output} output")
    prompt = args.prompt.split() if args.prompt else []
    ids, oov = vocab.encode_counting_oov(prompt)
    if oov:
        print(f"hlbl: {oov} prompt word(s) not in the vocabulary, read as {vocab.words[vocab.unk]}", file=sys.stderr)
    gen = torch.Generator().manual_seed(args.seed)
    sample = model.generate(ids, args.tokens, vocab.eos, gen, args.temperature, args.per_node_temperature)
    # The prompt as typed, then the sample; every <eos> ends a line.
    lines, cur = [], list(prompt)
    for w in vocab.decode(sample):
        if w == EOS:
            lines.append(" ".join(cur))
            cur = []
        else:
            cur.append(w)
    if cur:
        lines.append(" ".join(cur))
    print("\n".join(lines))
    return 0


def cmd_score(args) -> int:
    from .scoring import score_report, score_sentences

    model, vocab, device = _load_for_inference(args)
    scores = []
    for chunk in _stdin_chunks():
        sentences = [line for line in chunk if line.strip()]  # blank lines are not sentences
        for s in score_sentences(model, vocab, sentences, device=device):
            scores.append(s)
            if args.json:
                print(json.dumps({"log10_prob": s.log10_prob, "tokens": s.tokens, "oov": s.oov}))
            else:
                print(f"{s.log10_prob:.6f}\t{s.tokens}\t{s.oov}")
        sys.stdout.flush()  # a program reading our answers line by line gets them now
    if not scores:
        raise DataError("no sentences on standard input")
    print(json.dumps(score_report(scores)))
    return 0


def cmd_predict(args) -> int:
    from .scoring import encode_context

    if args.k < 1:
        raise DataError(f"--k must be at least 1, got {args.k}")
    model, vocab, device = _load_for_inference(args)
    n = model.config.context
    unknown = 0
    for chunk in _stdin_chunks():
        encoded = [encode_context(vocab, line.split(), n) for line in chunk]
        unknown += sum(oov for _, oov in encoded)
        ctx = torch.tensor([c for c, _ in encoded], dtype=torch.int64, device=device).view(len(chunk), n)
        values, idx = model.topk(ctx, args.k)
        probs = values.double().exp().cpu().tolist()
        for line, (_, oov), p, w in zip(chunk, encoded, probs, idx.cpu().tolist()):
            words = vocab.decode(w)
            if args.json:
                print(json.dumps({"context": line, "oov": oov, "words": words, "probs": p}))
            else:
                print(" ".join(f"{word} {prob:.6g}" for word, prob in zip(words, p)))
        sys.stdout.flush()  # a program reading our answers line by line gets them now
    if unknown:
        print(f"hlbl: {unknown} context word(s) not in the vocabulary, read as {vocab.words[vocab.unk]}", file=sys.stderr)
    return 0


def _run_args(c: argparse.ArgumentParser) -> None:
    """The arguments of every command that loads a trained run."""
    c.add_argument("run", help="run directory")
    c.add_argument("--which", choices=("best", "last"), default="best",
                   help="weights with the best valid perplexity, or after the last epoch")
    c.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    c.add_argument("--threads", type=int, default=None, help="CPU threads")


def _add_inference_commands(sub) -> None:
    g = sub.add_parser("generate", help="sample text from a trained model (reproducible under --seed)")
    _run_args(g)
    g.add_argument("--tokens", type=int, default=100, help="number of words to sample (<eos> counts)")
    g.add_argument("--seed", type=seed_arg, default=0, help="the same seed gives the same text")
    g.add_argument("--prompt", default="", help="words to continue (the start of a sentence)")
    g.add_argument("--temperature", type=float, default=1.0,
                   help="sample from p(w)^(1/T)/Z (exact; costs the full distribution when T != 1)")
    g.add_argument("--per-node-temperature", action="store_true",
                   help="apply the temperature at each tree decision instead (fast; a different distribution)")
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("score", help="log10 probability of each sentence on stdin, then perplexity (JSON)",
                       description="Each non-blank stdin line is a sentence, scored independently as its words "
                                   "plus <eos> from an all-<eos> context; words outside the vocabulary are scored "
                                   "as <unk> and counted. Prints 'log10prob<TAB>tokens<TAB>oov' per sentence "
                                   "(tokens include <eos>), then one JSON line with the totals and perplexity.")
    _run_args(s)
    s.add_argument("--json", action="store_true", help="one JSON object per sentence")
    s.set_defaults(func=cmd_score)

    pr = sub.add_parser("predict", help="the k most probable next words for each context on stdin",
                        description="Each stdin line is the start of a sentence (a blank line: the sentence "
                                    "start itself); its last n words, padded with <eos>, are the context. Prints "
                                    "'word prob word prob ...' best first (ties: lower word id first), exact "
                                    "(best-first search on a tree model).")
    _run_args(pr)
    pr.add_argument("--k", type=int, default=10, help="number of words per context")
    pr.add_argument("--json", action="store_true", help="one JSON object per context")
    pr.set_defaults(func=cmd_predict)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"hlbl: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (hlbl ... | head): stop quietly, as a killed pipe writer
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141
    except OSError as e:  # unreadable input, unwritable output: the system's message names the path
        print(f"hlbl: error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hlbl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

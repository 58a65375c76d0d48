"""``hlbl train``: flags -> a model and recipe -> :func:`hlbl.run.fit`, or ``--resume`` -> :class:`hlbl.run.Run`.

Only the parsers are built at import: torch and the library's training modules are imported by the
command itself, so that ``--help`` and argument errors answer at once.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields, replace
from pathlib import Path

from ..config import (
    ENGINES,
    LR_SCHEDULES,
    OPTIMIZERS,
    OUTPUT_KINDS,
    SAMPLED_KINDS,
    LBLConfig,
    TrainConfig,
    check_model_memory,
)
from ..errors import DataError
from .common import corpus_args, duration_arg, flag_dest, pick_device, seed_arg, set_threads, with_oov


def cmd_train(args) -> int:
    """Train (under torchrun: one data-parallel process of several; see hlbl.distributed)."""
    from .. import distributed

    set_threads(args.threads)
    # 0 is a value, not "unset": --epochs 0 must not mean the default.
    for flag, value in (
        ("--epochs", args.epochs),
        ("--max-train-tokens", args.max_train_tokens),
        ("--hogwild", args.hogwild),
        ("--sync-every", args.sync_every),
    ):
        if value is not None and value < 1:
            raise DataError(f"{flag} must be at least 1, got {value}")
    if args.hogwild is not None and args.hogwild > 1 and args.engine == "torch":
        raise DataError("--hogwild runs threads of the fast engine; --engine torch has none (use --threads)")
    device = distributed.init_from_env(pick_device(args.device))  # torchrun: join the group, one GPU each
    if distributed.world_size() > 1 and args.hogwild is not None and args.hogwild > 1:
        distributed.cleanup(finished=False)
        raise DataError(
            "--hogwild runs threads of the fast engine in one process; under torchrun each process "
            "trains with one thread (start more processes instead)"
        )
    try:
        rc = _train(args, device, distributed.rank() == 0)
    except BaseException:
        distributed.cleanup(finished=False)
        raise
    distributed.cleanup()
    return rc


# Flags a resume may give: the run's runtime settings (TrainConfig.RUNTIME, by their flags) and
# flags that are no setting of the run (--data is checked by its text, --blank-lines against the
# run's own record in _resumed_run; --quiet is the runtime setting progress).
RESUME_FLAGS = {"out", "resume", "data", "threads", "blank_lines", "quiet"} | {
    flag_dest(k) for k in TrainConfig.RUNTIME
}


def _contradictions(args, record) -> list[str]:
    """The flags given with --resume that differ from the run's recipe (its :class:`hlbl.run.RunRecord`), in words."""
    field_of = {flag_dest(f.name): f.name for f in fields(TrainConfig)}  # --epochs: max_epochs
    sections = (
        record.model.to_json(),
        record.train.to_json(),
        record.text.to_json(),
        record.options.to_json(),
    )
    out = []
    for dest in sorted(getattr(args, "_given", set()) - RESUME_FLAGS):
        flag = args._flag_names.get(dest, "--" + dest.replace("_", "-"))
        key, value = field_of.get(dest, dest), getattr(args, dest)
        recorded = [sec[key] for sec in sections if key in sec]
        if not recorded:
            out.append(f"{flag} (the run does not record it)")
        elif not _same(dest, value, recorded[0]):
            out.append(f"{flag} {value} (the run's is {recorded[0]})")
    return out


def _same(dest: str, value, recorded) -> bool:
    """A flag's value against the run's record: numbers by value, paths by the file they name."""
    if recorded == value:
        return True
    number = (int, float)
    if isinstance(value, number) and isinstance(recorded, number) and not isinstance(value, bool):
        return float(recorded) == float(value)
    if dest in ("tree", "init_from") and Path(str(value)).exists():  # relative or absolute: the same file or run
        return Path(str(value)).resolve() == Path(str(recorded)).resolve()
    return False


def _check_resume_flags(args, run) -> None:
    """Refuse flags that contradict the run's recipe (the only source of the recipe on a resume:
    only --epochs and the settings of how to run may change)."""
    differ = _contradictions(args, run.record)
    if differ:
        raise DataError(
            f"--resume continues {run.path} with its own recipe, and these flags contradict it: "
            f"{', '.join(differ)}; leave them out, or choose a new --out for a new run"
        )
    blank_lines = run.text.blank_lines
    if args.blank_lines not in (None, blank_lines):
        raise DataError(f"{run.path} was trained with --blank-lines {blank_lines}; resume it with the same")


def _say_where_resuming(run, cfg) -> None:
    found, state = run.latest(), run.state()
    if state is not None and state.done:
        print(
            f"note: {run.path} had already stopped early (after epoch {state.epoch}): nothing to train; "
            "reporting its best weights",
            file=sys.stderr,
        )
    elif state is not None and state.epoch >= cfg.max_epochs:
        print(
            f"note: {run.path} has {state.epoch} epochs and --epochs is {cfg.max_epochs}: nothing to train; "
            "pass a larger --epochs to continue",
            file=sys.stderr,
        )
    where = (
        "with no complete checkpoint: from the start"
        if found is None
        else f"after epoch {state.epoch}, from its newest complete checkpoint ({found.relative_to(run.path)})"
    )
    print(
        f"resuming {run.path} {where}: the model, vocabulary and recipe are the run's own (only --epochs, --engine, "
        "--hogwild, --sync-every, --device, --threads and --time-budget apply)",
        file=sys.stderr,
    )


TREE_KINDS = ("random", "huffman")
CLASS_KINDS = ("frequency",)


def _structure(args, counts) -> object:
    """The output layer's structure from --tree: a word tree (tree output), word classes (classes
    output: frequency binning into about sqrt(V) classes by default, or a classes file), or None."""
    V = len(counts)
    if args.output in ("tree", "hybrid"):
        from ..tree import build_tree

        return build_tree(args.tree or "random", V, counts, args.seed)
    if args.output != "classes":
        return None
    from ..classes import WordClasses, frequency_classes

    if args.tree in (None, "frequency"):
        return frequency_classes(counts, max(1, min(round(V**0.5), V - 1)) if V > 2 else 2)
    classes = WordClasses.load(args.tree)
    if classes.num_words != V:
        raise DataError(f"--tree {args.tree}: word classes of {classes.num_words} words, the vocabulary {V}")
    return classes


def _new_run(args, splits: tuple[str, ...], device: str):
    """A new model and recipe from the flags; the vocabulary comes from the training split."""
    if args.tree is not None and args.output not in ("tree", "classes", "hybrid"):
        raise DataError(
            f"--tree applies to the tree output layer (and to classes and hybrid output) only, not --output {args.output}"
        )
    if args.head is not None and args.output != "hybrid":
        raise DataError(f"--head applies to --output hybrid only, not {args.output}")
    args.head = LBLConfig.head if args.head is None else args.head
    if args.output not in SAMPLED_KINDS and any(
        x is not None for x in (args.samples, args.noise_power, args.noise_share)
    ):
        raise DataError(
            f"--samples, --noise-power and --noise-share apply to --output {' or '.join(SAMPLED_KINDS)} only, "
            f"not {args.output}"
        )
    args.noise_share = LBLConfig.noise_share if args.noise_share is None else args.noise_share
    args.samples = LBLConfig.samples if args.samples is None else args.samples
    args.noise_power = LBLConfig.noise_power if args.noise_power is None else args.noise_power
    if args.momentum is not None and args.optimizer != "momentum":
        raise DataError(f"--momentum applies to --optimizer momentum only, not {args.optimizer}")
    if args.output == "classes":
        if args.tree is not None and args.tree not in CLASS_KINDS and not Path(args.tree).exists():
            raise DataError(
                f"--tree {args.tree}: not {', '.join(CLASS_KINDS)}, nor a word classes file "
                "(hlbl tree build --classes writes one)"
            )
    elif args.tree is not None and args.tree not in TREE_KINDS and not Path(args.tree).exists():
        raise DataError(
            f"--tree {args.tree}: not {', '.join(TREE_KINDS)}, nor a tree file (.json or .npz; "
            "hlbl tree build writes one)"
        )
    import torch

    from ..data import load_corpus
    from ..model import LBL

    corpus = load_corpus(
        args.data, args.max_vocab, args.min_count, splits=splits, blank_lines=args.blank_lines or "drop"
    )
    V = len(corpus.vocab)
    if args.output == "hybrid" and not 1 <= args.head <= V - 2:
        raise DataError(
            f"--head {args.head}: the hybrid needs 1 to V - 2 = {V - 2} head words (the vocabulary has {V})"
        )
    mcfg = LBLConfig(
        V,
        dim=args.dim,
        context=args.context,
        full_context=args.full_context,
        output=args.output,
        init_std=args.init_std,
        samples=args.samples,
        noise_power=args.noise_power,
        noise_share=args.noise_share,
        head=args.head,
    )
    cfg = TrainConfig(
        lr=args.lr,
        lr_final=args.lr_final,
        lr_schedule=args.lr_schedule,
        lr_decay=args.lr_decay,
        lr_decays=args.lr_decays,
        lr_min_gain=args.lr_min_gain,
        batch_size=args.batch_size,
        max_epochs=args.epochs or TrainConfig.max_epochs,
        epoch_tokens=args.epoch_tokens,
        optimizer=args.optimizer,
        momentum=TrainConfig.momentum if args.momentum is None else args.momentum,
        weight_decay_words=args.weight_decay_words,
        weight_decay_other=args.weight_decay,
        hogwild=args.hogwild,
        sync_every=args.sync_every,
        seed=args.seed,
        device=device,
        max_train_tokens=args.max_train_tokens,
        progress=not args.quiet,
    )
    check_model_memory(mcfg, f"dim {args.dim} with {V:,} words")
    tree = _structure(args, corpus.vocab.counts)
    model = LBL(mcfg, tree, torch.Generator().manual_seed(args.seed))
    model.init_unigram(corpus.vocab.counts)
    if args.init_from:
        from ..run import Run
        from ..warmstart import warm_start

        source = Run(args.init_from)
        if not source.has_record():
            raise DataError(f"--init-from {args.init_from}: not a run directory (no run description)")
        source = Run.open(args.init_from)
        say = lambda msg: print(msg, file=sys.stderr)
        warm_start(model, source.model(), source.vocab, corpus.vocab, say, args.keep_output, name=args.init_from)
    elif args.keep_output:
        raise DataError("--keep-output goes with --init-from RUN")
    return model, corpus, cfg


def _train(args, device: str, first: bool) -> int:
    """``first``: this is the process that prints (under torchrun, rank 0)."""
    from ..data import corpus_record, resolve_corpus
    from ..run import Run, fit

    out = Path(args.out)
    run = Run(out)
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    # How to run, not what is learned; the time budget is this call's, never a recorded one.
    runtime = dict(device=device, engine=args.engine, hogwild=args.hogwild, sync_every=args.sync_every)
    runtime["time_budget"] = args.time_budget
    trained = {}  # what the report needs: the model (holding the best weights after fit) and corpus

    def started(model, corpus, cfg) -> None:
        trained.update(model=model, corpus=corpus)
        if first:
            _say_what_trains(model, corpus, cfg, device)

    if args.resume and run.has_record():
        run = Run.open(out)
        _check_resume_flags(args, run)
        if args.epochs:
            runtime["max_epochs"] = args.epochs
        if first:
            _say_where_resuming(run, run.train_config(**runtime))
        state = Run.resume(out, args.data, log, started, **runtime)
    else:  # said before the corpus is read; fit checks again while it holds the directory
        run.check_writable(resume=bool(args.resume))
        if args.resume and first:
            print(f"note: {out} holds no run: nothing to resume, starting a new run", file=sys.stderr)
        if args.data is None:
            raise DataError("--data is needed (it may be left out to --resume a run, which records its corpus)")
        # A corpus without a test split can still be trained on (the final report skips test).
        splits = ("train", "valid") + (("test",) if (resolve_corpus(args.data) / "test.txt").exists() else ())
        model, corpus, cfg = _new_run(args, splits, device)
        cfg = replace(cfg, **runtime)  # (validated again)
        started(model, corpus, cfg)
        options = _options(args, model)
        # resume: a --resume of a start killed before its run.json clears its leftovers
        state = fit(model, corpus, cfg, out, bool(args.resume), corpus_record(args.data), log, options)
    if first:
        _report(trained["model"], trained["corpus"], state, out, device, args.seed)
    return 0


def _say_what_trains(model, corpus, cfg, device: str) -> None:
    from ..data import epoch_span
    from ..schedule import resolve

    n_train = min(len(corpus["train"]), cfg.max_train_tokens or len(corpus["train"]))
    print(
        f"{model.config.output} output, {len(corpus.vocab):,} words, {model.num_parameters():,} parameters, "
        f"{n_train:,} training tokens, device {device}",
        file=sys.stderr,
    )
    span = epoch_span(n_train, 1, cfg.epoch_tokens, cfg.batch_size)
    if span.parts > 1:
        how = " (auto)" if cfg.lr_schedule == "auto" else ""
        print(
            f"a pass over the training split is {span.parts} epochs of {span.hi:,} positions "
            f"(--epoch-tokens {cfg.epoch_tokens:,}): each ends in validation and a checkpoint; "
            f"learning-rate schedule {resolve(cfg, span.parts)}{how}",
            file=sys.stderr,
        )


def _options(args, model):
    """What run.json records of the flags that shaped the output layer and the start (the
    vocabulary's are the corpus's text protocol)."""
    from ..run import RunOptions

    tree = None
    if model.config.output in ("tree", "classes", "hybrid"):
        tree = args.tree or ("frequency" if model.config.output == "classes" else "random")
    init_from = str(Path(args.init_from).resolve()) if getattr(args, "init_from", None) else None
    return RunOptions(tree, init_from, bool(init_from and args.keep_output))


def _report(model, corpus, state, out: Path, device: str, seed: int) -> None:
    """The final JSON line (valid and test perplexity of the best weights), then a sample."""
    from ..evaluate import evaluate, self_normalisation

    valid = corpus.token_counts("valid")
    report = {
        "valid_perplexity": state.best_valid_ppl,
        "blank_lines": corpus.blank_lines,
        "valid_blank_lines_dropped": valid["blank_lines_dropped"],
    }
    if "test" in corpus.splits:
        test = evaluate(model, corpus["test"], corpus.vocab.eos, device=device)  # fit left the best weights in
        test = with_oov(test, corpus, "test")
        report.update(
            test_perplexity=test["perplexity"],
            test_tokens=test["tokens"],
            test_oov=test["oov"],
            test_unk_in_text=test["unk_in_text"],
            test_blank_lines_dropped=test["blank_lines_dropped"],
        )
        norm = self_normalisation(model, corpus["test"], corpus.vocab.eos, device=device)
        if norm is not None:  # nce / sampled: how far from Z = 1 (the perplexity above is exact)
            report["test_self_normalisation"] = norm
    else:
        print("note: the corpus has no test.txt: no test perplexity", file=sys.stderr)
    print(json.dumps({**report, "run": str(out)}))
    show_sample(model, corpus, device, seed)


def show_sample(model, corpus, device: str, seed: int) -> None:
    """Print the top next words for a test (else valid) context and a short sample continuing it."""
    import torch

    vocab, n = corpus.vocab, model.config.context
    test = corpus["test" if "test" in corpus.splits else "valid"]
    prompt = [vocab.eos] * max(0, n - len(test)) + [int(i) for i in test[:n]]  # a test split may be shorter
    lp, idx = model.topk(torch.tensor([prompt], device=device), 5)
    nxt = ", ".join(f"{vocab.words[i]} {p:.3f}" for p, i in zip(lp[0].exp().tolist(), idx[0].tolist()))
    print(f"context: {' '.join(vocab.decode(prompt))} -> {nxt}")
    sample = model.generate(prompt, 20, vocab.eos, torch.Generator().manual_seed(seed))
    print(f"sample: {' '.join(vocab.decode(prompt))} | {' '.join(vocab.decode(sample))}")


def add_commands(sub) -> None:
    t = sub.add_parser("train", help="train a model and report valid/test perplexity")
    corpus_args(t, "; with --resume, the run's own by default")
    t.add_argument("--out", required=True, help="run directory (checkpoints, metrics.jsonl)")
    _model_args(t)
    _recipe_args(t)
    _how_to_run_args(t)
    t.set_defaults(func=cmd_train)
    _note_given_flags(t)


def _model_args(t) -> None:
    """What the model is (LBLConfig's defaults) and where it starts."""
    m = {f.name: f.default for f in fields(LBLConfig) if f.name != "vocab_size"}
    t.add_argument(
        "--output",
        choices=OUTPUT_KINDS,
        default="tree",
        help="output layer: tree = HLBL, classes = two-level tree with a softmax over classes then over "
        "the class's words (--tree: its classes), flat = LBL, adaptive = PyTorch's adaptive softmax, "
        "nce = noise-contrastive estimation, sampled = sampled softmax (nce and sampled train on "
        "--samples noise words per step and are evaluated with the exact full softmax), hybrid = an exact "
        "softmax over the --head most frequent words and the --tree restricted to the others (the torch engine)",
    )
    t.add_argument(
        "--head",
        type=int,
        default=None,
        help=f"hybrid: the most frequent words in its exact softmax (default {m['head']}; at most V - 2)",
    )
    t.add_argument(
        "--samples", type=int, default=None, help=f"K noise words per example (nce/sampled; default {m['samples']})"
    )
    t.add_argument(
        "--noise-power",
        type=float,
        default=None,
        help=f"noise distribution = unigram ** this (nce/sampled; default {m['noise_power']}; 0.75 as word2vec)",
    )
    t.add_argument(
        "--noise-share",
        type=int,
        default=None,
        help=f"examples that share one draw of K noise words (nce/sampled; default {m['noise_share']}; "
        "0 = the whole minibatch)",
    )
    t.add_argument(
        "--tree",
        default=None,
        help="tree and hybrid output: random (the default), huffman, or a tree file (JSON/npz; hybrid: cut to "
        "its tail words); classes output: "
        "frequency (the default: frequency binning into about sqrt(V) classes) or a word classes file "
        "(hlbl tree build --classes)",
    )
    t.add_argument(
        "--init-from",
        default=None,
        metavar="RUN",
        help="start from the word vectors and context weights of a trained run (same vocabulary, --dim, "
        "--context); the output layer starts from the unigram (the iterated bootstrap: hlbl tree build --from RUN, "
        "then train on the new tree with --init-from RUN)",
    )
    t.add_argument(
        "--keep-output",
        action="store_true",
        help="with --init-from: keep the run's output layer too: on its own tree, to go on with another recipe "
        "(e.g. a lower --lr), or on its word classes refined by hlbl tree refine, each membership's vector "
        "moving with it",
    )
    t.add_argument("--dim", type=int, default=m["dim"], help="feature vector size")
    t.add_argument("--context", type=int, default=m["context"], help="number of context words (n-1)")
    t.add_argument("--full-context", action="store_true", help="full d x d context matrices C_i")
    t.add_argument("--init-std", type=float, default=m["init_std"], help="std of the Gaussian initial weights")


def _recipe_args(t) -> None:
    """How it learns: the training recipe (TrainConfig's defaults)."""
    d = TrainConfig()
    t.add_argument(
        "--epochs", type=int, default=None, help=f"maximum epochs (default {d.max_epochs}; early stopping ends sooner)"
    )
    t.add_argument(
        "--epoch-tokens",
        type=int,
        default=d.epoch_tokens,
        help="an epoch is at most this many training positions: a longer split is cut into epochs that each "
        "end in validation, a checkpoint and the learning-rate decision, and together make one pass in the "
        "seeded order; --epochs counts them (0 = an epoch is always the whole split)",
    )
    t.add_argument("--batch-size", type=int, default=d.batch_size, help="examples per SGD step")
    t.add_argument(
        "--lr", type=float, default=d.lr, help="learning rate per example (gradients are summed over a batch)"
    )
    t.add_argument(
        "--lr-final",
        type=float,
        default=d.lr_final,
        help="two-rate schedule: the learning rate after validation perplexity first rises",
    )
    t.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default=d.lr_schedule,
        help="two-rate = the paper's (--lr until validation rises, then --lr-final until it rises again); "
        "halve = multiply the rate by --lr-decay whenever validation gains less than --lr-min-gain, "
        "--lr-decays times, then stop; auto = two-rate where an epoch is a whole pass over the training "
        "split, halve where a longer split is cut into several epochs (--epoch-tokens)",
    )
    t.add_argument("--lr-decay", type=float, default=d.lr_decay, help="halve schedule: factor per decay")
    t.add_argument("--lr-decays", type=int, default=d.lr_decays, help="halve schedule: decays before stopping")
    t.add_argument(
        "--lr-min-gain",
        type=float,
        default=d.lr_min_gain,
        help="halve schedule: relative validation gain below which the rate decays",
    )
    t.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default=d.optimizer,
        help="momentum = SGD with momentum (the recipe), sgd = plain SGD; adam/adagrad use the torch engine",
    )
    t.add_argument("--momentum", type=float, default=None, help=f"with --optimizer momentum (default {d.momentum})")
    t.add_argument(
        "--weight-decay-words",
        type=float,
        default=d.weight_decay_words,
        help="L2 penalty per example on the word feature vectors R",
    )
    t.add_argument(
        "--weight-decay",
        type=float,
        default=d.weight_decay_other,
        help="L2 penalty per example on the other weights (C, node vectors; never biases)",
    )


def _how_to_run_args(t) -> None:
    """How a run is computed (engine, threads, device), its seed and training prefix, and --resume."""
    d = TrainConfig()
    t.add_argument(
        "--engine",
        choices=ENGINES,
        default=d.engine,
        help="fast = numba CPU kernels (tree output, SGD/momentum), torch = autograd (GPU, any model); auto picks fast where it applies",
    )
    t.add_argument(
        "--hogwild",
        type=int,
        default=d.hogwild,
        help="threads of the fast engine; 1 is bit-reproducible, more run lock-free Hogwild steps",
    )
    t.add_argument(
        "--sync-every",
        type=int,
        default=d.sync_every,
        metavar="STEPS",
        help="fast engine under torchrun: each process's steps between two averagings of the rows "
        "the processes touched (docs/distributed.md)",
    )
    t.add_argument("--seed", type=seed_arg, default=0, help="initial weights and example order")
    t.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    t.add_argument("--threads", type=int, default=None, help="CPU threads (PyTorch and numba)")
    t.add_argument(
        "--time-budget",
        type=duration_arg,
        default=None,
        metavar="DURATION",
        help="stop at the first checkpoint after this much training (5400, 90m, 1.5h, 1h30m), report "
        "valid and test as at an early stop; --resume continues the run",
    )
    t.add_argument("--max-train-tokens", type=int, default=None, help="train on this many tokens only")
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest complete "
        "checkpoint, with its own recipe (run.json); a new run if --out holds none",
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar or epoch lines")


class _Given:
    """Mixed into an argparse action: records that its flag was given (a resume refuses recipe
    flags that contradict the run, and a flag left at its default contradicts nothing)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if not hasattr(namespace, "_given"):
            namespace._given = set()
        namespace._given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


def _note_given_flags(parser) -> None:
    names = {}
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            action.__class__ = type(f"Given{type(action).__name__}", (_Given, type(action)), {})
            names[action.dest] = max(action.option_strings, key=len)
    parser.set_defaults(_flag_names=names)

"""``hlbl train``: flags -> a model and recipe -> :func:`hlbl.run.fit`, or ``--resume`` -> :class:`hlbl.run.Run`.

Only the parsers are built at import: torch and the library's training modules are imported by the
command itself, so that ``--help`` and argument errors answer at once.
"""

from __future__ import annotations

import json
import sys
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
from .common import (
    FLAGS,
    corpus_args,
    duration_arg,
    flag_dest,
    given_flag,
    pick_device,
    seed_arg,
    set_threads,
    setting_arg,
    settings,
    sync_every_arg,
    with_oov,
)


def cmd_train(args) -> int:
    """Train (under torchrun: one data-parallel process of several; see hlbl.distributed)."""
    from .. import distributed

    set_threads(args.threads)
    # 0 is a value, not "unset": --epochs 0 must not mean the default.
    for flag, value in (
        ("--epochs", args.epochs),
        ("--max-train-tokens", args.max_train_tokens),
        ("--hogwild", args.hogwild),
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
# run's own record in _check_resume_flags; --quiet is the runtime setting progress).
RESUME_FLAGS = {"out", "resume", "data", "threads", "blank_lines", "quiet"} | {
    flag_dest(k) for k in TrainConfig.RUNTIME
}


def _contradictions(args, record) -> list[str]:
    """The flags given with --resume that differ from the run's recipe (its :class:`hlbl.run.RunRecord`:
    every setting a flag of ``train`` sets is recorded there), in words. A flag not given is None."""
    recorded = {}
    for section in (record.model, record.train, record.text, record.options):
        recorded.update(section.to_json())
    out = []
    for key in sorted(recorded, key=flag_dest):
        dest, value = flag_dest(key), given_flag(key, args)
        if value is not None and dest not in RESUME_FLAGS and not _same(dest, value, recorded[key]):
            out.append(f"{FLAGS[key]} {value} (the run's is {recorded[key]})")
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
        "--hogwild, --sync-every, --sync-overlap, --device, --threads and --time-budget apply)",
        file=sys.stderr,
    )


TREE_KINDS = ("random", "huffman")
CLASS_KINDS = ("frequency",)


def _structure(args, output: str, counts, seed: int) -> object:
    """The output layer's structure from --tree: a word tree (tree output), word classes (classes
    output: frequency binning into about sqrt(V) classes by default, or a classes file), or None."""
    V = len(counts)
    if output in ("tree", "hybrid"):
        from ..tree import build_tree

        return build_tree(args.tree or "random", V, counts, seed)
    if output != "classes":
        return None
    from ..classes import WordClasses, frequency_classes

    if args.tree in (None, "frequency"):
        return frequency_classes(counts, max(1, min(round(V**0.5), V - 1)) if V > 2 else 2)
    classes = WordClasses.load(args.tree)
    if classes.num_words != V:
        raise DataError(f"--tree {args.tree}: word classes of {classes.num_words} words, the vocabulary {V}")
    return classes


def _new_run(args, splits: tuple[str, ...], cfg: TrainConfig):
    """A new model from the flags, trained by ``cfg``; the vocabulary comes from the training split."""
    output = args.output or LBLConfig.output
    if args.tree is not None and output not in ("tree", "classes", "hybrid"):
        raise DataError(
            f"--tree applies to the tree output layer (and to classes and hybrid output) only, not --output {output}"
        )
    if given_flag("head", args) is not None and output != "hybrid":
        raise DataError(f"--head applies to --output hybrid only, not {output}")
    if output not in SAMPLED_KINDS and any(given_flag(k, args) is not None for k in _SAMPLING):
        raise DataError(
            f"--samples, --noise-power and --noise-share apply to --output {' or '.join(SAMPLED_KINDS)} only, "
            f"not {output}"
        )
    if args.momentum is not None and cfg.optimizer != "momentum":
        raise DataError(f"--momentum applies to --optimizer momentum only, not {cfg.optimizer}")
    if output == "classes":
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

    from ..data import TextProtocol, load_corpus
    from ..model import LBL

    corpus = load_corpus(args.data, splits=splits, text=settings(TextProtocol, args))
    V = len(corpus.vocab)
    mcfg = settings(LBLConfig, args, vocab_size=V)
    if mcfg.output == "hybrid" and not 1 <= mcfg.head <= V - 2:
        raise DataError(
            f"--head {mcfg.head}: the hybrid needs 1 to V - 2 = {V - 2} head words (the vocabulary has {V})"
        )
    check_model_memory(mcfg, f"dim {mcfg.dim} with {V:,} words")
    tree = _structure(args, mcfg.output, corpus.vocab.counts, cfg.seed)
    model = LBL(mcfg, tree, torch.Generator().manual_seed(cfg.seed))
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
    return model, corpus


_SAMPLING = ("samples", "noise_power", "noise_share")  # LBLConfig's settings of the sampled output layers


def _train(args, device: str, first: bool) -> int:
    """``first``: this is the process that prints (under torchrun, rank 0)."""
    from ..data import corpus_record, resolve_corpus
    from ..run import Run, fit

    out = Path(args.out)
    run = Run(out)
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    # The recipe from the flags (TrainConfig's defaults where not given) and how this call runs it.
    flags = settings(TrainConfig, args, device=device, progress=not args.quiet)
    trained = {}  # what the report needs: the model (holding the best weights after fit), corpus and recipe

    def started(model, corpus, cfg) -> None:
        trained.update(model=model, corpus=corpus, cfg=cfg)
        if first:
            _say_what_trains(model, corpus, cfg, device)

    if args.resume and run.has_record():
        run = Run.open(out)
        _check_resume_flags(args, run)
        # How to run, not what is learned: this call's settings (their defaults where not given; the
        # time budget is never a recorded one); the epoch cap is the run's own unless --epochs is given.
        runtime = {k: getattr(flags, k) for k in TrainConfig.RUNTIME if k != "max_epochs" or args.epochs}
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
        model, corpus = _new_run(args, splits, flags)
        started(model, corpus, flags)
        options = _options(args, model)
        # resume: a --resume of a start killed before its run.json clears its leftovers
        state = fit(model, corpus, flags, out, bool(args.resume), corpus_record(args.data), log, options)
    if first:
        _report(trained["model"], trained["corpus"], state, out, device, trained["cfg"].seed)
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
    from ..run import Run

    Run(out).write_report(report)  # kept, for whoever serves or inspects the run later
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


# The settings' flags (common.setting_arg) default to None: the config's own default applies where
# one is not given, and a resume refuses only the flags given (a flag not given contradicts nothing).


def _model_args(t) -> None:
    """What the model is (LBLConfig's defaults) and where it starts."""
    m = LBLConfig
    setting_arg(
        t,
        "output",
        m.output,
        "output layer: tree = HLBL, classes = two-level tree with a softmax over classes then over "
        "the class's words (--tree: its classes), flat = LBL, adaptive = PyTorch's adaptive softmax, "
        "nce = noise-contrastive estimation, sampled = sampled softmax (nce and sampled train on "
        "--samples noise words per step and are evaluated with the exact full softmax), hybrid = an exact "
        "softmax over the --head most frequent words and the --tree restricted to the others (the torch engine)",
        choices=OUTPUT_KINDS,
    )
    setting_arg(t, "head", m.head, "hybrid: the most frequent words in its exact softmax (at most V - 2)", type=int)
    setting_arg(t, "samples", m.samples, "K noise words per example (nce/sampled)", type=int)
    setting_arg(
        t,
        "noise_power",
        m.noise_power,
        "noise distribution = unigram ** this (nce/sampled; 0.75 as word2vec)",
        type=float,
    )
    setting_arg(
        t,
        "noise_share",
        m.noise_share,
        "examples that share one draw of K noise words (nce/sampled; 0 = the whole minibatch)",
        type=int,
    )
    setting_arg(
        t,
        "tree",
        None,
        "tree and hybrid output: random (the default), huffman, or a tree file (JSON/npz; hybrid: cut to its "
        "tail words); classes output: "
        "frequency (the default: frequency binning into about sqrt(V) classes) or a word classes file "
        "(hlbl tree build --classes)",
    )
    setting_arg(
        t,
        "init_from",
        None,
        "start from the word vectors and context weights of a trained run (same vocabulary, --dim, "
        "--context); the output layer starts from the unigram (the iterated bootstrap: hlbl tree build --from RUN, "
        "then train on the new tree with --init-from RUN)",
        metavar="RUN",
    )
    setting_arg(
        t,
        "keep_output",
        False,
        "with --init-from: keep the run's output layer too: on its own tree, to go on with another recipe "
        "(e.g. a lower --lr), or on its word classes refined by hlbl tree refine, each membership's vector "
        "moving with it",
        action="store_true",
    )
    setting_arg(t, "dim", m.dim, "feature vector size", type=int)
    setting_arg(t, "context", m.context, "number of context words (n-1)", type=int)
    setting_arg(t, "full_context", False, "full d x d context matrices C_i", action="store_true")
    setting_arg(t, "init_std", m.init_std, "std of the Gaussian initial weights", type=float)


# The training recipe's flags (TrainConfig's fields, defaults said from TrainConfig): field, help, argparse options.
_RECIPE_FLAGS = (
    ("max_epochs", "maximum epochs (early stopping ends sooner)", {"type": int}),
    (
        "epoch_tokens",
        "an epoch is at most this many training positions: a longer split is cut into epochs that each "
        "end in validation, a checkpoint and the learning-rate decision, and together make one pass in the "
        "seeded order; --epochs counts them (0 = an epoch is always the whole split)",
        {"type": int},
    ),
    ("batch_size", "examples per SGD step", {"type": int}),
    ("lr", "learning rate per example (gradients are summed over a batch)", {"type": float}),
    ("lr_final", "two-rate schedule: the learning rate after validation perplexity first rises", {"type": float}),
    (
        "lr_schedule",
        "two-rate = the paper's (--lr until validation rises, then --lr-final until it rises again); "
        "halve = multiply the rate by --lr-decay whenever validation gains less than --lr-min-gain, "
        "--lr-decays times, then stop; auto = two-rate where an epoch is a whole pass over the training "
        "split, halve where a longer split is cut into several epochs (--epoch-tokens)",
        {"choices": LR_SCHEDULES},
    ),
    ("lr_decay", "halve schedule: factor per decay", {"type": float}),
    ("lr_decays", "halve schedule: decays before stopping", {"type": int}),
    ("lr_min_gain", "halve schedule: relative validation gain below which the rate decays", {"type": float}),
    (
        "optimizer",
        "momentum = SGD with momentum (the recipe), sgd = plain SGD; adam/adagrad use the torch engine",
        {"choices": OPTIMIZERS},
    ),
    ("momentum", "with --optimizer momentum", {"type": float}),
    ("weight_decay_words", "L2 penalty per example on the word feature vectors R", {"type": float}),
    (
        "weight_decay_other",
        "L2 penalty per example on the other weights (C, node vectors; never biases)",
        {"type": float},
    ),
    (
        "word_rate_power",
        "frequency-scaled rates of the word vectors R: a word rarer than the word at the middle of "
        "the tokens (count c_ref) takes its gradient times min(--word-rate-cap, (c_ref / count) ** "
        "power); 0 = one rate for every word (the recipe)",
        {"type": float},
    ),
    ("word_rate_cap", "the largest multiple of --word-rate-power", {"type": float}),
)


def _recipe_args(t) -> None:
    """How it learns: the training recipe (TrainConfig's defaults)."""
    for field, help, options in _RECIPE_FLAGS:
        setting_arg(t, field, getattr(TrainConfig, field), help, **options)


def _how_to_run_args(t) -> None:
    """How a run is computed (engine, threads, device), its seed and training prefix, and --resume."""
    d = TrainConfig
    setting_arg(
        t,
        "engine",
        d.engine,
        "fast = numba CPU kernels (tree output, SGD/momentum), torch = autograd (GPU, any model); auto picks fast where it applies",
        choices=ENGINES,
    )
    setting_arg(
        t,
        "hogwild",
        d.hogwild,
        "threads of the fast engine; 1 is bit-reproducible, more run lock-free Hogwild steps",
        type=int,
    )
    setting_arg(
        t,
        "sync_every",
        d.sync_every,
        "fast engine under torchrun: each process's steps between two averagings of the rows "
        "the processes touched, or auto: 256 at 10,000 words, growing with the vocabulary to 1,024 "
        "(docs/distributed.md)",
        type=sync_every_arg,
        metavar="STEPS",
    )
    setting_arg(
        t,
        "sync_overlap",
        False,
        "fast engine under torchrun: exchange each round's rows while the next round trains, its "
        "averages applied one round late (for slow links; two more copies of the model in memory)",
        action="store_true",
    )
    setting_arg(t, "seed", d.seed, "initial weights and example order", type=seed_arg)
    t.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    t.add_argument("--threads", type=int, default=None, help="CPU threads (PyTorch and numba)")
    setting_arg(
        t,
        "time_budget",
        None,
        "stop at the first checkpoint after this much training (5400, 90m, 1.5h, 1h30m), report "
        "valid and test as at an early stop; --resume continues the run",
        type=duration_arg,
        metavar="DURATION",
    )
    setting_arg(t, "max_train_tokens", None, "train on this many tokens only", type=int)
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest complete "
        "checkpoint, with its own recipe (run.json); a new run if --out holds none",
    )
    t.add_argument("--quiet", action="store_true", help="no progress bar or epoch lines")

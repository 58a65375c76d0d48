"""``hlbl tree stats|make|build|refine``. The library's tree modules (numpy, torch) are imported by
the commands, not while the parser is built."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import DEFAULT_EM_ITERS, DEFAULT_MAX_LEAVES_PER_WORD
from ..errors import DataError, TreeError
from .common import corpus_args, make_parent, min_count_arg, seed_arg, set_threads, settings


def cmd_tree_stats(args) -> int:
    from ..classes import WordClasses, is_classes_file
    from ..data import load_corpus
    from ..run import read_vocab
    from ..tree import WordTree

    path = Path(args.tree)
    if path.is_dir():  # a run directory: its own tree (and, without --data, its own counts)
        if not (path / "tree.json").is_file():
            raise TreeError(f"{path} is a directory without a tree.json; give a tree file or a run directory")
        path = path / "tree.json"
    tree = WordClasses.load(path) if is_classes_file(path) else WordTree.load(path)
    counts = None
    if args.data:
        corpus = load_corpus(args.data, args.max_vocab, args.min_count, splits=("train",))
        if len(corpus.vocab) != tree.num_words:
            raise TreeError(
                f"{args.tree}: tree has {tree.num_words} words, the corpus vocabulary {len(corpus.vocab)} "
                "(build the vocabulary as for the tree: --min-count / --max-vocab)"
            )
        counts = corpus.vocab.counts
    elif path != Path(args.tree):  # a run directory: its vocabulary's training counts
        counts = read_vocab(path.parent).counts
        if len(counts) != tree.num_words:
            raise TreeError(f"{path}: tree has {tree.num_words} words, the run's vocabulary {len(counts)}")
    print(json.dumps(tree.stats(counts)))
    return 0


def cmd_tree_make(args) -> int:
    from ..data import load_corpus
    from ..tree import build_tree

    corpus = load_corpus(args.data, args.max_vocab, args.min_count, splits=("train",), blank_lines=args.blank_lines)
    tree = build_tree(args.kind, len(corpus.vocab), corpus.vocab.counts, args.seed)
    make_parent(args.out)
    tree.save(args.out)
    print(json.dumps({"out": args.out, **tree.stats(corpus.vocab.counts)}))
    return 0


def _classes_build(args) -> int:
    """Word classes for ``--output classes``: k-means on a trained run's word features (--from),
    or frequency binning of a corpus's training counts (no --from)."""
    import time

    from ..classes import frequency_classes, kmeans_classes
    from ..data import load_corpus
    from ..run import Run
    from ..treebuild import features_from_run

    for flag, value in (("--copies", args.copies), ("--policy", args.policy), ("--em-iters", args.em_iters)):
        if value != tb_defaults[flag]:
            raise DataError(f"{flag} applies to binary trees, not --classes (see --eps and --max-codes)")
    if args.senses:
        raise DataError("--senses applies to binary trees, not --classes (see --eps and --max-codes)")
    if args.max_codes < 1:
        raise DataError(f"--max-codes must be at least 1, got {args.max_codes}")
    t0 = time.perf_counter()
    if args.run is None:
        if args.eps or args.max_codes != 1 or args.weighted:
            raise DataError("--eps, --max-codes and --weighted need word features: give --from RUN")
        if args.data is None:
            raise DataError("give --from RUN (k-means on its word features) or --data (frequency binning)")
        corpus = load_corpus(args.data, args.max_vocab, args.min_count, splits=("train",))
        classes = frequency_classes(corpus.vocab.counts, args.classes, args.shortlist)
        method, n = "frequency", None
    else:
        corpus = Run.open(args.run).corpus(("train",), args.data)
        X, n = features_from_run(args.run, corpus)
        classes = kmeans_classes(
            X,
            args.classes,
            args.seed,
            corpus.vocab.counts,
            args.shortlist,
            eps=args.eps,
            max_codes=args.max_codes,
            weighted=args.weighted,
        )
        method = "kmeans"
    make_parent(args.out)
    classes.save(args.out)
    print(
        json.dumps(
            {
                "out": args.out,
                "method": method,
                "seconds": round(time.perf_counter() - t0, 2),
                **({"unseen_words": int((n == 0).sum())} if n is not None else {}),
                **classes.stats(corpus.vocab.counts),
            }
        )
    )
    return 0


def cmd_tree_build(args) -> int:
    """A learned tree (the paper's Section 5) from the word features of a trained run."""
    import time

    import numpy as np

    from ..run import Run
    from ..treebuild import (
        BuildReport,
        SenseReport,
        build_tree_from_features,
        features_from_run,
        parse_policy,
        sense_features,
        tree_over_items,
    )

    set_threads(args.threads)
    if args.classes is not None:
        return _classes_build(args)
    for flag, value in (("--shortlist", args.shortlist), ("--eps", args.eps), ("--max-codes", args.max_codes)):
        if value != tb_defaults[flag]:
            raise DataError(f"{flag} applies to --classes only")
    if args.run is None:
        raise DataError("--from RUN is needed (a learned tree is built from a trained run's word features)")
    if args.max_leaves_per_word is not None and not args.max_leaves_per_word >= 1:
        raise DataError(
            f"--max-leaves-per-word must be at least 1 (every word has a leaf), got {args.max_leaves_per_word}"
        )
    parse_policy(args.policy)  # fail on a bad policy before the feature pass
    run = Run.open(args.run)
    corpus = run.corpus(("train",), args.data)
    t0 = time.perf_counter()
    X, n = features_from_run(args.run, corpus)
    senses = SenseReport()
    item_word = None
    if args.senses:  # up to two vectors per frequent word; the tree is built over these items
        model = run.model()
        X, item_word = sense_features(
            model,
            corpus["train"],
            corpus.vocab.eos,
            min_count=args.sense_min_count,
            seed=args.seed,
            report=senses,
            features=(X, n),
        )
    t1 = time.perf_counter()
    if (n == 0).mean() > 0.5:
        print(
            f"hlbl: warning: {int((n == 0).sum()):,} of {len(n):,} words never occur as a target in the training "
            "text, so they share one feature vector (the overall mean): is --data the run's corpus?",
            file=sys.stderr,
        )
    rep = BuildReport()
    tree = build_tree_from_features(
        X,
        args.policy,
        args.seed,
        args.copies,
        args.em_iters,
        weights=(
            None if not args.weighted else np.asarray(corpus.vocab.counts)[item_word if args.senses else slice(None)]
        ),
        max_leaves=None if args.max_leaves_per_word is None else int(args.max_leaves_per_word * len(X)),
        report=rep,
    )
    if args.senses:
        tree = tree_over_items(tree, item_word, len(corpus.vocab))
    make_parent(args.out)
    tree.save(args.out)
    print(
        json.dumps(
            {
                "out": args.out,
                "feature_seconds": round(t1 - t0, 2),
                "build_seconds": round(time.perf_counter() - t1, 2),
                "unseen_words": int((n == 0).sum()),
                **rep.to_json(),
                **(senses.to_json() if args.senses else {}),
                **tree.stats(corpus.vocab.counts),
            }
        )
    )
    return 0


def cmd_tree_refine(args) -> int:
    """Exchange moves on a class model's own objective (:mod:`hlbl.refine`): writes the refined
    classes; train on them with ``--init-from RUN --keep-output``."""
    import time

    from ..refine import RefineConfig, refine_classes
    from ..run import Run

    set_threads(args.threads)
    try:
        cfg = settings(RefineConfig, args)
    except ValueError as e:
        raise DataError(str(e)) from None
    t0 = time.perf_counter()
    run = Run.open(args.run)
    model = run.model()
    if model.config.output != "classes":
        raise DataError(
            f"--from {args.run}: exchange moves need a run with --output classes, not {model.config.output}"
        )
    corpus = run.corpus(("train",), args.data)
    train = corpus["train"]
    try:
        sweep, history = refine_classes(
            model, train, corpus.vocab.eos, cfg, args.sweeps, log=lambda msg: print(msg, file=sys.stderr)
        )
    except ValueError as e:
        raise DataError(str(e)) from None
    make_parent(args.out)
    sweep.classes.save(args.out)
    gains = [m.gain for m in sweep.moves]
    print(
        json.dumps(
            {
                "out": args.out,
                "moves": len(sweep.moves),
                "positive_last_sweep": sweep.positive,
                "sweeps": history,
                "estimated_gain_nats": round(float(sum(gains)), 3),
                "estimated_gain_per_token": float(sum(gains)) / max(len(train), 1),
                "sampled_positions": sweep.sampled,
                "seconds": round(time.perf_counter() - t0, 2),
                **sweep.classes.stats(corpus.vocab.counts),
            }
        )
    )
    return 0


tb_defaults = {
    "--copies": 1,
    "--policy": "adaptive",
    "--em-iters": DEFAULT_EM_ITERS,
    "--shortlist": 0,
    "--eps": 0.0,
    "--max-codes": 1,
}


def add_commands(sub) -> None:
    tr = sub.add_parser("tree", help="word trees: statistics, builders")
    tsub = tr.add_subparsers(dest="tree_command", required=True)
    _add_stats(tsub)
    _add_make(tsub)
    _add_build(tsub)
    _add_refine(tsub)


def _add_stats(tsub) -> None:
    ts = tsub.add_parser(
        "stats",
        help="Table 1 statistics of a tree, or sizes of word classes (one JSON line)",
        description="Fields: words (V); internal_nodes; leaves (codes in all); codes_per_word and "
        "mean_code_length (the summed length of a word's codes), averaged by training counts with a corpus "
        "or run, else uniformly (weighting); max_depth, the longest code of the tree (a joined xK tree's top "
        "nodes included). hlbl tree build adds levels, its splitting rounds summed over the copies (not a "
        "depth). Word classes: shortlist, classes, largest_class, mean_scores_per_word. See docs/reproduction.md.",
    )
    ts.add_argument("tree", help="tree file (JSON or npz), or a run directory (its tree and training counts)")
    ts.add_argument("--data", default=None, help="corpus whose training counts weight the averages")
    ts.add_argument("--max-vocab", type=int, default=None, help="as for hlbl train")
    ts.add_argument("--min-count", type=min_count_arg, default="auto", help="as for hlbl train")
    ts.set_defaults(func=cmd_tree_stats)


def _add_make(tsub) -> None:
    tm = tsub.add_parser("make", help="build a RANDOM or Huffman tree for a corpus")
    corpus_args(tm)
    tm.add_argument(
        "--kind",
        choices=("random", "huffman"),
        default="random",
        help="random permutation halved recursively, or Huffman codes from the training counts",
    )
    tm.add_argument("--seed", type=seed_arg, default=0, help="the random tree's permutation")
    tm.add_argument("--out", required=True, help="tree file (.json or .npz)")
    tm.set_defaults(func=cmd_tree_make)


def _add_build(tsub) -> None:
    tb = tsub.add_parser(
        "build",
        help="learned tree from a trained run's word features (paper, Section 5), or word classes (--classes)",
    )
    tb.add_argument(
        "--from",
        dest="run",
        default=None,
        help="run directory of a trained model (normally HLBL on a RANDOM tree); needed except for "
        "--classes by frequency binning",
    )
    tb.add_argument(
        "--policy", default=tb_defaults["--policy"], help="balanced, adaptive, or adaptive:EPS (e.g. adaptive:0.4)"
    )
    tb.add_argument(
        "--copies",
        type=int,
        default=tb_defaults["--copies"],
        help="K trees from different seeds joined under new top nodes (xK)",
    )
    tb.add_argument("--seed", type=seed_arg, default=0, help="EM initialisation (trees differ run to run)")
    tb.add_argument("--em-iters", type=int, default=tb_defaults["--em-iters"], help="EM iterations per split")
    tb.add_argument("--weighted", action="store_true", help="weight words by training frequency in the EM")
    tb.add_argument(
        "--max-leaves-per-word",
        type=float,
        default=None,
        help=f"leaf budget per tree, in units of V (default {DEFAULT_MAX_LEAVES_PER_WORD}): caps leaves/words "
        "at copies x this; give the previous bootstrap round's leaves / (copies x words) to hold the tree's size",
    )
    tb.add_argument(
        "--senses",
        action="store_true",
        help="give each frequent word whose contexts form two groups two feature vectors (2-means over its "
        "occurrences), so that it can get codes in two parts of the tree",
    )
    tb.add_argument(
        "--sense-min-count", type=int, default=100, help="with --senses: occurrences a word needs to be split"
    )
    tb.add_argument(
        "--classes",
        type=int,
        default=None,
        help="build word classes for --output classes instead of a binary tree: C classes, by k-means on the word features of --from, or without --from by frequency "
        "binning of --data's training counts. Start at about sqrt(V) (100 for 10,000 words): a word's step then "
        "scores fewest entries (C + V/C); fewer or more classes cost time per word (on PTB C = 50 and 30 "
        "trained slower than 100). See docs/classes.md, 'How many classes'",
    )
    tb.add_argument(
        "--shortlist",
        type=int,
        default=tb_defaults["--shortlist"],
        help="--classes: the S most frequent words go directly under the root (default 0)",
    )
    tb.add_argument(
        "--eps",
        type=float,
        default=tb_defaults["--eps"],
        help="--classes: a word also joins each next-nearest class whose mixture responsibility is at least "
        "this (several memberships; with --max-codes > 1)",
    )
    tb.add_argument(
        "--max-codes",
        type=int,
        default=tb_defaults["--max-codes"],
        help="--classes: most classes a word may join (default 1)",
    )
    tb.add_argument("--max-vocab", type=int, default=None, help="--classes without --from: as for hlbl train")
    tb.add_argument(
        "--min-count", type=min_count_arg, default="auto", help="--classes without --from: as for hlbl train"
    )
    tb.add_argument("--data", default=None, help="corpus (default: the one the run was trained on)")
    tb.add_argument("--threads", type=int, default=None, help="CPU threads")
    tb.add_argument("--out", required=True, help="tree file (.json or .npz), or word classes file (.json)")
    tb.set_defaults(func=cmd_tree_build)


def _add_refine(tsub) -> None:
    tf = tsub.add_parser(
        "refine",
        help="exchange moves: move words between the classes of a trained --output classes run where that "
        "lowers its training NLL (then train with --init-from RUN --keep-output)",
    )
    tf.add_argument("--from", dest="run", required=True, help="run directory of a model with --output classes")
    tf.add_argument(
        "--per-word", type=int, default=256, help="occurrences sampled per word; rarer words use all (default 256)"
    )
    tf.add_argument(
        "--sigmas",
        type=float,
        default=2.0,
        help="rank moves by their estimated gain less this many standard errors of the sampling (default 2)",
    )
    tf.add_argument("--candidates", type=int, default=4, help="classes each membership is scored against (default 4)")
    tf.add_argument(
        "--max-moves", type=float, default=0.05, help="most moves, as a share of the class memberships (default 0.05)"
    )
    tf.add_argument(
        "--into-class",
        type=int,
        default=1,
        help="most moves into one class in a sweep (moves into one class interact; default 1)",
    )
    tf.add_argument(
        "--sweeps", type=int, default=1, help="sweeps of moves, each on the classes after the last (default 1)"
    )
    tf.add_argument("--seed", type=seed_arg, default=0, help="the sampling of occurrences (sweep k uses seed + k)")
    tf.add_argument("--data", default=None, help="corpus (default: the one the run was trained on)")
    tf.add_argument("--threads", type=int, default=None, help="CPU threads")
    tf.add_argument("--out", required=True, help="word classes file (.json)")
    tf.set_defaults(func=cmd_tree_refine)

"""``hlbl reproduce``: the paper's Tables 1 and 3."""

from __future__ import annotations

import json
import sys

from ..config import ReproConfig
from .common import DATA_HELP, seed_arg, set_threads, settings


def _reproduce_command(args) -> str:
    """The command line with every option that shapes the results spelled out (defaults included), for
    the tables (not ``--work``: where checkpoints go changes no result, and it is often a machine path)."""
    parts = ["hlbl reproduce"]
    for k in (
        "data",
        "out",
        "epochs",
        "flat_epochs",
        "dim",
        "seed",
        "threads",
        "max_train_tokens",
        "max_vocab",
        "em_iters",
        "skip",
    ):
        v = getattr(args, k)
        if v is not None:
            parts.append(f"--{k.replace('_', '-')} {v}")
    return " ".join(parts + (["--quick"] if args.quick else []))


def cmd_reproduce(args) -> int:
    from ..reproduce import reproduce

    set_threads(args.threads)
    skip = tuple(x for x in (args.skip or "").split(",") if x)
    cfg = settings(ReproConfig, args, skip=skip, command=_reproduce_command(args))
    log = (lambda *a: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    res = reproduce(cfg, log)
    print(
        json.dumps(
            {
                "out": res["out"],
                "rows": [{k: r.get(k) for k in ("model", "tree", "test_perplexity")} for r in res["rows"]],
            }
        )
    )
    return 0


def add_commands(sub) -> None:
    rp = sub.add_parser("reproduce", help="the paper's Tables 1 and 3 on a corpus, resumable")
    rp.add_argument("--data", default="ptb", help=DATA_HELP)
    rp.add_argument(
        "--out",
        default=None,
        help="tables, plot, results.json (default results/NAME, NAME the corpus's; --quick: in its --work)",
    )
    rp.add_argument(
        "--work",
        default=None,
        help="checkpoints, features, trees, ~300 MB for PTB (default: runs/reproduce-NAME, -quick added for --quick)",
    )
    rp.add_argument(
        "--epochs",
        type=int,
        default=ReproConfig.epochs,
        help="epoch cap of every HLBL run (early stopping ends sooner)",
    )
    rp.add_argument(
        "--flat-epochs",
        type=int,
        default=ReproConfig.flat_epochs,
        help="epoch cap of the flat LBL, ~4 min an epoch on PTB (0 = skip it)",
    )
    rp.add_argument("--dim", type=int, default=ReproConfig.dim, help="feature vector size")
    rp.add_argument(
        "--seed", type=seed_arg, default=ReproConfig.seed, help="initial weights, example order, tree seeds"
    )
    rp.add_argument("--threads", type=int, default=None, help="CPU threads (PyTorch and numba)")
    rp.add_argument("--max-train-tokens", type=int, default=None, help="train on this many tokens only")
    rp.add_argument("--em-iters", type=int, default=ReproConfig.em_iters, help="EM iterations per split")
    rp.add_argument("--max-vocab", type=int, default=None, help="keep at most this many word types")
    rp.add_argument("--skip", default=None, help="comma-separated steps to leave out: T2..T7, flat, KN5")
    rp.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 2000 words, 3000 training tokens, 5000 eval tokens, 16-d, 2 epochs (1 flat)",
    )
    rp.add_argument("--quiet", action="store_true", help="no progress lines")
    rp.set_defaults(func=cmd_reproduce)

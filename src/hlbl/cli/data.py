"""``hlbl data split FILE``: one text file in, a corpus directory (train/valid/test by line) out.

The library is :mod:`hlbl.data.split`; numpy is imported by the command, not while the parser is built.
"""

from __future__ import annotations

import argparse
import math

from ..config import SPLIT_SEED as SEED
from ..config import SPLIT_TEST as TEST
from ..config import SPLIT_VALID as VALID


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value < 1):
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}")
    return value


def cmd_data_split(args) -> int:
    from ..data import default_cache_dir
    from ..data.split import split_file

    split = split_file(args.file, default_cache_dir(), args.valid, args.test, args.seed)
    print(split.root)  # stdout: the directory alone, for --data "$(hlbl data split FILE)"
    return 0


def add_commands(sub) -> None:
    d = sub.add_parser("data", help="corpora from your own text")
    dsub = d.add_subparsers(dest="data_command", required=True)
    s = dsub.add_parser(
        "split",
        help="split one text file by line into a corpus (train.txt, valid.txt, test.txt)",
        description="Every line goes to exactly one split (order kept within each): about --valid and --test "
        "of the lines, chosen by --seed, to valid.txt and test.txt, the rest to train.txt. The corpus is "
        "cached ($HLBL_CACHE/splits/) and its directory printed on stdout; --data FILE on other commands "
        "makes the same split with the default fractions and seed. See docs/data.md.",
    )
    s.add_argument("file", help="UTF-8 text, one sentence a line")
    s.add_argument("--valid", type=_fraction, default=VALID, help=f"fraction of lines for valid.txt (default {VALID})")
    s.add_argument("--test", type=_fraction, default=TEST, help=f"fraction of lines for test.txt (default {TEST})")
    s.add_argument("--seed", type=int, default=SEED, help=f"which lines go where (default {SEED})")
    s.set_defaults(func=cmd_data_split)

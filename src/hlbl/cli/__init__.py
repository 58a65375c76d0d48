"""The ``hlbl`` command line: a thin layer over the library.

Each command is a small function; ``build_parser`` is the one place commands are registered.
User errors (bad data, trees, checkpoints, arguments) print one line and exit with status 2.
"""

from __future__ import annotations

import os
import sys

from ..errors import HlblError
from . import infer, reproduce, serve, train, tree
from .common import Parser

USER_ERRORS = (HlblError, FloatingPointError)


def build_parser() -> Parser:
    p = Parser(prog="hlbl", description="Hierarchical log-bilinear language models.")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (train, tree, reproduce, infer, serve):
        group.add_commands(sub)
    from ..ngram import add_subcommands as add_ngram_commands  # hlbl ngram train|eval

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

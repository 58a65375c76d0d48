"""The ``hlbl`` command line: a thin layer over the library.

Each command is a small function; ``build_parser`` is the one place commands are registered.
User errors (bad data, trees, checkpoints, arguments) print one line and exit with status 2; a
setting the library refuses (:class:`~hlbl.errors.ConfigError`) is named by its flag.

Building the parser imports no torch, numpy or numba: each command imports what it needs when it
runs, so that ``hlbl --help`` and an argument error answer at once.
"""

from __future__ import annotations

import logging
import os
import sys

from .._version import __version__
from ..errors import HlblError
from . import eval as eval_cmd
from . import data, infer, ngram, reproduce, serve, train, tree
from . import rank as rank_cmd
from .common import Parser, flag_message

USER_ERRORS = (HlblError, FloatingPointError)


def show_library_log(quiet: bool = False) -> None:
    """The library's ``hlbl`` logger to stderr, message text only (as the commands print their own lines)."""
    logger = logging.getLogger("hlbl")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is at the time of each message."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


def build_parser() -> Parser:
    p = Parser(prog="hlbl", description="Hierarchical log-bilinear language models.")
    p.add_argument("--version", action="version", version=f"hlbl {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for group in (train, eval_cmd, tree, reproduce, infer, serve, data):
        group.add_commands(sub)
    ngram.add_subcommands(sub)  # hlbl ngram train|eval
    rank_cmd.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    show_library_log(getattr(args, "quiet", False))
    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"hlbl: error: {flag_message(e)}", file=sys.stderr)
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

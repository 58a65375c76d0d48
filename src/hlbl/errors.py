"""The library's errors. Each message is one line meant for a person, and names the file, field or
value at fault; the CLI prints it as ``hlbl: error: MESSAGE`` and exits with status 2.

Catch :class:`HlblError` to handle every error the library raises on purpose. Each subclass also
derives from the built-in exception it refines (``ValueError``, ``RuntimeError``), so code written
against those keeps working.

Messages name settings as the library's parameters (``max_vocab``, ``engine 'fast'``), never as
command-line flags: the command line names its own flags (see :class:`ConfigError`).
"""

from __future__ import annotations


class HlblError(Exception):
    """Base of every error hlbl raises for bad input, files or settings."""


class DataError(HlblError, ValueError):
    """Bad corpus input or a bad argument value."""


class ConfigError(HlblError, ValueError):
    """A model, training or pipeline setting out of range or inconsistent with another.

    ``field`` is the setting at fault (``"max_vocab"``), or None where no one setting is; the
    message names it, mostly first, so that a front end can put its own name for the setting there
    (the CLI: ``--max-vocab must be at least 2 ...``).
    """

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field

    def __reduce__(self):  # pickled across processes (torchrun, worker pools) with both arguments
        return type(self), (self.field, str(self))


class TreeError(HlblError, ValueError):
    """An invalid tree or tree file; the message names the offending node or word."""


class CheckpointError(HlblError, RuntimeError):
    """A run directory or checkpoint file that cannot be used."""

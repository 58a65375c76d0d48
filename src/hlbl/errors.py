"""The library's errors. Each message is one line meant for a person, and names the file, field or
value at fault; the CLI prints it as ``hlbl: error: MESSAGE`` and exits with status 2.

Catch :class:`HlblError` to handle every error the library raises on purpose. Each subclass also
derives from the built-in exception it refines (``ValueError``, ``RuntimeError``), so code written
against those keeps working.
"""

from __future__ import annotations


class HlblError(Exception):
    """Base of every error hlbl raises for bad input, files or settings.

    Messages name settings as the library's parameters (``max_vocab``, ``engine='fast'``), never
    as command-line flags; ``field``, when set, is the parameter the message starts with, so that
    the CLI can name its flag instead.
    """

    def __init__(self, *args, field: str | None = None):
        super().__init__(*args)
        self.field = field


class DataError(HlblError, ValueError):
    """Bad corpus input or a bad argument value."""


class ConfigError(DataError):
    """A model or training setting out of range or inconsistent with another."""


class TreeError(HlblError, ValueError):
    """An invalid tree or tree file; the message names the offending node or word."""


class CheckpointError(HlblError, RuntimeError):
    """A run directory or checkpoint file that cannot be used."""

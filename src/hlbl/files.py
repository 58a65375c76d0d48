"""A check made before a file a user names is opened for reading.

A named pipe (FIFO) opened for reading waits for a writer, forever if none comes, and a device
such as ``/dev/zero`` never ends: the readers of tree, classes, ARPA and JSON files refuse anything
but a regular file (or a link to one) with one line, before they open it.
"""

from __future__ import annotations

import hashlib
import os
import stat

from .errors import DataError, HlblError


def refuse_special(path: str | os.PathLike, error: type[HlblError], what: str) -> None:
    """Raise ``error`` if ``path`` exists and is neither a regular file nor a directory (those, and
    a missing path, are left to the reader, whose messages say more)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, unreadable, a bad name: the reader says which
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise error(f"{path}: not a regular file ({kind}), expected {what}")


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in blocks: what names a corpus file in the cache, an n-gram
    model or a run's weights (a path, size and timestamp would miss a file replaced in place).
    Anything but a regular file is refused (a named pipe would block, a device never end)."""
    refuse_special(path, DataError, "a file")
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    return h.hexdigest()

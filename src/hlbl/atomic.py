"""Atomic file writes: every file hlbl writes appears whole or not at all.

``with atomic_path(dest) as tmp:`` writes to ``tmp`` (a fresh file beside ``dest``), then flushes
it to disk, gives it the permissions a plain ``open`` would (``0666`` less the umask:
:func:`tempfile.mkstemp` makes ``0600`` files, which other users could not read) and renames it
over ``dest``. If the body raises, the temporary file is removed and ``dest`` is untouched.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _umask() -> int:
    mask = os.umask(0)  # the only portable way to read it; restored at once
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[str]:
    """The name of a temporary file to write; renamed to ``dest`` when the block ends cleanly."""
    dest = Path(dest)
    try:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    except OSError as e:  # name the file the caller asked for, not the temporary one
        raise OSError(e.errno, f"cannot write {dest}: {e.strerror}") from None
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes(dest: str | os.PathLike, data: bytes) -> None:
    with atomic_path(dest) as tmp, open(tmp, "wb") as f:
        f.write(data)


def write_text(dest: str | os.PathLike, text: str) -> None:
    write_bytes(dest, text.encode("utf-8"))

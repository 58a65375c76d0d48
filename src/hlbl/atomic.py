"""Atomic file writes: every file hlbl writes appears whole or not at all.

``with atomic_path(dest) as tmp:`` writes to ``tmp`` (a fresh file beside ``dest``), then flushes
it to disk, gives it the permissions a plain ``open`` would (``0666`` less the umask:
:func:`tempfile.mkstemp` makes ``0600`` files, which other users could not read) and renames it
over ``dest`` (and syncs the directory, so the rename survives a crash). If the body raises, the
temporary file is removed and ``dest`` is untouched.

Only a regular file is ever replaced: an existing ``dest`` that is a device, a named pipe or a
socket (``/dev/null``, ``/dev/full``, a FIFO) is refused with one line before anything is written
(and checked again just before the rename), since renaming over it would put a file in its place
(as root, every later ``> /dev/null`` on the machine would write into it). A symbolic link is
written through: its target is replaced and the link stays.

Crash tests: every step of a write calls :func:`fault_point`. With ``HLBL_TEST_CRASH_AFTER=N`` in
the environment the process ends at its Nth step with ``os._exit`` (no ``finally`` blocks, no
buffers flushed: what kill -9 or a power cut leaves, up to the page cache); with
``HLBL_TEST_PAUSE_AFTER=N`` it prints ``hlbl-test: paused at file operation N`` to stderr and
sleeps there, for a test to kill it with a real signal. Unset, the hook costs one dictionary lookup.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


CRASH_EXIT_STATUS = 86  # the status fault_point's os._exit gives (tests tell it from real errors)
_ops = [0]  # file operations so far in this process (the counter the hooks test against)


def fault_point(what: str = "") -> None:
    """One step of a file write (see the module docstring): a no-op unless a crash test set a hook."""
    _ops[0] += 1
    crash, pause = os.environ.get("HLBL_TEST_CRASH_AFTER"), os.environ.get("HLBL_TEST_PAUSE_AFTER")
    if crash and _ops[0] >= int(crash):
        os._exit(CRASH_EXIT_STATUS)
    if pause and _ops[0] == int(pause):
        os.write(2, f"hlbl-test: paused at file operation {_ops[0]} ({what})\n".encode())
        while True:
            time.sleep(60)


def file_operations() -> int:
    """How many :func:`fault_point` steps this process has taken (crash tests size their sweep with it)."""
    return _ops[0]


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a just-written file to disk."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def plain_mode() -> int:
    """The permissions a plain ``open`` gives a new file (0666 less the umask)."""
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read from /proc where possible: ``os.umask`` can only read it by setting
    it, which for an instant would give files another thread creates the permissions 0666."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def sync_dir(path: str | os.PathLike) -> None:
    """Make the renames and removals in directory ``path`` durable."""
    _sync_dir(Path(path))


def _sync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort: not every system can open a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def output_path(dest: str | os.PathLike) -> Path:
    """The file a write to ``dest`` replaces: ``dest``, or the target of the link ``dest`` is.
    Raises OSError (one line naming ``dest``) if that exists and is not a regular file or a directory
    (a directory is left to the rename, whose error names it)."""
    dest = Path(dest)
    real = Path(os.path.realpath(dest)) if os.path.islink(dest) else dest
    try:
        mode = os.stat(real).st_mode
    except OSError:  # missing (a new file), or unreachable: the write says which
        return real
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise OSError(errno.EEXIST, f"cannot write {dest}: not a regular file ({kind}); name a file to write")
    return real


@contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[str]:
    """The name of a temporary file to write; renamed to ``dest`` when the block ends cleanly
    (``dest``'s target where it is a symbolic link; a path that is not a regular file is refused)."""
    asked = Path(dest)
    dest = output_path(asked)
    try:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".tmp")
    except OSError as e:  # name the file the caller asked for, not the temporary one
        raise OSError(e.errno, f"cannot write {asked}: {e.strerror}") from None
    os.close(fd)
    try:
        fault_point(f"create {tmp}")
        yield tmp
        fault_point(f"write {tmp}")
        try:
            fsync_path(tmp)
            fault_point(f"fsync {tmp}")
            os.chmod(tmp, 0o666 & ~_umask())
            output_path(asked)  # (again: the path may have become a device or pipe meanwhile)
            os.replace(tmp, dest)
        except OSError as e:  # e.g. dest is a directory: name dest, not the temporary file
            if e.strerror and e.strerror.startswith("cannot write"):
                raise
            raise OSError(e.errno, f"cannot write {asked}: {e.strerror}") from None
        fault_point(f"rename {dest}")
        _sync_dir(dest.parent)
        fault_point(f"fsync {dest.parent}")
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes(dest: str | os.PathLike, data: bytes) -> None:
    with atomic_path(dest) as tmp, open(tmp, "wb") as f:
        f.write(data)


def write_text(dest: str | os.PathLike, text: str) -> None:
    write_bytes(dest, text.encode("utf-8"))


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) and SIGTERM until the block ends, for files that only make sense
    together (an epoch's checkpoint: each is atomic, the group is not). A signal that arrives
    meanwhile acts when the block ends. Handlers can only be set from the main thread; elsewhere
    the block runs unprotected."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in sigs}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        # Now with their usual effect, SIGTERM first (KeyboardInterrupt, for SIGINT, ends the loop).
        for s in sorted(set(held), key=lambda s: s != signal.SIGTERM):
            signal.raise_signal(s)


@contextmanager
def exclusive_directory(path: str | os.PathLike, what: str = "another process") -> Iterator[None]:
    """Hold an advisory lock on directory ``path`` (created if missing) for the block; a second
    holder, in this or another process, gets BlockingIOError at once instead of waiting. Two
    trainings writing one run directory would interleave their checkpoints. The lock goes with
    the process (no stale lock file after a crash); where ``fcntl`` is missing (Windows) there is
    none."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BlockingIOError(f"{path} is in use by {what}") from None
        yield
    finally:
        os.close(fd)

"""One text file in, a corpus out: a deterministic train/valid/test split by line.

``hlbl data split FILE`` and ``--data FILE`` (a file where a corpus directory is expected) call
:func:`split_file`. Every line of the file (blank lines too: the blank-line protocol applies when
the splits are read) goes to exactly one split, in the file's order within each split:

- ``round(valid * L)`` lines go to ``valid.txt`` and ``round(test * L)`` to ``test.txt`` (at least
  one each), the rest to ``train.txt``; by default 10% and 10% (:data:`VALID`, :data:`TEST`);
- which lines: line ``i`` (from 0) gets the key :func:`line_keys` (output ``i + 1`` of splitmix64
  seeded with ``seed * 2**32``); the lines of the smallest keys are valid, the next ones test.
  The keys are this module's own arithmetic (not a library's random stream, whose sequence may
  change between versions), so a seed gives the same split everywhere.

The text is read as the corpus rules read it (UTF-8, a leading byte-order mark dropped, ``\\n``,
``\\r\\n`` or ``\\r`` line endings) and written with ``\\n`` endings. The splits are cached like
encoded corpora: ``$HLBL_CACHE/splits/STEM-KEY/`` holds ``train.txt``, ``valid.txt``,
``test.txt`` and ``split.json`` (what was split and how), the key being a hash of the file's
SHA-256, the fractions, the seed and :data:`SPLIT_VERSION`; a second call finds them there.
Memory: about 17 bytes a line (a key, its rank and a label) while the split is drawn; the text
is read a line at a time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import atomic
from ..config import SPLIT_SEED, SPLIT_TEST, SPLIT_VALID
from ..errors import DataError
from ..files import file_sha256, refuse_special
from .vocab import first_bad_byte

logger = logging.getLogger(__name__)

SPLIT_FORMAT = "hlbl-split"
SPLIT_VERSION = 1  # part of the cache key: raise it when the same file and settings would split differently
VALID, TEST, SEED = SPLIT_VALID, SPLIT_TEST, SPLIT_SEED  # the defaults: fractions of lines in valid.txt, test.txt
NAMES = ("train", "valid", "test")


@dataclass(frozen=True)
class Split:
    """A split made (or found in the cache): its directory and the number of lines of each split."""

    root: Path
    lines: dict[str, int]
    reused: bool


def line_keys(n: int, seed: int) -> np.ndarray:
    """``(n,)`` uint64: for line ``i``, output ``i + 1`` of splitmix64 seeded with ``seed * 2**32``
    (Steele, Lea and Flood 2014; seeded with 0 it starts 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4)."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64 on purpose
        x = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64((seed << 32) % (1 << 64))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def split_counts(n: int, valid: float = VALID, test: float = TEST) -> dict[str, int]:
    """How many of ``n`` lines each split gets (at least one each)."""
    for name, f in (("valid", valid), ("test", test)):
        if not 0 < f < 1:
            raise DataError(f"the {name} fraction must be between 0 and 1, got {f}")
    if valid + test >= 1:
        raise DataError(f"the valid and test fractions leave no training lines ({valid} + {test} >= 1)")
    nv, nt = max(1, round(valid * n)), max(1, round(test * n))
    if n - nv - nt < 1:
        raise DataError(f"{n} line(s): too few to split (train, valid and test need one line each at least)")
    return {"train": n - nv - nt, "valid": nv, "test": nt}


def assign_lines(n: int, valid: float = VALID, test: float = TEST, seed: int = SEED) -> np.ndarray:
    """``(n,)`` uint8: the split of each line (0 train, 1 valid, 2 test), as the module docstring says."""
    counts = split_counts(n, valid, test)
    order = np.argsort(line_keys(n, seed), kind="stable")
    label = np.zeros(n, np.uint8)
    label[order[: counts["valid"]]] = 1
    label[order[counts["valid"] : counts["valid"] + counts["test"]]] = 2
    return label


def _open_text(path: Path):
    return open(path, encoding="utf-8-sig", newline=None)  # the corpus rules (hlbl.data.vocab)


def count_lines(path: Path) -> int:
    """Lines of ``path`` as the corpus rules read them; one-line errors for what is not such text."""
    n = 0
    try:
        with _open_text(path) as f:
            for n, line in enumerate(f, 1):
                if "\0" in line:
                    raise DataError(
                        f"{path}: binary data (a NUL byte on line {n}); expected UTF-8 text, a sentence a line"
                    )
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text ({first_bad_byte(path)})") from None
    if n == 0:
        raise DataError(f"{path}: the file is empty; expected UTF-8 text, a sentence a line")
    return n


def _check_file(path: Path) -> None:
    refuse_special(path, DataError, "a text file")
    if path.is_dir():
        raise DataError(f"{path} is a directory; hlbl data split takes one text file (a directory is a corpus already)")
    if not path.exists():
        raise DataError(f"{path}: no such file")


def split_dir(path: Path, sha256: str, valid: float, test: float, seed: int, cache_dir: Path) -> Path:
    """Where the split of this file with these settings lives in the cache."""
    key = hashlib.sha1(json.dumps([SPLIT_VERSION, sha256, valid, test, seed]).encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", path.stem)[:40] or "text"
    return Path(cache_dir) / "splits" / f"{stem}-{key}"


def _cached(root: Path, sha256: str) -> dict[str, int] | None:
    """The line counts of a complete split in ``root`` (its split.json agrees with its files), else None."""
    try:
        meta = json.loads((root / "split.json").read_text(encoding="utf-8"))
        ok = (
            meta["format"] == SPLIT_FORMAT
            and meta["version"] == SPLIT_VERSION
            and meta["sha256"] == sha256
            and all((root / f"{s}.txt").stat().st_size == meta["bytes"][s] for s in NAMES)
        )
        return {s: int(meta["lines"][s]) for s in NAMES} if ok else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def split_file(
    path: str | os.PathLike, cache_dir: str | os.PathLike, valid: float = VALID, test: float = TEST, seed: int = SEED
) -> Split:
    """Split the lines of ``path`` into ``train.txt``, ``valid.txt`` and ``test.txt`` (the module
    docstring), in ``cache_dir``'s ``splits/`` unless a split of the same text and settings is there."""
    path = Path(path)
    _check_file(path)
    split_counts(3, valid, test)  # the fractions checked before the file is read
    sha256 = file_sha256(path)
    root = split_dir(path, sha256, valid, test, seed, Path(cache_dir))
    found = _cached(root, sha256)
    if found is not None:
        logger.debug("%s: using its split in %s", path, root)
        return Split(root, found, True)
    n = count_lines(path)
    label = assign_lines(n, valid, test, seed)
    lines = {s: int(np.count_nonzero(label == i)) for i, s in enumerate(NAMES)}
    try:
        root.mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:  # the three files appear together, or none of them
            tmps = [stack.enter_context(atomic.atomic_path(root / f"{s}.txt")) for s in NAMES]
            outs = [stack.enter_context(open(t, "w", encoding="utf-8", newline="\n")) for t in tmps]
            i = -1
            with _open_text(path) as f:
                for i, line in enumerate(f):
                    if i >= n:
                        break
                    out = outs[label[i]]
                    out.write(line)
                    if not line.endswith("\n"):
                        out.write("\n")
            if i + 1 != n:
                raise DataError(f"{path} changed while it was being split; run again")
        meta = {
            "format": SPLIT_FORMAT,
            "version": SPLIT_VERSION,
            "source": str(path.resolve()),
            "sha256": sha256,
            "valid": valid,
            "test": test,
            "seed": seed,
            "lines": lines,
            "bytes": {s: (root / f"{s}.txt").stat().st_size for s in NAMES},
        }
        atomic.write_text(root / "split.json", json.dumps(meta, indent=1) + "\n")
    except OSError as e:
        raise DataError(
            f"cannot write the split of {path} in {root}: {e.strerror or e}; free space there or set "
            "HLBL_CACHE to another directory"
        ) from None
    logger.info(
        "%s: split into %s (%s lines of train, %s valid, %s test)",
        path,
        root,
        *(f"{lines[s]:,}" for s in NAMES),
    )
    return Split(root, lines, False)

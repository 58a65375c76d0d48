"""A training file read and turned into provisional ids on every core: the parallel half of
:func:`hlbl.data.corpus.scan_file`, with exactly its result.

The file is cut into byte ranges that end just after a ``\\n`` (so no line, no ``\\r\\n`` and no
multibyte UTF-8 character is split; a file whose lines end in lone ``\\r`` has no cut and is read
whole by one worker). Each worker reads its range by the text rules of
:func:`hlbl.data.vocab.iter_sentences` (same splitting, long lines cut by ``line_pieces``, blank lines
dropped or kept) and writes the range as *local* ids: its words numbered in order of first
appearance within the range, ``<eos>`` = 0, beside their counts. The parent then numbers the words
of range 1, 2, ... in that order: that is the order of first appearance in the whole file, the
single pass's provisional ids, so a lookup table per range turns local ids into them; the ranges'
ids are mapped and concatenated in order.

Why processes, and plain child interpreters (``python -m hlbl.data.scan``, one per range): the
work is ``str.split`` and dictionary lookups, which hold the GIL, so threads would take turns on
one core (CPython 3.11 has no free-threaded build). ``multiprocessing`` is no better here: its
*spawn* and *forkserver* children re-run the caller's main script (one without an ``if __name__
== "__main__"`` guard fails), and *fork* copies a process whose torch and numba thread pools may
hold locks. A child interpreter imports only the data layer (numpy, no torch), and passes its
result through files (raw int32 ids and a JSON list of words), not pickles. A whitespace pre-tokenizer of a Rust or
Arrow library would split by its own notion of whitespace (Rust's ``char::is_whitespace`` is not
Python's ``str.split``: U+001C..U+001F, for one), so the ids could differ from today's; the same
Python code in every worker gives the same ids by construction. Only a file of at least
``PARALLEL_BYTES`` is split, in one range per core: below that, starting the workers (an
interpreter and numpy each) costs more than they save.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from array import array
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..errors import DataError
from .vocab import EOS, LONG_LINE, first_bad_byte, line_pieces

PARALLEL_BYTES = 16 << 20  # files smaller than this are read in one pass
MIN_RANGE_BYTES = 1 << 20
BLOCK_BYTES = 32 << 20  # what a worker reads and decodes at once
BAD_UTF8 = 3  # a worker's exit status when its range is not UTF-8


def workers_available() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on every platform)
        return os.cpu_count() or 1


def byte_ranges(path: Path, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` byte ranges covering ``path``, about ``parts`` of them, each but the
    last ending just after a ``\\n`` (ranges never split a line or a character)."""
    size = Path(path).stat().st_size
    target = max(MIN_RANGE_BYTES, -(-size // max(1, parts)))
    cuts = [0]
    with open(path, "rb") as f:
        while cuts[-1] + target < size:
            f.seek(cuts[-1] + target)
            f.readline()  # to just after the next b"\n" (or the end of the file)
            pos = f.tell()
            if pos >= size:
                break
            cuts.append(pos)
    return list(zip(cuts, cuts[1:] + [size]))


def _lines_of(raw: bytes, first: bool) -> io.TextIOWrapper:
    """The text lines of a range (universal newlines, as ``open(..., newline=None)``; the file's
    leading byte-order mark dropped in the first range only, as ``utf-8-sig`` does)."""
    return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8-sig" if first else "utf-8", newline=None)


def _blocks(path: str, start: int, stop: int):
    """The bytes ``[start, stop)`` of ``path`` in blocks of about BLOCK_BYTES, each ending after a
    ``\n`` (or at ``stop``), so a worker holds one block, not its whole range, whatever the file's
    size (a line longer than a block comes whole, as the single pass reads it)."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        while pos < stop:
            raw = f.read(min(BLOCK_BYTES, stop - pos))
            if pos + len(raw) < stop and not raw.endswith(b"\n"):
                raw += f.readline()  # (stop is just after a line end: readline never passes it)
            if not raw:
                return
            yield pos, raw
            pos += len(raw)


def _scan_range(path: str, start: int, stop: int, keep: bool, out) -> tuple[list[str], int, int]:
    """One worker's range: write its local ids (raw int32, ``<eos>`` = 0 ending each line) to the
    binary file ``out``; return (its words in order of first appearance, ids written, blank
    lines). The line rules are :func:`hlbl.data.vocab.iter_sentences`'s."""
    first: defaultdict = defaultdict()
    first.default_factory = first.__len__  # an unseen word gets the next id
    first[EOS] = 0
    word_id = first.__getitem__
    n = blanks = 0
    for pos, raw in _blocks(path, start, stop):
        buf = array("i")
        for line in _lines_of(raw, pos == 0):
            if len(line) <= LONG_LINE:
                tokens = line.split()
                if tokens or keep:
                    buf.extend(map(word_id, tokens))
                    buf.append(0)
                if not tokens:
                    blanks += 1
                continue
            ended = False
            for tokens in line_pieces(line):
                if tokens:
                    buf.extend(map(word_id, tokens))
                    ended = True
            if ended or keep:
                buf.append(0)
            if not ended:
                blanks += 1
        if sys.byteorder != "little":
            buf.byteswap()
        out.write(buf.tobytes())
        n += len(buf)
    return list(first), n, blanks


def _worker_env() -> dict[str, str]:
    """The environment of a worker: this one, with the directory holding this ``hlbl`` first on
    the module path (the package may have been put on ``sys.path`` by the caller, not installed)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def _start(path: Path, start: int, stop: int, keep: bool, out: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "hlbl.data.scan", str(path), str(start), str(stop), "keep" if keep else "drop"]
    return subprocess.Popen([*argv, str(out)], env=_worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _finish(proc: subprocess.Popen, path: Path, out: Path) -> tuple[list[str], int, int]:
    """Wait for a worker: (its words, ids written, blank lines), or its error."""
    _, err = proc.communicate()
    if proc.returncode == BAD_UTF8:
        raise DataError(f"{path}: not UTF-8 text ({first_bad_byte(Path(path))})")
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        raise OSError(f"{path}: a reading worker failed ({tail[0]})")
    meta = json.loads(Path(f"{out}.json").read_text(encoding="utf-8"))
    return meta["words"], meta["tokens"], meta["blank_lines"]


def scan_parallel(path: Path, ids: Path, blank_lines: str, workers: int, chunk: int = 1 << 22):
    """The pass of :func:`hlbl.data.corpus.scan_file` over ``path`` in ``workers`` processes:
    (words in order of first appearance, their counts (int64), ids written to ``ids``, blank
    lines). The caller checks ``blank_lines``, and removes ``ids`` on an error.

    Workers are child interpreters (``python -m hlbl.data.scan``, module docstring), one per
    byte range, each writing the range's ids and a JSON file of its words."""
    ranges = byte_ranges(path, workers)
    parts = [Path(f"{ids}.part{i}") for i in range(len(ranges))]
    procs = [_start(path, a, b, blank_lines == "keep", part) for (a, b), part in zip(ranges, parts)]
    words: dict[str, int] = {EOS: 0}
    total = np.zeros(0, np.int64)
    n = blanks = 0
    try:
        with open(ids, "wb") as f:
            for proc, part in zip(procs, parts):  # in file order: first appearance stays in order
                local, size, local_blanks = _finish(proc, path, part)
                lookup = np.fromiter((words.setdefault(w, len(words)) for w in local), np.int32, len(local))
                total = np.concatenate([total, np.zeros(len(words) - len(total), np.int64)])
                mapped = np.memmap(part, dtype="<i4", mode="r", shape=(size,)) if size else np.zeros(0, "<i4")
                for i in range(0, size, chunk):
                    piece = lookup[mapped[i : i + chunk]]
                    total += np.bincount(piece, minlength=len(words))
                    f.write(piece.astype("<i4").tobytes())
                del mapped
                n += size
                blanks += local_blanks
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for part in parts:
            part.unlink(missing_ok=True)
            Path(f"{part}.json").unlink(missing_ok=True)
    return list(words), total, n, blanks


def _main(argv: list[str]) -> int:
    """A worker: ``PATH START STOP drop|keep OUT`` -> OUT (raw int32 ids) and OUT.json (words,
    tokens, blank lines); exit status BAD_UTF8 if the range is not UTF-8."""
    path, start, stop, blank_lines, out = argv
    try:
        with open(out, "wb") as f:
            words, n, blanks = _scan_range(path, int(start), int(stop), blank_lines == "keep", f)
    except UnicodeDecodeError:
        return BAD_UTF8
    meta = {"words": words, "tokens": n, "blank_lines": blanks}
    Path(f"{out}.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

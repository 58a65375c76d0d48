"""A training file read and turned into provisional ids on every core: the fast half of
:func:`hlbl.data.corpus.scan_file`, with exactly the result of its Python pass.

The file is cut into byte ranges that end just after a ``\\n`` (so no line, no
``\\r\\n`` and no multibyte UTF-8 character is split; a file whose lines end in lone ``\\r`` has
no cut and is one range). Each range is read by :func:`hlbl.data.text_kernel.scan_block` (the
text rules of :func:`hlbl.data.vocab.iter_sentences`, on the bytes) in a thread of its own: the
kernel releases the GIL, so the threads run on every core, with no interpreter to start and
nothing to pass between processes. A range is read in blocks of about ``BLOCK_BYTES`` cut at line
ends, so a thread holds one block's ids at a time, whatever the file's size.

Each range numbers its words in order of first appearance within the range (``<eos>`` = 0) and
writes its ids to a file of its own. The parent then numbers the words of range 1, 2, ... in that
order: that is the order of first appearance in the whole file, the Python pass's provisional
ids, so a lookup table per range turns its ids into them; the ranges' ids are mapped and
concatenated in order (range 1's need no mapping).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Iterator

import numpy as np

from ..errors import DataError
from ..progress import progress
from .vocab import PROGRESS_BYTES, first_bad_byte

KERNEL_BYTES = 1 << 20  # smaller files are read by the Python pass: loading the kernel costs more
MIN_RANGE_BYTES = 1 << 20  # a range of a file read by several threads is at least this long
BLOCK_BYTES = 1 << 20  # what a thread reads at once (its ids: 4 bytes a byte of text at most)


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


def blocks(path: Path, start: int, stop: int, size: int) -> Iterator[tuple[int, bytes]]:
    """The bytes ``[start, stop)`` of ``path`` as (offset, block) in blocks of about ``size`` bytes,
    each ending just after a line end (a ``\\n``; in a stretch with none, a lone ``\\r``) or at
    ``stop``: a line longer than a block comes whole. Read into memory block by block (not
    mapped), so a thread holds one block and its ids, whatever the file's size."""
    with open(path, "rb") as f:
        f.seek(start)
        pos, offset, carry = start, start, b""
        while pos < stop:
            chunk = f.read(min(size, stop - pos))
            if not chunk:
                break
            pos += len(chunk)
            raw = carry + chunk
            cut = len(raw)
            if pos < stop:
                cut = raw.rfind(b"\n") + 1
                if cut == 0:  # no \n: a \r not last (so not the first half of a \r\n) ends a line
                    cut = raw.rfind(b"\r", 0, len(raw) - 1) + 1
                if cut == 0:  # (a line longer than the block: read on)
                    carry = raw
                    continue
            yield offset, raw[:cut]
            offset, carry = offset + cut, raw[cut:]
        if carry:
            yield offset, carry


class _Stopped(Exception):
    """A range's thread stopped because another failed or the caller was interrupted."""


class _Reader:
    """One file's ranges read by threads: the kernel and the options they share, and ``stopped``:
    set when one thread fails or the caller is interrupted, so that the others stop at their next
    block rather than read their whole range first."""

    def __init__(self, path: Path, keep: bool, bar):
        from ..jit import compile_logged
        from . import text_kernel

        self.path, self.keep, self.bar, self.lock = path, keep, bar, threading.Lock()
        self.kernel, self.stopped = text_kernel, threading.Event()
        with compile_logged("the text reader"):  # (once, before the threads: they would wait on it)
            probe = np.frombuffer(b"a\n", np.uint8)
            text_kernel.scan_block(
                probe, 0, 2, False, False, text_kernel.ASCII_SPACE, text_kernel.new_table(), np.empty(3, np.int32)
            )

    def read_range(self, start: int, stop: int, out: Path) -> tuple[list[str], np.ndarray, int, int]:
        """Range ``[start, stop)``'s ids (raw little-endian int32) to ``out``; returns (its words in
        order of first appearance, their counts, ids written, blank lines)."""
        try:
            return self._read_range(start, stop, out)
        except BaseException:
            self.stopped.set()
            raise

    def _read_range(self, start: int, stop: int, out: Path) -> tuple[list[str], np.ndarray, int, int]:
        k = self.kernel
        table, n, blanks = k.new_table(), 0, 0
        with open(out, "wb") as f:
            for offset, raw in blocks(self.path, start, stop, BLOCK_BYTES):
                if self.stopped.is_set():
                    raise _Stopped()
                data, ids = np.frombuffer(raw, np.uint8), np.empty(len(raw) + 1, np.int32)
                table, m, b, status, _ = k.scan_block(
                    data, 0, len(raw), offset == 0, self.keep, k.ASCII_SPACE, table, ids
                )
                if status != k.OK:
                    self.stopped.set()  # (before the message: it reads the file again)
                    raise DataError(f"{self.path}: not UTF-8 text ({first_bad_byte(self.path)})")
                f.write(ids[:m].astype("<i4", copy=False).tobytes())
                n, blanks = n + m, blanks + b
                with self.lock:
                    self.bar.update(len(raw))
        size = int(table.size[0])
        return k.words_of(table), table.counts[:size].copy(), n, blanks


def scan_bytes(path: Path, ids: Path, blank_lines: str, workers: int, chunk: int = 1 << 20):
    """The pass of :func:`hlbl.data.corpus.scan_file` over ``path`` by the byte kernel, its ranges
    in ``workers`` threads: (words in order of first appearance, their counts (int64), ids written
    to ``ids``, blank lines). The caller checks ``blank_lines`` and that the file is not empty, and
    removes ``ids`` on an error."""
    ranges = byte_ranges(path, workers)
    parts = [Path(ids)] + [Path(f"{ids}.part{i}") for i in range(1, len(ranges))]
    size = Path(path).stat().st_size
    bar = progress(size, f"reading {Path(path).name}", "B", show=size >= PROGRESS_BYTES)
    reader = _Reader(Path(path), blank_lines == "keep", bar)
    try:
        with ThreadPoolExecutor(len(ranges)) as pool:
            futures = [pool.submit(reader.read_range, a, b, part) for (a, b), part in zip(ranges, parts)]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)
            finally:  # (after a failure or an interrupt: the other threads stop at their next block)
                reader.stopped.set()
        for future in futures:  # the failure itself, not a thread that stopped because of it
            if future.exception() is not None and not isinstance(future.exception(), _Stopped):
                raise future.exception()
        done = [future.result() for future in futures]
        words, total, n, blanks = done[0]
        index = {w: i for i, w in enumerate(words)}
        with open(ids, "ab") as f:  # range 1's ids are already the file's: the others are mapped on
            for (local, counts, size_r, blanks_r), part in zip(done[1:], parts[1:]):
                lookup = np.fromiter((index.setdefault(w, len(index)) for w in local), np.int32, len(local))
                total = np.concatenate([total, np.zeros(len(index) - len(total), np.int64)])
                total[lookup] += counts  # (a range's words are distinct: no id repeats in lookup)
                with open(part, "rb") as src:  # (read, not mapped: the pages would stay resident)
                    while piece := src.read(4 * chunk):
                        f.write(lookup[np.frombuffer(piece, "<i4")].astype("<i4").tobytes())
                n, blanks = n + size_r, blanks + blanks_r
        return list(index), total, n, blanks
    finally:
        bar.close()
        for part in parts[1:]:
            part.unlink(missing_ok=True)

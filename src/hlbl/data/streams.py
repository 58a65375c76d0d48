"""Encoded token streams read for training and evaluation: contexts and batches, the order in
which an epoch visits a stream's positions, and reading a memory-mapped stream through its file.

A stream is a flat ``int32`` array of word ids (an encoded split, :mod:`hlbl.data.corpus`). A long
one is never held whole: an epoch visits it a group of shuffled blocks at a time
(:class:`EpochOrder`), read into a bounded buffer (:class:`EpochReader`), and whole-stream passes
read it in pieces (:func:`stream_windows`), so memory does not grow with the corpus.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import DataError


# --------------------------------------------------------------------------------------------
# Contexts and batches


def contexts(stream: np.ndarray, positions: np.ndarray, n_ctx: int, pad: int) -> np.ndarray:
    """(B, n_ctx) int64 contexts of ``stream[positions]``, oldest word first.

    Column ``i`` holds ``stream[pos - n_ctx + i]``; positions before the stream's start read
    ``pad`` (``<eos>``), so the first token of a split is predicted from an all-``<eos>`` context.
    """
    offsets = positions[:, None] - n_ctx + np.arange(n_ctx)[None, :]
    out = np.asarray(stream)[np.maximum(offsets, 0)].astype(np.int64)
    out[offsets < 0] = pad
    return out


def batches(
    stream: np.ndarray,
    n_ctx: int,
    batch_size: int,
    pad: int,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(contexts (B, n_ctx), targets (B,))`` over the stream, in order."""
    for start in range(0, len(stream), batch_size):
        pos = np.arange(start, min(start + batch_size, len(stream)))
        yield contexts(stream, pos, n_ctx, pad), np.asarray(stream[pos], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# Epoch orders


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order in which an epoch visits the n positions of a stream: a permutation seeded by
    (seed, epoch), the same for every engine. int32 where it fits: the permutation of a 1B-token
    corpus takes 4 GB, not 8 (the same order as ``default_rng([seed, epoch]).permutation(n)``)."""
    order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    np.random.default_rng([seed, epoch]).shuffle(order)
    return order


@dataclass(frozen=True)
class EpochSpan:
    """What one training epoch visits: positions ``lo .. hi-1`` of pass ``pass_``'s order
    (``EpochOrder(seed, pass_, n)``), the ``part``-th of the ``parts`` epochs that make that pass."""

    pass_: int
    part: int
    parts: int
    lo: int
    hi: int


def epoch_span(n: int, epoch: int, epoch_tokens: int, batch_size: int) -> EpochSpan:
    """The positions epoch ``epoch`` (1, 2, ...) trains on, for a split of ``n`` positions.

    ``epoch_tokens`` 0, or at least ``n``: every epoch is one whole pass (pass = epoch). Otherwise
    each pass is cut into about ``ceil(n / epoch_tokens)`` epochs of L positions (the last one
    shorter), L being ``n / ceil(n / epoch_tokens)`` rounded up to whole minibatches: the epochs
    of a pass are of about equal size and take, in order, exactly the minibatches an uncut pass
    takes. A long split thus gets its validation, checkpoint and learning-rate decision every L
    positions instead of once a pass."""
    if epoch < 1:
        raise ValueError(f"epochs count from 1, got {epoch}")
    if n <= 0 or not epoch_tokens or epoch_tokens >= n:
        return EpochSpan(epoch, 1, 1, 0, max(n, 0))
    even = -(-n // -(-n // int(epoch_tokens)))  # n / ceil(n / epoch_tokens), rounded up
    length = -(-even // batch_size) * batch_size
    parts = -(-n // length)
    pass_, part = (epoch - 1) // parts + 1, (epoch - 1) % parts + 1
    return EpochSpan(pass_, part, parts, (part - 1) * length, min(n, part * length))


# Streams of up to this many tokens get their epoch order as one permutation in memory (4 bytes a
# token: 64 MB here) and are read where they are; longer ones get it a window at a time, visiting
# one group of blocks at a time (EpochOrder), read into a bounded buffer (EpochReader), so training
# memory does not grow with the corpus.
ORDER_IN_MEMORY = 1 << 24
BLOCK_TOKENS = 1 << 12  # tokens a block of a long stream (16 KB: a few pages of a book)
GROUP_BLOCKS = 1 << 10  # blocks a group (4M tokens, 16 MB): the pool an epoch's minibatches draw from
_ROUNDS = 6  # Feistel rounds of the bijection (4 already give a pseudo-random permutation)


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic): the Feistel round function."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _bijection(x: np.ndarray, m: int, keys: np.ndarray) -> np.ndarray:
    """f(x) for x in 0..m-1 (uint64): a balanced Feistel network keyed by ``keys`` over the
    smallest even number of bits that holds m, made a bijection of 0..m-1 by cycle walking (apply
    it again while the value is m or more: fewer than 4 rounds on average, the domain is < 4m)."""
    bits = max(2, (m - 1).bit_length())
    half = np.uint64((bits + 1) // 2)
    mask = np.uint64((1 << int(half)) - 1)

    def feistel(v: np.ndarray) -> np.ndarray:
        left, right = v >> half, v & mask
        for k in keys:
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        return (left << half) | right

    y = feistel(x)
    out = y >= np.uint64(m)
    while out.any():
        idx = np.flatnonzero(out)
        y[idx] = feistel(y[idx])
        out[idx] = y[idx] >= np.uint64(m)
    return y


class EpochOrder:
    """The order in which an epoch visits the n positions of a stream, read a window at a time.

    Up to ``in_memory`` positions (default :data:`ORDER_IN_MEMORY`) it is :func:`epoch_order`'s
    permutation, held whole. Beyond, the stream is cut into blocks of ``block`` tokens
    (:data:`BLOCK_TOKENS`), the blocks are shuffled (a seeded permutation of the block numbers)
    and taken ``group`` (:data:`GROUP_BLOCKS`) at a time: the epoch visits every position of the
    first group's blocks, in the order of a seeded bijection of the group's positions, then the
    next group's, and so on. The bijection is a balanced Feistel network keyed by (seed, epoch,
    group), made a bijection of the group's m positions by cycle walking. So each minibatch draws
    its positions from 1024 blocks spread over the whole stream, a window costs O(its length)
    time and memory whatever n, and the positions an epoch reads at any time lie in one or two
    groups, 4M tokens each, which :class:`EpochReader` holds in a bounded buffer: a 100M-token
    epoch needs neither a 400 MB permutation nor the whole encoded split in memory.
    Both forms are a permutation; they are different ones.
    """

    def __init__(
        self,
        seed: int,
        epoch: int,
        n: int,
        in_memory: int | None = None,
        block: int | None = None,
        group: int | None = None,
    ):
        self.n = int(n)
        limit = ORDER_IN_MEMORY if in_memory is None else int(in_memory)
        self.dtype = np.int32 if self.n < 2**31 else np.int64
        self._perm = epoch_order(seed, epoch, self.n) if self.n <= limit else None
        self.block = int(block or BLOCK_TOKENS)
        self.group = int(group or GROUP_BLOCKS)
        if self._perm is not None:
            return
        nb = max(1, -(-self.n // self.block))
        # blocks[k]: the block number visited k-th; starts[k]: the epoch step where it begins.
        self.blocks = np.random.default_rng([seed, epoch, 2]).permutation(nb)
        lengths = np.full(nb, self.block, np.int64)
        lengths[-1] = self.n - (nb - 1) * self.block
        self.starts = np.concatenate([[0], np.cumsum(lengths[self.blocks])])
        self.group_starts = self.starts[np.r_[np.arange(0, nb, self.group), nb]]  # (groups + 1,)
        self._keys = np.random.default_rng([seed, epoch, 1]).integers(
            0, 2**64, size=_ROUNDS, dtype=np.uint64, endpoint=False
        )

    def __len__(self) -> int:
        return self.n

    @property
    def in_memory(self) -> bool:
        return self._perm is not None

    @property
    def groups(self) -> int:
        return len(self.group_starts) - 1

    def groups_of(self, lo: int, hi: int) -> range:
        """The groups that steps lo .. hi-1 visit (in order)."""
        lo, hi = max(0, int(lo)), min(int(hi), self.n)
        if hi <= lo:
            return range(0)
        first = int(np.searchsorted(self.group_starts, lo, "right")) - 1
        last = int(np.searchsorted(self.group_starts, hi - 1, "right")) - 1
        return range(first, last + 1)

    def group_blocks(self, g: int) -> np.ndarray:
        """The block numbers of group g, in the order the epoch lists them."""
        return self.blocks[g * self.group : (g + 1) * self.group]

    def window(self, lo: int, hi: int) -> np.ndarray:
        """(min(hi, n) - lo,) the positions visited at steps lo .. hi-1 of the epoch."""
        lo, hi = max(0, int(lo)), min(int(hi), self.n)
        if self._perm is not None:
            return self._perm[lo:hi]
        out = np.empty(max(0, hi - lo), self.dtype)
        for g in self.groups_of(lo, hi):
            g0, g1 = int(self.group_starts[g]), int(self.group_starts[g + 1])
            a, b = max(lo, g0), min(hi, g1)
            keys = _mix64(self._keys ^ np.uint64(g))  # the group's own bijection
            y = _bijection(np.arange(a - g0, b - g0, dtype=np.uint64), g1 - g0, keys).astype(np.int64) + g0
            k = np.searchsorted(self.starts, y, "right") - 1  # which block of the epoch's list
            out[a - lo : b - lo] = self.blocks[k] * self.block + (y - self.starts[k])
        return out


# --------------------------------------------------------------------------------------------
# Reading a stream


def mapped_file(stream: np.ndarray) -> tuple[str, int] | None:
    """(path, byte offset) of ``stream``'s data in its file where it is a contiguous little-endian
    int32 view of a memory-mapped file (``np.memmap``, slices included); None otherwise."""
    mm = getattr(stream, "_mmap", None)
    if not isinstance(stream, np.memmap) or mm is None or not stream.filename:
        return None
    if stream.dtype != np.dtype("<i4") or stream.ndim != 1 or not stream.flags.c_contiguous:
        return None
    base = np.frombuffer(mm, np.uint8).ctypes.data  # where the mapping starts
    start = stream.offset - stream.offset % mmap.ALLOCATIONGRANULARITY  # the file offset mapped there
    return str(stream.filename), start + stream.ctypes.data - base


def read_tokens(stream: np.ndarray, lo: int, out: np.ndarray, file=None) -> None:
    """``out[:] = stream[lo : lo + len(out)]`` (int32). A memory-mapped stream is read through its
    file (``file``: an open binary file of it, else it is opened), not through the mapping, so the
    read leaves no page of the mapping in the process's resident set."""
    where = mapped_file(stream)
    if where is None:
        out[:] = stream[lo : lo + len(out)]
        return
    path, offset = where
    f = file if file is not None else open(path, "rb")
    try:
        view = memoryview(out).cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(f.fileno(), [view[done:]], offset + 4 * lo + done)
            if got <= 0:
                raise DataError(f"{path}: the encoded split ended early (truncated while in use?)")
            done += got
    finally:
        if file is None:
            f.close()


READ_TOKENS = 1 << 20  # tokens per read of a whole-stream pass (stream_pieces: stream_fingerprint, the ids check)


def stream_pieces(stream: np.ndarray, size: int = READ_TOKENS) -> Iterator[np.ndarray]:
    """The stream's tokens as int32 arrays of up to ``size``, in order; a memory-mapped stream is
    read through its file into one reused buffer (:func:`read_tokens`): a piece holds its tokens
    until the next one is read."""
    if mapped_file(stream) is None:
        for lo in range(0, len(stream), size):
            yield np.asarray(stream[lo : lo + size])
        return
    for part, _ in stream_windows(stream, size, 0):
        yield part


def stream_windows(stream: np.ndarray, size: int, before: int) -> Iterator[tuple[np.ndarray, int]]:
    """``(tokens, first)`` for the stream's positions in pieces of up to ``size``, in order: int32
    ``tokens[first:]`` are a piece's own tokens and ``tokens[:first]`` the up to ``before`` tokens
    that precede it (the context of its first positions). A memory-mapped stream is read through
    its file into one reused buffer (:func:`read_tokens`), so a pass over it keeps no page of the
    mapping resident; a piece holds its tokens until the next one is read."""
    n = len(stream)
    buf = np.empty(min(size, n) + before, np.int32)
    where = mapped_file(stream)
    with open(where[0], "rb") if where is not None else contextlib.nullcontext() as f:
        for lo in range(0, n, size):
            start = max(0, lo - before)
            part = buf[: min(lo + size, n) - start]
            read_tokens(stream, start, part, f)
            yield part, lo - start


def stream_fingerprint(stream: np.ndarray) -> str:
    """SHA-256 of an encoded split (its int32 ids): the same text under the same vocabulary, and
    nothing else, has the same fingerprint (a run records its train and valid splits')."""
    h = hashlib.sha256()
    for part in stream_pieces(stream):  # a mapped split through its file (EpochReader)
        h.update(np.ascontiguousarray(part, dtype="<i4").data)
    return h.hexdigest()


class EpochReader:
    """The tokens an epoch's windows read: ``window(lo, hi)`` gives ``(tokens, positions)`` with
    ``tokens[positions[i] - j]`` the token ``stream[p - j]`` (j = 0 .. n_ctx) of the i-th position
    ``p`` the epoch visits at steps lo .. hi-1, ``pad`` where ``p - j < 0``: what both engines'
    contexts and targets read.

    An order held in memory reads the stream itself (``tokens`` is the stream, ``positions`` the
    order's). A long one reads each group's blocks, each with the n_ctx tokens before it, into
    a ring of buffers for ``2 + max_window // group tokens`` groups (every group a window of up to
    ``max_window`` steps visits is there at once), through the file for a memory-mapped stream: the
    process holds that ring (about 2 x 16 MB), never the pages of the mapped split.
    """

    def __init__(self, stream: np.ndarray, order: EpochOrder, n_ctx: int, pad: int, max_window: int):
        self.stream, self.order, self.n_ctx, self.pad = stream, order, int(n_ctx), int(pad)
        if order.in_memory:
            self.whole = np.asarray(stream)  # (a plain array view of a memory-mapped one)
            return
        self.slot = self.n_ctx + order.block  # a block's tokens, after its context
        self.ring = 2 + int(max_window) // (order.group * order.block)
        self.tokens = np.empty(self.ring * order.group * self.slot, np.int32)
        self.slot_of = np.full(len(order.blocks), -1, np.int64)  # block number -> its slot in the ring
        self.held: list[int] = [-1] * self.ring  # the group in each place of the ring
        self.reads = 0  # groups read (tests)

    def _load(self, g: int) -> None:
        order, place = self.order, g % self.ring
        if self.held[place] == g:
            return
        if self.held[place] >= 0:
            self.slot_of[order.group_blocks(self.held[place])] = -1
        self.held[place] = -1
        where = mapped_file(self.stream)
        f = open(where[0], "rb") if where else None
        try:
            for i, blk in enumerate(order.group_blocks(g)):
                s = (place * order.group + i) * self.slot
                start = int(blk) * order.block
                end = min(start + order.block, order.n)
                first = max(0, start - self.n_ctx)  # context before the block; pad before the stream
                self.tokens[s : s + self.n_ctx - (start - first)] = self.pad
                read_tokens(
                    self.stream, first, self.tokens[s + self.n_ctx - (start - first) : s + self.n_ctx + end - start], f
                )
                self.slot_of[blk] = place * order.group + i
        finally:
            if f is not None:
                f.close()
        self.held[place] = g
        self.reads += 1

    def window(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        pos = self.order.window(lo, hi)
        if self.order.in_memory:
            return self.whole, pos
        groups = self.order.groups_of(lo, hi)
        if len(groups) > self.ring:
            raise ValueError(f"a window of {hi - lo} steps is longer than this reader's max_window")
        for g in groups:
            self._load(g)
        blk = pos // self.order.block
        local = self.slot_of[blk] * self.slot + self.n_ctx + (pos - blk * self.order.block)
        return self.tokens, local.astype(pos.dtype)

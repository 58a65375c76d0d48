"""The fast engine's rows averaged between W processes every round (docs/distributed.md has the
scheme and its costs): at the round's end, or, with ``overlap``, one round later while the next
round's steps run.

:class:`Sync` is the rule. At a round's start every process holds the same state s0 (parameters
and momentum buffers). A row that no process touched during the round ends it at A^k s0 on every
process alike (A: the gradient-free step of ``hlbl.fast``'s docstring, applied by the catch-up),
so it needs no exchange. A row that some processes touched takes the mean of their values: s0's
gradient-free path plus the mean of what each toucher's minibatches added to it. A rare word's
row, touched by one process, so keeps that process's whole update; a row every process moved (C,
the nodes near the root, frequent words) takes the mean of their moves, the step one process would
take, not W of them. Momentum buffers are averaged the same way; decay is applied once.

:class:`DelayedSync` applies the same means one round late, so that the exchange runs in the
background (the process group's own threads) while the next round's steps run. At the end of
round r+1 (rows caught up, k steps after round r's end) it has round r's means m and its own
state at round r's end, the snapshot x_r. A row that some process touched in round r becomes

    A^k m                  where this process did not touch it in round r+1 (the same everywhere),
    x + A^k (m - x_r)      where it did (its own round r+1 update kept on top of the mean),

and then round r+1's exchange starts from these rows. So after every correction the rows this
process did not touch in the round are the same on every process (the invariant :class:`Sync`
relies on), and each round's mean is the blocking rule's, only its updates were computed from
states that lacked the other processes' previous round. The epoch's last round is exchanged at
once, so every epoch ends with the same state, bit for bit, on every process. The price: a copy of
the parameters and momentum for the snapshot and one for the send buffer, and every row is sent
(the rows to send are not known before the exchange starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import numpy as np
from numba import njit

from .errors import ConfigError


class Mixer(Protocol):
    """What a data-parallel epoch needs from its process group (``hlbl.distributed.UpdateMixer``):
    this process's rank of ``world``, the steps between synchronisations, whether they overlap the
    next round, and the collectives."""

    rank: int
    world: int
    every: int
    overlap: bool
    bytes_sent: int  # over all synchronisations so far: what this process put in

    def average_rows(self, tables: list[tuple[list[np.ndarray], np.ndarray]]) -> None:
        """For each table (arrays, this process's touched rows): each row that some process touched
        becomes the mean of the touchers' rows, in place, on every process."""

    def sum_async(self, values: np.ndarray) -> Callable[[], None]:
        """Start summing ``values`` (float32, 1-d) over the processes in place; returns the wait."""

    def totals(self, nll: float, seen: int, elapsed: float) -> tuple[float, int, float]:
        """Summed NLL and positions over the processes, and the slowest one's seconds."""


@dataclass
class Pair:
    """A parameter (rows first) with its momentum buffer (None without momentum) and the powers
    (steps+1, 2, 2) float64 A^k of its optimiser group's gradient-free step."""

    value: np.ndarray
    buf: np.ndarray | None
    powers: np.ndarray

    @property
    def arrays(self) -> list[np.ndarray]:
        return [self.value] + ([self.buf] if self.buf is not None else [])


def gradient_free(pair: Pair, steps: int) -> None:
    """(value, buf) <- A^steps (value, buf) in place (float32 coefficients, as the kernels'
    catch-up); without momentum only value <- A[0, 0] value."""
    a00, a01, a10, a11 = (np.float32(x) for x in pair.powers[steps].ravel())
    value, buf = pair.value, pair.buf
    if buf is None:
        value *= a00
        return
    new_value = a00 * value + a01 * buf
    buf[...] = a10 * value + a11 * buf
    value[...] = new_value


class Sync:
    """Averaged updates between W processes at the end of every round (the module docstring).

    ``tables``: rows touched together, each a list of :class:`Pair`: the words (R), the context
    weights (C, touched by every process that took a step) and the nodes (Q, and the node biases
    that live in the node records during an epoch). ``last_w``, ``last_n``: the words' and nodes'
    step stamps, which tell the rows a round touched."""

    def __init__(self, words: list[Pair], context: list[Pair], nodes: list[Pair], last_w, last_n, mixer: Mixer):
        self.tables = [words, context, nodes]
        self.last_w, self.last_n = last_w, last_n
        self.mixer = mixer

    def prepare(self) -> None:
        """Compile (or load from numba's cache) what the rounds' ends run, before the clock starts."""

    def touched(self, first: int, stepped: bool) -> list[np.ndarray]:
        """Per table, which rows this process's steps of the round (after step ``first``) touched:
        the rows stamped past ``first`` (read before the catch-up stamps every row)."""
        return [self.last_w > first, np.full(len(self.tables[1][0].value), stepped), self.last_n > first]

    def advance_dense(self, steps: int) -> None:
        """Apply ``steps`` gradient-free steps to C (dense, stepped by every step, not lazy): for a
        process whose share ended before the round's last step, as the lazy rows are caught up."""
        if steps > 0:
            gradient_free(self.tables[1][0], steps)

    def finish(self, touched: list[np.ndarray], step: int, final: bool) -> None:
        """After a round ending at ``step`` (every row caught up to it): the averaged rows.
        ``final``: the epoch's last round."""
        arrays = [[a for pair in table for a in pair.arrays] for table in self.tables]
        self.mixer.average_rows(list(zip(arrays, touched)))


class Rows(NamedTuple):
    """One parameter's arrays as (rows, width) for :func:`_land_rows`: its values and momentum
    buffer, their sums over the processes and this process's snapshot of them. Without momentum
    the buffer's three are the value's (and are not written)."""

    value: np.ndarray
    buf: np.ndarray
    sum_value: np.ndarray
    sum_buf: np.ndarray
    snap_value: np.ndarray
    snap_buf: np.ndarray


class DelayedSync(Sync):
    """:class:`Sync`'s means applied one round late, the exchange overlapping the next round's
    steps (the module docstring). Holds two flat float32 copies of every table's arrays: ``send``
    (the touch flags, then this process's rows, zero where it did not touch them; summed over the
    processes in place) and ``snap`` (this process's rows at the exchanged round's end)."""

    def __init__(self, words, context, nodes, last_w, last_n, mixer: Mixer, buffers: dict | None = None):
        """:class:`Sync`'s arguments; ``buffers``: where ``send`` and ``snap`` are kept between
        epochs (reused when their sizes match)."""
        super().__init__(words, context, nodes, last_w, last_n, mixer)
        flags = sum(len(table[0].value) for table in self.tables)
        values = sum(a.size for table in self.tables for pair in table for a in pair.arrays)
        buffers = {} if buffers is None else buffers
        for name, size in (("send", flags + values), ("snap", values)):
            if buffers.get(name) is None or buffers[name].size != size:
                buffers.pop(name, None)
                try:
                    buffers[name] = np.empty(size, np.float32)
                except MemoryError:  # (a large vocabulary: two more copies of the model)
                    need = 4 * (flags + 2 * values) / 2**30
                    raise ConfigError(
                        "sync_overlap",
                        f"sync_overlap needs {need:.1f} GiB more memory a process (two copies of the "
                        "model and its momentum); train without it",
                    ) from None
        self.send, self.snap = buffers["send"], buffers["snap"]
        self.pending: tuple[Callable[[], None], int] | None = None  # (wait, the exchanged round's end step)
        # Per table: its touch flags (summed: the counts) in ``send``, and per pair its Rows.
        self.layout: list[tuple[np.ndarray, list[tuple[Pair, Rows]]]] = []
        f, at, s = 0, flags, 0  # the next flag's offset in send, the next value's in send and in snap
        for table in self.tables:
            pairs = []
            for pair in table:
                views = []  # (in send, in snap) of each of the pair's arrays
                for a in pair.arrays:
                    views.append(
                        (self.send[at : at + a.size].reshape(a.shape), self.snap[s : s + a.size].reshape(a.shape))
                    )
                    at, s = at + a.size, s + a.size
                (sv, xv), (sb, xb) = views[0], views[-1]  # (without momentum: the value's twice)
                pairs.append((pair, Rows(*(_rows(x) for x in (pair.value, pair.arrays[-1], sv, sb, xv, xb)))))
            rows = len(table[0].value)
            self.layout.append((self.send[f : f + rows], pairs))
            f += rows

    def prepare(self) -> None:
        """Run the kernels on each table's first two rows, touched by no process (nothing changes
        but the buffers' first rows), which compiles them for the arrays' layouts (or loads them
        from numba's cache) before the clock starts. (Two rows: a one-row view of a strided array
        counts as contiguous, another layout.)"""
        for _, pairs in self.layout:
            for pair, rows in pairs:
                first = Rows(*(x[:2] for x in rows))
                zero, no = np.zeros(len(first.value), np.float32), np.zeros(len(first.value), bool)
                _pack_rows(first, no, pair.buf is not None)
                _land_rows(first, zero, no, pair.powers[0].astype(np.float32), pair.buf is not None)

    def finish(self, touched: list[np.ndarray], step: int, final: bool) -> None:
        self.land(touched, step)
        if final:
            super().finish(touched, step, final)
        else:
            self.launch(touched, step)

    def launch(self, touched: list[np.ndarray], step: int) -> None:
        """Snapshot every row, pack this process's touched ones and the flags, start the sum."""
        for (flags, pairs), mine in zip(self.layout, touched):
            flags[:] = mine
            for pair, rows in pairs:
                _pack_rows(rows, mine, pair.buf is not None)
        self.pending = (self.mixer.sum_async(self.send), step)

    def land(self, touched: list[np.ndarray], step: int) -> None:
        """Apply the pending round's means to the rows caught up to ``step`` (no-op without one)."""
        if self.pending is None:
            return
        wait, began = self.pending
        wait()
        self.pending = None
        for (counts, pairs), mine in zip(self.layout, touched):
            for pair, rows in pairs:
                _land_rows(rows, counts, mine, pair.powers[step - began].astype(np.float32), pair.buf is not None)


def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` as (rows, width): a view (a 1-d array, such as the node biases, gets a unit axis)."""
    return a[:, None] if a.ndim == 1 else a


@njit(nogil=True, cache=True)
def _pack_rows(rows, mine, pair):  # pragma: no cover (numba)
    """DelayedSync.launch for one parameter (``rows``: its :class:`Rows`), in one read of it: the
    snapshot, and the sums' arrays set to this process's rows where ``mine`` (rows,), else 0."""
    x, b, mx, mb, sx, sb = rows.value, rows.buf, rows.sum_value, rows.sum_buf, rows.snap_value, rows.snap_buf
    zero = np.float32(0.0)
    for j in range(x.shape[0]):
        keep = mine[j]
        for f in range(x.shape[1]):
            v = x[j, f]
            sx[j, f] = v
            mx[j, f] = v if keep else zero
            if pair:
                m = b[j, f]
                sb[j, f] = m
                mb[j, f] = m if keep else zero


@njit(nogil=True, cache=True)
def _land_rows(rows, counts, mine, A, pair):  # pragma: no cover (numba)
    """DelayedSync.land for one parameter (``rows``: its :class:`Rows`): counts (rows,) the touch
    counts over the processes, mine (rows,) bool this process's round, A (2, 2) float32 A^k.
    ``pair`` False: no momentum (the buffer's arrays are the value's and are not written)."""
    x, b, mx, mb, sx, sb = rows.value, rows.buf, rows.sum_value, rows.sum_buf, rows.snap_value, rows.snap_buf
    a00, a01, a10, a11 = A[0, 0], A[0, 1], A[1, 0], A[1, 1]
    zero = np.float32(0.0)
    for j in range(x.shape[0]):
        c = counts[j]
        if c == 0:
            continue
        for f in range(x.shape[1]):
            mv = mx[j, f] / c
            mm = mb[j, f] / c if pair else zero
            if mine[j]:
                dv = mv - sx[j, f]
                dm = mm - sb[j, f] if pair else zero
                x[j, f] += a00 * dv + a01 * dm
                if pair:
                    b[j, f] += a10 * dv + a11 * dm
            else:
                v = a00 * mv + a01 * mm
                if pair:
                    b[j, f] = a10 * mv + a11 * mm
                x[j, f] = v

"""Data-parallel training with ``torch.distributed``: setup and the few collectives the training
loop and the two engines need.

Launch with ``torchrun --nproc_per_node N -m hlbl train ...``; the CLI calls
:func:`init_from_env`, which joins the process group that torchrun describes in the environment
(gloo on the CPU, nccl on CUDA, one GPU per process). Without torchrun (or with one process)
nothing is initialised and every helper here is a no-op, so single-process training is unchanged.

The fast engine (``hlbl.fast``, CPU) trains each process on its own minibatches and averages the
rows they touched every few steps (:class:`UpdateMixer`). The torch engine takes synchronous
steps. How its step is split (see ``hlbl.engine.train_epoch``): every rank walks the same seeded epoch order
in global minibatches of B positions, takes its contiguous shard of each (:func:`shard_bounds`),
computes the *summed* loss of that shard and backpropagates; :func:`all_reduce_gradients` sums the
gradients over the ranks, so every rank takes the single-process step on the whole minibatch (up
to float rounding in the order of the sum).

Why an explicit all-reduce rather than ``DistributedDataParallel``: DDP averages gradients (the
loss would need scaling by W, which is inexact in float for W not a power of two); every rank must
run a forward/backward on every step, even with an empty shard (the last minibatch split W ways can
leave a rank nothing, and the output layers' mean loss is NaN on an empty batch); it needs
``find_unused_parameters`` for PyTorch's adaptive softmax, whose tail clusters get no gradient in
a minibatch without their words; and it wraps the module, whereas both training engines take the
plain :class:`~hlbl.model.LBL` with the same signature. The explicit version is one coalesced
all-reduce per step that also carries a "has a gradient" flag per parameter, so a parameter no rank
touched keeps ``grad None`` and the optimiser skips it, exactly as in one process. What it gives
up is DDP's overlap of communication with the backward pass, small for this model.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from datetime import timedelta
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .data import stream_fingerprint
from .errors import DataError  # a user error: the CLI prints its one-line message


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def init_from_env(device: str) -> str:
    """Join the process group torchrun describes (env ``WORLD_SIZE`` > 1); returns the device to train on.

    ``device`` is the one the user picked ("cpu", "cuda" or "cuda:N"). On the CPU the group uses
    gloo; on CUDA it uses nccl and each process takes GPU ``LOCAL_RANK`` of its node (an explicit
    ":N" is overridden: one process per GPU is the only layout that makes sense here). Without
    torchrun (no ``WORLD_SIZE``, or 1) this returns ``device`` unchanged and initialises nothing.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return device
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise DataError(f"distributed training runs on the CPU (gloo) or CUDA (nccl), not {device!r}")
    if kind == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise DataError(
                f"LOCAL_RANK {local} but this node has {torch.cuda.device_count()} CUDA device(s): "
                "start at most one process per GPU (torchrun's --nproc_per_node)"
            )
        device = f"cuda:{local}"
        torch.cuda.set_device(local)  # nccl collectives and barriers run on the current device
    if not dist.is_initialized():
        # env:// reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, all set by torchrun.
        dist.init_process_group(
            "nccl" if kind == "cuda" else "gloo", init_method="env://", timeout=collective_timeout()
        )
    return device


DEFAULT_COLLECTIVE_TIMEOUT = 600.0  # seconds; torch's default is 30 minutes


def collective_timeout() -> timedelta:
    """How long a collective (or barrier) waits for the other ranks before it fails: a rank that
    stopped (SIGSTOP, a hung disk) then ends the run with an error instead of holding the others
    for torch's 30 minutes. ``HLBL_COLLECTIVE_TIMEOUT`` (seconds) sets it: raise it where one rank
    legitimately works alone longer (rank 0 scores the test split while the others wait)."""
    raw = os.environ.get("HLBL_COLLECTIVE_TIMEOUT")
    if raw is None:
        return timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not (0 < seconds < 1e7):  # (NaN and infinity too)
        raise DataError(f"HLBL_COLLECTIVE_TIMEOUT must be a number of seconds above 0, got {raw!r}")
    return timedelta(seconds=seconds)


def cleanup(finished: bool = True) -> None:
    """Leave the process group (if one was joined); safe to call in any case.

    ``finished``: every process got here normally, so they first wait for each other. Without
    that, a process that is done early (not rank 0, which still scores the test split) tears
    its gloo connections down while its peer still holds them, and gloo may abort the process
    ("terminate called without an active exception"). After an error there is no waiting: the
    others may never arrive."""
    if dist.is_available() and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def shard_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """[lo, hi) of rank's contiguous shard of n items split W ways, sizes differing by at most 1
    (the first n % W shards get the extra item, as ``np.array_split``). A shard can be empty."""
    base, extra = divmod(n, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


def all_reduce_gradients(params: list[nn.Parameter]) -> None:
    """Sum every parameter's ``.grad`` over the ranks, in place, in one collective.

    A rank where a parameter got no gradient (``grad None``: an empty shard, an unused adaptive
    softmax cluster) contributes zeros; a parameter that got none on *any* rank stays ``None``, so
    the optimiser skips it (no weight decay, no momentum step) exactly as a single process would.
    All parameters must share one device and dtype (an LBL's do).
    """
    if not is_distributed():
        return
    dtype, device = params[0].dtype, params[0].device
    if any(p.dtype != dtype for p in params):
        raise TypeError("all_reduce_gradients needs parameters of one dtype")
    grads = [p.grad for p in params]
    # flat: (sum of numels + len(params),): every gradient flattened (zeros where a rank has none),
    # then one 0/1 "has a gradient" flag per parameter; summing it over the ranks counts users.
    flat = torch.cat(
        [
            g.reshape(-1) if g is not None else torch.zeros(p.numel(), dtype=dtype, device=device)
            for p, g in zip(params, grads)
        ]
        + [torch.tensor([float(g is not None) for g in grads], dtype=dtype, device=device)]
    )
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    used = (flat[-len(params) :] > 0).tolist()  # one device sync for all the flags
    offset = 0
    for p, has_grad in zip(params, used):
        n = p.numel()
        if has_grad:
            p.grad = flat[offset : offset + n].view_as(p)
        offset += n


def _all_reduce(values: list[float], device: torch.device | str, op) -> list[float]:
    if not is_distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def all_sum(values: list[float], device: torch.device | str) -> list[float]:
    """Element-wise sum over the ranks of a few numbers (in float64); identity in one process."""
    return _all_reduce(values, device, dist.ReduceOp.SUM)


def all_max(values: list[float], device: torch.device | str) -> list[float]:
    """Element-wise maximum over the ranks (float64); identity in one process."""
    return _all_reduce(values, device, dist.ReduceOp.MAX)


def broadcast_floats(values: list[float], device: torch.device | str, src: int = 0) -> list[float]:
    """Rank ``src``'s numbers on every rank (float64); the other ranks' ``values`` only give the length."""
    if not is_distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.broadcast(t, src)
    return t.tolist()


@torch.no_grad()
def broadcast_parameters(module: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters into every rank's ``module``, in place (the optimiser keeps them)."""
    if not is_distributed():
        return
    for p in module.parameters():
        dist.broadcast(p.detach(), src)


def check_same(description: str, device: torch.device | str, what: str) -> None:
    """Raise on every rank unless every rank passed the same ``description`` (any string; a
    48-bit hash of it is compared). ``what`` names it in the error."""
    if not is_distributed():
        return
    key = float(int(hashlib.sha256(description.encode()).hexdigest()[:12], 16))  # 48 bits: exact in float64
    low, high = all_max([-key, key], device)  # -min and max over the ranks
    if -low != high:
        raise DataError(f"the processes disagree on {what}; every process must build the same run")


def agree(flag: bool, device: torch.device | str, message: str) -> None:
    """Raise DataError(``message``) on every rank unless every rank passed the same ``flag``."""
    low, high = all_max([-float(flag), float(flag)], device)
    if -low != high:
        raise DataError(message)


def check_same_run(model: nn.Module, vocab, train, valid, cfg) -> None:
    """Every rank must build the same run: ranks that differ would deadlock or silently train W
    models. Parameters are broadcast later, but the tree is structure (a builder that is not
    deterministic across processes would differ), the split lengths and recipe set the number of
    steps, and each rank reads its shards from its own copy of the text."""
    if not is_distributed():
        return
    description = json.dumps(
        [
            model.config.to_json(),
            model.tree.fingerprint() if model.tree is not None else None,
            [(k, list(p.shape)) for k, p in model.named_parameters()],
            len(train),
            len(valid),
            stream_fingerprint(train),
            stream_fingerprint(valid),  # the text, not its size only
            hashlib.sha256("\n".join(vocab.words).encode()).hexdigest(),
            {k: v for k, v in asdict(cfg).items() if k not in ("device", "progress", "hogwild")},
        ],
        sort_keys=True,
    )
    check_same(description, cfg.device, "the model, its word tree, the corpus or the training recipe")


SYNC_CHUNK = 1 << 22  # elements per collective of UpdateMixer (16 MiB of float32): bounds its temporaries


class UpdateMixer:
    """The fast engine's link between W processes (``hlbl.fast.FastEngine(mixer=...)``): every
    ``every`` local steps each row that some process touched becomes the mean of the touchers'
    copies of it (docs/distributed.md has the scheme and its costs).

    One all-reduce (gloo on the CPU) of the touch counts, then one per send buffer of at most
    ``SYNC_CHUNK`` values: at most :func:`sync_bytes` a synchronisation (``bytes_per_sync``, the
    last one's). The sum of W float32 numbers is the same on every process, so the processes leave
    every synchronisation with the same state, bit for bit. With ``overlap`` the engine's rounds
    (``hlbl.sync.DelayedSync``) start their exchange with :meth:`sum_async` instead, every row
    and the touch counts in one buffer, and wait for it a round later.
    """

    def __init__(self, every: int, overlap: bool = False):
        if every < 1:
            raise ValueError(f"every must be at least 1 step, got {every}")
        self.every, self.rank, self.world = int(every), rank(), world_size()
        self.overlap = bool(overlap)  # apply each round's means one round late (hlbl.sync.DelayedSync)
        self.bytes_per_sync = self.syncs = 0
        self.bytes_sent = 0  # over all synchronisations: what this process put in
        self._buffer = np.empty(0, np.float32)  # the send buffer, kept between synchronisations

    def average_rows(self, tables: list) -> None:
        """In place, for each table (arrays, touched): row j of every array becomes the mean of row
        j over the processes whose ``touched[j]`` is true; rows no process touched (the same on
        every process: caught up alike) keep their values.

        A table most of whose rows some process touched is sent whole, straight from its arrays
        into one reused send buffer (no gathering of rows); a sparser one sends only those rows."""
        flags = np.concatenate([touched for _, touched in tables]).astype(np.float32)
        dist.all_reduce(torch.from_numpy(flags), op=dist.ReduceOp.SUM)  # (sum of rows,) touch counts
        self.bytes_per_sync, offset, pending = flags.nbytes, 0, []
        for arrays, touched in tables:
            counts = flags[offset : offset + len(touched)]
            offset += len(touched)
            used = np.flatnonzero(counts)  # the same rows, in the same order, on every process
            whole = 2 * len(used) > len(counts)
            for a in arrays:
                width = a[0].size if a.ndim > 1 else 1
                step = max(1, SYNC_CHUNK // width)
                for lo in range(0, len(counts) if whole else len(used), step):
                    rows = slice(lo, min(lo + step, len(counts))) if whole else used[lo : lo + step]
                    pending.append((a, rows, counts, touched, width))
        self._send(pending)
        self.bytes_sent += self.bytes_per_sync
        self.syncs += 1

    def _send(self, pending: list) -> None:
        """Pack (array, rows, counts, touched, width) pieces into the send buffer (this process's
        rows, zero where it did not touch them), sum them over the processes a buffer at a time,
        and write the means back. A piece is at most SYNC_CHUNK values (average_rows cuts them)."""
        sizes = [len(counts[rows]) * width for _, rows, counts, _, width in pending]
        if self._buffer.size < min(SYNC_CHUNK, sum(sizes)):
            self._buffer = np.empty(min(SYNC_CHUNK, sum(sizes)), np.float32)
        batch, used = [], 0
        for piece, size in zip(pending + [None], sizes + [0]):
            if batch and (piece is None or used + size > self._buffer.size):
                buf = self._buffer[:used]
                dist.all_reduce(torch.from_numpy(buf), op=dist.ReduceOp.SUM)
                for (a, rows, counts, _, _), at, n in batch:
                    _unpack(a, rows, counts, buf[at : at + n])
                batch, used = [], 0
            if piece is None:
                break
            a, rows, counts, touched, _ = piece
            mine = touched[rows].reshape((-1,) + (1,) * (a.ndim - 1))
            np.multiply(a[rows], mine, out=self._buffer[used : used + size].reshape(a[rows].shape))
            batch.append((piece, used, size))
            used += size
            self.bytes_per_sync += 4 * size

    def sum_async(self, values: np.ndarray) -> Callable[[], None]:
        """Start summing ``values`` (float32, 1-d) over the processes in place, a collective per
        ``SYNC_CHUNK`` values run by the process group's threads; returns the wait for them all."""
        works = [
            dist.all_reduce(torch.from_numpy(values[lo : lo + SYNC_CHUNK]), op=dist.ReduceOp.SUM, async_op=True)
            for lo in range(0, len(values), SYNC_CHUNK)
        ]
        self.bytes_per_sync = values.nbytes
        self.bytes_sent += values.nbytes
        self.syncs += 1

        def wait() -> None:
            for work in works:
                work.wait()

        return wait

    def totals(self, nll: float, seen: int, elapsed: float) -> tuple[float, int, float]:
        """The epoch's summed NLL and positions over the processes, and the slowest one's seconds."""
        nll, seen_all = all_sum([nll, float(seen)], "cpu")
        (elapsed,) = all_max([elapsed], "cpu")
        return nll, int(seen_all), elapsed


def _unpack(a: np.ndarray, rows, counts: np.ndarray, summed: np.ndarray) -> None:
    """a[rows] = summed / counts[rows] where the count is positive (``summed``: the flat sums)."""
    c = counts[rows].reshape((-1,) + (1,) * (a.ndim - 1))
    view = summed.reshape(a[rows].shape)
    if isinstance(rows, slice):  # in place, leaving the rows no process touched as they are
        np.divide(view, c, out=a[rows], where=c > 0)
    else:
        a[rows] = view / c


def sync_bytes(model: nn.Module, momentum: bool) -> int:
    """The most bytes each process contributes to one synchronisation of the fast engine
    (:class:`UpdateMixer`) for an LBL with a tree output, when a round touches every row: the word
    vectors, context weights, node vectors and biases as float32, their momentum buffers with
    ``momentum``, and one touch count per word, context position and node. A ring all-reduce
    sends about twice this per process."""
    V, d = model.R.weight.shape
    n, N = model.C.shape[0], model.out.weight.shape[0]
    values = V * d + n * d + N * d + N
    return 4 * (values * (2 if momentum else 1) + V + n + N)

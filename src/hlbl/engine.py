"""The engines that train one epoch, and the one place that chooses between them.

Both take the same steps on the same minibatches, in the same seeded order:

* :func:`train_epoch` (here): autograd on any output layer and optimiser, on the CPU or a GPU, and
  data-parallel under a process group (:mod:`hlbl.distributed`): every rank walks the same seeded
  order in the same global minibatches, computes the summed loss of its contiguous 1/W shard of
  each, and the gradients are summed over the ranks before every step, so the W processes take the
  single-process steps (up to float rounding in the order of the sums);
* :class:`hlbl.fast.FastEngine`: numba kernels with sparse exact updates, for the tree output layer
  with diagonal context weights and SGD with or without momentum, on the CPU; under a process
  group (:func:`fast_parallel_engine`) each process runs it on every W-th minibatch and the
  processes average the rows they touched every ``cfg.sync_steps(V)`` steps (docs/distributed.md).

An engine is a callable ``(model, optimizer, stream, pad, cfg, epoch, show) -> (mean NLL, words/s)``;
a training loop keeps the one :func:`choose_engine` gives it (the fast engine's caches live in it).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from . import distributed as ddp
from . import fast
from .config import TrainConfig
from .data import EpochOrder, EpochReader, contexts, epoch_span
from .errors import ConfigError
from .model import LBL
from .progress import progress


def train_epoch(
    model: LBL, optimizer: torch.optim.Optimizer, stream: np.ndarray, pad: int, cfg: TrainConfig, epoch: int, show: bool
) -> tuple[float, float]:
    """One epoch over ``stream`` in a seeded random order: a whole pass, or for a split longer than
    ``cfg.epoch_tokens`` its share of one (:func:`hlbl.data.epoch_span`); returns (mean NLL, words/s).

    Under a process group of W > 1 ranks (every rank calls this with the same arguments and the
    same parameters), each global minibatch of ``cfg.batch_size`` positions is split into W
    contiguous shards, rank r computes the summed loss of shard r and the gradients are summed
    over the ranks: every rank takes the single-process step. The returned loss and words/s are
    global (all ranks' tokens).
    """
    span = epoch_span(len(stream), epoch, cfg.epoch_tokens, cfg.batch_size)
    order = EpochOrder(cfg.seed, span.pass_, len(stream))  # N positions, the same on every rank
    # the stream, or for a long one its current groups of blocks in a bounded buffer
    reader = EpochReader(stream, order, model.config.context, pad, max_window=cfg.batch_size)
    device = torch.device(cfg.device)
    rank, world = ddp.rank(), ddp.world_size()
    params = [p for p in model.parameters() if p.requires_grad]
    total, seen = 0.0, 0  # this rank's summed NLL and token count
    start = time.perf_counter()
    bar = progress(span.hi - span.lo, f"epoch {epoch}", "w", show)  # a bar on a terminal, else a line every few seconds
    model.train()
    # Layers whose loss samples restart their noise from (seed, epoch), so that a resumed run draws
    # what the uninterrupted one drew; under W ranks every rank draws the same words per step.
    model.out.start_epoch(cfg.seed, epoch)
    for first in range(span.lo, span.hi, cfg.batch_size):
        tokens, batch = reader.window(
            first, min(first + cfg.batch_size, span.hi)
        )  # (B,) positions of the global minibatch
        lo, hi = ddp.shard_bounds(len(batch), rank, world)
        pos = batch[lo:hi]  # (b,) this rank's shard; b = B in one process, and can be 0
        optimizer.zero_grad(set_to_none=True)
        if len(pos):  # an empty shard (a short last minibatch) contributes no gradient, but still syncs
            ctx = torch.from_numpy(contexts(tokens, pos, model.config.context, pad)).to(device)  # (b, n)
            tgt = torch.from_numpy(np.asarray(tokens[pos], dtype=np.int64)).to(device)  # (b,)
            loss = model(ctx, tgt).loss * len(pos)  # summed over the shard: the learning rate is per example
            loss.backward()
            total += float(loss.detach())
            seen += len(pos)
        ddp.all_reduce_gradients(params)  # sum over the ranks = the whole minibatch's gradient (no-op in one process)
        optimizer.step()
        bar.update(len(batch))
        bar.set_postfix(
            loss=f"{total / max(seen, 1):.3f}", wps=f"{seen * world / (time.perf_counter() - start):.0f}", refresh=False
        )  # (this rank's loss; words/s estimated as W times its own)
    bar.close()
    elapsed = time.perf_counter() - start
    total, seen = ddp.all_sum([total, float(seen)], device)  # global, in float64
    (elapsed,) = ddp.all_max([elapsed], device)  # the slowest rank's time is the epoch's
    return total / max(seen, 1), seen / elapsed


def fast_parallel_engine(cfg: TrainConfig, vocab_size: int) -> fast.FastEngine:
    """The fast engine as one of W processes: one thread on this process's minibatches, averaging
    the rows the processes touched every ``cfg.sync_steps(vocab_size)`` steps (one round late with
    ``cfg.sync_overlap``); global loss and words/s."""
    return fast.FastEngine(threads=1, mixer=ddp.UpdateMixer(cfg.sync_steps(vocab_size), cfg.sync_overlap))


def choose_engine(model: LBL, cfg: TrainConfig):
    """The one place that picks the step implementation; all have train_epoch's signature.

    A :class:`hlbl.fast.FastEngine` (numba kernels, sparse exact updates; tree output, diagonal context,
    SGD with or without momentum, CPU), under a process group :func:`fast_parallel_engine`'s, or
    :func:`train_epoch` (autograd: GPU, any output layer and optimiser; under a process group the
    exact synchronous steps). ``auto`` takes the fast engine wherever it applies.
    """
    if cfg.engine == "torch":
        return train_epoch
    why = fast.unsupported(model, cfg=cfg)
    if why is None:
        return fast_parallel_engine(cfg, model.config.vocab_size) if ddp.is_distributed() else fast.FastEngine()
    if cfg.engine == "fast":
        raise ConfigError("engine", f"engine 'fast' cannot train this model: {why}")
    if cfg.hogwild > 1:  # auto would train on the torch engine, which has no Hogwild threads
        raise ConfigError("hogwild", f"hogwild runs threads of the fast engine, which cannot train this model: {why}")
    return train_epoch


def check_memory(model: LBL, cfg: TrainConfig, tokens: int) -> None:
    """Refuse a minibatch whose buffers could not be allocated (``--batch-size 1000000000000``
    would ask numpy for terabytes and end in a traceback): a rough per-example estimate of the
    engines' buffers (context ids, targets, hidden vectors and their gradients) against the
    machine's memory."""
    per_example = 8 * (model.config.context + 2) + 4 * 4 * model.config.dim
    need = cfg.batch_size * per_example
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on every system
        return
    if need > have:
        raise ConfigError(
            "batch_size",
            f"batch_size {cfg.batch_size} needs about {need / 2**30:,.0f} GiB for one minibatch's "
            f"buffers, more than this machine's {have / 2**30:,.0f} GiB; the training split has "
            f"{tokens:,} tokens",
        )

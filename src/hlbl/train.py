"""Training: minibatch gradient steps on the penalised log-likelihood, with early stopping.

Default recipe, after Mnih & Hinton (2008, appendix; 2007 for what 2008 leaves out):

* SGD on minibatches of 1000 contexts; the gradient is the *sum* over the minibatch, so
  the learning rate is per example (1e-3). We add momentum 0.9, which the paper does not
  mention: PTB is 15 times smaller than the paper's APNews data, and plain SGD at 1e-3 needs
  many more epochs on it (``--optimizer sgd`` gives the plain recipe);
* learning rate 1e-3 until validation perplexity rises, then the best weights so far are
  restored and training goes on at 3e-5 until it rises again; the best weights are kept
  (``lr_schedule="two-rate"``; the default where an epoch is a whole pass). ``"halve"`` and ``"auto"`` are the other
  schedules (:mod:`hlbl.schedule`);
* L2 penalty 1e-4 on word vectors, 1e-5 on other weights, none on biases, per example (the
  penalised objective is the mean over examples of NLL + penalty);
* non-bias weights from N(0, 0.1^2) (the context weights C_i around 1), node biases set so
  the untrained model predicts the unigram distribution.

Output layers trained by sampling (``nce``, ``sampled``; :mod:`hlbl.output.sampled`) minimise
their sampled loss with the same recipe; their ``train_loss`` in metrics.jsonl is that loss (its
``train_ppl`` is no perplexity), while the validation perplexity that drives early stopping is
always exact (full softmax).

``--optimizer sgd|adam|adagrad`` are options (the same per-example learning rate).
This module is the loop: epoch after epoch, the chosen engine (:mod:`hlbl.engine`), validation,
the schedule's decision (:mod:`hlbl.schedule`) and the run's checkpoint (:meth:`hlbl.run.Run.commit`).
:func:`hlbl.run.fit` sets it up: it resolves the recipe once into those objects and starts or
resumes the run directory.

Data parallelism (``torchrun --nproc_per_node N -m hlbl train ... --engine torch``; see
:mod:`hlbl.distributed`): training loss and words/s are global; rank 0 evaluates the validation
split and broadcasts the perplexity, so the early-stopping and learning-rate decisions are the
same on every rank; best weights are restored on every rank (rank 0 reads its own file and
broadcasts them); only rank 0 logs and writes files. No module-level state.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from . import distributed as ddp
from .checkpoint import load_weights
from .config import TrainConfig
from .data import Vocab, epoch_span
from .evaluate import evaluate, perplexity_report
from .model import LBL
from .optim import make_optimizer
from .schedule import Schedule, TrainState

Engine = Callable[..., "tuple[float, float]"]  # hlbl.engine: (model, optimizer, stream, pad, cfg, epoch, show)
Commit = Callable[[nn.Module, torch.optim.Optimizer, TrainState, list, "Path | None"], Path]


@dataclass
class Loop:
    """What the loop drives, resolved once by :func:`hlbl.run.fit`: the engine's epoch, the
    schedule, the splits, and ``commit`` (the run's checkpoint of an epoch; None on ranks > 0)."""

    engine: Engine
    schedule: Schedule
    train: np.ndarray  # (N,) token ids, the training prefix in use
    valid: np.ndarray
    pad: int
    vocab: Vocab
    commit: Commit | None
    log: Callable[[str], None]


def _valid_perplexity(loop: Loop, model: LBL, device: torch.device, cfg: TrainConfig) -> float:
    """The validation perplexity, scored by the engine where it scores (the fast engine: the same
    scorer :func:`hlbl.evaluate.evaluate` would pick, with the tree's paths the engine keeps)."""
    score = getattr(loop.engine, "token_log_probs", None)
    if score is not None:
        return perplexity_report(score(model, loop.valid, loop.pad))["perplexity"]
    return evaluate(model, loop.valid, loop.pad, device=device, engine=cfg.engine)["perplexity"]


def train_loop(
    loop: Loop,
    model: LBL,
    cfg: TrainConfig,
    state: TrainState,
    optimizer: torch.optim.Optimizer,
    metrics: list[str],
    best: Path | None,
) -> TrainState:
    """Train from ``state`` until the schedule stops or ``cfg.max_epochs`` is reached; every rank
    returns holding the best weights. ``metrics``: the JSON lines of the epochs so far; ``best``:
    the newest checkpoint's best-weights file (None before the first)."""
    rank = ddp.rank()
    device = torch.device(cfg.device)
    started, first = time.monotonic(), state.epoch
    while not state.done and state.epoch < cfg.max_epochs:
        if state.epoch > first and _over_budget(cfg, started, loop, state):  # (each call trains an epoch)
            break
        epoch = state.epoch + 1
        t0 = time.perf_counter()
        loss, wps = loop.engine(model, optimizer, loop.train, loop.pad, cfg, epoch, cfg.progress and rank == 0)
        train_time = time.perf_counter() - t0
        # Rank 0 scores the validation split and broadcasts the perplexity, so that the decisions
        # below (improved, learning-rate drop, stop) are the same on every rank.
        ppl = _valid_perplexity(loop, model, device, cfg) if rank == 0 else 0.0
        (ppl,) = ddp.broadcast_floats([ppl], device)
        state.elapsed += time.perf_counter() - t0
        _check_finite(loss, ppl, epoch, state.lr, model.config.context)
        improved = ppl < state.best_valid_ppl
        metrics.append(_metrics_line(loop, cfg, state, epoch, loss, ppl, wps, train_time, improved))
        state.epoch = epoch
        decision = loop.schedule.after_epoch(state, ppl)
        if decision.drop:
            if decision.restore:
                restore_best(model, best, loop.vocab)  # go back to the best weights
            optimizer = make_optimizer(model, cfg, state.lr)  # (momentum starts afresh)
            restored = "best weights restored, " if decision.restore else ""
            what = "rose" if not decision.improved else "barely improved"
            loop.log(f"valid perplexity {what}: {restored}learning rate now {state.lr:g}")
        if loop.commit is not None:  # rank 0 writes the checkpoint (metrics are written with it, never before)
            best = (
                loop.commit(model, optimizer, state, metrics, None if decision.improved else best) / "best.safetensors"
            )
    restore_best(model, best, loop.vocab)
    return state


def _over_budget(cfg: TrainConfig, started: float, loop: Loop, state: TrainState) -> bool:
    """Whether this call's time budget is spent (checked after each checkpoint, so the run stops
    on a complete one). Rank 0's clock decides for every rank."""
    if cfg.time_budget is None:
        return False
    spent = time.monotonic() - started
    (over,) = ddp.broadcast_floats([float(spent >= cfg.time_budget)], torch.device(cfg.device))
    if over:
        loop.log(
            f"time budget of {cfg.time_budget:g} s spent after epoch {state.epoch} ({spent:.0f} s): "
            "stopping at this checkpoint; a resume continues the run"
        )
    return bool(over)


def _metrics_line(loop: Loop, cfg: TrainConfig, state: TrainState, epoch, loss, ppl, wps, train_time, improved) -> str:
    """One line of metrics.jsonl (also logged), written before the schedule decides on the epoch."""
    span = epoch_span(len(loop.train), epoch, cfg.epoch_tokens, cfg.batch_size)
    line = {
        "epoch": epoch,
        "pass": span.pass_,  # epochs of a long split are parts of a pass (cfg.epoch_tokens)
        "part": span.part,
        "parts": span.parts,
        "train_loss": loss,
        "train_ppl": math.exp(loss),
        "valid_ppl": ppl,
        "words_per_sec": wps,
        "epoch_minutes": train_time / 60,
        "lr": state.lr,
        "elapsed_s": state.elapsed,
        "improved": improved,
    }
    sync = getattr(loop.engine, "sync_stats", None)  # the fast engine under torchrun: its rounds' ends
    ends = ""
    if sync:
        line["sync"] = sync
        ends = f"  {sync['rounds']} rounds, {sync['seconds']:.1f} s at their ends"
    where = f" (pass {span.pass_}, part {span.part}/{span.parts})" if span.parts > 1 else ""
    loop.log(
        f"epoch {epoch}{where}: train loss {loss:.4f}  valid ppl {ppl:.2f}  {wps:,.0f} words/s  lr {state.lr:g}{ends}"
    )
    return json.dumps(line)


def _check_finite(loss: float, ppl: float, epoch: int, lr: float, context: int) -> None:
    if not math.isfinite(loss) or not math.isfinite(ppl):
        hint = (
            f" or the context size (context={context}: the context vector sums {context} word vectors)"
            if context > 10
            else ""
        )
        raise FloatingPointError(
            f"training diverged in epoch {epoch}: train loss {loss:.4g} per token, "
            f"validation perplexity {ppl:.4g}; lower the learning rate (lr={lr:g}){hint}"
        )


def restore_best(model: LBL, best: Path | None, vocab: Vocab) -> None:
    """Load a checkpoint's best.safetensors into ``model`` on every rank. Only rank 0 reads the
    file, which it wrote itself (no race with the writer, no filesystem shared between nodes
    needed), and broadcasts."""
    if ddp.rank() == 0:
        load_weights(best, model, vocab=vocab)
    ddp.broadcast_parameters(model)

"""The learning-rate schedule and early stopping: what the training loop decides after each epoch.

* ``two-rate`` (the paper's): keep the rate while validation perplexity improves; on the first
  rise restore the best weights and go on at ``lr_final`` (0: stop); on the second rise stop.
* ``halve`` (RNNLM-style): keep the rate while validation improves by at least ``lr_min_gain``
  (relative); otherwise multiply it by ``lr_decay`` (restoring the best weights when it rose),
  ``lr_decays`` times, then stop.
* ``auto``: two-rate where an epoch is a whole pass over the training split, halve where a long
  split is cut into several epochs a pass (``TrainConfig.epoch_tokens``): there the model is far
  from overfitting, and a rate halved on each stall keeps gaining where two rates stop on the
  first small rise (docs/scale.md; on PTB two-rate is the better one, docs/frontier.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .config import TrainConfig


@dataclass
class TrainState:
    """Where a run stands after ``epoch`` epochs; saved in each checkpoint's state.json."""

    lr: float
    epoch: int = 0
    phase: int = 0  # how many times the rate has dropped (0 or 1 for two-rate)
    best_valid_ppl: float = math.inf
    done: bool = False  # the schedule stopped the run
    elapsed: float = 0.0  # seconds of training and validation so far

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    """What follows an epoch: ``improved`` (a new best), ``drop`` (the rate changed: a fresh
    optimiser; with ``restore``, from the best weights), ``stop`` (training is over)."""

    improved: bool
    drop: bool = False
    restore: bool = False
    stop: bool = False


def resolve(cfg: TrainConfig, parts: int) -> str:
    """The schedule a run follows: ``cfg.lr_schedule``, with "auto" resolved for a split whose
    pass is ``parts`` epochs (:func:`hlbl.data.epoch_span`)."""
    if cfg.lr_schedule != "auto":
        return cfg.lr_schedule
    return "halve" if parts > 1 else "two-rate"


class Schedule:
    """The decisions of one run's schedule, from its recipe and the epochs a pass is cut into."""

    def __init__(self, cfg: TrainConfig, parts: int):
        self.kind = resolve(cfg, parts)
        self.lr_final, self.lr_decay, self.lr_decays, self.min_gain = (
            cfg.lr_final,
            cfg.lr_decay,
            cfg.lr_decays,
            cfg.lr_min_gain,
        )

    def after_epoch(self, state: TrainState, ppl: float) -> Decision:
        """Update ``state`` (epoch already counted) with the validation perplexity ``ppl`` of its
        last epoch; returns what the loop does next."""
        improved = ppl < state.best_valid_ppl
        enough = ppl < state.best_valid_ppl * (1.0 - self.min_gain)
        if improved:
            state.best_valid_ppl = ppl
        if improved if self.kind == "two-rate" else enough:
            return Decision(improved)  # the rate stays
        new_lr = self._dropped_lr(state)
        if new_lr is None:
            state.done = True
            return Decision(improved, stop=True)
        state.phase, state.lr = state.phase + 1, new_lr
        return Decision(improved, drop=True, restore=not improved)

    def _dropped_lr(self, state: TrainState) -> float | None:
        """The rate after a stall; None: stop."""
        if self.kind == "two-rate":
            return self.lr_final if state.phase == 0 and self.lr_final > 0 else None
        return state.lr * self.lr_decay if state.phase < self.lr_decays else None

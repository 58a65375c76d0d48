"""The optimiser a recipe asks for, over the model's parameter groups."""

from __future__ import annotations

import numpy as np
import torch

from .config import TrainConfig
from .eager import build_optimizer
from .model import LBL


def make_optimizer(model: LBL, cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """``cfg.optimizer`` at learning rate ``lr`` (the schedule's current one). The L2 penalty is
    per example, like the loss: a summed minibatch carries ``batch_size`` copies of it. Built without
    importing ``torch._dynamo`` (``eager.build_optimizer``): the fast engine never compiles."""
    groups = model.param_groups(cfg.weight_decay_words * cfg.batch_size, cfg.weight_decay_other * cfg.batch_size)
    if cfg.optimizer == "sgd":
        return build_optimizer(torch.optim.SGD, groups, lr=lr)
    if cfg.optimizer == "momentum":
        return build_optimizer(torch.optim.SGD, groups, lr=lr, momentum=cfg.momentum)
    if cfg.optimizer == "adam":
        return build_optimizer(torch.optim.Adam, groups, lr=lr)
    return build_optimizer(torch.optim.Adagrad, groups, lr=lr)


def word_rates(counts, power: float, cap: float) -> np.ndarray:
    """(V,) float32 multipliers of the context word vectors' gradients (``TrainConfig.word_rate_power``).

    Why: with SGD a word seen c times gets c small updates, so the vectors of mid-frequency and rare
    words stay near their start while the frequent ones converge (AdaGrad's per-row rates grow as
    1 / sqrt(c) for the same reason; these are fixed, so both engines stay exact and nothing is
    added to a checkpoint). Row w gets min(cap, (c_ref / c_w) ** power) if c_w < c_ref, else 1,
    c_ref the count of the word at the middle of the tokens: words that make up the more frequent
    half of the text keep the recipe's rate. A word never seen (c_w = 0) counts as seen once."""
    c = np.maximum(np.asarray(counts, dtype=np.float64), 1.0)
    if c.ndim != 1 or len(c) == 0:
        raise ValueError(f"counts must be a non-empty vector, got shape {c.shape}")
    by_count = np.sort(c)[::-1]
    c_ref = by_count[np.searchsorted(np.cumsum(by_count), by_count.sum() / 2.0)]
    scale = np.minimum(cap, (c_ref / c) ** power)
    return np.where(c < c_ref, scale, 1.0).astype(np.float32)

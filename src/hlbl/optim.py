"""The optimiser a recipe asks for, over the model's parameter groups."""

from __future__ import annotations

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

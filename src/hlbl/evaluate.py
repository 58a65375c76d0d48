"""Perplexity under the stream protocol.

A split is one stream of token ids with ``<eos>`` after every line. Every token is predicted
(on PTB test N = 82,430); the contexts of the first tokens are padded with ``<eos>``.
Perplexity = exp(total NLL / N), with the total accumulated in float64 and divided once.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .data import batches


@torch.no_grad()
def token_log_probs(model, stream: np.ndarray, pad: int, batch_size: int = 4096,
                    device: str | torch.device = "cpu", engine: str = "auto") -> np.ndarray:
    """(N,) float64 natural-log probability of every token of ``stream`` given its context.

    ``engine="torch"`` always uses the model's forward; otherwise tree models on the CPU are
    scored by ``hlbl.fast`` (the same values up to float32 rounding, several times faster).
    """
    if engine != "torch":
        from .fast import scorer  # lazily: numba compiles its kernels on first use

        score = scorer(model, device)
        if score is not None:
            return score(stream, pad)
    was_training = model.training
    model.eval()
    out = np.empty(len(stream), dtype=np.float64)
    i = 0
    for ctx, tgt in batches(stream, model.config.context, batch_size, pad):
        lp = model(torch.from_numpy(ctx).to(device), torch.from_numpy(tgt).to(device)).output
        out[i : i + len(tgt)] = lp.double().cpu().numpy()
        i += len(tgt)
    model.train(was_training)
    return out


def perplexity_report(log_probs: np.ndarray) -> dict:
    """``{"perplexity", "tokens", "nll"}`` with nll the mean NLL per token in nats."""
    n = int(len(log_probs))
    if n == 0:
        raise ValueError("no tokens to evaluate")
    nll = float(-np.sum(log_probs, dtype=np.float64) / n)
    ppl = math.exp(nll) if nll < 709.0 else (math.inf if nll == nll else math.nan)  # exp overflows past ~709
    return {"perplexity": ppl, "tokens": n, "nll": nll}


def evaluate(model, stream: np.ndarray, pad: int, batch_size: int = 4096,
             device: str | torch.device = "cpu", engine: str = "auto") -> dict:
    return perplexity_report(token_log_probs(model, stream, pad, batch_size, device, engine))

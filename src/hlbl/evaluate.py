"""Perplexity under the stream protocol.

A split is one stream of token ids with ``<eos>`` after every line. Every token is predicted
(on PTB test N = 82,430); the contexts of the first tokens are padded with ``<eos>``.
Perplexity = exp(total NLL / N), with the total accumulated in float64 and divided once.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .data import batches
from .jit import compile_logged

if TYPE_CHECKING:  # imported where a torch model is scored: a NumpyLBL (hlbl.numpy_model) needs no torch
    import torch


def token_log_probs(
    model,
    stream: np.ndarray,
    pad: int,
    batch_size: int = 4096,
    device: str | torch.device = "cpu",
    engine: str = "auto",
) -> np.ndarray:
    """(N,) float64 natural-log probability of every token of ``stream`` given its context.

    ``engine="torch"`` always uses the model's forward; otherwise tree models on the CPU are
    scored by ``hlbl.fast`` (the same values up to float32 rounding, several times faster). A
    :class:`~hlbl.numpy_model.NumpyLBL` is scored by the same kernel (``device`` and ``engine``
    aside), without torch.
    """
    from .numpy_model import NumpyLBL

    if isinstance(model, NumpyLBL):  # its scorer is the fast engine's
        return model.token_log_probs(stream, pad)
    import torch

    with torch.no_grad():
        return _torch_log_probs(model, stream, pad, batch_size, device, engine)


def _torch_log_probs(model, stream: np.ndarray, pad: int, batch_size: int, device, engine: str) -> np.ndarray:
    """:func:`token_log_probs` of a torch model (under no_grad)."""
    import torch

    if engine != "torch":
        from .fast import scorer  # lazily: numba compiles its kernels on first use

        score = scorer(model, device)
        if score is not None:
            with compile_logged("the scoring kernels"):
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


def evaluate(
    model,
    stream: np.ndarray,
    pad: int,
    batch_size: int = 4096,
    device: str | torch.device = "cpu",
    engine: str = "auto",
) -> dict:
    return perplexity_report(token_log_probs(model, stream, pad, batch_size, device, engine))


def self_normalisation(
    model, stream: np.ndarray, pad: int, batch_size: int = 4096, device: str | torch.device = "cpu"
) -> dict | None:
    """How self-normalised a sampled-output model (nce, sampled) is on ``stream``: statistics of
    ``log Z(h) = log sum_w exp s(w, h)`` over its contexts, and the perplexity one would report by
    trusting Z = 1, i.e. exp(-mean s(target, h)) from the unnormalised scores. None for layers
    without unnormalised scores (tree, flat, adaptive: their outputs are normalised by design).

    This is a diagnostic: the model's perplexity is :func:`evaluate`'s, from the full softmax.
    """
    out = getattr(model, "out", None)  # (a NumpyLBL has a tree: normalised)
    if not (hasattr(out, "log_normaliser") and hasattr(out, "score")):
        return None
    import torch

    with torch.no_grad():
        return _self_normalisation(model, out, stream, pad, batch_size, device)


def _self_normalisation(model, out, stream: np.ndarray, pad: int, batch_size: int, device) -> dict:
    """:func:`self_normalisation` of a layer with unnormalised scores (under no_grad)."""
    import torch

    was_training = model.training
    model.eval()
    log_z = np.empty(len(stream), dtype=np.float64)
    scores = np.empty(len(stream), dtype=np.float64)
    i = 0
    for ctx, tgt in batches(stream, model.config.context, batch_size, pad):
        h = model.context_vector(torch.from_numpy(ctx).to(device))  # (b, d)
        t = torch.from_numpy(tgt).to(device)
        log_z[i : i + len(tgt)] = out.log_normaliser(h).double().cpu().numpy()
        scores[i : i + len(tgt)] = out.score(h, t).double().cpu().numpy()
        i += len(tgt)
    model.train(was_training)
    pct = np.percentile(log_z, [1, 5, 25, 50, 75, 95, 99])
    trusting = perplexity_report(scores)
    exact = perplexity_report(scores - log_z)  # log P = s - log Z: the same as evaluate(), for the record
    return {
        "log_z_mean": float(log_z.mean()),
        "log_z_std": float(log_z.std()),
        "log_z_percentiles": {f"p{q}": float(v) for q, v in zip((1, 5, 25, 50, 75, 95, 99), pct)},
        "perplexity_trusting_z1": trusting["perplexity"],
        "perplexity": exact["perplexity"],
        "tokens": len(stream),
    }

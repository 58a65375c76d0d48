"""torch's optimiser methods called without importing ``torch._dynamo``.

``torch.optim.Optimizer.add_param_group``, ``state_dict`` and ``load_state_dict`` are decorated
with ``torch._disable_dynamo``, which imports ``torch._dynamo`` (and with it sympy and the
compiler stack: 1.3 CPU-s a process, ``results/optimizer_import.json``) the first time the method is called, only to
tell the compiler not to trace it. A process that never compiles (the fast engine's, a checkpoint
commit, ``hlbl eval``) pays that for nothing. Outside ``torch.compile`` the decorator is a plain
pass-through, so calling the function it wraps gives exactly the same result.

Only torch's own lazy wrapper is unwrapped (recognised by its code object); any other decorator,
or a torch release without ``__wrapped__``, leaves the method as it is: slower to start, never
different. When ``torch._dynamo`` is already imported (a process that compiles), nothing is
unwrapped either, so a compiled caller keeps torch's behaviour.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any, TypeVar

import torch

O = TypeVar("O", bound=torch.optim.Optimizer)


def _wrapper_code() -> types.CodeType | None:
    """The code object of ``torch._disable_dynamo``'s wrapper (one for every wrapped function)."""
    disable = getattr(torch, "_disable_dynamo", None)
    if disable is None:
        return None
    return getattr(disable(lambda: None), "__code__", None)


def undecorated(fn: Callable) -> Callable:
    """``fn`` without ``torch._disable_dynamo``'s wrapper when it has one and ``torch._dynamo`` is
    not loaded yet; else ``fn`` itself."""
    inner = getattr(fn, "__wrapped__", None)
    code = _wrapper_code()
    if inner is None or code is None or getattr(fn, "__code__", None) is not code or "torch._dynamo" in sys.modules:
        return fn
    return inner


def build_optimizer(cls: type[O], params: Any, **options: Any) -> O:
    """``cls(params, **options)`` whose parameter groups are added without the compiler import.

    ``Optimizer.__init__`` adds each group through ``self.add_param_group``; an attribute of the
    new instance shadows the class's method for that call only and is removed afterwards, so the
    object is an ordinary ``cls`` (``type(opt) is cls``, its ``__dict__`` as torch leaves it)."""
    opt = cls.__new__(cls)
    opt.add_param_group = types.MethodType(undecorated(cls.add_param_group), opt)  # type: ignore[method-assign]
    try:
        cls.__init__(opt, params, **options)  # type: ignore[misc]
    finally:
        del opt.add_param_group
    return opt


def state_dict(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` without the compiler import."""
    return undecorated(type(optimizer).state_dict)(optimizer)


def load_state_dict(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)`` without the compiler import."""
    undecorated(type(optimizer).load_state_dict)(optimizer, state)

"""Compiled regions: pure-PyTorch glue compiled by ``torch.compile`` (Inductor, fixed shapes, one
graph: a graph break is an error, not a silent fallback), once per process, on first use.

Dynamo specialises a region to what it is called with (shapes, dtypes, grad mode, the integers
passed): a training run calls each region with one such set (its micro-batch) and compiles it once.
A process that calls a region with many (several models or batch shapes in one process: a notebook,
a test session, a loop over configurations) reaches Dynamo's recompile limit
(``torch._dynamo.config.recompile_limit``, 8 by default), where ``fullgraph=True`` made Dynamo
raise ``FailOnRecompileLimitHit`` out of the model's forward. Past that limit a region runs the
calls Dynamo refuses eagerly (the same arithmetic, unfused) and says so once in the log
(``zebractl.model.ops.regions``); the calls it compiled for keep running compiled.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable
from typing import Any

import torch

log = logging.getLogger(__name__)


def _signature(args: tuple[Any, ...], kw: dict[str, Any]) -> Hashable:
    """What a call is specialised on, as far as it can be told without Dynamo: each tensor's
    shape, dtype, device and grad requirement, every other argument, the grad mode and autocast."""

    def one(a: Any) -> Hashable:
        if isinstance(a, torch.Tensor):
            return ("T", tuple(a.shape), a.dtype, a.device, a.requires_grad)
        return a if isinstance(a, Hashable) else repr(a)

    autocast = tuple(
        torch.get_autocast_dtype(d) if torch.is_autocast_enabled(d) else None
        for d in ("cpu", "cuda")
    )
    return (
        tuple(one(a) for a in args),
        tuple((k, one(v)) for k, v in sorted(kw.items())),
        torch.is_grad_enabled(),
        autocast,
    )


class Region:
    """``fn`` compiled (``torch.compile(fn, dynamic=False, fullgraph=True)``), eager for calls past
    Dynamo's recompile limit. ``eager_calls``: how many calls ran eagerly."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.compiled = torch.compile(fn, dynamic=False, fullgraph=True)
        self.limit_hit = False
        self.eager_calls = 0
        self._compiled_for: set[Hashable] = set()

    def __call__(self, *args: Any, **kw: Any) -> Any:
        sig = _signature(args, kw)
        if self.limit_hit and sig not in self._compiled_for:
            return self._eager(args, kw)
        try:
            out = self.compiled(*args, **kw)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            if not self.limit_hit:
                log.info(
                    "%s: Dynamo's recompile limit (%s) reached; calls with new shapes run eagerly",
                    getattr(self.fn, "__qualname__", self.fn),
                    torch._dynamo.config.recompile_limit,
                )
            self.limit_hit = True
            return self._eager(args, kw)
        self._compiled_for.add(sig)
        return out

    def _eager(self, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        self.eager_calls += 1
        return self.fn(*args, **kw)


@functools.cache
def region(fn: Callable[..., Any]) -> Region:
    """The process's compiled region of ``fn`` (one per function)."""
    return Region(fn)

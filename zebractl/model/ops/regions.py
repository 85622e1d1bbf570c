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
    """``fn`` compiled (``torch.compile(fn, dynamic=False, fullgraph=True)``), eager for the calls
    Dynamo refuses past its recompile limit. ``eager_calls``: how many calls ran eagerly."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.compiled = torch.compile(fn, dynamic=False, fullgraph=True)
        self.eager_calls = 0
        self._refused: set[Hashable] = set()  # signatures Dynamo refused: eager without asking

    @property
    def limit_hit(self) -> bool:
        return bool(self._refused)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        # nothing is computed per call until Dynamo first refuses one (a training run: never)
        if self._refused and _signature(args, kw) in self._refused:
            return self._eager(args, kw)
        try:
            return self.compiled(*args, **kw)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            if not self._refused:
                log.info(
                    "%s: Dynamo's recompile limit (%s) reached; calls with new shapes run eagerly",
                    getattr(self.fn, "__qualname__", self.fn),
                    torch._dynamo.config.recompile_limit,
                )
            self._refused.add(_signature(args, kw))
            return self._eager(args, kw)

    def _eager(self, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        self.eager_calls += 1
        return self.fn(*args, **kw)


@functools.cache
def region(fn: Callable[..., Any]) -> Region:
    """The process's compiled region of ``fn`` (one per function)."""
    return Region(fn)

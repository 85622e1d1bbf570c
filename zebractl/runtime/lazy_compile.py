"""Import megatron-core and FLA without building their ``torch.compile`` wrappers at import.

Both wrap functions in ``torch.compile`` as their modules are imported: megatron-core's
``jit_fuser`` (its fused bias/activation/RoPE helpers) and FLA's ``@torch.compile`` functions.
Building those wrappers imports TorchDynamo and TorchInductor at every training run's start-up, for
functions zebractl mostly never calls (its own kernels replace them). On a 2-core CPU, importing
both took 5.2 s, and 4.1 s with the wrappers deferred (TorchInductor not imported;
``tests/runtime/test_lazy_compile.py`` shows the import skips it).

:func:`import_frameworks` imports them with ``torch.compile`` replaced by :func:`deferred` for the
duration of the import (restored after it, as every patch in :mod:`zebractl.runtime`): a plain
function is wrapped in a function that calls ``torch.compile`` on its first call and the compiled
function from then on, so what runs is what ran before, made later. Inside a region TorchDynamo is
compiling (e.g. zebractl's compiled Mamba2 glue) the wrapper calls the function itself, which
Dynamo then traces inline, as it does with a nested ``torch.compile``. Anything else (a module, a
method) goes to ``torch.compile`` at once. ``kernels.lazy_framework_compile`` turns it on
(opt-in: on an H200 the GPU tests and the parity smoke passed with it, but the cold start was no
shorter; the key's docstring has the figures).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

FRAMEWORKS = ("megatron.core",)
"""Imported by every training run (the process group, the datasets, the model's configuration)."""
FLA_MODULES = (
    "fla",
    "fla.modules",
    "fla.ops.kda",
    "fla.ops.gated_delta_rule",
    "fla.ops.simple_gla",
)
"""FLA's modules a run on FLA's kernels imports (``fla/__init__`` imports most of FLA)."""

_lock = threading.Lock()


def deferred(compile_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for ``compile_fn`` (``torch.compile``) that wraps a plain function lazily."""

    def compile_later(model: Any = None, **options: Any) -> Any:
        if model is None:  # @torch.compile(...) with options: the decorator
            return lambda fn: compile_later(fn, **options)
        if not inspect.isfunction(model):
            return compile_fn(model, **options)
        made: list[Callable[..., Any]] = []
        made_lock = threading.Lock()

        @functools.wraps(model)
        def call(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return model(*args, **kwargs)
            if not made:
                with made_lock:
                    if not made:
                        made.append(compile_fn(model, **options))
            return made[0](*args, **kwargs)

        call.zebractl_compiled = made  # type: ignore[attr-defined]  # what tests look at
        return call

    return compile_later


@contextlib.contextmanager
def deferred_compile() -> Iterator[None]:
    """``torch.compile`` is :func:`deferred` inside the block (one block at a time)."""
    with _lock:
        real = torch.compile
        torch.compile = deferred(real)  # type: ignore[assignment]
        try:
            yield
        finally:
            torch.compile = real  # type: ignore[assignment]


def import_frameworks(fla: bool) -> list[str]:
    """Import megatron-core (and, with ``fla``, FLA's modules) with their compile wrappers
    deferred; modules already imported stay as they are (their wrappers were made). Returns the
    modules this call imported. An import that fails is left to the code that needs the module
    (it reports it the way it always has). FLA's import queries the current GPU: import it once
    the process's device is set (under torchrun, each rank its own)."""
    names = [*FRAMEWORKS, *(FLA_MODULES if fla else ())]
    todo = [n for n in names if n not in sys.modules]
    done = []
    if not todo:
        return done
    with deferred_compile():
        for name in todo:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - reported where the module is needed, as before
                continue
            done.append(name)
    return done

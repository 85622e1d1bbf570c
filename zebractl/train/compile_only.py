"""Compile the Triton kernels a step launches without running them, many compiles at once
(``kernels.precompile_workers``).

The background compilation (:mod:`zebractl.train.precompile`) runs one training step of each
mixer on throwaway weights, so every kernel compiles on its first launch: one after the other, as
the step reaches it. Most of a Triton compile runs outside the GIL (MLIR and LLVM passes, ptxas
in a subprocess), so compiles in threads overlap: on a 2-core CPU, 8 kernels compiled for sm_90 in
8 threads took 0.60x the time of one after the other. On an H100 (2026-12-06, edcc58e;
benchmarks/README.md) 16 workers did not shorten kda_300M's background compilation (26.8 s against
26.2 s; KDA's TileLang kernel, compiled beside it, took 21 s on that machine) and the first step
then compiled the kernels left out (cold start 44.4 s against 41.6 s): opt-in.

Inside :func:`compile_only`, in the thread that entered it and nowhere else, a Triton kernel call
compiles without launching: Triton's own ``AsyncCompileMode`` hands the compile to a thread pool
and the call returns at once, so the exercise walks the whole step in the time its Python takes
and the pool compiles every kernel of it together. Nothing is launched, so the kernels' outputs are
garbage; the exercise only needs their shapes (no FLA code path reads a kernel's output on the host).
An autotuned kernel whose best configuration is neither in memory nor in Triton's autotuning disk
cache (the shipped tuned configurations seed it) is skipped: tuning needs real launches, and the
first training step tunes it as before. Leaving the block waits for the pool; the compiled kernels
are then in each kernel's in-memory cache (and on disk), and the first step finds them.

This leans on Triton's internals (``JITFunction.run``'s ``warmup`` flag, ``Autotuner``'s key and
disk lookup, ``AsyncCompileMode``) as of Triton 3.6; :func:`supported` says whether the installed
Triton has them, and the caller falls back to launching the step otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CompileOnly:
    """What a :func:`compile_only` block did."""

    submitted: int = 0
    """Kernel calls that went to the pool (compiles, or hits of a kernel already compiled)."""
    untuned: list[str] = field(default_factory=list)
    """Autotuned kernels skipped: no tuned configuration for their key (the first step tunes)."""
    calls: int = 0
    """Kernel calls met (with a share: every call, the others' included)."""


class _NotTuned(Exception):
    """Raised instead of benchmarking, inside the autotuner's disk lookup."""


def supported() -> bool:
    """Whether the installed Triton has what :func:`compile_only` relies on."""
    try:
        from triton.runtime import _async_compile, autotuner, jit
    except ImportError:
        return False
    tuner = autotuner.Autotuner
    return (
        hasattr(_async_compile, "AsyncCompileMode")
        and hasattr(_async_compile, "active_mode")
        and callable(getattr(jit.JITFunction, "run", None))
        and all(hasattr(tuner, a) for a in ("run", "prune_configs", "check_disk_cache"))
    )


def tuning_key(tuner: Any, args: tuple, kwargs: dict) -> tuple:
    """The key ``Autotuner.run`` looks its best configuration up by (Triton 3.6's rule: the values
    of the ``key`` arguments, then the dtype of every tensor argument)."""
    given = {**dict(zip(tuner.arg_names, args, strict=False)), **kwargs}
    named = {k: v for k, v in given.items() if k in tuner.arg_names}
    key = [named[k] for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


def is_tuned(tuner: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``tuner`` would run ``args`` without benchmarking: one configuration, the key in its
    memory, or its tuned configuration found in Triton's autotuning disk cache (then loaded)."""
    if len(tuner.configs) <= 1:
        return True
    key = tuning_key(tuner, args, kwargs)
    if key in tuner.cache:
        return True
    if not tuner.cache_results:
        return False
    tuner.nargs = dict(zip(tuner.arg_names, args, strict=False))
    try:
        configs = tuner.prune_configs(kwargs)
        return bool(tuner.check_disk_cache(key, configs, _refuse_to_benchmark))
    except _NotTuned:
        return False
    finally:
        tuner.nargs = None


def _refuse_to_benchmark() -> None:
    raise _NotTuned


@contextlib.contextmanager
def compile_only(workers: int, share: tuple[int, int] | None = None) -> Iterator[CompileOnly]:
    """Within the block, in this thread, Triton kernel calls compile on a pool of ``workers``
    threads instead of launching (see the module docstring); leaving it waits for every compile
    (a compile's error is raised then). ``share=(i, n)``: only the calls whose index in the walk
    is i modulo n compile here, the rest are skipped (n processes walking the same step split its
    kernels between them: :mod:`zebractl.train.compile_procs`)."""
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime import _async_compile, autotuner, jit

    done = CompileOnly()
    real_run, real_tune = jit.JITFunction.run, autotuner.Autotuner.run
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zebractl-compile") as pool:
        mode = _async_compile.AsyncCompileMode(pool)

        def ours() -> bool:  # another thread (the run's own setup) launches for real
            return _async_compile.active_mode.get() is mode

        def run(self, *args, grid, warmup, **kwargs):  # type: ignore[no-untyped-def]
            if ours():
                index, done.calls = done.calls, done.calls + 1
                if share is not None and index % share[1] != share[0]:
                    return None  # another process's
                done.submitted += 1
                warmup = True
            return real_run(self, *args, grid=grid, warmup=warmup, **kwargs)

        def tune(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if ours() and not is_tuned(self, args, kwargs):
                done.untuned.append(getattr(self.base_fn, "__name__", repr(self)))
                return None
            return real_tune(self, *args, **kwargs)

        jit.JITFunction.run, autotuner.Autotuner.run = run, tune  # type: ignore[method-assign]
        try:
            with mode:
                yield done
        finally:
            jit.JITFunction.run, autotuner.Autotuner.run = real_run, real_tune  # type: ignore[method-assign]
            if ours():  # Triton 3.6 leaves the mode set when a compile failed
                _async_compile.active_mode.set(None)

"""Compile a run's GPU kernels in a background thread while the run sets up.

On a cold kernel cache the first training step compiles every FLA kernel it meets, one after the
other: on the H200, with the shipped tuned configurations, kda_300M took 81 s from launch to the end
of iteration 1, 33 s of it TileLang compiling KDA's Hopper backward kernel (nvcc, in a subprocess)
and most of the rest Triton compiling the chunk kernels. None of it needs the run's data or
weights, only the shapes and dtypes of a step. :func:`start` therefore runs, in a thread, one
training forward + backward and one evaluation forward of each distinct recurrent mixer of the model
(plus a pre-norm with its residual add and the LM-head loss) at the run's micro-batch and sequence
length, in the dtypes its engine trains in, on throwaway weights; the kernels land in Triton's and
TileLang's caches (memory and disk) while the main thread reads the data and builds the model, and
the first step then finds them compiled. TileLang's nvcc and Triton's ptxas run outside the GIL.
KDA's backward waits for its TileLang kernel (built by a helper) before the Triton kernels around it
compile; with ``kernels.precompile_tilelang_overlap`` it runs at once with stand-ins for that
kernel's outputs (:func:`zebractl.train.tilelang_build.stand_in`) and they compile meanwhile.
With ``kernels.precompile_workers: N`` the step compiles its Triton kernels without launching them,
N at once (:mod:`zebractl.train.compile_only`); with ``kernels.precompile_processes: N``, N
processes started at launch compile them first (:mod:`zebractl.train.compile_procs`).

The thread never touches the process's random state (its inputs come from a private generator, its
modules are built on the meta device and filled from it), so a run is bitwise the same with and
without it; :meth:`Precompile.join` (before the first step) waits for it. Off with
``kernels.precompile: false``; nothing runs on CPU, with ``kernels.backend: torch`` or without FLA.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from zebractl.errors import first_line
from zebractl.schemas.recipe import RunConfig
from zebractl.train.exercise import exercise


@dataclass
class Precompile:
    """A background compilation started by :func:`start`."""

    thread: threading.Thread | None = None
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None
    error: BaseException | None = None
    helpers: list[threading.Thread] = field(default_factory=list)
    """Threads that build TileLang kernels (see :func:`tilelang_builds`)."""
    processes: str | None = None
    """With ``precompile_processes``: what :func:`zebractl.train.compile_procs.wait` said."""
    overlapped: bool = False
    """KDA's backward ran with stand-ins for its TileLang kernel (``precompile_tilelang_overlap``)."""
    compiled: Any = None
    """With ``kernels.precompile_workers``: what the compile-only step did
    (:class:`zebractl.train.compile_only.CompileOnly`)."""

    def join(self) -> str:
        """Wait for the thread; one line for the log (how long it took, how long the main thread
        waited for it, or why it failed: the first step then compiles what is missing)."""
        t0 = time.perf_counter()
        if self.thread is not None:
            self.thread.join()
        for helper in self.helpers:
            helper.join()
        waited = time.perf_counter() - t0
        if self.error is not None:
            first = first_line(self.error, type(self.error).__name__)
            return (
                f"note: compiling the kernels in the background failed ({type(self.error).__name__}:"
                f" {first}); the first step compiles them"
            )
        took = (self.finished or time.perf_counter()) - self.started
        how = ""
        if self.compiled is not None:
            left = len(self.compiled.untuned)
            how = f"; {self.compiled.submitted} kernel calls compiled without launching" + (
                f", {left} autotuned kernels left to the first step" if left else ""
            )
        if self.overlapped:
            how += "; KDA's backward compiled beside its TileLang kernel"
        if self.processes:
            how += f"; {self.processes}"
        return (
            f"kernels compiled in the background in {took:.1f} s (setup waited {waited:.1f} s{how})"
        )


def start(cfg: RunConfig, device: Any) -> Precompile | None:
    """Start compiling ``cfg``'s kernels for ``device`` in a thread (None where nothing would be
    compiled: CPU, the torch backend, ``kernels.precompile: false``)."""
    from zebractl.train import compile_procs

    # the launcher's (spawn gives them back), or now; the key is read on every device
    procs = compile_procs.spawn(cfg) if compile_procs.wanted(cfg) and device.type == "cuda" else []
    workers = cfg.kernels.precompile_workers  # read on every device (used on CUDA only)
    overlap = cfg.kernels.precompile_tilelang_overlap  # likewise
    if cfg.kernels.precompile and cfg.kernels.precompile_tilelang == "process":
        # started by the launcher already (then this is that process), or now: the trainer run
        # without the launcher (the Python API); nothing without a GPU
        from zebractl.train import tilelang_build

        tilelang_build.spawn(cfg)
    if not cfg.kernels.precompile or device.type != "cuda" or cfg.kernels.backend == "torch":
        return None
    from zebractl.model.ops import kernel_options

    try:
        if kernel_options(cfg.kernels, device).backend != "fla":
            return None
    except Exception:  # noqa: BLE001 - FLA missing: the trainer reports that itself
        return None
    job = Precompile()
    for build in tilelang_builds(cfg):  # nvcc in threads of their own, beside the Triton compiles

        def helper(build=build) -> None:
            build()
            job.finished = max(job.finished or 0.0, time.perf_counter())

        job.helpers.append(threading.Thread(name="zebractl-tilelang", daemon=True, target=helper))
        job.helpers[-1].start()

    overlap = overlap and bool(job.helpers)
    stood_in = False

    def wait_for_helpers(kind: str) -> None:
        # TileLang does not share a compilation in flight: a second request would compile again;
        # with the stand-in there is no request (join() waits for the helpers instead)
        if kind == "kda" and not stood_in:
            for helper in job.helpers:
                helper.join()

    def target() -> None:
        nonlocal stood_in
        try:
            if procs:  # their kernels are in the disk cache once they exit
                job.processes = compile_procs.wait(procs)
            from zebractl.train import compile_only, tilelang_build

            stand_in = tilelang_build.stand_in() if overlap else contextlib.nullcontext(False)
            with stand_in as stood_in:
                job.overlapped = stood_in
                if workers and compile_only.supported():
                    with compile_only.compile_only(workers) as job.compiled:
                        exercise(cfg, device, wait_for_helpers)
                else:
                    exercise(cfg, device, wait_for_helpers)
        except BaseException as exc:  # noqa: BLE001 - reported by join(); the step compiles then
            job.error = exc
        finally:
            job.finished = max(job.finished or 0.0, time.perf_counter())

    job.thread = threading.Thread(name="zebractl-precompile", daemon=True, target=target)
    job.thread.start()
    return job


def tilelang_builds(cfg: RunConfig) -> list[Any]:
    """Zero-argument builders of the TileLang kernels FLA will compile for ``cfg``'s training step
    (:mod:`zebractl.train.tilelang_build`), each run in a helper thread beside the Triton
    compiles: KDA's backward built here, or, where the launcher started its process
    (``kernels.precompile_tilelang: process``), a wait for that process. Empty where FLA runs no
    TileLang kernel (or anything is unexpected: FLA then compiles it itself as before)."""
    from zebractl.train import tilelang_build

    proc = tilelang_build.spawned(cfg)
    if proc is not None:
        return [proc.wait]
    shapes = tilelang_build.spec(cfg)
    build = None if shapes is None else tilelang_build.prepare(**shapes)
    return [] if build is None else [build]

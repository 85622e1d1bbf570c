"""A run's Triton kernels compiled in processes of their own, started at launch
(``kernels.precompile_processes: N``).

The background compilation (:mod:`zebractl.train.precompile`) compiles a step's kernels in one
thread of the run's process, after setup has imported everything: on an H200 (2026-12-06, 426c5e6)
kda_300M's setup then waited ~30 s for it, the imports before it took ~15 s, and compiling the same
kernels in threads (``precompile_workers``) or beside TileLang's build (``precompile_tilelang_overlap``)
did not shorten it: the Triton front end holds the interpreter. With N processes, :func:`spawn`
(called by the launcher before the run's own imports) starts ``python -m
zebractl.train.compile_procs I N CONFIG`` for I = 0..N-1; each imports torch and FLA beside the
run's imports, walks the background step's forward and backward without launching a kernel
(:func:`zebractl.train.compile_only.compile_only` with ``share=(I, N)``: it compiles every N-th
kernel call, so the N processes split the step's kernels) and exits. The compiled kernels land in
Triton's disk cache (the run's: :mod:`zebractl.runtime.kernel_cache` set it in the environment
they inherit), where the run's background compilation, which waits for the processes first
(:func:`wait`), then finds them.
KDA's TileLang kernel is not theirs (they run its stand-in: :func:`zebractl.train.tilelang_build.stand_in`);
``kernels.precompile_tilelang: process`` builds it from launch too. On an H100 (2026-12-06,
e87a0dd) four processes finished later than the thread (83 and 77 s after launch against 77 and
69 s: each imported torch, megatron-core and FLA first, beside the run's own imports): opt-in (the
key's docstring has the figures). The step they walk imports no megatron-core since.

Best effort, like the rest of the background compilation: a process that fails or is killed leaves
its kernels to the run (compiled as without it); :func:`wait` says how many failed. Each process
holds a CUDA context and the step's activations on the run's GPU until it exits, before the run's
first step. Under torchrun the N are the node's: each of its ``LOCAL_WORLD_SIZE`` ranks starts
N / ranks of them (at least one, on its rank's GPU), which split that rank's step.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from zebractl.schemas.recipe import RunConfig
from zebractl.train import tilelang_build

WAIT_S = 300.0
"""The longest the run waits for the processes (one thread compiled the step's kernels in ~30 s);
those still running then are stopped and the run compiles what they left."""


@dataclass
class Spawned:
    """The processes :func:`spawn` started and the configuration file they read."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    config: Path | None = None


_SPAWNED: dict[str, Spawned] = {}
"""What :func:`spawn` started in this process, by the run configuration's JSON."""


def wanted(cfg: RunConfig) -> int:
    """How many processes this rank starts for ``cfg``: its share of the node's
    ``kernels.precompile_processes`` (at least one; under torchrun ``LOCAL_WORLD_SIZE`` ranks share
    the node), 0 where they could do nothing (precompile off, the torch backend, no GPU visible)."""
    k = cfg.kernels
    n = k.precompile_processes  # read on every device (the tests read it on the CPU)
    if not n or not k.precompile or k.backend == "torch" or not tilelang_build.gpu_visible():
        return 0
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return -(-n // ranks)


def spawn(cfg: RunConfig) -> list[subprocess.Popen]:
    """Start the processes for ``cfg`` (none where :func:`wanted` says 0); once per configuration:
    a second call returns the first call's. Stopped at this process's exit if still running."""
    n = wanted(cfg)
    if not n:
        return []
    key = cfg.model_dump_json(by_alias=True)
    if key in _SPAWNED:
        return _SPAWNED[key].procs
    spawned = _SPAWNED[key] = Spawned()
    try:
        fd, name = tempfile.mkstemp(prefix="zebractl-compile-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(key)
        spawned.config = Path(name)
        for i in range(n):
            spawned.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "zebractl.train.compile_procs", str(i), str(n), name],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    except OSError:  # no temporary file or no process: the run compiles its kernels itself
        pass
    atexit.register(_stop, spawned)
    return spawned.procs


def wait(procs: list[subprocess.Popen], limit: float = WAIT_S) -> str:
    """Wait for the processes (at most ``limit`` seconds in all; those still running then are
    stopped); a few words for the background compilation's log line."""
    t0 = time.perf_counter()
    failed = 0
    for proc in procs:
        left = max(0.0, limit - (time.perf_counter() - t0))
        try:
            code = proc.wait(left)
        except subprocess.TimeoutExpired:
            tilelang_build.stop_process(proc)
            code = -1
        failed += code != 0
    took = time.perf_counter() - t0
    return f"{len(procs)} compile processes ({failed} failed; waited {took:.1f} s)"


def _stop(spawned: Spawned) -> None:
    for proc in spawned.procs:
        tilelang_build.stop_process(proc)
    if spawned.config is not None:
        with contextlib.suppress(OSError):
            spawned.config.unlink()


def main(argv: list[str]) -> int:
    """``python -m zebractl.train.compile_procs INDEX COUNT CONFIG``: compile this process's share
    of the step's kernels; 0 when done (also where nothing applies: no CUDA, a Triton without
    what :mod:`zebractl.train.compile_only` needs), 1 when the walk failed (FLA missing
    included), 2 for arguments that are not that."""
    try:
        index, count = int(argv[0]), int(argv[1])
        cfg = RunConfig.model_validate_json(Path(argv[2]).read_text(encoding="utf-8"))
    except (IndexError, ValueError, OSError):
        return 2
    if not 0 <= index < count:
        return 2
    import torch

    if not torch.cuda.is_available():
        return 0
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # a torchrun rank's own GPU
    from zebractl.train import compile_only
    from zebractl.train.exercise import exercise

    if not compile_only.supported():
        return 0
    if cfg.kernels.lean_fla_import:
        from zebractl.runtime import fla_import

        fla_import.lean()
    try:
        with tilelang_build.stand_in(), compile_only.compile_only(2, share=(index, count)):
            exercise(cfg, torch.device("cuda", torch.cuda.current_device()))
    except Exception:  # noqa: BLE001 - best effort: the run compiles what is missing itself
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

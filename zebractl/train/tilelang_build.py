"""KDA's TileLang backward kernel, compiled ahead of the first step: in a thread of the run's
process (the default) or in a Python process of its own started at launch.

FLA 0.6.0 runs KDA's fused backward (``chunk_kda_bwd_wy_dqkg_fused``) as a TileLang kernel whenever
its TileLang backend can be used (tilelang and nvcc present, not disabled by ``FLA_TILELANG=0``) and
k and v have as many heads; the kernel is specialised on the batch size, the head counts and dims,
and compiled the first time (33 s of nvcc on an H200): the longest single piece of a cold start.
:func:`prepare` derives the arguments FLA's wrapper derives
(fla/ops/kda/backends/tilelang/chunk_bwd_dqkg.py) and returns the build; the kernel lands in
TileLang's caches (memory and disk) and FLA's own call finds it there.

``kernels.precompile_tilelang: thread``: :mod:`zebractl.train.precompile` runs the build in a
thread once setup has imported FLA. ``process``: :func:`spawn`, called by the launcher before the
trainer's imports, starts ``python -m zebractl.train.tilelang_build`` with the shapes; that process
imports FLA and TileLang and runs nvcc beside the run's own imports and setup (TileLang's disk cache
is where the run finds the kernel), and the background compilation waits for it before KDA's
backward. Anything unexpected (another FLA version, a changed signature, no GPU) builds nothing:
FLA then compiles the kernel at the first backward, as without either.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from zebractl.schemas.recipe import RunConfig

_SPAWNED: dict[str, subprocess.Popen] = {}
"""The processes :func:`spawn` started in this process, by their shapes (:func:`spec`)."""


def spec(cfg: RunConfig) -> dict[str, int] | None:
    """The shapes KDA's TileLang backward is specialised on for ``cfg``'s training step; None where
    FLA runs no TileLang kernel for it (no KDA mixer; more v heads than k heads: FLA's TileLang
    kernel refuses GQA and Triton runs it)."""
    if "kda" not in cfg.model.sublayers:
        return None
    d = cfg.model.linear_attention_dims("kda")
    if d.num_v_heads != d.num_heads:
        return None
    return {"batch": cfg.batch.micro, "heads": d.num_heads, "k": d.head_k_dim, "v": d.head_v_dim}


def prepare(batch: int, heads: int, k: int, v: int) -> Callable[[], None] | None:
    """A zero-argument build of KDA's TileLang backward for these shapes, or None where FLA would
    not use TileLang here (or FLA is another version). Imports FLA and TileLang."""
    try:
        import triton
        from fla.backends import _DISPATCH_DISABLED, TileLangBackend
        from fla.ops.kda.backends.tilelang.chunk_bwd_dqkg import _build_kda_bwd_kernel
        from fla.utils import check_shared_mem

        if _DISPATCH_DISABLED or not TileLangBackend.can_use():
            return None
        tiling = 64 if check_shared_mem() else 32
        bk = min(max(triton.next_power_of_2(k), 16), tiling)
        bv = min(max(triton.next_power_of_2(v), 16), tiling)
        args = (batch, heads, k, v, 64, bk, bv, k, v, "bfloat16", False, False)
    except Exception:  # noqa: BLE001 - best effort: FLA compiles it on first use otherwise
        return None

    def build() -> None:
        # on failure FLA compiles it itself at the first backward
        with contextlib.suppress(Exception):
            _build_kda_bwd_kernel(*args, num_warps=8 if k <= 64 else 4)

    return build


_BACKWARD = "chunk_kda_bwd_wy_dqkg_fused"
"""FLA's dispatched name of KDA's fused backward, the one kernel its TileLang backend replaces."""


@contextlib.contextmanager
def stand_in() -> Iterator[bool]:
    """While inside, in the thread that entered and nowhere else, FLA's TileLang implementation of
    KDA's fused backward returns fresh tensors of its outputs' shapes, dtypes and layouts (what
    ``chunk_kda_bwd_wy_dqkg_fused_tilelang`` allocates) without compiling or running its kernel;
    other threads get the kernel. Yields whether the stand-in is in place (False where FLA is not
    the version this knows: nothing is changed then).

    The background compilation (``kernels.precompile_tilelang_overlap``) runs KDA's backward on
    throwaway weights under it, so the Triton kernels after the TileLang one compile while nvcc
    builds it elsewhere instead of after it; their inputs are then uninitialised memory, which
    only a kernel's compilation sees (shapes, dtypes, alignment), never the run."""
    try:
        import torch
        from fla.ops.kda.backends.tilelang import KDATileLangBackend

        original = KDATileLangBackend.__dict__[_BACKWARD]
        signature = inspect.signature(original)
        if not {"q", "k", "v", "g", "beta", "A"} <= signature.parameters.keys():
            raise TypeError(f"{_BACKWARD}{signature}")
    except Exception:  # noqa: BLE001 - another FLA: no stand-in, the caller waits for the kernel
        yield False
        return
    owner = threading.get_ident()

    def backward(self, *args, **kwargs):
        if threading.get_ident() != owner:
            return original(self, *args, **kwargs)
        a = signature.bind(self, *args, **kwargs).arguments
        f = torch.float
        return (
            torch.empty_like(a["q"], dtype=f),
            torch.empty_like(a["k"], dtype=f),
            torch.empty_like(a["v"]),
            torch.empty_like(a["beta"], dtype=f),
            torch.empty_like(a["g"], dtype=f),
            torch.empty_like(a["A"], dtype=f),
        )

    setattr(KDATileLangBackend, _BACKWARD, functools.wraps(original)(backward))
    try:
        yield True
    finally:
        setattr(KDATileLangBackend, _BACKWARD, original)


def gpu_visible() -> bool:
    """A CUDA device this process could use, judged without importing torch."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidiactl").exists()


def spawn(cfg: RunConfig) -> subprocess.Popen | None:
    """Start the build in a process of its own (``kernels.precompile_tilelang: process``, precompile
    on, FLA's kernels, a GPU visible, KDA in the model); None otherwise. One process per set of
    shapes; stopped at this process's exit if still running."""
    k = cfg.kernels
    shapes = spec(cfg)
    if (
        shapes is None
        or not k.precompile
        or k.precompile_tilelang != "process"
        or k.backend == "torch"
        or not gpu_visible()
    ):
        return None
    key = json.dumps(shapes, sort_keys=True)
    if key in _SPAWNED:
        return _SPAWNED[key]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "zebractl.train.tilelang_build", key]
            + (["lean"] if k.lean_fla_import else []),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None
    _SPAWNED[key] = proc
    atexit.register(stop_process, proc)
    return proc


def spawned(cfg: RunConfig) -> subprocess.Popen | None:
    """The process :func:`spawn` started for ``cfg``'s shapes, if any."""
    shapes = spec(cfg)
    return None if shapes is None else _SPAWNED.get(json.dumps(shapes, sort_keys=True))


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate ``proc`` if it still runs (killed after 5 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str]) -> int:
    """``python -m zebractl.train.tilelang_build '{"batch": B, "heads": H, "k": K, "v": V}' [lean]``:
    build the kernel (exit 0 also where nothing applies; ``lean``: FLA imported as
    ``kernels.lean_fla_import`` imports it); 2 for arguments that are not that."""
    try:
        shapes = json.loads(argv[0])
        batch, heads, k, v = (int(shapes[n]) for n in ("batch", "heads", "k", "v"))
    except (IndexError, ValueError, KeyError, TypeError):
        return 2
    if argv[1:] not in ([], ["lean"]):
        return 2
    if argv[1:]:
        from zebractl.runtime import fla_import

        fla_import.lean()
    if "LOCAL_RANK" in os.environ:  # a torchrun rank's process: that rank's GPU, not GPU 0
        with contextlib.suppress(Exception):
            import torch

            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    build = prepare(batch, heads, k, v)
    if build is not None:
        build()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Distributed setup: megatron's parallel state for one process (CPU, meta builds) or torchrun."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


def launched_world() -> tuple[int, int]:
    """(rank, world size) of this process as its launcher (torchrun, or the Slurm script, which
    exports torchrun's variables per task) set them; (0, 1) when started directly."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def ensure_initialized() -> None:
    """Make sure torch.distributed and megatron's parallel state exist (one model-parallel rank:
    no tensor, pipeline or context parallelism).

    Under torchrun (RANK/WORLD_SIZE set) this joins the job; without a launcher it creates a
    one-process group on an in-memory store (no ports), which is all a single-device run, a
    meta-device build or a test needs. CUDA tensors use NCCL, CPU tensors gloo.
    """
    import torch  # here, not at the top: :func:`launched_world` must not import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        # CUDA tensors go through NCCL (megatron's DDP and optimizer reduce them even on one
        # GPU), CPU tensors through gloo
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1
        )


@contextlib.contextmanager
def scoped() -> Iterator[None]:
    """:func:`ensure_initialized` for the duration of a ``with`` block: what it had to create
    (the process group, megatron's parallel state) is torn down afterwards, so a one-off job in a
    process (convert, verify) leaves no process-wide state behind."""
    global _CPU_GROUP
    import torch.distributed as dist
    from megatron.core import parallel_state

    had_group, had_state = dist.is_initialized(), parallel_state.model_parallel_is_initialized()
    ensure_initialized()
    try:
        yield
    finally:
        if not had_state:
            parallel_state.destroy_model_parallel()
        if not had_group:
            _CPU_GROUP = None  # a group of the process group destroyed here
            dist.destroy_process_group()


_CPU_GROUP: Any = None


def cpu_group() -> Any:
    """A gloo group for small collectives between steps (the stop agreement, a checkpoint's
    verdict): no GPU synchronisation. Made once per process."""
    global _CPU_GROUP
    import torch.distributed as tdist

    if _CPU_GROUP is None:
        # one-process-per-GPU runs use "cpu:gloo,cuda:nccl": CPU tensors already go through gloo
        gloo = "gloo" in str(tdist.get_backend())
        _CPU_GROUP = tdist.group.WORLD if gloo else tdist.new_group(backend="gloo")
    return _CPU_GROUP

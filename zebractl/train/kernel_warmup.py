"""`zebractl warmup RECIPE`: compile and tune a recipe's GPU kernels into the kernel cache ahead of
a job, so that the job's first step does not spend minutes autotuning.

It builds the recipe's model in the dtype its engine trains in (bf16 parameters for the Megatron
engine, fp32 parameters under bf16 autocast for torch_fused), and runs one training forward +
backward and one evaluation forward on random tokens at each requested micro-batch (default: the
recipe's) and the recipe's sequence length: the kernels, shapes and dtypes of a training step and
of validation. The optimizer runs no Triton kernels and is not built. Results land in the cache
:mod:`zebractl.runtime.kernel_cache` sets up (the same one `zebractl train` uses).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from zebractl.errors import ConfigError
from zebractl.schemas.recipe import RunConfig

if TYPE_CHECKING:
    from zebractl.schemas.reports import WarmupReport


@dataclass
class WarmupResult:
    """What a warmup did."""

    cache: str
    """The Triton cache folder."""
    stack: str
    """The software stack the cache is for."""
    shipped: str | None
    """The shipped tuned-configuration set used to seed it, if any."""
    seconds: dict[int, float] = field(default_factory=dict)
    """Micro-batch -> seconds of its first forward + backward + evaluation forward."""
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    exported: Path | None = None
    exported_files: int = 0
    exported_compiled: Path | None = None
    exported_compiled_kernels: int = 0
    compiled_seeded: int = 0


def check_supported(device_is_cuda: bool) -> None:
    """Warmup compiles CUDA kernels: refuse (exit 2) where there are none to compile."""
    if not device_is_cuda:
        raise ConfigError(
            "zebractl warmup compiles FLA's CUDA kernels, and this machine has no CUDA GPU (the CPU "
            "backend has no kernels to compile or tune); run it on the GPU machine the job uses"
        )


def check_export_paths(paths: dict[str, Path | None]) -> None:
    """Refuse (exit 2) an archive path that cannot be written, before minutes of compiling: an
    existing folder, or a folder under something that is not one or cannot be written."""
    for option, path in paths.items():
        if path is None:
            continue
        if path.is_dir():
            raise ConfigError(f"{option} {path}: a folder; give the archive's file name")
        parent = next((p for p in path.absolute().parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            raise ConfigError(f"{option} {path}: {parent} is a file, not a folder")
        if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{option} {path}: {parent} cannot be written")


def warm_kernels(
    cfg: RunConfig,
    micro_batches: list[int] | None = None,
    export: Path | None = None,
    console: Callable[[str], None] = print,
    export_compiled: Path | None = None,
) -> WarmupResult:
    """Fill the kernel cache for ``cfg`` (see the module docstring)."""
    check_export_paths({"--export": export, "--export-compiled": export_compiled})
    import torch

    check_supported(torch.cuda.is_available())
    if cfg.kernels.backend == "torch":
        raise ConfigError(
            "kernels.backend is 'torch': the recipe runs no FLA kernels, so there is nothing to "
            "warm up (use kernels.backend auto or fla)"
        )
    from zebractl.train.engine import check_engine

    check_engine(cfg, torch.device("cuda"))  # e.g. kernels.fp8_mlp on a GPU without FP8
    micro_batches = micro_batches or [cfg.batch.micro]
    if any(m < 1 for m in micro_batches):
        raise ConfigError("--micro values must be at least 1")
    from zebractl.model.model import build_model
    from zebractl.runtime import kernel_cache

    cache = kernel_cache.configure_for(cfg.kernels)
    assert cache is not None  # CUDA is there
    console(cache.describe())
    result = WarmupResult(
        cache=str(cache.triton),
        stack=cache.stack.key,
        shipped=cache.shipped,
        before=kernel_cache.entries(cache.triton),
        compiled_seeded=cache.compiled_seeded,
    )
    megatron = cfg.optimizer.impl == "megatron" and cfg.precision == "bf16"
    dtype = torch.bfloat16 if megatron else torch.float32
    autocast = not megatron and cfg.precision == "bf16"
    model = build_model(
        cfg.model, kernels=cfg.kernels, device="cuda", seed=cfg.seed, params_dtype=dtype
    )
    seq = cfg.data.seq_length
    for micro in micro_batches:
        ids = torch.randint(0, cfg.model.vocab_size, (micro, seq), device="cuda")
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            model.train()
            loss_sum, n = model(ids, labels=ids.roll(-1, 1))
            (loss_sum / n).backward()
            model.eval()
            with torch.no_grad():
                model(ids, labels=ids.roll(-1, 1))
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        result.seconds[micro] = time.perf_counter() - t0
        console(f"micro-batch {micro} x {seq} tokens: {result.seconds[micro]:.1f} s")
        del ids, loss_sum, n
        torch.cuda.empty_cache()
    result.after = kernel_cache.entries(cache.triton)
    if export is not None:
        result.exported = export
        result.exported_files = kernel_cache.export(cache.triton, export)
        console(f"exported {result.exported_files} tuned configurations to {export}")
    if export_compiled is not None:
        from zebractl.runtime import compiled_kernels

        counts = compiled_kernels.export(cache.triton, cache.tilelang, export_compiled)
        result.exported_compiled, result.exported_compiled_kernels = export_compiled, counts.total
        console(
            f"exported {counts.triton} Triton kernels, {counts.modules} of their host modules and "
            f"{counts.tilelang} TileLang kernels to {export_compiled}"
        )
    return result


def report(recipe: str, res: WarmupResult) -> WarmupReport:
    """The ``warmup --json`` report of ``res``, a warmup of ``recipe``."""
    from zebractl.schemas.reports import WarmupReport

    return WarmupReport(
        recipe=recipe,
        cache=res.cache,
        stack=res.stack,
        shipped=res.shipped,
        seconds={str(k): v for k, v in res.seconds.items()},
        tuned_before=res.before["tuned"],
        tuned_after=res.after["tuned"],
        compiled_before=res.before["compiled"],
        compiled_after=res.after["compiled"],
        exported=str(res.exported) if res.exported else None,
        exported_files=res.exported_files,
        exported_compiled=str(res.exported_compiled) if res.exported_compiled else None,
        exported_compiled_kernels=res.exported_compiled_kernels,
        compiled_seeded=res.compiled_seeded,
    )

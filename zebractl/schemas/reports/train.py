"""``zebractl train --json`` (and ``--check``), ``zebractl warmup --json``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, FiniteFloat

from zebractl.schemas.base import StrictModel
from zebractl.schemas.reports.base import Report

# ---- zebractl train ---------------------------------------------------------------------------------


class TrainReport(Report):
    """``zebractl train RECIPE --json``: what the run did (one process, or the launcher)."""

    command: ClassVar[str] = "train"

    launched: Literal["train", "torchrun", "slurm"]
    """train: this process trained; torchrun: it launched --nproc workers (their own output is
    the run directory); slurm: it wrote (and maybe submitted) a batch script."""
    run_dir: str
    """The run directory."""
    exit_code: int
    """The exit code of the command: 0 done, 130/143/138 stopped by SIGINT/SIGTERM/SIGUSR1 after
    saving, or the launcher's or sbatch's code."""
    stopped: Literal["done", "signal", "limit"] | None = None
    """How training ended (train only)."""
    iterations: int | None = None
    """Optimizer steps completed (train only)."""
    resumed_from: int | None = None
    """Iteration of the checkpoint this process resumed from."""
    final_loss: FiniteFloat | None = None
    """Training loss of the last logging interval."""
    val_loss: FiniteFloat | None = None
    """The last validation loss."""
    skipped: int = 0
    """Updates skipped for non-finite values (nonfinite.action skip)."""
    checkpoint: str | None = None
    """The newest checkpoint folder."""
    total_iterations: int | None = Field(None, ge=0)
    """The run's resolved iterations (``schedule.iterations``, or ``train_tokens`` over the
    tokens of a step; after ``--set``) (train only)."""
    tokens: int | None = Field(None, ge=0)
    """Training tokens the run has consumed (samples x seq_length, a resumed run's earlier ones
    included) (train only)."""
    wall_seconds: FiniteFloat | None = Field(None, ge=0)
    """Seconds from the run's start in this process to its end: setup, kernel compilation,
    training, validation and saves (train only)."""
    mean_tokens_per_s: FiniteFloat | None = Field(None, ge=0)
    """Mean training tokens per second per process over this process's steps (the first,
    compiling, one included; validation and saves excluded, like the metrics rows'
    ``tokens_per_s``); null when it ran none (train only)."""
    metrics: str
    """The run's metrics.jsonl."""
    script: str | None = None
    """The Slurm batch script (slurm only)."""


class WarmupReport(Report):
    """``zebractl warmup RECIPE --json``: what was compiled and tuned into the kernel cache."""

    command: ClassVar[str] = "warmup"

    recipe: str
    """The recipe warmed up."""
    cache: str
    """The Triton cache folder (TRITON_CACHE_DIR) that now holds the kernels."""
    stack: str
    """The GPU and package versions the cache is for (its folder name)."""
    shipped: str | None
    """The tuned configurations shipped with zebractl that seeded the cache, if any ship for
    this stack."""
    seconds: dict[str, FiniteFloat]
    """Micro-batch -> seconds of its first training forward + backward and evaluation forward."""
    tuned_before: int
    """Tuned configurations (``*.autotune.json``) in the cache before."""
    tuned_after: int
    """... and after."""
    compiled_before: int
    """Compiled kernels (``*.cubin``) in the cache before."""
    compiled_after: int
    """... and after."""
    exported: str | None = None
    """--export: the archive written."""
    exported_files: int = 0
    """Tuned configurations in it."""
    exported_compiled: str | None = None
    """--export-compiled: the archive of compiled kernels written."""
    exported_compiled_kernels: int = 0
    """Compiled kernels in it (Triton binaries and TileLang libraries)."""
    compiled_seeded: int = 0
    """Compiled kernels copied into the cache from the set shipped for this stack
    (``kernels.shipped_compiled``) before the warmup."""


# ---- zebractl train --check ------------------------------------------------------------------------


class PreflightCheck(StrictModel):
    """One pre-flight check of `train --check`."""

    name: str
    """config, engine, gpus, data, memory or disk."""
    status: Literal["ok", "not checked", "failed"]
    """not checked: this machine cannot check it (no GPU, no CUDA); never counted as passed."""
    detail: str
    """What was found."""


class TrainCheckReport(Report):
    """``zebractl train RECIPE --check --json``: the pre-flight checks of a run, no training."""

    command: ClassVar[str] = "train --check"

    recipe: str
    """The recipe as given."""
    ok: bool
    """No check failed (rows not checked allowed)."""
    checks: list[PreflightCheck]
    """Every check, in order."""

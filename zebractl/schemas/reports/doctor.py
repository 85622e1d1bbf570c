"""``zebractl doctor --json`` and ``zebractl env --json``."""

from __future__ import annotations

from typing import ClassVar, Literal

from zebractl.schemas.base import StrictModel
from zebractl.schemas.reports.base import Report

# ---- zebractl doctor -------------------------------------------------------------------------------


class DoctorModule(StrictModel):
    """One module a command imports at run time, imported for real."""

    module: str
    """The module, e.g. ``fla.models`` or ``zebractl.convert.hf``."""
    ok: bool
    """It imported."""
    error: str | None = None
    """The import's error in one line (``ModuleNotFoundError: No module named 'triton'``)."""
    install: str | None = None
    """The fix: the pip command of the extra that provides the missing module."""


class DoctorCommand(StrictModel):
    """Whether one command can run here."""

    command: str
    """The command (``compare --fla``: compare's reference training)."""
    ok: bool
    """Every module it needs imported."""
    extra: str
    """The extra that installs everything this command imports."""
    modules: list[DoctorModule]
    """Each module, in import order."""


class DoctorReport(Report):
    """``zebractl doctor --json``: what each command needs, imported for real, and the stack."""

    command: ClassVar[str] = "doctor"

    ok: bool
    """Every command asked about can run."""
    commands: list[DoctorCommand]
    """Each command asked about."""
    versions: dict[str, str | None]
    """Installed version of each package zebractl's runtime uses (None: not installed)."""
    cuda: str | None
    """The CUDA device torch sees (name), or None (no torch, no GPU)."""


class EnvGpu(StrictModel):
    """One GPU of this machine."""

    index: int
    """Device index (as nvidia-smi or torch numbers it)."""
    name: str
    """Device name, e.g. ``NVIDIA H200``."""
    memory_gib: float | None = None
    """Total memory, GiB (None: not reported)."""
    driver: str | None = None
    """Driver version (nvidia-smi only)."""


class EnvPath(StrictModel):
    """A path zebractl reads or writes, and whether it exists."""

    name: str
    """What it is, e.g. ``kernel cache`` or ``TRITON_CACHE_DIR``."""
    path: str
    """The path (absolute)."""
    exists: bool
    """It exists here."""
    note: str | None = None
    """Where the setting came from, or what is in it."""


class EnvReport(Report):
    """``zebractl env --json``: the versions, GPUs, caches and paths of this machine, for a bug
    report."""

    command: ClassVar[str] = "env"

    zebractl: str
    """zebractl's version."""
    python: str
    """Python's version."""
    python_executable: str
    """The interpreter running zebractl."""
    platform: str
    """Operating system, kernel and architecture (``platform.platform()``)."""
    versions: dict[str, str | None]
    """Installed version of each package zebractl's runtime uses (None: not installed); the same
    list as ``zebractl doctor``."""
    torch_cuda: str | None = None
    """The CUDA version torch was built with (None: a CPU build, or no torch)."""
    cuda_available: bool | None = None
    """torch sees a CUDA device (None: torch is not importable)."""
    torch_error: str | None = None
    """Why torch did not import, in one line (None: it did, or it is not installed)."""
    gpus: list[EnvGpu]
    """The GPUs of this machine (empty: none found)."""
    gpu_source: Literal["nvidia-smi", "torch", "none"]
    """Where the GPU list came from."""
    kernel_stacks: list[str]
    """Kernel cache folders present under the kernel cache (one per GPU/torch/triton/FLA stack)."""
    shipped_kernel_configs: list[str]
    """Kernel sets shipped with zebractl: tuned configurations (``<stack>.tar.xz``) and compiled
    kernels (``<stack>.compiled.tar.xz``)."""
    paths: list[EnvPath]
    """Caches and folders zebractl uses: the kernel cache, Triton's and TileLang's cache folders,
    the Hugging Face cache, the shipped recipes and presets, the package, the working directory."""
    environment: dict[str, str]
    """Environment variables that change zebractl's behaviour (CUDA, NCCL, Triton, Hugging Face,
    ZEBRACTL_*), as set; never variables whose name holds TOKEN, KEY, SECRET or PASSWORD."""

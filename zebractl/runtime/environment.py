"""`zebractl env`: what a bug report needs to know about this machine, in one report; and
`zebractl doctor`'s report (:func:`doctor`).

Versions (the same list as ``zebractl doctor``: :func:`zebractl.deps.versions`), the GPUs
(``nvidia-smi`` when it is on PATH, else torch), the kernel cache and the other caches and paths
zebractl uses, and the environment variables that change its behaviour. torch is imported only
here, lazily, and a torch that fails to import is reported, not raised.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from zebractl.schemas.reports import DoctorReport, EnvGpu, EnvPath, EnvReport

_ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "NVIDIA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
    "TRITON_CACHE_DIR", "TRITON_CACHE_AUTOTUNING", "TILELANG_CACHE_DIR", "HF_HOME",
    "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE", "XDG_CACHE_HOME", "OMP_NUM_THREADS", "SLURM_JOB_ID",
)  # fmt: skip
_ENV_PREFIXES = ("ZEBRACTL_", "NCCL_", "TORCH_", "TRITON_")
_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def _environment() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if (k in _ENV_NAMES or k.startswith(_ENV_PREFIXES)) and not _SECRET.search(k)
    }


def _nvidia_smi() -> list[EnvGpu] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total,driver_version",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        try:
            mem = round(float(parts[2]) / 1024, 1)  # MiB
        except ValueError:
            mem = None
        gpus.append(EnvGpu(index=int(parts[0]), name=parts[1], memory_gib=mem, driver=parts[3]))
    return gpus


def _torch() -> tuple[str | None, bool | None, str | None, list[EnvGpu]]:
    """torch's CUDA build, whether it sees a GPU, its import error, and the GPUs it sees."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None, None, None, []
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch is what the report is for
        return (
            None,
            None,
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            [],
        )
    cuda = torch.cuda.is_available()
    gpus = []
    if cuda:
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append(
                EnvGpu(index=i, name=props.name, memory_gib=round(props.total_memory / 2**30, 1))
            )
    return torch.version.cuda, cuda, None, gpus


def _path(name: str, path: Path | str, note: str | None = None) -> EnvPath:
    p = Path(path).expanduser()
    try:
        exists = p.exists()
    except OSError:
        exists = False
    return EnvPath(name=name, path=str(p.absolute()), exists=exists, note=note)


def collect() -> EnvReport:
    """The environment report of this process and machine."""
    from zebractl import __version__
    from zebractl.config import catalog
    from zebractl.deps import versions
    from zebractl.runtime import kernel_cache

    torch_cuda, cuda_available, torch_error, torch_gpus = _torch()
    smi = _nvidia_smi()
    if smi:
        gpus, source = smi, "nvidia-smi"
    elif torch_gpus:
        gpus, source = torch_gpus, "torch"
    else:
        gpus, source = [], "none"

    root = kernel_cache.cache_root()
    kernels = root / "kernels"
    try:
        stacks = sorted(p.name for p in kernels.iterdir() if p.is_dir()) if kernels.is_dir() else []
    except OSError:
        stacks = []
    shipped = sorted(p.name for p in kernel_cache.SHIPPED.glob("*.tar.xz"))
    where = f"${kernel_cache.CACHE_ENV}" if os.environ.get(kernel_cache.CACHE_ENV) else "default"
    paths = [_path("kernel cache", kernels, f"{where}; {len(stacks)} stack folder(s)")]
    for var in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR"):
        if os.environ.get(var):
            paths.append(_path(var, os.environ[var], "set in the environment"))
        else:
            paths.append(
                EnvPath(
                    name=var,
                    path=str(kernels / "<stack>" / var.split("_")[0].lower()),
                    exists=False,
                    note="unset: zebractl train/warmup set it per stack",
                )
            )
    hf_home = os.environ.get("HF_HOME") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    paths.append(
        _path("Hugging Face cache", hf_home, "$HF_HOME" if "HF_HOME" in os.environ else "default")
    )
    data = catalog.data_root()
    paths += [
        _path("shipped recipes", data / "recipes"),
        _path("shipped presets", data / "presets"),
        _path("zebractl package", Path(__file__).resolve().parents[1]),
        _path("working directory", Path.cwd()),
    ]
    return EnvReport(
        zebractl=__version__,
        python=platform.python_version(),
        python_executable=sys.executable,
        platform=platform.platform(),
        versions=versions(),
        torch_cuda=torch_cuda,
        cuda_available=cuda_available,
        torch_error=torch_error,
        gpus=gpus,
        gpu_source=source,
        kernel_stacks=stacks,
        shipped_kernel_configs=shipped,
        paths=paths,
        environment=_environment(),
    )


def markdown(report: EnvReport) -> str:
    """The report as Markdown, ready to paste into an issue."""
    lines = ["### zebractl env", ""]
    lines += [
        f"- zebractl {report.zebractl}, Python {report.python} ({report.python_executable})",
        f"- platform: {report.platform}",
    ]
    if report.torch_error:
        lines.append(f"- torch: does not import: {report.torch_error}")
    elif report.cuda_available is not None:
        cuda = f"CUDA {report.torch_cuda}" if report.torch_cuda else "CPU build"
        lines.append(f"- torch: {cuda}, GPU visible: {'yes' if report.cuda_available else 'no'}")
    if report.gpus:
        for g in report.gpus:
            mem = f", {g.memory_gib:g} GiB" if g.memory_gib is not None else ""
            drv = f", driver {g.driver}" if g.driver else ""
            lines.append(f"- GPU {g.index}: {g.name}{mem}{drv} ({report.gpu_source})")
    else:
        lines.append("- GPU: none found")
    lines += ["", "| package | version |", "|---|---|"]
    lines += [f"| {k} | {v or 'not installed'} |" for k, v in report.versions.items()]
    lines += ["", "| path | exists | location | note |", "|---|---|---|---|"]
    lines += [
        f"| {p.name} | {'yes' if p.exists else 'no'} | `{p.path}` | {p.note or ''} |"
        for p in report.paths
    ]
    lines += ["", f"kernel cache stacks: {', '.join(report.kernel_stacks) or 'none'}"]
    lines.append(f"shipped kernel configs: {', '.join(report.shipped_kernel_configs) or 'none'}")
    if report.environment:
        lines += ["", "environment:", "", "```"]
        lines += [f"{k}={v}" for k, v in report.environment.items()]
        lines.append("```")
    return "\n".join(lines) + "\n"


def doctor(commands: list[str] | None) -> DoctorReport:
    """``zebractl doctor``: whether each of ``commands`` (default: all) can run here, each module
    it needs imported for real (:func:`zebractl.deps.probe`); versions and the GPU torch sees."""
    from zebractl.deps import EXTRA_FOR, NEEDS, probe, versions
    from zebractl.errors import ConfigError
    from zebractl.schemas.reports import DoctorCommand, DoctorModule

    wanted = list(commands or NEEDS)
    for c in wanted:
        if c not in NEEDS:
            raise ConfigError(f"doctor: unknown command {c!r} (one of: {', '.join(NEEDS)})")
    if "compare" in wanted and commands:
        wanted.append("compare --fla")  # compare without --fla is only its plots
    rows = []
    for c in dict.fromkeys(wanted):
        mods = [DoctorModule(module=p.module, ok=p.error is None, error=p.error, install=p.install)
                for p in probe(c)]  # fmt: skip
        rows.append(
            DoctorCommand(command=c, ok=all(m.ok for m in mods), extra=EXTRA_FOR[c], modules=mods)
        )
    return DoctorReport(
        ok=all(r.ok for r in rows), commands=rows, versions=versions(), cuda=_cuda_name()
    )


def _cuda_name() -> str | None:
    """The name of GPU 0 as torch sees it; None without torch or a CUDA GPU."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None

"""Where compiled GPU kernels and their tuned configurations live between runs.

FLA's Triton kernels autotune on first use: every candidate configuration is compiled and timed,
which took 3-9 minutes for a 300M model's first step on a fresh H200. Triton can keep both the
compiled binaries and the autotuning winners on disk (``TRITON_CACHE_DIR``; the winners only when
``TRITON_CACHE_AUTOTUNING=1`` or the kernel asks for it), and TileLang (FLA's Hopper backend for
one GDN backward kernel) keeps its compiled kernels in ``TILELANG_CACHE_DIR``. :func:`configure`:

1. points both at a persistent per-user cache, one folder per software stack,
   ``~/.cache/zebractl/kernels/<gpu>_torch-<v>_triton-<v>_fla-<v>/{triton,tilelang}``
   (``$ZEBRACTL_CACHE_DIR`` replaces ``~/.cache/zebractl``; a variable the user set is left alone);
2. turns on Triton's autotune cache for every kernel (``TRITON_CACHE_AUTOTUNING=1``);
3. seeds the Triton cache with the **tuned configurations shipped in this package** for the stack,
   if there are any (``zebractl/runtime/kernel_configs/<stack>.tar.xz``: the ``*.autotune.json``
   winners of every kernel a shipped recipe runs, measured on that GPU; see that folder's
   README.md). A fresh machine then compiles only the winning configuration of each kernel instead of
   timing every candidate. Triton keys each file by its own version, the GPU target, the kernel's
   source, the candidate list and the tuning key, so a file that does not fit is never used: the
   kernel falls back to autotuning.

4. with ``compiled`` (``kernels.shipped_compiled``, on by default), seeds both caches with the
   **compiled kernels shipped** for the GPU architecture and packages
   (``sm<NN>_torch-<v>_triton-<v>_fla-<v>.compiled.tar.xz``,
   :mod:`zebractl.runtime.compiled_kernels`): a fresh machine then loads the shipped recipes'
   kernels instead of compiling them.

``zebractl warmup RECIPE`` fills the cache ahead of a job. Nothing here imports torch or triton at
module level; the stack is read from the installed packages.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import tarfile
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebractl.runtime import compiled_kernels

CACHE_ENV = "ZEBRACTL_CACHE_DIR"
"""Replaces ``~/.cache/zebractl`` (the cache root) when set."""
SHIPPED = Path(__file__).with_name("kernel_configs")
"""The tuned configurations shipped with the package, one ``<stack>.tar.xz`` per stack."""
_SEEDED = ".zebractl-seeded"


@dataclass(frozen=True)
class Stack:
    """What a tuned kernel configuration is valid for."""

    gpu: str
    torch: str
    triton: str
    fla: str
    arch: str | None = None
    """The GPU's compute capability, e.g. ``sm90`` (an H100 and an H200 alike)."""

    @property
    def key(self) -> str:
        """Folder and archive name, e.g. ``nvidia-h200_torch-2.11.0+cu130_triton-3.6.0_fla-0.6.0``."""
        return f"{self.gpu}_torch-{self.torch}_triton-{self.triton}_fla-{self.fla}"

    @property
    def compiled_key(self) -> str | None:
        """The shipped compiled kernels' archive stem: by compute capability, not GPU model (a
        binary runs on every GPU of its architecture; which tuned configuration a GPU picks is
        the tuned set's business), e.g. ``sm90_torch-2.11.0+cu130_triton-3.6.0_fla-0.6.0``."""
        if self.arch is None:
            return None
        return f"{self.arch}_torch-{self.torch}_triton-{self.triton}_fla-{self.fla}"


def slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9.+]+", "-", name.lower()).strip("-")


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "none"


def current_stack() -> Stack | None:
    """The stack of this process's first CUDA device (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return Stack(
        gpu=slug(torch.cuda.get_device_name()),
        torch=torch.__version__,
        triton=_version("triton"),
        fla=_version("fla-core"),
        arch=f"sm{major}{minor}",
    )


def cache_root(environ: MutableMapping[str, str] | None = None) -> Path:
    """``$ZEBRACTL_CACHE_DIR``, else ``$XDG_CACHE_HOME/zebractl``, else ``~/.cache/zebractl``."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "zebractl"


@dataclass
class KernelCache:
    """Where this process's kernels are cached, and where each setting came from."""

    stack: Stack
    triton: Path
    tilelang: Path
    sources: dict[str, str] = field(default_factory=dict)
    """Environment variable -> "zebractl" (set here) or "user" (already set, left alone)."""
    shipped: str | None = None
    """The shipped configuration set that matches the stack (None: none ships for it)."""
    seeded: int = 0
    """Tuned configurations copied from it into the cache by this call."""
    compiled: str | None = None
    """The shipped compiled-kernel set that matches the stack (None: none ships, or not asked)."""
    compiled_seeded: int = 0
    """Compiled kernels (Triton binaries, TileLang libraries) copied from it by this call."""

    def describe(self) -> str:
        """One line for a log."""
        ship = (
            f"{self.seeded} tuned configurations seeded from the shipped set {self.shipped}"
            if self.seeded
            else (
                f"shipped set {self.shipped} already seeded"
                if self.shipped
                else f"no tuned configurations ship for {self.stack.key} (kernels autotune)"
            )
        )
        if self.compiled_seeded:
            ship += f"; {self.compiled_seeded} compiled kernels seeded from {self.compiled}"
        elif self.compiled:
            ship += f"; compiled kernels of {self.compiled} already seeded"
        return f"kernel cache {self.triton.parent} ({ship})"


def configure(
    environ: MutableMapping[str, str] | None = None,
    stack: Stack | None = None,
    shipped_dir: Path = SHIPPED,
    compiled: bool = True,
) -> KernelCache | None:
    """Set up the persistent kernel cache for this process and the ones it starts (see the module
    docstring; ``compiled``: seed the shipped compiled kernels too). Returns None without CUDA
    (nothing to compile)."""
    env = os.environ if environ is None else environ
    stack = stack or current_stack()
    if stack is None:
        return None
    root = cache_root(env) / "kernels" / stack.key
    wanted = {
        "TRITON_CACHE_DIR": root / "triton",
        "TILELANG_CACHE_DIR": root / "tilelang",
        "TRITON_CACHE_AUTOTUNING": "1",
    }
    sources = {}
    for var, value in wanted.items():
        if env.get(var):
            sources[var] = "user"
        else:
            env[var] = str(value)
            sources[var] = "zebractl"
    cache = KernelCache(
        stack, Path(env["TRITON_CACHE_DIR"]), Path(env["TILELANG_CACHE_DIR"]), sources
    )
    archive = shipped_dir / f"{stack.key}.tar.xz"
    if archive.is_file():
        cache.shipped = archive.name
        cache.seeded = seed(cache.triton, archive)
    binaries = shipped_dir / f"{stack.compiled_key}{compiled_kernels.SUFFIX}"
    if compiled and stack.compiled_key and binaries.is_file():
        cache.compiled = binaries.name
        cache.compiled_seeded = compiled_kernels.seed(cache.triton, cache.tilelang, binaries).total
    return cache


def configure_for(kernels: Any) -> KernelCache | None:
    """:func:`configure` for a run whose recipe's ``kernels`` section is ``kernels`` (its
    ``shipped_compiled`` says whether the shipped compiled kernels are seeded)."""
    return configure(compiled=kernels.shipped_compiled)


def seed(triton_dir: Path, archive: Path) -> int:
    """Copy the archive's ``*.autotune.json`` files into ``triton_dir`` (never over an existing
    file; each file written atomically, so ranks seeding at once are safe). Returns the number
    copied. A damaged archive is reported and skipped: the kernels then autotune."""
    marker = triton_dir / _SEEDED
    if compiled_kernels.seeded(marker, archive):
        return 0
    copied = 0
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if (
                    not member.isfile()
                    or len(parts) != 2
                    or not parts[1].endswith(".autotune.json")
                    or any(p in ("", ".", "..") for p in parts)
                ):
                    continue  # only <hash>/<kernel>.autotune.json, never a path outside
                dest = triton_dir.joinpath(*parts)
                if dest.exists():
                    continue
                data = tar.extractfile(member)
                if data is None:
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                compiled_kernels.write_atomic(dest, data.read())
                copied += 1
    except compiled_kernels.SEED_ERRORS as exc:
        compiled_kernels.warn_unseeded(
            "the shipped kernel configurations",
            archive,
            "cannot be read",
            exc,
            "kernels will autotune",
        )
        return copied
    compiled_kernels.mark_seeded(marker, archive)
    return copied


def export(triton_dir: Path, dest: Path) -> int:
    """Write every ``<hash>/<kernel>.autotune.json`` under ``triton_dir`` into ``dest`` (.tar.xz):
    the shippable tuned configurations. Returns the number of files."""
    files = sorted(p for p in triton_dir.glob("*/*.autotune.json") if p.is_file())
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:xz") as tar:
        for p in files:
            info = tar.gettarinfo(str(p), arcname=f"{p.parent.name}/{p.name}")
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with p.open("rb") as f:
                tar.addfile(info, f)
    return len(files)


def entries(triton_dir: Path) -> dict[str, int]:
    """Counts of what the Triton cache holds: tuned configurations and compiled kernels."""
    if not triton_dir.is_dir():
        return {"tuned": 0, "compiled": 0}
    return {
        "tuned": sum(1 for _ in triton_dir.glob("*/*.autotune.json")),
        "compiled": sum(1 for _ in triton_dir.glob("*/*.cubin")),
    }

"""Compiled GPU kernels shipped with the package, and how they reach the kernel cache.

A fresh machine with only the tuned configurations (:mod:`zebractl.runtime.kernel_cache`) still
compiles every kernel of the first step: Triton lowers each kernel through ptxas, TileLang runs
nvcc over KDA's Hopper backward kernel, 30-57 s for kda_300M on an H100 or H200. Both compilers
keep what they built on disk, keyed by everything that decides the binary, so a binary built on
one machine is the one another machine with the same stack would build:

- Triton: ``<TRITON_CACHE_DIR>/<hash>/``, the hash of Triton's own version and installation (its
  compiler sources and ``libtriton``), ptxas's version, the GPU target, the kernel's source and
  everything it reads, its argument specialisation and compile options. A hit needs the metadata
  ``<name>.json``, the binary ``<name>.cubin`` and the group file ``__grp__<name>.json`` naming
  their absolute paths (the layout Triton's own ``store_binary_only`` writes). Beside the kernels,
  Triton builds a small host module with the C compiler for each kernel signature it launches
  (``__triton_launcher``) and one for the driver (``cuda_utils``): ``<hash>/<name><EXT_SUFFIX>``,
  the hash of the module's C source and the platform, the suffix naming the Python; one that
  fails to load is built again.
- TileLang: ``<TILELANG_CACHE_DIR>/<version>/<platform>/kernels/<key>/``, the key a hash of the
  kernel's TIR, its arguments, the target, TileLang's version and a content hash of its native
  libraries; each entry carries a manifest of its files' sizes and hashes, checked on load (an
  entry that fails it, or fails to load, is removed and compiled again).

:func:`export` packs the compiled entries of a cache into an archive (``zebractl warmup RECIPE
--export-compiled FILE``; shipped as ``sm<NN>_torch-<v>_triton-<v>_fla-<v>.compiled.tar.xz``);
:func:`seed` unpacks such an archive into a cache: never over an existing entry, each Triton
entry's group file written last and each TileLang entry moved into place whole, so ranks seeding
at once and a crash half-way leave no entry a compiler would half-read. Nothing here imports
torch, triton or tilelang.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

SUFFIX = ".compiled.tar.xz"
"""``Stack.compiled_key`` + this: the compiled kernels shipped for a GPU architecture and
package set."""
_SEEDED = ".zebractl-seeded-compiled"
_BINARY = ".cubin"
_TRITON = "triton"
_TILELANG = "tilelang"
_MANIFEST = "manifest.json"
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,200}$")


@dataclass
class Counts:
    """Compiled kernels: Triton binaries and host modules, TileLang libraries."""

    triton: int = 0
    modules: int = 0
    """Triton's host modules (launchers)."""
    tilelang: int = 0

    @property
    def total(self) -> int:
        return self.triton + self.modules + self.tilelang


def _safe_parts(name: str) -> tuple[str, ...] | None:
    """A member name's parts, or None for anything but a plain relative path of safe names."""
    path = PurePosixPath(name)
    if path.is_absolute() or not path.parts:
        return None
    if any(p in (".", "..") or not _NAME.match(p) for p in path.parts):
        return None
    return path.parts


def _triton_entries(triton_dir: Path) -> list[tuple[str, list[Path]]]:
    """(hash, [metadata, binary]) of every compiled kernel in a Triton cache."""
    found = []
    for grp in sorted(triton_dir.glob("*/__grp__*.json")):
        name = grp.name[len("__grp__") :]
        try:
            children = json.loads(grp.read_text()).get("child_paths") or {}
        except (OSError, ValueError, AttributeError):
            continue
        if name not in children or not any(c.endswith(_BINARY) for c in children):
            continue  # not a compiled kernel (or a damaged group)
        files = [grp.parent / name] + [grp.parent / c for c in children if c.endswith(_BINARY)]
        if all(f.is_file() for f in files):
            found.append((grp.parent.name, files))
    return found


def _triton_modules(triton_dir: Path) -> list[Path]:
    """Triton's host modules: a folder holding one ``.so`` and nothing else."""
    found = []
    for folder in sorted(p for p in triton_dir.iterdir() if p.is_dir()):
        files = [f for f in folder.iterdir() if not f.name.startswith(".")]
        if len(files) == 1 and files[0].suffix == ".so" and files[0].is_file():
            found.append(files[0])
    return found


def _tilelang_entries(tilelang_dir: Path) -> list[Path]:
    """Every complete TileLang cache entry (a folder with its manifest), staging left out."""
    return sorted(
        m.parent
        for m in tilelang_dir.rglob(_MANIFEST)
        if ".staging" not in m.relative_to(tilelang_dir).parts
    )


def _add(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    info = tar.gettarinfo(str(path), arcname=arcname)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    with path.open("rb") as f:
        tar.addfile(info, f)


def export(triton_dir: Path, tilelang_dir: Path, dest: Path) -> Counts:
    """Write every compiled kernel of the two caches into ``dest`` (.tar.xz): Triton's metadata
    and binary of each (not its intermediate IR), its host modules, every file of each complete
    TileLang entry."""
    counts = Counts()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:xz") as tar:
        if triton_dir.is_dir():
            for digest, files in _triton_entries(triton_dir):
                for f in files:
                    _add(tar, f, f"{_TRITON}/{digest}/{f.name}")
                counts.triton += 1
            for module in _triton_modules(triton_dir):
                _add(tar, module, f"{_TRITON}/{module.parent.name}/{module.name}")
                counts.modules += 1
        if tilelang_dir.is_dir():
            for entry in _tilelang_entries(tilelang_dir):
                rel = entry.relative_to(tilelang_dir).as_posix()
                for f in sorted(p for p in entry.iterdir() if p.is_file()):
                    _add(tar, f, f"{_TILELANG}/{rel}/{f.name}")
                counts.tilelang += 1
    return counts


def write_atomic(dest: Path, data: bytes, mode: int = 0o644) -> None:
    """``data`` into ``dest``, atomically (a temporary file beside it, then a rename)."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".seed-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, dest)


def _read_archive(archive: Path) -> tuple[dict[str, dict[str, bytes]], dict[str, dict[str, bytes]]]:
    """The archive's Triton entries (hash -> file -> bytes) and TileLang entries (relative folder
    -> file -> bytes); members that are not plain files at safe relative paths are ignored."""
    triton: dict[str, dict[str, bytes]] = {}
    tilelang: dict[str, dict[str, bytes]] = {}
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar:
            parts = _safe_parts(member.name)
            if not member.isfile() or parts is None:
                continue
            data = tar.extractfile(member)
            if data is None:
                continue
            if parts[0] == _TRITON and len(parts) == 3:
                triton.setdefault(parts[1], {})[parts[2]] = data.read()
            elif parts[0] == _TILELANG and len(parts) >= 3 and ".staging" not in parts:
                tilelang.setdefault("/".join(parts[1:-1]), {})[parts[-1]] = data.read()
    return triton, tilelang


def _seed_module(triton_dir: Path, digest: str, name: str, data: bytes) -> bool:
    dest = triton_dir / digest / name
    if dest.exists():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(dest, data, 0o755)
    return True


def _seed_triton(triton_dir: Path, digest: str, files: dict[str, bytes]) -> bool:
    metas = [n for n in files if n.endswith(".json")]
    if len(metas) != 1 or not any(n.endswith(_BINARY) for n in files):
        return False  # not one kernel's metadata and binary
    folder = triton_dir / digest
    group = folder / f"__grp__{metas[0]}"
    if group.exists():
        return False  # compiled here already (or seeded by another rank)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(folder / name, data)
    paths = {name: str(folder / name) for name in sorted(files)}
    write_atomic(group, json.dumps({"child_paths": paths}).encode())  # last: the entry is now whole
    return True


def _seed_tilelang(tilelang_dir: Path, rel: str, files: dict[str, bytes]) -> bool:
    if _MANIFEST not in files:
        return False  # TileLang would not trust it
    dest = tilelang_dir / rel
    if dest.exists():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".seed-"))
    try:
        for name, data in files.items():
            (staging / name).write_bytes(data)
            os.chmod(staging / name, 0o755 if name.endswith(".so") else 0o644)
        os.rename(staging, dest)  # whole, or not at all (another rank may have won)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False
    return True


SEED_ERRORS = (tarfile.TarError, OSError, EOFError, ValueError)
"""What reading a shipped archive or writing the cache may raise: a warning, never a failed run."""


def seeded(marker: Path, archive: Path) -> bool:
    """Whether ``marker`` says ``archive`` (by name and size) was copied into the cache already."""
    return marker.is_file() and marker.read_text().strip() == _stamp(archive)


def mark_seeded(marker: Path, archive: Path) -> None:
    """Record that ``archive`` was copied (the next run skips reading it)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(_stamp(archive) + "\n")


def warn_unseeded(what: str, archive: Path, problem: str, exc: BaseException, then: str) -> None:
    """A shipped archive that could not be used: a warning, and the run goes on (``then``)."""
    import warnings

    warnings.warn(
        f"zebractl: {what} {archive} {problem} ({exc}); {then}", RuntimeWarning, stacklevel=3
    )


def _stamp(archive: Path) -> str:
    return f"{archive.name} {archive.stat().st_size}"


def seed(triton_dir: Path, tilelang_dir: Path, archive: Path) -> Counts:
    """Copy the archive's compiled kernels into the two caches (see the module docstring).
    Returns what was copied. A damaged archive is reported and skipped: the kernels compile."""
    marker = triton_dir / _SEEDED
    if seeded(marker, archive):
        return Counts()
    counts = Counts()
    try:
        triton, tilelang = _read_archive(archive)
        for digest, files in sorted(triton.items()):
            if len(files) == 1 and next(iter(files)).endswith(".so"):
                name, data = next(iter(files.items()))
                counts.modules += _seed_module(triton_dir, digest, name, data)
            else:
                counts.triton += _seed_triton(triton_dir, digest, files)
        for rel, files in sorted(tilelang.items()):
            counts.tilelang += _seed_tilelang(tilelang_dir, rel, files)
    except SEED_ERRORS as exc:
        warn_unseeded(
            "the shipped compiled kernels",
            archive,
            "could not be copied into the kernel cache",
            exc,
            "kernels will compile",
        )
        return counts
    mark_seeded(marker, archive)
    return counts

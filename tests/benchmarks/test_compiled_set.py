"""benchmarks/device/compiled_set.sh: one part per GPU's tuned set, the parts merged (of a name
in several, the part built first gives its entry; with COMPILED_MERGE=1 the shipped set first), the
set written under a name without a '+' beside a file naming it, and copied into the tree's
kernel_configs/ under its shipped name. Stand-ins for nvidia-smi and for `python -m zebractl warmup`
(no GPU, no compiling: the script's logic only)."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/device/compiled_set.sh"
TAIL = "torch-2.11.0+cu130_triton-3.6.0_fla-0.6.0"
STEM = f"sm90_{TAIL}"

# `python -c` of the stack key and of the seed; `python -m zebractl warmup ...` writes a part
# holding one file shared by every GPU and one of its own; anything else is the real Python
FAKE_PY = f"""#!/usr/bin/env bash
if [ "$1" = -c ]; then
  case "$2" in
    *current_stack*) echo "${{FAKE_GPU}}{TAIL} {STEM}"; exit 0 ;;
    *) echo "seed $4" >> "$FAKE_SEEN"; exit 0 ;;
  esac
fi
if [ "$1" = -m ]; then
  echo "$*" >> "$FAKE_SEEN"
  while [ $# -gt 0 ]; do
    if [ "$1" = --export-compiled ]; then
      "{sys.executable}" - "$2" "$(basename "$(dirname "$TRITON_CACHE_DIR")")" <<'EOF'
import io, sys, tarfile
dest, cache = sys.argv[1:]
with tarfile.open(dest, "w:xz") as tar:
    for name, text in (("triton/shared/k.json", cache), (f"triton/{{cache}}/own.cubin", cache)):
        data = text.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
EOF
    fi
    shift
  done
  exit 0
fi
exec "{sys.executable}" "$@"
"""

FAKE_SMI = """#!/bin/sh
echo "$FAKE_MEM"
"""


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _setup(tmp_path: Path, gpu: str, mem: str) -> tuple[Path, Path, Path, Path, dict[str, str]]:
    """A tree with both GPUs' tuned sets, the stand-ins on PATH; (tree, shipped, out, seen, env)."""
    tree = tmp_path / "tree"
    shipped = tree / "zebractl/runtime/kernel_configs"
    shipped.mkdir(parents=True)
    for g in ("nvidia-h100-80gb-hbm3", "nvidia-h200"):
        (shipped / f"{g}_{TAIL}.tar.xz").write_bytes(b"tuned")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    _exe(bin_ / "nvidia-smi", FAKE_SMI)
    py = _exe(tmp_path / "python", FAKE_PY)
    out, seen = tmp_path / "out", tmp_path / "seen.txt"
    out.mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
        "PY": str(py),
        "FAKE_GPU": f"{gpu}_",
        "FAKE_MEM": mem,
        "FAKE_SEEN": str(seen),
        "COMPILED_BUILD_DIR": str(tmp_path / "build"),
    }
    for key in ("COMPILED_TUNED", "COMPILED_RECIPES", "COMPILED_MERGE", "COMPILED_EXPORT_TUNED"):
        env.pop(key, None)
    return tree, shipped, out, seen, env


def _members(archive: Path) -> dict[str, str]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar}


def _tar(path: Path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:xz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_a_merged_build_keeps_the_shipped_entries_and_warms_a_recipe_at_its_own_micro(tmp_path):
    """COMPILED_MERGE=1: the tree's set first (its entries unchanged, the new part's added);
    COMPILED_RECIPES' RECIPE:MICRO warms that recipe at that micro-batch; COMPILED_EXPORT_TUNED=1:
    the last warmup also exports the cache's tuned configurations."""
    tree, shipped, out, seen, env = _setup(tmp_path, "nvidia-h200", "143771")
    _tar(shipped / f"{STEM}.compiled.tar.xz", {"triton/shared/k.json": "from the shipped set"})
    env |= {
        "COMPILED_MERGE": "1",
        "COMPILED_TUNED": "nvidia-h200:64",
        "COMPILED_RECIPES": "kda_300M zebra_mamba_300M_hybrid:16",
        "COMPILED_EXPORT_TUNED": "1",
    }
    r = subprocess.run(
        ["bash", str(SCRIPT), "/data", str(out)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    members = _members(out / "compiled_set.tar.xz")
    assert members == {
        "triton/shared/k.json": "from the shipped set",
        "triton/zbuild_nvidia-h200/own.cubin": "zbuild_nvidia-h200",
    }
    assert (shipped / f"{STEM}.compiled.tar.xz").read_bytes() == (
        out / "compiled_set.tar.xz"
    ).read_bytes()
    log = seen.read_text()
    assert "warmup kda_300M --micro 64" in log
    assert "warmup zebra_mamba_300M_hybrid --micro 16" in log
    assert log.count("--export-compiled") == 1
    assert log.count(f"--export {out}/tuned_nvidia-h200.tar.xz") == 1, log
    assert "zebra_mamba_300M_hybrid --micro 16" in log.splitlines()[-1], "the last warmup exports"


@pytest.mark.parametrize(
    ("gpu", "mem", "parts"),
    [
        ("nvidia-h100-80gb-hbm3", "81559", ["nvidia-h100-80gb-hbm3:32"]),
        ("nvidia-h200", "143771", ["nvidia-h200:64", "nvidia-h100-80gb-hbm3:32"]),
    ],
)
def test_the_set_comes_back_under_a_plain_name_and_ships_under_its_own(tmp_path, gpu, mem, parts):
    tree, shipped, out, seen, env = _setup(tmp_path, gpu, mem)
    r = subprocess.run(
        ["bash", str(SCRIPT), "/data", str(out)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"from: {' '.join(parts)}" in r.stdout

    # the set: no '+' in the name that comes back; the shipped name and checksum beside it
    data = (out / "compiled_set.tar.xz").read_bytes()
    assert not list(out.glob("*+*")), sorted(p.name for p in out.iterdir())
    name, checksum = (out / "compiled_set.txt").read_text().splitlines()
    assert name == f"{STEM}.compiled.tar.xz"
    assert checksum.split()[0] == hashlib.sha256(data).hexdigest()
    assert (shipped / name).read_bytes() == data

    # one part per GPU's tuned set, each warmup seeded with that GPU's set; the part built first wins a
    # shared name
    caches = [f"zbuild_{p.split(':')[0]}" for p in parts]
    members = _members(out / "compiled_set.tar.xz")
    assert members["triton/shared/k.json"].endswith(caches[0])
    assert {n for n in members if n.endswith("own.cubin")} == {
        f"triton/{c}/own.cubin" for c in caches
    }
    log = seen.read_text()
    for p in parts:
        g, micro = p.split(":")
        assert f"seed {shipped.relative_to(tree)}/{g}_{TAIL}.tar.xz" in log
        assert (
            f"warmup kda_300M --micro {micro}" in log and f"warmup gdn_300M --micro {micro}" in log
        )
    assert log.count("--export-compiled") == len(parts)
    assert "--export " not in log, "tuned configurations only when asked"
    assert log.count("kernels.shipped_compiled=false") == 2 * len(parts)

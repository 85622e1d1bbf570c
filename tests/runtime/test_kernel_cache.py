"""The persistent kernel cache: where it points, what it leaves alone, how shipped tuned
configurations seed it, and that damaged or hostile archives are never trusted."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from zebractl.runtime import compiled_kernels
from zebractl.runtime import kernel_cache as kc

STACK = kc.Stack(gpu="nvidia-h200", torch="2.11.0+cu130", triton="3.6.0", fla="0.6.0")


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _tuned(key: str = "k") -> bytes:
    return json.dumps({"key": [key], "configs_timings": [[{"kwargs": {"BT": 64}}, [1.0]]]}).encode()


def test_slug_and_stack_key():
    assert kc.slug("NVIDIA H200") == "nvidia-h200"
    assert kc.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert STACK.key == "nvidia-h200_torch-2.11.0+cu130_triton-3.6.0_fla-0.6.0"


def test_configure_points_at_the_per_stack_cache_and_respects_the_user(tmp_path):
    env = {"ZEBRACTL_CACHE_DIR": str(tmp_path / "c")}
    cache = kc.configure(env, stack=STACK, shipped_dir=tmp_path / "none")
    root = tmp_path / "c" / "kernels" / STACK.key
    assert env["TRITON_CACHE_DIR"] == str(root / "triton")
    assert env["TILELANG_CACHE_DIR"] == str(root / "tilelang")
    assert env["TRITON_CACHE_AUTOTUNING"] == "1"
    assert cache is not None and set(cache.sources.values()) == {"zebractl"}
    assert cache.shipped is None and "autotune" in cache.describe()

    mine = {"TRITON_CACHE_DIR": "/my/triton", "XDG_CACHE_HOME": str(tmp_path / "x")}
    cache = kc.configure(mine, stack=STACK, shipped_dir=tmp_path / "none")
    assert mine["TRITON_CACHE_DIR"] == "/my/triton" and cache.sources["TRITON_CACHE_DIR"] == "user"
    assert mine["TILELANG_CACHE_DIR"].startswith(str(tmp_path / "x" / "zebractl"))


def test_configure_without_cuda_does_nothing():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env: dict[str, str] = {}
    assert kc.configure(env) is None and env == {}


def test_shipped_configurations_seed_once_and_never_overwrite(tmp_path):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    _archive(
        shipped / f"{STACK.key}.tar.xz",
        {"abc/chunk_kda.autotune.json": _tuned("a"), "def/l2norm.autotune.json": _tuned("b")},
    )
    env = {"ZEBRACTL_CACHE_DIR": str(tmp_path / "c")}
    triton = tmp_path / "c" / "kernels" / STACK.key / "triton"
    (triton / "def").mkdir(parents=True)
    (triton / "def" / "l2norm.autotune.json").write_text("mine")  # tuned on this machine
    cache = kc.configure(env, stack=STACK, shipped_dir=shipped)
    assert cache.seeded == 1 and cache.shipped == f"{STACK.key}.tar.xz"
    assert json.loads((triton / "abc" / "chunk_kda.autotune.json").read_text())["key"] == ["a"]
    assert (triton / "def" / "l2norm.autotune.json").read_text() == "mine"
    assert kc.configure(env, stack=STACK, shipped_dir=shipped).seeded == 0  # once
    assert kc.entries(triton) == {"tuned": 2, "compiled": 0}


def test_export_round_trips_into_a_fresh_cache(tmp_path):
    src = tmp_path / "src"
    for name in ("h1/a.autotune.json", "h2/b.autotune.json"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(_tuned(name))
    (src / "h1" / "a.cubin").write_bytes(b"\0binary")  # compiled kernels are not exported
    out = tmp_path / "set.tar.xz"
    assert kc.export(src, out) == 2
    assert kc.seed(tmp_path / "fresh", out) == 2
    assert kc.entries(tmp_path / "fresh") == {"tuned": 2, "compiled": 0}


@pytest.mark.parametrize(
    "members",
    [
        {"../escape.autotune.json": b"x"},  # outside the cache
        {"a/b/c.autotune.json": b"x"},  # not <hash>/<file>
        {"abc/evil.cubin": b"x"},  # not a tuned configuration
        {"/abs/x.autotune.json": b"x"},
    ],
)
def test_hostile_archive_members_are_skipped(tmp_path, members):
    archive = _archive(tmp_path / "a.tar.xz", members)
    assert kc.seed(tmp_path / "cache", archive) == 0
    assert not (tmp_path / "escape.autotune.json").exists()
    assert not list((tmp_path / "cache").rglob("*.cubin"))


def test_damaged_archive_warns_and_leaves_autotuning_on(tmp_path):
    archive = tmp_path / "bad.tar.xz"
    good = _archive(tmp_path / "good.tar.xz", {"abc/k.autotune.json": _tuned()})
    archive.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # truncated
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        n = kc.seed(tmp_path / "cache", archive)
    assert n <= 1
    assert not (tmp_path / "cache" / ".zebractl-seeded").exists()  # retried next time


def test_shipped_archives_hold_only_tuning_results_and_are_documented(tmp_path):
    """Every shipped archive is named by a stack key, holds only ``<hash>/<kernel>.autotune.json``
    files of valid JSON (nothing executable), seeds a cache, and has its row in the README."""
    readme = (kc.SHIPPED / "README.md").read_text()
    archives = sorted(
        p for p in kc.SHIPPED.glob("*.tar.xz") if not p.name.endswith(compiled_kernels.SUFFIX)
    )
    assert archives, "no shipped kernel configurations"
    for archive in archives:
        stack = archive.name.removesuffix(".tar.xz")
        assert "_torch-" in stack and "_triton-" in stack and "_fla-" in stack, stack
        assert f"`{archive.name}`" in readme, f"{archive.name} has no row in the README"
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            assert members
            for m in members:
                parts = m.name.split("/")
                assert m.isfile() and len(parts) == 2 and parts[1].endswith(".autotune.json"), m
                json.loads(tar.extractfile(m).read())
        assert kc.seed(tmp_path / stack, archive) == len(members)

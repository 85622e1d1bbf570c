"""The shipped compiled kernels: what an export holds, that a seeded cache is one Triton's own cache
manager reads as a hit, that seeding never overwrites, and that hostile or damaged archives are
never trusted. The GPU test runs a Triton kernel from a seeded cache without compiling it."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
from pathlib import Path, PurePosixPath

import pytest

from zebractl.runtime import compiled_kernels as ck
from zebractl.runtime import kernel_cache as kc

STACK = kc.Stack(gpu="nvidia-h200", torch="2.11.0+cu130", triton="3.6.0", fla="0.6.0", arch="sm90")
HASH = "a" * 64
LAUNCHER = "9" * 64, "__triton_launcher.cpython-312-x86_64-linux-gnu.so"
ENTRY = "0.1.15/linux-x86_64/kernels/" + "b" * 64


def _triton_cache(root: Path) -> Path:
    """A Triton cache as Triton writes it: one compiled kernel (every IR level, its group file
    naming absolute paths), its launcher, one autotune result, one damaged group, one group whose
    binary is gone."""
    folder = root / HASH
    folder.mkdir(parents=True)
    files = {
        "k.json": b'{"name": "k"}',
        "k.cubin": bytes(range(256)) * 4,
        "k.ptx": b"// ptx",
        "k.ttir": b"ttir",
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    group = {"child_paths": {n: str(folder / n) for n in files}}
    (folder / "__grp__k.json").write_text(json.dumps(group))
    (root / LAUNCHER[0]).mkdir()
    (root / LAUNCHER[0] / LAUNCHER[1]).write_bytes(b"\x7fELF launcher")
    (root / ("c" * 64)).mkdir()
    (root / ("c" * 64) / "k.autotune.json").write_text("{}")
    (root / ("d" * 64)).mkdir()
    (root / ("d" * 64) / "__grp__x.json").write_text("{not json")
    gone = root / ("e" * 64)
    gone.mkdir()
    (gone / "y.json").write_text("{}")
    (gone / "__grp__y.json").write_text(
        json.dumps({"child_paths": {"y.json": str(gone / "y.json"), "y.cubin": "/nowhere"}})
    )
    return root


def _tilelang_cache(root: Path) -> Path:
    """A TileLang cache: one complete entry, one without its manifest, one in staging."""
    entry = root / ENTRY
    entry.mkdir(parents=True)
    for name in ("kernel_lib.so", "params.json", "device_kernel.cu", "host_kernel.cu"):
        (entry / name).write_bytes(name.encode() * 10)
    (entry / "manifest.json").write_text('{"version": 1, "files": {}}')
    (root / "0.1.15/linux-x86_64/kernels/incomplete").mkdir(parents=True)
    (root / "0.1.15/linux-x86_64/kernels/incomplete/kernel_lib.so").write_bytes(b"half")
    staged = root / "0.1.15/linux-x86_64/.staging/s1"
    staged.mkdir(parents=True)
    (staged / "manifest.json").write_text("{}")
    return root


def _export(tmp_path: Path) -> Path:
    dest = tmp_path / f"{STACK.compiled_key}{ck.SUFFIX}"
    counts = ck.export(_triton_cache(tmp_path / "a"), _tilelang_cache(tmp_path / "at"), dest)
    assert (counts.triton, counts.modules, counts.tilelang) == (1, 1, 1)
    return dest


def test_export_holds_each_kernels_metadata_and_binary_and_whole_tilelang_entries(tmp_path):
    with tarfile.open(_export(tmp_path), "r:xz") as tar:
        names = sorted(tar.getnames())
    assert names == [
        *(f"tilelang/{ENTRY}/{n}" for n in sorted(
            ["device_kernel.cu", "host_kernel.cu", "kernel_lib.so", "manifest.json", "params.json"]
        )),
        f"triton/{LAUNCHER[0]}/{LAUNCHER[1]}",
        f"triton/{HASH}/k.cubin",
        f"triton/{HASH}/k.json",
    ]  # fmt: skip


def test_a_seeded_cache_is_a_hit_for_tritons_own_cache_manager(tmp_path, monkeypatch):
    archive = _export(tmp_path)
    triton, tilelang = tmp_path / "b", tmp_path / "bt"
    counts = ck.seed(triton, tilelang, archive)
    assert (counts.triton, counts.modules, counts.tilelang) == (1, 1, 1)
    pytest.importorskip("triton")
    from triton.runtime.cache import FileCacheManager

    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    group = FileCacheManager(HASH).get_group("k.json")  # what triton.compile looks up
    assert group == {
        "k.json": str(triton / HASH / "k.json"),
        "k.cubin": str(triton / HASH / "k.cubin"),
    }
    assert Path(group["k.cubin"]).read_bytes() == (tmp_path / "a" / HASH / "k.cubin").read_bytes()
    launcher = FileCacheManager(LAUNCHER[0]).get_file(LAUNCHER[1])  # what the launcher build reads
    assert launcher is not None and Path(launcher).read_bytes() == b"\x7fELF launcher"
    so = tilelang / ENTRY / "kernel_lib.so"
    assert so.read_bytes() == b"kernel_lib.so" * 10 and os.stat(so).st_mode & 0o777 == 0o755
    assert sorted(p.name for p in (tilelang / ENTRY).iterdir()) == sorted(
        p.name for p in (tmp_path / "at" / ENTRY).iterdir()
    )
    assert not list(tilelang.rglob(".seed-*")), "no staging folder left behind"


SHIPPED_NAME = re.compile(r"^sm\d+_torch-[^_/]+_triton-[^_/]+_fla-[^_/]+\.compiled\.tar\.xz$")


@pytest.mark.parametrize(
    "archive",
    sorted(kc.SHIPPED.glob(f"*{ck.SUFFIX}")),
    ids=lambda p: p.name,
)
def test_a_shipped_compiled_set_is_documented_whole_and_seeds_every_entry(tmp_path, archive):
    """Each shipped compiled set: named by an architecture's stack, a row in the README, only plain
    files at safe paths under triton/<hash>/ or tilelang/, every entry copied by one seeding."""
    assert SHIPPED_NAME.match(archive.name), archive.name
    readme = (kc.SHIPPED / "README.md").read_text()
    assert f"`{archive.name}`" in readme, f"{archive.name} has no row in the README"
    entries: set[tuple[str, ...]] = set()
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            assert member.isfile() and not PurePosixPath(member.name).is_absolute(), member.name
            assert ".." not in parts and parts[0] in ("triton", "tilelang"), member.name
            if parts[0] == "triton":
                assert len(parts) == 3 and len(parts[1]) >= 32, member.name
                entries.add(parts[:2])
            else:
                entries.add(parts[:-1])
    triton = sum(1 for e in entries if e[0] == "triton")
    assert triton and len(entries) > triton, "Triton kernels and TileLang kernels both ship"
    counts = ck.seed(tmp_path / "t", tmp_path / "tl", archive)
    assert counts.total == len(entries), (counts, len(entries))
    assert counts.triton and counts.modules and counts.tilelang, counts


def test_seeding_never_overwrites_and_reads_the_archive_once(tmp_path):
    archive = _export(tmp_path)
    triton, tilelang = tmp_path / "b", tmp_path / "bt"
    (triton / HASH).mkdir(parents=True)
    (triton / HASH / "__grp__k.json").write_text('{"child_paths": {}}')  # compiled here already
    (tilelang / ENTRY).mkdir(parents=True)
    (tilelang / ENTRY / "mine").write_text("local")
    counts = ck.seed(triton, tilelang, archive)
    assert (counts.triton, counts.modules, counts.tilelang) == (0, 1, 0)  # only the launcher
    assert (triton / HASH / "__grp__k.json").read_text() == '{"child_paths": {}}'
    assert sorted(p.name for p in (tilelang / ENTRY).iterdir()) == ["mine"]
    (triton / HASH / "__grp__k.json").unlink()
    assert ck.seed(triton, tilelang, archive).total == 0, "the marker says it was read"
    (triton / ck._SEEDED).unlink()
    assert ck.seed(triton, tilelang, archive).triton == 1


def test_ranks_seeding_at_once_leave_whole_entries(tmp_path):
    archive = _export(tmp_path)
    triton, tilelang = tmp_path / "b", tmp_path / "bt"
    threads = [threading.Thread(target=ck.seed, args=(triton, tilelang, archive)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    group = json.loads((triton / HASH / "__grp__k.json").read_text())["child_paths"]
    assert all(Path(p).read_bytes() for p in group.values())
    assert (tilelang / ENTRY / "manifest.json").is_file()
    assert not list(triton.rglob(".seed-*")) and not list(tilelang.rglob(".seed-*"))


def _archive(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                tar.addfile(info, io.BytesIO(m[1]))
    return path


def test_hostile_members_are_ignored(tmp_path):
    link = tarfile.TarInfo(f"triton/{HASH}/k.cubin")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    archive = _archive(
        tmp_path / "x.tar.xz",
        [
            ("triton/../../evil.json", b"x"),
            ("/abs/triton/h/k.json", b"x"),
            (f"triton/{HASH}/sub/k.json", b"x"),  # too deep
            (f"triton/{HASH}/k.json", b"{}"),
            link,  # the binary as a link: not a plain file
            ("triton/" + "f" * 64 + "/a.json", b"{}"),
            ("triton/" + "f" * 64 + "/b.json", b"{}"),  # two metadata files, no binary
            (f"tilelang/{ENTRY}/kernel_lib.so", b"no manifest"),
            ("tilelang/../outside/manifest.json", b"{}"),
            ("tilelang/x/.staging/e/manifest.json", b"{}"),
            ("tilelang/x/bad name;rm/manifest.json", b"{}"),
        ],
    )
    triton, tilelang = tmp_path / "t" / "triton", tmp_path / "t" / "tilelang"
    assert ck.seed(triton, tilelang, archive).total == 0
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["t/triton/.zebractl-seeded-compiled", "x.tar.xz"]


@pytest.mark.parametrize("damage", ["truncated", "not xz", "empty"])
def test_a_damaged_archive_warns_and_leaves_the_kernels_to_compile(tmp_path, damage):
    good = _export(tmp_path).read_bytes()
    bad = tmp_path / "bad.tar.xz"
    bad.write_bytes(
        {"truncated": good[: len(good) // 2], "not xz": b"PK\x03\x04", "empty": b""}[damage]
    )
    triton = tmp_path / "b"
    with pytest.warns(
        RuntimeWarning, match=r"bad\.tar\.xz could not be copied.*kernels will compile"
    ):
        counts = ck.seed(triton, tmp_path / "bt", bad)
    assert counts.total == 0 and not (triton / ck._SEEDED).exists()
    assert not list(triton.rglob("__grp__*")) if triton.exists() else True


def test_configure_seeds_the_compiled_set_only_when_asked(tmp_path):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    _export(tmp_path).rename(shipped / f"sm90_torch-2.11.0+cu130_triton-3.6.0_fla-0.6.0{ck.SUFFIX}")
    env = {"ZEBRACTL_CACHE_DIR": str(tmp_path / "c1")}
    cache = kc.configure(env, stack=STACK, shipped_dir=shipped, compiled=False)
    assert cache is not None and cache.compiled is None and cache.compiled_seeded == 0
    assert not (cache.triton / HASH).exists()
    env = {"ZEBRACTL_CACHE_DIR": str(tmp_path / "c2")}
    cache = kc.configure(env, stack=STACK, shipped_dir=shipped)
    assert cache is not None and cache.compiled_seeded == 3
    assert "3 compiled kernels seeded from" in cache.describe()
    assert (cache.triton / HASH / "k.cubin").is_file()
    assert (Path(env["TILELANG_CACHE_DIR"]) / ENTRY / "kernel_lib.so").is_file()
    again = kc.configure(dict(env), stack=STACK, shipped_dir=shipped)
    assert again is not None and again.compiled_seeded == 0
    assert "already seeded" in again.describe()
    h100 = kc.Stack("nvidia-h100-80gb-hbm3", "2.11.0+cu130", "3.6.0", "0.6.0", arch="sm90")
    env = {"ZEBRACTL_CACHE_DIR": str(tmp_path / "c3")}
    cache = kc.configure(env, stack=h100, shipped_dir=shipped)  # one set for the architecture
    assert cache is not None and cache.compiled_seeded == 3
    blackwell = kc.Stack("nvidia-b200", "2.11.0+cu130", "3.6.0", "0.6.0", arch="sm100")
    env = {"ZEBRACTL_CACHE_DIR": str(tmp_path / "c4")}
    cache = kc.configure(env, stack=blackwell, shipped_dir=shipped)
    assert cache is not None and cache.compiled is None and cache.compiled_seeded == 0


_KERNEL = """
import sys, torch, triton, triton.language as tl

@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

x = torch.arange(1000, device="cuda", dtype=torch.float32)
y = torch.empty_like(x)
_double[(8,)](x, y, 1000, BLOCK=128)
assert torch.equal(y, x * 2)
"""


@pytest.mark.gpu
def test_a_kernel_runs_from_a_seeded_cache_without_compiling(tmp_path):
    """Compiled in cache A, exported, seeded into an empty cache B: a fresh process with B runs
    the kernel and writes nothing to B (a compile would write every IR level of the kernel, a
    launcher build its host module)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    script = tmp_path / "k.py"
    script.write_text(_KERNEL)

    def run(cache: Path) -> None:
        env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
        subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=300)

    run(tmp_path / "a")
    assert list((tmp_path / "a").rglob("*.ptx")), "the first run compiled"
    counts = ck.export(tmp_path / "a", tmp_path / "none", tmp_path / "k.compiled.tar.xz")
    assert counts.triton >= 1
    counts = ck.seed(tmp_path / "b", tmp_path / "bt", tmp_path / "k.compiled.tar.xz")
    assert counts.triton >= 1 and counts.modules >= 1, counts
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "b").rglob("*"))
    run(tmp_path / "b")
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "b").rglob("*"))
    assert after == before, f"the seeded run compiled: {sorted(set(after) - set(before))}"


def test_a_cache_that_cannot_be_written_warns_and_leaves_the_kernels_to_compile(tmp_path):
    archive = _export(tmp_path)
    blocked = tmp_path / "bt"
    blocked.write_text("a file where the TileLang cache folder should be")
    with pytest.warns(RuntimeWarning, match=r"could not be copied into the kernel cache"):
        counts = ck.seed(tmp_path / "b", blocked, archive)
    assert counts.tilelang == 0 and not (tmp_path / "b" / ck._SEEDED).exists()

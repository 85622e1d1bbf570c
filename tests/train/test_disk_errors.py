"""Disks that cannot take a run's writes (issue 26): a read-only run directory, a disk that fills
during a save, a full data cache, and a disk too small for a checkpoint in ``train --check``.

Each error is one line naming the path, what was being written, the free space and the checkpoint
the rerun resumes from (exit 1, no traceback), and nothing is lost: the rerun on a healthy disk
resumes and its losses equal an uninterrupted run's bit for bit. The file systems are real where
this machine lets the test mount a tmpfs (root with CAP_SYS_ADMIN: a tiny tmpfs fills up, a
remount makes it read-only); elsewhere a patched writer raises the same ``OSError`` at the same
place."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

RUN = ("schedule.iterations=4", "checkpoint.interval=2", "checkpoint.keep_last=0")
CKPT_MIB = 39  # a tiny_kda checkpoint: 40.2 MB (fp32 weights and Adam's two moments)


def _mount(*args: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


@contextmanager
def _tmpfs(path: Path, mib: int):
    """A tmpfs of ``mib`` MiB at ``path``; yields False (nothing mounted) where mounting fails."""
    path.mkdir(parents=True)
    mounted = _mount("-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(path))
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _losses_match(fast, run: Path, ref: Path) -> None:
    got, want = fast.losses(run), fast.losses(ref)
    assert list(got) == list(want) == [1, 2, 3, 4], (got, want)
    assert got == want  # bitwise: the same floats


@pytest.fixture
def reference(fast, tmp_path):
    """The uninterrupted run's losses."""
    fast.train("tiny_kda", tmp_path / "ref", *RUN)
    return tmp_path / "ref"


def _deny_writes_under(monkeypatch, root: Path, code: int) -> None:
    """A patched writer: opening a file under ``root`` for writing fails with ``code``."""
    real = os.open
    write = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def refusing(path, flags, *args, **kw):
        if flags & write and str(os.path.abspath(path)).startswith(str(root)):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", refusing)


@pytest.mark.slow
def test_a_read_only_run_directory_is_named_and_the_rerun_resumes(
    cli, fast, tmp_path, reference, monkeypatch
):
    run = tmp_path / "fs" / "run"
    with _tmpfs(tmp_path / "fs", 256) as mounted:
        fast.train("tiny_kda", run, *RUN, stop_after=3)  # a checkpoint at 2, then "killed"
        if mounted:
            assert _mount("-o", "remount,ro", str(tmp_path / "fs"))
            why = "Read-only file system"
        else:
            _deny_writes_under(monkeypatch, run, errno.EROFS)
            why = os.strerror(errno.EROFS)
        r = cli("train", "tiny_kda", *fast.args(*RUN), "--output", str(run))
        line = _one_line_error(
            r,
            f"cannot write {run / 'zebractl.lock'} (the lock file of train): {why}",
            " free there; make it writable",
            f"resumes from the newest intact checkpoint, {run / 'checkpoints/iter_0000002'} "
            "(iteration 2)",
        )
        print(line)
        if mounted:
            assert _mount("-o", "remount,rw", str(tmp_path / "fs"))
        else:
            monkeypatch.undo()
        again = cli("train", "tiny_kda", *fast.args(*RUN), "--output", str(run))
        assert again.exit_code == 0, again.output
        assert "resumed from" in again.output and "iter_0000002" in again.output
        _losses_match(fast, run, reference)


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "async"])
def test_a_disk_that_fills_during_a_save_is_named_and_nothing_is_lost(
    cli, fast, tmp_path, reference, monkeypatch, async_save
):
    """A disk with room for one checkpoint: the warning before the second save names the
    shortfall, the save fails with one line naming its folder and the checkpoint before it, the
    torn ``iter_0000004.tmp`` is removed at the next start, and the rerun resumes bitwise."""
    run = tmp_path / "fs" / "run"
    sets = fast.args(*RUN, f"checkpoint.async_save={str(async_save).lower()}")
    with _tmpfs(tmp_path / "fs", CKPT_MIB + 20) as mounted:
        if not mounted:  # the patched writer: the second checkpoint's files cannot be written
            import builtins

            real = builtins.open

            def full(file, mode="r", *args, **kw):
                if "iter_0000004.tmp" in str(file) and any(c in mode for c in "wax+"):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
                return real(file, mode, *args, **kw)

            monkeypatch.setattr(builtins, "open", full)
        r = cli("train", "tiny_kda", *sets, "--output", str(run))
        torn = run / "checkpoints" / "iter_0000004.tmp"
        line = _one_line_error(
            r,
            f"{torn}",
            "(the checkpoint of iteration 4): No space left on device",
            " free there; free some space",
            f"resumes from the newest intact checkpoint, {run / 'checkpoints/iter_0000002'} "
            "(iteration 2)",
        )
        print(line)
        if mounted:
            assert "warning: the checkpoint of iteration 4 needs about" in r.output, r.output
            assert "short by" in r.output
            assert _mount("-o", "remount,size=256m", str(tmp_path / "fs"))
        else:
            monkeypatch.undo()
        assert torn.is_dir() and not (run / "checkpoints" / "iter_0000004").exists()
        again = cli("train", "tiny_kda", *sets, "--output", str(run))
        assert again.exit_code == 0, again.output
        assert f"note: removed {torn}, a save that did not complete" in again.output
        assert "resumed from" in again.output and not torn.exists()
        _losses_match(fast, run, reference)


def test_a_full_data_cache_is_named_in_our_words(cli, fast, tmp_path, monkeypatch):
    """megatron's 'supply a directory ... via the path_to_cache attribute' becomes the run's own
    data_cache folder (a patched numpy.save under megatron's dataset builder)."""
    import numpy

    real = numpy.save

    def full(file, *args, **kw):
        if "data_cache" in str(file):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real(file, *args, **kw)

    monkeypatch.setattr(numpy, "save", full)
    run = tmp_path / "run"
    r = cli("train", "tiny_kda", *fast.args(*RUN), "--output", str(run))
    line = _one_line_error(
        r,
        f"cannot write {run / 'data_cache'}",
        "(the dataset index cache (safe to delete)): No space left on device",
        "no checkpoint was saved yet, so it starts from iteration 0",
    )
    assert "path_to_cache" not in r.output and "keep_last" not in line, r.output
    print(line)


def test_train_check_reports_free_space_against_one_checkpoint(cli, fast, tmp_path, monkeypatch):
    from zebractl.run import disk

    out = tmp_path / "run"
    ok = cli("train", "tiny_kda", *fast.args(*RUN), "--output", str(out), "--check")
    assert ok.exit_code == 0, ok.output
    row = next(line for line in ok.stdout.splitlines() if line.startswith("disk"))
    assert "free at" in row and "one checkpoint about 38." in row and "(planned)" in row, row
    monkeypatch.setattr(disk, "free_bytes", lambda path: 5 * 2**20)
    bad = cli("train", "tiny_kda", *fast.args(*RUN), "--output", str(out), "--check", "--json")
    assert bad.exit_code == 3, bad.output
    import json

    doc = json.loads(bad.stdout)
    (check,) = [c for c in doc["checks"] if c["name"] == "disk"]
    assert check["status"] == "failed" and "5.0 MiB free" in check["detail"], check
    assert "the first save would fail" in check["detail"]

"""zebractl.run.disk: which failures are a disk's, and what the user is told about them."""

from __future__ import annotations

import errno
import os

import pytest

from zebractl.run import disk


class _Wrapped(BaseException):
    """Like torch's CheckpointException: a BaseException with each rank's (exception, trace)."""

    def __init__(self, failures):
        super().__init__("CheckpointException ranks:dict_keys([0])")
        self.failures = failures


def _enospc(name=None):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([name] if name else []))


def test_the_disk_cause_is_found_in_chains_and_rank_failures():
    assert disk.disk_cause(_enospc()).errno == errno.ENOSPC
    try:
        try:
            raise _enospc("/x/a.npy")
        except OSError as err:
            raise Exception("Failed to write dataset materials ... path_to_cache") from err
    except Exception as exc:  # noqa: BLE001
        assert disk.disk_cause(exc).filename == "/x/a.npy"
    wrapped = _Wrapped({0: (ValueError("no"), None), 3: (OSError(errno.EROFS, "ro"), None)})
    assert disk.disk_cause(wrapped).errno == errno.EROFS
    outer = RuntimeError("save failed")
    outer.__cause__ = wrapped
    assert disk.disk_cause(outer).errno == errno.EROFS
    # not a disk's: another errno, no OSError at all, a cycle in the chain
    assert disk.disk_cause(OSError(errno.ENOENT, "missing")) is None
    assert disk.disk_cause(_Wrapped({0: (KeyError("k"), None)})) is None
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert disk.disk_cause(a) is None


def test_free_bytes_of_a_path_not_made_yet_and_human_sizes(tmp_path):
    assert disk.free_bytes(tmp_path / "not" / "yet") == disk.free_bytes(tmp_path) > 0
    assert [disk.human(n) for n in (5, 2048, 3 * 2**20 + 2**19, 5 * 2**30 // 4)] == [
        "5 B",
        "2.0 KiB",
        "3.5 MiB",
        "1.25 GiB",
    ]


def _checkpoint(root, it, files=None):
    from zebractl.run.checkpoint import MARKER, checkpoint_dir
    from zebractl.run.records import CheckpointMarker, FileRecord

    folder = checkpoint_dir(root, it)
    folder.mkdir(parents=True)
    files = files or {"common.pt": b"abc", "metadata.json": b"{}"}
    for name, data in files.items():
        (folder / name).write_bytes(data)
    marker = CheckpointMarker(
        iteration=it,
        consumed_samples=8 * it,
        zebractl_version="0",
        files=[FileRecord(path=n, size=len(d), sha256="0" * 64) for n, d in files.items()],
    )
    (folder / MARKER).write_text(marker.model_dump_json())
    return folder


def test_the_message_names_what_where_free_space_and_the_resume_point(tmp_path):
    ckpts = tmp_path / "checkpoints"
    good = _checkpoint(ckpts, 2)
    torn = _checkpoint(ckpts, 4)
    (torn / "common.pt").write_bytes(b"a")  # truncated: not a resume point
    err = disk.DiskError(
        _enospc(), "the checkpoint of iteration 6", ckpts / "iter_0000006.tmp", ckpts
    )
    text = str(err)
    assert text.startswith(
        f"cannot write {ckpts / 'iter_0000006.tmp'} (the checkpoint of iteration 6): "
        "No space left on device; "
    ), text
    assert " free there; free some space" in text and "checkpoint.keep_last" in text
    assert text.endswith(f"resumes from the newest intact checkpoint, {good} (iteration 2)"), text
    assert "\n" not in text
    # the file the OSError names wins over the path given; no checkpoints yet; read-only
    ro = disk.DiskError(
        OSError(errno.EROFS, "Read-only file system", "/r/x.tmp"),
        "the config",
        tmp_path,
        tmp_path / "none",
    )
    assert str(ro).startswith("cannot write /r/x.tmp (the config): Read-only file system;")
    assert "make it writable" in str(ro)
    assert str(ro).endswith("no checkpoint was saved yet, so it starts from iteration 0")


def test_writing_translates_disk_failures_only_and_keeps_the_inner_what(tmp_path):
    metrics = disk.writing("the metrics", tmp_path / "metrics.jsonl", tmp_path / "c")
    with pytest.raises(disk.DiskError) as info, metrics:
        raise _Wrapped({0: (_enospc(), None)})
    assert info.value.what == "the metrics" and info.value.checkpoints == tmp_path / "c"
    assert isinstance(info.value.__cause__, _Wrapped)
    with pytest.raises(ValueError), disk.writing("x", tmp_path):
        raise ValueError("not a disk's")
    with pytest.raises(KeyboardInterrupt), disk.writing("x", tmp_path):
        raise KeyboardInterrupt
    outer, inner = disk.writing("outer", tmp_path, tmp_path / "c"), disk.writing("inner", tmp_path)
    with pytest.raises(disk.DiskError) as info, outer, inner:
        raise _enospc()
    assert info.value.what == "inner" and info.value.checkpoints == tmp_path / "c"


def test_space_warning_names_the_shortfall(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "free_bytes", lambda p: 10 * 2**20)
    assert disk.space_warning(tmp_path, 5 * 2**20, "the checkpoint of iteration 4") is None
    w = disk.space_warning(tmp_path, 30 * 2**20, "the checkpoint of iteration 4")
    assert w.startswith("warning: the checkpoint of iteration 4 needs about 30.0 MiB, but 10.0 MiB")
    assert "short by 20.0 MiB" in w
    monkeypatch.setattr(disk, "free_bytes", lambda p: None)
    assert disk.space_warning(tmp_path, 1e18, "x") is None


def test_a_writer_error_on_a_disk_without_room_is_the_disks(tmp_path, monkeypatch):
    """torch's zip writer reports a full disk as a RuntimeError: with less free space than the
    save needed it is a full disk, naming what the writer said; with room it is left alone."""
    inner = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    outer = RuntimeError("checkpoint iter_0000004 was not saved")
    outer.__cause__ = inner
    monkeypatch.setattr(disk, "free_bytes", lambda p: 4096)
    saving = disk.writing(
        "the checkpoint of iteration 4", tmp_path / "c/x.tmp", tmp_path / "c", 4e7
    )
    with pytest.raises(disk.DiskError) as info, saving:
        raise outer
    text = str(info.value)
    assert "(the checkpoint of iteration 4): No space left on device (the writer reported: " in text
    assert "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704" in text
    assert "4.0 KiB free there; free some space (or lower checkpoint.keep_last" in text, text
    monkeypatch.setattr(disk, "free_bytes", lambda p: 10**9)
    with pytest.raises(RuntimeError, match="was not saved"), disk.writing("x", tmp_path, None, 4e7):
        raise outer

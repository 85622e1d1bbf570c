"""One writer per directory: the lock file, its holder, a second writer and a stale lock."""

from __future__ import annotations

import json
import os
import socket

import pytest

from zebractl.errors import ConfigError
from zebractl.run import lock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_lock_file_names_the_holder_and_is_emptied_on_release(tmp_path):
    folder = tmp_path / "run"
    notes: list[str] = []
    with lock.hold(folder, "train", notes.append):
        h = lock.holder(folder)
        assert h is not None
        assert (h.command, h.pid, h.host) == ("train", os.getpid(), socket.gethostname())
        assert h.started.endswith("Z")
        with lock.hold(folder, "train", notes.append):  # re-entrant in one process
            assert lock.holder(folder) == h
        assert lock.holder(folder) == h  # the inner release keeps the outer hold
    assert lock.holder(folder) is None and (folder / lock.LOCK).read_text() == ""
    assert notes == []


def test_a_second_process_is_refused_naming_the_holder(tmp_path, lock_holders):
    folder = tmp_path / "run"
    proc = lock_holders.start(folder, "prepare")
    try:
        with pytest.raises(ConfigError) as info, lock.hold(folder, "train"):
            pass
        msg = str(info.value)
        assert f"PID {proc.pid} on {socket.gethostname()}" in msg and "zebractl prepare" in msg
        assert "\n" not in msg
    finally:
        lock_holders.end(proc)
    with lock.hold(folder, "train"):  # released when its holder ended: free again, no note
        pass


def test_a_holder_killed_releases_the_lock_and_is_taken_over_with_a_note(tmp_path, lock_holders):
    folder = tmp_path / "run"
    proc = lock_holders.start(folder, "prepare")
    proc.kill()
    lock_holders.end(proc)
    assert lock.holder(folder).pid == proc.pid  # the file still names the dead process
    notes: list[str] = []
    with lock.hold(folder, "train", notes.append):
        assert lock.holder(folder).pid == os.getpid()
    assert len(notes) == 1 and f"left by zebractl prepare (PID {proc.pid}" in notes[0], notes
    assert "no longer running" in notes[0]


def test_a_path_that_is_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with (
        pytest.raises(ConfigError, match="exists and is not a directory"),
        lock.hold(tmp_path / "f", "train"),
    ):
        pass


def test_an_unreadable_lock_file_is_taken_without_a_note(tmp_path):
    (tmp_path / lock.LOCK).write_text("not json")
    notes: list[str] = []
    with lock.hold(tmp_path, "eval", notes.append):
        assert json.loads((tmp_path / lock.LOCK).read_text())["command"] == "eval"
    assert notes == []

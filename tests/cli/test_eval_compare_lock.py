"""One writer per run directory (issue 26), for the commands that write into a run after its train:
`zebractl eval` (RUN/eval/) and `zebractl compare` (RUN_A/reports/compare-*/) hold the run's lock.
A run in use by another process is refused at once (exit 2, one line naming the holder, before any
evaluation or comparison starts); a lock left by a process that died is taken over with a note.

The runs here are stand-ins (a folder with a resolved-config file): the lock is taken before the
run is read, so the refusal is seen without a model, and the takeover by the error of reading it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zebractl.run import lock
from zebractl.run.rundir import RunDir

pytest.importorskip("lm_eval")  # `eval` needs its extra before it gets to the lock
pytest.importorskip("matplotlib")  # and `compare` its

REPO = Path(__file__).resolve().parents[2]
NOT_A_CONFIG = "not a valid resolved config"  # what reading a stand-in run says: past the lock


def _run_dir(path: Path) -> Path:
    """A stand-in run directory: a resolved-config file (not a valid one) and nothing else."""
    path.mkdir(parents=True)
    (path / RunDir.CONFIG).write_text("{}")
    return path


def _hf_dir(path: Path) -> Path:
    """A stand-in Hugging Face folder: config.json and a (empty) model.safetensors."""
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "zebra"}')
    (path / "model.safetensors").write_bytes(b"")
    return path


def _zebractl(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "zebractl", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    return done, time.perf_counter() - t0


def _refused_by(done: subprocess.CompletedProcess, took: float, proc: subprocess.Popen) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"zebractl train (PID {proc.pid} on {socket.gethostname()}" in done.stderr, done.stderr
    assert "is in use by" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert took < 2.0, f"refused after {took:.2f} s"


def _stale(folder: Path) -> int:
    """Leave in ``folder`` the lock file of a train that died holding it; returns its PID."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID that no longer runs (the OS released its lock when it died)
    (folder / lock.LOCK).write_text(
        json.dumps(
            {"command": "train", "pid": dead.pid, "host": socket.gethostname(), "started": "x"}
        )
    )
    return dead.pid


def _took_over(output: str, folder: Path, pid: int) -> None:
    assert f"taking over the lock of {folder} left by zebractl train (PID {pid}" in output, output
    assert "no longer running" in output
    assert (folder / lock.LOCK).read_text() == ""  # released when the command ended


def test_the_locked_directory_is_the_run_holding_the_output(tmp_path):
    lock_dir = lock.writer_root
    run = _run_dir(tmp_path / "run")
    assert lock_dir(run) == run
    assert lock_dir(run / "reports" / "compare-b") == run  # need not exist yet
    assert lock_dir(run / "eval") == run
    assert lock_dir(tmp_path / "elsewhere") == tmp_path / "elsewhere"


# ---- eval


def test_eval_of_a_run_in_use_exits_2_within_2_s_naming_the_holder(tmp_path, lock_holders):
    run = _run_dir(tmp_path / "run")
    proc = lock_holders.start(run)
    try:
        done, took = _zebractl("eval", str(run), "--tasks", "piqa", "--json")
        _refused_by(done, took, proc)
        assert done.stdout == ""  # --json: no document for a refusal
        assert lock.holder(run).pid == proc.pid  # the holder's lock file is untouched
    finally:
        lock_holders.end(proc)
    assert not (run / "eval").exists()  # refused before anything was written


def test_eval_of_a_checkpoint_locks_its_run(tmp_path, lock_holders):
    run = _run_dir(tmp_path / "run")
    ckpt = run / "checkpoints" / "iter_0000002"
    ckpt.mkdir(parents=True)
    proc = lock_holders.start(run)
    try:
        _refused_by(*_zebractl("eval", str(ckpt), "--tasks", "piqa"), proc)
    finally:
        lock_holders.end(proc)


def test_eval_of_a_hugging_face_folder_in_use_exits_2(tmp_path, lock_holders):
    folder = _hf_dir(tmp_path / "hf")
    proc = lock_holders.start(folder)
    try:
        _refused_by(*_zebractl("eval", str(folder), "--tasks", "piqa"), proc)
    finally:
        lock_holders.end(proc)


def test_eval_usage_errors_come_before_the_lock(tmp_path, lock_holders):
    run = _run_dir(tmp_path / "run")
    proc = lock_holders.start(run)
    try:
        done, _ = _zebractl("eval", str(run), "--tasks", "nope")
        assert done.returncode == 2 and "unknown task 'nope'" in done.stderr, done.stderr
        done, _ = _zebractl("eval", str(tmp_path / "nope"))
        assert done.returncode == 2 and "no such model folder" in done.stderr, done.stderr
    finally:
        lock_holders.end(proc)
    assert not (tmp_path / "nope").exists()  # no lock file (nor folder) made for a missing model


def test_eval_writing_elsewhere_only_reads_the_run_and_is_not_refused(cli, tmp_path, lock_holders):
    """--output outside the run: the run being trained is read, not written, and not locked."""
    run = _run_dir(tmp_path / "run")
    out = tmp_path / "out"
    proc = lock_holders.start(run)
    try:
        r = cli("eval", str(run), "--tasks", "wikitext-like", "--output", str(out))
    finally:
        lock_holders.end(proc)
    assert r.exit_code == 2 and NOT_A_CONFIG in r.stderr, r.output  # past the lock: reading it
    assert "in use" not in r.stderr
    assert lock.holder(out) is None and (out / lock.LOCK).is_file()  # OUTPUT's lock, released


def test_eval_takes_over_a_stale_lock_with_a_note(cli, tmp_path):
    run = _run_dir(tmp_path / "run")
    pid = _stale(run)
    r = cli("eval", str(run), "--tasks", "wikitext-like")
    assert r.exit_code == 2 and NOT_A_CONFIG in r.stderr, r.output  # past the lock: reading it
    _took_over(r.output, run, pid)


# ---- compare


def test_compare_into_a_run_in_use_exits_2_within_2_s_naming_the_holder(tmp_path, lock_holders):
    a, b = _run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")
    proc = lock_holders.start(a)
    try:
        _refused_by(*_zebractl("compare", str(a), str(b), "--json"), proc)
    finally:
        lock_holders.end(proc)
    assert not (a / "reports").exists()  # refused before anything was written


def test_compare_fla_of_a_run_in_use_is_refused_before_training_the_reference(
    tmp_path, lock_holders
):
    from zebractl.deps import require
    from zebractl.errors import ConfigError

    try:
        require("compare --fla")
    except ConfigError as exc:
        pytest.skip(str(exc))
    a = _run_dir(tmp_path / "a")
    proc = lock_holders.start(a)
    try:
        _refused_by(*_zebractl("compare", str(a), "--fla"), proc)
    finally:
        lock_holders.end(proc)
    assert not (a / "reports").exists() and not (tmp_path / "a-fla-reference").exists()


def test_compare_reading_a_run_in_use_is_not_refused(cli, tmp_path, lock_holders):
    """RUN_B is only read: a train of it does not stop a compare into RUN_A."""
    a, b = _run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")
    proc = lock_holders.start(b)
    try:
        r = cli("compare", str(a), str(b))
    finally:
        lock_holders.end(proc)
    assert r.exit_code == 2 and NOT_A_CONFIG in r.stderr, r.output  # past the lock: reading them
    assert "in use" not in r.stderr and lock.holder(a) is None


def test_compare_with_output_in_a_run_in_use_is_refused(tmp_path, lock_holders):
    a, b = _run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")
    proc = lock_holders.start(b)
    try:
        _refused_by(*_zebractl("compare", str(a), str(b), "--output", str(b / "reports/x")), proc)
    finally:
        lock_holders.end(proc)


def test_compare_takes_over_a_stale_lock_with_a_note(cli, tmp_path):
    a, b = _run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")
    pid = _stale(a)
    r = cli("compare", str(a), str(b))
    assert r.exit_code == 2 and NOT_A_CONFIG in r.stderr, r.output  # past the lock: reading them
    _took_over(r.output, a, pid)
    assert sorted(os.listdir(a)) == sorted([RunDir.CONFIG, lock.LOCK])  # no report written


# ---- and the other way round


@pytest.mark.parametrize("command", ["eval", "compare"])
def test_a_train_of_a_run_being_written_by_eval_or_compare_exits_2(
    cli, tmp_path, monkeypatch, command
):
    """While eval (compare) works, in this process, a train of the run is refused naming it."""
    pytest.importorskip("megatron.core")  # train's extra
    from zebractl.errors import ConfigError

    a, b = _run_dir(tmp_path / "a"), _run_dir(tmp_path / "b")
    trains: list[tuple[subprocess.CompletedProcess, float]] = []

    def working(*args, **kwargs):  # stands for the evaluation (comparison): a train starts
        trains.append(_zebractl("train", "tiny_kda", "--output", str(a)))
        raise ConfigError("stopped after the train")

    if command == "eval":
        from zebractl.evaluate import harness

        monkeypatch.setattr(harness, "_evaluate", working)
        r = cli("eval", str(a), "--tasks", "piqa")
    else:
        from zebractl.compare import report

        monkeypatch.setattr(report, "compare", working)
        r = cli("compare", str(a), str(b))
    assert r.exit_code == 2 and "stopped after the train" in r.stderr, r.output
    ((done, took),) = trains
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"zebractl {command} (PID {os.getpid()} on " in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and took < 2.0, (done.stderr, took)
    assert lock.holder(a) is None  # released when the command ended

"""One writer per run directory (issue 26): a second `zebractl train` of a directory in use exits 2
at once naming the holder; a lock left by a process that died is taken over with a note."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.run import lock  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_a_second_train_of_a_directory_in_use_exits_2_within_2_s_naming_the_first(fast, tmp_path):
    run = tmp_path / "run"
    with lock.hold(run, "train", lambda s: None):  # this process is the first train
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "zebractl", "train", "tiny_kda", *fast.args(), "-o", str(run)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        took = time.perf_counter() - t0
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"PID {os.getpid()} on {socket.gethostname()}" in done.stderr, done.stderr
        assert "zebractl train" in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert took < 2.0, f"the second train took {took:.2f} s to refuse"
        assert lock.holder(run).pid == os.getpid()  # the first's lock file is untouched
    assert not (run / "metrics.jsonl").exists()


def test_a_torchrun_launch_of_a_directory_in_use_exits_2_before_launching(fast, tmp_path):
    """The launcher holds no lock (its rank 0 worker does) but refuses a directory in use."""
    run = tmp_path / "run"
    with lock.hold(run, "train", lambda s: None):
        done = subprocess.run(
            [sys.executable, "-m", "zebractl", "train", "tiny_kda", "--nproc", "2", "-o", str(run)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"PID {os.getpid()}" in done.stderr and "launching" not in done.stdout, done.stdout


def test_a_stale_lock_of_a_dead_train_is_taken_over_with_a_note(cli, fast, tmp_path):
    run = tmp_path / "run"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID that no longer runs (the OS released its lock when it died)
    run.mkdir()
    (run / lock.LOCK).write_text(
        json.dumps(
            {"command": "train", "pid": dead.pid, "host": socket.gethostname(), "started": "x"}
        )
    )
    r = cli("train", "tiny_kda", *fast.args("schedule.iterations=2"), "--output", str(run))
    assert r.exit_code == 0, r.output
    assert f"taking over the lock of {run} left by zebractl train (PID {dead.pid}" in r.output
    assert "no longer running" in r.output
    assert (run / lock.LOCK).read_text() == ""  # released when the train ended


def test_the_trainer_holds_the_lock_while_it_trains(fast, tmp_path):
    """Callers of the Trainer itself (compare's FLA reference) hold the lock too."""
    from zebractl.train import trainer as trainer_mod

    seen: list[lock.LockHolder | None] = []
    real = trainer_mod.Trainer.train_step

    def step(self):
        seen.append(lock.holder(tmp_path))
        return real(self)

    trainer_mod.Trainer.train_step = step
    try:
        fast.train("tiny_kda", tmp_path, "schedule.iterations=2")
    finally:
        trainer_mod.Trainer.train_step = real
    assert [h.pid if h else None for h in seen] == [os.getpid()] * 2
    assert lock.holder(tmp_path) is None

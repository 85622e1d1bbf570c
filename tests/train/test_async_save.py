"""Asynchronous checkpoint saves (`checkpoint.async_save=true`): the checkpoints equal those of
synchronous saves and resume bitwise, a stop waits for the save in flight, and a process killed with
SIGKILL while a save is in flight leaves that save incomplete and resumes from the one before."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.run import checkpoint as ckpt  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SETS = (
    "schedule.iterations=6",
    "checkpoint.interval=2",
    "checkpoint.keep_last=0",
    "checkpoint.async_save=true",
)


def _weights(folder: Path, cfg) -> dict[str, torch.Tensor]:
    from zebractl.model.model import build_model

    model = build_model(cfg.model, seed=3)
    ckpt.load_weights(folder, model)
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


@pytest.mark.slow
def test_async_saves_write_what_sync_saves_write_and_resume_bitwise(fast, tmp_path):
    # the sync run is trained once per session (test_stop_mid_save's reference run)
    sync = fast.once("tiny_kda", *SETS[:-1], "checkpoint.async_save=false")
    msgs: list[str] = []
    asyn = fast.train("tiny_kda", tmp_path / "async", *SETS, console=msgs.append)
    assert fast.results[sync].checkpoint == sync / "checkpoints/iter_0000006"
    assert asyn.checkpoint == tmp_path / "async/checkpoints/iter_0000006"
    assert fast.losses(tmp_path / "async") == fast.losses(sync)
    roots = [sync / "checkpoints", tmp_path / "async" / "checkpoints"]
    assert [[c.iteration for c in ckpt.complete(r)] for r in roots] == [[2, 4, 6]] * 2
    assert not list(roots[1].glob("*.tmp"))
    cfg = fast.resolve("tiny_kda", *SETS).run
    for it in (2, 4, 6):
        a, b = (ckpt.check_intact(ckpt.checkpoint_dir(r, it)).marker for r in roots)
        assert [f.path for f in a.files] == [f.path for f in b.files]
        # the tensors' bytes are the same (.metadata and common.pt hold paths and timestamps)
        shards = [{f.path: f.sha256 for f in m.files if f.path.endswith(".distcp")} for m in (a, b)]
        assert shards[0] and shards[0] == shards[1]
        wa, wb = (_weights(ckpt.checkpoint_dir(r, it), cfg) for r in roots)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # the console says what training paid and when each checkpoint completed
    for it in (2, 4, 6):
        assert any(f"iter_000000{it} (async: training paused" in m for m in msgs), msgs
        assert any(f"checkpoint iter_000000{it} complete in" in m for m in msgs), msgs
    assert not any(m.startswith("saved ") for m in msgs)

    # resume from an asynchronous save: the run ends after iteration 3, the save of iteration 2
    # complete before it returns; the resumed losses equal the uninterrupted (sync) run's
    out = tmp_path / "resumed"
    killed = fast.train("tiny_kda", out, *SETS, stop_after=3)
    assert killed.stopped == "limit" and killed.checkpoint == out / "checkpoints/iter_0000002"
    assert [c.iteration for c in ckpt.complete(out / "checkpoints")] == [2]
    resumed = fast.train("tiny_kda", out, *SETS)
    assert resumed.resumed_from == 2 and resumed.iterations == 6
    assert fast.losses(out) == fast.losses(sync)  # bitwise


def test_a_stop_right_after_an_async_save_waits_for_it_and_saves_once(fast, tmp_path):
    from zebractl.train import trainer as trainer_mod

    real = trainer_mod.Trainer.train_step

    def step(self):
        if self.iteration == 3:  # inside step 4, whose checkpoint (interval 2) begins after it
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return real(self)

    previous = signal.getsignal(signal.SIGTERM)
    trainer_mod.Trainer.train_step = step
    msgs: list[str] = []
    try:
        res = fast.train("tiny_kda", tmp_path, *SETS, console=msgs.append)
    finally:
        trainer_mod.Trainer.train_step = real
        signal.signal(signal.SIGTERM, previous)
    assert res.stopped == "signal" and res.iterations == 4
    assert res.checkpoint == tmp_path / "checkpoints/iter_0000004"
    assert [c.iteration for c in ckpt.complete(tmp_path / "checkpoints")] == [2, 4]
    assert sum("iter_0000004 (async" in m for m in msgs) == 1, msgs  # not saved twice
    assert any("after iteration 4: completing its checkpoint" in m for m in msgs), msgs
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


_SLOW = r"""
import sys, time
from pathlib import Path

stage, ready, target = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
if stage == "writing":  # the writer process writes every file, then never reports back
    from megatron.core.dist_checkpointing.strategies.filesystem_async import (
        FileSystemWriterAsync as W,
    )

    real = W.write_preloaded_data_multiproc

    def slow(transforms, use_msc, rank, buckets, results):
        real(transforms, use_msc, rank, buckets, results)
        if target in str(buckets[0][0]):
            ready.touch()
            time.sleep(600)

    W.write_preloaded_data_multiproc = staticmethod(slow)
else:  # "hashing": megatron's finalisation ran; rank 0's marker thread never finishes hashing
    from zebractl.run import checkpoint

    real = checkpoint.sha256_file

    def slow(path):
        if target in str(path):
            ready.touch()
            time.sleep(600)
        return real(path)

    checkpoint.sha256_file = slow
from zebractl.cli import app

app(args=sys.argv[4:], prog_name="zebractl")
"""


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["writing", "hashing"])
def test_sigkill_during_an_async_save_leaves_it_incomplete(fast, tmp_path, stage):
    """The save of iteration 4 is held in flight (its writer, or rank 0's marker thread, blocks);
    SIGKILL then: only iter_0000004.tmp exists, and the rerun resumes from iteration 2."""
    out, ready = tmp_path / "run", tmp_path / "ready"
    cmd = [sys.executable, "-c", _SLOW, stage, str(ready), "iter_0000004.tmp"]
    cmd += ["train", "tiny_kda", *fast.args(*SETS), "--output", str(out)]
    # a session of its own: the held writer (a grandchild) is killed with the group afterwards
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the save of iteration 4 never started"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the trainer only: its writer lives on, held
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        log = proc.communicate(timeout=60)[0]  # EOF once the group is gone
    assert proc.returncode == -signal.SIGKILL, log[-3000:]
    root = out / "checkpoints"
    tmp = root / "iter_0000004.tmp"
    assert "saving " + str(root / "iter_0000004") in log, log[-3000:]
    assert [c.iteration for c in ckpt.complete(root)] == [2], log[-3000:]
    assert not (root / "iter_0000004").exists() and not (tmp / ckpt.MARKER).exists()
    assert list(tmp.glob("*.distcp"))  # the shards are on disk, but nothing vouches for them
    # megatron's own completeness file comes from its finalisation, which the hashing stage passed
    # and the writing stage never reached
    assert (tmp / "metadata.json").exists() == (stage == "hashing")
    msgs: list[str] = []
    resumed = fast.train("tiny_kda", out, *SETS, console=msgs.append)
    assert resumed.resumed_from == 2 and resumed.iterations == 6, msgs
    assert [c.iteration for c in ckpt.complete(out / "checkpoints")] == [2, 4, 6]
    assert not list((out / "checkpoints").glob("*.tmp"))
    ref = fast.once("tiny_kda", *SETS)  # the uninterrupted run, trained once for both stages
    assert fast.losses(out) == fast.losses(ref)  # bitwise

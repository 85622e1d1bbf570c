"""A stop signal sent to a run's whole process group while a checkpoint is being written, and a disk
that fills during a save, through the CLI in a process of its own (issue 42, items 6 and 7).

A launcher stops a run by signalling its process group (torchrun stopping a worker, Slurm,
``timeout``, Ctrl-C), which reaches every helper process of the save as well: megatron's writer
processes and the multiprocessing manager they report through. That manager died of SIGTERM, and the
save the stop was completing failed: ``ConnectionRefusedError`` from the background writer,
``BrokenPipeError`` from a blocking save, exit 1. Now the save completes, the run exits 143 with no
traceback and the rerun resumes bitwise. The save is held inside its writer (a patched megatron
writer waits for a file) while the signal is sent, so it is in flight whatever the machine's speed.
A full disk is one line, zebractl's, with no megatron log line before it.

The GPU test does the same on both engines (``optimizer.impl`` torch_fused and megatron).
"""

from __future__ import annotations

import contextlib
import os
import re
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
SETS = ("schedule.iterations=6", "checkpoint.interval=2", "checkpoint.keep_last=0")
GPU_SETS = (
    "data.seq_length=128",
    "precision=bf16",
    "kernels.backend=torch",
    "data.num_workers=0",
)
"""On the GPU machine, on top of the fast run's (tests/train/test_engine_gpu.py's settings)."""

# the command line's first words: where the save of a target folder waits, then `zebractl ...`
_HOLD = r"""
import sys, time
from pathlib import Path

import zebractl  # noqa: F401 - first: its filters of megatron's import-time notices

ready, go, target = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
from megatron.core.dist_checkpointing.strategies.filesystem_async import (
    FileSystemWriterAsync as W,
)

real = W.write_preloaded_data_multiproc


def held(transforms, use_msc, rank, buckets, results):
    # the trainer's process (a blocking save) or its background writer: waits before writing
    if target in str(buckets[0][0]):
        ready.touch()
        while not go.exists():
            time.sleep(0.01)
    real(transforms, use_msc, rank, buckets, results)


W.write_preloaded_data_multiproc = staticmethod(held)
from zebractl.cli import app

app(args=sys.argv[4:], prog_name="zebractl")
"""
# a disk that is full from the target folder's save on: its writes fail, its free space is 4 KiB
_FULL = r"""
import builtins, errno, os, sys

target, real = sys.argv[1], builtins.open


def full(file, mode="r", *args, **kw):  # every process of the save inherits it (forks)
    if target in str(file) and any(c in mode for c in "wax+"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
    return real(file, mode, *args, **kw)


builtins.open = full
from zebractl.run import disk

free = disk.free_bytes
disk.free_bytes = lambda path: 4096 if target in str(path) else free(path)
from zebractl.cli import app

app(args=sys.argv[2:], prog_name="zebractl")
"""


def _weights(folder: Path, cfg) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint (held in the engine's parameter dtype)."""
    from zebractl.model.model import build_model

    bf16 = cfg.optimizer.impl == "megatron" and cfg.precision == "bf16"
    model = build_model(cfg.model, seed=3, params_dtype=torch.bfloat16 if bf16 else torch.float32)
    ckpt.load_weights(folder, model)
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


def _reference(fast, *sets: str) -> Path:
    """The uninterrupted run of ``sets`` with blocking saves (``checkpoint.async_save`` aside:
    background saves change no number), trained once per session (test_async_save's sync run)."""
    key = [s for s in sets if not s.startswith("checkpoint.async_save=")]
    return fast.once("tiny_kda", *key, "checkpoint.async_save=false")


def _assert_resumes_bitwise(fast, out: Path, stop: int, *sets: str) -> None:
    """The rerun resumes from the stop's checkpoint; its losses and final weights equal the
    uninterrupted run's bit for bit."""
    resumed = fast.train("tiny_kda", out, *sets)
    assert resumed.resumed_from == stop and resumed.iterations == 6
    ref = _reference(fast, *sets)
    assert fast.losses(out) == fast.losses(ref)  # bitwise
    cfg = fast.resolve("tiny_kda", *sets).run
    got, want = (_weights(r / "checkpoints/iter_0000006", cfg) for r in (out, ref))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def _train_args(sets: list[str], out: Path) -> list[str]:
    return ["train", "tiny_kda", *[x for s in sets for x in ("--set", s)], "--output", str(out)]


def _stopped_mid_save(
    sets: list[str], out: Path, work: Path, timeout: float
) -> tuple[int, str, str]:
    """Train in a process (and session) of its own until the save of iteration 2 is inside its
    writer, send SIGTERM to the whole process group, let the save go on; (exit code, stdout,
    stderr)."""
    ready, go = work / "ready", work / "go"
    target = str(ckpt.checkpoint_dir(out / "checkpoints", 2)) + ".tmp"
    cmd = [sys.executable, "-c", _HOLD, str(ready), str(go), target, *_train_args(sets, out)]
    with open(work / "stdout", "w") as stdout, open(work / "stderr", "w") as stderr:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready.exists():
            assert proc.poll() is None, (work / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "the save of iteration 2 never started"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGTERM)  # the trainer and every helper of the save
        time.sleep(0.5)  # a helper that dies of it is gone before the save goes on
        go.touch()
        proc.wait(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything left of the group (none should be)
        proc.wait(timeout=60)
    return proc.returncode, (work / "stdout").read_text(), (work / "stderr").read_text()


def _assert_stopped_cleanly(code: int, log: str, err: str, out: Path, background: bool) -> int:
    """Exit 143, stderr one line (the stop's), the save of iteration 2 and the stop's complete and
    intact, nothing incomplete; returns the iteration the run stopped after. A blocking save holds
    the training: the stop follows iteration 2. A background save does not: iteration 3 runs
    meanwhile and the stop follows it, or iteration 4, whose save waits for the held one (or, on
    a machine slow to start iteration 3, iteration 2)."""
    assert code == 128 + signal.SIGTERM, log[-3000:] + err[-3000:]
    assert err.splitlines() == [
        "terminated (SIGTERM): the checkpoint above resumes the run (rerun the same command)"
    ], err[-3000:]
    for bad in ("Traceback", "Error", "error:", "Exception", "warning"):
        assert bad not in log, log[-3000:]
    (stop,) = map(int, re.findall(r"stopping on SIGTERM after iteration (\d+)", log))
    assert stop in ((2, 3, 4) if background else (2,)), log[-3000:]
    root = out / "checkpoints"
    assert [c.iteration for c in ckpt.complete(root)] == sorted({2, stop}), log[-3000:]
    assert not ckpt.incomplete(root)
    for c in ckpt.complete(root):
        ckpt.check_intact(c.folder)
    return stop


@pytest.mark.slow
@pytest.mark.parametrize("background", [False, True], ids=["blocking", "async"])
def test_sigterm_to_the_process_group_mid_save_completes_it_and_resumes_bitwise(
    fast, tmp_path, background
):
    sets = (*SETS, f"checkpoint.async_save={str(background).lower()}")
    out = tmp_path / "run"
    code, log, err = _stopped_mid_save(fast.sets(*sets), out, tmp_path, timeout=300)
    stop = _assert_stopped_cleanly(code, log, err, out, background)
    _assert_resumes_bitwise(fast, out, stop, *sets)


@pytest.mark.slow
@pytest.mark.parametrize("background", [False, True], ids=["blocking", "async"])
def test_a_full_disk_mid_save_is_one_line_of_ours(fast, tmp_path, background):
    """megatron's writer logged ``Local process 0 encountered an error: ...`` on the line before
    zebractl's error (both save modes: the background writer's stderr is the run's)."""
    out = tmp_path / "run"
    target = str(ckpt.checkpoint_dir(out / "checkpoints", 2)) + ".tmp"
    sets = fast.sets(*SETS, f"checkpoint.async_save={str(background).lower()}")
    cmd = [sys.executable, "-c", _FULL, target, *_train_args(sets, out)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "No space left on device" in errors[0], r.stderr[-3000:]
    assert r.stderr.rstrip().endswith(errors[0]), r.stderr[-3000:]  # nothing after it
    assert "encountered an error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert ckpt.incomplete(out / "checkpoints") == [Path(target)]


@pytest.mark.gpu
@pytest.mark.parametrize("background", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("engine", ["torch_fused", "megatron"])
def test_sigterm_mid_save_on_the_gpu_completes_it_and_resumes_bitwise(
    fast, tmp_path, engine, background
):
    """Both engines, both save modes, on the GPU (megatron's engine is CUDA-only): the stop
    completes the save in flight, exits 143 without a traceback (it ended in
    ConnectionRefusedError), and the rerun's losses and weights equal an uninterrupted run's."""
    sets = (
        *SETS,
        *GPU_SETS,
        f"optimizer.impl={engine}",
        f"checkpoint.async_save={str(background).lower()}",
    )
    out = tmp_path / "run"
    code, log, err = _stopped_mid_save(fast.sets(*sets), out, tmp_path, timeout=300)
    stop = _assert_stopped_cleanly(code, log, err, out, background)
    assert ckpt.read_marker(ckpt.checkpoint_dir(out / "checkpoints", 2)).optimizer_impl == engine
    _assert_resumes_bitwise(fast, out, stop, *sets)

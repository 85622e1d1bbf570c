"""The helper processes of a checkpoint save (issue 42): megatron's writers report through a queue
served by a multiprocessing manager that outlives the stop signals a launcher sends to the whole
process group (it died of SIGTERM, and the save a stop was completing failed with
``ConnectionRefusedError``), and a failed write is not logged by megatron on the line before
zebractl's own error."""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.run import async_save  # noqa: E402
from zebractl.run import checkpoint as ckpt  # noqa: E402
from zebractl.run.records import CheckpointMarker  # noqa: E402
from zebractl.runtime import quiet  # noqa: E402


def _marker(iteration: int) -> CheckpointMarker:
    return CheckpointMarker(
        iteration=iteration,
        consumed_samples=8 * iteration,
        optimizer_impl="torch_fused",
        distributed_optimizer=False,
        world_size=1,
        run_id="test",
        zebractl_version="0",
    )


def _state(weight: torch.Tensor, iteration: int) -> dict:
    from megatron.core.dist_checkpointing import ShardedTensor

    return {"w": ShardedTensor.from_rank_offsets("w", weight, replica_id=0), "iteration": iteration}


def _save(root: Path, iteration: int, background: bool) -> Path:
    """A checkpoint of a random tensor, saved as the trainer saves it (raises what the save
    raises)."""
    state, marker = _state(torch.randn(64, 32), iteration), _marker(iteration)
    if not background:
        return ckpt.save(root, iteration, state, marker, keep_last=0, is_writer=True)
    saver = async_save.AsyncSaver()
    final = saver.begin(root, iteration, state, marker, keep_last=0, is_writer=True)
    assert saver.wait() is not None
    return final


def _manager_process():
    """The process serving megatron's queue of write results (the one the next save uses)."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    return filesystem_async._get_write_results_queue()._manager._process


def _signal_mask(pid: int, field: str) -> set[int]:
    """The signals of ``/proc/PID/status``'s ``SigIgn`` / ``SigBlk`` line."""
    line = next(
        x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(field)
    )
    bits = int(line.split()[1], 16)
    return {n for n in range(1, 65) if bits >> (n - 1) & 1}


@pytest.mark.parametrize("background", [False, True], ids=["blocking", "async"])
def test_the_writers_results_manager_outlives_the_stop_signals(process_group, tmp_path, background):
    """SIGINT, SIGTERM and SIGUSR1 sent to the manager (as a launcher's signal to the process
    group reaches it) leave it running: the next save completes. Before, SIGTERM killed it and the
    save failed (BrokenPipeError blocking, ConnectionRefusedError from the background writer)."""
    _save(tmp_path, 1, background)
    manager = _manager_process()
    stops = {int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    if Path("/proc").is_dir():
        assert stops <= _signal_mask(manager.pid, "SigIgn")
        assert not stops & _signal_mask(manager.pid, "SigBlk")  # ignored, not held back
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        os.kill(manager.pid, sig)
    time.sleep(0.3)  # a default handler would have ended it by now
    assert manager.is_alive()
    final = _save(tmp_path, 2, background)
    ckpt.check_intact(final)
    assert _manager_process() is manager  # the same one: a save does not start another


def test_a_dead_results_manager_is_replaced_before_the_next_save(process_group, tmp_path):
    """A manager killed outright (SIGKILL) is started again by the next save."""
    _save(tmp_path, 1, False)
    dead = _manager_process()
    os.kill(dead.pid, signal.SIGKILL)
    dead.join(timeout=30)
    assert not dead.is_alive()
    for it, background in ((2, False), (3, True)):
        ckpt.check_intact(_save(tmp_path, it, background))
    assert _manager_process() is not dead and _manager_process().is_alive()


@pytest.mark.parametrize("background", [False, True], ids=["blocking", "async"])
def test_a_failed_write_is_not_logged_by_megatron(process_group, tmp_path, monkeypatch, background):
    """A full disk: megatron's writer logged ``Local process 0 encountered an error: ...`` at ERROR
    (which the CLI's quiet mode keeps) before the save raised; zebractl reports the failure itself
    (one line, :class:`zebractl.run.disk.DiskError`). With ``-v`` the record stays. The records go
    to a file: the background writer is a forked process."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    def full_disk(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(filesystem_async, "_write_item", full_disk)  # the forks inherit it
    handler = logging.FileHandler(tmp_path / "megatron.log")
    megatron = logging.getLogger("megatron")
    megatron.addHandler(handler)
    try:
        for verbose in ("0", "1"):
            monkeypatch.setenv(quiet.VERBOSE_ENV, verbose)
            root = tmp_path / f"verbose{verbose}"
            with pytest.raises(BaseException, match="CheckpointException|was not saved"):
                _save(root, 4, background)
            assert not (root / "iter_0000004").exists()
            handler.flush()
            logged = (tmp_path / "megatron.log").read_text()
            if verbose == "0":
                assert logged == "", logged
        assert "Local process 0 encountered an error" in logged, logged
    finally:
        megatron.removeHandler(handler)
        handler.close()

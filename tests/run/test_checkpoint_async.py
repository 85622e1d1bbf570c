"""Checkpoint writing. `zebractl.run.async_save.AsyncSaver`: a background save holds the state of
the moment it began, writes the files a synchronous save writes, completes only through the marker,
and a failure of the writer or of the marker thread raises and leaves no complete checkpoint.

The helper processes of a save, blocking or background (issue 42): megatron's writers report
through a queue served by a multiprocessing manager that outlives the stop signals a launcher sends
to the whole process group (it died of SIGTERM, and the save a stop was completing failed with
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

    return {
        "w": ShardedTensor.from_rank_offsets("w", weight, replica_id=0),
        "iteration": iteration,
    }


def _load(folder: Path) -> dict:
    return ckpt.load(folder, _state(torch.empty(64, 32), 0))


def _until_done(saver: async_save.AsyncSaver, timeout: float = 60.0) -> async_save.SaveDone:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = saver.poll()
        if done is not None:
            return done
        time.sleep(0.01)
    raise AssertionError("the background save did not complete")


def test_a_background_save_holds_the_state_it_began_with(process_group, tmp_path):
    w = torch.randn(64, 32)
    ckpt.save(tmp_path, 1, _state(w, 1), _marker(1), keep_last=0, is_writer=True)
    saver = async_save.AsyncSaver()
    final = saver.begin(tmp_path, 2, _state(w, 2), _marker(2), keep_last=0, is_writer=True)
    began = w.clone()
    w.add_(1.0)  # training goes on: the checkpoint keeps the weights of the moment it began
    assert saver.pending == 2
    assert not final.exists() or (final / ckpt.MARKER).exists()
    done = _until_done(saver)
    assert (done.folder, done.iteration) == (final, 2) and done.seconds > 0
    assert saver.pending is None and saver.last_complete == final
    assert saver.poll() is None and saver.wait() is None  # nothing in flight any more
    assert [c.iteration for c in ckpt.complete(tmp_path)] == [1, 2]
    ckpt.check_intact(final)
    loaded = _load(final)
    assert torch.equal(loaded["w"], began) and loaded["iteration"] == 2
    # the same files as a synchronous save, the same shard bytes
    sync, asyn = (ckpt.read_marker(tmp_path / f"iter_000000{i}").files for i in (1, 2))
    assert [f.path for f in sync] == [f.path for f in asyn]
    ckpt.save(tmp_path / "again", 2, _state(began, 2), _marker(2), keep_last=0, is_writer=True)
    again = {f.path: f.sha256 for f in ckpt.read_marker(tmp_path / "again/iter_0000002").files}
    assert all(again[f.path] == f.sha256 for f in asyn if f.path.endswith(".distcp"))


def test_begin_finishes_the_previous_save_and_prunes(process_group, tmp_path):
    w = torch.randn(64, 32)
    saver = async_save.AsyncSaver()
    for it in (1, 2, 3):
        saver.begin(tmp_path, it, _state(w, it), _marker(it), keep_last=2, is_writer=True)
        # the previous save is complete (and pruned) before the next begins
        assert [c.iteration for c in ckpt.complete(tmp_path)] == list(range(max(1, it - 2), it))
    done = saver.wait()
    assert done is not None and done.iteration == 3
    assert [c.iteration for c in ckpt.complete(tmp_path)] == [2, 3]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_failed_background_write_raises_and_completes_nothing(
    process_group, tmp_path, monkeypatch
):
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    def full_disk(*_a, **_k):
        raise OSError(28, "No space left on device")

    # the writer processes are forked from this one: they inherit the failing write
    monkeypatch.setattr(filesystem_async, "_write_item", full_disk)
    saver = async_save.AsyncSaver()
    saver.begin(
        tmp_path, 5, _state(torch.randn(64, 32), 5), _marker(5), keep_last=0, is_writer=True
    )
    with pytest.raises(
        async_save.SaveFailed, match="iter_0000005 was not saved: writing it failed"
    ):
        saver.wait()
    assert ckpt.complete(tmp_path) == []
    assert (tmp_path / "iter_0000005.tmp").is_dir()
    assert not (tmp_path / "iter_0000005.tmp" / ckpt.MARKER).exists()
    # the saver is usable again once the cause is gone
    monkeypatch.undo()
    saver.begin(
        tmp_path, 6, _state(torch.randn(64, 32), 6), _marker(6), keep_last=0, is_writer=True
    )
    assert saver.wait() is not None
    assert [c.iteration for c in ckpt.complete(tmp_path)] == [6]


def test_a_failed_marker_thread_raises_at_the_next_poll(process_group, tmp_path, monkeypatch):
    def unreadable(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(ckpt, "sha256_file", unreadable)
    saver = async_save.AsyncSaver()
    saver.begin(
        tmp_path, 7, _state(torch.randn(64, 32), 7), _marker(7), keep_last=0, is_writer=True
    )
    with pytest.raises(
        async_save.SaveFailed, match="hashing and marking it failed .*Permission denied"
    ):
        _until_done(saver)
    assert saver.pending is None and saver.last_complete is None
    assert ckpt.complete(tmp_path) == []
    assert not (tmp_path / "iter_0000007.tmp" / ckpt.MARKER).exists()


def test_abort_leaves_the_save_incomplete_and_later_saves_sound(process_group, tmp_path):
    """An aborted save is never finalised; its writer's report (megatron's writers report through
    one process-wide queue) must not be taken by the next save, synchronous or not."""
    from megatron.core.dist_checkpointing import ShardedTensor

    saver = async_save.AsyncSaver()
    bigger = _state(torch.randn(64, 32), 8) | {
        "v": ShardedTensor.from_rank_offsets("v", torch.randn(1000), replica_id=0)
    }  # two write buckets, where the saves below have one
    saver.begin(tmp_path, 8, bigger, _marker(8), keep_last=0, is_writer=True)
    saver.abort()
    assert saver.pending is None and saver.wait() is None
    w9, w10 = torch.randn(64, 32), torch.randn(64, 32)
    ckpt.save(tmp_path, 9, _state(w9, 9), _marker(9), keep_last=0, is_writer=True)
    saver.begin(tmp_path, 10, _state(w10, 10), _marker(10), keep_last=0, is_writer=True)
    assert saver.wait() is not None
    assert [c.iteration for c in ckpt.complete(tmp_path)] == [9, 10]
    assert torch.equal(_load(tmp_path / "iter_0000009")["w"], w9)
    assert torch.equal(_load(tmp_path / "iter_0000010")["w"], w10)
    tmp = tmp_path / "iter_0000008.tmp"  # the aborted save: written by its writer, never finalised
    assert (
        tmp.is_dir() and not (tmp / ckpt.MARKER).exists() and not (tmp / "metadata.json").exists()
    )


def test_the_staged_host_copies_live_until_the_save_is_finalised(
    process_group, tmp_path, monkeypatch
):
    """The writer reads host copies of the GPU tensors: they are made when the save begins, in the
    saver's own staging arena, and stay referenced in the trainer's process until the save is
    finalised (megatron's own staging let them go at the fork, and its pinned memory could then be
    handed to the next batch). The next save reuses the arena."""
    import gc
    import weakref

    monkeypatch.setattr(
        async_save, "_needs_staging", lambda t: True
    )  # CPU tensors stand in for GPU ones
    copies: list[weakref.ref] = []
    real_copy = async_save.HostStaging.copy

    def copy(self, tensors):
        out = real_copy(self, tensors)
        copies.extend(weakref.ref(c) for c in out)
        return out

    monkeypatch.setattr(async_save.HostStaging, "copy", copy)
    w = torch.randn(64, 32)
    saver = async_save.AsyncSaver()
    saver.staging.reserve(64 * 32 * 4, background=False)
    ((arena, _),) = saver.staging.block_ranges()
    saver.begin(tmp_path, 3, _state(w, 3), _marker(3), keep_last=0, is_writer=True)
    began = w.clone()
    w.add_(1.0)
    gc.collect()
    assert copies and all(ref() is not None for ref in copies), "staged copies were released"
    (staged,) = [ref() for ref in copies]
    assert staged.data_ptr() == arena, "the save did not stage into the arena"
    # its own storage, just its bytes (the writer serialises whole storages)
    assert staged.untyped_storage().nbytes() == 64 * 32 * 4
    assert torch.equal(staged, began)
    del staged
    done = _until_done(saver)
    assert done.iteration == 3
    gc.collect()
    assert all(ref() is None for ref in copies), "staged copies outlive their save"
    assert torch.equal(_load(done.folder)["w"], began)
    # the next save overwrites the same arena (its previous writer has exited) and keeps its state
    copies.clear()
    saver.begin(tmp_path, 4, _state(w, 4), _marker(4), keep_last=0, is_writer=True)
    w.add_(1.0)
    (staged,) = [ref() for ref in copies]
    assert staged.data_ptr() == arena
    del staged
    done = _until_done(saver)
    assert torch.equal(_load(done.folder)["w"], began + 1.0)
    assert torch.equal(_load(tmp_path / "iter_0000003")["w"], began)
    assert saver.staging.nbytes == 64 * 32 * 4  # reused, never grown


def test_staging_copies_every_dtype_and_shape_exactly(monkeypatch):
    """Mixed dtypes, a non-contiguous tensor, an empty one and a scalar: each copy is equal, starts
    on an aligned offset, and a save larger than the arena grows it by one block."""
    monkeypatch.setattr(async_save, "_needs_staging", lambda t: True)
    g = torch.Generator().manual_seed(int(time.time_ns() % 2**31))
    tensors = [
        torch.randn(33, 7, generator=g).to(torch.bfloat16),
        torch.randn(5, 9, generator=g),
        torch.randint(-(2**40), 2**40, (13,), generator=g),
        torch.randn(8, 6, generator=g).t(),  # non-contiguous
        torch.empty(0, 4),
        torch.tensor(3.5, dtype=torch.float64),
    ]
    staging = async_save.HostStaging()
    staging.reserve(512)  # in the background; copy() waits for it
    out = staging.copy(tensors)
    for t, c in zip(tensors, out, strict=True):
        assert c.dtype == t.dtype and c.shape == t.shape and torch.equal(c, t)
        if c.numel():
            assert c.untyped_storage().nbytes() == t.numel() * t.element_size()
            (base,) = [a for a, n in staging.block_ranges() if a <= c.data_ptr() < a + n]
            assert (c.data_ptr() - base) % async_save._ALIGN == 0
    grown = staging.nbytes
    assert grown > 512 and len(staging.block_ranges()) == 2
    again = staging.copy(tensors)  # fits now: no growth, same places
    assert staging.nbytes == grown
    assert [c.data_ptr() for c in again] == [c.data_ptr() for c in out]


def test_cpu_tensors_are_not_staged():
    """Without a GPU nothing is copied: CPU tensors go to the writer as they are (the fork copies
    them on write), and the arena stays empty."""
    staging = async_save.HostStaging()
    t = torch.randn(4)
    assert staging.copy([t])[0] is t
    assert staging.nbytes == 0


def test_a_staged_save_writes_its_tensors_not_the_arena(process_group, tmp_path, monkeypatch):
    """The writer serialises a tensor's whole storage: a tensor staged in a large arena must hold
    only its own bytes, or every tensor of a save would be written as the whole arena (on the H200
    one 4.25 GB save filled the 64 GB disk that way)."""
    monkeypatch.setattr(async_save, "_needs_staging", lambda t: True)
    saver = async_save.AsyncSaver()
    saver.staging.reserve(64 << 20, background=False)  # 64 MiB of arena for an 8 KiB tensor
    w = torch.randn(64, 32)
    saver.begin(tmp_path, 1, _state(w, 1), _marker(1), keep_last=0, is_writer=True)
    done = _until_done(saver)
    written = sum(f.stat().st_size for f in done.folder.rglob("*") if f.is_file())
    assert written < 1 << 20, written
    assert torch.equal(_load(done.folder)["w"], w)


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


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc/PID/maps")
def test_the_writers_are_ready_before_the_first_save(process_group, tmp_path):
    """:func:`ckpt.ready_writers` (a run's setup) starts the results manager, which has imported
    torch's checkpoint types before it serves: the first writer report no longer waits for that
    import (2.2 s of a tiny CPU run's first save). The manager is the one the save then uses."""
    _kill_manager()
    ckpt.ready_writers()
    ckpt.writers_started()  # the end of setup
    manager = _manager_process()
    assert manager.is_alive()
    assert "libtorch" in _maps(manager.pid)
    ckpt.check_intact(_save(tmp_path, 1, False))
    assert _manager_process() is manager


def _kill_manager() -> None:
    """SIGKILL the results manager an earlier test started (or a fresh one of megatron's)."""
    dead = _manager_process()
    os.kill(dead.pid, signal.SIGKILL)
    dead.join(timeout=30)


def test_setup_does_not_wait_for_the_report_server(process_group, monkeypatch):
    """:func:`ckpt.ready_writers` returns while the manager is still starting (2.3-2.5 s on a
    2-core CPU, most of it the server importing torch): setup goes on; :func:`ckpt.writers_started`
    (the end of setup) waits for it. Held here by a start that waits for an event."""
    import threading
    from multiprocessing.managers import SyncManager

    _kill_manager()
    entered, release = threading.Event(), threading.Event()
    real = SyncManager.start

    def held_start(self, *args, **kwargs):
        entered.set()
        assert release.wait(60)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SyncManager, "start", held_start)
    ckpt.ready_writers()  # returns with the start held
    assert entered.wait(30) and not ckpt._serving()
    release.set()
    ckpt.writers_started()
    assert ckpt._serving() and _manager_process().is_alive()


RUN_THAT_DIES = """
import time
from zebractl.run import checkpoint
checkpoint.ready_writers()
checkpoint.writers_started()
print(checkpoint._RESULTS[0]._process.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    """The process ended (or is a zombie waiting for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc/PID/stat")
def test_the_results_manager_ends_with_a_run_killed_outright():
    """A run killed with SIGKILL (or by the OOM killer) cannot shut its manager down, and the
    manager ignores the stop signals: it outlived the run until a reboot. It exits within a few
    seconds of its run now."""
    import subprocess
    import sys

    with subprocess.Popen([sys.executable, "-c", RUN_THAT_DIES], stdout=subprocess.PIPE) as run:
        try:
            manager = int(run.stdout.readline())
            assert not _gone(manager)
        finally:
            run.kill()
    deadline = time.monotonic() + 30
    while not _gone(manager):
        assert time.monotonic() < deadline, f"the manager {manager} outlived its run"
        time.sleep(0.1)


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

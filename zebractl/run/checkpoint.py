"""Checkpoints of a run: megatron torch_dist folders, saved atomically, verified on resume.

``CKPTS/iter_0000020/`` is a megatron ``dist_checkpointing`` folder: sharded tensors (model weights and,
from the trainer, optimizer state: every rank writes its share through megatron's fully parallel
save) plus ``common.pt`` (small common state: scheduler, RNG, counters, the resolved config). The
``zebractl.json`` marker (:class:`~zebractl.run.records.CheckpointMarker`) is written last and lists
every file with its size and SHA-256. A save goes to ``iter_N.tmp`` and is renamed when complete, so a
crash mid-save never leaves a folder that looks finished.

:func:`save` writes a checkpoint while training waits. :class:`AsyncSaver` takes a save off the
training critical path: training pauses only while the state is staged in host memory and a writer
process is forked (megatron's ``async_sharded_save``); the files are written in the background, then
megatron's finalisation runs on every rank and rank 0 hashes the files, writes the marker and renames
the folder in a background thread. A crash at any point of it (even SIGKILL) leaves ``iter_N.tmp``
without a marker, which resume never takes.

Resume takes the newest complete checkpoint that verifies (sizes and checksums equal the marker's, and
megatron loads it); a checkpoint damaged after it completed is named in a warning and skipped for the
next one. Only this module knows megatron's checkpoint files.
"""

from __future__ import annotations

import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from zebractl.errors import ConfigError, first_line
from zebractl.run.records import CheckpointMarker, FileRecord
from zebractl.run.rundir import utc_now, write_text_atomic
from zebractl.util import sha256_file

MARKER = "zebractl.json"
_META = "metadata.json"  # megatron's: backend and version of the sharded format
_NAME = re.compile(r"^iter_(\d{7})$")


class DamagedCheckpoint(Exception):
    """A checkpoint that completed but no longer verifies or loads."""

    def __init__(self, folder: Path, reason: str) -> None:
        super().__init__(f"{folder}: {reason}")
        self.folder, self.reason = folder, reason


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its folder and marker."""

    folder: Path
    marker: CheckpointMarker

    @property
    def iteration(self) -> int:
        """Optimizer steps completed."""
        return self.marker.iteration


def checkpoint_dir(root: Path, iteration: int) -> Path:
    """Folder of the checkpoint of ``iteration``."""
    return root / f"iter_{iteration:07d}"


def read_marker(folder: Path) -> CheckpointMarker:
    """The marker of a checkpoint folder (:class:`DamagedCheckpoint` if unreadable)."""
    path = folder / MARKER
    try:
        return CheckpointMarker.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise DamagedCheckpoint(folder, f"no {MARKER} (the save did not complete)") from None
    except (OSError, ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise DamagedCheckpoint(folder, f"{MARKER} is unreadable ({first})") from None


def _candidates(root: Path, *, marked: bool = True) -> list[tuple[int, Path]]:
    """(iteration, folder) of the ``iter_N`` folders under ``root``, oldest first: those with a
    marker, or (``marked=False``) every one. A save completes under its ``iter_N.tmp`` name and is
    renamed only once marked, so an ``iter_N`` folder without a marker lost it afterwards."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (not marked or (p / MARKER).exists()):
            found.append((int(m.group(1)), p))
    return sorted(found)


def candidates(root: Path) -> list[tuple[int, Path]]:
    """(iteration, folder) of every ``iter_N`` folder under ``root``, marked or not, oldest first."""
    return _candidates(root, marked=False)


def incomplete(root: Path) -> list[Path]:
    """The ``iter_N.tmp`` folders under ``root``: saves that never completed (a crash, a kill, a
    full disk); resume never takes them."""
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if _NAME.match(p.name.removesuffix(".tmp")) and p.name.endswith(".tmp") and p.is_dir()
    )


def size(folder: Path) -> int:
    """Bytes of a complete checkpoint, from its marker's file list (0 if it has none)."""
    try:
        return sum(f.size for f in read_marker(folder).files)
    except DamagedCheckpoint:
        return 0


def complete(root: Path) -> list[Checkpoint]:
    """Every checkpoint under ``root`` whose save completed (marker readable), oldest first.

    Completeness is not integrity: see :func:`verify`.
    """
    out = []
    for _, folder in _candidates(root):
        try:
            out.append(Checkpoint(folder, read_marker(folder)))
        except DamagedCheckpoint:
            continue
    return out


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER)


def verify(folder: Path, *, checksums: bool = True) -> Checkpoint:
    """The checkpoint in ``folder`` if every file is as the marker recorded it.

    Raises :class:`DamagedCheckpoint` naming the first problem: a missing, truncated, grown or
    changed file, or a missing marker. Markers of format 1 have no file list; only megatron's
    metadata file is checked for them.
    """
    if not (folder / MARKER).exists():  # renamed into place only once marked: emptied since
        left = len(_files(folder))
        raise DamagedCheckpoint(
            folder,
            f"no {MARKER} (its marker was removed after the save"
            + (f"; {left} other file(s) left)" if left else "; the folder is empty)"),
        )
    marker = read_marker(folder)
    if not (folder / _META).is_file():
        raise DamagedCheckpoint(folder, f"{_META} is missing")
    for rec in marker.files:
        path = folder / rec.path
        if not path.is_file():
            raise DamagedCheckpoint(folder, f"{rec.path} is missing")
        size = path.stat().st_size
        if size != rec.size:
            what = "emptied" if size == 0 else "truncated" if size < rec.size else "grown"
            raise DamagedCheckpoint(
                folder, f"{rec.path} was {what} ({size:,} bytes, {rec.size:,} when saved)"
            )
        if checksums and sha256_file(path) != rec.sha256:
            raise DamagedCheckpoint(folder, f"{rec.path} changed since it was saved (checksum)")
    return Checkpoint(folder, marker)


def save(
    root: Path,
    iteration: int,
    sharded_state: dict[str, Any],
    marker: CheckpointMarker,
    *,
    keep_last: int,
    is_writer: bool,
) -> Path:
    """Save ``sharded_state`` as the checkpoint of ``iteration`` (collective: every rank calls it).

    Each rank writes its share of the sharded tensors (megatron's fully parallel save over the
    data-parallel replicas); rank 0 writes ``common.pt``, then the marker with every file's size
    and checksum, renames the folder into place and prunes to the newest ``keep_last`` (0 keeps
    all).
    """
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from zebractl.runtime import megatron_compat

    _settle_abandoned()
    final, tmp = _prepare_tmp(root, iteration, is_writer)
    with megatron_compat.patched():  # the writer synchronises CUDA, a no-op without it
        dist_checkpointing.save(sharded_state, str(tmp), sharded_strategy=_save_strategy())
    dist.barrier()
    if is_writer:
        _seal(tmp, final, marker, keep_last)
    dist.barrier()
    return final


def _seal(tmp: Path, final: Path, marker: CheckpointMarker, keep_last: int) -> None:
    """Complete a fully written ``tmp`` folder (writer rank only): hash every file, write the
    marker, rename ``tmp`` to ``final`` and prune the checkpoints beside it to ``keep_last``."""
    files = [
        FileRecord(path=str(p.relative_to(tmp)), size=p.stat().st_size, sha256=sha256_file(p))
        for p in _files(tmp)
    ]
    done = marker.model_copy(update={"files": files, "created": utc_now()})
    write_text_atomic(tmp / MARKER, done.model_dump_json(indent=2) + "\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    prune(final.parent, keep_last)


_ABANDONED: list[Any] = []
"""megatron ``AsyncCallsQueue``s of saves :meth:`AsyncSaver.abort` gave up, whose writers may still run."""


def _settle_abandoned() -> None:
    """Before a save: wait for the writer processes of abandoned saves and drop what they reported.

    megatron's writers report through one process-wide queue, and a save's finalisation takes the
    first report it finds there as its own: an abandoned writer's report would be taken by the next
    save (a failed save, or a checkpoint whose metadata points into other files).
    """
    if not _ABANDONED:
        return
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    for calls in _ABANDONED:
        for call in calls.async_calls:
            call.async_caller.close()  # joins the writer process
    _ABANDONED.clear()
    results = filesystem_async._get_write_results_queue()
    while True:
        try:
            results.get_nowait()
        except queue.Empty:
            return


def _prepare_tmp(root: Path, iteration: int, is_writer: bool) -> tuple[Path, Path]:
    """(final, tmp) folders of the checkpoint of ``iteration``; the writer empties ``tmp``, then
    every rank waits for it (collective)."""
    import torch.distributed as dist

    final = checkpoint_dir(root, iteration)
    tmp = final.with_name(final.name + ".tmp")
    if is_writer:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    return final, tmp


def _save_strategy() -> Any:
    """megatron's torch_dist writer, spread over the data-parallel replicas when there are several."""
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )

    strategy = get_default_save_sharded_strategy()
    if dist.get_world_size() > 1:
        strategy = FullyParallelSaveStrategyWrapper(strategy, dist.group.WORLD)
    return strategy


class SaveFailed(RuntimeError):
    """A checkpoint save that did not complete; its ``iter_N.tmp`` folder stays incomplete."""


@dataclass(frozen=True)
class SaveDone:
    """A checkpoint an :class:`AsyncSaver` completed."""

    folder: Path
    """The complete checkpoint folder (marker written, renamed into place)."""
    iteration: int
    """Optimizer steps it holds."""
    seconds: float
    """Wall time from the start of the save to its completion (training went on meanwhile)."""


@dataclass
class _Pending:
    """The save an :class:`AsyncSaver` has in flight."""

    iteration: int
    tmp: Path
    final: Path
    marker: CheckpointMarker
    keep_last: int
    is_writer: bool
    started: float  # time.perf_counter() when the save began
    stage: str = "write"  # "write": megatron's writer processes; "seal": the marker thread
    thread: threading.Thread | None = None  # the writer rank's marker thread
    error: BaseException | None = field(default=None, repr=False)  # what the thread raised
    staged: Any = field(default=None, repr=False)  # the host copies the writer reads (see _stage)


def _stage(request: Any, staging: HostStaging) -> tuple[Any, Any]:
    """Copy the request's GPU tensors into host memory now (``staging``), and keep the copies.

    megatron would stage them inside ``schedule_async_request`` (its ``preload_fn``: a
    non-blocking copy into pinned memory from torch's caching allocator) and hand them to the
    forked writer as the process's arguments only: ``multiprocessing`` drops those arguments in the
    parent right after the fork, so the caching allocator may give the same blocks to the next
    pinned allocation (the data loader's next batch) while the writer still reads them; and the
    first save of a process pays for pinning gigabytes (2.6-3.1 s of the training pause at 300M).
    Here the copies land in a :class:`HostStaging` arena that only the saver uses and that the next
    save reuses only after this one is finalised (its writer has exited). The copies are also held
    until then. Returns the request without its ``preload_fn`` (its arguments hold the copies)
    and the copies.
    """
    if request is None or request.preload_fn is None:
        return request, None
    args = list(request.async_fn_args)
    items = [
        (file_name, key, bytes_data, [item for item, _ in tensor_data], [t for _, t in tensor_data])
        for file_name, key, (bytes_data, tensor_data) in args[1]
    ]
    copies = staging.copy([t for *_, tensors in items for t in tensors])
    staged, i = [], 0
    for file_name, key, bytes_data, names, tensors in items:
        pairs = list(zip(names, copies[i : i + len(tensors)], strict=True))
        staged.append((file_name, key, (bytes_data, pairs)))
        i += len(tensors)
    args[1] = staged
    return request._replace(async_fn_args=tuple(args), preload_fn=None), staged


def _needs_staging(t: Any) -> bool:
    """Whether a tensor must be copied to host memory for the writer (GPU tensors; CPU tensors go
    as they are: the fork copies them on write)."""
    return t.device.type != "cpu"


_ALIGN = 256  # bytes: every staged tensor starts on this boundary (any dtype views cleanly)


class HostStaging:
    """Host memory for the tensors of an asynchronous save, allocated once and reused.

    The device-to-host copy into freshly allocated memory ran at 1.1-1.6 GB/s on the H200 (the
    kernel zeroes and maps every new page during the copy): 2.6-3.8 s of training pause per
    4.25 GB save at 300M. This arena is allocated ahead (:meth:`reserve`, in a background thread
    while training starts) as anonymous memory maps whose pages are touched once, so a save only
    copies. Each staged tensor is a tensor of its own over its slice of a map
    (``torch.frombuffer``), not a view of one large tensor: the writer serialises a tensor's whole
    storage, and views of one block would each write the whole block. A save larger than the arena
    adds a map for the excess. Reuse is safe because a save begins only after the previous one is
    finalised, and its writer, which saw the maps at the fork (copy-on-write, private), has exited.
    """

    def __init__(self) -> None:
        self._blocks: list[tuple[memoryview, Any]] = []  # (the map's bytes, a uint8 tensor over it)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        self._join()
        return sum(len(mv) for mv, _ in self._blocks)

    def block_ranges(self) -> list[tuple[int, int]]:
        """(address, bytes) of each map (for tests and diagnostics)."""
        self._join()
        return [(t.data_ptr(), len(mv)) for mv, t in self._blocks]

    def reserve(self, nbytes: int, background: bool = True) -> None:
        """Allocate (and touch) ``nbytes`` of staging memory, in a background thread unless
        ``background`` is false. A failure surfaces as a warning at the next use, which then
        allocates what it needs."""
        self._join()
        need = nbytes - self.nbytes
        if need <= 0:
            return
        if not background:
            self._blocks.append(self._allocate(need))
            return
        self._thread = threading.Thread(
            target=self._reserve_in_thread, args=(need,), name="zebractl-staging", daemon=True
        )
        self._thread.start()

    def _reserve_in_thread(self, nbytes: int) -> None:
        try:
            self._blocks.append(self._allocate(nbytes))
        except BaseException as exc:  # noqa: BLE001 - reported by the next use
            self._error = exc

    @staticmethod
    def _allocate(nbytes: int) -> tuple[memoryview, Any]:
        import mmap

        import torch

        view = memoryview(mmap.mmap(-1, nbytes))  # anonymous, private: copy-on-write at a fork
        whole = torch.frombuffer(view, dtype=torch.uint8)
        whole.fill_(0)  # fault every page in now rather than during a save's copy
        return view, whole

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            import warnings

            exc, self._error = self._error, None
            warnings.warn(
                f"zebractl: the checkpoint staging memory could not be allocated ahead "
                f"({first_line(exc, type(exc).__name__)}); saves stage into memory allocated when they start",
                RuntimeWarning,
                stacklevel=3,
            )

    def copy(self, tensors: list[Any]) -> list[Any]:
        """Host copies of ``tensors`` (tensors over the arena for the GPU tensors, CPU tensors as
        they are), in order."""
        import torch

        self._join()
        staged = [t for t in tensors if _needs_staging(t)]
        sizes = [_aligned(t.numel() * t.element_size()) for t in staged]
        places, b, offset = [], 0, 0  # (block, offset) of each staged tensor, first fit in order
        for i, size in enumerate(sizes):
            while b < len(self._blocks) and offset + size > len(self._blocks[b][0]):
                b, offset = b + 1, 0
            if b == len(self._blocks):  # out of room: one new block for this and all the rest
                self._blocks.append(self._allocate(sum(sizes[i:])))
            places.append((b, offset))
            offset += size
        copies = {}
        for t, (b, offset) in zip(staged, places, strict=True):
            n = t.numel() * t.element_size()
            if n == 0:
                host = torch.empty(t.shape, dtype=t.dtype)
            else:
                mv = self._blocks[b][0][offset : offset + n]
                host = torch.frombuffer(mv, dtype=t.dtype).view(t.shape)
                host.copy_(t.detach())
            copies[id(t)] = host
        return [copies.get(id(t), t) for t in tensors]


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class AsyncSaver:
    """Checkpoint saves off the training critical path, one at a time.

    Collective: every rank makes one and calls each method at the same points (the trainer's step
    boundaries). :meth:`begin` takes the arguments of :func:`save`; training pauses only while
    megatron plans the save, writes ``common.pt``, stages the tensors in host memory and forks its
    writer process, which then writes this rank's shards. :meth:`poll` (non-blocking) moves the save
    on once every rank's writer is done: megatron's finalisation (collective: ``.metadata`` and
    ``metadata.json``), then, on the writer rank, a background thread that hashes every file, writes
    the marker, renames ``iter_N.tmp`` to ``iter_N`` and prunes (:func:`save`'s last steps;
    hashlib releases the GIL). :meth:`wait` finishes the save in flight; :meth:`abort` forgets it after
    an error.

    With several ranks each :meth:`poll` of a save in flight agrees on its progress with one
    all-reduce of two integers over ``group``, which must reduce CPU tensors (gloo): no GPU
    synchronisation per step. With one rank a poll is a ``waitpid``.
    """

    def __init__(self, group: Any = None, staging: HostStaging | None = None) -> None:
        """``group``: the process group for the agreement (None: the default group);
        ``staging``: the host memory saves stage into (None: an arena of its own)."""
        import torch.distributed as dist
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        self._group = group
        self._world = dist.get_world_size(group)
        self._queue = AsyncCallsQueue()
        self._pending: _Pending | None = None
        self.staging = staging if staging is not None else HostStaging()
        self.last_complete: Path | None = None
        """The newest checkpoint this saver completed (every rank knows it)."""

    @property
    def pending(self) -> int | None:
        """The iteration of the save in flight, if any."""
        return self._pending.iteration if self._pending is not None else None

    def begin(
        self,
        root: Path,
        iteration: int,
        sharded_state: dict[str, Any],
        marker: CheckpointMarker,
        *,
        keep_last: int,
        is_writer: bool,
    ) -> Path:
        """Start saving ``sharded_state`` as the checkpoint of ``iteration``; returns its final
        folder, which exists only once the save completes. First finishes the previous save
        (:meth:`wait`, whose error it raises)."""
        from megatron.core import dist_checkpointing

        from zebractl.runtime import megatron_compat

        self.wait()
        _settle_abandoned()
        started = time.perf_counter()
        final, tmp = _prepare_tmp(root, iteration, is_writer)
        with megatron_compat.patched():  # staging synchronises CUDA, a no-op without it
            request = dist_checkpointing.save(
                sharded_state, str(tmp), sharded_strategy=_save_strategy(), async_sharded_save=True
            )
            request, staged = _stage(request, self.staging)
            self._queue.schedule_async_request(request)
        self._pending = _Pending(iteration, tmp, final, marker, keep_last, is_writer, started)
        self._pending.staged = staged
        return final

    def poll(self) -> SaveDone | None:
        """Move the save in flight on without blocking; the checkpoint it completed, if it did.

        Raises :class:`SaveFailed` (on every rank) if the writer or the marker thread failed.
        """
        p = self._pending
        if p is None:
            return None
        if p.stage == "write":
            (writing,) = self._agree(int(not self._written()))
            if not writing:
                self._finish_write(p)
            return None
        running = int(p.thread is not None and p.thread.is_alive())  # before reading the error
        running, failed = self._agree(running, int(p.error is not None))
        return None if running else self._done(p, bool(failed))

    def wait(self) -> SaveDone | None:
        """Finish the save in flight (blocking); the checkpoint it completed, if one was in flight.

        Raises :class:`SaveFailed` (on every rank) if the writer or the marker thread failed.
        """
        p = self._pending
        if p is None:
            return None
        if p.stage == "write":
            self._finish_write(p)
        if p.thread is not None:
            p.thread.join()
        (failed,) = self._agree(int(p.error is not None))
        return self._done(p, bool(failed))

    def abort(self) -> None:
        """Forget the save in flight after an error, with no collective and without finalising it:
        its ``iter_N.tmp`` stays incomplete. A writer process still running finishes its files on its
        own; the next save of this process joins it first and drops its report (multiprocessing
        joins it when the interpreter exits). A marker thread already running (every rank's files
        were written and finalised) is joined: its checkpoint is complete."""
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        p, self._pending = self._pending, None
        if p is None:
            return
        if p.stage == "write":
            _ABANDONED.append(self._queue)  # its request is never finalised
            self._queue = AsyncCallsQueue()
        elif p.thread is not None:
            p.thread.join()

    # ---- internals -----------------------------------------------------------------------------
    def _written(self) -> bool:
        """Whether this rank's writer process is done (non-blocking; joins it when it is)."""
        calls = self._queue.async_calls
        if not calls:
            return True
        return calls[0].async_caller.is_current_async_call_done(blocking=False, no_dist=True)

    def _finish_write(self, p: _Pending) -> None:
        """Wait for this rank's writer, run megatron's finalisation (collective), then start the
        writer rank's marker thread."""
        from zebractl.runtime import megatron_compat

        try:
            with megatron_compat.patched():  # finalisation asks for the CUDA device and syncs
                self._queue.maybe_finalize_async_calls(blocking=True, no_dist=True)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - torch's CheckpointException is a BaseException
            self._pending = None
            raise SaveFailed(
                f"checkpoint {p.final} was not saved: writing it failed ({first_line(exc, type(exc).__name__)}); "
                f"{p.tmp} stays incomplete"
            ) from exc
        p.stage = "seal"
        if p.is_writer:
            p.thread = threading.Thread(
                target=self._seal_in_thread, args=(p,), name=f"zebractl-seal-{p.final.name}"
            )
            p.thread.start()

    @staticmethod
    def _seal_in_thread(p: _Pending) -> None:
        """The marker thread: hash, write the marker, rename, prune; keeps its error for the
        main thread."""
        try:
            _seal(p.tmp, p.final, p.marker, p.keep_last)
        except BaseException as exc:  # noqa: BLE001 - raised again by poll/wait in the main thread
            p.error = exc

    def _done(self, p: _Pending, failed: bool) -> SaveDone:
        """Close the save in flight: raise its error everywhere, or report its checkpoint."""
        self._pending = None
        if failed:
            why = (
                first_line(p.error, type(p.error).__name__)
                if p.error is not None
                else "it failed on rank 0"
            )
            raise SaveFailed(
                f"checkpoint {p.final} was not completed: hashing and marking it failed ({why}); "
                f"{p.tmp} stays incomplete"
            ) from p.error
        self.last_complete = p.final
        return SaveDone(p.final, p.iteration, time.perf_counter() - p.started)

    def _agree(self, *flags: int) -> list[int]:
        """The maximum of each flag over the ranks (no collective with one rank)."""
        if self._world == 1:
            return list(flags)
        import torch
        import torch.distributed as dist

        t = torch.tensor(flags, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
        return [int(x) for x in t.tolist()]


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (0 keeps all); returns them."""
    if keep_last <= 0:
        return []
    old = [folder for _, folder in _candidates(root)][:-keep_last]
    for folder in old:
        shutil.rmtree(folder, ignore_errors=True)
    return old


def load(folder: Path, template: dict[str, Any]) -> dict[str, Any]:
    """Load a checkpoint into the structure of a sharded ``template``.

    Any failure of the reader (torch's ``CheckpointException`` is a ``BaseException``) becomes a
    :class:`DamagedCheckpoint`.
    """
    from megatron.core import dist_checkpointing

    try:
        return dist_checkpointing.load(template, str(folder))
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - torch's CheckpointException is a BaseException
        first = first_line(exc, type(exc).__name__)
        raise DamagedCheckpoint(
            folder, f"cannot be loaded ({type(exc).__name__}: {first})"
        ) from None


def newest_intact(
    root: Path, warn: Callable[[str], None], failed: dict[int, str] | None = None
) -> tuple[Checkpoint | None, list[str]]:
    """The newest checkpoint under ``root`` that verifies, and the damaged ones met on the way.

    Each damaged checkpoint is named through ``warn``. ``failed`` maps iterations to pass over
    (ones that verified but failed to load) to the reason.
    """
    failed = failed or {}
    damaged = [f"{checkpoint_dir(root, it)}: {why}" for it, why in sorted(failed.items())]
    for it, folder in reversed(candidates(root)):
        if it in failed:
            continue
        try:
            return verify(folder), damaged
        except DamagedCheckpoint as exc:
            damaged.append(str(exc))
            warn(f"warning: checkpoint {exc.folder} is damaged: {exc.reason}; skipping it")
    return None, damaged


def all_damaged(root: Path, damaged: list[str]) -> ConfigError:
    """The error for a checkpoint folder where nothing is intact: never a silent fresh start."""
    return ConfigError(
        f"every checkpoint in {root} is damaged ({len(damaged)}: "
        + "; ".join(damaged)
        + "); this run made progress, so it does not start over by itself: restore a checkpoint, "
        "or start over on purpose with --set checkpoint.resume=never (training from iteration 0 "
        "into this directory) or a fresh --output"
    )


def find(source: Path) -> Checkpoint:
    """The checkpoint ``source`` names: a checkpoint folder, a checkpoints folder or a run folder
    (newest intact one)."""
    if not source.exists():
        raise ConfigError(f"{source}: no such checkpoint, checkpoints folder or run directory")
    if (source / MARKER).exists():
        try:
            return verify(source)
        except DamagedCheckpoint as exc:
            raise ConfigError(f"checkpoint {exc}") from None
    for root in (source, source / "checkpoints"):
        found = candidates(root)
        for _, folder in reversed(found):
            try:
                return verify(folder)
            except DamagedCheckpoint:
                continue
        if found:
            raise ConfigError(f"{root}: every checkpoint is damaged")
    raise ConfigError(
        f"{source}: no complete checkpoint here (expected a checkpoint folder with {MARKER}, "
        "a checkpoints folder, or a run directory)"
    )


def load_weights(source: Path, model: Any) -> Checkpoint:
    """Load only the model weights of a checkpoint into ``model`` (a ``ZebraModel``, or anything
    with megatron's ``sharded_state_dict``); no optimizer state is read. ``source`` is a
    checkpoint folder, a checkpoints folder or a run directory (newest intact checkpoint)."""
    ckpt = find(Path(source))
    template = {"model": model.sharded_state_dict(metadata=sharded_metadata())}
    try:
        loaded = load(ckpt.folder, template)
    except DamagedCheckpoint as exc:
        raise ConfigError(f"checkpoint {exc}") from None
    load_model_state(model, loaded["model"])
    return ckpt


def load_model_state(model: Any, state: dict[str, Any]) -> None:
    """Put a loaded model state into ``model``; every parameter and buffer must be present."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    # megatron's modules carry `_extra_state` entries (TE/FP8 metadata) we neither save nor use
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise ConfigError(
            "the checkpoint does not fit this model: "
            + (f"missing {', '.join(missing[:5])}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (f"unexpected {', '.join(unexpected[:5])}" if unexpected else "")
        )


def sharded_metadata() -> dict[str, Any]:
    """The metadata megatron's ``sharded_state_dict`` calls take for our checkpoints."""
    from megatron.core import parallel_state

    return {
        "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
    }

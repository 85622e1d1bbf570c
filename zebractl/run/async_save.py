"""Checkpoint saves off the training critical path (``checkpoint.async_save``).

:class:`AsyncSaver` stages the state in pinned host memory (:class:`HostStaging`, reused from save
to save), forks megatron's writer process (``async_sharded_save``) and returns; the files are
written in the background, then megatron's finalisation runs on every rank and rank 0 hashes the
files, writes the marker and renames the folder (:func:`zebractl.run.checkpoint.seal`) in a
background thread. A crash at any point (even SIGKILL) leaves ``iter_N.tmp`` without a marker, which
resume never takes. What a checkpoint is, and the synchronous save, are
:mod:`zebractl.run.checkpoint`'s.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zebractl.errors import first_line
from zebractl.run import checkpoint as ckpt
from zebractl.run.records import CheckpointMarker


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

        self.wait()
        ckpt.shield_writers()
        ckpt.settle_abandoned()
        started = time.perf_counter()
        final, tmp = ckpt.prepare_tmp(root, iteration, is_writer)
        with ckpt.megatron_writing():  # the forked writer keeps megatron's logs off
            request = dist_checkpointing.save(
                sharded_state,
                str(tmp),
                sharded_strategy=ckpt.save_strategy(),
                async_sharded_save=True,
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
            ckpt.abandon(self._queue)  # its request is never finalised
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
        try:
            with ckpt.megatron_writing():  # finalisation asks for the CUDA device and syncs
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
            ckpt.seal(p.tmp, p.final, p.marker, p.keep_last)
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

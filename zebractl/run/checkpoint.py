"""Checkpoints of a run: megatron torch_dist folders, saved atomically, verified on resume.

``CKPTS/iter_0000020/`` is a megatron ``dist_checkpointing`` folder: sharded tensors (model weights and,
from the trainer, optimizer state: every rank writes its share through megatron's fully parallel
save) plus ``common.pt`` (small common state: scheduler, RNG, counters, the resolved config). The
``zebractl.json`` marker (:class:`~zebractl.run.records.CheckpointMarker`) is written last and lists
every file with its size and SHA-256. A save goes to ``iter_N.tmp`` and is renamed when complete, so a
crash mid-save never leaves a folder that looks finished.

:func:`save` writes a checkpoint while training waits; :mod:`zebractl.run.async_save` takes a
save off the training critical path and ends in :func:`seal` as well.

Resume takes the newest complete checkpoint that verifies (sizes and checksums equal the marker's, and
megatron loads it); a checkpoint damaged after it completed is named in a warning and skipped for the
next one. Only this module knows megatron's checkpoint files.
"""

from __future__ import annotations

import contextlib
import queue
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from zebractl.errors import ConfigError, first_line
from zebractl.run.records import CheckpointMarker, FileRecord
from zebractl.run.rundir import utc_now, write_text_atomic
from zebractl.util import sha256_file

MARKER = "zebractl.json"
_META = "metadata.json"  # megatron's: backend and version of the sharded format
_COMMON = "common.pt"  # megatron's: the state every rank shares (the trainer's resolved config)
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


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is a checkpoint folder's (``iter_0000020``, or ``iter_0000020.tmp`` while
    it is saved)."""
    return bool(_NAME.match(name.removesuffix(".tmp")))


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

    Completeness is not integrity: see :func:`check_intact`.
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


def check_intact(folder: Path, *, checksums: bool = True) -> Checkpoint:
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

    shield_writers()
    settle_abandoned()
    final, tmp = prepare_tmp(root, iteration, is_writer)
    with megatron_writing():
        dist_checkpointing.save(sharded_state, str(tmp), sharded_strategy=save_strategy())
    dist.barrier()
    if is_writer:
        seal(tmp, final, marker, keep_last)
    dist.barrier()
    return final


def seal(tmp: Path, final: Path, marker: CheckpointMarker, keep_last: int) -> None:
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


WRITER_LOGGERS = ("megatron.core.dist_checkpointing",)
"""megatron's checkpoint loggers: a failed write is logged at ERROR (``Local process 0 encountered an
error: ...``) before the save raises, and the save's error is ours to report."""


@contextlib.contextmanager
def megatron_writing() -> Iterator[None]:
    """Around megatron's save calls (the plan and the writes, the fork of a background writer, the
    finalisation): :func:`zebractl.runtime.megatron_compat.patched` (the writer synchronises CUDA,
    a no-op without it) and megatron's checkpoint logs off unless ``-v``
    (:func:`zebractl.runtime.quiet.reported`): a full disk is one line, the
    :class:`~zebractl.run.disk.DiskError` the save's failure becomes, not megatron's first."""
    from zebractl.runtime import megatron_compat, quiet

    with megatron_compat.patched(), quiet.reported(*WRITER_LOGGERS):
        yield


_RESULTS: tuple[Any, Any] | None = None
"""(manager, queue) of :func:`shield_writers`."""

_STARTING: Any = None
"""The thread :func:`ready_writers` starts the manager in, until :func:`writers_started` joins it."""


def ready_writers() -> None:
    """At the start of a run that saves: import megatron's save path, and start the writers'
    report server (:func:`shield_writers`) in a thread, which :func:`writers_started` joins at the
    end of setup. The first save waited for both (a tiny run on a CPU: its first save took 2.45 s
    against 0.20 s for the later ones); in a thread, setup does not wait for the server's start
    (2.3-2.5 s on that CPU, most of it the server importing torch) either. The imports stay in this
    thread (two threads importing the same modules can deadlock), and so does the resource
    tracker's start (a lock a fork would copy held)."""
    global _STARTING
    import threading
    from multiprocessing import managers, resource_tracker  # noqa: F401 - the thread's imports

    from megatron.core.dist_checkpointing import serialization  # noqa: F401 - the save's imports
    from megatron.core.dist_checkpointing.strategies import filesystem_async, fully_parallel  # noqa: F401
    from torch import multiprocessing  # noqa: F401

    from zebractl.runtime import stop_signals

    writers_started()
    if _serving():
        return
    with stop_signals.held():
        resource_tracker.ensure_running()
    _STARTING = threading.Thread(target=_start_quietly, name="zebractl-report-server", daemon=True)
    _STARTING.start()


def writers_started() -> None:
    """Wait for the start :func:`ready_writers` began (at the end of setup, before the training
    loop forks data workers; and before each save). A start that failed is not raised here: the
    save starts the server again and reports its own failure."""
    global _STARTING
    if _STARTING is not None:
        _STARTING.join()
        _STARTING = None


def _start_quietly() -> None:
    with contextlib.suppress(Exception):  # the save starts it again and reports the failure
        _start_server()


def _serving() -> bool:
    if _RESULTS is None:
        return False
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    manager, queue_ = _RESULTS
    process = getattr(manager, "_process", None)
    return filesystem_async._results_queue is queue_ and process is not None and process.is_alive()


def shield_writers() -> None:
    """Before a save: megatron's writers report to a queue served by a process that ignores the
    stop signals (:mod:`zebractl.runtime.stop_signals`).

    megatron's writer processes send their results through one process-wide queue served by a
    multiprocessing manager, which megatron spawns at the first save with Python's default signal
    handlers. A SIGTERM or SIGUSR1 sent to the run's process group (torchrun stopping its workers,
    Slurm, ``timeout``) killed it, and the save the stop was completing failed: a
    ``ConnectionRefusedError`` traceback from the background writer, ``BrokenPipeError`` from a
    blocking save, exit 1 instead of 143 (issue 42). This starts that manager, once (unless
    :func:`ready_writers` did), with the stop signals held back until its initializer ignores them,
    and starts another if it died since (a SIGKILL)."""
    writers_started()
    if not _serving():
        _start_server()


def _start_server() -> None:
    global _RESULTS
    from multiprocessing import resource_tracker
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from torch import multiprocessing

    from zebractl.runtime import stop_signals

    # spawning a process starts multiprocessing's resource tracker first, with SIGINT and SIGTERM
    # blocked around it and unblocked after: started here, SIGUSR1 stays blocked for its life too,
    # and the manager below is spawned with all three still held (in the calling thread: the
    # signal mask is a thread's, and a spawned process inherits its starter's)
    with stop_signals.held():
        resource_tracker.ensure_running()
    manager = SyncManager(ctx=multiprocessing.get_context("spawn"))  # megatron's own kind
    with stop_signals.held():
        manager.start(initializer=_results_server)
    queue_ = manager.Queue()  # the proxy keeps the manager alive; it shuts down at exit
    filesystem_async._results_queue = queue_
    _RESULTS = (manager, queue_)


def _results_server() -> None:
    """The initializer of :func:`shield_writers`' manager process: the stop signals ignored, the
    libraries' warnings hidden as zebractl hides them (unless -v), and torch's checkpoint types
    imported before the server starts. The server unpickles each writer's report (torch's
    ``WriteResult``s): without them imported, the first report imported torch while the save it
    ends waited (most of a tiny CPU run's first save: 2.45 s against 0.20 s for the next ones).
    Imported here, not in a thread beside the server: a report unpickled meanwhile imported
    the same modules, and Python's import lock refused one of the two (``_DeadlockError``).
    It ends with the process that started it (:func:`_end_with`)."""
    import os
    import threading
    import warnings

    from zebractl.runtime import quiet, stop_signals

    stop_signals.ignore()
    watch = threading.Thread(target=_end_with, args=(os.getppid(),), name="zebractl-parent-watch")
    watch.daemon = True
    watch.start()
    if os.environ.get(quiet.VERBOSE_ENV) != "1":
        warnings.filterwarnings("ignore", module=quiet.MODULE_PATTERN)
    import torch.distributed.checkpoint  # noqa: F401 - WriteResult, MetadataIndex, _StorageInfo


def _end_with(parent: int) -> None:
    """In the report server: exit once ``parent`` (the run's process) is gone. A run killed outright
    (SIGKILL, the kernel's OOM killer, a node's scheduler) never shuts its manager down, and the
    server ignores the stop signals: it outlived the run, holding torch in host memory, until
    the machine rebooted. Polled once a second (``os.getppid`` changes when the parent dies)."""
    import os
    import time

    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


_ABANDONED: list[Any] = []
"""megatron ``AsyncCallsQueue``s of saves :meth:`zebractl.run.async_save.AsyncSaver.abort` gave
up, whose writers may still run."""


def abandon(calls: Any) -> None:
    """Remember the ``AsyncCallsQueue`` of a save given up: :func:`settle_abandoned` waits for its
    writers before the next save."""
    _ABANDONED.append(calls)


def settle_abandoned() -> None:
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


def prepare_tmp(root: Path, iteration: int, is_writer: bool) -> tuple[Path, Path]:
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


def save_strategy() -> Any:
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
            return check_intact(folder), damaged
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


def find(source: Path, skipped: list[str] | None = None) -> Checkpoint:
    """The checkpoint ``source`` names: a checkpoint folder, a checkpoints folder or a run folder
    (newest intact one). Each damaged checkpoint passed over on the way is appended to
    ``skipped`` (``FOLDER: reason``) for the reader to name."""
    if not source.exists():
        raise ConfigError(f"{source}: no such checkpoint, checkpoints folder or run directory")
    if (source / MARKER).exists():
        try:
            return check_intact(source)
        except DamagedCheckpoint as exc:
            raise ConfigError(f"checkpoint {exc}") from None
    for root in (source, source / "checkpoints"):
        found = candidates(root)
        for _, folder in reversed(found):
            try:
                return check_intact(folder)
            except DamagedCheckpoint as exc:
                if skipped is not None:
                    skipped.append(str(exc))
                continue
        if found:
            raise ConfigError(f"{root}: every checkpoint is damaged")
    raise ConfigError(
        f"{source}: no complete checkpoint here (expected a checkpoint folder with {MARKER}, "
        "a checkpoints folder, or a run directory)"
    )


def recorded_config(folder: Path) -> dict[str, Any] | None:
    """The resolved config (a :class:`~zebractl.run.records.ResolvedConfigRecord` as a dict) the
    checkpoint in ``folder`` was saved with, from its common state; None when it holds none or
    cannot be read (a damaged file is the loader's to name)."""
    import torch

    try:  # the common state holds the schedule's and generators' states: not weights only
        common = torch.load(folder / _COMMON, map_location="cpu", weights_only=False)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - unreadable: the caller falls back on the run's record
        return None
    config = common.get("config") if isinstance(common, dict) else None
    return config if isinstance(config, dict) else None


def load_weights(source: Path, model: Any, skipped: list[str] | None = None) -> Checkpoint:
    """Load only the model weights of a checkpoint into ``model`` (a ``ZebraModel``, or anything
    with megatron's ``sharded_state_dict``); no optimizer state is read. ``source`` is a
    checkpoint folder, a checkpoints folder or a run directory (newest intact checkpoint). Works
    in any process: megatron's process group and parallel state are made for the load when there
    are none (and torn down after)."""
    from zebractl.runtime import dist

    ckpt = find(Path(source), skipped)  # damaged ones passed over: appended to ``skipped``
    with dist.scoped():
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

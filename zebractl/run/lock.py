"""One writer per directory: an exclusive OS lock held for the life of the writing process.

``RUN/zebractl.lock`` (and ``OUT/zebractl.lock`` of a prepared dataset) is locked with
``fcntl.flock``: the kernel releases the lock when the process ends however it ends (a crash,
SIGKILL, an out-of-memory kill), so a lock is never left held by a dead process. The file names its
holder (:class:`LockHolder`: command, PID, host, start time) for the message of a second writer, which
fails at once (:class:`~zebractl.errors.ConfigError`, exit 2) instead of waiting. A clean
release empties the file; a file that still names a holder when its lock is free was left by a
process that died holding it: the next writer takes it over with a note naming the old PID.

The lock is re-entrant within a process (``zebractl train`` takes it before it imports the trainer,
so a second train fails within a second, and the trainer takes it again for callers that use it
directly). Under torchrun only rank 0 takes it; the launcher process does not (its rank 0 worker
would find it held).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from zebractl.errors import DISK_ERRNOS, ConfigError
from zebractl.run.disk import DiskError
from zebractl.run.rundir import utc_now

LOCK = "zebractl.lock"


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or last held) a directory's lock: what its file records."""

    command: str
    pid: int
    host: str
    started: str

    @classmethod
    def me(cls, command: str) -> LockHolder:
        """This process as the holder."""
        return cls(command, os.getpid(), socket.gethostname(), utc_now())

    @classmethod
    def parse(cls, text: str) -> LockHolder | None:
        """The holder a lock file names; None for an empty (released) or unreadable file."""
        try:
            doc = json.loads(text)
            return cls(str(doc["command"]), int(doc["pid"]), str(doc["host"]), str(doc["started"]))
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        """'zebractl train (PID 123 on host, since 2026-...)'."""
        return f"zebractl {self.command} (PID {self.pid} on {self.host}, since {self.started})"


@dataclass
class _Held:
    fd: int
    pid: int  # the process that took it (a forked child does not hold it for itself)
    count: int


_HELD: dict[Path, _Held] = {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _acquire(
    folder: Path, command: str, note: Callable[[str], None], checkpoints: Path | None
) -> int:
    path = folder / LOCK
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"{folder}: exists and is not a directory") from None
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:  # read-only, full: nothing of the directory was changed
            raise DiskError(exc, f"the lock file of {command}", path, checkpoints) from None
        raise ConfigError(f"{path}: cannot create the lock file: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = LockHolder.parse(_read(fd))
        os.close(fd)
        who = holder.describe() if holder else "another process (it has not named itself yet)"
        raise ConfigError(
            f"{folder} is in use by {who}; one command writes a directory at a time: wait for it "
            f"to end, stop it, or choose another directory (lock file {path})"
        ) from None
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"{path}: cannot lock it: {exc.strerror or exc}") from None
    old = LockHolder.parse(_read(fd))
    if old is not None:  # its process ended without releasing the lock: a crash or a kill
        here = old.host == socket.gethostname()
        state = (
            "no longer running"
            if here and not _alive(old.pid)
            else "no longer holding it"
            if here
            else f"on {old.host}, no longer holding it"
        )
        note(
            f"note: taking over the lock of {folder} left by {old.describe()}, {state} "
            "(it ended without releasing it)"
        )
    me = LockHolder.me(command)
    text = json.dumps(
        {"command": me.command, "pid": me.pid, "host": me.host, "started": me.started}
    )
    os.ftruncate(fd, 0)
    os.pwrite(fd, (text + "\n").encode(), 0)
    os.fsync(fd)
    return fd


def _release(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)  # released cleanly: the next writer has nothing to take over
    except OSError:
        pass
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def hold(
    folder: Path,
    command: str,
    note: Callable[[str], None] = print,
    checkpoints: Path | None = None,
) -> Iterator[None]:
    """Hold the exclusive lock of ``folder`` (created if missing) for the ``with`` block.

    Raises :class:`ConfigError` naming the holder when another process holds it, and a
    :class:`~zebractl.run.disk.DiskError` when the file system cannot take the lock file (its
    message names the newest intact checkpoint under ``checkpoints``, if given). ``note`` is told
    when a lock left by a process that died is taken over. Re-entrant in one process.
    """
    key = Path(os.path.abspath(folder))
    held = _HELD.get(key)
    if held is not None and held.pid == os.getpid():
        held.count += 1
        try:
            yield
        finally:
            held.count -= 1
        return
    fd = _acquire(key, command, note, checkpoints)
    _HELD[key] = _Held(fd, os.getpid(), 1)
    try:
        yield
    finally:
        del _HELD[key]
        _release(fd)


def writer_root(folder: Path) -> Path:
    """The directory whose lock a command writing into ``folder`` takes: the nearest run directory
    at or above it (one holding ``config.resolved.json``), else ``folder`` itself. Writing
    ``RUN/eval/`` or ``RUN/reports/...`` locks ``RUN``, the directory its train locks."""
    from zebractl.run.rundir import RunDir

    here = Path(os.path.abspath(folder))
    return next((p for p in (here, *here.parents) if (p / RunDir.CONFIG).is_file()), here)


def holder(folder: Path) -> LockHolder | None:
    """Who the lock file of ``folder`` names (None when there is none or it was released)."""
    try:
        return LockHolder.parse((Path(folder) / LOCK).read_text(encoding="utf-8"))
    except OSError:
        return None

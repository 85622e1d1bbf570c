"""A disk that cannot take a run's writes, in plain words: full, over quota, read-only.

A full disk during a save surfaces as torch's ``CheckpointException ranks:dict_keys([0])``, a full
data-cache directory as megatron's advice to set an attribute of its dataset config, a read-only
run directory as an ``OSError`` on a temporary file's name. :func:`writing` wraps each write of a
run and turns any failure whose cause (anywhere in its chain, in any rank's failure of a
checkpoint exception) is such an ``OSError`` into one :class:`DiskError`: what was being written,
the path, the reason, the free space there, the newest intact checkpoint and that rerunning the same
command resumes from it. The CLI prints it as one line and exits 1.

:func:`space_warning` compares the free space with what the next checkpoint needs, before each
save and in ``train --check``.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zebractl.errors import DISK_ERRNOS, PlainError, first_line
from zebractl.run import checkpoint as ckpt

_REMEDY = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some of your quota",
    errno.EFBIG: "move the run to a file system that takes larger files",
    errno.EROFS: "make it writable (or choose another --output)",
    errno.EACCES: "make it writable for this user (or choose another --output)",
}
_ROOM = " (or lower checkpoint.keep_last, or move the checkpoints with checkpoint.dir)"
"""Added to the remedy of a full disk or quota when a checkpoint did not fit."""


def disk_cause(exc: BaseException) -> OSError | None:
    """The ``OSError`` of a file system that cannot take a write behind ``exc``, if any: ``exc``
    itself, its ``__cause__`` / ``__context__`` chain, or a rank's failure inside torch's
    ``CheckpointException`` (its ``failures``: rank -> (exception, traceback))."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            for pair in failures.values():
                first = pair[0] if isinstance(pair, tuple) and pair else pair
                if isinstance(first, BaseException):
                    todo.append(first)
        todo.extend(x for x in (e.__context__, e.__cause__) if x is not None)
    return None


def free_bytes(path: Path) -> int | None:
    """Free bytes (for this user) on the file system holding ``path`` or its nearest existing
    parent; None if that cannot be read."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def human(n: float) -> str:
    """Bytes for people: ``'512 B'``, ``'3.4 MiB'``, ``'1.25 GiB'``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit in ("TiB", "GiB") else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def resume_point(checkpoints: Path | None) -> str:
    """What a rerun resumes from: the newest checkpoint whose files are all there at the sizes
    its marker lists (checksums are for the resume itself: this runs while a disk is failing)."""
    if checkpoints is None:
        return "then rerun the same command"
    for it, folder in reversed(ckpt.candidates(checkpoints)):
        try:
            ckpt.check_intact(folder, checksums=False)
        except ckpt.DamagedCheckpoint:
            continue
        return (
            "then rerun the same command: it resumes from the newest intact checkpoint, "
            f"{folder} (iteration {it})"
        )
    return "then rerun the same command: no checkpoint was saved yet, so it starts from iteration 0"


class DiskError(PlainError):
    """A write the file system refused (see the module docstring); exit 1."""

    def __init__(
        self,
        cause: OSError,
        what: str,
        path: Path,
        checkpoints: Path | None = None,
        reported: str | None = None,
    ) -> None:
        """``reported``: what the writer said, when its error was not an ``OSError`` (torch's
        zip writer reports a full disk as ``unexpected pos 704 vs 598``)."""
        super().__init__(what)
        self.cause, self.what, self.path, self.checkpoints = cause, what, Path(path), checkpoints
        self.reported = reported

    def __str__(self) -> str:
        c = self.cause
        where = Path(c.filename) if isinstance(c.filename, (str, os.PathLike)) else self.path
        reason = c.strerror or os.strerror(c.errno or 0)
        free = free_bytes(where)
        said = f" (the writer reported: {self.reported})" if self.reported else ""
        parts = [
            f"cannot write {where} ({self.what}): {reason}{said}",
            f"{human(free)} free there" if free is not None else "free space unknown",
            f"{self._remedy(where)}, " + resume_point(self.checkpoints),
        ]
        return "; ".join(parts)

    def _remedy(self, where: Path) -> str:
        code = self.cause.errno or 0
        text = _REMEDY.get(code, "fix the file system")
        ckpts = self.checkpoints
        if (
            code in (errno.ENOSPC, errno.EDQUOT)
            and ckpts is not None
            and where.is_relative_to(ckpts)
        ):
            text += _ROOM
        return text


FULL = 2**20
"""Under this many bytes free, a failed write is the disk's even when the writer's error does not
say so."""


@contextmanager
def writing(
    what: str, path: Path, checkpoints: Path | None = None, need: float = 0.0
) -> Iterator[None]:
    """Turn a failure of the ``with`` block caused by a file system that cannot take a write into
    a :class:`DiskError` naming ``what`` (``path`` where the error names no file); a
    :class:`DiskError` from an inner block keeps its own ``what`` and learns ``checkpoints``.

    A failure whose chain holds no such ``OSError`` is still the disk's when, afterwards, the file
    system of ``path`` has less free space than ``need`` bytes (what the block was to write) or
    :data:`FULL`: torch's checkpoint writer reports a full disk as a ``RuntimeError`` of its zip
    container."""
    try:
        yield
    except DiskError as exc:
        if exc.checkpoints is None:
            exc.checkpoints = checkpoints
        raise
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - torch's CheckpointException is a BaseException
        cause = disk_cause(exc)
        if cause is not None:
            raise DiskError(cause, what, path, checkpoints) from exc
        free = free_bytes(path)
        if free is None or free >= max(need, FULL):
            raise
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        root = exc
        while root.__cause__ is not None:  # the writer's own error, not our wrapper's
            root = root.__cause__
        said = f"{type(root).__name__}: {first_line(root)}"
        raise DiskError(full, what, path, checkpoints, reported=said) from exc


def space_warning(where: Path, need: float, what: str) -> str | None:
    """A warning when the file system of ``where`` has less free space than ``need`` bytes for
    ``what``; None when it has enough (or its free space cannot be read)."""
    free = free_bytes(where)
    if free is None or free >= need:
        return None
    return (
        f"warning: {what} needs about {human(need)}, but {human(free)} is free on the file system "
        f"of {where} (short by {human(need - free)}): the save will likely fail; free some "
        "space, lower checkpoint.keep_last or move the checkpoints with checkpoint.dir"
    )

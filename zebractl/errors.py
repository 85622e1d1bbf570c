"""zebractl's error types and how a one-line error shows an exception (bottom layer: imports
nothing from zebractl).

The CLI (``zebractl.cli._common.guarded``) maps them to exit codes: ``ConfigError`` 2,
``PlainError`` and ``TrainingError`` 1, ``CheckFailed`` 3.
"""

from __future__ import annotations

import errno


class ConfigError(Exception):
    """A problem with a preset, recipe or ``--set`` value. ``str()`` is the message shown to users.

    ``problems`` holds one line per problem when several were found at once.
    """

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


class PlainError(Exception):
    """A runtime failure already explained in plain words (exit code 1, no type name, never a
    traceback without ``-v``): ``str()`` is the whole message."""


class CheckFailed(Exception):
    """A check ran and failed (exit code 3). The message has been printed already or is printed."""


class TrainingError(RuntimeError):
    """A run stopped for a reason the user must see (NaN loss, data exhausted, ...): exit 1."""


def first_line(exc: BaseException, default: str = "") -> str:
    """The first line of an exception's message, stripped (what a one-line error shows of it);
    ``default`` when the message is empty or blank (e.g. ``type(exc).__name__``)."""
    return (str(exc).strip().splitlines() or [default])[0]


DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG})
"""The errors of a file system that cannot take a write: full, over quota, read-only, not
writable by this user, or a file over its size limit."""

"""User-facing configuration errors (exit code 2, never a traceback)."""

from __future__ import annotations

import errno


class ConfigError(Exception):
    """A problem with a preset, recipe or ``--set`` value. ``str()`` is the message shown to users.

    ``problems`` holds one line per problem when several were found at once; ``key`` names the
    dotted key of a single problem when known.
    """

    def __init__(
        self, message: str, *, key: str | None = None, problems: list[str] | None = None
    ) -> None:
        super().__init__(message)
        self.key = key
        self.problems = problems or [message]


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (what a one-line error shows of it)."""
    return (str(exc).strip().splitlines() or [""])[0]


class PlainError(Exception):
    """A runtime failure already explained in plain words (exit code 1, no type name, never a
    traceback without ``-v``): ``str()`` is the whole message."""


DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG})
"""The errors of a file system that cannot take a write: full, over quota, read-only, not
writable by this user, or a file over its size limit."""

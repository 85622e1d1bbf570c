"""Re-exports of ``zebractl.errors`` (kept so that older imports keep working)."""

from __future__ import annotations

from zebractl.errors import DISK_ERRNOS, ConfigError, PlainError, first_line

__all__ = ["DISK_ERRNOS", "ConfigError", "PlainError", "first_line"]

"""The base of every ``--json`` report (see :mod:`zebractl.schemas.reports`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from zebractl.schemas.base import StrictModel

Split = Literal["train", "valid"]


class Report(StrictModel):
    """Base of every top-level ``--json`` document."""

    command: ClassVar[str] = ""
    """The command line that prints this report (names its schema file)."""

    schema_version: Literal[1] = 1
    """Layout version of this document; changes only with a breaking change (see CHANGELOG)."""

    @classmethod
    def schema_file(cls) -> str:
        """File name of the exported JSON Schema in ``schemas/reports/``, e.g. ``config-show.schema.json``."""
        slug = cls.command.replace(" --", "-").replace(" ", "-")
        return f"{slug}.schema.json"

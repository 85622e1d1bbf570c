"""The one base class every zebractl schema inherits.

Strict on purpose: an unknown key is an error (``extra="forbid"``), a string is never coerced into a
number (``strict=True``), a float must be finite (``allow_inf_nan=False``; JSON has no Infinity either),
and defaults are validated like user input. Numeric bounds live in :mod:`zebractl.schemas.bounds`. Field docstrings are the single
source of documentation: they end up in ``--help``-style listings and in the generated JSON Schema.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Base for presets, recipes and reports: frozen, strict, no unknown keys."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        strict=True,
        validate_default=True,
        use_attribute_docstrings=True,
    )

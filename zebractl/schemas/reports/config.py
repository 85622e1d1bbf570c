"""``zebractl config show | validate | diff --json`` and ``zebractl presets | recipes --json``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import JsonValue

from zebractl.schemas.base import StrictModel
from zebractl.schemas.preset import Mixer, ModelConfig
from zebractl.schemas.recipe import Derived, RunConfig
from zebractl.schemas.reports.base import Report

# ---- zebractl config show | validate | diff --------------------------------------------------------


class ConfigShowReport(Report):
    """``zebractl config show CONFIG --json``: every resolved value and where it came from."""

    command: ClassVar[str] = "config show"

    kind: Literal["preset", "recipe"]
    """Whether CONFIG resolved as a preset (an architecture) or a recipe (a run)."""
    name: str
    """Name of the config (file stem)."""
    source: str
    """The file it was read from, as displayed in messages."""
    config: RunConfig | ModelConfig
    """The resolved values, keys as written in YAML: a recipe (kind recipe) or a preset (kind
    preset)."""
    provenance: dict[str, str]
    """Source of every leaf value by dotted key: 'default', 'FILE:LINE' or '--set'."""
    derived: Derived | None = None
    """Values computed from a recipe; null for a preset."""


class ConfigValidateResult(StrictModel):
    """The verdict on one file or name."""

    path: str
    """The file or name as given."""
    ok: bool
    """Whether it resolved without problems."""
    kind: Literal["preset", "recipe"] | None = None
    """What it resolved as; null when invalid."""
    name: str | None = None
    """Its name (file stem); null when invalid."""
    errors: list[str]
    """One line per problem (FILE:LINE: key: message); empty when ok."""


class ConfigValidateReport(Report):
    """``zebractl config validate PATH... --json``: one verdict per file."""

    command: ClassVar[str] = "config validate"

    results: list[ConfigValidateResult]
    """Verdicts in the order given."""
    ok: bool
    """Whether every file is valid (exit 0); otherwise the exit code is 2."""


class ConfigDifference(StrictModel):
    """One resolved value that differs between the two configs."""

    key: str
    """Dotted key."""
    a: JsonValue
    """Value in the first config; null where absent."""
    b: JsonValue
    """Value in the second config; null where absent."""
    a_source: str | None
    """Where the first config's value came from; null where absent."""
    b_source: str | None
    """Where the second config's value came from; null where absent."""


class ConfigDiffReport(Report):
    """``zebractl config diff A B --json``: the resolved values that differ."""

    command: ClassVar[str] = "config diff"

    a: str
    """The first config's file."""
    b: str
    """The second config's file."""
    differences: list[ConfigDifference]
    """Differing values, sorted by key; empty when the configs resolve alike."""


# ---- zebractl presets | recipes --------------------------------------------------------------------


class PresetEntry(StrictModel):
    """One shipped preset."""

    name: str
    """Shipped name (file stem)."""
    description: str
    """One-line description from the file."""
    parameters: int
    """Exact parameter count."""
    num_blocks: int
    """Number of blocks (mixer + mlp)."""
    hidden_size: int
    """Model width."""
    mixers: list[Mixer]
    """Mixer types used, sorted."""
    path: str
    """The file, as displayed in messages."""


class PresetsReport(Report):
    """``zebractl presets --json``: the shipped architecture presets."""

    command: ClassVar[str] = "presets"

    presets: list[PresetEntry]
    """Every shipped preset, sorted by name."""


class RecipeEntry(StrictModel):
    """One shipped recipe."""

    name: str
    """Shipped name (file stem)."""
    description: str
    """One-line description from the file."""
    preset: str
    """The preset it trains."""
    num_gpus: int
    """GPUs it is planned for."""
    micro_batch: int
    """Sequences per GPU per forward/backward."""
    global_batch: int
    """Sequences per optimizer step."""
    seq_length: int
    """Tokens per sequence."""
    iterations: int
    """Optimizer steps."""
    total_tokens: int
    """Tokens of the whole run."""
    path: str
    """The file, as displayed in messages."""


class RecipesReport(Report):
    """``zebractl recipes --json``: the shipped recipes."""

    command: ClassVar[str] = "recipes"

    recipes: list[RecipeEntry]
    """Every shipped recipe, sorted by name."""

"""``zebractl convert --json`` and ``zebractl verify --json``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, FiniteFloat, JsonValue

from zebractl.schemas.base import StrictModel
from zebractl.schemas.reports.base import Report


class ConvertReport(Report):
    """``zebractl convert SOURCE OUTPUT --json``: the Hugging Face folder written."""

    command: ClassVar[str] = "convert"

    output: str
    """The folder written."""
    format: Literal["fla", "zebra", "megatron"]
    """fla: FLA's model classes (pure KDA / GDN); megatron: an imported zebractl checkpoint."""
    architecture: str
    """The mixer family (kda, gdn)."""
    iteration: int
    """The checkpoint's iteration."""
    dtype: Literal["bf16", "fp32"]
    """dtype of the exported tensors."""
    tensors: int
    """Tensors written."""
    parameters: int
    """Their elements (the tied LM head counted once)."""
    bytes: int
    """Their bytes."""
    shards: list[str]
    """The safetensors files (one, or shards listed by model.safetensors.index.json)."""
    tokenizer: str | None
    """Where the tokenizer files came from (the dataset's tokenizer/), if the data had one."""
    files: list[str]
    """Every file of the folder."""
    seconds: FiniteFloat
    """Wall time of the conversion."""
    peak_rss_gib: FiniteFloat | None
    """Peak resident memory of the process (host)."""


class VerifyTier(StrictModel):
    """One tier of ``zebractl verify``."""

    name: Literal["structure", "weights", "logits", "generation"]
    """The tier."""
    status: Literal["pass", "fail", "not run"]
    """Its result (not run: an earlier tier failed)."""
    detail: str
    """What was found."""
    metrics: dict[str, JsonValue] = Field(default_factory=dict)
    """Its numbers (e.g. max_rel_err and tolerance for logits)."""


class ModelVerifyReport(Report):
    """``zebractl verify SOURCE CONVERTED --json``: the conversion checked tier by tier."""

    command: ClassVar[str] = "verify"

    source: str
    """The checkpoint folder checked against."""
    converted: str
    """The converted folder."""
    ok: bool
    """Every tier passed."""
    first_failure: str | None
    """The first tier that failed (exit 3), if any."""
    tiers: list[VerifyTier]
    """structure, weights, logits, generation, in order."""

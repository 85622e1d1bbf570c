"""Typed records of a run directory: the resolved config, the checkpoint marker, metrics rows.

Everything ``zebractl train`` writes for others to read (convert, verify, eval, compare, a resumed run)
is one of these models, written and read only through :mod:`zebractl.run`. Their ``format_version`` /
``schema_version`` changes whenever a field changes meaning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from zebractl.schemas.base import StrictModel

if TYPE_CHECKING:
    from zebractl.config.resolve import Resolved

MARKER_FORMAT = 2
"""Checkpoint marker format. 1 (zebractl 0.1.0, no file list) is still read; 2 adds ``files``."""


class ResolvedConfigRecord(StrictModel):
    """``RUN/config.resolved.json``: the resolved recipe of the run, with provenance."""

    schema_version: Literal[1] = 1
    """Version of this document's layout."""
    name: str
    """Recipe name (file stem)."""
    recipe: str
    """The recipe file or shipped name the run was started from."""
    config: dict[str, Any]
    """Every resolved value, nested as in a recipe file (``model`` holds the merged preset)."""
    provenance: dict[str, str]
    """Where each dotted leaf came from: ``default``, ``FILE:LINE`` or ``--set``."""
    zebractl_version: str
    """zebractl version that wrote this file."""
    created: str
    """UTC time this file was written (ISO 8601)."""
    reference: str | None = None
    """Set for a reference run (e.g. ``fla``): which stack trained it."""

    @classmethod
    def of(cls, resolved: Resolved) -> ResolvedConfigRecord:
        """The record of a resolved recipe, stamped now."""
        import time

        from zebractl import __version__

        return cls(
            name=resolved.name,
            recipe=resolved.source,
            config=resolved.values(),
            provenance=resolved.provenance,
            zebractl_version=__version__,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )


class InitRecord(StrictModel):
    """``RUN/init.json``: what the run's weights were initialised from (``init_from`` or
    ``train --init-from``), written once, when they were loaded; a resumed run keeps it."""

    schema_version: Literal[1] = 1
    """Version of this document's layout."""
    init_from: str
    """The path as given (relative to the working directory the run was started in)."""
    given_by: str
    """Where it came from: ``--init-from``, or the recipe's ``FILE:LINE`` / ``--set``."""
    path: str
    """The same path, absolute."""
    kind: Literal["checkpoint", "hf"]
    """A zebractl checkpoint (of a run directory, or a checkpoint folder) or a Hugging Face folder."""
    checkpoint: str | None
    """The checkpoint folder whose weights were loaded, absolute (null for a Hugging Face folder)."""
    iteration: int | None = Field(ge=0)
    """Its iteration (null for a Hugging Face folder)."""
    run: str | None
    """The run directory holding that checkpoint, absolute (null when it is in none)."""
    run_id: str
    """The training session that loaded the weights."""
    created: str
    """UTC time the weights were loaded (ISO 8601)."""


class TrackerRecord(StrictModel):
    """``RUN/wandb.json``: the Weights & Biases run this run directory logs to (``logging.wandb``),
    written at the first tracked start; a resume, ``eval`` and ``compare`` of the run continue the
    same W&B run through it."""

    schema_version: Literal[1] = 1
    """Version of this document's layout."""
    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    """The W&B run id (unique within its project)."""
    project: str
    """The W&B project."""
    entity: str | None
    """The W&B entity (null: the user's default)."""
    mode: Literal["online", "offline"]
    """How the newest training session logged (offline: ``wandb sync RUN/wandb/offline-run-*``)."""
    url: str | None
    """The run's page (null offline)."""
    created: str
    """UTC time the W&B run was first started from this directory (ISO 8601)."""


class ConfigHistoryEntry(StrictModel):
    """One line of ``RUN/config.history.jsonl``: the resolved config one training session started
    (or resumed) with. Appended at every start, never rewritten: ``config.resolved.json`` holds the
    newest config only, so a resume with changed settings (more iterations: another learning-rate
    schedule) is known from here."""

    schema_version: Literal[1] = 1
    """Version of this line's layout."""
    event: Literal["start", "resume", "found"]
    """start: from iteration 0 (fresh or ``init_from`` weights); resume: from a checkpoint; found:
    the config of a run directory written before zebractl kept this history (recorded at its first
    later start; the iteration it started from is unknown)."""
    iteration: int | None = Field(ge=0)
    """The iteration the session started from (null for ``found``)."""
    run_id: str | None
    """The training session (null for ``found``)."""
    device: str | None
    """What it trained on: ``cpu`` or ``cuda (GPU NAME)`` (null for ``found``)."""
    world_size: int | None = Field(gt=0)
    """Processes (null for ``found``)."""
    changed: list[str]
    """Dotted keys whose value differs from the previous line's config (empty for the first)."""
    created: str
    """UTC time the line was written (ISO 8601)."""
    record: ResolvedConfigRecord
    """The resolved config, with provenance, as ``config.resolved.json`` held it."""


class FileRecord(StrictModel):
    """One file of a checkpoint folder, as it was when the checkpoint completed."""

    path: str
    """Path relative to the checkpoint folder."""
    size: int = Field(ge=0)
    """Size in bytes."""
    sha256: str
    """Hex SHA-256 of the content."""


class CheckpointMarker(StrictModel):
    """``iter_N/zebractl.json``, written last: the checkpoint is complete and these are its files."""

    format_version: int = MARKER_FORMAT
    """Marker format (see :data:`MARKER_FORMAT`)."""
    iteration: int = Field(ge=0)
    """Optimizer steps completed; the weights are those after this step."""
    consumed_samples: int = Field(ge=0)
    """Training samples consumed (the data position to resume from)."""
    skipped_iterations: int = Field(0, ge=0)
    """Updates skipped for non-finite values so far."""
    optimizer_impl: str = "torch_fused"
    """optimizer.impl that wrote the optimizer state."""
    distributed_optimizer: bool = False
    """Whether the optimizer state was sharded over data-parallel ranks."""
    world_size: int | None = Field(None, gt=0)
    """Processes that wrote the checkpoint (it loads on any data-parallel size)."""
    run_id: str | None = None
    """The training session that wrote it."""
    zebractl_version: str
    """zebractl version that wrote it."""
    created: str | None = None
    """UTC completion time (ISO 8601)."""
    files: list[FileRecord] = Field(default_factory=list)
    """Every file of the folder except this marker (empty in format 1)."""


class TrainRow(StrictModel):
    """A ``metrics.jsonl`` row for a logging interval of training."""

    kind: Literal["train"] = "train"
    """Row type."""
    iteration: int = Field(ge=1)
    """Last iteration of the interval."""
    loss: float
    """Mean training loss over the interval's updates (nats per token)."""
    lr: float
    """Learning rate of the last update."""
    grad_norm: float
    """Gradient norm (before clipping) of the last update."""
    tokens_per_s: float
    """Training tokens per second per process over the interval."""
    tflops_per_gpu: float | None = None
    """Model TFLOP/s per GPU (CUDA only)."""
    mfu: float | None = None
    """Model FLOPs utilisation against the GPU's bf16 peak (known GPUs only)."""
    memory_gib: float | None = None
    """Peak CUDA memory allocated so far, GiB (CUDA only)."""
    consumed_samples: int = Field(ge=0)
    """Training samples consumed after this iteration."""
    skipped: int = Field(0, ge=0)
    """Updates skipped in this interval (nonfinite.action skip)."""
    wall_time: float
    """Unix time the row was written."""
    run_id: str
    """The training session (one process launch) that wrote the row."""


class ValRow(StrictModel):
    """A ``metrics.jsonl`` row for one evaluation of the held-out data."""

    kind: Literal["val"] = "val"
    """Row type."""
    iteration: int = Field(ge=0)
    """Iteration whose weights were evaluated."""
    val_loss: float | None
    """Mean held-out loss (nats per token); null if it was not finite."""
    val_ppl: float | None
    """exp(val_loss); null if it overflows."""
    tokens: int = Field(ge=0)
    """Held-out tokens evaluated."""
    wall_time: float
    """Unix time the row was written."""
    run_id: str
    """The training session that wrote the row."""


MetricsRow = Annotated[TrainRow | ValRow, Field(discriminator="kind")]
"""One line of ``metrics.jsonl``."""

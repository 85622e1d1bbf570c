"""What a run did: :class:`RunResult`, returned by ``Trainer.fit`` and reported by ``zebractl train``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunResult:
    """What a run did."""

    iterations: int
    resumed_from: int | None
    final_loss: float | None
    checkpoint: Path | None
    stopped: str  # "done" | "signal" | "limit"
    skipped: int = 0  # updates skipped for a non-finite loss or gradient (nonfinite.action skip)
    signal: int | None = None  # the signal that stopped the run
    val_loss: float | None = None  # the last validation loss
    total: int = 0  # the run's resolved iterations (schedule.iterations or train_tokens)
    tokens: int = 0  # tokens consumed by the run so far (samples x seq_length, resumed ones too)
    wall_s: float = 0.0  # seconds from the start of the run in this process to its end (setup too)
    tokens_per_s: float | None = None  # mean training tokens/s per process over this process's
    # steps (validation and saves excluded, the compile step included); None if it ran none

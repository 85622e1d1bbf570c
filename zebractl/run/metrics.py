"""``RUN/metrics.jsonl``, TensorBoard and W&B: the writer a run appends to, the reader others use."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import TypeAdapter, ValidationError

from zebractl.errors import ConfigError
from zebractl.run.records import MetricsRow, TrainRow, ValRow
from zebractl.run.rundir import RunDir, write_text_atomic

if TYPE_CHECKING:
    from zebractl.run.tracking import Tracker

_ROW: TypeAdapter[TrainRow | ValRow] = TypeAdapter(MetricsRow)


def scalars(row: TrainRow | ValRow) -> dict[str, float]:
    """The finite numbers of a row by TensorBoard's (and W&B's) name: ``train/loss``,
    ``val/loss`` (``val_`` dropped), ...; the iteration is the step, not a scalar."""
    out: dict[str, float] = {}
    for key, value in row.model_dump(exclude={"kind", "iteration", "run_id"}).items():
        if isinstance(value, int | float) and math.isfinite(value):
            out[f"{row.kind}/{key.removeprefix('val_')}"] = value
    return out


class MetricsWriter:
    """Appends rows to ``metrics.jsonl``, TensorBoard (``train/*``, ``val/*``) and the W&B run of
    ``tracker`` (:mod:`zebractl.run.tracking`), if any.

    Opening it for a run resumed at iteration N drops rows after N (written by the attempt that
    was interrupted after the checkpoint), in the file and, through ``purge_step``, in TensorBoard.
    """

    def __init__(
        self,
        run: RunDir,
        *,
        resumed_at: int,
        jsonl: bool,
        tensorboard: bool,
        note: Callable[[str], None],
        tracker: Tracker | None = None,
    ) -> None:
        self.tracker = tracker
        self.path = run.metrics_path if jsonl else None
        if self.path is not None and self.path.exists():
            keep = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and _iteration(line) <= resumed_at
            ]
            write_text_atomic(self.path, "".join(k + "\n" for k in keep))
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                note(
                    "note: TensorBoard is not installed; logging to metrics.jsonl only "
                    "(pip install tensorboard)"
                )
            else:
                self.tb = SummaryWriter(str(run.tensorboard_dir), purge_step=resumed_at + 1)

    def write(self, row: TrainRow | ValRow) -> None:
        """Append one row (and its scalars to TensorBoard)."""
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(row.model_dump_json() + "\n")
        if self.tb is not None:
            for key, value in scalars(row).items():
                self.tb.add_scalar(key, value, row.iteration)
            self.tb.flush()
        if self.tracker is not None:
            self.tracker.log(row)

    def close(self, *, failed: bool = False) -> None:
        """Close TensorBoard's writer and finish the W&B run (``failed``: the run ended on an
        error)."""
        if self.tb is not None:
            self.tb.close()
        if self.tracker is not None:
            self.tracker.finish(exit_code=1 if failed else 0)
            self.tracker = None


def _iteration(line: str) -> float:
    """The iteration of a row; a line torn by a crash mid-write counts as infinitely late (dropped)."""
    try:
        return int(json.loads(line)["iteration"])
    except (ValueError, TypeError, KeyError):
        return math.inf


class MetricsReader:
    """Typed rows of a run's ``metrics.jsonl``; a malformed line is an error naming file:line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, run: RunDir) -> MetricsReader:
        """The reader of a run directory's metrics."""
        return cls(run.metrics_path)

    def rows(self) -> Iterator[TrainRow | ValRow]:
        """Every row, in file order."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise ConfigError(f"{self.path}: no metrics (the run has not logged yet)") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield _ROW.validate_json(line)
            except ValidationError as exc:
                first = str(exc).splitlines()
                raise ConfigError(
                    f"{self.path}:{n}: not a metrics row ({' '.join(first[:3])})"
                ) from None

    def train(self) -> list[TrainRow]:
        """Training rows."""
        return [r for r in self.rows() if isinstance(r, TrainRow)]

    def validation(self) -> list[ValRow]:
        """Validation rows."""
        return [r for r in self.rows() if isinstance(r, ValRow)]

    def losses(self) -> dict[int, float]:
        """Training loss by iteration."""
        return {r.iteration: r.loss for r in self.train()}

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

    The file is append-only history: opening it keeps every row of earlier lineages (a deliberate
    fresh start in a used directory adds its rows after them, under its own run id). Only a resume
    at iteration N drops rows of its own lineage (``lineage``: their run ids, see
    :meth:`RunDir.lineage`; None: every row) after N, written by the attempt that was interrupted
    after the checkpoint and replayed bit for bit now; in TensorBoard through ``purge_step``.
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
        lineage: set[str] | None = None,
    ) -> None:
        self.tracker = tracker
        self.path = run.metrics_path if jsonl else None
        if self.path is not None and self.path.exists():
            lines = self.path.read_text(encoding="utf-8").splitlines()
            keep = [
                line for line in lines if line.strip() and not _replayed(line, resumed_at, lineage)
            ]
            if len(keep) != len([line for line in lines if line.strip()]):
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


def recorded_progress(run: RunDir) -> tuple[int, list[str]]:
    """How far the run's records say its current lineage trained: the newest iteration of its
    training rows in ``metrics.jsonl`` and of the resumes in ``config.history.jsonl`` (0: none),
    and the files that say so. Unreadable lines are passed over (this only asks whether the run
    had progressed)."""
    try:
        lineage = run.lineage()
    except ConfigError:
        lineage = None
    found: dict[str, int] = {}
    try:
        lines = run.metrics_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            row = json.loads(line)
            if row.get("kind") == "train" and (lineage is None or row.get("run_id") in lineage):
                found["metrics.jsonl"] = max(found.get("metrics.jsonl", 0), int(row["iteration"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
    try:
        history = run.read_config_history()
    except ConfigError:
        history = []
    resumed = [h.iteration for h in history if h.event == "resume" and h.iteration]
    if resumed:
        found["config.history.jsonl"] = max(resumed)
    return max(found.values(), default=0), sorted(found)


def _replayed(line: str, resumed_at: int, lineage: set[str] | None) -> bool:
    """Whether a row is dropped when a run resumes at ``resumed_at``: a row of ``lineage`` after
    that iteration, or a line torn by a crash mid-write (not JSON: the attempt's last line)."""
    try:
        row = json.loads(line)
        iteration = int(row["iteration"])
    except (ValueError, TypeError, KeyError):
        return True
    mine = lineage is None or (isinstance(row, dict) and row.get("run_id") in lineage)
    return mine and iteration > resumed_at


class MetricsReader:
    """Typed rows of a run's ``metrics.jsonl``; a malformed line is an error naming file:line."""

    def __init__(self, path: Path, lineage: set[str] | None = None) -> None:
        self.path = Path(path)
        self.lineage = lineage

    @classmethod
    def of(cls, run: RunDir) -> MetricsReader:
        """The reader of a run directory's metrics: the rows of its current lineage (the newest
        fresh start and its resumes, :meth:`RunDir.lineage`); older rows stay in the file."""
        return cls(run.metrics_path, run.lineage())

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
                row = _ROW.validate_json(line)
            except ValidationError as exc:
                first = str(exc).splitlines()
                raise ConfigError(
                    f"{self.path}:{n}: not a metrics row ({' '.join(first[:3])})"
                ) from None
            if self.lineage is None or row.run_id in self.lineage:
                yield row

    def train(self) -> list[TrainRow]:
        """Training rows."""
        return [r for r in self.rows() if isinstance(r, TrainRow)]

    def validation(self) -> list[ValRow]:
        """Validation rows."""
        return [r for r in self.rows() if isinstance(r, ValRow)]

    def losses(self) -> dict[int, float]:
        """Training loss by iteration."""
        return {r.iteration: r.loss for r in self.train()}

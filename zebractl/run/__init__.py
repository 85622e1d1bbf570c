"""The run directory contract: paths, typed records, checkpoints, metrics (see :mod:`.rundir`)."""

from zebractl.run.checkpoint import Checkpoint, DamagedCheckpoint, load_weights
from zebractl.run.metrics import MetricsReader, MetricsWriter
from zebractl.run.records import (
    CheckpointMarker,
    ConfigHistoryEntry,
    InitRecord,
    ResolvedConfigRecord,
    TrackerRecord,
    TrainRow,
    ValRow,
)
from zebractl.run.rundir import RunDir

__all__ = [
    "Checkpoint",
    "CheckpointMarker",
    "ConfigHistoryEntry",
    "DamagedCheckpoint",
    "InitRecord",
    "MetricsReader",
    "MetricsWriter",
    "ResolvedConfigRecord",
    "RunDir",
    "TrackerRecord",
    "TrainRow",
    "ValRow",
    "load_weights",
]

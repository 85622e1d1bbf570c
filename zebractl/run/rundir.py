"""The run directory: where everything a training run writes lives, by name, in one place.

::

    RUN/config.resolved.json        ResolvedConfigRecord (values + provenance) of the newest start
    RUN/config.history.jsonl        ConfigHistoryEntry: every start and resume's config, appended
    RUN/metrics.jsonl               TrainRow / ValRow, one JSON object per line
    RUN/init.json                   InitRecord: the weights it started from (init_from), if any
    RUN/tensorboard/                TensorBoard event files (train/*, val/*)
    RUN/wandb.json                  TrackerRecord: the W&B run of logging.wandb, if tracked
    RUN/wandb/                      W&B's own files (offline-run-*/ to `wandb sync`)
    RUN/checkpoints/iter_0000020/   megatron torch_dist checkpoint + zebractl.json marker (written last)
    RUN/data_cache/                 megatron's GPTDataset index cache (safe to delete)
    RUN/reports/                    reports written by later commands (compare, ...)
    RUN/eval/                       evaluation results
    RUN/train.sbatch                the Slurm script of `zebractl train --slurm`
    RUN/zebractl.lock               the lock of the one process writing RUN (zebractl.run.lock)

``checkpoint.dir`` may move the checkpoints elsewhere; nothing else moves.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from zebractl.errors import DISK_ERRNOS, ConfigError
from zebractl.run.records import (
    ConfigHistoryEntry,
    InitRecord,
    ResolvedConfigRecord,
    TrackerRecord,
)

if TYPE_CHECKING:
    from zebractl.schemas.recipe import RunConfig


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class RunDir:
    """Paths and records of one run directory."""

    CONFIG = "config.resolved.json"
    METRICS = "metrics.jsonl"
    INIT = "init.json"
    HISTORY = "config.history.jsonl"
    TRACKER = "wandb.json"

    def __init__(self, root: Path, checkpoints: Path | None = None) -> None:
        self.root = Path(root)
        self.checkpoints = Path(checkpoints) if checkpoints else self.root / "checkpoints"

    @classmethod
    def for_recipe(cls, cfg: RunConfig, name: str, output: Path | None = None) -> RunDir:
        """The run directory of a recipe: ``output``, else ``output_dir``, else ``runs/NAME``."""
        root = output if output is not None else Path(cfg.output_dir or f"runs/{name}")
        ckpt = cfg.checkpoint.dir
        return cls(root, Path(ckpt) if ckpt else None)

    # ---- paths -------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        """The resolved config with provenance."""
        return self.root / self.CONFIG

    @property
    def history_path(self) -> Path:
        """Every start's resolved config, one JSON line each (never rewritten)."""
        return self.root / self.HISTORY

    @property
    def init_path(self) -> Path:
        """What the weights were initialised from (``init_from``)."""
        return self.root / self.INIT

    @property
    def metrics_path(self) -> Path:
        """Training and validation metrics, JSON lines."""
        return self.root / self.METRICS

    @property
    def tensorboard_dir(self) -> Path:
        """TensorBoard event files."""
        return self.root / "tensorboard"

    @property
    def tracker_path(self) -> Path:
        """The W&B run this directory logs to (``logging.wandb``)."""
        return self.root / self.TRACKER

    @property
    def wandb_dir(self) -> Path:
        """W&B's own files (the ``dir`` it is started with holds its ``wandb/`` folder)."""
        return self.root / "wandb"

    @property
    def data_cache(self) -> Path:
        """megatron's dataset index cache."""
        return self.root / "data_cache"

    @property
    def reports_dir(self) -> Path:
        """Reports of later commands."""
        return self.root / "reports"

    @property
    def eval_dir(self) -> Path:
        """Evaluation results."""
        return self.root / "eval"

    def reference_root(self, reference: str = "fla") -> Path:
        """``RUN-fla-reference``, beside the run: where ``train --reference fla`` (without
        ``--output``) and ``compare --fla`` train the run's reference."""
        return self.root.with_name(f"{self.root.name}-{reference}-reference")

    @property
    def sbatch_path(self) -> Path:
        """The Slurm batch script."""
        return self.root / "train.sbatch"

    @property
    def slurm_log_pattern(self) -> str:
        """Slurm's ``--output`` pattern (one log per job id)."""
        return f"{self.root}/slurm-%j.log"

    # ---- records -----------------------------------------------------------------------------
    def create(self) -> None:
        """Make the directory (and its checkpoint folder) if missing."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(f"{self.root}: exists and is not a directory") from None
        except OSError as exc:
            if exc.errno in DISK_ERRNOS:  # the caller says what was being written (run.disk)
                raise
            raise ConfigError(f"{self.root}: cannot create the run directory: {exc}") from None

    def write_config(self, record: ResolvedConfigRecord) -> None:
        """Write the resolved config (atomically). The config it replaces in a run directory
        without a history (written before zebractl kept one) is first kept in the history, as a
        ``found`` line: a resume never loses what the run was trained with."""
        if self.config_path.is_file() and not self.history_path.is_file():
            try:
                old = ResolvedConfigRecord.model_validate_json(self.config_path.read_bytes())
            except (OSError, ValidationError):
                old = None  # unreadable: nothing to keep (the trainer's note names it)
            if old is not None:
                self._append_history(
                    ConfigHistoryEntry(
                        event="found", iteration=None, run_id=None, device=None,
                        world_size=None, changed=[], created=utc_now(), record=old,
                    )
                )  # fmt: skip
        write_text_atomic(self.config_path, record.model_dump_json(indent=2) + "\n")

    def record_start(
        self,
        record: ResolvedConfigRecord,
        *,
        iteration: int,
        resumed: bool,
        run_id: str,
        device: str,
        world_size: int,
        if_changed: bool = False,
    ) -> ConfigHistoryEntry | None:
        """Append the config a training session starts (``resumed``: from a checkpoint of
        ``iteration``) with to ``config.history.jsonl``, with the keys changed since the previous
        line; returns the line. ``if_changed`` (a rerun of a finished run, which trains nothing):
        only when the config differs from the previous line's (None otherwise)."""
        history = self.read_config_history()
        changed = sorted(_diff(history[-1].record.config, record.config)) if history else []
        if if_changed and history and not changed:
            return None
        entry = ConfigHistoryEntry(
            event="resume" if resumed else "start",
            iteration=iteration,
            run_id=run_id,
            device=device,
            world_size=world_size,
            changed=changed,
            created=utc_now(),
            record=record,
        )
        self._append_history(entry)
        return entry

    def _append_history(self, entry: ConfigHistoryEntry) -> None:
        with self.history_path.open("a", encoding="utf-8") as f:
            f.write(entry.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read_config_history(self) -> list[ConfigHistoryEntry]:
        """Every line of ``config.history.jsonl``, oldest first (empty: no history, a run trained
        before zebractl kept one). A torn last line (a crash while appending) is skipped; any other
        damaged line is an error naming it."""
        path = self.history_path
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        out = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                out.append(ConfigHistoryEntry.model_validate_json(line))
            except ValidationError as exc:
                if n == len(lines):
                    break
                first = str(exc).splitlines()[0]
                raise ConfigError(f"{path}:{n}: not a config history line ({first})") from None
        return out

    def lineage(self) -> set[str] | None:
        """The training sessions (run ids) of the run's current lineage: the newest ``start`` of
        ``config.history.jsonl`` (iteration 0, fresh or from ``init_from``) and every session after
        it. A deliberate fresh start in a used directory keeps the older sessions' metrics rows;
        readers take this lineage's. None: no recorded start (a run from before zebractl kept the
        history): every row is the lineage's."""
        history = self.read_config_history()
        starts = [i for i, h in enumerate(history) if h.event == "start"]
        if not starts:
            return None
        return {h.run_id for h in history[starts[-1] :] if h.run_id is not None}

    def read_config(self) -> ResolvedConfigRecord:
        """The resolved config this run was started with."""
        path = self.config_path
        try:
            return ResolvedConfigRecord.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"{path}: not a zebractl run directory (no {self.CONFIG})") from None
        except ValidationError as exc:
            raise ConfigError(f"{path}: not a valid resolved config: {exc}") from None

    def write_init(self, record: InitRecord) -> None:
        """Write the init record (atomically)."""
        write_text_atomic(self.init_path, record.model_dump_json(indent=2) + "\n")

    def read_init(self) -> InitRecord | None:
        """The init record; None when the run did not start from other weights (or was trained
        before zebractl wrote one)."""
        path = self.init_path
        try:
            return InitRecord.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValidationError as exc:
            raise ConfigError(f"{path}: not a valid init record: {exc}") from None

    def write_tracker(self, record: TrackerRecord) -> None:
        """Write the W&B run record (atomically)."""
        write_text_atomic(self.tracker_path, record.model_dump_json(indent=2) + "\n")

    def read_tracker(self) -> TrackerRecord | None:
        """The W&B run this directory logs to; None when it was never tracked."""
        path = self.tracker_path
        try:
            return TrackerRecord.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValidationError as exc:
            raise ConfigError(f"{path}: not a valid W&B run record: {exc}") from None

    @classmethod
    def containing(cls, path: Path) -> Path | None:
        """The run directory ``path`` is (or is a checkpoint of): the first of ``path``, its parent
        and grandparent holding a resolved config; None when there is none."""
        path = Path(path)
        return next(
            (p for p in (path, path.parent, path.parent.parent) if (p / cls.CONFIG).is_file()),
            None,
        )

    def write_sbatch(self, script: str) -> Path:
        """Write the Slurm script; returns its path."""
        self.create()
        write_text_atomic(self.sbatch_path, script)
        return self.sbatch_path

    def config_changes(self, record: ResolvedConfigRecord) -> list[str]:
        """Dotted keys whose value differs from the config already in this directory."""
        if not self.config_path.is_file():
            return []
        try:
            old = json.loads(self.config_path.read_text(encoding="utf-8")).get("config", {})
        except (OSError, ValueError):
            return ["(unreadable previous config)"]
        return sorted(_diff(old, record.config))


def _diff(a: object, b: object, prefix: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[str] = set()
        for k in set(a) | set(b):
            out |= _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return set() if a == b else {prefix.rstrip(".")}

"""Weights & Biases tracking of a run directory (``logging.wandb``).

The trainer opens a :class:`Tracker` on rank 0 (:func:`open_tracker`) and hands it to
:class:`~zebractl.run.metrics.MetricsWriter`, which forwards every row: the W&B run's config is the
resolved config with its provenance (under ``zebractl.provenance``), every TrainRow / ValRow is logged
as ``train/*`` / ``val/*`` at step = iteration (TensorBoard's names), and the run finishes with the
training's outcome (exit code 1 after an error). The W&B run id is kept in ``RUN/wandb.json``
(:class:`~zebractl.run.records.TrackerRecord`): a resume continues the same W&B run, and
:func:`attach_eval` / :func:`attach_compare` add the results of ``eval`` and ``compare`` written
into the run directory to it.

W&B writes under ``RUN/wandb/`` and prints nothing: its terminal output, console capture, git and
code capture and system metrics are off. ``wandb`` is imported here only, and only for a tracked run.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebractl.deps import install_hint
from zebractl.errors import ConfigError
from zebractl.run.lock import writer_root
from zebractl.run.metrics import scalars
from zebractl.run.records import ResolvedConfigRecord, TrackerRecord, TrainRow, ValRow
from zebractl.run.rundir import RunDir, utc_now

if TYPE_CHECKING:
    from zebractl.schemas.recipe import WandbConfig

Note = Callable[[str], None]

SYNC_HINT = "wandb sync {dir}/offline-run-*"


def _wandb() -> Any:
    """The wandb module, or exit 2 naming the extra."""
    try:
        import wandb
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "wandb":
            raise
        raise ConfigError(
            f"logging.wandb is set but wandb is not installed: {install_hint('wandb')}"
        ) from None
    return wandb


def _init(wandb: Any, run: RunDir, record: TrackerRecord, **kw: Any) -> Any:
    """Start (or continue) the W&B run of ``record`` with files under ``RUN/wandb/``, silently."""
    quiet = wandb.Settings(
        silent=True,
        console="off",
        disable_git=True,
        disable_code=True,
        save_code=False,
        x_disable_stats=True,
    )
    wandb.setup(settings=quiet)  # its terminal messages (set once per process, from here)
    try:
        return wandb.init(
            project=record.project,
            entity=record.entity,
            id=record.id,
            resume="allow",
            mode=record.mode,
            dir=str(run.root),
            settings=quiet,
            **kw,
        )
    except wandb.errors.UsageError as exc:  # not logged in, a bad entity or project, ...
        raise ConfigError(
            f"wandb: {exc} (or --set logging.wandb.mode=offline, to upload later)"
        ) from None


def run_config(record: ResolvedConfigRecord) -> dict[str, Any]:
    """The W&B config of a run: every resolved value, and under ``zebractl`` where each came from
    (nested like the values), the recipe and the zebractl version."""
    provenance: dict[str, Any] = {}
    for key, source in sorted(record.provenance.items()):
        *parents, leaf = key.split(".")
        node = provenance
        for p in parents:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):  # a leaf and a branch of one name: keep it flat
                node = None
                break
            node = child
        if node is None:
            provenance[key] = source
        else:
            node[leaf] = source
    return {
        **record.config,
        "zebractl": {
            "name": record.name,
            "recipe": record.recipe,
            "version": record.zebractl_version,
            "reference": record.reference,
            "provenance": provenance,
        },
    }


class Tracker:
    """The W&B run a training session logs to (rank 0)."""

    def __init__(self, wb_run: Any) -> None:
        self.wb = wb_run

    def log(self, row: TrainRow | ValRow) -> None:
        """Log a row's scalars at step = its iteration."""
        self.wb.log(scalars(row), step=row.iteration)

    def finish(self, exit_code: int = 0) -> None:
        """Mark the W&B run finished (0) or failed, and flush it."""
        self.wb.finish(exit_code=exit_code)


def open_tracker(
    run: RunDir, record: ResolvedConfigRecord, cfg: WandbConfig | None, note: Note
) -> Tracker | None:
    """Start the W&B run of ``cfg`` (None or mode disabled: no tracking), or continue the one
    ``RUN/wandb.json`` names, and write that record."""
    if cfg is None or cfg.mode == "disabled":
        return None
    wandb = _wandb()
    known = run.read_tracker()
    tracked = TrackerRecord(
        id=known.id if known is not None else uuid.uuid4().hex[:12],
        project=cfg.project,
        entity=cfg.entity,
        mode=cfg.mode,
        url=None,
        created=known.created if known is not None else utc_now(),
    )
    wb = _init(
        wandb,
        run,
        tracked,
        name=cfg.name or run.root.name,
        group=cfg.group,
        tags=list(cfg.tags),
        notes=cfg.notes,
        config=run_config(record),
    )
    if cfg.mode == "online":
        tracked = tracked.model_copy(update={"url": wb.url})
    run.write_tracker(tracked)
    verb = "continuing" if known is not None else "logging to"
    if cfg.mode == "online":
        note(f"wandb: {verb} {tracked.url}")
    else:
        note(
            f"wandb: {verb} offline run {tracked.id} in {run.wandb_dir} (upload: "
            f"{SYNC_HINT.format(dir=run.wandb_dir)})"
        )
    return Tracker(wb)


def _attach(
    folder: Path, what: str, summary: dict[str, Any], files: Iterable[Path], note: Note
) -> None:
    """Continue the W&B run of the run directory holding ``folder`` (if it is tracked) to add
    ``summary`` and ``files``. Never fails the command: the results are written already."""
    run = RunDir(writer_root(folder))
    try:
        known = run.read_tracker()
    except ConfigError as exc:
        note(f"note: {what} not attached to W&B: {exc}")
        return
    if known is None:
        return
    try:
        wandb = _wandb()
    except ConfigError:
        note(
            f"note: {run.root} is tracked by W&B run {known.id} but wandb is not installed; "
            f"{what} not attached ({install_hint('wandb')})"
        )
        return
    try:
        wb = _init(wandb, run, known)
        wb.summary.update(summary)
        for f in files:
            wb.save(str(f), base_path=str(run.root), policy="now")
        wb.finish()
    except Exception as exc:  # noqa: BLE001 - a tracker problem must not fail a written result
        note(f"note: {what} not attached to W&B run {known.id}: {exc}")
        return
    where = f" (upload: {SYNC_HINT.format(dir=run.wandb_dir)})" if known.mode == "offline" else ""
    note(f"wandb: {what} attached to run {known.id}{where}")


def attach_eval(report: Any, output: Path, note: Note) -> None:
    """Add an EvalReport written into ``output`` (``OUTPUT/eval/results.json``) to its run's W&B
    run: ``eval/<task>/<metric>`` (and ``..._stderr``) summary values and the results file."""
    summary: dict[str, Any] = {"eval/iteration": report.iteration}
    for t in report.tasks:
        for name, m in t.metrics.items():
            if m.value is not None:
                summary[f"eval/{t.task}/{name}"] = m.value
            if m.stderr is not None:
                summary[f"eval/{t.task}/{name}_stderr"] = m.stderr
    _attach(output, "eval results", summary, [Path(report.results_file)], note)


def attach_compare(report: Any, folder: Path, note: Note) -> None:
    """Add a CompareReport written into ``folder`` to its run's W&B run: ``compare/<B>/*``
    summary values (verdict, headline deltas, each check) and the report's files."""
    b = folder.name.removeprefix("compare-")
    values: dict[str, Any] = {
        "kind": report.kind,
        "passed": report.passed,
        "iteration1_delta": report.iteration1_delta,
        "last_half_mean_abs_pct": report.last_half_mean_abs_pct,
        "val_loss_delta": report.val_loss.delta,
        "tokens_per_s_ratio": (
            report.throughput.ratio.tokens_per_s if report.throughput.meaningful else None
        ),
        "eval_mean_abs_pp": report.eval_mean_abs_pp,
    }
    for c in report.checks:
        values[f"check/{c.name}"] = c.value
        values[f"check/{c.name}_ok"] = c.ok
    for e in report.eval:
        values[f"eval_delta_pp/{e.task}/{e.metric}"] = e.delta_pp
    if report.finetune is not None:
        for e in report.finetune.eval:
            values[f"eval_delta/{e.task}/{e.metric}"] = e.delta
    summary = {f"compare/{b}/{k}": v for k, v in values.items() if v is not None}
    _attach(folder, "the compare report", summary, map(Path, report.files), note)

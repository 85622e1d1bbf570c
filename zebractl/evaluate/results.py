"""``eval/results.json``: lm-eval's numbers as :class:`~zebractl.schemas.reports.EvalReport` rows,
and the earlier results a new call may reuse (same model fingerprint and settings)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebractl.evaluate import tasks as T

if TYPE_CHECKING:
    from zebractl.schemas.reports import EvalReport, EvalTaskResult

SETTINGS = (
    "fingerprint",
    "lm_eval_version",
    "device",
    "dtype",
    "batch_size",
    "max_length",
    "limit",
)
"""What must equal for an earlier results.json's tasks to be reused."""


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def parse_results(res: dict[str, Any], task: T.Task) -> tuple[dict[str, Any], int, int]:
    """lm-eval's results of one task: {metric: (value, stderr)}, samples scored, documents."""
    row = res["results"][task.lm_eval_name]
    metrics: dict[str, Any] = {}
    for key, value in row.items():
        if "," not in key or "_stderr," in key:
            continue
        metric, _filter = key.split(",", 1)
        stderr = row.get(f"{metric}_stderr,{_filter}")
        metrics[metric] = {"value": _finite(value), "stderr": _finite(stderr)}
    counts = res.get("n-samples", {})
    names = [task.lm_eval_name]
    if task.name == "mmlu":
        names = [f"{task.lm_eval_name}_{s}" for s in T.MMLU_SUBJECTS]
    samples = sum(int(counts.get(n, {}).get("effective", 0)) for n in names)
    docs = sum(int(counts.get(n, {}).get("original", 0)) for n in names)
    return metrics, samples, docs


def previous(path: Path) -> EvalReport | None:
    """The results.json at ``path``, if there is a readable one."""
    from zebractl.schemas.reports import EvalReport

    if not path.is_file():
        return None
    try:
        return EvalReport.model_validate_json(path.read_text())
    except Exception:  # noqa: BLE001 - a damaged or older file is not reused (it is rewritten)
        return None


def reusable(old: EvalReport | None, fields: dict[str, Any]) -> dict[str, EvalTaskResult]:
    """The tasks of ``old`` that ran with the same :data:`SETTINGS` as ``fields``, by name."""
    if old is None or tuple(getattr(old, k) for k in SETTINGS) != tuple(
        fields[k] for k in SETTINGS
    ):
        return {}
    return {r.task: r for r in old.tasks if r.status == "ok"}


def _row(
    t: T.Task,
    ran: bool,
    res: dict[str, Any],
    reused: dict[str, EvalTaskResult],
    digests: dict[str, dict[str, str]],
) -> EvalTaskResult:
    """The row of task ``t``: skipped, ``ran`` now (from lm-eval's ``res``), or reused."""
    from zebractl.schemas.reports import EvalMetric, EvalTaskResult

    if t.skip is not None:
        return EvalTaskResult(
            task=t.name,
            lm_eval_task=t.lm_eval_name,
            status="skipped",
            reason=t.skip,
            split=t.split,
            primary=list(t.primary),
        )
    if not ran:
        return reused[t.name].model_copy(update={"reused": True})
    metrics, samples, docs = parse_results(res, t)
    return EvalTaskResult(
        task=t.name,
        lm_eval_task=t.lm_eval_name,
        status="ok",
        split=t.split,
        primary=list(t.primary),
        metrics={k: EvalMetric(**v) for k, v in metrics.items()},
        samples=samples,
        documents=docs,
        data_sha256=digests.get(t.name, {}),
    )


def task_rows(
    chosen: list[T.Task],
    todo: list[T.Task],
    res: dict[str, Any],
    reused: dict[str, EvalTaskResult],
    digests: dict[str, dict[str, str]],
    old: EvalReport | None,
) -> list[EvalTaskResult]:
    """One row per task asked for, then the reusable rows of ``old`` not asked for this time (the
    file keeps what it held for the same model and settings)."""
    rows = [_row(t, t in todo, res, reused, digests) for t in chosen]
    asked = {t.name for t in chosen}
    if old is not None and reused:
        rows += [
            r.model_copy(update={"reused": True})
            for r in old.tasks
            if r.task not in asked and r.status == "ok"
        ]
    return rows


def write(report: EvalReport, results_file: Path) -> None:
    """Write ``report`` to ``results_file`` atomically."""
    tmp = results_file.with_name(results_file.name + ".tmp")
    tmp.write_text(report.model_dump_json(by_alias=True, indent=2) + "\n")
    tmp.replace(results_file)

"""The GPU check's `memory` phase in its record: the big models' peak memory against the plan.

check.sh's ``phase_memory`` (``PHASES=memory``, never by default) trains each run of
``CHECK_MEMORY_RUNS`` for a few iterations on one GPU and writes, per run, one line of
``memory_runs.tsv`` (name, recipe, micro-batch, recompute mode, the extra ``--set`` values) and
``NAME.plan.json`` (``zebractl plan --json`` with the same settings) beside ``runs/NAME/``. Here each
run becomes one row: tokens/s and MFU (median of the iterations after the first two), the peak
memory (the largest ``memory_gib`` of metrics.jsonl: ``torch.cuda.max_memory_allocated``), the
plan's estimate and the plan's error against the peak (issue 27: within 10%). Stdlib only; a run
that failed or never ran is a row of nulls with the reason, never an exception.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record_io import num, read_json, read_tsv, train_rows  # noqa: E402

COLUMNS = ("name", "recipe", "micro", "mode", "sets", "as_shipped")
"""memory_runs.tsv's columns; ``as_shipped`` (yes/no) is the run's micro-batch, recompute mode and
sets all the recipe's (its ``--check`` verdict belongs to it). Files from before that column:
mode ``shipped`` and no sets, whatever the micro-batch (a run at another micro-batch then showed
the shipped one's verdict: the 2026-12-06 426c5e6 memory record's micro-32 row)."""


def _plan(path: Path) -> tuple[float | None, str | None]:
    """The plan's estimate (GiB) and its recompute label (``full (N of B blocks)``)."""
    doc = read_json(path)
    try:
        m = doc["memory_per_gpu"]
    except (KeyError, TypeError):
        return None, None
    label = m.get("recompute") if isinstance(m, dict) else None
    return num(m.get("total_gib")) if isinstance(m, dict) else None, label


def _check(path: Path) -> dict[str, Any] | None:
    """`zebractl train RECIPE --check --json`'s verdict and its memory row (None: not run)."""
    doc = read_json(path)
    if not isinstance(doc, dict):
        return None
    rows = {c.get("name"): c for c in doc.get("checks") or [] if isinstance(c, dict)}
    mem = rows.get("memory") or {}
    return {"ok": doc.get("ok"), "memory": mem.get("status"), "detail": mem.get("detail")}


def run_row(job: Path, spec: dict[str, str], status: dict[str, str] | None) -> dict[str, Any]:
    """One run of the phase: what was asked, what was measured, how far the plan was."""
    name = spec["name"]
    rows = train_rows(job / "runs" / name / "metrics.jsonl")
    steady = [r for r in rows if (num(r.get("iteration")) or 0) > 2]
    tps = [t for t in (num(r.get("tokens_per_s")) for r in steady) if t is not None]
    mfu = [m for m in (num(r.get("mfu")) for r in steady) if m is not None]
    mem = [g for g in (num(r.get("memory_gib")) for r in rows) if g is not None]
    peak = max(mem) if mem else None
    plan, label = _plan(job / f"{name}.plan.json")
    if spec.get("as_shipped") in ("yes", "no"):
        shipped = spec["as_shipped"] == "yes"
    else:  # written before the column
        shipped = spec.get("mode") == "shipped" and not spec.get("sets")
    step = status or {}
    reason = None
    if step.get("status") not in (None, "ok"):
        reason = step.get("reason") or step.get("status")
    elif not rows:
        reason = "no metrics.jsonl rows (the run did not log an iteration)"
    return {
        "name": name,
        "recipe": spec.get("recipe"),
        "micro": int(spec["micro"]) if (spec.get("micro") or "").isdigit() else spec.get("micro"),
        "recompute": label or spec.get("mode"),
        "as_shipped": shipped,
        "sets": [s for s in (spec.get("sets") or "").split(",") if s],
        "status": step.get("status") or ("ok" if rows else "missing"),
        "reason": reason,
        "iterations": len(rows),
        "tokens_per_s": round(statistics.median(tps)) if tps else None,
        "mfu": round(statistics.median(mfu), 4) if mfu else None,
        "peak_gib": round(peak, 2) if peak is not None else None,
        "plan_gib": plan,
        "plan_error": round(plan / peak - 1, 4) if plan is not None and peak else None,
        "check": _check(job / f"check_{spec.get('recipe')}.json") if shipped else None,
    }


def memory(job: Path, steps: list[dict[str, str]]) -> dict[str, Any]:
    """The phase's section of the record (``steps``: check.sh's steps.tsv rows)."""
    specs = [r for r in read_tsv(job / "memory_runs.tsv", COLUMNS) if r["name"] and r["recipe"]]
    by_step = {s.get("step"): s for s in steps if s.get("phase") == "memory"}
    runs = [run_row(job, spec, by_step.get(spec["name"])) for spec in specs]
    errors = [r["plan_error"] for r in runs if r["plan_error"] is not None]
    return {
        "method": "zebractl train RECIPE on one GPU, micro = global (the recipe's micro-batch, "
        "no accumulation), the demo corpus; peak = the "
        "largest memory_gib (torch.cuda.max_memory_allocated) of metrics.jsonl; plan = zebractl "
        "plan --json memory_per_gpu.total_gib with the same settings; plan_error = plan / peak - 1",
        "runs": runs,
        "worst_plan_error": max(errors, key=abs) if errors else None,
    }

"""What a comparison concludes: whether the two runs are of one model (:func:`model_differences`),
the verdict or why there is none (:func:`verdict`), and the config differences a verdict is read
with (:func:`differs`).

A parity verdict says that two runs of one model trained alike: runs of different models (any
model field but its description: the layout, a width, a head, the vocabulary, a norm's epsilon)
get none, their curves side by side as a plain comparison (``kind: models_differ``). Runs of one
model that differ in data, seed, schedule or optimizer keep theirs, read with those differences.
"""

from __future__ import annotations

from typing import Any

from zebractl.config import models

SHOWN = 8
"""Differences a one-line summary lists before "and N more"."""


def model_of(run: Any) -> Any:
    """The run's model (a ``ModelConfig``) as its resolved config records it; None when the record
    is not a valid model (a run of an older zebractl: its model keys are compared as written)."""
    from zebractl.schemas.preset import ModelConfig

    try:
        return ModelConfig.model_validate(run.record.config.get("model"))
    except Exception:  # noqa: BLE001 - an older record: compared key by key instead
        return None


def described(run: Any) -> str | None:
    """``tiny_kda (2 blocks: kda, kda; hidden 64)``: the run's model (None: not a valid one)."""
    m = model_of(run)
    return models.described(m, run.record.config.get("preset")) if m is not None else None


def model_differences(a: Any, b: Any, diffs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where run A's model differs from run B's (:func:`zebractl.config.models.differences`), as
    :class:`~zebractl.schemas.reports.CompareModelDifference` fields; for a run whose record is no
    valid model, the differing ``model.*`` keys of ``diffs`` (the config differences)."""
    ma, mb = model_of(a), model_of(b)
    if ma is not None and mb is not None:
        return [
            {"key": d.key, "a": d.a, "b": d.b, "kind": d.kind} for d in models.differences(ma, mb)
        ]
    return [
        {"key": d["key"].removeprefix("model."), "a": d["a"], "b": d["b"], "kind": "weights"}
        for d in diffs
        if d["key"].startswith("model.") and d["key"] != "model.description"
    ]


def listed(rows: list[Any], shown: int = SHOWN) -> str:
    """``key A ≠ B`` of each difference (dicts or report rows), then ``and N more``."""

    def get(x: Any, k: str) -> Any:
        return x[k] if isinstance(x, dict) else getattr(x, k)

    text = ", ".join(
        f"{get(d, 'key')} {models.show(get(d, 'a'))} ≠ {models.show(get(d, 'b'))}"
        for d in rows[:shown]
    )
    more = len(rows) - shown
    return text + (f", and {more} more" if more > 0 else "")


def verdict(data: dict[str, Any], checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The :class:`~zebractl.schemas.reports.CompareVerdict`: PASS, FAIL or NOTHING TO CHECK with
    the bounds checked, or no result and why."""
    if data["kind"] == "finetune":
        return {
            "result": None,
            "reason": "no parity verdict: a fine-tune and the run it started from are a "
            "before/after pair (other data, another schedule)",
        }
    if data["kind"] == "models_differ":
        n = len(data["model_differences"])
        return {
            "result": None,
            "reason": f"no parity verdict: the runs are of different models ({n} model "
            f"field(s) differ: {listed(data['model_differences'])}); a verdict compares runs "
            "of one model",
        }
    if not checks:
        return {"result": "NOTHING TO CHECK", "reason": "no common iteration to check"}
    bounds = "; ".join(
        f"{c['what']} {c['value']:.3g} {'<=' if c['ok'] else '>'} {c['tolerance']:.3g}"
        for c in checks
    )
    return {"result": "PASS" if all(c["ok"] for c in checks) else "FAIL", "reason": bounds}


def other_differences(r: Any) -> list[Any]:
    """The config differences a verdict is read with: all of them for runs of one model; for runs
    of different models, those outside the model and its preset (they lead the report already)."""
    if r.kind != "models_differ":
        return list(r.differences)
    return [d for d in r.differences if d.key != "preset" and not d.key.startswith("model.")]


def differs(r: Any, shown: int = SHOWN) -> str | None:
    """``the runs differ in: seed 1234 ≠ 99, ...``: the config differences a verdict is read with
    (None: none)."""
    rows = other_differences(r)
    if not rows:
        return None
    also = "also " if r.kind == "models_differ" else ""
    return f"the runs {also}differ in: {listed(rows, shown)}"

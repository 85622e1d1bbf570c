"""`zebractl compare RUN_A RUN_B`: a parity report of two runs, the kind the seed assembles by hand.

Loss at the seed's kind of checkpoints (iteration 1, then powers of two, then the last), with
each run's learning rate there, absolute and relative difference (Δ = A - B, relative to B: the
seed's "Primus - FLA"), the mean |Δ%| over the last half of the common iterations and the final
validation losses; throughput side by side (tokens/s/GPU, TFLOP/s, MFU, peak memory: means over the
logged rows after the first, which holds the warm-up; marked not meaningful when either run trained
on a CPU); and, when both runs have ``eval/results.json`` (`zebractl eval`), each task's seed
metrics in points and their mean |Δ|. Every difference between the runs' resolved configs is listed
with where each side's value came from, and so is every value that changed within a run at a resume
(``RUN/config.history.jsonl``: ``config.resolved.json`` holds only the newest); runs that differ in
their data, tokenizer, sequence length or global batch are refused unless ``force`` (the comparison
would not be apples to apples).

:func:`checks` turns the tolerances into pass/fail rows (``compare --assert``: exit 3). Runs of
different models (any model field: :mod:`zebractl.compare.verdict`) are compared as curves side by
side with no check and no verdict (``kind: models_differ``).

A fine-tune and the run it started from (:func:`relation`: one run's ``init_from`` is the other,
read from its ``init.json`` or, for older runs, its resolved config) are a before/after pair, not a
parity pair: they trained on different data with different schedules, so nothing is refused for
differing, no loss-parity number is computed and no check applies. Their report (``kind:
finetune``, :func:`finetune`) gives each task's eval delta as after - before, the tasks that cannot
be compared and why, and the fine-tuned run's own training and validation losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zebractl.errors import ConfigError, first_line
from zebractl.util import flatten

if TYPE_CHECKING:
    from zebractl.schemas.reports import CompareReport

TOLERANCES = {"iteration1_abs": 1e-3, "last_half_pct": 1.0, "eval_pp": 1.0}
"""Defaults of --assert: iteration-1 |Δloss|, last-half mean |Δ%| of the loss, eval mean |Δ| (pp)."""
MUST_MATCH = ("data.paths", "data.tokenizer", "data.seq_length", "data.split", "batch.global")
"""Resolved keys (and their children) that must be equal unless --force."""
IGNORED = ("output_dir", "description", "checkpoint.dir")
"""Keys whose difference says nothing about the runs (where they were written)."""
PERCENT = ("acc", "acc_norm")
"""Eval metrics that are fractions: reported in points (x 100)."""
LOWER_IS_BETTER = ("word_perplexity", "byte_perplexity", "bits_per_byte")
"""Eval metrics where a drop is an improvement."""


@dataclass
class Run:
    """One side of the comparison."""

    root: Path
    label: str
    record: Any  # ResolvedConfigRecord
    train: list[Any]  # TrainRow
    val: list[Any]  # ValRow
    eval: Any  # EvalReport | None
    init: Any = None  # InitRecord | None: RUN/init.json
    history: list[Any] | None = None  # ConfigHistoryEntry: RUN/config.history.jsonl (or found)


def check_run(path: Path) -> Path:
    """``path`` if it looks like a run directory (its resolved config is there), checked without
    reading it: :func:`open_run`'s first errors, before the command takes a lock."""
    from zebractl.run.rundir import RunDir

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: no such run directory")
    run = RunDir(path)
    if not run.config_path.is_file():
        raise ConfigError(f"{run.config_path}: not a zebractl run directory (no {RunDir.CONFIG})")
    return path


def open_run(path: Path) -> Run:
    """A run directory's config, metrics and (if any) eval results."""
    from zebractl.run.metrics import MetricsReader
    from zebractl.run.rundir import RunDir
    from zebractl.schemas.reports import EvalReport

    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: no such run directory")
    run = RunDir(path)
    record = run.read_config()
    reader = MetricsReader.of(run)
    train = sorted({r.iteration: r for r in reader.train()}.values(), key=lambda r: r.iteration)
    if not train:
        raise ConfigError(f"{run.metrics_path}: no training rows to compare")
    val = reader.validation()
    ev = None
    results = run.eval_dir / "results.json"
    if results.is_file():
        try:
            ev = EvalReport.model_validate_json(results.read_text())
        except Exception as exc:  # noqa: BLE001 - damaged results: said, not used
            first = first_line(exc)
            raise ConfigError(f"{results}: not a zebractl eval report ({first})") from None
    label = f"{path.name}" + (f" ({record.reference})" if record.reference else "")
    history = run.read_config_history()
    if not history:  # trained before zebractl kept a history: its resolved config is all we know
        from zebractl.run.records import ConfigHistoryEntry

        history = [
            ConfigHistoryEntry(
                event="found", iteration=None, run_id=None, device=None, world_size=None,
                changed=[], created=record.created, record=record,
            )
        ]  # fmt: skip
    return Run(path, label, record, train, val, ev, run.read_init(), history)


def _ignored(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in IGNORED)


def config_changes(run: Run, side: str) -> list[dict[str, Any]]:
    """Every resolved value that changed within ``run`` from one start to the next (output paths
    excluded), at the iteration the changed session started from."""
    out: list[dict[str, Any]] = []
    history = run.history or []
    for prev, cur in zip(history, history[1:], strict=False):
        fp, fc = (
            flatten(prev.record.config, keep_empty=True),
            flatten(cur.record.config, keep_empty=True),
        )
        for k in sorted(set(fp) | set(fc)):
            if _ignored(k) or fp.get(k) == fc.get(k):
                continue
            out.append(
                {
                    "side": side,
                    "iteration": cur.iteration,
                    "run_id": cur.run_id,
                    "key": k,
                    "before": fp.get(k),
                    "after": fc.get(k),
                    "before_source": prev.record.provenance.get(k, "default"),
                    "after_source": cur.record.provenance.get(k, "default"),
                }
            )
    return out


def device(run: Run) -> str | None:
    """What the run trained on (its newest start); for a run without a history, ``cpu`` when no
    row logged TFLOP/s (CUDA only), else unknown."""
    recorded = (run.history or [None])[-1]
    if recorded is not None and recorded.device is not None:
        return recorded.device
    return "cpu" if all(r.tflops_per_gpu is None for r in run.train) else None


def side(run: Run) -> dict[str, Any]:
    """One side of the report: the run, its model, its device and its starts."""
    from zebractl.compare.verdict import described

    return {
        "run": str(run.root),
        "label": run.label,
        "model": described(run),
        "reference": run.record.reference,
        "iterations": run.train[-1].iteration,
        "device": device(run),
        "starts": [
            {"event": h.event, "iteration": h.iteration, "run_id": h.run_id, "device": h.device,
             "created": h.created, "changed": h.changed}
            for h in run.history or []
        ],
    }  # fmt: skip


def on_cpu(run: Run) -> bool:
    """Whether any of the run's sessions trained on a CPU (its rows are averaged together); for a
    run without a recorded device, whether no row logged TFLOP/s (CUDA only)."""
    recorded = [h.device for h in run.history or [] if h.device is not None]
    if recorded:
        return any(d.startswith("cpu") for d in recorded)
    return all(r.tflops_per_gpu is None for r in run.train)


def throughput(a: Run, b: Run) -> dict[str, Any]:
    """Speed side by side; not meaningful when either run trained on a CPU."""
    ta, tb = _throughput(a.train), _throughput(b.train)
    cpu = [r.label for r in (a, b) if on_cpu(r)]
    note = None
    if cpu:
        note = (
            f"{' and '.join(cpu)} trained on a CPU: tokens/s on a CPU say nothing of GPU "
            "throughput, so the ratio is not meaningful"
        )
    return {
        "a": ta,
        "b": tb,
        "ratio": {k: _ratio(ta[k], tb[k]) for k in ta},
        "meaningful": not cpu,
        "note": note,
    }


def initial_run(run: Run) -> tuple[Path, dict[str, Any]] | None:
    """The run directory whose checkpoint ``run``'s weights started from, with how that is known
    (the fields of :class:`~zebractl.schemas.reports.CompareFinetune` it fills); None when it
    started from a fresh initialisation, a Hugging Face folder, or a path in no run directory."""
    from zebractl.run.rundir import RunDir

    rec = run.init
    if rec is not None:  # what the trainer actually loaded
        if rec.run is None:
            return None
        return Path(rec.run), {
            "init_from": rec.init_from,
            "given_by": rec.given_by,
            "recorded_in": str(run.root / RunDir.INIT),
            "checkpoint": rec.checkpoint,
            "iteration": rec.iteration,
        }
    given = run.record.config.get("init_from")
    if not given:
        return None
    # a run trained before init.json: its init_from, relative to the working directory
    root = RunDir.containing(Path(given).resolve())
    if root is None:
        return None
    return root, {
        "init_from": given,
        "given_by": run.record.provenance.get("init_from", "default"),
        "recorded_in": str(run.root / RunDir.CONFIG),
        "checkpoint": None,
        "iteration": None,
    }


def _same(x: Path, y: Path) -> bool:
    try:
        return x.resolve() == y.resolve()
    except OSError:
        return False


def relation(a: Run, b: Run) -> dict[str, Any] | None:
    """How A and B are a fine-tune and its initial run (``after``/``before``: ``"a"`` or ``"b"``,
    and what :func:`initial_run` says), or None."""
    for after, before, sides in ((a, b, ("a", "b")), (b, a, ("b", "a"))):
        found = initial_run(after)
        if found is not None and _same(found[0], before.root):
            return {"after": sides[0], "before": sides[1], **found[1]}
    return None


def differences(a: Run, b: Run) -> list[dict[str, Any]]:
    """Every resolved key whose value differs, with each side's provenance."""
    fa, fb = flatten(a.record.config, keep_empty=True), flatten(b.record.config, keep_empty=True)
    out = []
    for k in sorted(set(fa) | set(fb)):
        if _ignored(k):
            continue
        if fa.get(k) != fb.get(k):
            out.append(
                {
                    "key": k,
                    "a": fa.get(k),
                    "b": fb.get(k),
                    "a_source": a.record.provenance.get(k, "default"),
                    "b_source": b.record.provenance.get(k, "default"),
                    "must_match": any(k == p or k.startswith(p + ".") for p in MUST_MATCH),
                }
            )
    return out


def checkpoints(logged: list[int]) -> list[int]:
    """The seed's kind of checkpoints among the logged (sorted) iterations: the first, the first
    at or after each power of two, and the last."""
    out: list[int] = []
    i = 1
    while logged and i <= logged[-1]:
        at = next(x for x in logged if x >= i)
        if at not in out:
            out.append(at)
        i *= 2
    if logged and logged[-1] not in out:
        out.append(logged[-1])
    return out


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def _throughput(rows: list[Any]) -> dict[str, float | None]:
    steady = rows[1:] or rows
    return {
        "tokens_per_s": _mean([r.tokens_per_s for r in steady]),
        "tflops_per_gpu": _mean([r.tflops_per_gpu for r in steady]),
        "mfu": _mean([r.mfu for r in steady]),
        "memory_gib": max((r.memory_gib for r in rows if r.memory_gib is not None), default=None),
    }


def _val_points(run: Run) -> list[dict[str, Any]]:
    """The finite validation losses, one per iteration (the newest: a restart of a complete run
    evaluates its last iteration again)."""
    last = {r.iteration: r.val_loss for r in run.val}
    return [
        {"iteration": i, "loss": v}
        for i, v in sorted(last.items())
        if v is not None and math.isfinite(v)
    ]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b != 0 else None


def _eval_rows(a: Run, b: Run) -> list[dict[str, Any]]:
    if a.eval is None or b.eval is None:
        return []
    tb = {t.task: t for t in b.eval.tasks if t.status == "ok"}
    rows = []
    for t in a.eval.tasks:
        if t.status != "ok" or t.task not in tb:
            continue
        for metric in t.primary:
            ma, mb = t.metrics.get(metric), tb[t.task].metrics.get(metric)
            if ma is None or mb is None or ma.value is None or mb.value is None:
                continue
            pa, pb = 100 * ma.value, 100 * mb.value
            rows.append({"task": t.task, "metric": metric, "a": pa, "b": pb, "delta_pp": pa - pb})
    return rows


def _scaled(m: Any, scale: float) -> tuple[float | None, float | None]:
    if m is None or m.value is None:
        return None, None
    return scale * m.value, (scale * m.stderr if m.stderr is not None else None)


def finetune_eval(
    before: Run, after: Run, init_iteration: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Each task's primary metrics before and after (delta = after - before), the tasks without a
    delta and why, and the notes on settings that differ."""
    notes = [
        f"no eval results for the {what} ({r.root / 'eval' / 'results.json'}): "
        f"`zebractl eval {r.root}` writes them"
        for what, r in (("initial run", before), ("fine-tuned run", after))
        if r.eval is None
    ]
    if notes:
        return [], [], notes
    eb, ea = before.eval, after.eval
    for key in ("max_length", "dtype", "device", "batch_size", "lm_eval_version"):
        if getattr(eb, key) != getattr(ea, key):
            notes.append(
                f"evaluated with another {key}: before {getattr(eb, key)}, after {getattr(ea, key)}"
            )
    if init_iteration is not None and eb.iteration is not None and eb.iteration != init_iteration:
        notes.append(
            f"the initial run's eval is of its iteration {eb.iteration}; the fine-tune started "
            f"from iteration {init_iteration} (`zebractl eval {before.root} --iteration "
            f"{init_iteration}` evaluates those weights)"
        )
    ok_b = {t.task: t for t in eb.tasks if t.status == "ok"}
    ok_a = {t.task: t for t in ea.tasks if t.status == "ok"}
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for task, ta in ok_a.items():
        tb = ok_b.get(task)
        if tb is None:
            skipped.append({"task": task, "reason": "evaluated on the fine-tuned run only"})
            continue
        if eb.limit != ea.limit:
            skipped.append(
                {"task": task, "reason": f"other documents: --limit {eb.limit} before, "
                 f"{ea.limit} after"}
            )  # fmt: skip
            continue
        if ta.data_sha256 != tb.data_sha256:
            why = "scored other documents (their data sha256 differ)"
            if task == "wikitext-like":
                why = (
                    "scored other documents: each run's own held-out data (`zebractl eval "
                    f"{after.root} --tasks wikitext-like --data {before.root}` scores the initial "
                    "run's)"
                )
            skipped.append({"task": task, "reason": why})
            continue
        for metric in ta.primary:
            scale = 100.0 if metric in PERCENT else 1.0
            va, sa = _scaled(ta.metrics.get(metric), scale)
            vb, sb = _scaled(tb.metrics.get(metric), scale)
            if va is None or vb is None:
                continue
            rows.append(
                {
                    "task": task,
                    "metric": metric,
                    "unit": "points" if metric in PERCENT else "value",
                    "higher_is_better": metric not in LOWER_IS_BETTER,
                    "before": vb,
                    "after": va,
                    "delta": va - vb,
                    "before_stderr": sb,
                    "after_stderr": sa,
                }
            )
    skipped += [
        {"task": task, "reason": "evaluated on the initial run only"}
        for task in ok_b
        if task not in ok_a
    ]
    return rows, skipped, notes


def finetune(a: Run, b: Run, rel: dict[str, Any]) -> dict[str, Any]:
    """The before/after part of a fine-tune pair's report (see
    :class:`~zebractl.schemas.reports.CompareFinetune`)."""
    after, before = (a, b) if rel["after"] == "a" else (b, a)
    rows, skipped, notes = finetune_eval(before, after, rel["iteration"])
    fin = math.isfinite
    return {
        **rel,
        "data_format": after.record.config.get("data", {}).get("format", "text"),
        "train_loss": [
            {"iteration": r.iteration, "loss": r.loss} for r in after.train if fin(r.loss)
        ],
        "val_loss": [
            {"iteration": r.iteration, "loss": r.val_loss}
            for r in after.val
            if r.val_loss is not None and fin(r.val_loss)
        ],
        "eval": rows,
        "eval_not_compared": skipped,
        "eval_before_iteration": before.eval.iteration if before.eval is not None else None,
        "eval_after_iteration": after.eval.iteration if after.eval is not None else None,
        "notes": notes,
    }


def compare(a_path: Path, b_path: Path, *, force: bool = False) -> dict[str, Any]:
    """The comparison of two runs as plain data (see :class:`~zebractl.schemas.reports.CompareReport`):
    a parity report, or the before/after report of a fine-tune pair (:func:`relation`)."""
    from zebractl.compare.verdict import model_differences

    a, b = open_run(a_path), open_run(b_path)
    diffs = differences(a, b)
    rel = relation(a, b)
    changes = config_changes(a, "a") + config_changes(b, "b")
    model_diffs = model_differences(a, b, diffs)
    if rel is not None:
        va = a.val[-1].val_loss if a.val else None
        vb = b.val[-1].val_loss if b.val else None
        return {
            "kind": "finetune",
            "a": side(a),
            "b": side(b),
            "loss": [],
            "curves": {"iterations": [], "a": [], "b": [], "val_a": [], "val_b": []},
            "iteration1_delta": None,
            "last_half_mean_abs_pct": None,
            "val_loss": {"a": va, "b": vb, "delta": None},  # each on its own held-out data
            "throughput": throughput(a, b),
            "eval": [],
            "eval_mean_abs_pp": None,
            "differences": diffs,
            "model_differences": model_diffs,
            "config_changes": changes,
            "forced": False,
            "finetune": finetune(a, b, rel),
        }  # fmt: skip
    blocking = [d for d in diffs if d["must_match"]]
    if blocking and not force:
        raise ConfigError(
            "the runs differ in "
            + ", ".join(f"{d['key']} ({d['a']!r} vs {d['b']!r})" for d in blocking)
            + ": not the same data and batch; --force compares them anyway"
        )
    la = {r.iteration: r.loss for r in a.train}
    lb = {r.iteration: r.loss for r in b.train}
    lra = {r.iteration: r.lr for r in a.train}
    lrb = {r.iteration: r.lr for r in b.train}
    common = sorted(set(la) & set(lb))
    if not common:
        raise ConfigError(f"{a.root} and {b.root} logged no common iteration")
    last = common[-1]
    rows = []
    for i in checkpoints(common):
        if i in la and i in lb:
            d = la[i] - lb[i]  # Δ = A - B, relative to B
            rows.append(
                {"iteration": i, "a": la[i], "b": lb[i], "delta": d, "delta_pct": 100 * d / lb[i],
                 "lr_a": lra[i], "lr_b": lrb[i]}
            )  # fmt: skip
    half = [i for i in common if i > last / 2] or [last]
    last_half = _mean([abs(100 * (la[i] - lb[i]) / lb[i]) for i in half])
    va = a.val[-1].val_loss if a.val else None
    vb = b.val[-1].val_loss if b.val else None
    ev = _eval_rows(a, b)
    return {
        "kind": "models_differ" if model_diffs else "parity",
        "a": side(a),
        "b": side(b),
        "loss": rows,
        "curves": {"iterations": common, "a": [la[i] for i in common], "b": [lb[i] for i in common],
                   "val_a": _val_points(a), "val_b": _val_points(b)},
        "iteration1_delta": (la[1] - lb[1]) if 1 in la and 1 in lb else None,
        "last_half_mean_abs_pct": last_half,
        "val_loss": {"a": va, "b": vb, "delta": va - vb if va is not None and vb is not None else None},
        "throughput": throughput(a, b),
        "eval": ev,
        "eval_mean_abs_pp": _mean([abs(r["delta_pp"]) for r in ev]) if ev else None,
        "differences": diffs,
        "model_differences": model_diffs,
        "config_changes": changes,
        "forced": bool(blocking),
        "finetune": None,
    }  # fmt: skip


def checks(data: dict[str, Any], tolerances: dict[str, float]) -> list[dict[str, Any]]:
    """Pass/fail of each tolerance that has a value to check (``compare --assert``); none for a
    fine-tune pair or runs of different models (no parity verdict applies to them)."""
    out: list[dict[str, Any]] = []
    if data["kind"] != "parity":
        return out
    for key, value, what in (
        ("iteration1_abs", data["iteration1_delta"], "iteration-1 |Δ loss|"),
        ("last_half_pct", data["last_half_mean_abs_pct"], "last-half mean |Δ%| of the loss"),
        ("eval_pp", data["eval_mean_abs_pp"], "eval mean |Δ| (points)"),
    ):
        if value is None:
            continue
        v = abs(value)
        out.append({"name": key, "what": what, "value": v, "tolerance": tolerances[key],
                    "ok": v <= tolerances[key]})  # fmt: skip
    return out


def report(data: dict[str, Any], tolerances: dict[str, float]) -> CompareReport:
    """The :class:`~zebractl.schemas.reports.CompareReport` of :func:`compare`'s ``data`` with its
    :func:`checks` and verdict (``passed`` is None where no verdict applies: a fine-tune pair,
    runs of different models); no files written yet."""
    from zebractl.compare.verdict import verdict
    from zebractl.schemas.reports import CompareReport

    found = checks(data, tolerances)
    passed = all(c["ok"] for c in found) if data["kind"] == "parity" else None
    return CompareReport(
        **data, checks=found, passed=passed, verdict=verdict(data, found), files=[]
    )


def parse_tolerances(items: list[str]) -> dict[str, float]:
    """KEY=VALUE overrides of :data:`TOLERANCES`."""
    tol = dict(TOLERANCES)
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in tol:
            raise ConfigError(
                f"--tolerance {item}: expected KEY=VALUE with KEY one of {', '.join(tol)}"
            )
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not math.isfinite(v) or v < 0:
            raise ConfigError(f"--tolerance {item}: expected a finite number >= 0")
        tol[key] = v
    return tol

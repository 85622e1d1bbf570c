"""The GPU check's record: one JSON document assembled from what `check.sh` left in its job folder.

Plain Python, standard library only (it runs where nothing else may be installed, and must never
crash on a phase that failed, was cut short or never ran: what is missing is null, with the reason).

    python3 check_record.py write JOB OUTDIR [--partial]   # OUTDIR/DATE-COMMIT.json; prints its path
    python3 check_record.py summary RECORD.json            # the short status table
    python3 check_record.py versions                       # installed versions (JSON), for check.sh
    python3 check_record.py fingerprint [ROOT]             # the source tree's content hash

The job folder (written by check.sh; tests/benchmarks/test_check_record.py builds a synthetic one):

    meta.env         KEY=VALUE: MODE, DATE (UTC, ISO), T0 (epoch), BUDGET, PHASES, XDIST, DRY_RUN,
                     GPU_OK, GPU_REASON, FLA_VARIANTS, EVAL_TASK, EVAL_LIMIT, T_END (epoch, at the end)
    source.env       COMMIT, DIRTY (1/0/empty), FINGERPRINT; dirty.txt: `git status --porcelain`
    gpu.csv          nvidia-smi --query-gpu=name,memory.total,driver_version (csv, noheader, nounits)
    gpu_apps_before_perf.csv   nvidia-smi --query-compute-apps before the perf phase
    versions.json    `check_record.py versions` under the job's PYTHONPATH
    kernel_cache.json          what zebractl.runtime.kernel_cache.configure() set up and seeded
    phases.tsv       phase, status, t0, t1, reason            (one line per phase that ended)
    steps.tsv        phase, step, status, rc, seconds, limit, reason
    logs/STEP.out    a step's stdout (the --json report of a zebractl command), logs/STEP.log its
                     stderr with timestamps (pytest's output is all in logs/tests.log)
    junit.xml        pytest's --junitxml
    runs/perf_RECIPE/metrics.jsonl, bench_RECIPE.json (benchmarks/step_bench.py --json-out)
    logs/parity_compare.out (compare --json), logs/eval.out (eval --json)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_memory  # noqa: E402  (beside this file: the memory phase's rows)
from record_io import num, read_json, read_kv, read_text, read_tsv, train_rows  # noqa: E402

SCHEMA = "zebractl-gpu-check/1"
PHASES = ("setup", "perf", "memory", "tests", "parity", "eval")
DEFAULT_PHASES = ("perf", "tests", "parity", "eval")
"""What runs without PHASES; ``memory`` (the big models' peak memory, issue 27) only when named."""
PERF_RECIPES = ("kda_300M", "gdn_300M")
# the one-GPU 1B hybrids the perf phase trains as shipped on a GPU over 100 GB (check.sh PERF_BIG)
PERF_BIG = ("zebra_mamba_1B_hybrid_1gpu", "zebra_kda_1B_hybrid_1gpu")
CLAIM_VARIANT = "fla_shipped"
"""The FLA variant of the README's "x FLA shipped" ratios (FLA's class trained its way, its loss as
shipped); ``fla_tuned`` (our LM-head loss swapped in) is the one of its "x FLA tuned" ratios."""
VERSION_DISTS = {
    "torch": "torch",
    "triton": "triton",
    "fla": "flash-linear-attention",
    "fla_core": "fla-core",
    "megatron_core": "megatron-core",
    "tilelang": "tilelang",
    "transformers": "transformers",
    "lm_eval": "lm_eval",
    "pydantic": "pydantic",
    "numpy": "numpy",
}
FINGERPRINT_PARTS = ("zebractl", "benchmarks", "tests", "presets", "recipes", "schemas")
FINGERPRINT_FILES = ("pyproject.toml",)


_STAMP = re.compile(r"^\d\d:\d\d:\d\d(\.\d+)? ")
_ERROR = re.compile(r"(\w*(Error|Exception)\b|error:|Traceback|Killed|out of memory)")


def last_error(path: Path) -> str | None:
    """The last line of a log that names an error (timestamp removed), for a reason."""
    hits = [
        _STAMP.sub("", line).strip()
        for line in (read_text(path) or "").splitlines()
        if _ERROR.search(line) and "Traceback" not in line
    ]
    return hits[-1][:300] if hits else None


# ---- the phases' results


STEP_COLUMNS = ("phase", "step", "status", "rc", "seconds", "limit", "reason")
PHASE_COLUMNS = ("phase", "status", "t0", "t1", "reason")


def junit(path: Path) -> dict[str, Any] | None:
    """Counts, failed names and the slowest tests from pytest's --junitxml (None if unreadable)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failed, times = [], []
    for case in root.iter("testcase"):
        if not case.get("name"):
            continue  # the entry pytest leaves for the test a KeyboardInterrupt stopped
        name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
        kinds = {child.tag for child in case}
        if "error" in kinds:
            counts["errors"] += 1
            failed.append(name)
        elif "failure" in kinds:
            counts["failed"] += 1
            failed.append(name)
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
        times.append((num(case.get("time")) or 0.0, name))
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    seconds = sum(num(s.get("time")) or 0.0 for s in suites)
    slowest = [{"name": n, "seconds": round(t, 2)} for t, n in sorted(times, reverse=True)[:10]]
    return {
        **counts,
        "total": sum(counts.values()),
        "failed_names": failed,
        "slowest": slowest,
        "pytest_seconds": round(seconds, 2),
        "source": "junit",
    }


_VERBOSE = re.compile(
    r"(?:(?P<id1>\S+::\S+) (?P<s1>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b)"
    r"|(?:(?P<s2>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (?P<id2>\S+::\S+))"
)


def pytest_log(path: Path) -> dict[str, Any] | None:
    """Counts from pytest's -v / -rA lines when there is no junit XML (pytest was killed)."""
    status: dict[str, str] = {}
    for line in (read_text(path) or "").splitlines():
        m = _VERBOSE.search(line)
        if m:
            status[m.group("id1") or m.group("id2")] = m.group("s1") or m.group("s2")
    if not status:
        return None
    kind = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "errors"}
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for s in status.values():
        counts[kind.get(s, "skipped")] += 1
    return {
        **counts,
        "total": sum(counts.values()),
        "failed_names": [n for n, s in status.items() if s in ("FAILED", "ERROR")],
        "slowest": [],
        "pytest_seconds": None,
        "source": "log (no junit XML: pytest was stopped before writing it)",
    }


def ours_throughput(job: Path, recipe: str) -> dict[str, Any]:
    """Tokens/s and MFU of the steady iterations (2 and later) of `zebractl train RECIPE`."""
    rows = train_rows(job / "runs" / f"perf_{recipe}" / "metrics.jsonl")
    steady = [r for r in rows if (num(r.get("iteration")) or 0) >= 2 and num(r.get("tokens_per_s"))]
    if not steady:
        why = (
            "no metrics.jsonl"
            if not rows
            else f"only iteration(s) {[r.get('iteration') for r in rows]}"
        )
        return {"tokens_per_s": None, "mfu": None, "missing": f"no steady iteration logged ({why})"}
    tps = [num(r["tokens_per_s"]) for r in steady]
    mfu = [m for m in (num(r.get("mfu")) for r in steady) if m is not None]
    tfl = [t for t in (num(r.get("tflops_per_gpu")) for r in steady) if t is not None]
    mem = [g for g in (num(r.get("memory_gib")) for r in rows) if g is not None]
    return {
        "tokens_per_s": round(statistics.median(tps)),
        "mfu": round(statistics.median(mfu), 4) if mfu else None,
        "tflops_per_gpu": round(statistics.median(tfl), 1) if tfl else None,
        "peak_gib": round(max(mem), 2) if mem else None,
        "iterations": [r.get("iteration") for r in steady],
        "tokens_per_s_each": [round(x) for x in tps],
        "first_iteration_tokens_per_s": round(num(rows[0].get("tokens_per_s")) or 0)
        if rows and rows[0].get("iteration") == 1
        else None,
    }


def fla_throughput(job: Path, recipe: str, variants: list[str]) -> dict[str, Any]:
    """benchmarks/step_bench.py's rows for FLA's own class (each variant)."""
    rows = read_json(job / f"bench_{recipe}.json")
    rows = rows if isinstance(rows, list) else []
    out: dict[str, Any] = {}
    for v in variants:
        hit = [
            r
            for r in rows
            if isinstance(r, dict) and r.get("check") == "step" and r.get("impl") == v
        ]
        if not hit:
            out[v] = {"tokens_per_s": None, "missing": "not measured (no step_bench row)"}
            continue
        r = hit[0]
        if r.get("oom") or r.get("error"):
            why = "out of memory" if r.get("oom") else "error"
            out[v] = {"tokens_per_s": None, "missing": f"{why}: {r.get('error', '')}"[:300]}
            continue
        out[v] = {
            "tokens_per_s": r.get("tokens_per_s"),
            "mfu": r.get("mfu_plan"),
            "step_ms": r.get("step_ms"),
            "peak_gib": r.get("peak_gib"),
            "micro": r.get("micro"),
        }
    return out


def perf(job: Path, variants: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "method": "ours: `zebractl train RECIPE` (the recipe's engine, micro 64 = global 64, seq "
        "2048, real data), median of iterations 2-4 from metrics.jsonl; FLA: "
        "benchmarks/step_bench.py (FLA 0.6.0's class trained FLA's way: fp32 params, bf16 "
        "autocast, fused AdamW, clip 1.0; random tokens; median of 8 steps after 3) at micro 64 in "
        "the same job; ratio = ours / FLA. The README's 'x FLA shipped' ratios are against "
        f"{CLAIM_VARIANT}, its 'x FLA tuned' ones against fla_tuned.",
    }
    for recipe in PERF_RECIPES:
        ours = ours_throughput(job, recipe)
        fla = fla_throughput(job, recipe, variants)
        ratio = {
            v: round(ours["tokens_per_s"] / f["tokens_per_s"], 3)
            if ours["tokens_per_s"] and num(f.get("tokens_per_s"))
            else None
            for v, f in fla.items()
        }
        out[recipe] = {
            "ours": ours,
            "fla": fla,
            "ratio": ratio,
            "tokens_per_s": ours["tokens_per_s"],
            "mfu": ours["mfu"],
            "fla_tokens_per_s": fla.get(CLAIM_VARIANT, {}).get("tokens_per_s"),
            "ratio_vs_" + CLAIM_VARIANT: ratio.get(CLAIM_VARIANT),
        }
    out["micro16"] = _safe(micro16, job)
    out["save_stall"] = _safe(save_stall, job)
    out["big"] = _safe(big, job)
    return out


def big(job: Path) -> dict[str, Any]:
    """The one-GPU 1B hybrids as shipped (`zebractl train RECIPE`, the recipe's batch and
    sequence length): tokens/s and MFU of iterations 2-4, or why they were not run."""
    skipped = job / "perf_big_skipped.txt"
    out: dict[str, Any] = {}
    for recipe in PERF_BIG:
        if (job / "runs" / f"perf_{recipe}").is_dir():
            out[recipe] = ours_throughput(job, recipe)
        elif skipped.is_file():
            out[recipe] = {
                "tokens_per_s": None,
                "mfu": None,
                "missing": skipped.read_text().strip(),
            }
        else:
            out[recipe] = {"tokens_per_s": None, "mfu": None, "missing": "not run"}
    return out


def micro16(job: Path) -> dict[str, Any]:
    """bench_micro16.json: each preset's step at micro 16 (defaults), and the hybrids' MFU as a
    fraction of kda_300M's (issue 41 asks >= 0.9)."""
    rows = read_json(job / "bench_micro16.json")
    steps = (
        [r for r in rows if isinstance(r, dict) and r.get("check") == "step"]
        if isinstance(rows, list)
        else []
    )
    if not steps:
        return {"missing": "no bench_micro16.json rows"}
    out: dict[str, Any] = {
        r["preset"]: {
            k: r.get(k) for k in ("tokens_per_s", "mfu_plan", "peak_gib", "first_step_s", "error")
        }
        for r in steps
    }
    base = (out.get("kda_300M") or {}).get("mfu_plan")
    out["mfu_vs_kda_300M"] = {
        p: round(v["mfu_plan"] / base, 3)
        for p, v in out.items()
        if p != "kda_300M" and isinstance(v, dict) and v.get("mfu_plan") and base
    }
    return out


STALL = re.compile(
    r"training paused (\d+(?:\.\d+)?) s(?:, (\d+(?:\.\d+)?) s of it for the previous save)?"
    r"|saved \S+ in (\d+(?:\.\d+)?) s"
)
WRITTEN = re.compile(r"checkpoint \S+ complete in (\d+(?:\.\d+)?) s")


def save_stall(job: Path) -> dict[str, Any]:
    """The training pause of each checkpoint save of stall_kda_300M (the default save mode):
    ``pause_s`` as logged; ``own_s`` without the wait for the previous save to finish writing
    (a background save every few iterations of a short run waits for the one before: the pause a
    save itself costs is ``own_s``); ``write_s``: each background save's time to complete."""
    log = job / "logs" / "stall_kda_300M.log"
    if not log.is_file():
        return {"missing": "no stall_kda_300M log"}
    text = log.read_text(errors="replace")
    paused, own = [], []
    for a, waited, b in STALL.findall(text):
        total = float(a or b)
        paused.append(total)
        own.append(round(total - float(waited or 0), 2))
    mode = "async" if "training paused" in text else "blocking"
    return {
        "mode": mode,
        "pause_s": paused,
        "max_s": max(paused) if paused else None,
        "own_s": own,
        "max_own_s": max(own) if own else None,
        "write_s": [float(w) for w in WRITTEN.findall(text)],
    }


def parity(job: Path) -> dict[str, Any]:
    doc = read_json(job / "logs" / "parity_compare.out")
    if not isinstance(doc, dict):
        found = sorted((job / "runs").glob("parity_*/reports/compare-*/compare.json"))
        doc = read_json(found[-1]) if found else None
    train = read_json(job / "logs" / "parity_train.out")
    final_loss = train.get("final_loss") if isinstance(train, dict) else None
    if not isinstance(doc, dict):
        return {
            "iteration1_delta": None,
            "last_half_mean_abs_pct": None,
            "passed": None,
            "final_loss": final_loss,
            "missing": "no compare report",
        }
    tp = ((doc.get("throughput") or {}).get("ratio") or {}).get("tokens_per_s")
    loss = doc.get("loss") or []
    return {
        "iteration1_delta": doc.get("iteration1_delta"),
        "last_half_mean_abs_pct": doc.get("last_half_mean_abs_pct"),
        "passed": doc.get("passed"),
        "checks": [
            {k: c.get(k) for k in ("name", "value", "tolerance", "ok")}
            for c in doc.get("checks") or []
            if isinstance(c, dict)
        ],
        "iterations": (doc.get("a") or {}).get("iterations"),
        "last_loss": {"a": loss[-1].get("a"), "b": loss[-1].get("b")}
        if loss and isinstance(loss[-1], dict)
        else None,
        "final_loss": final_loss,
        "throughput_ratio": tp,
        "note": "throughput_ratio ran beside the tests phase: not a performance figure",
    }


def evaluation(job: Path, task: str | None, limit: str | None) -> dict[str, Any]:
    doc = read_json(job / "logs" / "eval.out")
    base = {"task": task, "limit": int(limit) if (limit or "").isdigit() else None}
    if not isinstance(doc, dict):
        return {
            **base,
            "acc": None,
            "acc_norm": None,
            "eval_wall_s": None,
            "missing": "no eval report",
        }
    tasks = [t for t in doc.get("tasks") or [] if isinstance(t, dict)]
    t = next((x for x in tasks if x.get("task") == task), tasks[0] if tasks else {})
    metrics = t.get("metrics") or {}

    def value(name: str) -> float | None:
        m = metrics.get(name)
        return m.get("value") if isinstance(m, dict) else None

    def stderr(name: str) -> float | None:
        m = metrics.get(name)
        return m.get("stderr") if isinstance(m, dict) else None

    return {
        "task": t.get("task", task),
        "task_status": t.get("status"),
        "task_reason": t.get("reason"),
        "acc": value("acc"),
        "acc_stderr": stderr("acc"),
        "acc_norm": value("acc_norm"),
        "acc_norm_stderr": stderr("acc_norm"),
        "samples": t.get("samples"),
        "limit": doc.get("limit", base["limit"]),
        "eval_wall_s": doc.get("wall_seconds"),
        "model_class": doc.get("model_class"),
        "device": doc.get("device"),
        "dtype": doc.get("dtype"),
        "lm_eval_version": doc.get("lm_eval_version"),
    }


def gpu(job: Path) -> dict[str, Any]:
    lines = [x for x in (read_text(job / "gpu.csv") or "").splitlines() if x.strip()]
    if not lines:
        return {
            "name": None,
            "memory_mib": None,
            "driver": None,
            "count": 0,
            "reason": "nvidia-smi gave nothing",
        }
    cells = [c.strip() for c in lines[0].split(",")]
    cells += [""] * (3 - len(cells))
    mem = num(cells[1])
    return {
        "name": cells[0] or None,
        "memory_mib": int(mem) if mem else None,
        "driver": cells[2] or None,
        "count": len(lines),
    }


# ---- the record


def _step_reason(step: dict[str, str], job: Path) -> str:
    if step["status"] == "timeout":
        return f"{step['step']} stopped at its time limit ({step['limit']} s)"
    if step["status"] == "skipped":
        return f"{step['step']} not run: {step['reason']}"
    err = last_error(job / "logs" / f"{step['step']}.log") or last_error(
        job / "logs" / f"{step['step']}.out"
    )
    return f"{step['step']} exited {step['rc']}" + (f": {err}" if err else "")


def build(job: Path, partial: bool = False) -> dict[str, Any]:
    """The record of the job folder ``job`` (``partial``: the job is still running)."""
    meta = read_kv(job / "meta.env")
    src = read_kv(job / "source.env")
    steps = read_tsv(job / "steps.tsv", STEP_COLUMNS)
    ended = {r["phase"]: r for r in read_tsv(job / "phases.tsv", PHASE_COLUMNS)}
    requested = (meta.get("PHASES") or " ".join(DEFAULT_PHASES)).split()
    variants = (meta.get("FLA_VARIANTS") or f"{CLAIM_VARIANT} fla_tuned").split()
    variants = [v for v in variants if v != "none"]  # CHECK_FLA_VARIANTS=none: no step_bench
    asked = (meta.get("PERF_RECIPES") or " ".join(PERF_RECIPES)).split()
    t0 = num(meta.get("T0"))
    t_end = num(meta.get("T_END")) or (time.time() if partial else None)

    sections: dict[str, Any] = {
        "perf": _safe(perf, job, variants),
        "tests": _safe(junit, job / "junit.xml"),
        "parity": _safe(parity, job),
        "eval": _safe(evaluation, job, meta.get("EVAL_TASK"), meta.get("EVAL_LIMIT")),
        "memory": _safe(record_memory.memory, job, steps),
    }
    if "missing" in sections["perf"]:  # unreadable: the per-recipe shape, all null
        why = sections["perf"]["missing"]
        sections["perf"] = {
            r: {"ours": {"tokens_per_s": None, "missing": why}, "fla": {}, "ratio": {}}
            for r in PERF_RECIPES
        }
    if not sections["tests"] or "missing" in sections["tests"]:
        sections["tests"] = _safe(pytest_log, job / "logs" / "tests.log")
        if sections["tests"] and "missing" in sections["tests"]:
            sections["tests"] = None
    phases: dict[str, dict[str, Any]] = {}
    for name in PHASES:
        row = ended.get(name)
        mine = [s for s in steps if s["phase"] == name]
        info: dict[str, Any] = {
            "steps": [
                {
                    "step": s["step"],
                    "status": s["status"],
                    "rc": num(s["rc"]),
                    "seconds": num(s["seconds"]),
                    "limit": num(s["limit"]),
                    **({"reason": _step_reason(s, job)} if s["status"] != "ok" else {}),
                }
                for s in mine
            ],
        }
        if row is not None:
            a, b = num(row["t0"]), num(row["t1"])
            info.update(
                status=row["status"],
                reason=row["reason"] or None,
                wall_s=round(b - a, 1) if a is not None and b is not None else None,
            )
        elif name != "setup" and name not in requested:
            info.update(status="skipped", reason="not in PHASES", wall_s=None)
        elif partial:
            info.update(status="pending", reason="the job is still running", wall_s=None)
        else:
            info.update(
                status="failed",
                reason="no status: the job stopped before this phase ended",
                wall_s=None,
            )
        bad = [s for s in mine if s["status"] not in ("ok",)]
        if info["status"] == "failed" and not info.get("reason") and bad:
            info["reason"] = "; ".join(_step_reason(s, job) for s in bad)
        phases[name] = info

    _refine(phases, sections, steps, job, asked)
    for name in ("perf", "memory", "tests", "parity", "eval"):
        sections[name] = {
            **(sections[name] or {}),
            "status": phases[name]["status"],
            "reason": phases[name].get("reason"),
            "wall_s": phases[name].get("wall_s"),
        }

    commit = src.get("COMMIT") or "unknown"
    dirty = {"1": True, "0": False}.get(src.get("DIRTY", ""))
    wall = {n: phases[n].get("wall_s") for n in PHASES}
    wall["total"] = round(t_end - t0, 1) if t0 is not None and t_end is not None else None
    return {
        "schema": SCHEMA,
        "complete": not partial,
        "commit": commit,
        "dirty": dirty,
        "dirty_paths": [x for x in (read_text(job / "dirty.txt") or "").splitlines() if x][:100],
        "tree_fingerprint": src.get("FINGERPRINT") or None,
        "date": meta.get("DATE") or None,
        "mode": meta.get("MODE") or None,
        "dry_run": meta.get("DRY_RUN") == "1",
        "budget_s": num(meta.get("BUDGET")),
        "phases_requested": requested,
        "xdist": meta.get("XDIST") or None,
        "gpu": gpu(job),
        "gpu_processes_before_perf": _gpu_apps(job),
        "versions": read_json(job / "versions.json"),
        "kernel_cache": read_json(job / "kernel_cache.json"),
        "wall_s": wall,
        "phases": {
            n: {k: phases[n].get(k) for k in ("status", "reason", "wall_s")} for n in PHASES
        },
        "setup": {
            "status": phases["setup"]["status"],
            "reason": phases["setup"].get("reason"),
            "wall_s": phases["setup"].get("wall_s"),
            "steps": phases["setup"]["steps"],
        },
        "tests": {**sections["tests"], "steps": phases["tests"]["steps"]},
        "perf": {**sections["perf"], "steps": phases["perf"]["steps"]},
        "parity": {**sections["parity"], "steps": phases["parity"]["steps"]},
        "eval": {**sections["eval"], "steps": phases["eval"]["steps"]},
        "memory": {**sections["memory"], "steps": phases["memory"]["steps"]},
    }


def _safe(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or {"missing": why} when its input is malformed in a way nothing foresaw: a
    record is written whatever the job left behind."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001
        return {"missing": f"could not read it: {type(exc).__name__}: {exc}"[:300]}


def _gpu_apps(job: Path) -> int | None:
    text = read_text(job / "gpu_apps_before_perf.csv")
    return None if text is None else len([x for x in text.splitlines() if x.strip()])


COLLECTED = re.compile(
    r"(\d+) workers \[(\d+) items?\]"
    r"|collected (\d+) items?(?: / (\d+) deselected)?(?: / (\d+) selected)?"
)


def _selected(job: Path) -> int | None:
    """How many tests pytest was to run (its collection line in logs/tests.log), or None."""
    text = read_text(job / "logs" / "tests.log") or ""
    m = COLLECTED.search(text)
    if m is None:
        return None
    if m.group(2):
        return int(m.group(2))
    collected, deselected, selected = (int(g) if g else None for g in m.group(3, 4, 5))
    if selected is not None:
        return selected
    return collected - (deselected or 0) if collected is not None else None


def _refine(
    phases: dict, sections: dict, steps: list[dict[str, str]], job: Path, asked: list[str]
) -> None:
    """A phase whose commands exited 0 is ok only if its results are there; a failure's reason
    says what the results say (failed tests, tolerances) before what the exit code says."""
    t = phases["tests"]
    res = sections["tests"]
    if t["status"] in ("ok", "failed") and res is not None:
        timed_out = any(s["phase"] == "tests" and s["status"] == "timeout" for s in steps)
        selected = _selected(job)
        # every selected test reported: pytest had ended, its process only just after the limit
        cut = timed_out and not (selected is not None and res["total"] >= selected)
        res["selected"] = selected
        res["interrupted"] = cut
        what = [
            f"{res['failed']} failed" if res["failed"] else "",
            f"{res['errors']} errors" if res["errors"] else "",
        ]
        what = [w for w in what if w]
        if what or cut:
            t["status"] = "failed"
            t["reason"] = (
                ", ".join(what)
                + ("; " if what and cut else "")
                + (f"stopped at the time limit after {res['total']} tests" if cut else "")
            )
        elif res["total"] == 0:
            t["status"], t["reason"] = "failed", "pytest collected no tests"
        elif res["passed"] == 0:
            t["status"] = "failed"
            t["reason"] = f"no test passed ({res['skipped']} skipped)"
        elif timed_out:  # the limit was the phase's only failure, and it cut nothing
            t["status"], t["reason"] = "ok", None
    elif t["status"] == "ok" and res is None:
        t["status"], t["reason"] = "failed", "pytest exited 0 but left no junit XML or log"

    p = phases["perf"]
    if p["status"] in ("ok", "failed"):
        missing = []
        for recipe in (r for r in PERF_RECIPES if r in asked):  # CHECK_PERF_RECIPES's
            r = sections["perf"][recipe]
            if r["ours"]["tokens_per_s"] is None:
                missing.append(f"{recipe} ours: {r['ours'].get('missing')}")
            for v, f in r["fla"].items():
                if f.get("tokens_per_s") is None:
                    missing.append(f"{recipe} {v}: {f.get('missing')}")
        if missing:
            p["status"] = "failed"
            p["reason"] = "; ".join(filter(None, [p.get("reason"), *missing]))

    q = phases["parity"]
    par = sections["parity"]
    if q["status"] in ("ok", "failed"):
        if par.get("passed") is False:
            bad = [c for c in par.get("checks") or [] if c.get("ok") is False]
            q["status"] = "failed"
            q["reason"] = (
                "outside tolerance: "
                + "; ".join(
                    f"{c.get('name')} {_g(c.get('value'))} > {_g(c.get('tolerance'))}" for c in bad
                )
                if bad
                else (q.get("reason") or "compare did not pass")
            )
        elif par.get("passed") is None:
            q["status"] = "failed"
            q["reason"] = q.get("reason") or par.get("missing") or "no compare report"

    e = phases["eval"]
    ev = sections["eval"]
    if e["status"] == "ok" and ev.get("acc") is None and ev.get("acc_norm") is None:
        e["status"] = "failed"
        e["reason"] = ev.get("task_reason") or ev.get("missing") or "no accuracy in the eval report"


def _g(x: Any) -> str:
    return f"{x:.3g}" if num(x) is not None else str(x)


def record_name(record: dict[str, Any], partial: bool = False) -> str:
    date = (record.get("date") or time.strftime("%Y-%m-%dT", time.gmtime()))[:10]
    commit = re.sub(r"[^A-Za-z0-9._-]", "-", str(record.get("commit") or "unknown"))
    return f"{date}-{commit}" + (".partial" if partial else "") + ".json"


def write(job: Path, outdir: Path, partial: bool = False) -> Path:
    record = build(job, partial)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / record_name(record, partial)
    path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return path


# ---- the status table


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if num(x) is not None else "n/a"


def _int(x: Any) -> str:
    return f"{x:.0f}" if num(x) is not None else "n/a"


def _tps(x: Any) -> str:
    return f"{x:,.0f}" if num(x) is not None else "n/a"


def summary(record: dict[str, Any]) -> str:
    rows = []
    wall = record.get("wall_s") or {}
    g = record.get("gpu") or {}
    kc = record.get("kernel_cache") or {}
    setup_note = f"{g.get('name') or 'no GPU'}"
    if isinstance(kc, dict) and kc.get("cuda"):
        setup_note += (
            f"; {kc.get('seeded', 0)} tuned configs seeded ({kc.get('shipped') or 'none ship'})"
        )
    rows.append(("setup", record.get("setup") or {}, setup_note))
    p = record.get("perf") or {}
    notes = []
    for recipe in PERF_RECIPES:
        r = p.get(recipe) or {}
        ratio = r.get("ratio") or {}
        fla = r.get("fla") or {}
        parts = [f"{recipe} {_tps(r.get('tokens_per_s'))} tok/s MFU {_pct(r.get('mfu'))}"]
        for v in fla:
            x = ratio.get(v)
            parts.append(f"{x:.2f}x {v}" if x is not None else f"{v} n/a")
        notes.append(", ".join(parts))
    for recipe, r in (p.get("big") or {}).items():
        if isinstance(r, dict) and r.get("tokens_per_s") is not None:
            notes.append(f"{recipe} {_tps(r['tokens_per_s'])} tok/s MFU {_pct(r.get('mfu'))}")
    rows.append(("perf", p, " | ".join(notes)))
    t = record.get("tests") or {}
    rows.append(
        (
            "tests",
            t,
            f"{t.get('passed', 'n/a')} passed, {t.get('failed', 'n/a')} failed, "
            f"{t.get('errors', 'n/a')} errors, {t.get('skipped', 'n/a')} skipped",
        )
    )
    q = record.get("parity") or {}
    d1, lh = num(q.get("iteration1_delta")), num(q.get("last_half_mean_abs_pct"))
    verdict = {True: "PASS", False: "FAIL"}.get(q.get("passed"), "n/a")
    rows.append(
        (
            "parity",
            q,
            f"iter-1 Δ {d1:.2e}, last-half |Δ%| {lh:.4f}, {verdict}"
            if d1 is not None and lh is not None
            else f"{verdict}",
        )
    )
    mem = record.get("memory") or {}
    if mem.get("reason") != "not in PHASES":
        parts = [
            f"{r.get('recipe')} m{r.get('micro')} {r.get('recompute')}: "
            + (
                f"{_tps(r.get('tokens_per_s'))} tok/s, peak {r.get('peak_gib')} GiB, plan "
                f"{r.get('plan_gib')} ({_pct(r.get('plan_error'))})"
                + (f", --check memory {r['check'].get('memory')}" if r.get("check") else "")
                if r.get("peak_gib") is not None
                else str(r.get("reason") or r.get("status"))[:80]
            )
            for r in mem.get("runs") or []
        ]
        rows.append(("memory", mem, " | ".join(parts) or "no runs"))
    e = record.get("eval") or {}
    acc, accn = num(e.get("acc")), num(e.get("acc_norm"))
    rows.append(
        (
            "eval",
            e,
            f"{e.get('task')} acc {acc:.3f} acc_norm {accn:.3f} (limit {e.get('limit')})"
            if acc is not None and accn is not None
            else f"{e.get('task')}",
        )
    )
    lines = [f"{'phase':<7} {'status':<8} {'wall':>7}  result"]
    for name, sec, note in rows:
        w = sec.get("wall_s")
        ws = f"{w:.0f}s" if num(w) is not None else "-"
        lines.append(f"{name:<7} {sec.get('status') or '?':<8} {ws:>7}  {note}")
        if sec.get("status") not in ("ok", None) and sec.get("reason"):
            lines.append(f"{'':<7} reason: {str(sec['reason'])[:400]}")
    tot = wall.get("total")
    lines.append(
        f"{'total':<7} {'':<8} {(f'{tot:.0f}s' if num(tot) is not None else '-'):>7}  "
        f"commit {record.get('commit')}{' (dirty)' if record.get('dirty') else ''}, "
        f"budget {_int(record.get('budget_s'))} s, {'complete' if record.get('complete') else 'PARTIAL'}"
    )
    return "\n".join(lines)


# ---- helpers for check.sh


def versions() -> dict[str, Any]:
    import importlib.metadata as md
    import platform

    out: dict[str, Any] = {"python": platform.python_version()}
    for key, dist in VERSION_DISTS.items():
        try:
            out[key] = md.version(dist)
        except md.PackageNotFoundError:
            out[key] = None
        except Exception as exc:  # noqa: BLE001 - a broken install is a value, not a crash
            out[key] = f"unreadable: {exc}"[:100]
    return out


def fingerprint(root: Path) -> str:
    """sha256 (12 hex) over the paths and contents of the source files (FINGERPRINT_PARTS; no
    caches, no results): the same tree gives the same value here and on the device."""
    h = hashlib.sha256()
    files = [root / f for f in FINGERPRINT_FILES if (root / f).is_file()]
    for part in FINGERPRINT_PARTS:
        base = root / part
        if base.is_dir():
            files += [
                p
                for p in base.rglob("*")
                if p.is_file()
                and "__pycache__" not in p.parts
                and not p.name.endswith(".pyc")
                and "results" not in p.relative_to(root).parts[:2]
            ]
    for p in sorted(set(files)):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        with contextlib.suppress(OSError):
            h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:12]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "write" and len(args) >= 2:
        path = write(Path(args[0]), Path(args[1]), partial="--partial" in args)
        print(path)
    elif cmd == "summary" and args:
        print(summary(read_json(Path(args[0])) or {}))
    elif cmd == "versions":
        print(json.dumps(versions(), indent=1))
    elif cmd == "fingerprint":
        print(fingerprint(Path(args[0] if args else os.getcwd())))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""benchmarks/device/check_record.py: the GPU check's record from a job folder, on synthetic logs,
junit XML and metrics (CPU). A finished job, a partial one, and one whose phases failed or never ran
must each give a record with the right numbers, statuses and reasons, and never raise."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/device/check_record.py"


@pytest.fixture(scope="module")
def cr():
    spec = importlib.util.spec_from_file_location("check_record", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_record"] = mod
    spec.loader.exec_module(mod)
    return mod


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5" time="301.5">
<testcase classname="tests.model.test_lm_head" name="test_gpu_fla_path" time="12.5"/>
<testcase classname="tests.convert.test_convert" name="test_gpu_verify[tiny_kda]" time="150.25">
  <failure message="assert">AssertionError: tiers</failure></testcase>
<testcase classname="tests.train.test_engine_gpu" name="test_resume" time="80.0">
  <error message="fixture">RuntimeError: boom</error></testcase>
<testcase classname="tests.train.test_engine_gpu" name="test_two_gpus" time="0.01">
  <skipped message="needs two GPUs"/></testcase>
<testcase classname="tests.train.test_precompile" name="test_gpu_runs" time="58.7"/>
<testcase time="0.001"/>
</testsuite></testsuites>
"""


def _row(it: int, tps: float, mfu: float) -> str:
    return json.dumps({"kind": "train", "iteration": it, "loss": 11.0 - it, "tokens_per_s": tps,
                       "mfu": mfu, "tflops_per_gpu": mfu * 989, "memory_gib": 70.0 + it,
                       "consumed_samples": 64 * it, "wall_time": 1e9 + it, "run_id": "x"})  # fmt: skip


def _job(tmp: Path, *, phases: str = "perf tests parity eval", done: bool = True) -> Path:
    job = tmp / "job"
    (job / "logs").mkdir(parents=True)
    t0 = 1_800_000_000
    (job / "meta.env").write_text(
        f"MODE=device\nDATE=2026-12-02T10:00:00Z\nT0={t0}\nBUDGET=720\nPHASES={phases}\n"
        "XDIST=\nDRY_RUN=0\nFLA_VARIANTS=fla_shipped fla_tuned\nEVAL_TASK=arc_easy\n"
        "EVAL_LIMIT=100\nGPU_OK=1\nGPU_REASON=\n" + (f"T_END={t0 + 700}\n" if done else "")
    )
    (job / "source.env").write_text("COMMIT=433915c\nDIRTY=1\nFINGERPRINT=abcdef012345\n")
    (job / "dirty.txt").write_text(" M README.md\n?? new.py\n")
    (job / "gpu.csv").write_text("NVIDIA H200, 143771, 580.159.04\n")
    (job / "gpu_apps_before_perf.csv").write_text("")
    (job / "versions.json").write_text(json.dumps({"python": "3.12.3", "torch": "2.11.0+cu130"}))
    (job / "kernel_cache.json").write_text(
        json.dumps({"cuda": True, "seeded": 128, "shipped": "nvidia-h200_x.tar.xz"})
    )
    steps = [
        ("setup", "setup_copy", "ok", "0", "1", "60", ""),
        ("perf", "perf_kda_300M", "ok", "0", "80", "150", ""),
        ("perf", "perf_gdn_300M", "ok", "0", "70", "120", ""),
        ("perf", "bench_kda_300M", "ok", "0", "60", "120", ""),
        ("perf", "bench_gdn_300M", "failed", "1", "20", "120", "exit 1"),
        ("tests", "tests", "timeout", "124", "380", "380", "stopped at the time limit (380 s)"),
        ("parity", "parity_train", "ok", "0", "70", "180", ""),
        ("parity", "parity_compare", "failed", "3", "90", "200", "exit 3"),
    ]
    (job / "steps.tsv").write_text("".join("\t".join(s) + "\n" for s in steps))
    ph = [("setup", "ok", t0, t0 + 50, ""), ("perf", "failed", t0 + 50, t0 + 330, "bench_gdn_300M exited 1"),
          ("parity", "failed", t0 + 330, t0 + 500, "compare: outside tolerance"),
          ("tests", "failed", t0 + 330, t0 + 710, "pytest stopped at its time limit")]  # fmt: skip
    if done:
        ph.append(("eval", "ok", t0 + 500, t0 + 560, ""))
    (job / "phases.tsv").write_text("".join("\t".join(map(str, p)) + "\n" for p in ph))
    (job / "junit.xml").write_text(JUNIT)
    (job / "logs/tests.log").write_text(
        "10:00:01.000 tests/model/test_lm_head.py::test_gpu PASSED\n"
    )
    (job / "logs/bench_gdn_300M.log").write_text(
        "10:05:00.000 Traceback (most recent call last):\n"
        "10:05:00.001 torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
    )
    for recipe, base in (("kda_300M", 220_000.0), ("gdn_300M", 233_000.0)):
        run = job / "runs" / f"perf_{recipe}"
        run.mkdir(parents=True)
        rows = [_row(1, 900.0, 0.002)] + [
            _row(i, base + 1000 * i, 0.40 + i / 1000) for i in (2, 3, 4)
        ]
        rows.insert(2, json.dumps({"kind": "val", "iteration": 2, "val_loss": 9.0}))
        (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (job / "bench_kda_300M.json").write_text(json.dumps([
        {"env": "versions", "torch": "2.11.0"},
        {"check": "step", "preset": "kda_300M", "impl": "fla_shipped", "micro": 64,
         "tokens_per_s": 104_000, "mfu_plan": 0.19, "step_ms": 1260.0, "peak_gib": 94.1},
        {"check": "step", "preset": "kda_300M", "impl": "fla_tuned", "micro": 64,
         "tokens_per_s": 205_000, "mfu_plan": 0.38, "step_ms": 640.0, "peak_gib": 86.3},
    ]))  # fmt: skip
    compare = {
        "a": {"iterations": 30}, "b": {"iterations": 30},
        "loss": [{"iteration": 1, "a": 11.95, "b": 11.95}, {"iteration": 30, "a": 7.81, "b": 7.83}],
        "iteration1_delta": 2.5e-4, "last_half_mean_abs_pct": 1.7,
        "throughput": {"ratio": {"tokens_per_s": 1.1}},
        "checks": [
            {"name": "iteration1_abs", "what": "x", "value": 2.5e-4, "tolerance": 1e-3, "ok": True},
            {"name": "last_half_pct", "what": "y", "value": 1.7, "tolerance": 1.0, "ok": False},
        ],
        "passed": False,
    }  # fmt: skip
    (job / "logs/parity_compare.out").write_text("noise before\n" + json.dumps(compare, indent=2))
    (job / "logs/parity_train.out").write_text(json.dumps({"final_loss": 7.81}))
    if done:
        (job / "logs/eval.out").write_text(json.dumps({
            "limit": 100, "wall_seconds": 41.5, "model_class": "KDAForCausalLM", "device": "cuda",
            "dtype": "bf16", "lm_eval_version": "0.4.13",
            "tasks": [{"task": "arc_easy", "status": "ok", "samples": 100, "metrics": {
                "acc": {"value": 0.33, "stderr": 0.047}, "acc_norm": {"value": 0.31, "stderr": 0.046}}}],
        }))  # fmt: skip
    return job


def test_a_finished_job_gives_the_numbers_statuses_and_reasons(cr, tmp_path):
    job = _job(tmp_path)
    path = cr.write(job, tmp_path / "out")
    assert path.name == "2026-12-02-433915c.json"
    rec = json.loads(path.read_text())
    assert rec["complete"] and rec["commit"] == "433915c" and rec["dirty"] is True
    assert rec["dirty_paths"] == [" M README.md", "?? new.py"]
    assert rec["gpu"] == {"name": "NVIDIA H200", "memory_mib": 143771, "driver": "580.159.04",
                          "count": 1}  # fmt: skip
    assert rec["gpu_processes_before_perf"] == 0

    t = rec["tests"]
    assert (t["passed"], t["failed"], t["errors"], t["skipped"], t["total"]) == (2, 1, 1, 1, 5)
    assert t["failed_names"] == [
        "tests.convert.test_convert::test_gpu_verify[tiny_kda]",
        "tests.train.test_engine_gpu::test_resume",
    ]
    assert [s["seconds"] for s in t["slowest"][:3]] == [150.25, 80.0, 58.7]
    assert t["status"] == "failed" and t["interrupted"] is True
    assert t["reason"] == "1 failed, 1 errors; stopped at the time limit after 5 tests"

    kda = rec["perf"]["kda_300M"]
    assert kda["tokens_per_s"] == 223_000  # median of iterations 2-4 (222k, 223k, 224k), not 1
    assert kda["ours"]["iterations"] == [2, 3, 4]
    assert kda["mfu"] == pytest.approx(0.403)
    assert kda["ratio"] == {"fla_shipped": 2.144, "fla_tuned": 1.088}
    assert kda["fla_tokens_per_s"] == 104_000 and kda["ratio_vs_fla_shipped"] == 2.144
    gdn = rec["perf"]["gdn_300M"]
    assert gdn["tokens_per_s"] == 236_000 and gdn["ratio"] == {
        "fla_shipped": None,
        "fla_tuned": None,
    }
    assert rec["perf"]["status"] == "failed"
    reason = rec["perf"]["reason"]
    assert "bench_gdn_300M exited 1" in reason and "gdn_300M fla_shipped: not measured" in reason
    step = next(s for s in rec["perf"]["steps"] if s["step"] == "bench_gdn_300M")
    assert "CUDA out of memory" in step["reason"]

    p = rec["parity"]
    assert p["iteration1_delta"] == 2.5e-4 and p["last_half_mean_abs_pct"] == 1.7
    assert p["passed"] is False and p["status"] == "failed"
    assert p["reason"] == "outside tolerance: last_half_pct 1.7 > 1"
    assert p["final_loss"] == 7.81 and p["last_loss"] == {"a": 7.81, "b": 7.83}

    e = rec["eval"]
    assert (e["status"], e["acc"], e["acc_norm"], e["limit"], e["eval_wall_s"]) == (
        "ok", 0.33, 0.31, 100, 41.5
    )  # fmt: skip
    assert rec["wall_s"] == {"setup": 50.0, "perf": 280.0, "memory": None, "tests": 380.0,
                             "parity": 170.0, "eval": 60.0, "total": 700.0}  # fmt: skip
    assert rec["phases"]["setup"]["status"] == "ok"

    table = cr.summary(rec)
    assert table.splitlines()[-1].startswith("total") and "700s" in table
    assert "kda_300M 223,000 tok/s MFU 40.3%, 2.14x fla_shipped, 1.09x fla_tuned" in table
    assert "iter-1 Δ 2.50e-04, last-half |Δ%| 1.7000, FAIL" in table
    assert "arc_easy acc 0.330 acc_norm 0.310 (limit 100)" in table


def test_a_partial_or_broken_job_never_crashes(cr, tmp_path):
    job = _job(tmp_path, done=False)
    (job / "junit.xml").write_text("<testsuites><testsuite")  # pytest was killed mid-write
    (job / "logs/tests.log").write_text(
        "10:00:01.000 tests/model/test_lm_head.py::test_a PASSED                    [ 10%]\n"
        "10:00:02.000 [gw1] [ 20%] FAILED tests/convert/test_convert.py::test_b[tiny_gdn]\n"
        "10:00:03.000 tests/train/test_engine_gpu.py::test_c SKIPPED (needs two GPUs)\n"
    )
    (job / "bench_kda_300M.json").write_text("{not json")
    (job / "runs/perf_gdn_300M/metrics.jsonl").write_text(_row(1, 900.0, 0.002) + "\n")
    (job / "logs/parity_compare.out").unlink()
    rec = json.loads(cr.write(job, tmp_path / "out", partial=True).read_text())
    assert not rec["complete"]
    t = rec["tests"]
    assert (t["passed"], t["failed"], t["skipped"]) == (1, 1, 1) and t["source"].startswith("log")
    assert t["failed_names"] == ["tests/convert/test_convert.py::test_b[tiny_gdn]"]
    assert rec["eval"]["status"] == "pending" and rec["eval"]["acc"] is None
    assert rec["perf"]["gdn_300M"]["ours"]["missing"].startswith("no steady iteration")
    assert rec["perf"]["kda_300M"]["fla"]["fla_shipped"]["tokens_per_s"] is None
    assert rec["parity"]["passed"] is None and rec["parity"]["status"] == "failed"
    assert rec["wall_s"]["total"] is not None  # up to now

    # nothing at all but the meta: every phase has a status and a reason, no exception
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "meta.env").write_text("PHASES=perf eval\nDATE=2026-12-03T00:00:00Z\n")
    rec = cr.build(empty)
    assert rec["commit"] == "unknown" and rec["dirty"] is None
    assert rec["tests"]["status"] == "skipped" and rec["tests"]["reason"] == "not in PHASES"
    assert rec["perf"]["status"] == "failed" and "job stopped" in rec["perf"]["reason"]
    assert rec["gpu"]["name"] is None
    assert "total" in cr.summary(rec) and cr.summary({}).splitlines()[-1].startswith("total")
    assert cr.record_name(rec) == "2026-12-03-unknown.json"


def test_skipped_phases_keep_their_reason_and_the_cli_works(cr, tmp_path):
    job = _job(tmp_path)
    (job / "phases.tsv").write_text(
        "setup\tok\t1\t2\t\nperf\tskipped\t2\t2\tno CUDA GPU: no nvidia-smi\n"
        "tests\tskipped\t2\t2\tdry run (CHECK_DRY_RUN=1): commands in logs/, none run\n"
        "parity\tskipped\t2\t2\tno CUDA GPU\neval\tskipped\t2\t2\tno .whl/eval-cp312.tar.xz\n"
    )
    out = subprocess.run([sys.executable, str(SCRIPT), "write", str(job), str(tmp_path / "o")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    rec = json.loads(Path(out.stdout.strip()).read_text())
    assert [rec[p]["status"] for p in ("perf", "tests", "parity", "eval")] == ["skipped"] * 4
    assert rec["perf"]["reason"] == "no CUDA GPU: no nvidia-smi"
    assert rec["eval"]["reason"] == "no .whl/eval-cp312.tar.xz"
    assert rec["tests"]["reason"].startswith("dry run")
    table = subprocess.run([sys.executable, str(SCRIPT), "summary", out.stdout.strip()],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "reason: no CUDA GPU: no nvidia-smi" in table
    versions = json.loads(subprocess.run([sys.executable, str(SCRIPT), "versions"],
                                         capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert versions["python"].count(".") == 2 and "megatron_core" in versions
    fp = cr.fingerprint(ROOT)
    assert len(fp) == 12 and fp == cr.fingerprint(ROOT)


def test_malformed_reports_are_reasons_not_exceptions(cr, tmp_path):
    job = _job(tmp_path)
    (job / "logs/parity_compare.out").write_text(json.dumps({
        "passed": False, "loss": "oops", "throughput": None, "a": None,
        "checks": [{"name": "last_half_pct", "ok": False, "value": None}, "not a check"],
    }))  # fmt: skip
    (job / "logs/eval.out").write_text("[1, 2]")
    with (job / "runs/perf_kda_300M/metrics.jsonl").open("a") as f:
        f.write('{"kind": "train", "iteration": "x", "tokens_per_s": "fast"}\n[]\n')
    (job / "bench_kda_300M.json").write_text(json.dumps([{"check": "step", "impl": "fla_tuned"}]))
    rec = cr.build(job)
    assert rec["parity"]["status"] == "failed" and rec["parity"]["last_loss"] is None
    assert rec["parity"]["reason"] == "outside tolerance: last_half_pct None > None"
    assert rec["eval"]["status"] == "failed" and rec["eval"]["reason"] == "no eval report"
    assert rec["perf"]["kda_300M"]["tokens_per_s"] == 223_000
    assert rec["perf"]["kda_300M"]["ratio"] == {"fla_shipped": None, "fla_tuned": None}
    json.dumps(rec, allow_nan=False)
    assert "parity" in cr.summary(rec)


def test_the_memory_phase_gives_peak_throughput_and_the_plans_error(cr, tmp_path):
    """PHASES=memory (issue 27): one row per run of memory_runs.tsv: the median tokens/s and MFU
    after the first two iterations, the peak memory_gib, the plan's total and plan / peak - 1; a
    run that was cut or never logged is a row of nulls with the reason."""
    job = _job(tmp_path, phases="memory")
    ok, cut = "memory_zebra_kda_1B_hybrid_m13_selective", "memory_zebra_mamba_3B_hybrid_m20_full"
    shipped = "memory_zebra_kda_1B_hybrid_1gpu_m8_shipped"
    other = "memory_zebra_kda_1B_hybrid_1gpu_m16_shipped"  # another micro-batch: not as shipped
    (job / "memory_runs.tsv").write_text(
        f"{ok}\tzebra_kda_1B_hybrid\t13\tselective\t\n"
        f"{cut}\tzebra_mamba_3B_hybrid\t20\tfull\tmodel.num_blocks=4,kernels.precompile=false\n"
        f"{shipped}\tzebra_kda_1B_hybrid_1gpu\t8\tshipped\t\tyes\n"
        f"{other}\tzebra_kda_1B_hybrid_1gpu\t16\tshipped\t\tno\n"
    )
    (job / f"{shipped}.plan.json").write_text(
        json.dumps({"memory_per_gpu": {"total_gib": 112.1, "recompute": "none"}})
    )
    memory_row = {"name": "memory", "status": "ok", "detail": "estimate 112.1 GiB per GPU"}
    (job / "check_zebra_kda_1B_hybrid_1gpu.json").write_text(
        "a warning first\n" + json.dumps({"ok": True, "checks": [memory_row]})
    )
    runs = job / "runs" / ok
    runs.mkdir(parents=True)
    (runs / "metrics.jsonl").write_text(
        "\n".join(
            _row(i, tps, 0.4) for i, tps in ((1, 1e4), (2, 9e4), (3, 100e3), (4, 110e3), (5, 90e3))
        )
        + "\nnot json\n"
    )
    (job / f"{ok}.plan.json").write_text(json.dumps({"memory_per_gpu": {"total_gib": 78.75}}))
    (job / f"{cut}.plan.json").write_text("{broken")
    (job / "steps.tsv").write_text(
        f"memory\t{ok}\tok\t0\t120\t300\t\n"
        f"memory\t{cut}\ttimeout\t124\t300\t300\tstopped at the time limit (300 s)\n"
    )
    (job / "phases.tsv").write_text("memory\tfailed\t1800000010\t1800000430\tcut stopped\n")
    rec = cr.build(job)
    mem = rec["memory"]
    a, b, c, d = mem["runs"]
    assert (a["micro"], a["recompute"], a["tokens_per_s"], a["mfu"]) == (
        13,
        "selective",
        100000,
        0.4,
    )
    assert (a["peak_gib"], a["plan_gib"], a["plan_error"], a["status"]) == (75.0, 78.75, 0.05, "ok")
    assert b["sets"] == ["model.num_blocks=4", "kernels.precompile=false"]
    assert (b["peak_gib"], b["plan_gib"], b["plan_error"], b["status"]) == (
        None,
        None,
        None,
        "timeout",
    )
    assert "time limit" in b["reason"] and mem["worst_plan_error"] == 0.05
    # as shipped: the plan's own recompute label and the pre-flight check's memory verdict
    assert (c["recompute"], c["as_shipped"], c["status"]) == ("none", True, "missing")
    assert c["check"] == {"ok": True, "memory": "ok", "detail": memory_row["detail"]}
    assert a["check"] is None and not a["as_shipped"]
    assert d["check"] is None and d["as_shipped"] is False and d["recompute"] == "shipped"
    assert rec["phases"]["memory"]["status"] == "failed" and rec["wall_s"]["memory"] == 420.0
    text = cr.summary(rec)
    assert (
        "zebra_kda_1B_hybrid m13 selective: 100,000 tok/s, peak 75.0 GiB, plan 78.75 (5.0%)" in text
    )
    # not requested: skipped with its reason, and no summary row
    plain = cr.build(_job(tmp_path / "plain"))
    assert plain["phases"]["memory"] == {
        "status": "skipped",
        "reason": "not in PHASES",
        "wall_s": None,
    }
    assert plain["memory"]["runs"] == [] and "\nmemory " not in cr.summary(plain)


def test_the_save_stall_separates_a_saves_own_pause_from_the_wait_for_the_one_before(cr, tmp_path):
    """The lines stall_kda_300M logged at 775f8db (H100): a save every 3 iterations waited for the
    one before to finish writing; the pause each save itself cost was 1.4, 0.4 and 0.4 s."""
    job = tmp_path / "job"
    (job / "logs").mkdir(parents=True)
    (job / "logs/stall_kda_300M.log").write_text(
        "08:42:51.704 saving /r/checkpoints/iter_0000003 (async: training paused 1.4 s)\n"
        "08:43:08.658 checkpoint iter_0000003 complete in 17.9 s\n"
        "08:43:09.091 saving /r/checkpoints/iter_0000006 (async: training paused 16.5 s, "
        "16.1 s of it for the previous save)\n"
        "08:43:17.457 checkpoint iter_0000006 complete in 8.8 s\n"
        "08:43:17.905 saving /r/checkpoints/iter_0000009 (async: training paused 7.9 s, "
        "7.5 s of it for the previous save)\n"
    )
    got = cr.save_stall(job)
    assert got == {
        "mode": "async",
        "pause_s": [1.4, 16.5, 7.9],
        "max_s": 16.5,
        "own_s": [1.4, 0.4, 0.4],
        "max_own_s": 1.4,
        "write_s": [17.9, 8.8],
    }
    (job / "logs/stall_kda_300M.log").write_text("saved /r/checkpoints/iter_0000003 in 6.8 s\n")
    assert cr.save_stall(job)["own_s"] == [6.8] and cr.save_stall(job)["mode"] == "blocking"


def test_a_time_limit_after_every_selected_test_reported_is_no_cut(cr, tmp_path):
    """9e2cf5a (H100): pytest printed "5 passed" and its process ended 4 s later, past the phase's
    limit; the record said "stopped at the time limit". Every selected test reported: not cut."""
    for i, (line, cut) in enumerate((
        ("09:10:09.434 6 workers [5 items]", False),
        ("09:12:36.896 collecting ... collected 457 items / 452 deselected / 5 selected", False),
        ("08:47:11.256 6 workers [52 items]", True),  # 775f8db: 38 of 52 reported
        ("collected 5 items", False),
    )):  # fmt: skip
        job = _job(tmp_path / str(i))
        (job / "logs/tests.log").write_text(f"{line}\nPASSED tests/x.py::a\n")
        rec = json.loads(cr.write(job, tmp_path / str(i) / "out").read_text())
        t = rec["tests"]
        assert t["total"] == 5 and t["interrupted"] is cut, (line, t)
        assert t["selected"] == (52 if cut else 5)
        want = "1 failed, 1 errors" + ("; stopped at the time limit after 5 tests" if cut else "")
        assert t["reason"] == want and t["status"] == "failed", (line, t["reason"])


def test_a_complete_run_past_the_limit_is_ok(cr, tmp_path):
    job = _job(tmp_path)
    (job / "junit.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="2">'
        '<testcase classname="tests.a" name="t1" time="1.0"/>'
        '<testcase classname="tests.a" name="t2" time="2.0"/></testsuite></testsuites>'
    )
    (job / "logs/tests.log").write_text("collected 9 items / 7 deselected / 2 selected\n")
    rec = json.loads(cr.write(job, tmp_path / "out").read_text())
    assert rec["tests"]["passed"] == 2 and rec["tests"]["interrupted"] is False
    assert rec["phases"]["tests"]["status"] == "ok", rec["phases"]["tests"]


def test_the_1b_hybrids_as_shipped_get_their_row_or_the_reason_they_did_not_run(cr, tmp_path):
    job = _job(tmp_path)
    run = job / "runs" / "perf_zebra_mamba_1B_hybrid_1gpu"
    run.mkdir(parents=True)
    rows = [_row(1, 9_000.0, 0.01)] + [
        _row(i, 60_000.0 + 100 * i, 0.48 + i / 1000) for i in (2, 3, 4)
    ]
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    rec = json.loads(cr.write(job, tmp_path / "out").read_text())
    big = rec["perf"]["big"]
    mamba = big["zebra_mamba_1B_hybrid_1gpu"]
    assert mamba["tokens_per_s"] == 60_300 and mamba["mfu"] == pytest.approx(0.483)
    assert big["zebra_kda_1B_hybrid_1gpu"]["missing"] == "not run"
    assert "zebra_mamba_1B_hybrid_1gpu 60,300 tok/s MFU 48.3%" in cr.summary(rec)

    (job / "perf_big_skipped.txt").write_text(
        "needs a GPU of more than 80 GB (this one: 81559 MiB)\n"
    )
    rec = cr.build(job)
    assert rec["perf"]["big"]["zebra_kda_1B_hybrid_1gpu"]["missing"].startswith("needs a GPU of")


def test_a_perf_phase_of_one_recipe_without_fla_is_judged_on_what_it_ran(cr, tmp_path):
    """CHECK_PERF_RECIPES=kda_300M with CHECK_FLA_VARIANTS=none (a short job: one recipe and the
    save pause): the phase is ok on kda_300M's own rows; gdn_300M and the FLA rows are absent
    from the record, not failures. A recipe that was asked for and left no row still fails it."""
    job = _job(tmp_path)
    meta = (
        (job / "meta.env")
        .read_text()
        .replace("FLA_VARIANTS=fla_shipped fla_tuned", "FLA_VARIANTS=none")
    )
    (job / "meta.env").write_text(meta + "PERF_RECIPES=kda_300M\n")
    steps = [
        s
        for s in (job / "steps.tsv").read_text().splitlines()
        if "\tperf_gdn" not in s and "\tbench_" not in s
    ]
    (job / "steps.tsv").write_text("\n".join(steps) + "\n")
    ph = (
        (job / "phases.tsv")
        .read_text()
        .replace("perf\tfailed", "perf\tok")
        .replace("bench_gdn_300M exited 1", "")
    )
    (job / "phases.tsv").write_text(ph)
    shutil.rmtree(job / "runs" / "perf_gdn_300M")
    rec = json.loads(cr.write(job, tmp_path / "out").read_text())
    p = rec["phases"]["perf"]
    assert (p["status"], p["reason"]) == ("ok", None)
    assert (
        rec["perf"]["kda_300M"]["ours"]["tokens_per_s"] is not None
        and rec["perf"]["kda_300M"]["fla"] == {}
    )
    shutil.rmtree(job / "runs" / "perf_kda_300M")  # asked for, and no row: a failure
    rec = json.loads(cr.write(job, tmp_path / "out2").read_text())
    assert rec["phases"]["perf"]["status"] == "failed"
    assert "kda_300M ours" in rec["phases"]["perf"]["reason"]

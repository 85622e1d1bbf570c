"""`plan --fit` and the memory estimate behind it, against peak memory measured on an H200.

Golden numbers: benchmarks/results/2026-12-01_h200_issue12{b,d}/bench_*.json (benchmarks/step_bench.py,
seq 2048, torch.cuda.max_memory_allocated): zebractl's step on the engine each row names (``ours`` =
the recipe's torch_fused engine with the LM-head loss in 32 chunks, as the recipes then were;
``ours_chunksN``: in N chunks; ``ours_megatron`` = the Megatron engine), taken only from runs whose
memory held nothing of an earlier run of the process (``static_gib`` is the engine's own state:
step_bench builds several models one after the other, and later ones inherit leftovers).
Tolerance: the estimate is within 10% of every measured peak.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zebractl.config.resolve import resolve_recipe
from zebractl.planning.plan import GIB, Plan, fit, memory_estimate, parameter_report
from zebractl.schemas.recipe import derive

REPO = Path(__file__).resolve().parents[2]
MEASURED = sorted(
    path
    for topic in ("issue12b", "issue12d")
    for path in (REPO / f"benchmarks/results/2026-12-01_h200_{topic}").glob("bench_*.json")
)
ENGINES = {
    "ours": ("torch_fused", 32),
    "ours_megatron": ("megatron", 32),
    "ours_chunks8": ("torch_fused", 8),
    "ours_chunks4": ("torch_fused", 4),
    "ours_chunks2": ("torch_fused", 2),
}
"""step_bench's implementation -> (optimizer.impl, kernels.fused_ce_chunks) it ran with."""
CLEAN_STATIC_GIB = 5.5
"""Above this ``static_gib`` a 300M run's memory held an earlier run's tensors (its own state is
4.6 GiB on torch_fused, 5.2 GiB on the Megatron engine)."""


def _cfg(preset: str, micro: int, *more: str, impl: str = "megatron"):
    sets = [
        f"optimizer.impl={impl}",
        "parallelism.num_gpus=1",
        f"batch.micro={micro}",
        f"batch.global={micro}",
        "data.seq_length=2048",
        *more,
    ]
    return resolve_recipe(preset, sets).run


def _measured() -> list[dict]:
    rows = []
    for path in MEASURED:
        rows += [
            r
            for r in json.loads(path.read_text())
            if r.get("impl") in ENGINES
            and r.get("peak_gib")
            and r.get("static_gib", 99) <= CLEAN_STATIC_GIB
        ]
    return rows


def test_there_are_measurements_to_check():
    rows = _measured()
    assert len(rows) >= 5 and {r["impl"] for r in rows} == set(ENGINES)


@pytest.mark.parametrize(
    "row", _measured(), ids=lambda r: f"{r['preset']}-{r['impl']}-micro{r['micro']}"
)
def test_estimate_within_10_percent_of_the_measured_peak(row):
    impl, chunks = ENGINES[row["impl"]]
    cfg = _cfg(row["preset"], row["micro"], f"kernels.fused_ce_chunks={chunks}", impl=impl)
    est = Plan("x", cfg).to_dict()["memory_per_gpu"]["total_gib"]
    err = (est - row["peak_gib"]) / row["peak_gib"]
    assert abs(err) <= 0.10, f"estimate {est} GiB vs measured {row['peak_gib']} GiB ({err:+.1%})"


@pytest.mark.parametrize("capacity", [24.0, 80.0, 139.0, 1000.0])
def test_fit_is_the_largest_micro_batch_under_the_usable_memory(capacity):
    cfg = _cfg("kda_300M", 16, "batch.global=1024")
    total = parameter_report(cfg.model)["total"]
    f = fit(cfg, total, capacity)
    e = memory_estimate(cfg, total, derive(cfg))
    usable = f["usable_gib"] * GIB
    assert f["micro"] > 0
    assert e.total(f["micro"]) <= usable * 1.0001 < e.total(f["micro"] + 1)
    assert 1024 % f["micro_dividing_global"] == 0 and f["micro_dividing_global"] <= f["micro"]
    assert 2 * f["micro_dividing_global"] > f["micro"] or 1024 % (2 * f["micro_dividing_global"])


def test_fit_reports_when_nothing_fits():
    cfg = _cfg("kda_300M", 16)
    f = fit(cfg, parameter_report(cfg.model)["total"], 4.0)  # the state alone is ~5 GiB
    assert f["micro"] == 0 and f["estimate_gib"] is None and f["micro_dividing_global"] == 0


def test_cli_fit(cli):
    base = [
        "plan",
        "kda_300M",
        "--set",
        "optimizer.impl=megatron",
        "--set",
        "parallelism.num_gpus=1",
    ]
    r = cli(*base, "--gpu-memory", "139", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)["fit"]
    assert doc["micro"] >= 96 and doc["micro_dividing_global"] == 64
    assert doc["estimate_gib"] <= doc["usable_gib"] < doc["capacity_gib"] == 139
    assert json.loads(cli(*base, "--json").stdout)["fit"] is None
    text = cli(*base, "--gpu-memory", "139").stdout
    assert "--set batch.micro=64" in " ".join(text.split())
    tiny = cli(*base, "--gpu-memory", "2")
    assert tiny.exit_code == 0 and "not even micro-batch 1 fits" in " ".join(tiny.stdout.split())
    for bad in ("0", "-3", "inf", "nan"):
        r = cli(*base, "--gpu-memory", bad)
        assert r.exit_code == 2, (bad, r.output)
        assert "Traceback" not in r.output


def test_cli_fit_without_a_gpu_asks_for_the_memory(cli):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU to ask")
    r = cli("plan", "kda_300M", "--fit")
    assert r.exit_code == 2 and "--gpu-memory" in r.stderr and r.stdout == ""

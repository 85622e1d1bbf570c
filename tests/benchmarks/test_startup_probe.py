"""benchmarks/startup_probe.py on the CPU: every stage is timed and a missing package is a row's
error, never the probe's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")


def test_every_stage_is_timed_and_a_failure_is_its_rows_error(tmp_path, monkeypatch, script):
    probe = script("startup_probe")

    def broken() -> None:
        raise ModuleNotFoundError("No module named 'tilelang'")

    monkeypatch.setattr(probe, "_tilelang", broken)
    out = tmp_path / "probe.json"
    assert probe.main(["--recipe", "tiny_kda", "--json-out", str(out)]) == 0
    doc = json.loads(out.read_text())
    names = [r["stage"] for r in doc["rows"]]
    assert names == ["interpreter", "torch", "cuda", "trainer", "megatron", "fla", "tilelang",
                     "process_group", "config"]  # fmt: skip
    assert all(r["seconds"] >= 0 for r in doc["rows"])
    errors = {r["stage"]: r["error"] for r in doc["rows"]}
    assert errors.pop("tilelang") == "ModuleNotFoundError: No module named 'tilelang'"
    assert set(errors.values()) == {None}, errors
    assert doc["total_s"] == pytest.approx(sum(r["seconds"] for r in doc["rows"]), abs=0.02)


@pytest.mark.parametrize("lazy", [False, True])
def test_lazy_imports_megatron_and_fla_with_the_compile_wrappers_deferred(
    tmp_path, monkeypatch, script, lazy
):
    import torch

    probe = script("startup_probe")
    real, seen = torch.compile, []
    monkeypatch.setattr(probe, "_fla", lambda lean: lambda: seen.append(torch.compile is real))
    out = tmp_path / "probe.json"
    args = ["--recipe", "tiny_kda", "--json-out", str(out), *(["--lazy"] if lazy else [])]
    assert probe.main(args) == 0
    assert seen == [not lazy] and torch.compile is real
    assert json.loads(out.read_text())["lazy"] is lazy


@pytest.mark.parametrize("lean", [False, True])
def test_lean_imports_fla_as_the_key_does_before_the_step_modules(
    tmp_path, monkeypatch, script, lean
):
    """``--lean``: fla_import.lean() first (here recorded, not installed: this process may not have
    imported FLA yet), then the FLA modules a step imports; the row counts FLA's modules."""
    pytest.importorskip("fla")
    from zebractl.runtime import fla_import

    probe = script("startup_probe")
    calls: list[bool] = []
    monkeypatch.setattr(fla_import, "lean", lambda: calls.append(True) or False)
    out = tmp_path / "probe.json"
    args = ["--recipe", "tiny_kda", "--json-out", str(out), *(["--lean"] if lean else [])]
    assert probe.main(args) == 0
    doc = json.loads(out.read_text())
    assert calls == ([True] if lean else []) and doc["lean"] is lean
    (row,) = [r for r in doc["rows"] if r["stage"] == "fla"]
    assert row["error"] is None and row["fla_modules"] >= len(probe.FLA_STEP)

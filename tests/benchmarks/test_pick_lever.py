"""benchmarks/device/pick_lever.py: a lever wins only where it beats the defaults on every preset by
more than the defaults' own spread."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/device/pick_lever.py"
spec = importlib.util.spec_from_file_location("pick_lever", SCRIPT)
pick_lever = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pick_lever)


def _rows(**speeds):
    rows = [{"env": "versions"}]
    for key, tps in speeds.items():
        preset, impl = key.split("__")
        rows.append({"check": "step", "preset": preset, "impl": impl, "tokens_per_s": tps})
    return rows


def test_the_first_variant_beating_every_preset_wins():
    rows = _rows(
        a__ours=100, a__ours_repeat=101, a__both=105, a__one=103,
        b__ours=200, b__ours_repeat=200, b__both=206, b__one=199,
    )  # fmt: skip
    winner, lines = pick_lever.pick(rows, ["one", "both"])
    assert winner == "both"
    assert "a both: 1.0396x the defaults (spread 0.0099)" in lines


def test_within_the_spread_missing_or_out_of_memory_does_not_win():
    rows = _rows(a__ours=100, a__ours_repeat=104, a__x=104.5, a__y=110)
    rows.append({"check": "step", "preset": "b", "impl": "ours", "tokens_per_s": 100})
    rows.append({"check": "step", "preset": "b", "impl": "ours_repeat", "tokens_per_s": 100})
    rows.append({"check": "step", "preset": "b", "impl": "y", "error": "out of memory"})
    winner, lines = pick_lever.pick(rows, ["x", "y"])
    assert winner == "none" and "b y: not measured" in lines
    assert pick_lever.pick([], ["x"])[0] == "none"


def test_the_command_prints_the_winner(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_rows(a__ours=10, a__ours_repeat=10, a__v=11)))
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), "v"], capture_output=True, text=True, check=True
    )
    assert r.stdout.strip() == "v" and "a v: 1.1000x" in r.stderr
    bad = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert bad.returncode == 2


def test_a_missing_or_malformed_file_exits_2_naming_it(tmp_path):
    cases = {
        tmp_path / "missing.json": "cannot be read",
        tmp_path / "cut.json": ":1: not JSON",
        tmp_path / "object.json": "not a list of results",
        tmp_path / "numbers.json": "not a list of results",
    }
    (tmp_path / "cut.json").write_text('[{"check": "step"')
    (tmp_path / "object.json").write_text('{"a": 1}')
    (tmp_path / "numbers.json").write_text("[1, 2]")
    for path, message in cases.items():
        r = subprocess.run(
            [sys.executable, str(SCRIPT), str(path), "v"], capture_output=True, text=True
        )
        assert r.returncode == 2 and str(path) in r.stderr and message in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""

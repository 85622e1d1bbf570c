"""benchmarks/coldstart.py: each run is a fresh process with a fresh kernel cache, timed to setup's
first line, the background compilation's line and iteration 1; a run that fails is its row's error.
A stand-in interpreter prints what `zebractl train` prints (no training: the timing logic only)."""

from __future__ import annotations

import json
import os
import stat

FAKE = """#!/bin/sh
# a stand-in for `python -m zebractl train ...`: the lines the marks look for
echo "kernel cache $ZEBRACTL_CACHE_DIR" >> "$COLDSTART_SEEN"
echo "TRITON=${TRITON_CACHE_DIR:-unset}" >> "$COLDSTART_SEEN"
echo "$@" >> "$COLDSTART_SEEN"
echo "kernel cache x (shipped set y)"
echo "training kda_300M: Pure KDA"
echo "kernels compiled in the background in 1.0 s (setup waited 0.5 s)"
echo "iter 1/2 (50%) | loss 11.9"
case "$*" in *fail=yes*) echo "error: out of memory"; exit 3 ;; esac
"""


def _stand_in(tmp_path, monkeypatch):
    """The stand-in interpreter and the file it appends what it saw to."""
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    seen = tmp_path / "seen.txt"
    monkeypatch.setenv("COLDSTART_SEEN", str(seen))
    return fake, seen


def test_variants_run_in_order_each_with_a_fresh_cache(tmp_path, monkeypatch, script):
    fake, seen = _stand_in(tmp_path, monkeypatch)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/warm")  # a warm cache must not leak in
    out = tmp_path / "cold.json"
    code = script("coldstart").main([
        "--data", "/data", "--python", str(fake), "--variant", "thread=",
        "--variant", "process=kernels.precompile_tilelang=process,fail=yes",
        "--order", "thread,process,thread", "--prime", "--micro", "32", "--json-out", str(out),
    ])  # fmt: skip
    assert code == 1  # one variant's runs failed
    doc = json.loads(out.read_text())
    assert doc["order"] == ["thread", "thread", "process", "thread"]
    rows = doc["rows"]
    assert [r["prime"] for r in rows] == [True, False, False, False]
    for r in rows:
        assert 0 <= r["setup_s"] <= r["compiled_s"] <= r["first_iteration_s"], r
    assert [r["error"] for r in rows] == [None, None, "exit 3: error: out of memory", None]
    assert doc["summary"]["thread"]["runs"] == 2 and doc["summary"]["process"]["runs"] == 1
    lines = seen.read_text().splitlines()
    caches = [ln for ln in lines if ln.startswith("kernel cache")]
    assert len(set(caches)) == 4  # a new cache folder per run
    assert {ln for ln in lines if ln.startswith("TRITON=")} == {"TRITON=unset"}
    argv = [ln for ln in lines if "train" in ln]
    assert all("--set schedule.iterations=2" in ln and "--set data.paths=[{path: /data}]" in ln
               and "--set batch.micro=32 --set batch.global=32" in ln for ln in argv)  # fmt: skip
    assert "kernels.precompile_tilelang=process" in argv[2] and "precompile_tilelang" not in argv[1]


def test_an_order_naming_no_variant_is_a_usage_error(tmp_path, capsys, script):
    import pytest

    with pytest.raises(SystemExit) as exc:
        script("coldstart").main(["--data", "/d", "--variant", "a=", "--order", "a,b"])
    assert exc.value.code == 2 and "--order names no --variant: b" in capsys.readouterr().err
    assert os.environ.get("COLDSTART_SEEN") is None


def test_a_warmed_variant_runs_zebractl_warmup_into_its_cache_first(tmp_path, monkeypatch, script):
    fake, seen = _stand_in(tmp_path, monkeypatch)
    out = tmp_path / "cold.json"
    code = script("coldstart").main([
        "--data", "/data", "--python", str(fake), "--variant", "cold=", "--variant", "warm=a=1",
        "--warmed", "warm", "--order", "cold,warm", "--micro", "8", "--json-out", str(out),
    ])  # fmt: skip
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert (
        "warmup_s" not in rows[0] and rows[1]["warmup_s"] >= 0 and rows[1]["warmup_error"] is None
    )
    lines = seen.read_text().splitlines()
    calls = [ln for ln in lines if " warmup " in f" {ln} " or " train " in f" {ln} "]
    assert [("warmup" if " warmup " in f" {c} " else "train") for c in calls] == [
        "train",
        "warmup",
        "train",
    ]
    assert (
        "--set a=1" in calls[1] and "--set batch.micro=8" in calls[1] and "--output" not in calls[1]
    )
    caches = [ln for ln in lines if ln.startswith("kernel cache")]
    assert caches[1] == caches[2] != caches[0]  # the warmup filled the cache its run then read


def test_warmed_naming_no_variant_is_a_usage_error(capsys, script):
    import pytest

    with pytest.raises(SystemExit) as exc:
        script("coldstart").main(["--data", "/d", "--variant", "a=", "--warmed", "b"])
    assert exc.value.code == 2 and "--warmed names no --variant: b" in capsys.readouterr().err


def test_the_record_holds_every_finished_run_when_the_job_is_cut_short(
    tmp_path, monkeypatch, script
):
    """The GPU job's time limit may stop the script mid-run: the runs before it are on disk."""
    import pytest

    fake, _ = _stand_in(tmp_path, monkeypatch)
    mod = script("coldstart")
    real, calls = mod.one, []

    def cut(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # what the job's timeout does to the third run
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, "one", cut)
    out = tmp_path / "cold.json"
    with pytest.raises(KeyboardInterrupt):
        mod.main([
            "--data", "/d", "--python", str(fake), "--variant", "a=", "--variant", "b=",
            "--order", "a,b,a,b", "--json-out", str(out),
        ])  # fmt: skip
    doc = json.loads(out.read_text())
    assert [r["variant"] for r in doc["rows"]] == ["a", "b"]
    assert doc["summary"]["a"]["runs"] == 1 and doc["summary"]["b"]["runs"] == 1

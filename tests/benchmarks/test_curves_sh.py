"""benchmarks/device/curves.sh: two runs of one recipe (the levers' --set arguments on one of them)
and `zebractl compare`, each call's files holding that call's runs alone. A stand-in for
`python -m zebractl` (no training: the script's logic only) appends one metrics line per run to
the run directory's metrics.jsonl, as zebractl does when a run directory is trained again."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/device/curves.sh"

# `python -m zebractl train RECIPE ... --output DIR`: one line appended to DIR/metrics.jsonl naming
# the run's call and its --set arguments; `python -m zebractl compare A B --json`: the two files
FAKE_PY = """#!/usr/bin/env bash
shift 2  # -m zebractl
cmd=$1; shift
if [ "$cmd" = compare ]; then echo "{\\"a\\": \\"$1\\", \\"b\\": \\"$2\\"}"; exit 0; fi
out= sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --output) out=$2; shift ;;
    --set) sets+=("$2"); shift ;;
  esac
  shift
done
mkdir -p "$out"
printf '{"call": "%s", "sets": %d, "last": "%s"}\\n' "$FAKE_CALL" "${#sets[@]}" "${sets[-1]}" \\
  >> "$out/metrics.jsonl"
"""


def _call(tmp_path: Path, call: str, out: Path) -> subprocess.CompletedProcess:
    py = tmp_path / "py"
    py.write_text(FAKE_PY)
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PY": str(py), "CURVES_RUNS": str(tmp_path / "runs"), "FAKE_CALL": call}
    args = [str(tmp_path / "data"), str(out), "tiny_kda", "20", "4", "--set", "kernels.x=y"]
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_call_holds_its_own_runs_only(tmp_path):
    """A second call with the same run folder (a warm machine) starts both runs afresh: its
    metrics files hold its runs, not the first call's too."""
    for call in ("first", "second"):
        out = tmp_path / f"out_{call}"
        done = _call(tmp_path, call, out)
        assert done.returncode == 0, done.stdout + done.stderr
        levers, defaults = (
            _rows(out / f"curves.{v}.metrics.jsonl") for v in ("levers", "defaults")
        )
        assert [r["call"] for r in levers] == [call] == [r["call"] for r in defaults]
        # the levers' run got the extra --set, the defaults' only the script's own
        assert levers[0]["last"] == "kernels.x=y" and defaults[0]["last"] != "kernels.x=y"
        assert levers[0]["sets"] == defaults[0]["sets"] + 1
        compare = json.loads((out / "curves.compare.json").read_text())
        assert compare == {
            "a": str(tmp_path / "runs/curves_levers"),
            "b": str(tmp_path / "runs/curves_defaults"),
        }

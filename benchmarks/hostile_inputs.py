"""How long zebractl takes to refuse hostile input: one case per class of issue 11.

Each case is a fresh `zebractl` process (what a user pays, interpreter and imports included) and, for
the part zebractl owns, the same command run in-process after a warm-up (imports done), best of
``--repeats``. Every case must exit 2 (or 3 for a failed verify); the script says so if one does not.

    python benchmarks/hostile_inputs.py [--repeats 5] [--json-out benchmarks/results/....json]

The suite checks the exit codes and messages (tests/config/test_hostile.py,
tests/data/test_hostile_inputs.py); the times are measured here, not asserted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cases(tmp: Path) -> dict[str, list[str]]:
    """name -> zebractl arguments, with the files they need written into ``tmp``."""
    from zebractl.data.demo import tokenizer_dir

    def write(name: str, data: str | bytes) -> str:
        path = tmp / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        return str(path)

    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    good = "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(2000))
    cut = gzip.compress(good.encode())
    tok = ["--tokenizer", str(tokenizer_dir())]
    out = str(tmp / "out")
    return {
        "alias bomb (10^9 values)": ["config", "validate", write("bomb.yaml", bomb)],
        "recursive alias": ["config", "validate", write("rec.yaml", "a: &a [1, *a]\n")],
        "deep nesting (5000)": [
            "config",
            "validate",
            write("deep.yaml", "a: " + "[" * 5000 + "]" * 5000),
        ],
        "NUL byte": ["config", "validate", write("nul.yaml", "preset: tiny_kda\x00\n")],
        "400-digit integer": ["plan", "tiny_kda", "--set", "model.num_blocks=" + "9" * 400],
        "num_blocks 1e9": ["plan", "tiny_kda", "--set", "model.num_blocks=1000000000"],
        "lr .inf": ["plan", "tiny_kda", "--set", "schedule.lr=.inf"],
        "bases: without preset": ["config", "validate", write("bases.yaml", "bases: tiny_kda\n")],
        "300-byte file name": ["plan", "a" * 300 + ".yaml"],
        "truncated .jsonl.gz": [
            "prepare",
            write("cut.jsonl.gz", cut[: len(cut) // 2]),
            *tok,
            "-o",
            out,
        ],
        "empty input": ["prepare", write("empty.jsonl", ""), *tok, "-o", out + "2"],
        "lone surrogate": [
            "prepare",
            write("sur.jsonl", '{"text": "\\ud800"}\n'),
            *tok,
            "-o",
            out + "3",
        ],
    }


def _in_process(argv: list[str], repeats: int) -> tuple[float, int]:
    from typer.testing import CliRunner

    from zebractl.cli import app

    runner = CliRunner()
    runner.invoke(app, argv)  # warm-up: imports
    best, code = float("inf"), -1
    for _ in range(repeats):
        t0 = time.perf_counter()
        code = runner.invoke(app, argv).exit_code
        best = min(best, time.perf_counter() - t0)
    return best, code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    exe = str(Path(sys.executable).with_name("zebractl"))
    if not Path(exe).exists():
        exe = shutil.which("zebractl") or sys.exit("zebractl is not installed (pip install -e .)")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cases = _cases(Path(d))
        for name, argv in cases.items():
            t0 = time.perf_counter()
            proc = subprocess.run([exe, *argv], capture_output=True, text=True, cwd=d, timeout=120)
            process_s = time.perf_counter() - t0
            own_s, code = _in_process(argv, args.repeats)
            first = (proc.stderr.strip().splitlines() or [""])[-1][:90]
            rows.append(
                {
                    "case": name,
                    "exit": proc.returncode,
                    "process_s": round(process_s, 3),
                    "own_s": round(own_s, 4),
                    "message": first,
                }
            )
            print(
                f"{name:26} exit {proc.returncode} (in-process {code})  process {process_s:6.2f} s"
                f"  zebractl's own {own_s * 1000:7.1f} ms  {first}"
            )
    bad = [r["case"] for r in rows if r["exit"] not in (2, 3)]
    print("all exit 2" if not bad else f"NOT exit 2: {bad}")
    if args.json_out:
        env = {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "repeats": args.repeats,
        }
        args.json_out.write_text(json.dumps({"environment": env, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

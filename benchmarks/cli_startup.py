"""Start-up time of the CLI: `zebractl --help` and one Tab completion beside a bare interpreter.

Each command runs as a fresh process (what a user's shell pays), all commands interleaved in every
round so machine noise hits them alike; the table gives the best and the median wall time over
``--repeats`` rounds, and the median minus the bare interpreter's (``python -c pass``), which is the
part zebractl owns. The completion call is what bash runs on ``zebractl plan kda_<Tab>``.

The suite asserts only what is deterministic (``--help`` and completion import no torch, megatron,
fla, transformers or lm_eval: tests/cli/test_cli.py); the time itself is measured here, not asserted.

    python benchmarks/cli_startup.py --repeats 20 [--json-out benchmarks/results/....json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _zebractl() -> str:
    beside = Path(sys.executable).with_name("zebractl")
    found = str(beside) if beside.exists() else shutil.which("zebractl")
    if found is None:
        sys.exit("zebractl is not installed in this environment (pip install -e .)")
    return found


def commands() -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (argv, extra environment)."""
    exe = _zebractl()
    completion = {
        "_ZEBRACTL_COMPLETE": "complete_bash",
        "COMP_WORDS": "zebractl plan kda_",
        "COMP_CWORD": "2",
    }
    return {
        "python -c pass": ([sys.executable, "-c", "pass"], {}),
        "zebractl --help": ([exe, "--help"], {}),
        "zebractl plan kda_<Tab>": ([exe], completion),
    }


def _time(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env={**os.environ, **env}, capture_output=True, check=True, timeout=120)
    return time.perf_counter() - start


def measure(repeats: int) -> dict[str, list[float]]:
    cmds = commands()
    for argv, env in cmds.values():  # warm the file cache; not counted
        _time(argv, env)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeats):
        for name, (argv, env) in cmds.items():
            times[name].append(_time(argv, env))
    return times


def table(times: dict[str, list[float]]) -> list[dict[str, float | str]]:
    base = statistics.median(times["python -c pass"])
    return [
        {
            "command": name,
            "best_ms": round(1000 * min(ts), 1),
            "median_ms": round(1000 * statistics.median(ts), 1),
            "over_python_ms": round(1000 * (statistics.median(ts) - base), 1),
        }
        for name, ts in times.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10, help="rounds (default 10)")
    ap.add_argument("--json-out", type=Path, help="also write the rows and the machine as JSON")
    args = ap.parse_args()
    rows = table(measure(args.repeats))
    header = f"{'command':<26}{'best ms':>10}{'median ms':>12}{'over python ms':>17}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['command']:<26}{r['best_ms']:>10.1f}{r['median_ms']:>12.1f}"
            f"{r['over_python_ms']:>17.1f}"
        )
    print(f"\n{args.repeats} rounds, {platform.python_version()}, {platform.machine()}")
    if args.json_out:
        doc = {
            "rows": rows,
            "repeats": args.repeats,
            "python": platform.python_version(),
            "machine": platform.platform(),
            "cpus": os.cpu_count(),
        }
        args.json_out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

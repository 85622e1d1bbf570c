"""The step rows of a levers.sh log (lines ``RESULT {json}``) as one table (levers.sh prints it
last and writes it to $OUT/table.txt): ``python3 benchmarks/device/levers_table.py < levers.log``."""

from __future__ import annotations

import json
import sys


def main() -> None:
    cols = ("preset", "impl", "micro", "tok/s", "mfu_plan", "peak GiB", "step ms")
    print(
        f"{cols[0]:26} {cols[1]:22} {cols[2]:>5} {cols[3]:>9} {cols[4]:>8} {cols[5]:>8} {cols[6]:>8}"
    )
    for line in sys.stdin:
        if not line.startswith("RESULT "):
            continue
        r = json.loads(line[7:])
        if r.get("check") != "step":
            continue
        tps = r.get("tokens_per_s", "OOM" if r.get("oom") else "error")
        print(
            f"{r['preset']:26} {r['impl']:22} {r['micro']:>5} {tps!s:>9} "
            f"{r.get('mfu_plan', '')!s:>8} {r.get('peak_gib', '')!s:>8} {r.get('step_ms', '')!s:>8}"
        )


if __name__ == "__main__":
    main()

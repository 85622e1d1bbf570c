"""Which lever won a side-by-side step benchmark (``benchmarks/step_bench.py --repeat-ours``):

    python benchmarks/device/pick_lever.py BENCH.json VARIANT [VARIANT ...]

prints the first VARIANT whose tokens/s beat the defaults on every preset in the file, or ``none``.
Beating means faster than the faster of ``ours`` and ``ours_repeat`` (the defaults timed first and
last in the same process) by more than the two differ from each other (the run's own spread). A
variant missing on a preset, or one that ran out of memory, does not win. The ratios go to stderr;
a file that is missing or not step_bench's JSON list exits 2, naming it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def pick(rows: list[dict], variants: list[str]) -> tuple[str, list[str]]:
    """(the winner or "none", one line per preset and variant)."""
    speed = {
        (r["preset"], r["impl"]): r["tokens_per_s"]
        for r in rows
        if r.get("check") == "step" and r.get("tokens_per_s")
    }
    presets = sorted({p for p, _ in speed})
    lines, winner = [], "none"
    for v in variants:
        wins = bool(presets)
        for p in presets:
            a, b, t = (speed.get((p, i)) for i in ("ours", "ours_repeat", v))
            if a is None or b is None or t is None:
                lines.append(f"{p} {v}: not measured")
                wins = False
                continue
            best, spread = max(a, b), abs(a - b) / max(a, b)
            lines.append(f"{p} {v}: {t / best:.4f}x the defaults (spread {spread:.4f})")
            wins = wins and t > best * (1 + spread)
        if wins and winner == "none":
            winner = v
    return winner, lines


def _rows(path: Path) -> list[dict]:
    """The benchmark's results: a JSON list of objects (ValueError naming the file otherwise)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: not a list of results (step_bench.py --json-out writes one)")
    return rows


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        rows = _rows(Path(argv[0]))
    except ValueError as exc:
        print(f"pick_lever: {exc}", file=sys.stderr)
        return 2
    winner, lines = pick(rows, argv[1:])
    print("\n".join(lines), file=sys.stderr)
    print(winner)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Cold start of `zebractl train`, variants side by side: launch -> setup's first line -> the
kernels compiled -> the end of iteration 1, each run a fresh process with a fresh kernel cache
(seeded with the shipped tuned configurations, as a new machine's first run is).

    python benchmarks/coldstart.py --recipe kda_300M --data DIR \
        --variant thread= --variant process=kernels.precompile_tilelang=process \
        --order thread,process,thread,process --json-out coldstart.json

``--variant NAME=SET[,SET...]``: the `--set` values of a variant (empty: the recipe as shipped).
``--micro N``: micro = global batch N (the recipe's global batch on one GPU is many micro-steps
per iteration, and kda_300M's micro 64 does not fit an 80 GB GPU: 32 there). ``--order``: the runs, one after the other (repeat variants and alternate them: the first run of a
fresh machine also pays the cold page cache of every library; ``--prime`` runs one throwaway run of
the first variant before, not counted). Each run: `python -m zebractl train RECIPE` with the data,
one GPU, 2 iterations, no checkpoint, logging every iteration, ``ZEBRACTL_CACHE_DIR`` a new folder
(Triton's and TileLang's caches inside it, empty but for the shipped configurations), its output
timestamped line by line. A row: seconds from launch to setup's first line (``setup_s``), to the
background compilation's line (``compiled_s``) and to iteration 1's line (``first_iteration_s``),
or the run's error. ``--warmed NAME[,NAME...]``: those variants' runs first fill their fresh cache
with `zebractl warmup RECIPE` (the same `--set` values and micro-batch; not timed, its seconds in
``warmup_s``), so their row is the start of a run after `zebractl warmup`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MARKS = {
    "setup_s": re.compile(r"^training \S+:"),
    "compiled_s": re.compile(
        r"kernels compiled in the background|compiling the kernels in the background failed"
    ),
    "first_iteration_s": re.compile(r"^iter\s+1/"),
}
CACHE_VARS = (
    "ZEBRACTL_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "TILELANG_CACHE_DIR",
    "TRITON_CACHE_AUTOTUNING",
)


def command(
    recipe: str, data: str, out: Path, sets: list[str], python: str, micro: int | None = None
) -> list[str]:
    """The train command of one run; ``micro``: micro = global batch (none: the recipe's)."""
    base = [
        f"data.paths=[{{path: {data}}}]", "data.tokenizer=null", "parallelism.num_gpus=1",
        "validation=null", "logging.tensorboard=false", "logging.interval=1",
        "schedule.iterations=2", "schedule.warmup_iterations=1", "checkpoint.enabled=false",
    ]  # fmt: skip
    if micro is not None:
        base += [f"batch.micro={micro}", f"batch.global={micro}"]
    args = [x for s in (*base, *sets) for x in ("--set", s)]
    return [python, "-m", "zebractl", "train", recipe, *args, "--output", str(out)]


def warmup_command(
    recipe: str, data: str, sets: list[str], python: str, micro: int | None = None
) -> list[str]:
    """`zebractl warmup` for the same run as :func:`command`."""
    train = command(recipe, data, Path("unused"), sets, python, micro)
    args = train[train.index(recipe) + 1 : train.index("--output")]
    return [python, "-m", "zebractl", "warmup", recipe, *args]


def cache_env(cache: Path) -> dict[str, str]:
    """This process's environment with ``cache`` as the only kernel cache."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    env["ZEBRACTL_CACHE_DIR"] = str(cache)
    return env


def warm(cmd: list[str], cache: Path, timeout: float) -> dict[str, Any]:
    """Run `zebractl warmup` into ``cache``: its seconds and exit code (the log's tail on failure)."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, env=cache_env(cache), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"warmup_s": None, "warmup_error": f"past --timeout {timeout} s"}
    out = {"warmup_s": round(time.perf_counter() - t0, 2), "warmup_error": None}
    if done.returncode != 0:
        out["warmup_error"] = f"exit {done.returncode}: {(done.stdout + done.stderr)[-600:]}"
    return out


def one(name: str, cmd: list[str], cache: Path, timeout: float) -> dict[str, Any]:
    """One run in a fresh process with a fresh kernel cache; the seconds to each mark."""
    env = cache_env(cache)
    row: dict[str, Any] = {"variant": name, "error": None, **dict.fromkeys(MARKS)}
    lines: list[str] = []
    last = ""
    t0 = time.perf_counter()
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            t = time.perf_counter() - t0
            last = line.strip() or last
            lines.append(f"{t:8.2f} {line.rstrip()}")
            for key, pattern in MARKS.items():
                if row[key] is None and pattern.search(line):
                    row[key] = round(t, 2)
            if t > timeout:
                proc.kill()
                row["error"] = f"past --timeout {timeout} s"
                break
        code = proc.wait()
    row["exit_code"] = code
    if code != 0 and row["error"] is None:
        row["error"] = f"exit {code}: {last}"
    row["log"] = lines
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each variant's median of each mark (its runs that reached it)."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["variant"] for r in rows if not r.get("prime")):
        mine = [r for r in rows if r["variant"] == name and not r.get("prime")]
        out[name] = {
            key: (
                statistics.median(v)
                if (v := [r[key] for r in mine if r[key] is not None])
                else None
            )
            for key in MARKS
        } | {"runs": len(mine)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="kda_300M")
    ap.add_argument("--data", required=True, help="a prepared dataset folder (absolute path)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=SET[,SET...]")
    ap.add_argument(
        "--order", default="", help="comma-separated variant names (default: each once)"
    )
    ap.add_argument(
        "--prime", action="store_true", help="a throwaway run of the first variant first"
    )
    ap.add_argument(
        "--micro", type=int, help="micro = global batch (default: the recipe's; 32 on an 80 GB GPU)"
    )
    ap.add_argument(
        "--warmed", default="", help="comma-separated variants whose runs follow `zebractl warmup`"
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)
    variants: dict[str, list[str]] = {}
    for spec in a.variant or ["shipped="]:
        name, _, sets = spec.partition("=")
        if not name:
            ap.error(f"--variant {spec!r}: NAME=SET[,SET...]")
        variants[name] = [s for s in sets.split(",") if s]
    order = [n for n in a.order.split(",") if n] or list(variants)
    unknown = [n for n in order if n not in variants]
    if unknown:
        ap.error(f"--order names no --variant: {', '.join(unknown)}")
    warmed = {n for n in a.warmed.split(",") if n}
    if warmed - set(variants):
        ap.error(f"--warmed names no --variant: {', '.join(sorted(warmed - set(variants)))}")
    if a.prime:
        order = [order[0], *order]
    rows: list[dict] = []

    def record() -> dict:
        """The document so far, written after every run: a job cut short keeps the runs it made."""
        doc = {
            "recipe": a.recipe,
            "variants": variants,
            "order": order,
            "rows": rows,
            "summary": summary(rows),
        }
        if a.json_out:
            a.json_out.write_text(json.dumps(doc, indent=1))
        return doc

    with tempfile.TemporaryDirectory(prefix="coldstart-") as tmp:
        for i, name in enumerate(order):
            run_dir = Path(tmp) / f"run{i}"
            cmd = command(a.recipe, a.data, run_dir, variants[name], a.python, a.micro)
            cache = Path(tmp) / f"cache{i}"
            before = {}
            if name in warmed:
                wcmd = warmup_command(a.recipe, a.data, variants[name], a.python, a.micro)
                before = warm(wcmd, cache, a.timeout)
            row = one(name, cmd, cache, a.timeout) | before
            if before.get("warmup_error") and row["error"] is None:
                row["error"] = f"warmup: {before['warmup_error']}"
            row["prime"] = bool(a.prime and i == 0)
            rows.append(row)
            marks = "  ".join(f"{k} {row[k]}" for k in (*MARKS, *before))
            print(
                f"{name:>12}{' (prime)' if row['prime'] else ''}  {marks}  {row['error'] or ''}",
                flush=True,
            )
            record()
    print(json.dumps(record()["summary"], indent=1))
    return 0 if all(r["error"] is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

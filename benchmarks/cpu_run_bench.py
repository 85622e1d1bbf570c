"""A tiny recipe's first iterations on the CPU, for two source trees side by side.

    python benchmarks/cpu_run_bench.py --data data/demo --trees /tmp/before . \
        --recipe tiny_kda --steps 20 --repeat 2 --json-out cpu_run.json
    python benchmarks/cpu_run_bench.py ... --set checkpoint.interval=4   # and each save's time

Each tree (a checkout of zebractl, e.g. a ``git worktree`` of another commit) is put first on
``PYTHONPATH`` of a fresh process that trains ``--recipe`` as shipped on ``--data`` (the prepared
demo corpus) for ``--steps`` iterations, in process (the trainer the CLI runs, without the CLI's
start-up), and reports the wall seconds of the whole run and of its iterations alone (first to
last logged iteration); the trees take turns, ``--repeat`` runs each. The run's losses are printed
too: two trees of the same numerics give the same losses to a few fp32 ulps. The CPU tests' runs
are these runs (the golden runs are 20 iterations of each tiny recipe): this is where the suite's
time goes. ``--set KEY=VALUE`` (repeatable) changes the recipe as ``zebractl train --set`` does; the
seconds of each checkpoint save the run logged (``saved ... in X s``, blocking on a CPU) are
reported too: the first save and the later ones apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, re, sys, tempfile, time
from pathlib import Path

def main():
    recipe, data, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else []
    import zebractl
    from zebractl.config.resolve import resolve_recipe
    from zebractl.run import MetricsReader, ResolvedConfigRecord, RunDir
    from zebractl.train.trainer import Trainer

    sets = [f"data.paths=[{{path: {data}}}]", "logging.interval=1", "logging.tensorboard=false",
            *extra]
    r = resolve_recipe(recipe, sets)
    out = Path(tempfile.mkdtemp()) / "run"
    said = []
    t0 = time.perf_counter()
    Trainer(r.run, RunDir.for_recipe(r.run, r.name, out), ResolvedConfigRecord.of(r),
            stop_after=steps, console=said.append).fit()
    wall = time.perf_counter() - t0
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    times = [row["wall_time"] for row in rows if row.get("kind") == "train"]
    losses = MetricsReader.of(RunDir(out)).losses()
    print(json.dumps({"source": str(Path(zebractl.__file__).parent), "wall_s": wall,
                      "iterations_s": times[-1] - times[0] if len(times) > 1 else None,
                      "losses": list(losses.values()),
                      "saves_s": [float(x) for m in said
                                  for x in re.findall(r"^saved \S+ in ([0-9.]+) s", m)]}))

if __name__ == "__main__":
    main()
"""


def _run(tree: Path, recipe: str, data: Path, steps: int, script: Path, sets: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run(
        [sys.executable, str(script), recipe, str(data), str(steps), json.dumps(sets)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    want = (tree / "zebractl").resolve()
    if Path(out["source"]).resolve() != want:
        raise SystemExit(f"{tree}: ran the zebractl of {out['source']}, not {want}")
    return out


def _commit(tree: Path) -> str | None:
    """The tree's commit (with a ``+`` when its tracked files differ from it), None outside git."""
    git = ["git", "-C", str(tree)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return None
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    return head.stdout.strip() + ("+" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a prepared demo corpus")
    ap.add_argument("--trees", type=Path, nargs="+", required=True, help="zebractl checkouts")
    ap.add_argument("--recipe", default="tiny_kda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    runs: dict[str, list[dict]] = {str(t): [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        for i in range(args.repeat):
            for t in trees:
                r = _run(t, args.recipe, args.data.resolve(), args.steps, script, args.sets)
                runs[str(t)].append(r)
                print(f"run {i + 1} {t}: {r['wall_s']:.2f} s ({r['iterations_s']:.2f} s iterating)")
    base = statistics.median(r["wall_s"] for r in runs[str(trees[0])])
    summary = []
    for t in trees:
        rs = runs[str(t)]
        wall = statistics.median(r["wall_s"] for r in rs)
        first = runs[str(trees[0])][0]["losses"]
        drift = max(abs(a - b) / abs(b) for a, b in zip(rs[0]["losses"], first, strict=True))
        row = {
            "tree": str(t),
            "commit": _commit(t),
            "wall_s": [r["wall_s"] for r in rs],
            "median_s": wall,
            "speedup_vs_first": base / wall,
            "max_rel_loss_vs_first": drift,
        }
        print(
            f"{t}: median {wall:.2f} s, {base / wall:.3f}x the first tree; "
            f"losses within {drift:.1e} (relative) of the first tree's"
        )
        saves = [r.get("saves_s") or [] for r in rs]
        if all(saves):
            row["saves_s"] = saves
            row["first_save_median_s"] = statistics.median(x[0] for x in saves)
            later = [y for x in saves for y in x[1:]]
            row["later_saves_median_s"] = statistics.median(later) if later else None
            print(
                f"{t}: first save median {row['first_save_median_s']:.2f} s, later saves "
                + (f"{row['later_saves_median_s']:.2f} s" if later else "none")
            )
        summary.append(row)
    if args.json_out:
        meta = {
            "recipe": args.recipe,
            "steps": args.steps,
            "repeat": args.repeat,
            "sets": args.sets,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
        }
        args.json_out.write_text(json.dumps({"meta": meta, "trees": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

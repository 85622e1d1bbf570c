"""Where `zebractl train` spends the seconds before its first step starts: each stage of the
start-up that happens before setup's first line, timed one after the other in a fresh process.

    python benchmarks/startup_probe.py [--json-out FILE] [--recipe kda_300M]

Stages (each the time it adds; a stage that fails records its error and the rest still run):
``torch`` (import), ``cuda`` (the first CUDA tensor: context and libraries), ``trainer`` (import
zebractl.train.trainer and what it imports at module level), ``megatron`` (megatron.core),
``fla`` (the FLA modules a KDA or GDN step imports: :data:`FLA_STEP`), ``tilelang`` (FLA's TileLang
backend: ``TileLangBackend.can_use()`` and KDA's TileLang backward module),
``process_group`` (:func:`zebractl.runtime.dist.ensure_initialized`: torch.distributed and
megatron's parallel state), ``config`` (resolving the recipe). Run it twice in a row on a fresh
machine: the first run pays the cold page cache too. ``--lazy``: megatron and FLA imported as the
trainer imports them with ``kernels.lazy_framework_compile`` (their ``torch.compile`` wrappers
deferred: :mod:`zebractl.runtime.lazy_compile`). ``--lean``: FLA imported as
``kernels.lean_fla_import`` imports it (:mod:`zebractl.runtime.fla_import`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

T0 = time.perf_counter()


def _cuda() -> None:
    import torch

    if torch.cuda.is_available():
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()


FLA_STEP = (
    "fla.ops.kda",
    "fla.ops.gated_delta_rule",
    "fla.ops.utils",
    "fla.modules.norm.layernorm",
    "fla.modules.norm.fused_norm_gate",
    "fla.modules.norm.l2norm",
    "fla.modules.activations.ops",
    "fla.modules.causal_conv1d.ops",
    "fla.modules.fused_cross_entropy.ops",
)
"""The FLA modules a KDA or GDN training step imports (zebractl.model.ops and its kernels)."""


def _fla(lean: bool) -> Any:
    import importlib

    def run() -> dict[str, Any]:
        if lean:
            from zebractl.runtime import fla_import

            fla_import.lean()
        for name in FLA_STEP:
            importlib.import_module(name)
        return {"fla_modules": sum(m.startswith("fla") for m in sys.modules)}

    return run


def _tilelang() -> dict[str, Any]:
    from fla.backends import TileLangBackend

    usable = bool(TileLangBackend.can_use())
    import fla.ops.kda.backends.tilelang.chunk_bwd_dqkg  # noqa: F401

    return {"can_use": usable}


def _process_group() -> None:
    from zebractl.runtime import dist

    with dist.scoped():  # made as the trainer makes it, then taken down again
        pass


def _deferred(fn: Any) -> Any:
    def run() -> Any:
        from zebractl.runtime.lazy_compile import deferred_compile

        with deferred_compile():
            return fn()

    return run


def stages(recipe: str, lazy: bool = False, lean: bool = False) -> list[tuple[str, Any]]:
    wrap = _deferred if lazy else (lambda fn: fn)

    def config() -> None:
        from zebractl.config.resolve import resolve_recipe

        resolve_recipe(recipe)

    return [
        ("torch", lambda: __import__("torch")),
        ("cuda", _cuda),
        ("trainer", lambda: __import__("zebractl.train.trainer")),
        ("megatron", wrap(lambda: __import__("megatron.core"))),
        ("fla", wrap(_fla(lean))),
        ("tilelang", _tilelang),
        ("process_group", _process_group),
        ("config", config),
    ]


def run(recipe: str, lazy: bool = False, lean: bool = False) -> list[dict[str, Any]]:
    rows = [{"stage": "interpreter", "seconds": round(T0 - _process_start(), 3), "error": None}]
    for name, fn in stages(recipe, lazy, lean):
        t = time.perf_counter()
        row: dict[str, Any] = {"stage": name, "error": None}
        try:
            got = fn()
            if isinstance(got, dict):
                row |= got
        except Exception as exc:  # noqa: BLE001 - a stage's failure is its result
            row["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        row["seconds"] = round(time.perf_counter() - t, 3)
        rows.append(row)
        print(f"{name:>14}  {row['seconds']:7.2f} s  {row['error'] or ''}", flush=True)
    return rows


def _process_start() -> float:
    """This process's start on the perf_counter clock (Linux: /proc; else now)."""
    try:
        import os

        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        up = float(Path("/proc/uptime").read_text().split()[0])
        age = up - ticks / os.sysconf("SC_CLK_TCK")
        return time.perf_counter() - age
    except (OSError, ValueError, IndexError):
        return T0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="kda_300M")
    ap.add_argument("--lazy", action="store_true", help="the compile wrappers deferred")
    ap.add_argument(
        "--lean", action="store_true", help="FLA imported as kernels.lean_fla_import does"
    )
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args(argv)
    rows = run(args.recipe, args.lazy, args.lean)
    total = round(sum(r["seconds"] for r in rows), 2)
    print(f"{'total':>14}  {total:7.2f} s", flush=True)
    if args.json_out:
        doc = {
            "recipe": args.recipe,
            "lazy": args.lazy,
            "lean": args.lean,
            "rows": rows,
            "total_s": total,
        }
        args.json_out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

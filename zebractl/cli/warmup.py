"""`zebractl warmup RECIPE`: compile and tune the recipe's GPU kernels into the kernel cache."""

from __future__ import annotations

from pathlib import Path

import typer

from zebractl.cli._common import (
    JSON_HELP,
    SET_HELP,
    complete_recipe,
    complete_set,
    emit_json,
    err,
    guarded,
    stdout_to_stderr,
)
from zebractl.deps import require


@guarded
def warmup(
    recipe: str = typer.Argument(
        ..., help="Recipe: shipped name or .yaml path.", autocompletion=complete_recipe
    ),
    set_: list[str] = typer.Option(
        [], "--set", help=SET_HELP, metavar="KEY=VALUE", autocompletion=complete_set
    ),
    micro: list[int] = typer.Option(
        [],
        "--micro",
        metavar="N",
        help="Micro-batch to compile for (repeatable; default: the recipe's batch.micro).",
    ),
    export: Path = typer.Option(
        None,
        "--export",
        help="Also write the cache's tuned configurations to this .tar.xz (what zebractl ships "
        "for a GPU).",
    ),
    export_compiled: Path = typer.Option(
        None,
        "--export-compiled",
        help="Also write the cache's compiled kernels (Triton binaries and launchers, TileLang "
        "libraries) to this .tar.xz (what zebractl ships per GPU architecture as "
        "sm<NN>_torch-<v>_triton-<v>_fla-<v>.compiled.tar.xz).",
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP + " Progress goes to stderr."),
) -> None:
    """Compile and tune the recipe's FLA kernels into the persistent kernel cache, ahead of a job.

    The cache is ~/.cache/zebractl/kernels/<gpu>_torch-<v>_triton-<v>_fla-<v>/ (ZEBRACTL_CACHE_DIR
    moves it; TRITON_CACHE_DIR / TILELANG_CACHE_DIR, when set, are used instead). `zebractl train`
    reads the same cache. Needs a CUDA GPU (exit 2 without one).
    """
    require("warmup")
    from zebractl.config.catalog import locate
    from zebractl.config.resolve import resolve_recipe
    from zebractl.train.kernel_warmup import report
    from zebractl.train.kernel_warmup import warm_kernels as run

    say = err if json_out else print
    r = resolve_recipe(locate(recipe), set_)
    with stdout_to_stderr(json_out):  # TileLang logs its compiles on stdout
        res = run(r.run, list(micro) or None, export, say, export_compiled=export_compiled)
    before, after = res.before, res.after
    say(
        f"warm: {after['tuned']} tuned configurations ({after['tuned'] - before['tuned']:+d}), "
        f"{after['compiled']} compiled kernels ({after['compiled'] - before['compiled']:+d}) in "
        f"{res.cache}"
    )
    if json_out:
        emit_json(report(r.name, res))

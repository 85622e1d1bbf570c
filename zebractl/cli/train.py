"""`zebractl train RECIPE`: train on one device (CPU or one GPU), with checkpoints and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from zebractl.cli._common import (
    EXIT_INTERRUPTED,
    SET_HELP,
    complete_recipe,
    complete_set,
    err,
    guarded,
)


@guarded
def train(
    recipe: str = typer.Argument(
        ..., help="Recipe: shipped name or .yaml path.", autocompletion=complete_recipe
    ),
    set_: list[str] = typer.Option(
        [], "--set", help=SET_HELP, metavar="KEY=VALUE", autocompletion=complete_set
    ),
    output: Path = typer.Option(
        None, "--output", "-o", help="Run directory (default: the recipe's output_dir)."
    ),
    init_from: Path = typer.Option(
        None,
        "--init-from",
        help="Start from a checkpoint's weights with a fresh optimizer and schedule (finetune).",
    ),
    nproc: int = typer.Option(None, "--nproc", help="GPUs on this node (starts torchrun)."),
    slurm: bool = typer.Option(False, "--slurm", help="Write an sbatch script."),
    submit: bool = typer.Option(False, "--submit", help="Submit the sbatch script."),
) -> None:
    """Train a recipe: one device now; torchrun and Slurm launch land with data parallelism."""
    from zebractl.config.catalog import looks_like_path
    from zebractl.config.errors import ConfigError
    from zebractl.config.resolve import resolve_recipe

    if (nproc or 1) > 1 or slurm or submit:
        raise ConfigError(
            "--nproc > 1, --slurm and --submit are not available yet (multi-GPU "
            "data parallelism is the next step of `zebractl train`); nothing was done"
        )
    ref: str | Path = Path(recipe) if looks_like_path(recipe) or Path(recipe).is_file() else recipe
    r = resolve_recipe(ref, set_)
    cfg = r.run
    out = output or Path(cfg.output_dir or f"runs/{r.name}")
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema_version": 1,
        "recipe": r.source,
        "config": r.values(),
        "provenance": r.provenance,
    }
    (out / "config.resolved.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    from zebractl.train.loop import run

    result = run(cfg, out, config_doc=doc, init_from=init_from, console=print)
    where = f"; checkpoint {result.checkpoint}" if result.checkpoint else ""
    loss = f"{result.final_loss:.4f}" if result.final_loss is not None else "n/a"
    print(
        f"{result.stopped}: {result.iterations} iterations, final loss {loss}{where}; metrics "
        f"in {out / 'metrics.jsonl'}"
    )
    if result.stopped == "interrupted":
        err("interrupted: the checkpoint above resumes the run (rerun the same command)")
        raise typer.Exit(EXIT_INTERRUPTED)

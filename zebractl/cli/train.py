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
    require,
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
    """Train a recipe on one device, on --nproc GPUs (torchrun), or through Slurm (--slurm)."""
    import os
    import subprocess

    from zebractl.config.catalog import looks_like_path
    from zebractl.config.errors import ConfigError
    from zebractl.config.resolve import resolve_recipe
    from zebractl.train import launch

    require(("torch", "numpy", "megatron.core", "fla"), "train", "`zebractl train`")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if nproc is not None and nproc < 1:
        raise ConfigError("--nproc must be at least 1")
    if submit:
        slurm = True
    # the GPUs actually used decide the data-parallel size, unless the user set it explicitly
    explicit_gpus = any(x.partition("=")[0].strip() == "parallelism.num_gpus" for x in set_)
    ref: str | Path = Path(recipe) if looks_like_path(recipe) or Path(recipe).is_file() else recipe
    # (the recipe's own GPU count is validated only where it is used: a Slurm job)
    gpus = resolve_recipe(ref, set_).run.parallelism.num_gpus if slurm else (nproc or world)
    sets = set_ if explicit_gpus else [*set_, f"parallelism.num_gpus={gpus}"]
    r = resolve_recipe(ref, sets)
    cfg = r.run
    out = output or Path(cfg.output_dir or f"runs/{r.name}")
    out.mkdir(parents=True, exist_ok=True)
    args = launch.child_args(recipe, sets, str(out), str(init_from) if init_from else None)
    if slurm:
        per_node = min(8, gpus)
        nodes = -(-gpus // per_node)
        script = out / "train.sbatch"
        script.write_text(
            launch.slurm_script(r.name, nodes, per_node, args, str(out)), encoding="utf-8"
        )
        print(f"wrote {script} ({nodes} node(s) x {per_node} GPU(s))")
        if submit:
            try:
                done = subprocess.run(["sbatch", str(script)], check=False)
            except FileNotFoundError:
                err("sbatch is not on PATH: submit the script on the cluster's login node")
                raise typer.Exit(1) from None
            raise typer.Exit(done.returncode)
        return
    if nproc is not None and nproc > 1 and world == 1:
        cmd = launch.torchrun_command(nproc, args)
        print("launching: " + " ".join(cmd))
        raise typer.Exit(subprocess.run(cmd, check=False).returncode)

    doc = {
        "schema_version": 1,
        "recipe": r.source,
        "config": r.values(),
        "provenance": r.provenance,
    }
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "config.resolved.json").write_text(
            json.dumps(doc, indent=2) + "\n", encoding="utf-8"
        )
    from zebractl.train.loop import run

    result = run(cfg, out, config_doc=doc, init_from=init_from, console=print)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    where = f"; checkpoint {result.checkpoint}" if result.checkpoint else ""
    loss = f"{result.final_loss:.4f}" if result.final_loss is not None else "n/a"
    print(
        f"{result.stopped}: {result.iterations} iterations, final loss {loss}{where}; metrics "
        f"in {out / 'metrics.jsonl'}"
    )
    if result.stopped == "interrupted":
        err("interrupted: the checkpoint above resumes the run (rerun the same command)")
        raise typer.Exit(EXIT_INTERRUPTED)

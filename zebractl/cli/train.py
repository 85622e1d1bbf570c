"""`zebractl train RECIPE`: train on one device, on --nproc GPUs (torchrun), or through Slurm."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from zebractl.cli._common import (
    EXIT_CHECK,
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

if TYPE_CHECKING:
    from zebractl.train.launch import TrainRequest
    from zebractl.train.trainer import RunResult

STOP_HINT = {
    130: "interrupted (SIGINT)",
    143: "terminated (SIGTERM)",
    138: "stopped by SIGUSR1 (the time-limit warning)",
}


@guarded
def train(
    recipe: str = typer.Argument(
        ..., help="Recipe: shipped name or .yaml path.", autocompletion=complete_recipe
    ),
    set_: list[str] = typer.Option(
        [], "--set", help=SET_HELP, metavar="KEY=VALUE", autocompletion=complete_set
    ),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        metavar="RUN",
        help="Run directory (default: the recipe's output_dir).",
    ),
    init_from: Path = typer.Option(
        None,
        "--init-from",
        help="Start from a checkpoint's weights (or a Hugging Face folder's: a zebractl export or "
        "an FLA KDA/GDN checkpoint) with a fresh optimizer and schedule (finetune).",
    ),
    reference: str = typer.Option(
        None,
        "--reference",
        help="fla: train FLA's own model class (pure KDA/GDN) from the same initial weights on "
        "the same samples, into RUN-fla-reference (the other side of `zebractl compare`).",
    ),
    check: bool = typer.Option(
        False,
        "--check",
        help="Run every pre-flight check (config, engine, GPUs, data, tokenizer, memory, disk) and "
        "exit without training; what this machine cannot check is listed as not checked.",
    ),
    nproc: int = typer.Option(
        None, "--nproc", metavar="N", help="GPUs on this node, at least 1 (starts torchrun)."
    ),
    slurm: bool = typer.Option(False, "--slurm", help="Write an sbatch script."),
    submit: bool = typer.Option(False, "--submit", help="Submit the sbatch script."),
    json_out: bool = typer.Option(
        False, "--json", help=JSON_HELP + " Progress lines go to stderr."
    ),
) -> None:
    """Train a recipe on one device, on --nproc GPUs (torchrun), or through Slurm (--slurm).

    SIGINT, SIGTERM and SIGUSR1 finish the current step, save a checkpoint holding it and exit
    130 / 143 / 138; rerunning the same command resumes.
    """
    require("train")
    from zebractl.train.launch import TrainRequest, start
    from zebractl.train.progress import wants_bar

    req = TrainRequest(
        recipe,
        list(set_),
        output,
        init_from,
        nproc,
        slurm,
        submit,
        reference,
        bar=wants_bar(json_out),  # a terminal only: CI logs and pipes get the lines alone
    )
    if check:
        _check(req, json_out)
        return
    say = err if json_out else print
    with stdout_to_stderr(json_out):  # third-party output must not break the JSON document
        out = start(req, say)
    for line in out.lines:
        say(line)
    res = out.result
    if out.rank != 0:
        raise typer.Exit(out.exit_code)
    if res is not None:
        where = f"; checkpoint {res.checkpoint}" if res.checkpoint else ""
        say(f"{res.stopped}: {_summary(res)}{where}; metrics in {out.metrics}")
        if res.stopped == "signal":
            err(
                f"{STOP_HINT.get(out.exit_code, 'stopped')}: the checkpoint above resumes the run "
                "(rerun the same command)"
            )
    if json_out:
        from zebractl.schemas.reports import TrainReport

        emit_json(
            TrainReport(
                launched=out.kind,
                run_dir=str(out.run_dir),
                exit_code=out.exit_code,
                metrics=str(out.metrics),
                script=str(out.script) if out.script else None,
                **(
                    {
                        "stopped": res.stopped,
                        "iterations": res.iterations,
                        "resumed_from": res.resumed_from,
                        "final_loss": res.final_loss,
                        "val_loss": res.val_loss,
                        "skipped": res.skipped,
                        "checkpoint": str(res.checkpoint) if res.checkpoint else None,
                        "total_iterations": res.total,
                        "tokens": res.tokens,
                        "wall_seconds": res.wall_s,
                        "mean_tokens_per_s": res.tokens_per_s,
                    }
                    if res is not None
                    else {}
                ),
            )
        )
    if out.exit_code:
        raise typer.Exit(out.exit_code)


def _summary(res: RunResult) -> str:
    """``10/10 iterations, final loss 7.2345, val_loss 7.4012; 20.5k tokens, 0:00:12 wall, 1,706
    tok/s mean``: the final line's account of the run."""
    from zebractl.train.progress import count, duration

    loss = f"{res.final_loss:.4f}" if res.final_loss is not None else "n/a"
    val = f", val_loss {res.val_loss:.4f}" if res.val_loss is not None else ""
    tps = f"{res.tokens_per_s:,.0f} tok/s" if res.tokens_per_s is not None else "n/a tok/s"
    return (
        f"{res.iterations}/{res.total} iterations, final loss {loss}{val}; "
        f"{count(res.tokens)} tokens, {duration(res.wall_s)} wall, {tps} mean"
    )


def _check(req: TrainRequest, json_out: bool) -> None:
    from zebractl.train.check import preflight
    from zebractl.train.launch import resolve_request

    recipe = req.recipe
    # the same validation and resolution as a real train (--nproc, --reference, GPU count, run dir)
    resolved = resolve_request(req, world=None)
    checks = preflight(resolved.resolved.run, resolved.run.checkpoints)
    ok = all(c.status != "failed" for c in checks)
    if json_out:
        from zebractl.schemas.reports import PreflightCheck, TrainCheckReport

        emit_json(
            TrainCheckReport(
                recipe=recipe,
                ok=ok,
                checks=[
                    PreflightCheck(name=c.name, status=c.status, detail=c.detail) for c in checks
                ],
            )
        )
    else:
        for c in checks:
            print(f"{c.name:<7} {c.status:<12} {c.detail}")
    if not ok:
        err(f"train --check: {', '.join(c.name for c in checks if c.status == 'failed')} failed")
        raise typer.Exit(EXIT_CHECK)

"""`zebractl train RECIPE`: train on one device, on --nproc GPUs (torchrun), or through Slurm."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from zebractl.cli._common import (
    EXIT_CHECK,
    JSON_HELP,
    RecipeArg,
    SetOpt,
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


OutputOpt = Annotated[
    Path,
    typer.Option(
        "-o",
        "--output",
        metavar="RUN",
        help="Run directory (default: the recipe's output_dir).",
    ),
]
InitFromOpt = Annotated[
    Path,
    typer.Option(
        "--init-from",
        help="Start from a checkpoint's weights (or a Hugging Face folder's: a zebractl export or "
        "an FLA KDA/GDN checkpoint) with a fresh optimizer and schedule (finetune).",
    ),
]
ReferenceOpt = Annotated[
    str,
    typer.Option(
        "--reference",
        help="fla: train FLA's own model class (pure KDA/GDN) from the same initial weights on "
        "the same samples, into RUN-fla-reference (the other side of `zebractl compare`).",
    ),
]
CheckOpt = Annotated[
    bool,
    typer.Option(
        "--check",
        help="Run every pre-flight check (config, engine, GPUs, data, tokenizer, memory, disk) and "
        "exit without training; what this machine cannot check is listed as not checked.",
    ),
]
NprocOpt = Annotated[
    int,
    typer.Option("--nproc", metavar="N", help="GPUs on this node, at least 1 (starts torchrun)."),
]
SlurmOpt = Annotated[bool, typer.Option("--slurm", help="Write an sbatch script.")]
SubmitOpt = Annotated[bool, typer.Option("--submit", help="Submit the sbatch script.")]
TrainJsonOpt = Annotated[
    bool, typer.Option("--json", help=JSON_HELP + " Progress lines go to stderr.")
]


@guarded
def train(
    recipe: RecipeArg,
    set_: SetOpt = (),
    output: OutputOpt = None,
    init_from: InitFromOpt = None,
    reference: ReferenceOpt = None,
    check: CheckOpt = False,
    nproc: NprocOpt = None,
    slurm: SlurmOpt = False,
    submit: SubmitOpt = False,
    json_out: TrainJsonOpt = False,
) -> None:
    """Train a recipe on one device, on --nproc GPUs (torchrun), or through Slurm (--slurm).

    SIGINT, SIGTERM and SIGUSR1 finish the current step, save a checkpoint holding it and exit
    130 / 143 / 138; rerunning the same command resumes.
    """
    require("train")
    from zebractl.train.launch import TrainRequest, report, start
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
        emit_json(report(out))
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
    """--check: the pre-flight checks (a line each, or the report); exit 3 if one failed."""
    from zebractl.train.check import check

    report = check(req)
    if json_out:
        emit_json(report)
    else:
        for c in report.checks:
            print(f"{c.name:<7} {c.status:<12} {c.detail}")
    if not report.ok:
        failed = ", ".join(c.name for c in report.checks if c.status == "failed")
        err(f"train --check: {failed} failed")
        raise typer.Exit(EXIT_CHECK)

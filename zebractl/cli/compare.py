"""`zebractl compare`: the parity report of two runs (or of a run and its FLA reference)."""

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
    from zebractl.schemas.reports import CompareCheck


@guarded
def compare(
    run_a: Path = typer.Argument(..., help="Run A: the baseline of every delta (our run)."),
    run_b: Path = typer.Argument(None, help="Run B (e.g. the reference run); omit it with --fla."),
    fla: bool = typer.Option(
        False,
        "--fla",
        help="Train (or resume, or reuse) RUN_A's FLA reference into RUN_A-fla-reference, then "
        "compare against it.",
    ),
    assert_: bool = typer.Option(
        False, "--assert", help="Exit 3 listing the checks outside their tolerance."
    ),
    tolerance: list[str] = typer.Option(
        [],
        "--tolerance",
        metavar="KEY=VALUE",
        help="Override a tolerance: iteration1_abs (1e-3), last_half_pct (1.0), eval_pp (1.0).",
    ),
    output: Path = typer.Option(
        None, "--output", help="Report folder (default: RUN_A/reports/compare-<RUN_B name>)."
    ),
    force: bool = typer.Option(
        False, "--force", help="Compare runs that differ in data, tokenizer, sequence or batch."
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Parity report of two runs: loss at iteration 1, powers of two and the last (Δ, Δ%), the
    last-half mean |Δ%|, validation loss, throughput, eval deltas and every config difference;
    Markdown, JSON and PNG plots (loss, Δ%, throughput).

    One writer per run directory: every compare writes its report (--json too), so it holds the
    lock of the run directory holding the report folder (RUN_A by default) from after the usage
    checks to the end, before anything heavy is imported: a compare into a run that a train is
    writing to exits 2 naming it. RUN_B is only read. With --fla the reference is trained under
    RUN_A's lock, and the trainer locks RUN_A-fla-reference itself.
    """
    from zebractl.config.errors import ConfigError

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
    b_name = rep.fla_reference_dir(run_a).name if fla else Path(run_b).name
    folder = output or Path(run_a) / "reports" / f"compare-{b_name}"
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder}: exists and is not a folder; choose another --output")
    from zebractl.run import lock

    say = err if json_out else print
    # one writer per run directory: the report folder's run (RUN_A by default) is locked from here
    # to the end, --fla's reference training included (the trainer locks RUN_A-fla-reference)
    with lock.hold(lock.writer_root(folder), "compare", say):
        _compare(run_a, run_b, fla, assert_, tol, folder, force, json_out, say)


def _compare(
    run_a: Path,
    run_b: Path | None,
    fla: bool,
    assert_: bool,
    tol: dict[str, float],
    folder: Path,
    force: bool,
    json_out: bool,
    say: Callable[[str], None],
) -> None:
    from zebractl.compare import render
    from zebractl.compare import report as rep

    with stdout_to_stderr(json_out):
        if fla:
            run_b = rep.fla_reference(run_a, console=say)
        assert run_b is not None
        data = rep.compare(run_a, run_b, force=force)
    from zebractl.schemas.reports import CompareReport

    checks = rep.checks(data, tol)
    report = CompareReport(**data, checks=checks, passed=all(c["ok"] for c in checks), files=[])
    report = render.write(report, folder)
    if json_out:
        emit_json(report)
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{report.a.label} vs {report.b.label}", title_justify="left")
        for col in ("iteration", "A", "B", "Δ", "Δ%"):
            table.add_column(col, justify="right")
        for x in report.loss:
            table.add_row(
                str(x.iteration),
                f"{x.a:.4f}",
                f"{x.b:.4f}",
                f"{x.delta:+.4f}",
                f"{x.delta_pct:+.3f}",
            )
        Console(width=max(Console().width, 80)).print(table)
        t = report.throughput.ratio.tokens_per_s
        print(
            f"last-half mean |Δ%| {report.last_half_mean_abs_pct:.3f}; throughput A/B "
            + (f"{t:.3f}" if t is not None else "n/a")
            + (f"; eval mean |Δ| {report.eval_mean_abs_pp:.2f} pp" if report.eval else "")
            + (f"; {len(report.differences)} config difference(s)" if report.differences else "")
        )
    failed = [c for c in report.checks if not c.ok]
    if not json_out:  # the last two lines: the verdict, then the report (what the main job ends on)
        print(verdict(report.checks, asserted=assert_))
        print(f"report: {folder / 'compare.md'}")
    if assert_ and failed:
        err(
            "compare: outside tolerance: "
            + "; ".join(f"{c.what} {c.value:.6g} > {c.tolerance:.6g}" for c in failed)
        )
        raise typer.Exit(EXIT_CHECK)


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

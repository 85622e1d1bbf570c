"""`zebractl doctor`: can each command run here? Imports what it needs, for real, and says the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from zebractl.cli._common import EXIT_CHECK, JSON_HELP, emit_json, err, guarded, state

if TYPE_CHECKING:  # pydantic stays off the import path of --help and completion
    from zebractl.schemas.reports import DoctorReport


def _complete_command(incomplete: str) -> list[str]:
    from zebractl.deps import NEEDS

    return [c for c in NEEDS if " " not in c and c.startswith(incomplete)]


@guarded
def doctor(
    commands: list[str] = typer.Argument(
        None,
        help="Commands to check (default: all): prepare train warmup convert verify eval compare.",
        autocompletion=_complete_command,
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Check that each command's run-time dependencies import here, and name the extra to install.

    Imports every package a command uses (a package can be installed and still fail to import, as
    FLA does without triton) and zebractl's own modules for it; prints the versions of the stack
    and the GPU torch sees. Exit 3 when a command asked about cannot run.
    """
    from zebractl.runtime.environment import doctor as run

    report = run(commands)
    if json_out:
        emit_json(report)
    else:
        _print(report)
    if not report.ok:
        bad = ", ".join(r.command for r in report.commands if not r.ok)
        err(f"doctor: {bad} cannot run here")
        raise typer.Exit(EXIT_CHECK)


def _print(report: DoctorReport) -> None:
    for r in report.commands:
        bad = [m for m in r.modules if not m.ok]
        print(f"{r.command:<14} {'ok' if r.ok else 'MISSING'}")
        for m in bad if not state.verbose else r.modules:
            print(f"  {m.module}: {m.error or 'ok'}")
        if bad:
            print(f"  fix: {bad[0].install}")
    stack = ", ".join(f"{k} {v}" for k, v in report.versions.items() if v is not None)
    print(f"versions: {stack}")
    print(f"cuda: {report.cuda or 'none'}")

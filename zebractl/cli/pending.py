"""Pipeline commands whose runtime has not landed yet.

Each shows its planned arguments in ``--help`` and, when run, says in one line that it is not
available yet and exits 2 — never fake work. Each moves to its own module when its issue lands.
"""

from __future__ import annotations

from pathlib import Path

import typer

from zebractl.cli._common import EXIT_USAGE, JSON_HELP, err

_WHEN = {
    "compare": "a later issue",
}


def _not_yet(command: str) -> None:
    err(
        f"zebractl {command}: not available yet in this version (lands with {_WHEN[command]}); "
        "nothing was done"
    )
    raise typer.Exit(EXIT_USAGE)


def compare(
    run: Path = typer.Argument(..., help="Our run directory."),
    reference: Path = typer.Argument(..., help="Reference (FLA) run or golden file."),
    assert_: bool = typer.Option(False, "--assert", help="Exit 3 when outside tolerance."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Parity report against FLA: loss curves, eval deltas, throughput."""
    _not_yet("compare")


def register(app: typer.Typer, epilog: str) -> None:
    """Add the pending commands to the app."""
    for name, fn in (("compare", compare),):
        app.command(name, epilog=epilog)(fn)

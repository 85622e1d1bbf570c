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
    from zebractl.deps import EXTRA_FOR, NEEDS, probe, versions
    from zebractl.errors import ConfigError

    wanted = list(commands or NEEDS)
    for c in wanted:
        if c not in NEEDS:
            raise ConfigError(f"doctor: unknown command {c!r} (one of: {', '.join(NEEDS)})")
    if "compare" in wanted and commands:
        wanted.append("compare --fla")  # compare without --fla is only its plots
    from zebractl.schemas.reports import DoctorCommand, DoctorModule, DoctorReport

    rows = []
    for c in dict.fromkeys(wanted):
        mods = [DoctorModule(module=p.module, ok=p.error is None, error=p.error, install=p.install)
                for p in probe(c)]  # fmt: skip
        rows.append(
            DoctorCommand(command=c, ok=all(m.ok for m in mods), extra=EXTRA_FOR[c], modules=mods)
        )
    report = DoctorReport(
        ok=all(r.ok for r in rows), commands=rows, versions=versions(), cuda=_cuda()
    )
    if json_out:
        emit_json(report)
    else:
        _print(report)
    if not report.ok:
        err("doctor: " + ", ".join(r.command for r in rows if not r.ok) + " cannot run here")
        raise typer.Exit(EXIT_CHECK)


def _cuda() -> str | None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


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

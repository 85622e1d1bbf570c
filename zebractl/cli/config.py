"""`zebractl config show|validate|diff`: resolved values and where each one came from."""

from __future__ import annotations

import json
from typing import Any

import typer

from zebractl.cli._common import (
    EXIT_USAGE,
    JSON_HELP,
    SET_HELP,
    complete_config,
    complete_set,
    emit_json,
    err,
    guarded,
)
from zebractl.cli._examples import epilog

app = typer.Typer(help="Show, validate and compare resolved configs.", no_args_is_help=True)


def _flat(values: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(values, dict):
        out: dict[str, Any] = {}
        for k, v in values.items():
            out |= _flat(v, f"{prefix}{k}.")
        return out
    return {prefix.rstrip("."): values}


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


@app.command("show", epilog=epilog("config show"))
@guarded
def show(
    config: str = typer.Argument(
        ...,
        help="Recipe or preset (a shipped name or a .yaml path), or a run directory (RUN or "
        "RUN/config.resolved.json: the config it recorded).",
        autocompletion=complete_config,
    ),
    set_: list[str] = typer.Option(
        [], "--set", help=SET_HELP, metavar="KEY=VALUE", autocompletion=complete_set
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Print every resolved value with its source (default, FILE:LINE or --set); for a run
    directory, the config the run recorded, with the sources it recorded."""
    from zebractl.config.resolve import resolve_any

    r = resolve_any(config, set_)
    values = r.values()
    derived = r.derived
    if json_out:
        from zebractl.schemas.reports import ConfigShowReport

        emit_json(
            ConfigShowReport(
                kind=r.kind,
                name=r.name,
                source=r.source,
                config=r.config,
                provenance=r.provenance,
                derived=derived,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{r.kind} {r.name} ({r.source})", title_justify="left")
    table.add_column("key", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    for key, value in _flat(values).items():
        table.add_row(key, _fmt(value), r.provenance.get(key, "default"))
    if derived is not None:
        for key, value in derived.model_dump(mode="json").items():
            table.add_row(f"(derived) {key}", _fmt(value), "derived")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    console.print("merge order: schema default < preset < recipe < --set")


@app.command("validate", epilog=epilog("config validate"))
@guarded
def validate(
    paths: list[str] = typer.Argument(
        ...,
        metavar="CONFIG",
        help="Recipe or preset files (or shipped names), or run directories.",
        autocompletion=complete_config,
    ),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Validate presets and recipes; exit 2 if any is invalid."""
    from zebractl.config.errors import ConfigError
    from zebractl.config.resolve import resolve_any
    from zebractl.schemas.reports import ConfigValidateReport, ConfigValidateResult

    results = []
    for path in paths:
        try:
            r = resolve_any(path)
        except ConfigError as exc:
            results.append(ConfigValidateResult(path=path, ok=False, errors=list(exc.problems)))
            continue
        results.append(
            ConfigValidateResult(path=path, ok=True, kind=r.kind, name=r.name, errors=[])
        )
    report = ConfigValidateReport(results=results, ok=all(x.ok for x in results))
    if json_out:
        emit_json(report)
    else:
        for res in results:
            if res.ok:
                print(f"ok       {res.path} ({res.kind} {res.name})")
            else:
                print(f"invalid  {res.path}")
                for line in res.errors:
                    err(f"  {line}")
    if not report.ok:
        raise typer.Exit(EXIT_USAGE)


@app.command("diff", epilog=epilog("config diff"))
@guarded
def diff(
    a: str = typer.Argument(..., help="First recipe or preset.", autocompletion=complete_config),
    b: str = typer.Argument(..., help="Second recipe or preset.", autocompletion=complete_config),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Show the resolved values that differ between two configs or runs, with their sources."""
    from zebractl.config.resolve import resolve_any
    from zebractl.schemas.reports import ConfigDifference, ConfigDiffReport

    ra, rb = resolve_any(a), resolve_any(b)
    fa, fb = _flat(ra.values()), _flat(rb.values())
    rows = [
        ConfigDifference(
            key=key,
            a=fa.get(key),
            b=fb.get(key),
            a_source=ra.provenance.get(key),
            b_source=rb.provenance.get(key),
        )
        for key in sorted(set(fa) | set(fb))
        if fa.get(key, "<absent>") != fb.get(key, "<absent>")
    ]
    if json_out:
        emit_json(ConfigDiffReport(a=ra.source, b=rb.source, differences=rows))
        return
    if not rows:
        print(f"no differences between {ra.source} and {rb.source}")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{ra.source} vs {rb.source}", title_justify="left")
    for col in ("key", "a", "b", "a source", "b source"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(row.key, _fmt(row.a), _fmt(row.b), str(row.a_source), str(row.b_source))
    Console(width=max(Console().width, 140)).print(table)

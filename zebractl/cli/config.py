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
from zebractl.util import flatten

app = typer.Typer(help="Show, validate and compare resolved configs.", no_args_is_help=True)


def _fmt(value: Any) -> str:
    """A value as YAML spells it: a string bare, anything else as JSON (``null``, ``true``)."""
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
    from zebractl.run.resolve import resolve_any, show_report

    r = resolve_any(config, set_)
    if json_out:
        emit_json(show_report(r))
        return
    values = r.values()
    derived = r.derived
    from zebractl.cli import _tables

    # each value with its source (file:line, --set, default) on a line of its own under it, as in
    # config diff: a source folded inside a narrow third column would break file:line in two
    table = _tables.table(f"{r.kind} {r.name} ({r.source})", [("key", "key"), ("value", "value")])
    t = _tables.text
    for key, value in flatten(values).items():
        table.add_row(t(key), t(_fmt(value), r.provenance.get(key, "default")))
    if derived is not None:
        for key, value in derived.model_dump(mode="json").items():
            table.add_row(t(f"(derived) {key}"), t(_fmt(value), "derived"))
    _tables.show(table)
    print("merge order: schema default < preset < recipe < --set")


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
    from zebractl.run.resolve import validate as run

    report = run(paths)
    if json_out:
        emit_json(report)
    else:
        for res in report.results:
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
    from zebractl.run.resolve import resolve_any
    from zebractl.schemas.reports import ConfigDifference, ConfigDiffReport

    ra, rb = resolve_any(a), resolve_any(b)
    fa, fb = flatten(ra.values()), flatten(rb.values())
    rows = [
        ConfigDifference(
            key=key,
            a=fa.get(key),
            b=fb.get(key),
            a_source=ra.provenance.get(key),
            b_source=rb.provenance.get(key),
        )
        for key in sorted(set(fa) | set(fb))
        if not (_unset(fa, key) and _unset(fb, key))  # null or absent on both sides: no news
        if fa.get(key, "<absent>") != fb.get(key, "<absent>")
    ]
    if json_out:
        emit_json(ConfigDiffReport(a=ra.source, b=rb.source, differences=rows))
        return
    if not rows:
        print(f"no differences between {ra.source} and {rb.source}")
        return
    from zebractl.cli import _tables

    table = _tables.table(
        f"A = {ra.source}, B = {rb.source}",
        [("key", "key"), ("A (source)", "value"), ("B (source)", "value")],
    )
    for row in rows:
        table.add_row(
            _tables.text(row.key),
            _side(row.a, row.a_source, _shown(fa, row.key)),
            _side(row.b, row.b_source, _shown(fb, row.key)),
        )
    _tables.show(table)


def _unset(flat: dict[str, Any], key: str) -> bool:
    """Null, or absent: neither the key nor a key under it (``model.kda`` of a KDA model is
    absent from its flat values but its ``model.kda.*`` keys are there)."""
    if key in flat:
        return flat[key] is None
    return not any(k.startswith(key + ".") for k in flat)


def _shown(flat: dict[str, Any], key: str) -> str:
    """How a side holds the key: ``value``, ``section`` (keys under it) or ``absent``."""
    if key in flat:
        return "value"
    return "absent" if _unset(flat, key) else "section"


def _side(value: Any, source: str | None, shown: str) -> Any:
    """One side of a difference: the value as YAML spells it over its source (FILE:LINE or --set,
    else the schema's default); ``-`` alone where the config has no such key (a preset next to a
    recipe), ``(section)`` where it has keys under it (its mixer block)."""
    from zebractl.cli import _tables

    if shown != "value":
        return _tables.text("-" if shown == "absent" else "(section)")
    return _tables.text(_fmt(value), source if source is not None else "default")

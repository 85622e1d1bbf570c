"""`zebractl presets` and `zebractl recipes`: what ships, one line each."""

from __future__ import annotations

import typer

from zebractl.cli import _tables
from zebractl.cli._common import JSON_HELP, emit_json, guarded
from zebractl.cli._tables import Kind


def _human(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _print_table(title: str, columns: list[tuple[str, Kind]], rows: list[list[str]]) -> None:
    table = _tables.table(title, columns)
    for row in rows:
        table.add_row(*map(_tables.text, row))
    _tables.show(table)


@guarded
def presets(json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the shipped architecture presets with their size and layout."""
    from zebractl.planning.catalog import presets as listing

    report = listing()
    items = report.presets
    if json_out:
        emit_json(report)
        return
    _print_table(
        "presets",
        [
            ("name", "key"),
            ("params", "number"),
            ("blocks", "number"),
            ("mixers", "value"),
            ("description", "value"),
        ],
        [
            [i.name, _human(i.parameters), str(i.num_blocks), "+".join(i.mixers), i.description]
            for i in items
        ],
    )


@guarded
def recipes(json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the shipped recipes: preset, GPUs, batch, length."""
    from zebractl.planning.catalog import recipes as listing

    report = listing()
    items = report.recipes
    if json_out:
        emit_json(report)
        return
    _print_table(
        "recipes",
        [
            ("name (preset)", "key"),  # the preset under the name: it fits 80 columns
            ("gpus", "number"),
            ("batch", "number"),
            ("tokens", "number"),
            ("description", "value"),
        ],
        [
            [
                f"{i.name}\n({i.preset})",
                str(i.num_gpus),
                f"{i.micro_batch}/{i.global_batch}x{i.seq_length}",
                _human(i.total_tokens),
                i.description,
            ]
            for i in items
        ],
    )

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
    from zebractl.config import catalog
    from zebractl.config.resolve import resolve_preset
    from zebractl.layout import model_shapes, numel
    from zebractl.schemas.reports import PresetEntry, PresetsReport

    items: list[PresetEntry] = []
    for name, path in catalog.shipped("preset").items():
        m = resolve_preset(path).config
        items.append(
            PresetEntry(
                name=name,
                description=m.description,
                parameters=numel(model_shapes(m)),  # type: ignore[arg-type]
                num_blocks=m.num_blocks,  # type: ignore[union-attr]
                hidden_size=m.hidden_size,  # type: ignore[union-attr]
                mixers=sorted(set(m.blocks)),  # type: ignore[union-attr]
                path=catalog.display_path(path),
            )
        )
    if json_out:
        emit_json(PresetsReport(presets=items))
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
    from zebractl.config import catalog
    from zebractl.config.resolve import resolve_recipe
    from zebractl.schemas.reports import RecipeEntry, RecipesReport

    items: list[RecipeEntry] = []
    for name, path in catalog.shipped("recipe").items():
        r = resolve_recipe(path)
        cfg, d = r.run, r.derived
        assert d is not None
        items.append(
            RecipeEntry(
                name=name,
                description=cfg.description,
                preset=cfg.preset,
                num_gpus=cfg.parallelism.num_gpus,
                micro_batch=cfg.batch.micro,
                global_batch=cfg.batch.global_,
                seq_length=cfg.data.seq_length,
                iterations=d.iterations,
                total_tokens=d.total_tokens,
                path=catalog.display_path(path),
            )
        )
    if json_out:
        emit_json(RecipesReport(recipes=items))
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

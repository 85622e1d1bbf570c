"""`zebractl schema export`: JSON Schema files so editors validate and complete YAMLs."""

from __future__ import annotations

from pathlib import Path

import typer

from zebractl.cli._common import CheckFailed, guarded

app = typer.Typer(help="JSON Schema files for presets and recipes.", no_args_is_help=True)


@app.command("export")
@guarded
def export(
    out: Path = typer.Option(Path("schemas"), "--out", "-o", help="Folder to write into."),
    check: bool = typer.Option(
        False, "--check", help="Write nothing; exit 3 if the files in --out are stale."
    ),
) -> None:
    """Write schemas/preset.schema.json and schemas/recipe.schema.json from the Pydantic models."""
    from zebractl.schemas.export import file_schemas, render

    stale = []
    for name, schema in file_schemas().items():
        path = out / name
        text = render(schema)
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if check:
            if current != text:
                stale.append(str(path))
            continue
        if current != text:
            out.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
            print(f"wrote {path}")
        else:
            print(f"up to date {path}")
    if stale:
        raise CheckFailed(f"stale: {', '.join(stale)}; run `zebractl schema export`")
    if check:
        print("schemas are up to date")

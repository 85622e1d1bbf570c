"""`zebractl schema export`: JSON Schema files for editors (presets, recipes) and for --json reports."""

from __future__ import annotations

from pathlib import Path

import typer

from zebractl.cli._common import guarded
from zebractl.cli._examples import epilog
from zebractl.errors import CheckFailed

app = typer.Typer(
    help="JSON Schema files for presets, recipes and --json reports.", no_args_is_help=True
)


@app.command("export", epilog=epilog("schema export"))
@guarded
def export(
    out: Path = typer.Option(
        Path("schemas"), "-o", "--output", metavar="DIR", help="Folder to write into."
    ),
    out_alias: Path = typer.Option(None, "--out", hidden=True, help="Old spelling of --output."),
    check: bool = typer.Option(
        False, "--check", help="Write nothing; exit 3 if the files in --output are stale."
    ),
) -> None:
    """Write schemas/{preset,recipe}.schema.json and schemas/reports/*.schema.json from the models.

    A file in schemas/reports/ that no report produces any more is stale too: export removes it.
    """
    from zebractl.schemas.export import REPORTS_DIR, all_schemas, render

    if out_alias is not None:  # 0.1.0 spelled it --out (kept, hidden)
        out = out_alias

    schemas = all_schemas()
    stale = []
    for name, schema in schemas.items():
        path = out / name
        text = render(schema)
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if check:
            if current != text:
                stale.append(str(path))
            continue
        if current != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
            print(f"wrote {path}")
        else:
            print(f"up to date {path}")
    reports = out / REPORTS_DIR
    orphans = sorted(
        p
        for p in (reports.glob("*.schema.json") if reports.is_dir() else [])
        if f"{REPORTS_DIR}/{p.name}" not in schemas
    )
    for path in orphans:
        if check:
            stale.append(f"{path} (no report has this name)")
        else:
            path.unlink()
            print(f"removed {path}")
    if stale:
        raise CheckFailed(f"stale: {', '.join(stale)}; run `zebractl schema export`")
    if check:
        print("schemas are up to date")

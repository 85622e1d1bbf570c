"""Generated JSON Schema files: in sync with the models, and they validate the shipped YAMLs."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from zebractl.config import catalog
from zebractl.schemas.export import REPORTS_DIR, all_schemas, file_schemas, render

REPO = Path(__file__).resolve().parents[2]


def test_committed_schemas_are_current():
    for name, schema in all_schemas().items():
        committed = REPO / "schemas" / name
        assert committed.is_file(), f"schemas/{name} is missing: run `zebractl schema export`"
        assert committed.read_text() == render(schema), (
            f"schemas/{name} is stale: run `zebractl schema export`"
        )
    exported = {f"{REPORTS_DIR}/{p.name}" for p in (REPO / "schemas" / REPORTS_DIR).iterdir()}
    assert exported == {n for n in all_schemas() if n.startswith(f"{REPORTS_DIR}/")}


def test_export_check_detects_stale_files(cli, tmp_path):
    out = tmp_path / "schemas"
    assert cli("schema", "export", "--output", str(out)).exit_code == 0
    assert cli("schema", "export", "-o", str(out), "--check").exit_code == 0
    (out / "preset.schema.json").write_text("{}\n")
    result = cli("schema", "export", "-o", str(out), "--check")
    assert result.exit_code == 3 and "stale" in result.stderr
    assert cli("schema", "export", "--output", str(out)).exit_code == 0
    assert cli("schema", "export", "-o", str(out), "--check").exit_code == 0


def test_export_check_covers_report_schemas(cli, tmp_path):
    out = tmp_path / "schemas"
    assert cli("schema", "export", "--output", str(out)).exit_code == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json")) == sorted(
        all_schemas()
    )
    plan = out / REPORTS_DIR / "plan.schema.json"
    plan.unlink()
    result = cli("schema", "export", "-o", str(out), "--check")
    assert result.exit_code == 3 and "plan.schema.json" in result.stderr
    assert cli("schema", "export", "--output", str(out)).exit_code == 0 and plan.is_file()
    orphan = out / REPORTS_DIR / "gone.schema.json"  # a report that no longer exists
    orphan.write_text("{}\n")
    result = cli("schema", "export", "-o", str(out), "--check")
    assert result.exit_code == 3 and "gone.schema.json" in result.stderr
    assert cli("schema", "export", "--output", str(out)).exit_code == 0 and not orphan.exists()
    assert cli("schema", "export", "-o", str(out), "--check").exit_code == 0


@pytest.mark.parametrize("kind", ["preset", "recipe"])
def test_schemas_validate_shipped_files(kind):
    schema = file_schemas()[f"{kind}.schema.json"]
    for path in catalog.shipped(kind).values():
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_schemas_reject_unknown_keys():
    schema = file_schemas()["preset.schema.json"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"bases": "kda_300M"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"norm": {"epsilon": 1e-6}}, schema)


def test_packaged_data_ships_with_the_package():
    """Names resolve from the installed package (wheel: zebractl/_data; checkout: repo root)."""
    import zebractl

    root = catalog.data_root()
    for sub in ("presets", "recipes", "schemas"):
        assert (root / sub).is_dir(), root / sub
    if "site-packages" in zebractl.__file__:
        assert root == Path(zebractl.__file__).parent / "_data"

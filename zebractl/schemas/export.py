"""JSON Schema files generated from the Pydantic models, written under the top-level ``schemas/``.

- ``preset.schema.json`` and ``recipe.schema.json``, for editors. File schemas differ from the
  resolved models in two ways: they accept the ``extends`` inheritance key, and nothing is marked
  required (a file may inherit required values through ``extends``, or a recipe's ``model:`` may
  override only a few keys). Unknown keys stay errors.
- ``reports/<command>.schema.json``: the ``--json`` document of each command
  (:data:`zebractl.schemas.reports.REPORTS`), exactly as the models validate it.
"""

from __future__ import annotations

import json
from typing import Any

from zebractl.schemas.preset import ModelConfig
from zebractl.schemas.recipe import RunConfig
from zebractl.schemas.reports import REPORTS

DIALECT = "https://json-schema.org/draft/2020-12/schema"
REPORTS_DIR = "reports"

_EXTENDS = {
    "type": "string",
    "description": "The one inheritance key: a shipped name or a path (relative to this file) "
    "whose values this file starts from.",
}


def _relax(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _relax(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_relax(v) for v in node]
    return node


def file_schemas() -> dict[str, dict[str, Any]]:
    """{file name: JSON Schema} for preset and recipe files."""
    preset = _relax(ModelConfig.model_json_schema(by_alias=True))
    preset["properties"] = {"extends": _EXTENDS, **preset["properties"]}
    preset["title"] = "zebractl preset"
    preset["$schema"] = DIALECT

    recipe = _relax(RunConfig.model_json_schema(by_alias=True))
    recipe["properties"] = {"extends": _EXTENDS, **recipe["properties"]}
    recipe["title"] = "zebractl recipe"
    recipe["$schema"] = DIALECT
    return {"preset.schema.json": preset, "recipe.schema.json": recipe}


def report_schemas() -> dict[str, dict[str, Any]]:
    """{path under schemas/: JSON Schema} of every command's ``--json`` document."""
    out: dict[str, dict[str, Any]] = {}
    for model in REPORTS:
        schema = model.model_json_schema(by_alias=True)
        schema["title"] = f"zebractl {model.command} --json"
        schema["$schema"] = DIALECT
        out[f"{REPORTS_DIR}/{model.schema_file()}"] = schema
    return out


def all_schemas() -> dict[str, dict[str, Any]]:
    """{path under schemas/: JSON Schema} of every generated file."""
    return file_schemas() | report_schemas()


def render(schema: dict[str, Any]) -> str:
    """Stable text of one schema file."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"

"""Every `--json` document is a report model and validates against its exported JSON Schema."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

import jsonschema
import pytest
from pydantic import BaseModel, ValidationError

from zebractl.config import catalog
from zebractl.schemas import reports
from zebractl.schemas.export import REPORTS_DIR, report_schemas
from zebractl.schemas.reports import REPORTS, Report

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "State of the Union, 1790.",
    "",
    "A fourth document, with some more words in it.",
]


def _strict_json(text: str) -> object:
    """json.loads that refuses Infinity/NaN (which Python's json accepts, JSON does not)."""

    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def check(model: type[Report], result) -> BaseModel:
    """stdout is one JSON document: valid for the model and for the committed schema file."""
    doc = _strict_json(result.stdout)
    assert isinstance(doc, dict) and doc["schema_version"] == 1
    report = model.model_validate_json(result.stdout)
    schema = json.loads((REPO / "schemas" / REPORTS_DIR / model.schema_file()).read_text())
    jsonschema.validate(doc, schema)
    assert json.loads(report.model_dump_json(by_alias=True)) == doc  # nothing dropped or added
    return report


# ---- plan, config, catalog -------------------------------------------------------------------


@pytest.mark.parametrize("recipe", list(catalog.shipped("recipe")))
def test_plan(cli, recipe):
    result = cli("plan", recipe, "--json")
    assert result.exit_code == 0, result.output
    report = check(reports.PlanReport, result)
    assert report.parameters.total > 0 and report.batch.global_ > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [f"recipes/{n}.yaml" for n in catalog.shipped("recipe")]
    + [f"presets/{n}.yaml" for n in catalog.shipped("preset")],
)
def test_config_show(cli, config):
    result = cli("config", "show", str(REPO / config), "--json")
    assert result.exit_code == 0, result.output
    report = check(reports.ConfigShowReport, result)
    kind = config.split("/")[0][:-1]
    assert report.kind == kind
    assert (report.derived is None) == (kind == "preset")


def test_config_show_with_set(cli):
    result = cli("config", "show", "tiny_kda", "--set", "schedule.lr=1e-3", "--json")
    assert result.exit_code == 0, result.output
    assert check(reports.ConfigShowReport, result).provenance["schedule.lr"] == "--set"


def test_config_validate(cli, write):
    write("bad.yaml", "preset: tiny_kda\nbatch: {micro: 2, globl: 4}\n")
    good = cli("config", "validate", "tiny_kda", str(REPO / "presets/kda_300M.yaml"), "--json")
    assert good.exit_code == 0, good.output
    assert check(reports.ConfigValidateReport, good).ok
    bad = cli("config", "validate", "tiny_kda", "bad.yaml", "--json")
    assert bad.exit_code == 2
    report = check(reports.ConfigValidateReport, bad)
    assert not report.ok and [r.ok for r in report.results] == [True, False]
    assert report.results[1].kind is None and report.results[1].errors


@pytest.mark.parametrize(("a", "b"), [("kda_300M", "gdn_300M"), ("tiny_kda", "tiny_kda")])
def test_config_diff(cli, a, b):
    result = cli("config", "diff", a, b, "--json")
    assert result.exit_code == 0, result.output
    report = check(reports.ConfigDiffReport, result)
    assert bool(report.differences) == (a != b)


def test_presets_and_recipes(cli):
    presets = cli("presets", "--json")
    assert presets.exit_code == 0, presets.output
    assert {p.name for p in check(reports.PresetsReport, presets).presets} == set(
        catalog.shipped("preset")
    )
    recipes = cli("recipes", "--json")
    assert recipes.exit_code == 0, recipes.output
    assert {r.name for r in check(reports.RecipesReport, recipes).recipes} == set(
        catalog.shipped("recipe")
    )


# ---- prepare -----------------------------------------------------------------------------------


@pytest.fixture
def data_tools():
    pytest.importorskip("numpy")
    pytest.importorskip("megatron.core")
    pytest.importorskip("tokenizers")
    from zebractl.data import demo

    return str(demo.tokenizer_dir())


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--valid-fraction", "0.5", "--skip-bad"],
        ["--fla-aligned", "--seq-length", "4"],
    ],
    ids=["default", "valid-split", "fla-aligned"],
)
def test_prepare_and_verify(cli, tmp_path, data_tools, options):
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 3) + "not json\n")
    if "--skip-bad" not in options:
        src.write_text(src.read_text().replace("not json\n", ""))
    out = tmp_path / "out"
    argv = ["prepare", str(src), "--tokenizer", data_tools, "-o", str(out), "--workers", "1"]
    result = cli(*argv, *options, "--json")
    assert result.exit_code == 0, result.output
    report = check(reports.PrepareReport, result)
    manifest = report.manifest
    assert manifest == reports.Manifest.model_validate_json((out / "manifest.json").read_text())
    assert manifest.totals.empty_documents == 3
    assert manifest.totals.skipped == ({"malformed_json": 1} if "--skip-bad" in options else {})

    again = cli(*argv, *options, "--json")  # a resumed run: every shard is already done
    assert check(reports.PrepareReport, again).manifest.run.shards_resumed == len(
        {s.prefix.rsplit(".", 1)[0] for s in manifest.shards}
    )

    ok = cli("prepare", "--verify", str(out), "--json")
    assert ok.exit_code == 0, ok.output
    verified = check(reports.VerifyReport, ok)
    assert verified.ok and verified.checked.tokens == manifest.totals.tokens


@pytest.mark.parametrize("template", ["auto", "file"])
def test_prepare_chat_report(cli, tmp_path, data_tools, template):
    """Chat data: the manifest's chat section (template record included) in the report."""
    pytest.importorskip("jinja2")
    from zebractl.data.chat import CHATML_JINJA

    src = tmp_path / "talk.jsonl"
    talk = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    src.write_text(json.dumps({"messages": talk}) + "\n")
    spec = template
    if template == "file":
        spec = str(tmp_path / "chatml.jinja")
        Path(spec).write_text(CHATML_JINJA)
    argv = ["prepare", str(src), "--format", "chat", "--tokenizer", data_tools, "--json"]
    result = cli(*argv, "-o", str(tmp_path / "out"), "--workers", "1", "--chat-template", spec)
    assert result.exit_code == 0, result.output
    chat = check(reports.PrepareReport, result).manifest.chat
    assert chat is not None and chat.conversations == 1
    assert chat.template.source == ("builtin" if template == "auto" else "file")


def test_failed_verify_is_a_report_too(cli, tmp_path, data_tools):
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 5))
    out = tmp_path / "out"
    argv = ["prepare", str(src), "--tokenizer", data_tools, "-o", str(out), "--workers", "1"]
    assert cli(*argv).exit_code == 0
    (out / "shards" / "shard-00000.train.bin").write_bytes(b"\0\0")
    bad = cli("prepare", "--verify", str(out), "--json")
    assert bad.exit_code == 3
    report = check(reports.VerifyReport, bad)
    assert not report.ok and report.problems


# ---- the models themselves ---------------------------------------------------------------------


def _models(annotation: object) -> list[type[BaseModel]]:
    """Model classes reachable from a field annotation (through unions, lists, dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    if typing.get_origin(annotation) is not None or isinstance(annotation, types.UnionType):
        for arg in typing.get_args(annotation):
            found += _models(arg)
    return found


def _reachable() -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = list(REPORTS)
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.append(model)
        for field in model.model_fields.values():
            todo += _models(field.annotation)
    return seen


def test_every_report_field_is_documented():
    models = _reachable()
    assert reports.Manifest in models and reports.ForwardFlops in models
    for model in models:
        assert model.__doc__, model.__name__
        for name, field in model.model_fields.items():
            assert field.description and field.description.strip(), (
                f"{model.__name__}.{name} has no docstring"
            )


def test_every_report_model_is_exported():
    defined = {
        obj
        for obj in vars(reports).values()
        if isinstance(obj, type) and issubclass(obj, Report) and obj is not Report
    }
    assert defined == set(REPORTS)
    names = [m.schema_file() for m in REPORTS]
    assert len(set(names)) == len(names)
    assert set(report_schemas()) == {f"{REPORTS_DIR}/{n}" for n in names}
    for model in REPORTS:
        assert model.model_fields["schema_version"].default == 1
        assert next(iter(model.model_fields)) == "schema_version"  # printed first


def test_every_json_command_has_a_report():
    """Every command with --json names the report it prints."""
    import typer.main

    from zebractl.cli import app

    with_json = set()

    def walk(cmd, path):
        if any("--json" in p.opts for p in cmd.params):
            with_json.add(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    documented = {m.command.split(" --")[0] for m in REPORTS}
    assert with_json == documented


def test_non_finite_floats_never_reach_the_json_text():
    """Configs cannot hold Infinity or NaN (the schemas refuse them), and neither can a report."""
    with pytest.raises(ValidationError):
        reports.ConfigDifference(
            key="schedule.lr", a=float("inf"), b=float("nan"), a_source=None, b_source=None
        )
    with pytest.raises(ValidationError):
        reports.PlanMemory(
            scheme="s",
            params_and_grads_gib=float("inf"),
            optimizer_gib=0.0,
            activations_gib=0.0,
            total_gib=0.0,
            note="n",
        )


def test_reports_are_strict():
    with pytest.raises(ValidationError):
        reports.PresetsReport.model_validate_json('{"presets": [], "extra": 1}')
    with pytest.raises(ValidationError):
        reports.PresetsReport.model_validate_json('{"schema_version": 2, "presets": []}')
    with pytest.raises(ValidationError):
        reports.RecipesReport.model_validate_json(
            '{"recipes": [{"name": "x", "description": "", "preset": "p", "num_gpus": "8", '
            '"micro_batch": 1, "global_batch": 1, "seq_length": 1, "iterations": 1, '
            '"total_tokens": 1, "path": "x"}]}'
        )

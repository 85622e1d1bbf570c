"""`zebractl compare` of runs of different models gives no parity verdict (terminal, compare.md,
compare.json) and leads with where the models differ; `--assert` on them is exit 2. Runs of one
model keep their verdict, the config differences listed beside it. The runs train once per
module (3 iterations each; seeds 1234 and 99)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("matplotlib")
jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]
SETS = ("schedule.iterations=3", "schedule.warmup_iterations=1")
RUNS = {
    "kda": ("tiny_kda",),
    "gdn": ("tiny_gdn",),
    "seed": ("tiny_kda", "seed=99"),
    "eps": ("tiny_kda", "model.norm.eps=0.5"),
}
_TRAINED: dict[str, Path] = {}


@pytest.fixture
def runs(tmp_path_factory, fast) -> dict[str, Path]:
    """The runs of :data:`RUNS`, trained once for the module."""
    if not _TRAINED:
        root = tmp_path_factory.mktemp("runs")
        for name, (recipe, *sets) in RUNS.items():
            fast.train(recipe, root / name, *SETS, *sets)
            _TRAINED[name] = root / name
    return _TRAINED


def _compare(cli, a: Path, b: Path, *args: str):
    return cli("compare", str(a), str(b), *args, "--output", str(a.parent / f"{a.name}-{b.name}"))


def _json(result) -> dict:
    from zebractl.schemas.reports import CompareReport

    doc = json.loads(result.stdout)
    schema = json.loads((REPO / "schemas/reports" / CompareReport.schema_file()).read_text())
    jsonschema.validate(doc, schema)
    return doc


def test_runs_of_different_models_get_no_verdict(cli, runs):
    a, b = runs["kda"], runs["gdn"]
    r = _compare(cli, a, b)
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[0] == (
        "models differ: A tiny_kda (2 blocks: kda, kda; hidden 64), B tiny_gdn (2 blocks: gdn, "
        "gdn; hidden 64): blocks 1-2 mixer kda ≠ gdn"
    ), lines[0]
    assert lines[-2].startswith("no parity verdict: the runs are of different models"), lines
    assert lines[-1].startswith("report: ")
    folder = a.parent / "kda-gdn"
    md = (folder / "compare.md").read_text()
    assert md.startswith("# Models differ: kda vs gdn\n\n**No parity verdict**"), md[:300]
    assert "| blocks 1-2 mixer | `kda` | `gdn` |" in md and "## Checks" not in md
    doc = json.loads((folder / "compare.json").read_text())
    assert doc["kind"] == "models_differ" and doc["passed"] is None and doc["checks"] == []
    assert doc["verdict"]["result"] is None
    assert "different models" in doc["verdict"]["reason"], doc["verdict"]
    assert doc["model_differences"] == [
        {"key": "blocks 1-2 mixer", "a": "kda", "b": "gdn", "kind": "layout"}
    ]
    assert doc["a"]["model"] == "tiny_kda (2 blocks: kda, kda; hidden 64)"
    assert [len(doc["curves"][k]) for k in ("iterations", "a", "b")] == [3, 3, 3]  # the curves
    for text in (r.stdout, md, json.dumps(doc)):
        assert "PASS" not in text and "FAIL" not in text
    # the same in --json, which the schema holds
    assert _json(_compare(cli, a, b, "--json"))["verdict"] == doc["verdict"]


@pytest.mark.parametrize("option", [("--assert",), ("--tolerance", "last_half_pct=5")])
def test_a_parity_assertion_across_models_is_a_usage_error(cli, runs, option):
    r = _compare(cli, runs["kda"], runs["gdn"], *option)
    assert r.exit_code == 2, r.output
    assert "runs of different models (blocks 1-2 mixer kda ≠ gdn)" in r.stderr, r.stderr
    assert f"so {option[0]} does not apply" in r.stderr and "PASS" not in r.output


def test_one_model_field_is_a_different_model(cli, runs):
    doc = _json(_compare(cli, runs["kda"], runs["eps"], "--json"))
    assert doc["kind"] == "models_differ" and doc["verdict"]["result"] is None
    assert doc["model_differences"] == [{"key": "norm.eps", "a": 1e-6, "b": 0.5, "kind": "weights"}]
    assert doc["b"]["model"].startswith("tiny_kda with changes (2 blocks: kda, kda")


def test_two_seeds_keep_their_verdict_with_the_difference_beside_it(cli, runs):
    """compare.md: right under the verdict; the terminal: on the line above it (the verdict and
    the report stay the last two lines)."""
    a, b = runs["kda"], runs["seed"]
    r = _compare(cli, a, b)
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[-3] == "the runs differ in: seed 1234 ≠ 99", lines
    assert lines[-2].startswith(("parity: PASS", "parity: FAIL")) and lines[-1].startswith("report")
    md = (a.parent / "kda-seed" / "compare.md").read_text().splitlines()
    assert md[0].startswith(("# Parity PASS: kda vs seed", "# Parity FAIL: kda vs seed")), md[0]
    assert md[2].startswith(("**PASS**: ", "**FAIL**: ")) and md[3] == "", md[:5]
    assert md[4] == "The runs differ in (A ≠ B): seed 1234 ≠ 99.", md[:6]
    doc = _json(_compare(cli, a, b, "--json"))
    assert doc["kind"] == "parity" and doc["model_differences"] == []
    assert doc["verdict"]["result"] == ("PASS" if doc["passed"] else "FAIL")


def test_the_same_config_ends_on_the_verdict_then_the_report(cli, runs):
    """The README's main job reads its verdict from the last-but-one line."""
    r = _compare(cli, runs["kda"], runs["kda"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[-2].startswith("parity: PASS (") and lines[-1].startswith("report: "), lines

"""Issue 30, point 6: small frictions of the command line (run directories in `config show`, help
examples, word metavars, one spelling of the output flag, --nproc validation, `zebractl env`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zebractl.config.resolve import resolve_recipe
from zebractl.run.records import ResolvedConfigRecord
from zebractl.run.rundir import RunDir


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory as `zebractl train` leaves it (only its resolved config matters here)."""
    monkeypatch.chdir(tmp_path)
    run = RunDir(Path("runs/t"))
    run.create()
    run.write_config(ResolvedConfigRecord.of(resolve_recipe("tiny_kda", ["schedule.lr=1e-3"])))
    return run.root


@pytest.mark.parametrize("ref", ["runs/t", "runs/t/", "runs/t/config.resolved.json"])
def test_config_show_reads_a_run_directory(cli, run_dir, ref):
    result = cli("config", "show", ref, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "recipe" and doc["name"] == "tiny_kda"
    assert doc["source"] == "runs/t/config.resolved.json"
    assert doc["config"]["schedule"]["lr"] == 1e-3
    assert doc["provenance"]["schedule.lr"] == "--set"  # as recorded by the run
    assert doc["provenance"]["model.hidden_size"].endswith("tiny_kda.yaml:6")


def test_config_show_run_directory_takes_set_and_tables(cli, run_dir):
    result = cli("config", "show", "runs/t", "--set", "schedule.lr=2e-3", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["config"]["schedule"]["lr"] == 2e-3
    table = cli("config", "show", "runs/t")
    assert table.exit_code == 0 and "runs/t/config.resolved.json" in table.stdout


def test_config_diff_takes_run_directories(cli, run_dir):
    result = cli("config", "diff", "tiny_kda", "runs/t", "--json")
    assert result.exit_code == 0, result.stderr
    keys = [row["key"] for row in json.loads(result.stdout)["differences"]]
    assert keys == ["schedule.lr"]


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("runs", "not a zebractl run directory (no config.resolved.json)"),
        ("nope/x", "no such file or run directory"),
        ("other.json", "not a recipe or preset (.yaml) nor a run's config.resolved.json"),
    ],
)
def test_config_show_refuses_what_is_neither_config_nor_run(cli, run_dir, ref, message):
    Path("other.json").write_text("{}", encoding="utf-8")
    result = cli("config", "show", ref)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr

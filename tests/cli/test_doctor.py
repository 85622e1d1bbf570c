"""`zebractl doctor`: every command's imports, for real; the fix named; exit 3 when one cannot run."""

from __future__ import annotations

import json
import sys

import pytest

from zebractl.schemas.reports import DoctorReport


def test_doctor_passes_in_the_test_environment(cli):
    r = cli("doctor", "--json")
    assert r.exit_code == 0, r.output
    report = DoctorReport.model_validate(json.loads(r.stdout))
    assert report.ok and {c.command for c in report.commands} >= {
        "convert",
        "eval",
        "compare --fla",
    }
    assert report.versions["fla-core"] == "0.6.0"


def test_doctor_names_the_extra_for_a_package_that_cannot_import(cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    r = cli("doctor", "convert", "prepare")
    assert r.exit_code == 3, r.output
    assert "convert        MISSING" in r.stdout and "prepare        ok" in r.stdout
    assert "fix: pip install 'zebractl[train]'" in r.stdout
    assert "convert cannot run here" in r.stderr


def test_doctor_refuses_an_unknown_command(cli):
    r = cli("doctor", "trian")
    assert r.exit_code == 2 and "unknown command 'trian'" in r.stderr, r.output


@pytest.mark.parametrize(
    ("name", "code", "words"),
    [("triton", 2, "zebractl[train]"), ("zebractl.gone", 1, "ModuleNotFoundError")],
)
def test_a_module_missing_at_run_time_is_one_line_never_a_traceback(
    cli, monkeypatch, name, code, words
):
    """A ModuleNotFoundError that escapes a command: exit 2 with the extra for a third-party module,
    exit 1 (a bug) for zebractl's own."""
    import zebractl.cli.convert as conv

    def boom(*a, **k):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(conv, "require", boom)
    r = cli("convert", "a", "b")
    assert r.exit_code == code and words in r.stderr and "Traceback" not in r.output, r.output

"""Shared fixtures: a CLI runner and a helper that writes YAML files into a temporary folder."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zebractl.cli import app

REPO = Path(__file__).resolve().parents[1]


class Cli:
    """Invoke the real Typer app in-process; stdout and stderr are kept apart."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str):
        return self.runner.invoke(app, list(args), prog_name="zebractl")


@pytest.fixture
def cli() -> Cli:
    return Cli()


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], Path]:
    """write(name, text) -> path; the working directory is tmp_path, so messages show `name`."""
    monkeypatch.chdir(tmp_path)

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return _write

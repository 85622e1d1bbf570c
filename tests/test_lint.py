"""Lint and format are part of the suite: ruff check + ruff format --check on the package and tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")


def test_ruff_check():
    out = subprocess.run(
        [str(RUFF), "check", "zebractl", "tests", "benchmarks"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format():
    out = subprocess.run(
        [str(RUFF), "format", "--check", "zebractl", "tests", "benchmarks"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr

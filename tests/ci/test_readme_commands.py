"""CI runs README.md's commands verbatim: .ci/readme_command.py finds them, or says what is wrong."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = REPO / ".ci" / "readme_command.py"
spec = importlib.util.spec_from_file_location("readme_command", SCRIPT)
rc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rc)


def test_the_readme_holds_both_commands():
    main_job = subprocess.run([sys.executable, SCRIPT, "main-job"], capture_output=True, text=True)
    assert main_job.returncode == 0, main_job.stderr
    cmd = main_job.stdout.strip()
    assert cmd.startswith("python3 -m venv .venv && ") and "'.[train,demo,eval,report]'" in cmd
    assert cmd.endswith("$Z compare runs/tiny_kda --fla --assert")  # ends on the parity verdict
    assert "[test]" not in cmd  # the main job installs what a user installs, nothing of the tests'
    tests = subprocess.run([sys.executable, SCRIPT, "tests"], capture_output=True, text=True)
    assert tests.returncode == 0 and tests.stdout.strip().endswith("-m pytest"), tests.stderr


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("no marker\n", "found 0"),
        ("<!-- ci: x -->\n```bash\na\n```\n<!-- ci: x -->\n```bash\nb\n```\n", "found 2"),
        ("<!-- ci: x -->\nprose\n```bash\na\n```\n", "must be followed by ```bash"),
        ("<!-- ci: x -->\n```bash\na\n", "not closed"),
        ("<!-- ci: x -->\n```bash\na\nb\n```\n", "one command line"),
    ],
)
def test_a_damaged_readme_is_refused_naming_the_line(text, words):
    with pytest.raises(ValueError, match=words):
        rc.command(text, "x")


def test_one_command_is_extracted_with_blank_lines_around():
    assert rc.command("x\n<!-- ci: x -->\n\n```bash\n\n  echo hi  \n```\n", "x") == "echo hi"

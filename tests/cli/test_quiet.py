"""No third-party noise on stderr (issue 30, point 5), counted on a tiny run: `zebractl train`
and its resume, `zebractl compare --fla` and `zebractl eval` print nothing on stderr (before: a
megatron FutureWarning on every resume, torch's and torchao's log lines, lm-eval's notices and
tqdm bars, transformers' deprecations); with -v the libraries' warnings show. Their tables fit
80 columns (COLUMNS=80, a log: no terminal).

One tiny run is trained for the module (one iteration, then a resume to two); every command is a
real process, with a timeout. Slow (about 45 s in all on an idle CPU, most of it four imports of
torch and megatron): only a real process shows what a user sees on stderr, import-time log lines
and native writes included, and the three commands are the ones the issue counted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytestmark = pytest.mark.slow

from zebractl.runtime import quiet  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "batch.micro=4",
    "batch.global=8",
    "data.seq_length=64",
    "logging.tensorboard=false",
    "schedule.warmup_iterations=1",
    "validation=null",
    "data.split=[95, 5, 0]",  # held-out documents for eval's wikitext-like
    "checkpoint.interval=1",
]


TABLE = "┏┃┡│└"  # the first character of a table's lines


def _zebractl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (quiet.VERBOSE_ENV, *quiet.CHILD_ENV)}
    env["COLUMNS"] = "80"
    done = subprocess.run(
        [sys.executable, "-m", "zebractl", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _train(run: Path, data: Path, iterations: int, *flags: str) -> subprocess.CompletedProcess:
    sets = [f"data.paths=[{{path: {data}}}]", *TINY, f"schedule.iterations={iterations}"]
    return _zebractl(
        *flags, "train", "tiny_kda", "-o", str(run), *(a for s in sets for a in ("--set", s))
    )


def _quiet(done: subprocess.CompletedProcess) -> None:
    """Nothing on stderr; the tables on stdout fit 80 columns (zebractl's log lines may not)."""
    assert done.stderr == "", f"{len(done.stderr.splitlines())} line(s) on stderr:\n{done.stderr}"
    rows = [line for line in done.stdout.splitlines() if line[:1] in TABLE]
    wide = [line for line in rows if len(line) > 80]
    assert not wide, "\n".join(wide)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo_data) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """tiny_kda: one iteration, then resumed to two (the resume warned, from megatron)."""
    run = tmp_path_factory.mktemp("quiet") / "run"
    first = _train(run, demo_data, 1)
    resumed = _train(run, demo_data, 2)
    assert "resumed from" in resumed.stdout
    return run, [first, resumed]


def test_train_and_its_resume_print_nothing_on_stderr(trained):
    for done in trained[1]:
        _quiet(done)


def test_with_v_the_libraries_warnings_show(trained, demo_data, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained[0], copy)
    done = _train(copy, demo_data, 3, "-v")
    assert "FutureWarning" in done.stderr  # megatron's, on the resume: still there, only hidden


def test_eval_prints_nothing_on_stderr(trained, tmp_path):
    pytest.importorskip("lm_eval")
    done = _zebractl(
        "eval", str(trained[0]), "--tasks", "wikitext-like", "--limit", "2", "-o", str(tmp_path)
    )
    _quiet(done)
    assert "word_perplexity" in done.stdout and done.stdout.count("\n┏") == 1


def test_compare_fla_prints_nothing_on_stderr(trained, tmp_path):
    pytest.importorskip("matplotlib")
    done = _zebractl("compare", str(trained[0]), "--fla", "-o", str(tmp_path / "report"))
    _quiet(done)
    assert "parity: " in done.stdout and done.stdout.count("\n┏") == 1

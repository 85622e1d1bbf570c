"""The CLI surface: help, exit codes, lists, diff, import hygiene.

Start-up time is measured by benchmarks/cli_startup.py, not asserted here (wall-clock limits fail on
a busy machine); the deterministic part, that --help and completion import nothing heavy, is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = str(Path(sys.executable).with_name("zebractl"))
HEAVY = ("torch", "megatron", "fla", "transformers", "lm_eval")

_PROBE = """
import sys
from zebractl.cli import app
try:
    app(prog_name="zebractl")
except SystemExit:
    pass
print("LOADED:" + ",".join(m for m in {mods!r} if m in sys.modules), file=sys.stderr)
"""


def _loaded(argv: list[str], env: dict[str, str] | None = None) -> set[str]:
    code = _PROBE.format(mods=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    line = [x for x in out.stderr.splitlines() if x.startswith("LOADED:")][-1]
    return {m for m in line[len("LOADED:") :].split(",") if m}


def test_help_and_completion_import_nothing_heavy():
    assert _loaded(["--help"]) == set()
    assert _loaded(["plan", "--help"]) == set()
    env = {
        "_ZEBRACTL_COMPLETE": "complete_bash",
        "_ZEBRACTL_COMP_LINE": "zebractl plan kda_",
    }
    assert _loaded([], env) == set()
    env["_ZEBRACTL_COMP_LINE"] = "zebractl plan kda_ --set optimizer.impl="  # the schema's values
    assert _loaded([], env) == set()
    assert _loaded(["config", "show", "kda_300M", "--json"]) == set()


def test_help_documents_exit_codes_and_commands(cli):
    result = cli("--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "0 ok; 1 runtime failure; 2 usage or config error; 3 a check ran and failed" in text
    for command in (
        "prepare",
        "train",
        "warmup",
        "convert",
        "verify",
        "eval",
        "compare",
        "plan",
        "config",
        "presets",
        "recipes",
        "schema",
    ):
        assert f"\n  {command} " in result.stdout


def test_convert_and_verify_refuse_missing_inputs_in_one_line(cli, tmp_path):
    for argv, message in (
        (["convert", str(tmp_path / "nope"), str(tmp_path / "out")], "no such run directory"),
        (["verify", str(tmp_path / "nope"), str(tmp_path)], "no config.json"),
    ):
        r = cli(*argv)
        assert r.exit_code == 2 and r.stdout == "", r.output
        assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    help_text = cli("convert", "--help").stdout.lower()
    for arg in ("source", "output", "--to", "--iteration", "--dtype", "--format", "--json"):
        assert arg in help_text, arg


def test_train_help_lists_its_options(cli):
    text = cli("train", "--help").stdout
    for opt in ("RECIPE", "--set", "--output", "--nproc", "--slurm", "--submit", "--init-from"):
        assert opt.lower() in text.lower(), opt


def test_prepare_help_lists_its_options(cli):
    text = cli("prepare", "--help").stdout
    for opt in (
        "--tokenizer",
        "--output",
        "--workers",
        "--text-key",
        "--seq-length",
        "--fla-aligned",
        "--demo",
        "--verify",
        "--json",
        "--skip-bad",
        "--valid-fraction",
    ):
        assert opt in text, opt


def test_version(cli):
    from zebractl import __version__

    result = cli("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"zebractl {__version__}"


def test_usage_error_exits_2(cli):
    assert cli("plan").exit_code == 2
    assert cli("nosuchcommand").exit_code == 2
    assert cli("plan", "tiny_kda", "--nosuchflag").exit_code == 2


_FAILING_PLAN = """
import zebractl.planning.plan as plan_mod


def boom(self):
    raise RuntimeError("disk on fire")


plan_mod.Plan.to_dict = boom
from zebractl.cli import app

app(prog_name="zebractl")
"""


def test_runtime_failure_exits_1_and_traceback_only_with_verbose():
    """As a user sees it: a real process, its exit status and its stderr (in-process, -v's
    re-raised exception would be caught by the test runner and never printed)."""

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _FAILING_PLAN, *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )

    quiet = run("plan", "tiny_kda")
    assert quiet.returncode == 1, quiet.stderr
    assert "RuntimeError: disk on fire" in quiet.stderr and "zebractl -v" in quiet.stderr
    assert "Traceback" not in quiet.stderr + quiet.stdout
    verbose = run("-v", "plan", "tiny_kda")
    assert verbose.returncode == 1, verbose.stderr
    assert "Traceback (most recent call last)" in verbose.stderr
    assert ", in boom\n" in verbose.stderr  # the frame that raised
    assert verbose.stderr.rstrip().endswith("RuntimeError: disk on fire")


def test_no_duplicate_option_strings():
    import typer.main

    from zebractl.cli import app

    def walk(cmd, path):
        seen: dict[str, str] = {}
        for param in cmd.params:
            for opt in [*param.opts, *param.secondary_opts]:
                assert opt not in seen, f"{path}: {opt} used twice"
                seen[opt] = param.name
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "zebractl")


def test_presets_and_recipes_lists(cli):
    presets = json.loads(cli("presets", "--json").stdout)["presets"]
    by_name = {p["name"]: p for p in presets}
    assert by_name["kda_300M"]["parameters"] == 303_549_280
    assert by_name["zebra_mamba_8B_hybrid"]["mixers"] == ["mamba2", "mla"]
    recipes = json.loads(cli("recipes", "--json").stdout)["recipes"]
    kda = next(r for r in recipes if r["name"] == "kda_300M")
    assert (kda["preset"], kda["global_batch"], kda["iterations"]) == ("kda_300M", 1024, 4768)
    human = cli("presets").stdout
    assert "303.55M" in human and "Pure KDA 300M" in human
    assert "tiny_hybrid" in cli("recipes").stdout


def test_config_diff(cli):
    result = cli("config", "diff", "kda_300M", "gdn_300M", "--json")
    assert result.exit_code == 0
    diffs = {d["key"]: d for d in json.loads(result.stdout)["differences"]}
    assert diffs["model.layout.mixer"]["a"] == "kda" and diffs["model.layout.mixer"]["b"] == "gdn"
    assert diffs["model.kda"]["b"] is None
    assert "schedule.lr" not in diffs
    assert diffs["preset"]["a_source"].startswith("recipes/kda_300M.yaml:")
    same = cli("config", "diff", "kda_300M", "recipes/kda_300M.yaml")
    assert same.exit_code == 0 and "no differences" in same.stdout
    human = cli("config", "diff", "tiny_kda", "tiny_gdn")
    assert "model.layout.mixer" in human.stdout


def test_config_validate_many(cli):
    result = cli(
        "config", "validate", "recipes/kda_300M.yaml", "presets/gdn_300M.yaml", "tiny_kda", "--json"
    )
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["ok"] and [r["kind"] for r in doc["results"]] == ["recipe", "preset", "recipe"]


@pytest.mark.parametrize(("command", "extra"), [("train", "train"), ("prepare", "data")])
def test_missing_runtime_is_an_install_hint(cli, monkeypatch, tmp_path, command, extra):
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        if name.startswith("megatron"):
            raise ModuleNotFoundError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    args = ["tiny_kda"] if command == "train" else ["--demo"]
    r = cli(command, *args, "--output", str(tmp_path))
    assert r.exit_code == 2, r.output
    assert f"pip install 'zebractl[{extra}]'" in r.stderr and "megatron.core" in r.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="warmup's refusal needs torch to probe CUDA"
)
def test_warmup_without_a_gpu_is_a_usage_error(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for extra in ([], ["--json"], ["--micro", "4", "--micro", "8"]):
        r = cli("warmup", "tiny_kda", "--set", "data.paths=[{path: /nonexistent}]", *extra)
        assert r.exit_code == 2, r.output
        assert r.stdout == ""
        assert "no CUDA GPU" in r.stderr and "Traceback" not in r.stderr


def test_warmup_refuses_an_archive_path_it_cannot_write_before_compiling(cli, tmp_path):
    """--export / --export-compiled: a path that cannot be written is exit 2 naming it, before
    the GPU is even asked for (on any machine)."""
    afile = tmp_path / "plain"
    afile.write_text("x")
    for option, path in (
        ("--export-compiled", tmp_path),  # a folder
        ("--export-compiled", afile / "k.tar.xz"),  # under a file
        ("--export", afile / "sub" / "k.tar.xz"),
    ):
        r = cli("warmup", "tiny_kda", option, str(path))
        assert r.exit_code == 2, r.output
        assert f"{option} {path}" in r.stderr and "Traceback" not in r.stderr


def test_json_commands_keep_native_stdout_off_the_document():
    """--json commands print one document on stdout even when native code or child processes write
    to file descriptor 1 while they work (seen: TileLang's compile log in `warmup --json`)."""
    code = (
        "import json, os, sys\n"
        "from zebractl.cli._common import stdout_to_stderr\n"
        "with stdout_to_stderr():\n"
        "    print('py noise'); sys.stdout.flush()\n"
        "    os.write(1, b'native noise\\n')\n"
        "    os.system('echo child noise')\n"
        "print(json.dumps({'ok': 1}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ok": 1}
    for noise in ("py noise", "native noise", "child noise"):
        assert noise in r.stderr

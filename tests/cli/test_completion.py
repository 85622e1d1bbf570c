"""Shell completion through Typer's protocol, for bash, zsh and fish, on the installed command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = str(Path(sys.executable).with_name("zebractl"))


def _complete(shell: str, line: str, cwd: Path | None = None) -> list[str]:
    """Candidates the shell would offer for the command line ``line`` (cursor at its end)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("_TYPER")}
    env["_ZEBRACTL_COMPLETE"] = f"complete_{shell}"
    if shell == "bash":
        words = line.split()
        if line.endswith(" "):
            words.append("")
        env["COMP_WORDS"] = line
        env["COMP_CWORD"] = str(len(words) - 1)
    else:
        env["_TYPER_COMPLETE_ARGS"] = line
        if shell == "fish":
            env["_TYPER_COMPLETE_FISH_ACTION"] = "get-args"
    out = subprocess.run([EXE], env=env, capture_output=True, text=True, timeout=60, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return _parse(shell, out.stdout)


def _parse(shell: str, text: str) -> list[str]:
    if shell == "bash":
        return [x for x in text.splitlines() if x]
    if shell == "fish":
        return [x.split("\t")[0] for x in text.splitlines() if x]
    # zsh: _arguments '*: :(("value":"help" "value2"))'
    if text.strip() == "_files":
        return []
    body = text.split("((", 1)[1].rsplit("))", 1)[0]
    values = []
    for line in body.splitlines():
        value = line.split('":"', 1)[0].strip().strip('"')
        values.append(value.replace(r"\\:", ":"))
    return values


SHELLS = ["bash", "zsh", "fish"]


@pytest.mark.parametrize("shell", SHELLS)
def test_subcommands(shell):
    assert _complete(shell, "zebractl pl") == ["plan"]
    assert {"prepare", "presets"} <= set(_complete(shell, "zebractl pre"))
    assert set(_complete(shell, "zebractl config ")) == {"show", "validate", "diff"}


@pytest.mark.parametrize("shell", SHELLS)
def test_options(shell):
    assert "--json" in _complete(shell, "zebractl plan tiny_kda --j")
    assert {"--set", "--json"} <= set(_complete(shell, "zebractl config show kda_300M --"))


@pytest.mark.parametrize("shell", SHELLS)
def test_recipe_names(shell):
    assert _complete(shell, "zebractl plan kda_") == ["kda_1B", "kda_300M"]
    assert "tiny_hybrid" in _complete(shell, "zebractl train tiny_")


@pytest.mark.parametrize("shell", SHELLS)
def test_preset_names_for_config_commands(shell):
    # names that are both a recipe and a preset appear once
    got = _complete(shell, "zebractl config show zebra_mamba_8")
    assert got == ["zebra_mamba_8B_hybrid", "zebra_mamba_8B_hybrid_sft"]
    got = _complete(shell, "zebractl config validate tiny_")
    assert got == ["tiny_gdn", "tiny_hybrid", "tiny_kda", "tiny_mamba", "tiny_sft"]


@pytest.mark.parametrize("shell", SHELLS)
def test_yaml_paths_complete(shell, tmp_path):
    (tmp_path / "my_run.yaml").write_text("preset: tiny_kda\n")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "confs").mkdir()
    got = _complete(shell, "zebractl plan my", cwd=tmp_path)
    assert got == ["my_run.yaml"]
    assert "confs/" in _complete(shell, "zebractl plan con", cwd=tmp_path)
    assert "notes.txt" not in _complete(shell, "zebractl plan no", cwd=tmp_path)


@pytest.mark.parametrize("shell", SHELLS)
def test_show_completion_script(shell):
    # With detection disabled, --show-completion takes the shell name as its value.
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    out = subprocess.run(
        [EXE, "--show-completion", shell], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "_ZEBRACTL_COMPLETE" in out.stdout and f"complete_{shell}" in out.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_set_keys(shell):
    got = _complete(shell, "zebractl plan kda_300M --set model.norm.")
    assert got == ["model.norm.type=", "model.norm.eps="]
    assert "batch.global=" in _complete(shell, "zebractl config show tiny_kda --set batch.")

"""Shell completion, driven through real bash, zsh and fish (issue 30).

The scripts are the ones ``zebractl --show-completion SHELL`` prints (or ``--install-completion``
writes), loaded into the shell itself:

* bash: the function ``complete -p zebractl`` names is called with COMP_LINE/COMP_POINT as readline
  sets them; COMPREPLY is read back, and ``compopt`` (usable only inside a live completion) is
  shadowed by a function that records ``-o nospace``;
* zsh: ``zsh -f`` with compinit, the function ``$_comps[zebractl]`` is called with faked
  ``words``/``CURRENT``/``PREFIX``, and ``compadd`` is shadowed by a function that prints what it
  was given, with the suffix (``-S ''``: no space);
* fish: ``complete -C LINE``, fish's own completion of a command line;
* and, end to end, each shell runs interactively in a pseudo-terminal: Tab is pressed and the
  command line that results is printed, so that a space where none belongs shows.

A missing shell is a skip here; CI (``.ci/run``) installs bash, zsh and fish.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXE = str(Path(sys.executable).with_name("zebractl"))
SHELLS = ["bash", "zsh", "fish"]
WORDBREAKS = " \t\n\"'><=;|&(:"  # bash's default COMP_WORDBREAKS


def _env(tmp: Path) -> dict[str, str]:
    """A clean environment: zebractl on PATH, HOME and XDG folders of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_TYPER", "_ZEBRACTL"))}
    env["PATH"] = os.pathsep.join([str(Path(EXE).parent), env.get("PATH", "")])
    env["HOME"] = str(tmp / "home")
    env["XDG_CONFIG_HOME"] = str(tmp / "home" / ".config")
    env["XDG_DATA_HOME"] = str(tmp / "home" / ".local" / "share")
    env.pop("HISTFILE", None)
    (tmp / "home").mkdir(exist_ok=True)
    return env


def _need(shell: str) -> str:
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed (CI's .ci/run installs it)")
    return path


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, Path]:
    """``zebractl --show-completion SHELL`` for each shell, as a user runs it (shell detection on:
    no Typer test variable), saved to a file."""
    tmp = tmp_path_factory.mktemp("scripts")
    out = {}
    for shell in SHELLS:
        res = subprocess.run(
            [EXE, "--show-completion", shell],
            env=_env(tmp),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        out[shell] = tmp / f"zebractl.{shell}"
        out[shell].write_text(res.stdout)
    return out


def _q(text: str) -> str:
    assert "'" not in text
    return f"'{text}'"


def _blocks(stdout: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    for line in stdout.splitlines():
        if line == "@@":
            blocks.append([])
        elif blocks and line:
            blocks[-1].append(line)
    return blocks


class Complete:
    """What a shell offers for one command line: the candidates (whole words), those inserted
    without a space after them, and whether the shell's own file names are offered instead."""

    def __init__(self, values: list[str], nospace: set[str], files: bool):
        self.values, self.nospace, self.files = values, nospace, files

    def __repr__(self) -> str:
        return f"Complete({self.values}, nospace={sorted(self.nospace)}, files={self.files})"


def _run(argv: list[str], body: list[str], cwd: Path, env: dict[str, str]) -> str:
    out = subprocess.run(
        [*argv, "\n".join(body)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _bash(lines: list[str], load: str, cwd: Path, env: dict[str, str]) -> list[Complete]:
    body = [
        load,
        # compopt works only inside a live completion: record what the script asks of it
        "compopt() { [[ $1 == -o ]] && _opts+=($2); return 0; }",
        "_f=$(complete -p zebractl | sed -E 's/.*-F ([^ ]+).*/\\1/')",
        "_case() {",
        "  COMP_LINE=$1; COMP_POINT=${#1}; COMPREPLY=(); _opts=()",
        "  $_f zebractl",
        '  echo @@; echo "OPTS ${_opts[*]}"; printf \'%s\\n\' "${COMPREPLY[@]}"',
        "}",
    ] + [f"_case {_q(line)}" for line in lines]
    stdout = _run([_need("bash"), "--norc", "--noprofile", "-c"], body, cwd, env)
    result = []
    for line, block in zip(lines, _blocks(stdout), strict=True):
        opts = block[0].split()[1:]
        # readline replaces the text after the last word break: put back what stays
        word = line.split(" ")[-1]
        keep = word[: max(word.rfind(c) for c in WORDBREAKS) + 1]
        values = [keep + v for v in block[1:]]
        nospace = set(values) if "nospace" in opts else set()
        result.append(Complete(values, nospace, "default" in opts))
    return result


def _zsh(lines: list[str], load: str, cwd: Path, env: dict[str, str]) -> list[Complete]:
    body = [
        "autoload -U compinit && compinit -u -D",
        load,
        # compadd and _files work only inside a completion widget: record what they are given
        "compadd() {",
        "  local s=' ' i=${@[(i)-S]} v",
        "  (( i < $# )) && s=${@[i+1]}",
        '  for v in "${(@P)${@[-1]}}"; do print -r -- "$v"$\'\\t\'"[$s]"; done',
        "}",
        "_files() { print -r -- ':files'; }",
        "_case() {",
        "  words=(${(z)1}); [[ $1 == *' ' ]] && words+=('')",
        "  CURRENT=${#words}; PREFIX=${words[CURRENT]}",
        "  print @@; $_comps[zebractl]",  # the function compinit/compdef registered
        "}",
        "_case 'zebractl pl'",  # twice: an autoloaded function must work again
    ] + [f"_case {_q(line)}" for line in lines]
    stdout = _run([_need("zsh"), "-f", "-c"], body, cwd, env)
    result = []
    blocks = _blocks(stdout)
    assert [b.split("\t")[0] for b in blocks[0]] == ["plan"], blocks[0]
    for block in blocks[1:]:
        pairs = [b.split("\t") for b in block if b != ":files"]
        result.append(
            Complete([v for v, _ in pairs], {v for v, s in pairs if s == "[]"}, ":files" in block)
        )
    assert len(result) == len(lines)
    return result


def _fish(lines: list[str], load: str, cwd: Path, env: dict[str, str]) -> list[Complete]:
    body = [load] + [f"echo @@; complete -C {_q(line)}" for line in lines]
    argv = [_need("fish"), "-c"] if not load else [_need("fish"), "--no-config", "-c"]
    stdout = _run(argv, body, cwd, env)
    # fish chooses the space itself (none after a candidate that ends in = . / and a few more:
    # the interactive test below sees it); its file names are those of the folder (notes.txt)
    out = []
    for block in _blocks(stdout):
        values = [b.split("\t")[0] for b in block]
        out.append(Complete(values, set(), "notes.txt" in values))
    assert len(out) == len(lines)
    return out


DRIVERS = {"bash": _bash, "zsh": _zsh, "fish": _fish}

# (command line, candidates (sorted; None: see the test), no space after them, file names instead)
CASES = [
    ("zebractl pl", ["plan"], False, False),
    ("zebractl plan kda_", ["kda_1B", "kda_300M"], False, False),
    (
        "zebractl plan kda_300M --set model.norm.",
        ["model.norm.eps=", "model.norm.type="],
        True,
        False,
    ),
    ("zebractl plan kda_300M --set optimizer.im", ["optimizer.impl="], True, False),
    (
        "zebractl plan kda_300M --set optimizer.impl=",
        ["optimizer.impl=megatron", "optimizer.impl=torch_fused"],
        False,
        False,
    ),
    ("zebractl plan kda_300M --set optimizer.impl=t", ["optimizer.impl=torch_fused"], False, False),
    (
        "zebractl plan tiny_sft --set data.packing=",
        ["data.packing=concat", "data.packing=isolated", "data.packing=null"],
        False,
        False,
    ),
    ("zebractl convert runs/x hf/x --to ", ["hf", "megatron"], False, False),
    ("zebractl plan my", ["my_run.yaml"], False, False),
    ("zebractl plan con", ["confs/"], True, False),  # into the folder: no space
    ("zebractl plan no", [], False, False),  # a recipe is no .txt file
    ("zebractl convert no", None, False, True),  # a path: the shell's file names
]


@pytest.fixture
def work(tmp_path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "my_run.yaml").write_text("preset: tiny_kda\n")
    (work / "notes.txt").write_text("x")
    (work / "confs").mkdir()
    return work


@pytest.mark.slow
@pytest.mark.parametrize("shell", SHELLS)
def test_real_shell_completes(shell, scripts, tmp_path, work):
    """Each case through the shell, with the script ``--show-completion SHELL`` printed."""
    lines = [line for line, *_ in CASES]
    got = DRIVERS[shell](lines, f"source {scripts[shell]}", work, _env(tmp_path))
    for (line, values, nospace, files), have in zip(CASES, got, strict=True):
        if values is not None:
            assert sorted(have.values) == values, (line, have)
        if shell != "fish":  # fish decides the space itself (see the interactive test)
            assert have.nospace == (set(values) if nospace else set()), (line, have)
        assert have.files == files, (line, have)


@pytest.mark.slow
@pytest.mark.parametrize("shell", SHELLS)
def test_installed_script_completes(shell, tmp_path, work):
    """``--install-completion SHELL`` writes the script where the shell loads it by itself."""
    _need(shell)
    env = _env(tmp_path)
    res = subprocess.run(
        [EXE, "--install-completion", shell], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    home = Path(env["HOME"])
    load = {
        "bash": f"source {home / '.bashrc'}",
        "zsh": f"fpath=({home / '.zfunc'} $fpath); compinit -u -D",  # what the line added to ~/.zshrc does
        "fish": "",  # ~/.config/fish/completions is fish's own (read without --no-config)
    }[shell]
    if shell == "zsh":
        assert "fpath+=~/.zfunc" in (home / ".zshrc").read_text()
    lines = ["zebractl plan kda_", "zebractl plan kda_300M --set optimizer.impl=m"]
    got = DRIVERS[shell](lines, load, work, env)
    assert got[0].values == ["kda_1B", "kda_300M"]
    assert got[1].values == ["optimizer.impl=megatron"]


@pytest.mark.parametrize("shell", SHELLS)
def test_show_completion_prints_the_named_shells_script(shell, scripts):
    # Before issue 30, `--show-completion zsh` (and fish) printed the current shell's script
    # unless a Typer test variable was set.
    text = scripts[shell].read_text()
    assert f"_ZEBRACTL_COMPLETE=complete_{shell}" in text
    start = {"bash": "_zebractl_completion()", "zsh": "#compdef zebractl", "fish": "function "}
    assert text.startswith(start[shell])
    for other in set(SHELLS) - {shell}:
        assert f"complete_{other}" not in text


def test_show_completion_refuses_an_unknown_shell():
    res = subprocess.run(
        [EXE, "--show-completion", "tcsh"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2
    assert "bash, zsh or fish" in res.stderr and res.stdout == ""


# ---- the candidates themselves, in this process (no shell, fast) --------------------------------


def _candidates(line: str) -> list[str]:
    from typer.main import get_command

    from zebractl.cli import app
    from zebractl.cli.completion import CLASSES, split_line

    comp = CLASSES["zsh"](get_command(app), {}, "zebractl", "_ZEBRACTL_COMPLETE")
    return [str(item.value) for item in comp.get_completions(*split_line(line))]


def test_candidates():
    assert {"prepare", "presets"} <= set(_candidates("zebractl pre"))
    assert "--json" in _candidates("zebractl plan tiny_kda --j")
    assert {"--set", "--json"} <= set(_candidates("zebractl config show kda_300M --"))
    assert "tiny_hybrid" in _candidates("zebractl train tiny_")
    # names that are both a recipe and a preset appear once
    got = _candidates("zebractl config show zebra_mamba_8")
    assert got == ["zebra_mamba_8B_hybrid", "zebra_mamba_8B_hybrid_sft"]
    got = _candidates("zebractl config validate tiny_")
    assert got == ["tiny_gdn", "tiny_hybrid", "tiny_kda", "tiny_mamba", "tiny_sft"]
    assert "batch.global=" in _candidates("zebractl config show tiny_kda --set batch.")


def test_value_candidates():
    assert _candidates("zebractl train tiny_kda --set kernels.backend=") == [
        "kernels.backend=auto",
        "kernels.backend=fla",
        "kernels.backend=torch",
    ]
    assert _candidates("zebractl plan x --set recompute.mode=s") == ["recompute.mode=selective"]
    assert _candidates("zebractl plan x --set data.format=") == [
        "data.format=text",
        "data.format=chat",
    ]
    assert _candidates("zebractl plan x --set checkpoint.async_save=t") == [
        "checkpoint.async_save=true"
    ]
    assert _candidates("zebractl plan x --set model.norm.type=") == [
        "model.norm.type=rmsnorm",
        "model.norm.type=layernorm",
    ]
    assert _candidates("zebractl plan x --set no.such=") == []
    assert _candidates("zebractl plan x --set schedule.lr=") == []  # a number: nothing to offer
    assert set(_candidates("zebractl config ")) == {"show", "validate", "diff"}
    assert _candidates("zebractl convert a b --format z") == ["zebra"]
    assert _candidates("zebractl convert a b --dtype ") == ["bf16", "fp32"]
    assert _candidates("zebractl convert a b --to megatron --preset kda_3") == ["kda_300M"]
    assert _candidates("zebractl verify a b --device c") == ["cpu", "cuda"]
    assert _candidates("zebractl eval a --device ") == ["auto", "cpu", "cuda"]
    assert _candidates("zebractl eval a --dtype b") == ["bf16"]
    assert _candidates("zebractl prepare a b --overlong ") == ["truncate", "drop"]
    assert _candidates("zebractl convert ") == [":files"]  # a path: the shell's own


def test_yaml_paths(work, monkeypatch):
    monkeypatch.chdir(work)
    assert _candidates("zebractl plan my") == ["my_run.yaml"]
    assert "confs/" in _candidates("zebractl plan con")
    assert _candidates("zebractl plan no") == []


# ---- end to end: the shells, interactive in a pseudo-terminal, Tab pressed ---------------------

TYPED = [  # (keys, the words of the command line that results)
    ("zebractl pl\tX", ["zebractl", "plan", "X"]),
    (
        "zebractl plan kda_300M --set optimizer.im\tt\tX",
        ["--set", "optimizer.impl=torch_fused", "X"],
    ),
    ("zebractl plan kda_300M --set model.norm.ty\tX", ["--set", "model.norm.type=X"]),
    ("zebractl convert a b --to me\tX", ["--to", "megatron", "X"]),
]


def _interactive(
    argv: list[str], setup: str, keys: list[str], env: dict[str, str], cwd: Path
) -> str:
    """Run a shell in a pseudo-terminal; type ``setup``, then (once it ran) each of ``keys``
    followed by Ctrl-A and ``printf '<%s>' `` and Enter (the line is printed word by word), then
    ``exit``. Everything the terminal showed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the shell
        try:
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    out = b""
    deadline = time.monotonic() + 60

    def read_until(done) -> None:
        nonlocal out
        while not done() and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # the shell has exited
                    return
                if not data:
                    return
                if b"\x1b[c" in data or b"\x1b[0c" in data:  # a terminal query (fish 4): answer
                    os.write(fd, b"\x1b[?62;22c")
                out += data

    try:
        os.write(fd, (setup + '; echo RE""ADY\n').encode())
        read_until(lambda: b"READY" in out)
        os.write(fd, "".join(f"{k}\x01printf '<%s>' \n" for k in keys).encode() + b"exit\n")
        read_until(lambda: False)  # to the shell's exit
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    return out.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("shell", SHELLS)
def test_tab_in_an_interactive_shell(shell, scripts, tmp_path):
    path = _need(shell)
    env = {**_env(tmp_path), "TERM": "dumb", "PS1": "$ ", "INPUTRC": "/dev/null"}
    argv, setup = {
        "bash": ([path, "--norc", "--noprofile", "-i"], f"source {scripts['bash']}"),
        "zsh": (
            [path, "-f", "-i"],
            f"autoload -U compinit; compinit -u -D; bindkey -e; source {scripts['zsh']}",
        ),
        "fish": ([path, "--no-config", "-i"], f"source {scripts['fish']}"),
    }[shell]
    out = _interactive(argv, setup, [k for k, _ in TYPED], env, tmp_path)
    lines = re.findall(r"^((?:<[^>\r\n]*>)+)", out.replace("\r", "\n"), flags=re.M)
    words = [re.findall(r"<([^>]*)>", x) for x in lines]
    assert len(words) == len(TYPED), out[-3000:]
    for (keys, want), got in zip(TYPED, words, strict=True):
        assert got[-len(want) :] == want, (keys, got)

"""Shell completion for bash, zsh and fish: the scripts, the protocol behind them, the options.

Typer's own scripts and classes are replaced (issue 30): its bash script joins ``COMP_WORDS``,
which bash has already split at ``=`` and ``:``, so ``--set key=val`` reached the program as
``key = val``, and it added a space after a ``--set`` key that ends in ``=``; ``--show-completion
zsh`` printed the script of the shell it ran in; its zsh script only worked when sourced.

Protocol: the script runs ``zebractl`` with ``_ZEBRACTL_COMPLETE=complete_<shell>`` and the command
line up to the cursor in ``_ZEBRACTL_COMP_LINE``; the program prints one candidate a line (zsh and
fish: ``value<TAB>help``). A candidate that ends in ``=``, ``.`` or ``/`` (a ``--set`` key, a
folder) is inserted without a trailing space in all three shells.

Only light imports (typer, stdlib): this module runs on every Tab press.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from typer._click.core import Parameter
from typer._click.shell_completion import (
    CompletionItem,
    ShellComplete,
    _resolve_context,
    _resolve_incomplete,
    split_arg_string,
)
from typer.core import TyperGroup

PROG = "zebractl"
COMPLETE_VAR = "_ZEBRACTL_COMPLETE"
LINE_VAR = "_ZEBRACTL_COMP_LINE"
SHELLS = ("bash", "zsh", "fish")
NO_SPACE = "=./"  # a candidate ending in one of these is not followed by a space

BASH_SCRIPT = r"""
%(func)s() {
    local IFS=$'\n' c
    COMPREPLY=( $(env %(var)s=complete_bash %(line_var)s="${COMP_LINE:0:COMP_POINT}" \
        _ZEBRACTL_COMP_WORDBREAKS="$COMP_WORDBREAKS" "$1" 2>/dev/null) )
    if [[ ${COMPREPLY[0]} == :files ]]; then
        COMPREPLY=()
        compopt -o default  # readline's file names
        return 0
    fi
    for c in "${COMPREPLY[@]}"; do
        case $c in *[=./]) compopt -o nospace; break;; esac
    done
    return 0
}

complete -F %(func)s %(prog)s
"""

ZSH_SCRIPT = r"""#compdef %(prog)s

%(func)s() {
    local -a response spaced spaced_d nospace nospace_d
    local line value help
    response=("${(@f)$(env %(var)s=complete_zsh %(line_var)s="${words[1,CURRENT-1]} ${PREFIX}" \
        %(prog)s 2>/dev/null)}")
    for line in $response; do
        [[ -z $line || $line == :files ]] && continue
        value=${line%%%%$'\t'*}
        help=${line#*$'\t'}
        [[ $help == $line ]] && help=
        if [[ $value == *[=./] ]]; then
            nospace+=($value); nospace_d+=("$value${help:+  -- $help}")
        else
            spaced+=($value); spaced_d+=("$value${help:+  -- $help}")
        fi
    done
    if [[ $response[1] == :files ]]; then
        _files
        return
    fi
    (( $#nospace )) && compadd -S '' -l -d nospace_d -a nospace
    (( $#spaced )) && compadd -l -d spaced_d -a spaced
    return 0
}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    %(func)s "$@"  # autoloaded from $fpath (`--install-completion`): defined now, complete
else
    compdef %(func)s %(prog)s  # sourced: register for later
fi
"""

FISH_SCRIPT = r"""function %(func)s
    set -l response (env %(var)s=complete_fish %(line_var)s=(commandline -cp) %(prog)s 2>/dev/null)
    if test "$response[1]" = :files
        __fish_complete_path (commandline -ct)
        return
    end
    printf '%%s\n' $response
end

complete --command %(prog)s --no-files --arguments '(%(func)s)'
"""

SCRIPTS = {"bash": BASH_SCRIPT, "zsh": ZSH_SCRIPT, "fish": FISH_SCRIPT}


def script(shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    # zsh: the function has the name of the file on $fpath, so that once autoloaded it replaces
    # itself and every later Tab calls it directly
    func = {"bash": "_zebractl_completion", "zsh": "_zebractl", "fish": "__zebractl_complete"}[
        shell
    ]
    values = {"func": func, "prog": PROG, "var": COMPLETE_VAR, "line_var": LINE_VAR}
    return (SCRIPTS[shell] % values).strip() + "\n"


def split_line(line: str) -> tuple[list[str], str]:
    """The arguments after the program name and the word being completed, from the command line
    up to the cursor (an unclosed quote is tolerated)."""
    words = split_arg_string(line)
    args = words[1:]
    if args and line and not line[-1].isspace():
        return args[:-1], args[-1]
    return args, ""


class _Complete(ShellComplete):
    """The shared part: read the line, compute the candidates."""

    name = ""
    source_template = ""

    def source_vars(self) -> dict[str, Any]:
        return {}

    def source(self) -> str:
        return script(self.name)

    def get_completion_args(self) -> tuple[list[str], str]:
        return split_line(os.environ.get(LINE_VAR, ""))

    def get_completions(self, args: list[str], incomplete: str) -> list[CompletionItem]:
        ctx = _resolve_context(self.cli, self.ctx_args, self.prog_name, args)
        obj, incomplete = _resolve_incomplete(ctx, args, incomplete)
        own = getattr(obj, "_custom_shell_complete", None) is not None
        if isinstance(obj, Parameter) and not own:  # a path, a number: the shell's file names
            return [CompletionItem(":files")]
        return obj.shell_complete(ctx, incomplete)

    def format_completion(self, item: CompletionItem) -> str:
        help_text = re.sub(r"\s+", " ", item.help or "").strip()
        return f"{item.value}\t{help_text}" if help_text else str(item.value)


class BashComplete(_Complete):
    name = "bash"

    def get_completion_args(self) -> tuple[list[str], str]:
        line = os.environ.get(LINE_VAR, "")
        args, incomplete = split_line(line)
        # Readline replaces only the text after the last word-break character (bash splits at
        # = and : too): the candidates must be cut the same way, or `--set key=v` <Tab> would
        # insert `key=key=value`.
        breaks = os.environ.get("_ZEBRACTL_COMP_WORDBREAKS", " \t\n\"'><=;|&(:")
        start = max((line.rfind(c) for c in set(breaks) | {" ", "\t", "\n"}), default=-1)
        word = line[start + 1 :]
        self._cut = len(incomplete) - len(word) if incomplete.endswith(word) else 0
        return args, incomplete

    def format_completion(self, item: CompletionItem) -> str:
        return item.value if item.value == ":files" else str(item.value)[self._cut :]


class ZshComplete(_Complete):
    name = "zsh"


class FishComplete(_Complete):
    name = "fish"


CLASSES: dict[str, type[ShellComplete]] = {
    "bash": BashComplete,
    "zsh": ZshComplete,
    "fish": FishComplete,
}


def choices(*values: str) -> Callable[[str], list[str]]:
    """An ``autocompletion`` for an option with a fixed set of values."""

    def complete(incomplete: str) -> list[str]:
        return [v for v in values if v.startswith(incomplete)]

    return complete


# ---- --show-completion / --install-completion -------------------------------------------------


def detect_shell() -> str:
    """The shell this command runs in (its parent process), else $SHELL's name, else ''."""
    try:
        import shellingham

        name = shellingham.detect_shell()[0]
    except Exception:  # noqa: BLE001 - no process table (containers), an unknown shell
        name = Path(os.environ.get("SHELL", "")).name
    return name if name in SHELLS else ""


def _shell(value: str) -> str:
    shell = value or detect_shell()
    if shell not in SHELLS:
        got = f"'{value}'" if value else "none detected"
        print(
            f"error: completion is for bash, zsh or fish ({got}); name the shell, e.g. "
            f"`zebractl --show-completion zsh`",
            file=sys.stderr,
        )
        raise typer.Exit(2)
    return shell


def show_callback(ctx: typer.Context, value: str | None) -> None:
    if value is None or ctx.resilient_parsing:
        return
    sys.stdout.write(script(_shell(value)))
    raise typer.Exit()


def install(shell: str, home: Path | None = None) -> Path:
    """Write the script where ``shell`` finds it, hook it into the rc file where needed, and return
    the script's path."""
    home = home or Path.home()
    if shell == "fish":  # fish loads completions/<command>.fish by itself
        path = home / ".config/fish/completions" / f"{PROG}.fish"
        rc, line = None, ""
    elif shell == "zsh":  # an autoloaded function on $fpath
        path = home / ".zfunc" / f"_{PROG}"
        rc, line = home / ".zshrc", "fpath+=~/.zfunc; autoload -Uz compinit; compinit"
    else:
        path = home / ".bash_completions" / f"{PROG}.sh"
        rc, line = home / ".bashrc", f"source '{path}'"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script(shell))
    if rc is not None:
        text = rc.read_text() if rc.is_file() else ""
        if line not in text:
            rc.write_text(text + ("" if not text or text.endswith("\n") else "\n") + line + "\n")
    return path


def install_callback(ctx: typer.Context, value: str | None) -> None:
    if value is None or ctx.resilient_parsing:
        return
    shell = _shell(value)
    path = install(shell)
    print(f"{shell} completion installed in {path}; it takes effect in a new shell")
    raise typer.Exit()


SHOW_OPTION = typer.Option(
    None,
    "--show-completion",
    metavar="[SHELL]",
    callback=show_callback,
    expose_value=False,
    is_eager=True,
    help="Print the completion script for bash, zsh or fish (default: the current shell).",
)
INSTALL_OPTION = typer.Option(
    None,
    "--install-completion",
    metavar="[SHELL]",
    callback=install_callback,
    expose_value=False,
    is_eager=True,
    help="Install completion for bash, zsh or fish (default: the current shell).",
)


class Group(TyperGroup):
    """The root command: runs the completion protocol, and lets the shell name after
    ``--show-completion`` / ``--install-completion`` be left out (Typer's options take none, so
    ``--show-completion zsh`` printed the current shell's script)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        args = list(args)
        i = 0
        while i < len(args) and args[i].startswith("-"):
            if args[i] in ("--show-completion", "--install-completion"):
                if i + 1 == len(args) or args[i + 1].startswith("-"):
                    args.insert(i + 1, "")  # no shell named: detect it
                i += 1
            i += 1
        return super().parse_args(ctx, args)

    def _main_shell_completion(
        self, ctx_args: Any, prog_name: str, complete_var: str | None = None
    ) -> None:
        instruction = os.environ.get(COMPLETE_VAR)
        if not instruction:
            return
        action, _, shell = instruction.partition("_")
        cls = CLASSES.get(shell)
        if cls is None or action not in ("complete", "source"):
            print(
                f"{COMPLETE_VAR}={instruction}: expected complete_SHELL or source_SHELL, "
                f"SHELL one of {', '.join(SHELLS)}",
                file=sys.stderr,
            )
            sys.exit(1)
        comp = cls(self, ctx_args, PROG, COMPLETE_VAR)
        out = comp.source() if action == "source" else comp.complete()
        if out:
            sys.stdout.write(out if out.endswith("\n") else out + "\n")
        sys.exit(0)

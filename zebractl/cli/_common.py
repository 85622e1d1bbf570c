"""Shared CLI plumbing: exit codes, error handling, JSON output, completion of names.

Only light imports here (typer, stdlib, the catalog): this module runs on every Tab press.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from zebractl.deps import missing_hint
from zebractl.errors import CheckFailed, ConfigError, PlainError, first_line

if TYPE_CHECKING:  # pydantic is imported only by commands that print a report
    from zebractl.schemas.reports import Report

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CHECK, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
SCHEMA_VERSION = 1


class _State:
    verbose = False


state = _State()
F = TypeVar("F", bound=Callable[..., Any])


def _word_metavars() -> None:
    """Help and usage show metavars as words (``RECIPE``, ``PATH``, ``N``), never Python types.

    Typer 0.29's plain help prints an argument as ``{recipe}`` in the usage line and
    ``recipe <str>`` in its table, and an option without a metavar as ``--nproc <int>``. This keeps
    click's convention instead: an argument is its name in capitals (``[NAME]`` when optional,
    ``...`` when repeated), and an option's value is its ``metavar``, else ``PATH`` for a path,
    ``N`` for an integer, else the option's long name in capitals (``--device DEVICE``).
    Tested by tests/cli/test_frictions.py; a Typer without these hooks keeps its own format.
    """
    from typer import core

    arg, opt = getattr(core, "TyperArgument", None), getattr(core, "TyperOption", None)
    needed = ("display_type_rich", "display_name_raw", "_usage_display_name", "_rich_display_name")
    if arg is None or opt is None or not all(hasattr(arg, n) for n in needed):
        return
    if getattr(arg, "_zebractl_words", False):
        return

    def arg_name(self: Any) -> str:
        return self.metavar if self.metavar is not None else (self.name or "").upper()

    def arg_usage(self: Any) -> str:
        name = arg_name(self)
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    def opt_value(self: Any, ctx: Any) -> str | None:
        if self.metavar is not None:
            return self.metavar
        desc = self.type_descriptor
        annotation = getattr(desc, "annotation", None)
        if getattr(desc, "is_path", False):
            word = "PATH"
        elif annotation is int:
            word = "N"
        else:
            longs = [o for o in self.opts if o.startswith("--")] or [self.name or "value"]
            word = longs[0].lstrip("-").replace("-", "_").upper()
        return word + ("..." if self.nargs != 1 else "")

    arg.display_name_raw = property(arg_name)
    arg.display_type_rich = lambda self, ctx: None
    arg._usage_display_name = arg_usage
    arg._rich_display_name = lambda self: arg_name(self) + ("..." if self.nargs != 1 else "")
    opt.display_type_rich = opt_value
    arg._zebractl_words = True


_word_metavars()


def err(message: str) -> None:
    """Print a message for humans on stderr."""
    print(message, file=sys.stderr)


def guarded(fn: F) -> F:
    """Map exceptions to documented exit codes; tracebacks only with -v."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except ConfigError as exc:
            if state.verbose:
                import traceback

                traceback.print_exc()
            err(
                f"error: {exc}"
                if len(exc.problems) == 1
                else "error: the config has problems:\n" + "\n".join(f"  {p}" for p in exc.problems)
            )
            raise typer.Exit(EXIT_USAGE) from None
        except PlainError as exc:  # explained already (a full or read-only disk, ...)
            if state.verbose:
                import traceback

                traceback.print_exc()
            err(f"error: {exc}")
            raise typer.Exit(EXIT_FAILURE) from None
        except CheckFailed as exc:
            if str(exc):
                err(f"check failed: {exc}")
            raise typer.Exit(EXIT_CHECK) from None
        except ModuleNotFoundError as exc:
            hint = missing_hint(exc)  # None for zebractl's own module: a bug, not an install
            if state.verbose:
                raise
            if hint is None:
                err(
                    f"error: ModuleNotFoundError: {first_line(exc)} (run `zebractl -v ...` for the traceback)"
                )
                raise typer.Exit(EXIT_FAILURE) from None
            err(f"error: {hint}")
            raise typer.Exit(EXIT_USAGE) from None
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except (SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - the CLI boundary (torch's CheckpointException
            # derives from BaseException): report in one line, don't dump
            if state.verbose:
                raise
            first = first_line(exc)
            err(f"error: {type(exc).__name__}: {first} (run `zebractl -v ...` for the traceback)")
            raise typer.Exit(EXIT_FAILURE) from None

    return wrapper  # type: ignore[return-value]


def emit_json(report: Report) -> None:
    """Write one report model (``zebractl.schemas.reports``) to stdout as exactly one JSON document.

    Keys are the fields' aliases; report floats are finite by construction, and ``allow_nan=False``
    makes sure the text is valid JSON (never ``Infinity``/``NaN``). Indented, ASCII-only.
    """
    doc = json.loads(report.model_dump_json(by_alias=True))
    sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True) -> Iterator[None]:
    """While a ``--json`` command works, send everything written to stdout to stderr, so that the
    one JSON document printed afterwards is alone on stdout: Python prints and, when stdout is the
    process's file descriptor 1, native output too (compilers, TileLang's logger, child processes).
    """
    if not enabled:
        yield
        return
    saved = None
    try:
        if sys.stdout.fileno() == 1:
            sys.stdout.flush()
            saved = os.dup(1)
            os.dup2(2, 1)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        saved = None  # not a real file (a test runner's buffer): Python-level redirect only
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


def _names(kind: str) -> list[str]:
    from zebractl.config import catalog

    return list(catalog.shipped(kind))  # type: ignore[arg-type]


def _yaml_paths(incomplete: str) -> list[str]:
    base = Path(incomplete).parent if incomplete else Path(".")
    try:
        entries = sorted(base.iterdir()) if base.is_dir() else []
    except OSError:
        return []
    out = []
    for entry in entries:
        text = str(entry) if str(base) != "." or incomplete.startswith("./") else entry.name
        if not text.startswith(incomplete) or entry.name.startswith("."):
            continue
        if entry.is_dir():
            out.append(text + "/")
        elif entry.suffix in (".yaml", ".yml"):
            out.append(text)
    return out


def complete_recipe(incomplete: str) -> list[str]:
    """Shipped recipe names, then matching .yaml files and folders."""
    return [n for n in _names("recipe") if n.startswith(incomplete)] + _yaml_paths(incomplete)


def complete_preset(incomplete: str) -> list[str]:
    """Shipped preset names, then matching .yaml files and folders."""
    return [n for n in _names("preset") if n.startswith(incomplete)] + _yaml_paths(incomplete)


def complete_config(incomplete: str) -> list[str]:
    """Recipe and preset names, then matching .yaml files and folders."""
    names = _names("recipe") + [n for n in _names("preset") if n not in _names("recipe")]
    return [n for n in names if n.startswith(incomplete)] + _yaml_paths(incomplete)


def complete_set(incomplete: str) -> list[str]:
    """Dotted keys of the recipe schema, ending in '='; after the '=', the key's values where they
    are a fixed set (a Literal such as optimizer.impl, a bool), else nothing (the user types it)."""
    from zebractl.config.resolve import schema_choices, schema_keys

    if "=" in incomplete:
        key, _, value = incomplete.partition("=")
        return [f"{key}={v}" for v in schema_choices(key) if v.startswith(value)]
    return [f"{k}=" for k in schema_keys() if k.startswith(incomplete)]


SET_HELP = (
    "Override one value: dotted.key=value (a YAML scalar), e.g. --set schedule.lr=3e-4. "
    "Repeatable; applied last, after the preset and the recipe."
)
JSON_HELP = "Print one JSON document on stdout (schema_version 1) instead of tables."

JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
"""``--json`` (default False): the report on stdout."""
SetOpt = Annotated[
    list[str],
    typer.Option("--set", help=SET_HELP, metavar="KEY=VALUE", autocompletion=complete_set),
]
"""``--set KEY=VALUE`` (repeatable; default ``()``)."""
RecipeArg = Annotated[
    str, typer.Argument(help="Recipe: shipped name or .yaml path.", autocompletion=complete_recipe)
]
"""The ``RECIPE`` argument of train and warmup."""

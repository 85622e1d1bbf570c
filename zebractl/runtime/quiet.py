"""Third-party noise off unless ``-v``: warnings, log lines and progress bars of the libraries.

A tiny train, compare or eval would otherwise print a dozen lines on stderr that are not
zebractl's: megatron's deprecation warning on every resume, torch's and torchao's import-time log
lines, lm-eval's notices about its own task configs, transformers' deprecations and lm-eval's
tqdm bars (which lm-eval creates with an explicit ``disable=``, so ``TQDM_DISABLE`` alone does
nothing). :func:`enable` turns them off for the process and, through environment variables, for
the processes it starts (torchrun's workers run ``zebractl`` again and read ``ZEBRACTL_VERBOSE``).

What stays: zebractl's own warnings (their module is ``zebractl``), every log record at ERROR and
above, and everything with ``-v``. zebractl itself prints, it never logs, so switching off log
records below ERROR (``logging.disable``) touches only the libraries'; it also holds when a library
resets its loggers' levels when it is imported (transformers and torch do).

Nothing heavy is imported here: tqdm is patched when it is first imported (an import hook), or at
once when it already is.

:func:`reported` goes further for a block whose failures zebractl reports itself: a library's log
records of any level, ERROR included, are off while it runs (megatron's checkpoint writer logs a
full disk at ERROR, then the save raises and zebractl names the disk in one line).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

VERBOSE_ENV = "ZEBRACTL_VERBOSE"
"""``1`` in the environment of the processes a verbose zebractl starts, ``0`` otherwise."""

THIRD_PARTY = (
    "megatron",
    "torch",
    "torchao",
    "transformers",
    "lm_eval",
    "fla",
    "datasets",
    "huggingface_hub",
    "accelerate",
    "tokenizers",
    "triton",
    "tilelang",
    "tensorboard",
    "matplotlib",
    "evaluate",
    "sacrebleu",
    "numexpr",
)
"""Packages whose warnings are hidden unless -v (matched at the start of a warning's module)."""

CHILD_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "DATASETS_VERBOSITY": "error",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
}
"""Read by the libraries (and their native code) when they start; a value the user set is kept."""

MODULE_PATTERN = "(" + "|".join(THIRD_PARTY) + r")(\.|$)"


def _quiet_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > 10:  # disable given by position (the 11th parameter of tqdm.__init__)
            args = (*args[:10], True, *args[11:])
        else:
            kwargs["disable"] = True  # over an explicit disable=False (lm-eval's bars)
        original(self, *args, **kwargs)

    __init__._zebractl_original = original  # type: ignore[attr-defined]
    return __init__


def _patch(cls: type) -> None:
    if not hasattr(cls.__init__, "_zebractl_original"):
        cls.__init__ = _quiet_init(cls.__init__)  # type: ignore[method-assign]


def _unpatch(cls: type) -> None:
    original = getattr(cls.__init__, "_zebractl_original", None)
    if original is not None:
        cls.__init__ = original  # type: ignore[method-assign]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _patch(module.tqdm)


class _TqdmHook(importlib.abc.MetaPathFinder):
    """Patches ``tqdm.std.tqdm`` (the class every tqdm bar derives from) as it is imported."""

    def __init__(self) -> None:
        self.busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "tqdm.std" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader)
        return spec


def bars_off() -> Callable[[], None]:
    """No tqdm bar from now on, even one created with ``disable=False``; returns the undo."""
    for key in (
        "TQDM_DISABLE",
        "HF_DATASETS_DISABLE_PROGRESS_BARS",
        "HF_HUB_DISABLE_PROGRESS_BARS",
    ):
        os.environ.setdefault(key, "1")
    std = sys.modules.get("tqdm.std")
    if std is not None:
        _patch(std.tqdm)
        return lambda: _unpatch(std.tqdm)
    hook = _TqdmHook()
    sys.meta_path.insert(0, hook)

    def undo() -> None:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
        if "tqdm.std" in sys.modules:
            _unpatch(sys.modules["tqdm.std"].tqdm)

    return undo


def enable(verbose: bool, *, tty: bool) -> Callable[[], None]:
    """Hide third-party warnings, log records below ERROR and progress bars unless ``verbose`` (or
    ``ZEBRACTL_VERBOSE=1``, set by a verbose parent); bars also when stderr is not a terminal
    (``tty`` false). Returns a function that puts everything back (for a command run in-process)."""
    verbose = verbose or os.environ.get(VERBOSE_ENV) == "1"
    saved_env = {k: os.environ.get(k) for k in (VERBOSE_ENV, *CHILD_ENV)}
    saved_filters = list(warnings.filters)
    saved_level = logging.root.manager.disable
    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    undo_bars = bars_off() if not (verbose and tty) else (lambda: None)
    if not verbose:
        for key, value in CHILD_ENV.items():
            os.environ.setdefault(key, value)
        # never one of zebractl's ("zebractl: ..."), even when its stack level names a library
        warnings.filterwarnings("ignore", message="(?!zebractl:)", module=MODULE_PATTERN)
        logging.disable(logging.WARNING)

    def restore() -> None:
        undo_bars()
        logging.disable(saved_level)
        warnings.filters[:] = saved_filters
        getattr(warnings, "_filters_mutated", lambda: None)()  # the modules' caches see it
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    return restore


@contextlib.contextmanager
def reported(*loggers: str) -> Iterator[None]:
    """No log record of the loggers named (and their children), whatever its level, for the block,
    unless verbose (``-v``: ``ZEBRACTL_VERBOSE=1``); the levels come back when it ends.

    For a block whose failures are raised and reported in zebractl's words: megatron's checkpoint
    writer logs ``Local process 0 encountered an error: ...`` at ERROR, which :func:`enable` keeps,
    on the line before the save's :class:`~zebractl.run.disk.DiskError`. A process forked inside the
    block (megatron's background writer) keeps them off for its life. The levels are process-wide:
    records of other threads are off as well while the block runs.
    """
    if os.environ.get(VERBOSE_ENV) == "1":
        yield
        return
    named = [logging.getLogger(name) for name in loggers]
    below = tuple(f"{name}." for name in loggers)
    named += [  # children with a level of their own (the others take their parent's)
        log
        for name, log in list(logging.root.manager.loggerDict.items())
        if isinstance(log, logging.Logger) and name.startswith(below) and log.level
    ]
    levels = [log.level for log in named]
    for log in named:
        log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for log, level in zip(named, levels, strict=True):
            log.setLevel(level)

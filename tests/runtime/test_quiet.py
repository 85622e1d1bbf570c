"""zebractl.runtime.quiet: the libraries' warnings, log records below ERROR and tqdm bars off unless
-v (issue 30, point 5); zebractl's own warnings stay; everything is put back by the undo."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import warnings

import pytest

from zebractl.runtime import quiet


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    """Each test starts from a user's environment: none of the variables quiet sets."""
    for key in (quiet.VERBOSE_ENV, *quiet.CHILD_ENV):
        monkeypatch.delenv(key, raising=False)


def _warn(module: str, message: str = "deprecated") -> list[str]:
    """Warn as if from ``module``; the messages that got through."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.filters[:] = [f for f in warnings.filters if f[0] != "error"]  # pytest's
        warnings.simplefilter("always", append=True)
        warnings.warn_explicit(message, FutureWarning, "x.py", 1, module=module)
    return [str(w.message) for w in seen]


def _logged(name: str, level: int) -> bool:
    """Whether a record of ``level`` on logger ``name`` is emitted (reaches a handler)."""
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    log = logging.getLogger(name)
    log.addHandler(handler)
    try:
        log.log(level, "a record")
    finally:
        log.removeHandler(handler)
    return bool(seen)


def _bar(**kw) -> str:
    from tqdm import tqdm

    out = io.StringIO()
    for _ in tqdm(range(3), file=out, **kw):
        pass
    return out.getvalue()


def test_third_party_warnings_logs_and_bars_off_then_back():
    undo = quiet.enable(False, tty=True)
    try:
        assert _warn("megatron.core.dist_checkpointing.strategies.torch") == []
        assert _warn("lm_eval.api.task") == [] and _warn("torch") == []
        assert _warn("zebractl.run.checkpoint") == ["deprecated"]  # ours stay
        assert _warn("torchvision_like") == ["deprecated"]  # a name is matched whole
        assert _warn("torch.nn", "zebractl: ours") == ["zebractl: ours"]  # via a library's frame
        assert not _logged("lm_eval", logging.WARNING) and _logged("torchao", logging.ERROR)
        assert _bar(disable=False) == ""  # lm-eval passes disable= explicitly
        assert os.environ[quiet.VERBOSE_ENV] == "0"
        assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"  # for the processes it starts
    finally:
        undo()
    assert _warn("megatron.core") == ["deprecated"]
    assert "3/3" in _bar(disable=False)
    assert quiet.VERBOSE_ENV not in os.environ and "TRANSFORMERS_VERBOSITY" not in os.environ
    assert _logged("lm_eval", logging.WARNING)


def test_verbose_changes_nothing_and_is_inherited(monkeypatch):
    undo = quiet.enable(True, tty=True)
    try:
        assert _warn("megatron.core") == ["deprecated"] and "3/3" in _bar()
        assert os.environ[quiet.VERBOSE_ENV] == "1"
    finally:
        undo()
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")  # a worker of `zebractl -v train --nproc 2`
    undo = quiet.enable(False, tty=True)
    try:
        assert _warn("megatron.core") == ["deprecated"]
    finally:
        undo()


def test_verbose_off_a_terminal_keeps_warnings_but_no_bars():
    undo = quiet.enable(True, tty=False)
    try:
        assert _warn("megatron.core") == ["deprecated"] and _bar(disable=False) == ""
    finally:
        undo()


def test_a_user_setting_is_kept(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    undo = quiet.enable(False, tty=True)
    undo()
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"


def test_tqdm_imported_later_is_patched_too():
    """The import hook: a process that imports tqdm after zebractl's CLI started (every command)."""
    code = (
        "import io, sys\n"
        "from zebractl.runtime import quiet\n"
        "quiet.enable(False, tty=True)\n"
        "assert 'tqdm' not in sys.modules\n"
        "from tqdm.auto import tqdm\n"
        "out = io.StringIO()\n"
        "list(tqdm(range(3), disable=False, file=out))\n"
        "print(repr(out.getvalue()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (quiet.VERBOSE_ENV, *quiet.CHILD_ENV)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "''"


def test_reported_turns_the_named_loggers_off_for_the_block(monkeypatch):
    """quiet.reported: every record of the loggers named and their children, ERROR included, is off
    while the block runs (a process forked inside keeps that), then back; others are untouched;
    with -v nothing changes."""
    import multiprocessing

    parent = "megatron.core.dist_checkpointing"
    writer = f"{parent}.strategies.filesystem_async"
    leveled = logging.getLogger(f"{parent}.leveled")  # a child with a level of its own
    monkeypatch.setattr(leveled, "level", logging.INFO)
    assert _logged(writer, logging.ERROR) and _logged(leveled.name, logging.ERROR)
    fork = multiprocessing.get_context("fork")
    with quiet.reported(parent):
        assert not _logged(writer, logging.ERROR) and not _logged(writer, logging.CRITICAL)
        assert not _logged(leveled.name, logging.ERROR)
        assert _logged("megatron.core.optimizer", logging.ERROR)  # only the loggers named
        assert _logged("megatron.core.dist_checkpointing_x", logging.ERROR)  # a name is whole
        reader, sender = fork.Pipe(duplex=False)
        child = fork.Process(
            target=lambda: sender.send(logging.getLogger(writer).isEnabledFor(logging.ERROR))
        )
        child.start()
    assert reader.recv() is False  # the fork keeps them off after the block ended
    child.join()
    assert _logged(writer, logging.ERROR) and leveled.level == logging.INFO
    assert logging.getLogger(parent).level == logging.NOTSET
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    with quiet.reported(parent):
        assert _logged(writer, logging.ERROR)

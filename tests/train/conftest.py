"""Fixtures of the training tests."""

from __future__ import annotations

import subprocess
import types
from collections.abc import Callable
from pathlib import Path

import pytest


class FakeProc:
    """A stand-in for a helper process: exits with ``code`` when waited for (None: never, until
    terminated or killed); counts the waits."""

    def __init__(self, argv=(), code=0, **kw):
        self.argv, self.kw, self.code, self.killed, self.waited = list(argv), kw, code, False, 0

    def wait(self, timeout=None):
        self.waited += 1
        if self.code is None and not self.killed:
            raise subprocess.TimeoutExpired(self.argv, timeout)
        return -15 if self.killed else self.code

    def poll(self):
        return None if self.code is None and not self.killed else self.wait()

    def terminate(self):
        self.killed = True

    kill = terminate


@pytest.fixture
def helper_processes(monkeypatch):
    """``patch(module)``: a module that starts helper processes (``zebractl.train.tilelang_build``,
    ``zebractl.train.compile_procs``) starts :class:`FakeProc` s instead, in ``procs``, with a GPU
    visible, nothing started before, and its exit hooks recorded in ``stops`` rather than
    registered. ``Proc`` is the class."""
    from zebractl.train import tilelang_build

    out = types.SimpleNamespace(procs=[], stops=[], Proc=FakeProc)

    def patch(module):
        def popen(argv, **kw):
            out.procs.append(FakeProc(argv, **kw))
            return out.procs[-1]

        monkeypatch.setattr(module.subprocess, "Popen", popen)
        monkeypatch.setattr(module, "_SPAWNED", {})
        monkeypatch.setattr(tilelang_build, "gpu_visible", lambda: True)
        monkeypatch.setattr(module.atexit, "register", lambda fn, *a: out.stops.append((fn, a)))
        return out

    out.patch = patch
    return out


# ---- the first iterations of the shipped tiny recipes (golden losses, the fine-tune's base)

SHIPPED_STEPS = 20
SHIPPED_SETS = (
    # the shipped recipe, logged every step, its own checkpoint interval (20): one save, of the
    # last iteration, that a fine-tune can start from; two held-out batches after iterations 10 and
    # 20 (test_trainer's learning test reads them). Neither changes the training numbers: the
    # golden losses were recorded without validation and still match.
    "logging.interval=1",
    "logging.tensorboard=false",
    "validation={interval: 10, iterations: 2}",
)
_SHIPPED: dict[str, Path] = {}
_SHIPPED_RESULTS: dict[Path, object] = {}


def _shipped(demo_data: Path, out: Path, recipe: str, *more: str, steps: int) -> Path:
    from zebractl.config.resolve import resolve_recipe
    from zebractl.run import ResolvedConfigRecord, RunDir
    from zebractl.train.trainer import Trainer

    r = resolve_recipe(recipe, [f"data.paths=[{{path: {demo_data}}}]", *SHIPPED_SETS, *more])
    run = RunDir.for_recipe(r.run, r.name, out)
    trainer = Trainer(
        r.run, run, ResolvedConfigRecord.of(r), stop_after=steps, console=lambda s: None
    )
    result = trainer.fit()
    assert result.iterations == steps
    _SHIPPED_RESULTS[out] = result
    return out


@pytest.fixture(scope="session")
def shipped_run(tmp_path_factory, demo_data) -> Callable[..., Path]:
    """``shipped_run(recipe, *sets, steps=SHIPPED_STEPS, out=None)``: the run folder of the first
    ``steps`` iterations of a shipped recipe as shipped (its schedule too, stopped there) on the
    demo corpus, with :data:`SHIPPED_SETS` and ``sets``. Without ``out``, trained once per session
    for each (recipe, sets, steps): the golden tests and the fine-tune tests read the same
    tiny_hybrid run; copy it before changing it. With ``out``: trained there, every call.
    ``shipped_run.results[folder]``: the run's RunResult."""

    def get(recipe: str, *sets: str, steps: int = SHIPPED_STEPS, out: Path | None = None) -> Path:
        if out is not None:
            return _shipped(demo_data, out, recipe, *sets, steps=steps)
        key = " ".join((recipe, *sets, str(steps)))
        if key not in _SHIPPED:
            folder = tmp_path_factory.mktemp(f"shipped_{recipe}") / "run"
            _SHIPPED[key] = _shipped(demo_data, folder, recipe, *sets, steps=steps)
        return _SHIPPED[key]

    get.results = _SHIPPED_RESULTS  # type: ignore[attr-defined]
    return get

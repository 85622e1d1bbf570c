"""Fixtures of the training tests."""

from __future__ import annotations

import subprocess
import types

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

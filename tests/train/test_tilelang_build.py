"""`zebractl.train.tilelang_build`: KDA's TileLang backward compiled ahead of the first step, in a
thread (default) or in a process started at launch (``kernels.precompile_tilelang: process``). On
the CPU: the shapes FLA specialises the kernel on, when a process is started and with what, the
background compilation waiting for it, and the process's own command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zebractl.train import precompile, tilelang_build


class _Proc:
    """A stand-in for the build's process."""

    def __init__(self, argv, **kw):
        self.argv, self.kw, self.waited = argv, kw, 0

    def wait(self, timeout=None):
        self.waited += 1
        return 0

    def poll(self):
        return 0


@pytest.fixture
def popen(monkeypatch):
    started: list[_Proc] = []

    def fake(argv, **kw):
        started.append(_Proc(argv, **kw))
        return started[-1]

    monkeypatch.setattr(tilelang_build.subprocess, "Popen", fake)
    monkeypatch.setattr(tilelang_build, "_SPAWNED", {})
    monkeypatch.setattr(tilelang_build, "_gpu_visible", lambda: True)
    monkeypatch.setattr(tilelang_build.atexit, "register", lambda *a: None)
    return started


def test_the_shapes_are_the_kda_mixers_at_the_runs_micro_batch(fast):
    from zebractl.config.resolve import resolve_recipe

    cfg = resolve_recipe("kda_300M", ["batch.micro=16"]).run
    d = cfg.model.linear_attention_dims("kda")
    assert tilelang_build.spec(cfg) == {
        "batch": 16, "heads": d.num_heads, "k": d.head_k_dim, "v": d.head_v_dim
    }  # fmt: skip
    assert tilelang_build.spec(resolve_recipe("gdn_300M").run) is None  # no KDA mixer
    assert tilelang_build.spec(fast.resolve("tiny_mamba").run) is None


def test_a_process_starts_only_when_asked_and_once_per_shapes(fast, popen):
    on = fast.resolve("tiny_kda", "kernels.precompile_tilelang=process").run
    assert tilelang_build.spawn(fast.resolve("tiny_kda").run) is None  # the default: a thread
    for sets in (["kernels.precompile=false"], ["kernels.backend=torch"]):
        off = fast.resolve("tiny_kda", "kernels.precompile_tilelang=process", *sets).run
        assert tilelang_build.spawn(off) is None, sets
    assert (
        tilelang_build.spawn(fast.resolve("tiny_gdn", "kernels.precompile_tilelang=process").run)
        is None
    )
    assert popen == []
    proc = tilelang_build.spawn(on)
    assert proc is popen[0] and tilelang_build.spawn(on) is proc and len(popen) == 1
    assert proc.argv[:3] == [sys.executable, "-m", "zebractl.train.tilelang_build"]
    assert json.loads(proc.argv[3]) == tilelang_build.spec(on)
    assert proc.kw["stdout"] is subprocess.DEVNULL and proc.kw["stderr"] is subprocess.DEVNULL
    assert tilelang_build.spawned(on) is proc


def test_no_process_without_a_gpu(fast, popen, monkeypatch):
    monkeypatch.setattr(tilelang_build, "_gpu_visible", lambda: False)
    on = fast.resolve("tiny_kda", "kernels.precompile_tilelang=process").run
    assert tilelang_build.spawn(on) is None and popen == []
    monkeypatch.undo()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert tilelang_build._gpu_visible() is False


def test_the_background_compilation_waits_for_the_process(fast, popen):
    on = fast.resolve("tiny_kda", "kernels.precompile_tilelang=process").run
    proc = tilelang_build.spawn(on)
    builds = precompile.tilelang_builds(on)
    assert builds == [proc.wait]
    builds[0]()
    assert proc.waited == 1


def test_in_a_thread_without_tilelang_nothing_is_built(fast):
    """This machine has no TileLang (or no GPU): FLA would run Triton, so there is nothing to build."""
    cfg = fast.resolve("tiny_kda").run
    assert tilelang_build.prepare(**tilelang_build.spec(cfg)) is None
    assert precompile.tilelang_builds(cfg) == []


def test_the_process_entry_point(monkeypatch):
    built: list[tuple] = []
    monkeypatch.setattr(tilelang_build, "prepare", lambda *a: lambda: built.append(a))
    assert tilelang_build.main([json.dumps({"batch": 2, "heads": 4, "k": 64, "v": 32})]) == 0
    assert built == [(2, 4, 64, 32)]
    for bad in ([], ["{"], ['{"batch": 2}'], ['["x"]']):
        assert tilelang_build.main(bad) == 2, bad
    assert built == [(2, 4, 64, 32)]
    monkeypatch.setattr(tilelang_build, "prepare", lambda *a: None)  # nothing applies: still 0
    assert tilelang_build.main([json.dumps({"batch": 1, "heads": 1, "k": 16, "v": 16})]) == 0


def test_the_trainer_without_the_launcher_starts_it_too(fast, popen):
    """precompile.start (the trainer's setup) starts the process where the launcher did not (the
    Python API), and finds the launcher's where it did: one process either way."""
    import types

    on = fast.resolve("tiny_kda", "kernels.precompile_tilelang=process").run
    precompile.start(on, types.SimpleNamespace(type="cpu"))
    assert len(popen) == 1
    precompile.start(on, types.SimpleNamespace(type="cpu"))
    assert len(popen) == 1 and tilelang_build.spawned(on) is popen[0]

"""`zebractl.train.tilelang_build`: KDA's TileLang backward compiled ahead of the first step, in a
thread (default) or in a process started at launch (``kernels.precompile_tilelang: process``). On
the CPU: the shapes FLA specialises the kernel on, when a process is started and with what, the
background compilation waiting for it, and the process's own command line."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

from zebractl.runtime import fla_import
from zebractl.train import precompile, tilelang_build


@pytest.fixture
def popen(helper_processes):
    return helper_processes.patch(tilelang_build).procs


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
    assert proc.argv[4:] == ["lean"]  # the default: FLA imported as kernels.lean_fla_import does
    whole = fast.resolve(
        "tiny_kda",
        "kernels.precompile_tilelang=process",
        "kernels.lean_fla_import=false",
        "batch.micro=1",
    ).run
    assert tilelang_build.spawn(whole).argv[4:] == []


def test_no_process_without_a_gpu(fast, popen, monkeypatch):
    monkeypatch.setattr(tilelang_build, "gpu_visible", lambda: False)
    on = fast.resolve("tiny_kda", "kernels.precompile_tilelang=process").run
    assert tilelang_build.spawn(on) is None and popen == []
    monkeypatch.undo()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert tilelang_build.gpu_visible() is False


def test_the_background_compilation_waits_for_the_process(fast, popen):
    on = fast.resolve("tiny_kda", "kernels.precompile_tilelang=process").run
    proc = tilelang_build.spawn(on)
    builds = precompile.tilelang_builds(on)
    assert builds == [proc.wait]
    builds[0]()
    assert proc.waited == 1


def test_in_a_thread_without_tilelang_nothing_is_built(fast):
    """This machine has no TileLang (or no GPU): FLA would run Triton, so there is nothing to build."""
    cfg = fast.resolve("tiny_kda", "kernels.precompile_tilelang=thread").run
    assert tilelang_build.prepare(**tilelang_build.spec(cfg)) is None
    assert precompile.tilelang_builds(cfg) == []


def test_the_process_entry_point(monkeypatch):
    built: list[tuple] = []
    monkeypatch.setattr(tilelang_build, "prepare", lambda *a: lambda: built.append(a))
    assert tilelang_build.main([json.dumps({"batch": 2, "heads": 4, "k": 64, "v": 32})]) == 0
    assert built == [(2, 4, 64, 32)]
    shapes = json.dumps({"batch": 2, "heads": 4, "k": 64, "v": 32})
    for bad in ([], ["{"], ['{"batch": 2}'], ['["x"]'], [shapes, "lean", "x"], [shapes, "fat"]):
        assert tilelang_build.main(bad) == 2, bad
    assert built == [(2, 4, 64, 32)]
    leaned: list[bool] = []
    monkeypatch.setattr(fla_import, "lean", lambda: leaned.append(True) or True)
    assert tilelang_build.main([shapes]) == 0 and leaned == []
    assert tilelang_build.main([shapes, "lean"]) == 0 and leaned == [True]  # before FLA's import
    assert built == [(2, 4, 64, 32)] * 3
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


def _kda_backward_inputs(torch, seed: int) -> dict:
    """Inputs of KDA's fused backward at a small shape (B 2, T 64, H 2, K 32, V 16), bf16 where the
    training step has bf16, fp32 gates and beta; ``seed`` printed by the caller."""
    gen = torch.Generator().manual_seed(seed)
    b, t, h, k, v, bt = 2, 64, 2, 32, 16, 64

    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(dtype)

    shapes = {
        "q": (b, t, h, k), "k": (b, t, h, k), "v": (b, t, h, v), "v_new": (b, t, h, v),
        "g": (b, t, h, k), "beta": (b, t, h), "A": (b, t, h, bt), "h": (b, t // bt, h, k, v),
        "do": (b, t, h, v), "dh": (b, t // bt, h, k, v), "dv": (b, t, h, v),
    }  # fmt: skip
    fp32 = {"g", "beta"}
    return {n: r(*s, dtype=torch.float if n in fp32 else torch.bfloat16) for n, s in shapes.items()}


def _fla_tilelang_module(monkeypatch):
    """FLA's TileLang backward module; where TileLang is not installed (this CPU), imported over a
    stand-in ``tilelang`` package that only satisfies its module-level decorator (its kernel
    builder is then replaced by the caller), and taken out of ``sys.modules`` after the test."""
    import importlib
    import types
    from unittest import mock

    name = "fla.ops.kda.backends.tilelang.chunk_bwd_dqkg"
    try:
        import tilelang  # noqa: F401
    except ImportError:
        fake = types.ModuleType("tilelang")
        fake.jit = lambda **kw: lambda fn: fn
        fake.PassConfigKey = mock.MagicMock()
        fake.language = mock.MagicMock()
        monkeypatch.setitem(sys.modules, "tilelang", fake)
        monkeypatch.setitem(sys.modules, "tilelang.language", fake.language)
        monkeypatch.setitem(sys.modules, name, None)  # restored (then dropped) after the test
        del sys.modules[name]
    return importlib.import_module(name)


def test_the_stand_in_gives_what_tilelangs_backward_allocates_in_this_thread_only(monkeypatch):
    """Under ``stand_in()`` FLA's TileLang backward returns, in the entering thread, tensors of the
    shapes, dtypes and strides FLA's own TileLang function allocates for its outputs (compared with
    that function run with its kernel replaced by a no-op), builds nothing, and leaves other
    threads (and every thread after the block) on the real implementation."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("fla")
    import threading

    from fla.ops.kda.backends import tilelang as fla_tilelang

    chunk_bwd_dqkg = _fla_tilelang_module(monkeypatch)
    seed = 1234
    print(f"seed {seed}")
    x = _kda_backward_inputs(torch, seed)
    built: list[tuple] = []
    monkeypatch.setattr(
        chunk_bwd_dqkg,
        "_build_kda_bwd_kernel",
        lambda *a, **kw: built.append(a) or (lambda *t: None),
    )
    monkeypatch.setattr(chunk_bwd_dqkg, "check_shared_mem", lambda *a: True)
    backend = fla_tilelang.KDATileLangBackend()
    real = backend.chunk_kda_bwd_wy_dqkg_fused(**x)  # FLA's allocation, the kernel a no-op
    assert len(built) == 1
    original = fla_tilelang.KDATileLangBackend.__dict__["chunk_kda_bwd_wy_dqkg_fused"]
    with tilelang_build.stand_in() as active:
        assert active
        stood = backend.chunk_kda_bwd_wy_dqkg_fused(**x)
        positional = backend.chunk_kda_bwd_wy_dqkg_fused(*x.values())
        other: list = []
        thread = threading.Thread(
            target=lambda: other.append(backend.chunk_kda_bwd_wy_dqkg_fused(**x))
        )
        thread.start()
        thread.join()
    assert len(built) == 2  # the other thread ran FLA's function (and asked for its kernel)
    assert fla_tilelang.KDATileLangBackend.__dict__["chunk_kda_bwd_wy_dqkg_fused"] is original
    for got in (stood, positional):
        assert len(got) == len(real) == 6
        for mine, theirs in zip(got, real, strict=True):
            assert (mine.shape, mine.dtype, mine.stride()) == (
                theirs.shape,
                theirs.dtype,
                theirs.stride(),
            )
    backend.chunk_kda_bwd_wy_dqkg_fused(**x)
    assert len(built) == 3  # after the block: the real function again


def test_no_stand_in_for_an_fla_it_does_not_know(monkeypatch):
    pytest.importorskip("fla")
    from fla.ops.kda.backends import tilelang as fla_tilelang

    monkeypatch.delattr(fla_tilelang.KDATileLangBackend, "chunk_kda_bwd_wy_dqkg_fused")
    with tilelang_build.stand_in() as active:
        assert active is False


@pytest.mark.parametrize("overlap", [False, True])
def test_kdas_backward_waits_for_the_tilelang_helper_unless_overlapped(fast, monkeypatch, overlap):
    """With a TileLang helper building, the background step's KDA backward waits for it (the
    default) or, with ``kernels.precompile_tilelang_overlap``, runs under the stand-in at once
    (the helper is still building when it does); join() waits for the helper either way and says
    which it was."""
    import threading
    import types

    from zebractl.model import ops

    cfg = fast.resolve("tiny_kda", f"kernels.precompile_tilelang_overlap={overlap}").run
    release, building = threading.Event(), threading.Event()

    def build() -> None:
        building.set()
        release.wait(30)

    monkeypatch.setattr(precompile, "tilelang_builds", lambda cfg: [build])
    monkeypatch.setattr(ops, "kernel_options", lambda k, d: types.SimpleNamespace(backend="fla"))
    seen: list[tuple] = []

    @contextlib.contextmanager
    def fake_stand_in():
        seen.append(("stand_in", threading.get_ident()))
        yield True

    monkeypatch.setattr(tilelang_build, "stand_in", fake_stand_in)

    def exercise(cfg, device, before_backward=None):
        assert building.wait(30)
        seen.append(("exercise", threading.get_ident()))
        if overlap:  # must not wait: the helper is blocked until we release it
            before_backward("kda")
            seen.append(("backward", release.is_set()))
            release.set()
        else:
            threading.Timer(0.2, release.set).start()
            before_backward("kda")
            seen.append(("backward", release.is_set()))

    monkeypatch.setattr(precompile, "exercise", exercise)
    note = precompile.start(cfg, types.SimpleNamespace(type="cuda")).join()
    assert note.startswith("kernels compiled in the background in"), note
    if overlap:
        (_, stand_tid), (_, ex_tid), backward = seen
        assert stand_tid == ex_tid and backward == ("backward", False)
        assert "KDA's backward compiled beside its TileLang kernel" in note
    else:
        assert [s[0] for s in seen] == ["exercise", "backward"] and seen[1] == ("backward", True)
        assert "TileLang" not in note

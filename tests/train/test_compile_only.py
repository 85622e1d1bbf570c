"""`zebractl.train.compile_only` (``kernels.precompile_workers``): kernel calls compile without
launching, in the thread that entered the block only; autotuned kernels without a tuned
configuration are skipped, never benchmarked; Triton's hooks are restored after the block.

CPU: the Triton entry points are replaced by recorders (a real compile needs a GPU driver), and a
real ``triton.autotune`` object supplies the tuning key and the lookups. GPU: the background
compilation with workers leaves the first step nothing to compile (its kernels' caches filled) and
trains the same losses as without it.
"""

from __future__ import annotations

import threading
import types

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from triton.runtime import autotuner, jit  # noqa: E402

from zebractl.train import compile_only as co  # noqa: E402
from zebractl.train import precompile  # noqa: E402


@triton.autotune(
    configs=[triton.Config({"B": 16}), triton.Config({"B": 32})], key=["N"], cache_results=False
)
@triton.jit
def _tuned(X, N, B: tl.constexpr):
    pass


@triton.autotune(configs=[triton.Config({"B": 16})], key=["N"])
@triton.jit
def _single(X, N, B: tl.constexpr):
    pass


def test_the_installed_triton_has_what_it_relies_on():
    assert co.supported()


@pytest.fixture
def launches(monkeypatch):
    """``JITFunction.run`` replaced by a recorder of (thread, warmup) per call."""
    seen: list[tuple[str, bool]] = []

    def run(self, *args, grid, warmup, **kwargs):
        seen.append((threading.current_thread().name, warmup))
        return "kernel"

    monkeypatch.setattr(jit.JITFunction, "run", run)
    return seen


def test_only_the_entering_thread_compiles_without_launching(launches):
    before = jit.JITFunction.run
    fn = _tuned.fn  # the JITFunction under the autotuner
    with co.compile_only(4) as done:
        jit.JITFunction.run(fn, 1, 2, grid=(1,), warmup=False)
        other = threading.Thread(
            name="setup", target=lambda: jit.JITFunction.run(fn, 1, 2, grid=(1,), warmup=False)
        )
        other.start()
        other.join()
    me = threading.current_thread().name
    assert launches == [(me, True), ("setup", False)]
    assert done.submitted == 1 and done.untuned == []
    assert jit.JITFunction.run is before  # restored
    jit.JITFunction.run(fn, 1, 2, grid=(1,), warmup=False)
    assert launches[-1] == (me, False)


def test_an_untuned_kernel_is_skipped_never_benchmarked(launches, monkeypatch):
    x = torch.zeros(4)
    benchmarked = []
    monkeypatch.setattr(_tuned, "_bench", lambda *a, **k: benchmarked.append(1) or [1.0])
    _tuned.cache.clear()
    before = autotuner.Autotuner.run
    with co.compile_only(2) as done:
        assert autotuner.Autotuner.run(_tuned, x, 7, grid=(1,), warmup=False) is None
        _tuned.cache[co.tuning_key(_tuned, (x, 7), {})] = _tuned.configs[1]  # now tuned
        autotuner.Autotuner.run(_tuned, x, 7, grid=(1,), warmup=False)
        autotuner.Autotuner.run(_single, x, 7, grid=(1,), warmup=False)  # one config: no tuning
    assert done.untuned == ["_tuned"] and done.submitted == 2
    assert benchmarked == [] and autotuner.Autotuner.run is before
    assert [w for _, w in launches] == [True, True]
    _tuned.cache.clear()


def test_the_tuning_key_is_tritons():
    x = torch.zeros(4, dtype=torch.bfloat16)
    assert co.tuning_key(_tuned, (x, 7), {}) == (7, "torch.bfloat16")
    assert co.tuning_key(_tuned, (x,), {"N": 9}) == (9, "torch.bfloat16")


def test_a_tuned_configuration_on_disk_is_used_and_a_miss_is_not_benchmarked(monkeypatch):
    x = torch.zeros(4)
    key = co.tuning_key(_tuned, (x, 5), {})
    _tuned.cache.clear()
    monkeypatch.setattr(_tuned, "cache_results", True)

    def hit(tuning_key, configs, bench_fn):
        _tuned.cache[tuning_key] = configs[0]
        return True

    monkeypatch.setattr(_tuned, "check_disk_cache", hit)
    assert co.is_tuned(_tuned, (x, 5), {}) and key in _tuned.cache
    _tuned.cache.clear()
    ran = []

    def miss(tuning_key, configs, bench_fn):
        bench_fn()  # Triton benchmarks on a miss: the lookup refuses instead
        ran.append("benchmarked")
        return False

    monkeypatch.setattr(_tuned, "check_disk_cache", miss)
    assert not co.is_tuned(_tuned, (x, 5), {}) and ran == [] and _tuned.nargs is None
    monkeypatch.setattr(_tuned, "cache_results", False)
    assert not co.is_tuned(_tuned, (x, 5), {})
    assert co.is_tuned(_single, (x, 5), {})


def test_a_compile_error_is_raised_when_the_block_ends(monkeypatch):
    from triton.runtime import _async_compile

    def run(self, *args, grid, warmup, **kwargs):
        mode = _async_compile.active_mode.get()
        return mode.submit("k", lambda: 1 / 0, lambda kernel: None)

    monkeypatch.setattr(jit.JITFunction, "run", run)
    with pytest.raises(ZeroDivisionError), co.compile_only(2):
        jit.JITFunction.run(_tuned.fn, grid=(1,), warmup=False)
    assert _async_compile.active_mode.get() is None


def test_the_log_line_says_what_was_compiled_and_what_was_left():
    job = precompile.Precompile(finished=None)
    job.compiled = co.CompileOnly(submitted=41, untuned=["a", "b"])
    line = job.join()
    assert "41 kernel calls compiled without launching" in line
    assert "2 autotuned kernels left to the first step" in line


def test_the_workers_key_is_read_on_the_cpu(fast):
    cfg = fast.resolve("tiny_kda", "kernels.precompile_workers=8").run
    assert precompile.start(cfg, torch.device("cpu")) is None
    assert cfg.kernels.precompile_workers == 8


def test_a_triton_without_the_internals_falls_back(fast, monkeypatch):
    """Where ``supported()`` is false the background step launches its kernels as before."""
    calls = []
    monkeypatch.setattr(co, "supported", lambda: False)
    monkeypatch.setattr(co, "compile_only", lambda workers: pytest.fail("used"))
    monkeypatch.setattr(precompile, "exercise", lambda cfg, device, before=None: calls.append(1))
    monkeypatch.setattr(precompile, "tilelang_builds", lambda cfg: [])
    monkeypatch.setattr(
        "zebractl.model.ops.kernel_options", lambda k, d: types.SimpleNamespace(backend="fla")
    )
    cfg = fast.resolve("tiny_kda", "kernels.precompile_workers=8").run
    job = precompile.start(cfg, types.SimpleNamespace(type="cuda"))
    assert job is not None
    assert "compiled in the background" in job.join() and calls == [1]
    assert job.compiled is None


def test_a_share_compiles_every_nth_call_and_skips_the_rest(launches):
    """``share=(i, n)``: of the calls met in the block, those whose index is i modulo n compile
    (without launching), the others are neither compiled nor launched; n processes walking the
    same step with i = 0..n-1 compile each call exactly once between them."""
    fn = _tuned.fn
    compiled: list[list[int]] = []
    for i in range(3):
        before = len(launches)
        with co.compile_only(2, share=(i, 3)) as done:
            for _ in range(7):
                jit.JITFunction.run(fn, 1, 2, grid=(1,), warmup=False)
        assert all(w for _, w in launches[before:])  # compiled, never launched
        assert done.calls == 7
        compiled.append([k for k in range(7) if k % 3 == i])
        assert done.submitted == len(compiled[-1])
    assert sorted(k for share in compiled for k in share) == list(range(7))

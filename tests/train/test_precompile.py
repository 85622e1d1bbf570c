"""`zebractl.train.precompile`: the background compilation of a run's kernels exercises every
distinct mixer at the run's shapes without touching the run's random state, and is skipped (or
fails softly) where it has nothing to do."""

from __future__ import annotations

import random
import types

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from zebractl.train import precompile  # noqa: E402

TINY = ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"]


@pytest.mark.parametrize("recipe", TINY)
def test_exercise_leaves_the_random_state_alone(fast, recipe, monkeypatch):
    """It runs forward + backward of each mixer kind of the model (counted), the norms and the
    loss, and the process's torch, numpy and python random states are what they were (the run is
    bitwise the same with and without it)."""
    from zebractl.model import mixers

    cfg = fast.resolve(recipe, "batch.micro=2").run
    seen: list[str] = []
    for kind, cls in list(mixers.MIXERS.items()):

        class Counted(cls):  # type: ignore[misc, valid-type]
            def forward(self, x, _kind=kind):
                seen.append(_kind)
                return super().forward(x)

        monkeypatch.setitem(mixers.MIXERS, kind, Counted)
    torch.manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    precompile.exercise(cfg, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert random.getstate() == before[2]
    kinds = [k for k in dict.fromkeys(cfg.model.sublayers) if k in mixers.MIXERS]
    assert kinds and seen == [k for k in kinds for _ in range(2)]  # train + eval forward each


def test_nothing_starts_where_nothing_would_compile(fast):
    cfg = fast.resolve("tiny_kda").run
    assert precompile.start(cfg, torch.device("cpu")) is None
    fake_cuda = types.SimpleNamespace(type="cuda")
    off = fast.resolve("tiny_kda", "kernels.precompile=false").run
    assert precompile.start(off, fake_cuda) is None
    torch_backend = fast.resolve("tiny_kda", "kernels.backend=torch").run
    assert precompile.start(torch_backend, fake_cuda) is None


def test_a_failure_is_a_note_not_an_error(fast, monkeypatch):
    """A failing background compilation (out of memory, a kernel that refuses a shape) only says
    so: the first step then compiles the kernels itself."""
    from zebractl.model import ops

    cfg = fast.resolve("tiny_kda").run
    monkeypatch.setattr(ops, "kernel_options", lambda k, d: types.SimpleNamespace(backend="fla"))

    def boom(cfg, device, before_backward=None):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(precompile, "exercise", boom)
    job = precompile.start(cfg, types.SimpleNamespace(type="cuda"))
    assert job is not None
    note = job.join()
    assert note.startswith("note: compiling the kernels in the background failed")
    assert "OutOfMemoryError" in note and "first step compiles them" in note

    monkeypatch.setattr(precompile, "exercise", lambda cfg, device, before=None: None)
    assert (
        precompile.start(cfg, types.SimpleNamespace(type="cuda"))
        .join()
        .startswith("kernels compiled in the background in")
    )


@pytest.mark.gpu
@pytest.mark.parametrize(("workers", "processes"), [(0, 0), (16, 0), (0, 2)])
def test_gpu_runs_are_the_same_with_and_without_background_compilation(
    fast, tmp_path, monkeypatch, workers, processes
):
    """The real thing on a GPU with FLA kernels: the thread runs and succeeds (its note is printed),
    and the run's losses equal those of a run without it: the first bitwise (forward kernels are
    deterministic), later ones within 1e-3 relative (FLA's backward kernels may sum in another
    order from run to run). ``workers``: ``kernels.precompile_workers`` (16: the step compiles its
    Triton kernels without launching them, 16 at once; the note says how many). ``processes``:
    ``kernels.precompile_processes`` (2: two processes compile the step's kernels first, each
    half; the note says none failed).

    kda_300M as shipped (torch_fused, bf16 autocast, FLA's Triton kernels and KDA's TileLang
    backward in the helper thread) at micro-batch 16 of 2048, the shapes of the shipped tuned
    configurations: nothing autotunes (the tiny model this test used before autotuned every kernel:
    232.8 s cold on the H200). The runs get a kernel cache of their own (Triton's and TileLang's
    disk caches in tmp_path, seeded with the shipped configurations as ``zebractl train`` seeds
    them), so the test does not depend on an earlier test run's cache; kernels an earlier test of
    this process compiled at these shapes (test_cuda_graph_gpu.py) stay in memory, which only
    makes the thread quicker: its note is printed either way (Precompile.join)."""
    import shutil

    from zebractl.runtime import kernel_cache

    env = {kernel_cache.CACHE_ENV: str(tmp_path / "kernel-cache")}
    cache = kernel_cache.configure(env)
    assert cache is not None
    for var in ("TRITON_CACHE_DIR", "TILELANG_CACHE_DIR", "TRITON_CACHE_AUTOTUNING"):
        monkeypatch.setenv(var, env[var])  # put back as they were after the test
    print(cache.describe())
    sets = (
        "schedule.iterations=3",
        "batch.micro=16",
        "batch.global=16",
        "data.seq_length=2048",
        "data.tokenizer=null",
        "data.num_workers=0",
        "parallelism.num_gpus=1",
        "kernels.backend=fla",
    )
    lines: list[str] = []
    on_sets = (
        *sets,
        f"kernels.precompile_workers={workers}",
        f"kernels.precompile_processes={processes}",
    )
    fast.train("kda_300M", tmp_path / "on", *on_sets, console=lines.append)
    # one line from Precompile.join(): success, or "note: ... failed (<error>)" with the reason
    # (not the save mode's line: "checkpoint saves: in the background ...", the default on a GPU)
    notes = [line for line in lines if "compil" in line and "in the background" in line]
    assert len(notes) == 1, lines
    assert notes[0].startswith("kernels compiled in the background"), notes[0]
    assert ("compiled without launching" in notes[0]) == (workers > 0), notes[0]
    assert (f"{processes} compile processes (0 failed" in notes[0]) == (processes > 0), notes[0]
    shutil.rmtree(tmp_path / "on" / "checkpoints", ignore_errors=True)  # the final save: 3.6 GB
    fast.train("kda_300M", tmp_path / "off", *sets, "kernels.precompile=false")
    shutil.rmtree(tmp_path / "off" / "checkpoints", ignore_errors=True)
    on, off = fast.losses(tmp_path / "on"), fast.losses(tmp_path / "off")
    assert on.keys() == off.keys() == {1, 2, 3}
    assert on[1] == off[1]
    assert all(abs(on[i] - off[i]) <= 1e-3 * abs(off[i]) for i in on), (on, off)


def test_a_setup_failure_waits_for_the_compile_threads(fast, tmp_path, monkeypatch):
    """A setup error after the compile started (here: the datasets) waits for the compile threads
    before it propagates: an interpreter exiting under a thread in nvcc or ptxas aborted the
    process (exit 134, "terminate called without an active exception", H200 2026-12-02) where the
    error's own exit code belonged. A data mistake is found before any compile starts."""
    import threading

    from zebractl.errors import ConfigError
    from zebractl.train import data

    release = threading.Event()
    job = precompile.Precompile(thread=threading.Thread(target=release.wait, daemon=True))
    started: list[precompile.Precompile] = []

    def start(cfg, device):
        job.thread.start()
        threading.Timer(1.5, release.set).start()
        started.append(job)
        return job

    def broken(*a, **k):
        raise ConfigError("the datasets could not be built")

    monkeypatch.setattr(precompile, "start", start)
    monkeypatch.setattr(data, "build_datasets", broken)
    msgs: list[str] = []
    with pytest.raises(ConfigError, match="could not be built"):
        fast.train("tiny_kda", tmp_path / "a", console=msgs.append)
    assert started and not job.thread.is_alive()
    assert any("waiting for the background kernel compilation" in m for m in msgs), msgs

    started.clear()
    no_held_out = ("data.split=[100, 0, 0]", "validation={interval: 1, iterations: 1}")
    with pytest.raises(ConfigError, match="no held-out part"):
        fast.train("tiny_kda", tmp_path / "b", *no_held_out)
    assert not started  # refused before the compile would start

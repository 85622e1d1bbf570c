"""`zebractl.train.compile_procs` (``kernels.precompile_processes``): N processes started at
launch compile the step's Triton kernels, each its share, while the run imports and sets up; the
background compilation waits for them. On the CPU: when processes start and with what (their
configuration file gives back the run's), the wait and its line, the entry point's refusals, and
the background compilation waiting for them before its own step."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from zebractl.schemas.recipe import RunConfig
from zebractl.train import compile_procs, precompile, tilelang_build


@pytest.fixture
def popen(helper_processes):
    return helper_processes.patch(compile_procs)


def test_processes_start_only_when_asked_and_once_per_configuration(fast, popen):
    on = fast.resolve("tiny_kda", "kernels.precompile_processes=3").run
    assert compile_procs.spawn(fast.resolve("tiny_kda").run) == []  # the default: none
    for sets in (["kernels.precompile=false"], ["kernels.backend=torch"]):
        off = fast.resolve("tiny_kda", "kernels.precompile_processes=3", *sets).run
        assert compile_procs.spawn(off) == [], sets
    assert popen.procs == []
    procs = compile_procs.spawn(on)
    assert procs == popen.procs and len(procs) == 3
    assert compile_procs.spawn(on) is procs  # once
    config = Path(procs[0].argv[5])
    for i, proc in enumerate(procs):
        assert proc.argv == [
            sys.executable,
            "-m",
            "zebractl.train.compile_procs",
            str(i),
            "3",
            str(config),
        ]
        assert proc.kw["stdout"] is subprocess.DEVNULL and proc.kw["stderr"] is subprocess.DEVNULL
    assert RunConfig.model_validate_json(config.read_text()) == on  # the run's own configuration
    ((stop, args),) = popen.stops
    stop(*args)  # at exit: the file goes (the processes had ended)
    assert not config.exists()


def test_a_nodes_ranks_share_the_processes(fast, monkeypatch):
    monkeypatch.setattr(tilelang_build, "gpu_visible", lambda: True)
    on = fast.resolve("tiny_kda", "kernels.precompile_processes=4").run
    for ranks, each in (("1", 4), ("2", 2), ("3", 2), ("8", 1), ("x", 4), ("0", 4)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
        assert compile_procs.wanted(on) == each, ranks


def test_no_processes_without_a_gpu(fast, popen, monkeypatch):
    monkeypatch.setattr(tilelang_build, "gpu_visible", lambda: False)
    on = fast.resolve("tiny_kda", "kernels.precompile_processes=2").run
    assert compile_procs.wanted(on) == 0 and compile_procs.spawn(on) == [] and popen.procs == []


def test_the_wait_says_how_many_failed_and_stops_a_process_past_the_limit(helper_processes):
    proc = helper_processes.Proc
    done, failed, stuck = proc(code=0), proc(code=1), proc(code=None)
    line = compile_procs.wait([done, failed, stuck], limit=0.05)
    assert line.startswith("3 compile processes (2 failed; waited ") and stuck.killed
    assert compile_procs.wait([]).startswith("0 compile processes (0 failed")


@pytest.mark.parametrize(
    "argv",
    [[], ["0"], ["x", "2", "cfg"], ["2", "2", "CFG"], ["-1", "2", "CFG"], ["0", "2", "missing"],
     ["0", "2", "BROKEN"]],
)  # fmt: skip
def test_the_entry_point_refuses_what_is_not_its_arguments(argv, fast, tmp_path):
    good = tmp_path / "cfg.json"
    good.write_text(fast.resolve("tiny_kda").run.model_dump_json(by_alias=True))
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": 1}')
    paths = {"CFG": str(good), "BROKEN": str(broken), "missing": str(tmp_path / "none.json")}
    assert compile_procs.main([paths.get(a, a) for a in argv]) == 2


def test_the_entry_point_does_nothing_without_cuda(fast, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(fast.resolve("tiny_kda").run.model_dump_json(by_alias=True))
    assert compile_procs.main(["1", "2", str(cfg)]) == 0


def test_the_background_compilation_waits_for_the_processes_first(
    fast, monkeypatch, helper_processes
):
    """The thread waits for the processes before its own step (whose kernels they left in the
    disk cache) and its line says how that went; on a CPU device none start."""
    from zebractl.model import ops

    cfg = fast.resolve("tiny_kda", "kernels.precompile_processes=2").run
    monkeypatch.setattr(tilelang_build, "gpu_visible", lambda: True)
    order: list[str] = []

    class Proc(helper_processes.Proc):
        def wait(self, timeout=None):
            order.append("wait")
            return 0

    monkeypatch.setattr(compile_procs, "spawn", lambda cfg: [Proc(), Proc()])
    monkeypatch.setattr(precompile, "tilelang_builds", lambda cfg: [])
    monkeypatch.setattr(ops, "kernel_options", lambda k, d: types.SimpleNamespace(backend="fla"))
    monkeypatch.setattr(
        precompile, "exercise", lambda cfg, device, before=None: order.append("exercise")
    )
    note = precompile.start(cfg, types.SimpleNamespace(type="cuda")).join()
    assert order == ["wait", "wait", "exercise"]
    assert "; 2 compile processes (0 failed; waited " in note, note
    started: list = []
    monkeypatch.setattr(compile_procs, "spawn", lambda cfg: started.append(cfg) or [])
    assert precompile.start(cfg, types.SimpleNamespace(type="cpu")) is None and started == []


def test_the_step_a_process_walks_imports_no_megatron(fast):
    """A compile process imports torch, FLA and zebractl's mixers, norms and ops, and walks the
    step: megatron-core (~3 s on a 2-core CPU, 12-15 s on the H100 of e87a0dd) is not its to import.
    A fresh interpreter runs the CPU step of tiny_kda and lists what it imported."""
    cfg = fast.resolve("tiny_kda").run
    code = (
        "import json, sys, torch\n"
        "from zebractl.schemas.recipe import RunConfig\n"
        "from zebractl.train import compile_procs, compile_only\n"
        "from zebractl.train.exercise import exercise\n"
        "cfg = RunConfig.model_validate_json(sys.stdin.read())\n"
        "exercise(cfg, torch.device('cpu'))\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=cfg.model_dump_json(by_alias=True),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    top = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "torch" in top and "zebractl" in top
    assert "megatron" not in top

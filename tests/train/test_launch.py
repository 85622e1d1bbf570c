"""Multi-process launch: torchrun data parallelism on CPU (gloo) and the Slurm script."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "slurm"


def test_slurm_script_snapshot(cli, tmp_path, monkeypatch):
    """The generated sbatch script is reviewed text: a change must update the golden file."""
    monkeypatch.chdir(tmp_path)
    r = cli("train", "kda_300M", "--slurm", "--set", "batch.micro=32", "--output", "runs/kda_300M")
    assert r.exit_code == 0, r.output
    assert "1 node(s) x 8 GPU(s)" in r.stdout
    got = (tmp_path / "runs" / "kda_300M" / "train.sbatch").read_text()
    assert got == (ASSETS / "kda_300M.sbatch").read_text()


def test_slurm_script_spreads_nodes(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli(
        "train",
        "kda_300M",
        "--slurm",
        "--set",
        "parallelism.num_gpus=32",
        "--set",
        "batch.micro=32",
        "--output",
        "run",
    )
    assert r.exit_code == 0 and "4 node(s) x 8 GPU(s)" in r.stdout
    text = (tmp_path / "run" / "train.sbatch").read_text()
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=8" in text
    # every rank is an srun task (so Slurm's signals reach it), warned before the time limit,
    # and the job requeues itself when the run stopped for that warning
    assert "#SBATCH --signal=USR1@300" in text and "#SBATCH --requeue" in text
    assert 'if [ "$rc" -eq 138 ]; then' in text and 'scontrol requeue "$SLURM_JOB_ID"' in text
    checked = subprocess.run(["bash", "-n", str(tmp_path / "run" / "train.sbatch")])
    assert checked.returncode == 0


def test_submit_without_sbatch_is_a_clear_failure(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    r = cli("train", "kda_300M", "--submit", "--set", "batch.micro=32", "--output", "run")
    assert r.exit_code == 2 and "sbatch is not on PATH" in r.stderr


@pytest.mark.slow
def test_two_process_data_parallel_matches_one_process(cli, fast, tmp_path):
    sets = fast.args("schedule.iterations=4", "checkpoint.interval=2")
    one = cli("train", "tiny_kda", *sets, "--output", str(tmp_path / "one"))
    assert one.exit_code == 0, one.output
    two = cli("train", "tiny_kda", "--nproc", "2", *sets, "--output", str(tmp_path / "two"))
    assert two.exit_code == 0, two.output

    def losses(d):
        rows = map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
        return [r["loss"] for r in rows if r["kind"] == "train"]

    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert len(a) == len(b) == 4
    # same global batch, same samples, split over 2 ranks: equal up to fp32 summation order
    assert b == pytest.approx(a, rel=1e-4)
    cfg = json.loads((tmp_path / "two" / "config.resolved.json").read_text())
    assert cfg["config"]["parallelism"]["num_gpus"] == 2

    # checkpoints reshard: iteration 2 of the 2-process run resumes in 1 process and vice versa,
    # and iterations 3-4 continue the run they came from
    for src, nproc, out in (("two", "1", "two_to_one"), ("one", "2", "one_to_two")):
        shutil.copytree(
            tmp_path / src / "checkpoints" / "iter_0000002",
            tmp_path / out / "checkpoints" / "iter_0000002",
        )
        r = cli("train", "tiny_kda", "--nproc", nproc, *sets, "--output", str(tmp_path / out))
        assert r.exit_code == 0, r.output
        assert nproc == "2" or "resumed from" in r.output  # torchrun's children print elsewhere
        resumed = losses(tmp_path / out)
        assert len(resumed) == 2
        assert resumed == pytest.approx((a if src == "one" else b)[2:], rel=1e-4)


@pytest.mark.slow
def test_sigterm_to_a_torchrun_launch_saves_every_rank_and_exits_143(fast, tmp_path):
    """The launcher forwards SIGTERM to the workers, which finish their step and save together."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "zebractl", "train", "tiny_kda", "--nproc", "2", "-o", str(out)]
    cmd += fast.args("schedule.iterations=400")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    os.kill(proc.pid, signal.SIGTERM)
    log = proc.communicate(timeout=240)[0]
    assert proc.returncode == 143, log[-3000:]
    from zebractl.run import checkpoint as ckpt

    saved = ckpt.complete(out / "checkpoints")
    assert len(saved) == 1 and saved[0].marker.world_size == 2, log[-3000:]
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert saved[0].iteration == rows[-1]["iteration"] < 400  # the last completed step


def test_a_launcher_without_a_bar_tells_its_workers_to_draw_none(fast, tmp_path, monkeypatch):
    # `train --nproc 2 --json` (or stderr not a terminal): the workers share the launcher's stderr
    from zebractl.train import launch
    from zebractl.train.progress import NO_BAR_ENV

    envs: list = []
    monkeypatch.setattr(launch, "run_children", lambda cmd, env=None: envs.append(env) or 0)
    for bar in (False, True):
        req = launch.TrainRequest("tiny_kda", fast.sets(), tmp_path, nproc=2, bar=bar)
        assert launch.start(req, lambda s: None).kind == "torchrun"
    assert envs[0][NO_BAR_ENV] == "1" and envs[1] is None

"""Multi-process launch: torchrun data parallelism on CPU (gloo) and the Slurm script."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "slurm"
FAST = [
    "batch.micro=4",
    "batch.global=8",
    "data.seq_length=64",
    "logging.interval=1",
    "logging.tensorboard=false",
    "checkpoint.interval=1000",
    "schedule.warmup_iterations=2",
    "schedule.iterations=4",
]


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
    assert "#SBATCH --nodes=4" in text and "--nproc_per_node=8" in text


def test_submit_without_sbatch_is_a_clear_failure(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    r = cli("train", "kda_300M", "--submit", "--set", "batch.micro=32", "--output", "run")
    assert r.exit_code == 1 and "sbatch is not on PATH" in r.stderr


def test_two_process_data_parallel_matches_one_process(cli, demo_data, tmp_path):
    sets = [
        x
        for s in [f"data.paths=[{{path: {demo_data}}}]", *FAST, "checkpoint.interval=2"]
        for x in ("--set", s)
    ]
    one = cli("train", "tiny_kda", *sets, "--output", str(tmp_path / "one"))
    assert one.exit_code == 0, one.output
    two = cli("train", "tiny_kda", "--nproc", "2", *sets, "--output", str(tmp_path / "two"))
    assert two.exit_code == 0, two.output

    def losses(d):
        return [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]

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

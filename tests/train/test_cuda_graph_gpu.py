"""``kernels.cuda_graph`` on the GPU: the graphed run trains as the eager one (`pytest -m gpu`).

kda_300M as shipped (torch_fused, FLA's Triton and TileLang kernels, the chunked LM-head loss), made
short: micro-batch 16 of seq 2048 (the shapes of the shipped tuned kernel configurations: no
autotuning), two micro-batches per step (the graph's gradient accumulation adds in place), 8
iterations on the demo corpus. The two runs start from the same seed and read the same
data; the graph replays the kernels the eager steps launch, so the losses agree to within kernel
nondeterminism (tolerance: 1e-4 relative per iteration, stated before the first GPU run).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fla")

pytestmark = pytest.mark.gpu

SETS = [
    "batch.micro=16",
    "batch.global=32",
    "data.seq_length=2048",
    "schedule.iterations=8",
    "schedule.warmup_iterations=2",
    "logging.interval=1",
    "logging.tensorboard=false",
    "checkpoint.interval=1000",
    "validation=null",
    "parallelism.num_gpus=1",
    "data.tokenizer=null",
]


def _run(data: Path, out: Path, *more: str) -> tuple[dict[int, float], list[str]]:
    from zebractl.config.resolve import resolve_recipe
    from zebractl.run import ResolvedConfigRecord, RunDir
    from zebractl.train.trainer import Trainer

    r = resolve_recipe("kda_300M", [f"data.paths=[{{path: {data}}}]", *SETS, *more])
    said: list[str] = []
    Trainer(r.run, RunDir(out), ResolvedConfigRecord.of(r), console=said.append).fit()
    # the final save, 3.6 GB: the H200 machine's disk is 64 GB
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    return {x["iteration"]: x["loss"] for x in rows if x["kind"] == "train"}, said


def test_graphed_run_matches_the_eager_run(demo_data, tmp_path):
    eager, _ = _run(demo_data, tmp_path / "eager")
    graphed, said = _run(demo_data, tmp_path / "graphed", "kernels.cuda_graph=true")
    print("eager", eager, "\ngraphed", graphed)
    assert any("forward+backward captured" in s for s in said), said
    assert eager.keys() == graphed.keys() == set(range(1, 9))
    worst = max(abs(graphed[i] - eager[i]) / abs(eager[i]) for i in eager)
    print(f"max relative loss difference {worst:.3e}")
    assert worst <= 1e-4, (eager, graphed)

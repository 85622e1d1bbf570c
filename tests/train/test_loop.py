"""`zebractl train` on CPU: the tiny recipes learn, resume is bitwise, checkpoints are atomic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.config.errors import ConfigError  # noqa: E402
from zebractl.config.resolve import resolve_recipe  # noqa: E402
from zebractl.train import checkpoint as ckpt  # noqa: E402
from zebractl.train import loop  # noqa: E402

FAST = [
    "batch.micro=4",
    "batch.global=8",
    "data.seq_length=64",
    "logging.interval=1",
    "logging.tensorboard=false",
    "checkpoint.interval=1000",
    "schedule.warmup_iterations=2",
]


def _train_args(data: Path, *sets: str) -> list[str]:
    """`--set` arguments of the fast tiny run on ``data`` plus ``sets``."""
    return [x for s in (f"data.paths=[{{path: {data}}}]", *FAST, *sets) for x in ("--set", s)]


def _cfg(recipe: str, data: Path, *sets: str):
    r = resolve_recipe(recipe, [f"data.paths=[{{path: {data}}}]", *FAST, *sets])
    return r.run, {"config": r.values(), "provenance": r.provenance}


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    return {r["iteration"]: r["loss"] for r in rows}


@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"])
def test_tiny_recipes_learn_on_real_text(recipe, demo_data, tmp_path):
    cfg, doc = _cfg(recipe, demo_data, "schedule.iterations=30")
    result = loop.run(cfg, tmp_path, config_doc=doc, console=lambda s: None)
    assert result.stopped == "done" and result.iterations == 30
    losses = _losses(tmp_path)
    first = sum(losses[i] for i in (1, 2, 3)) / 3
    last = sum(losses[i] for i in (28, 29, 30)) / 3
    assert first > 10.0  # ~ln(50304) at initialisation
    assert last < first - 1.5, (first, last)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"iteration", "loss", "lr", "grad_norm", "tokens_per_s"} <= set(row)
    assert result.checkpoint == ckpt.checkpoint_dir(tmp_path / "checkpoints", 30)


def test_kill_and_resume_reproduces_the_losses_bitwise(demo_data, tmp_path):
    sets = ("schedule.iterations=10", "checkpoint.interval=3", "checkpoint.keep_last=0")
    cfg, doc = _cfg("tiny_kda", demo_data, *sets)
    full = loop.run(cfg, tmp_path / "full", config_doc=doc, console=lambda s: None)
    killed = loop.run(
        cfg, tmp_path / "resumed", config_doc=doc, stop_after=5, console=lambda s: None
    )
    assert killed.stopped == "limit" and killed.iterations == 5
    resumed = loop.run(cfg, tmp_path / "resumed", config_doc=doc, console=lambda s: None)
    assert resumed.resumed_from == 3 and resumed.iterations == 10
    a, b = _losses(tmp_path / "full"), _losses(tmp_path / "resumed")
    assert list(a) == list(range(1, 11)) == list(b)
    assert a == b  # bitwise: same float for every iteration
    assert full.final_loss == resumed.final_loss


def test_checkpoint_round_trip_and_torn_saves_are_skipped(demo_data, tmp_path):
    cfg, doc = _cfg(
        "tiny_gdn",
        demo_data,
        "schedule.iterations=4",
        "checkpoint.interval=2",
        "checkpoint.keep_last=0",
    )
    loop.run(cfg, tmp_path, config_doc=doc, console=lambda s: None)
    root = tmp_path / "checkpoints"
    assert [i for i, _ in ckpt.valid_checkpoints(root)] == [2, 4]
    # a save that died half-way: a .tmp folder, and a final-looking folder without the marker
    shutil.copytree(root / "iter_0000004", root / "iter_0000006.tmp")
    shutil.copytree(root / "iter_0000004", root / "iter_0000008")
    (root / "iter_0000008" / ckpt.MARKER).unlink()
    assert [i for i, _ in ckpt.valid_checkpoints(root)] == [2, 4]
    # the newest valid one loads back exactly
    from zebractl.model.model import build_model

    model = build_model(cfg.model, seed=99)
    from megatron.core import parallel_state

    md = {
        "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
    }
    loaded = ckpt.load(root / "iter_0000004", {"model": model.sharded_state_dict(metadata=md)})
    model.load_state_dict(loaded["model"], strict=False)
    assert loaded["iteration"] == 4 and loaded["consumed_samples"] == 32
    assert loaded["config"]["config"]["model"]["gdn"]["num_heads"] == 2
    assert "optimizer" in loaded and "scheduler" in loaded and "rng" in loaded
    again = build_model(cfg.model, seed=99)
    again.load_state_dict(
        ckpt.load(root / "iter_0000004", {"model": again.sharded_state_dict(metadata=md)})["model"],
        strict=False,
    )
    for (k, v), w in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, w), k


def test_keep_last_prunes_old_checkpoints_and_tensorboard_logs(demo_data, tmp_path):
    cfg, doc = _cfg(
        "tiny_mamba",
        demo_data,
        "schedule.iterations=6",
        "checkpoint.interval=2",
        "checkpoint.keep_last=1",
        "logging.tensorboard=true",
    )
    loop.run(cfg, tmp_path, config_doc=doc, console=lambda s: None)
    assert [i for i, _ in ckpt.valid_checkpoints(tmp_path / "checkpoints")] == [6]
    pytest.importorskip("tensorboard")
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def _poison_forward(monkeypatch, bad_calls):
    """Make ZebraModel.forward return a NaN loss on the given (1-based) calls."""
    from zebractl.model import model as model_mod

    real = model_mod.ZebraModel.forward
    calls = {"n": 0}

    def poisoned(self, *a, **k):
        calls["n"] += 1
        out = real(self, *a, **k)
        return (out[0] * float("nan"), out[1]) if bad_calls(calls["n"]) else out

    monkeypatch.setattr(model_mod.ZebraModel, "forward", poisoned)


def test_nan_loss_stops_naming_the_iteration(cli, demo_data, tmp_path, monkeypatch):
    _poison_forward(monkeypatch, lambda n: n > 4)  # from iteration 3 on (2 micro-batches per step)
    args = _train_args(demo_data, "schedule.iterations=6")
    r = cli("train", "tiny_kda", *args, "--output", str(tmp_path))
    assert r.exit_code == 1, r.output
    assert "the loss is nan at iteration 3" in r.stderr


def test_nonfinite_skip_drops_the_update_and_counts_it(demo_data, tmp_path, monkeypatch):
    _poison_forward(monkeypatch, lambda n: n in (5, 6))  # iteration 3's two micro-batches
    cfg, doc = _cfg("tiny_kda", demo_data, "schedule.iterations=6", "nonfinite.action=skip")
    msgs: list[str] = []
    res = loop.run(cfg, tmp_path, config_doc=doc, console=msgs.append)
    assert res.stopped == "done" and res.iterations == 6 and res.skipped == 1
    assert "iteration 3: non-finite loss or gradient; update skipped" in msgs
    rows = {
        r["iteration"]: r
        for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
    }
    assert sorted(rows) == [1, 2, 4, 5, 6]  # iteration 3 made no update, so no loss to log
    assert {i: r["skipped"] for i, r in rows.items()} == {1: 0, 2: 0, 4: 1, 5: 0, 6: 0}
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows.values())
    # the skipped step consumed its data but did not move the schedule: the learning rates are a
    # clean run's, one step late from iteration 4 on
    assert rows[6]["consumed_samples"] == 6 * 8
    monkeypatch.undo()
    loop.run(cfg, tmp_path / "clean", config_doc=doc, console=lambda s: None)
    clean = [
        json.loads(x)["lr"] for x in (tmp_path / "clean" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [rows[i]["lr"] for i in (1, 2, 4, 5, 6)] == clean[:5]


def test_nonfinite_skip_stops_past_max_skipped(cli, demo_data, tmp_path, monkeypatch):
    _poison_forward(monkeypatch, lambda n: n > 4)  # every step from iteration 3 on
    sets = ("schedule.iterations=8", "nonfinite.action=skip", "nonfinite.max_skipped=2")
    r = cli("train", "tiny_kda", *_train_args(demo_data, *sets), "--output", str(tmp_path))
    assert r.exit_code == 1, r.output
    assert "3 updates skipped for non-finite values by iteration 5" in r.stderr


def test_engine_choices_that_cannot_run_are_usage_errors(cli, demo_data, tmp_path):
    base = ["--set", f"data.paths=[{{path: {demo_data}}}]", "--output", str(tmp_path)]
    cases = {
        "optimizer.impl=megatron": "runs on CUDA only",
        "precision=fp16": "fp16 needs loss scaling",
        "parallelism.distributed_optimizer=true": "needs optimizer.impl 'megatron'",
    }
    for setting, message in cases.items():
        if setting.startswith("optimizer.impl") and torch.cuda.is_available():
            continue
        r = cli("train", "tiny_kda", *base, "--set", setting)
        assert r.exit_code == 2, (setting, r.output)
        assert message in r.stderr, (setting, r.stderr)


def test_resume_refuses_a_checkpoint_of_the_other_optimizer_impl(demo_data, tmp_path):
    cfg, doc = _cfg("tiny_kda", demo_data, "schedule.iterations=2")
    loop.run(cfg, tmp_path, config_doc=doc, console=lambda s: None)
    folder = ckpt.valid_checkpoints(tmp_path / "checkpoints")[-1][1]
    marker = json.loads((folder / ckpt.MARKER).read_text())
    assert marker["optimizer_impl"] == "torch_fused"
    marker["optimizer_impl"] = "megatron"
    (folder / ckpt.MARKER).write_text(json.dumps(marker))
    cfg4, _ = _cfg("tiny_kda", demo_data, "schedule.iterations=2")
    with pytest.raises(ConfigError, match="optimizer state of optimizer.impl 'megatron'"):
        loop.run(cfg4, tmp_path, config_doc=doc, console=lambda s: None)


def test_ctrl_c_saves_and_exits_130(cli, demo_data, tmp_path, monkeypatch):
    real = loop._Batches.step

    def interrupt_at_third(self, consumed):
        if consumed >= 16:
            raise KeyboardInterrupt
        return real(self, consumed)

    monkeypatch.setattr(loop._Batches, "step", interrupt_at_third)
    args = _train_args(demo_data, "schedule.iterations=6")
    r = cli("train", "tiny_kda", *args, "--output", str(tmp_path))
    assert r.exit_code == 130, r.output
    assert [i for i, _ in ckpt.valid_checkpoints(tmp_path / "checkpoints")] == [2]
    assert (tmp_path / "config.resolved.json").is_file()


def test_init_from_takes_weights_not_optimizer(demo_data, tmp_path):
    cfg, doc = _cfg("tiny_kda", demo_data, "schedule.iterations=3")
    loop.run(cfg, tmp_path / "a", config_doc=doc, console=lambda s: None)
    msgs: list[str] = []
    res = loop.run(
        cfg,
        tmp_path / "b",
        config_doc=doc,
        init_from=tmp_path / "a" / "checkpoints",
        console=msgs.append,
    )
    assert res.resumed_from is None and res.iterations == 3
    assert any("initialised weights from" in m for m in msgs)
    # starts from a's trained weights (fresh init gives ~10.83) with a fresh schedule
    assert _losses(tmp_path / "b")[1] < _losses(tmp_path / "a")[1] - 0.2

    def lrs(out):
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        return [r["lr"] for r in rows]

    assert lrs(tmp_path / "b") == lrs(tmp_path / "a")


def test_a_recipe_planned_for_more_gpus_runs_on_one_process(cli, demo_data, tmp_path):
    recipe = tmp_path / "eight.yaml"
    recipe.write_text("extends: tiny_kda\nparallelism:\n  num_gpus: 8\n", encoding="utf-8")
    args = _train_args(demo_data, "schedule.iterations=3")
    # 8 planned GPUs x micro 4 exceed the global batch of 8; one process accumulates 2 micro-batches
    r = cli("train", str(recipe), *args, "--output", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    assert len(_losses(tmp_path / "run")) == 3
    # an explicit GPU count is kept, and checked
    r = cli(
        "train", str(recipe), *args, "--set", "parallelism.num_gpus=8", "--output", str(tmp_path)
    )
    assert r.exit_code == 2 and "not a multiple of micro batch 4" in r.stderr, r.output


def test_missing_data_is_a_usage_error(cli, tmp_path):
    r = cli(
        "train",
        "tiny_kda",
        "--set",
        f"data.paths=[{{path: {tmp_path / 'none'}}}]",
        "--output",
        str(tmp_path / "run"),
    )
    assert r.exit_code == 2 and "zebractl prepare --demo" in r.stderr


def test_running_out_of_data_says_so():
    batches = loop._Batches(list(range(10)), micro=4, global_=8, rank=0, world=1)
    with pytest.raises(loop.TrainingError, match="out of data: the step after 8 samples needs 8"):
        next(batches.step(8))

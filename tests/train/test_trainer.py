"""`zebractl train` on CPU: the tiny recipes learn and validate, resume is bitwise, checkpoints are
atomic and verified, non-finite values stop or skip, and bad settings are usage errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.errors import ConfigError  # noqa: E402
from zebractl.run import checkpoint as ckpt  # noqa: E402
from zebractl.train import trainer as trainer_mod  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["tiny_kda", "tiny_gdn", "tiny_mamba", "tiny_hybrid"])
def test_tiny_recipes_learn_and_validate_on_real_text(recipe, shipped_run, fast):
    # the golden test's run (conftest's shipped_run: the recipe as shipped, stopped after 20 of
    # its 60 iterations), its own held-out 2% (data.split 98/2/0) evaluated every 10 iterations
    out = shipped_run(recipe)
    result = shipped_run.results[out]
    assert result.stopped == "limit" and result.iterations == 20
    losses = fast.losses(out)
    first = sum(losses[i] for i in (1, 2, 3)) / 3
    last = sum(losses[i] for i in (18, 19, 20)) / 3
    assert first > 10.0  # ~ln(50304) at initialisation
    assert last < first - 1.5, (first, last)
    assert {"iteration", "loss", "lr", "grad_norm", "tokens_per_s", "wall_time", "run_id"} <= set(
        fast.rows(out)[-1]
    )
    val = fast.rows(out, "val")
    assert [r["iteration"] for r in val] == [10, 20]
    assert all(r["tokens"] == 2 * 16 * 128 for r in val)  # 2 batches of the recipe's 16 x 128
    assert val[0]["val_loss"] > val[-1]["val_loss"] + 0.5, val
    assert val[-1]["val_ppl"] == pytest.approx(torch.tensor(val[-1]["val_loss"]).exp().item())
    assert result.val_loss == val[-1]["val_loss"]
    assert result.checkpoint == ckpt.checkpoint_dir(out / "checkpoints", 20)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_kill_and_resume_reproduces_the_losses_bitwise(fast, tmp_path, workers):
    sets = (
        "schedule.iterations=8",
        "checkpoint.interval=3",
        "checkpoint.keep_last=0",
        f"data.num_workers={workers}",
    )
    full = fast.train("tiny_kda", tmp_path / "full", *sets)
    killed = fast.train("tiny_kda", tmp_path / "resumed", *sets, stop_after=5)
    assert killed.stopped == "limit" and killed.iterations == 5
    resumed = fast.train("tiny_kda", tmp_path / "resumed", *sets)
    assert resumed.resumed_from == 3 and resumed.iterations == 8
    a, b = fast.losses(tmp_path / "full"), fast.losses(tmp_path / "resumed")
    assert list(a) == list(range(1, 9)) == list(b)
    assert a == b  # bitwise: the same float for every iteration
    assert full.final_loss == resumed.final_loss


@pytest.mark.slow
def test_workers_do_not_change_the_data(fast, tmp_path):
    sets = ("schedule.iterations=3",)
    fast.train("tiny_gdn", tmp_path / "w0", *sets, "data.num_workers=0")
    fast.train("tiny_gdn", tmp_path / "w2", *sets, "data.num_workers=2")
    assert fast.losses(tmp_path / "w0") == fast.losses(tmp_path / "w2")


@pytest.mark.slow
def test_checkpoint_round_trip_and_torn_saves_are_skipped(fast, tmp_path):
    import shutil

    from zebractl.model.model import build_model

    sets = ("schedule.iterations=4", "checkpoint.interval=2", "checkpoint.keep_last=0")
    fast.train("tiny_gdn", tmp_path, *sets)
    root = tmp_path / "checkpoints"
    assert [c.iteration for c in ckpt.complete(root)] == [2, 4]
    # a save that died half-way: a .tmp folder, and a final-looking folder without the marker
    shutil.copytree(root / "iter_0000004", root / "iter_0000006.tmp")
    shutil.copytree(root / "iter_0000004", root / "iter_0000008")
    (root / "iter_0000008" / ckpt.MARKER).unlink()
    assert [c.iteration for c in ckpt.complete(root)] == [2, 4]
    # load_weights takes the newest intact checkpoint of a run directory, weights only
    cfg = fast.resolve("tiny_gdn", *sets).run
    model = build_model(cfg.model, seed=99)
    assert ckpt.load_weights(tmp_path, model).iteration == 4
    again = build_model(cfg.model, seed=98)
    assert ckpt.load_weights(root / "iter_0000004", again).iteration == 4
    for (k, v), w in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, w), k
    marker = ckpt.read_marker(root / "iter_0000004")
    assert marker.iteration == 4 and marker.consumed_samples == 32
    assert {f.path for f in marker.files} >= {"common.pt", "metadata.json"}
    # the optimizer state is sharded tensors, not a pickled blob in the common state
    common = torch.load(root / "iter_0000004" / "common.pt", weights_only=False)
    assert "exp_avg" not in json.dumps(common, default=str)
    assert common["config"]["config"]["model"]["gdn"]["num_heads"] == 2


@pytest.mark.slow
def test_keep_last_prunes_old_checkpoints_and_tensorboard_logs(fast, tmp_path):
    sets = (
        "schedule.iterations=6",
        "checkpoint.interval=2",
        "checkpoint.keep_last=1",
        "logging.tensorboard=true",
    )
    fast.train("tiny_mamba", tmp_path, *sets)
    assert [c.iteration for c in ckpt.complete(tmp_path / "checkpoints")] == [6]
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


def test_nan_loss_stops_naming_the_iteration(cli, fast, tmp_path, monkeypatch):
    _poison_forward(monkeypatch, lambda n: n > 4)  # from iteration 3 on (2 micro-batches per step)
    r = cli("train", "tiny_kda", *fast.args("schedule.iterations=6"), "--output", str(tmp_path))
    assert r.exit_code == 1, r.output
    assert "the loss is nan at iteration 3" in r.stderr


def test_a_non_finite_gradient_norm_with_a_finite_loss_stops_too(cli, fast, tmp_path, monkeypatch):
    from zebractl.train import engine

    real = engine.TorchEngine.step
    monkeypatch.setattr(engine.TorchEngine, "step", lambda self: (real(self), float("inf"))[1])
    r = cli("train", "tiny_kda", *fast.args("schedule.iterations=3"), "--output", str(tmp_path))
    assert r.exit_code == 1, r.output
    assert "the gradient norm is inf at iteration 1" in r.stderr and "Traceback" not in r.output


@pytest.mark.slow
def test_nonfinite_skip_drops_the_update_and_counts_it(fast, tmp_path, monkeypatch):
    _poison_forward(monkeypatch, lambda n: n in (5, 6))  # iteration 3's two micro-batches
    msgs: list[str] = []
    sets = ("schedule.iterations=6", "nonfinite.action=skip")
    res = fast.train("tiny_kda", tmp_path, *sets, console=msgs.append)
    assert res.stopped == "done" and res.iterations == 6 and res.skipped == 1
    assert "iteration 3: non-finite loss or gradient; update skipped" in msgs
    rows = {r["iteration"]: r for r in fast.rows(tmp_path)}
    assert sorted(rows) == [1, 2, 4, 5, 6]  # iteration 3 made no update, so no loss to log
    assert {i: r["skipped"] for i, r in rows.items()} == {1: 0, 2: 0, 4: 1, 5: 0, 6: 0}
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows.values())
    # the skipped step consumed its data but did not move the schedule: the learning rates are a
    # clean run's, one step late from iteration 4 on
    assert rows[6]["consumed_samples"] == 6 * 8
    monkeypatch.undo()
    fast.train("tiny_kda", tmp_path / "clean", *sets)
    clean = [r["lr"] for r in fast.rows(tmp_path / "clean")]
    assert [rows[i]["lr"] for i in (1, 2, 4, 5, 6)] == clean[:5]


def test_nonfinite_skip_stops_past_max_skipped(cli, fast, tmp_path, monkeypatch):
    _poison_forward(monkeypatch, lambda n: n > 4)  # every step from iteration 3 on
    sets = ("schedule.iterations=8", "nonfinite.action=skip", "nonfinite.max_skipped=2")
    r = cli("train", "tiny_kda", *fast.args(*sets), "--output", str(tmp_path))
    assert r.exit_code == 1, r.output
    assert "3 updates skipped for non-finite values by iteration 5" in r.stderr


def test_engine_choices_that_cannot_run_are_usage_errors(cli, fast, tmp_path):
    cases = {
        "optimizer.impl=megatron": "runs on CUDA only",
        "precision=fp16": "fp16 needs loss scaling",
        "parallelism.distributed_optimizer=true": "needs optimizer.impl 'megatron'",
        # FP8 refuses before anything is built: without bf16, and (either engine) without a GPU
        "kernels.fp8_mlp=tensorwise precision=fp32": "fp8_mlp needs precision bf16",
        "kernels.fp8_mlp=rowwise precision=bf16": "FP8 tensor cores",
        "kernels.fp8_mlp=rowwise optimizer.impl=megatron precision=bf16": "FP8 tensor cores",
        "kernels.cuda_graph=true": "kernels.cuda_graph needs a CUDA GPU",
    }
    for setting, message in cases.items():
        gpu_only = "optimizer.impl" in setting or "FP8" in message or "CUDA GPU" in message
        if gpu_only and torch.cuda.is_available():
            continue
        r = cli("train", "tiny_kda", *fast.args(*setting.split()), "--output", str(tmp_path))
        assert r.exit_code == 2, (setting, r.output)
        assert message in r.stderr, (setting, r.stderr)


def test_resume_refuses_a_checkpoint_of_the_other_optimizer_impl(fast, tmp_path):
    fast.train("tiny_kda", tmp_path, "schedule.iterations=2")
    folder = ckpt.complete(tmp_path / "checkpoints")[-1].folder
    marker = json.loads((folder / ckpt.MARKER).read_text())
    assert marker["optimizer_impl"] == "torch_fused"
    marker["optimizer_impl"] = "megatron"
    (folder / ckpt.MARKER).write_text(json.dumps(marker))
    with pytest.raises(ConfigError, match="optimizer state of optimizer.impl 'megatron'"):
        fast.train("tiny_kda", tmp_path, "schedule.iterations=3")


@pytest.mark.slow
def test_init_from_takes_weights_not_optimizer(fast, tmp_path):
    sets = ("schedule.iterations=3",)
    fast.train("tiny_kda", tmp_path / "a", *sets)
    msgs: list[str] = []
    res = fast.train(
        "tiny_kda", tmp_path / "b", *sets, init_from=tmp_path / "a", console=msgs.append
    )
    assert res.resumed_from is None and res.iterations == 3
    assert any("initialised weights from" in m for m in msgs)
    # starts from a's trained weights (fresh init gives ~10.83) with a fresh schedule
    assert fast.losses(tmp_path / "b")[1] < fast.losses(tmp_path / "a")[1] - 0.2
    lrs = [[r["lr"] for r in fast.rows(tmp_path / x)] for x in "ab"]
    assert lrs[0] == lrs[1]


@pytest.mark.slow
def test_init_json_names_the_checkpoint_loaded_and_outlives_a_resume(fast, tmp_path):
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    fast.train("tiny_kda", a, "schedule.iterations=3")
    fast.train("tiny_kda", b, "schedule.iterations=2", init_from=a)
    first = json.loads((b / "init.json").read_text())
    assert first["init_from"] == str(a) and first["given_by"] == "--init-from"
    assert first["kind"] == "checkpoint" and first["iteration"] == 3
    assert first["checkpoint"] == str((a / "checkpoints" / "iter_0000003").resolve())
    assert first["run"] == str(a.resolve()) and first["path"] == str(a.resolve())
    # a resume starts from b's own checkpoint: the record of where its weights began stays
    res = fast.train("tiny_kda", b, "schedule.iterations=4", init_from=a)
    assert res.resumed_from == 2
    assert json.loads((b / "init.json").read_text()) == first
    # a fresh start (on purpose: the run's records say it trained) is not from a any more
    shutil.rmtree(b / "checkpoints")
    fast.train("tiny_kda", b, "schedule.iterations=2", "checkpoint.resume=never")
    assert not (b / "init.json").exists()


def test_a_recipe_planned_for_more_gpus_runs_on_one_process(cli, fast, tmp_path):
    recipe = tmp_path / "eight.yaml"
    recipe.write_text("extends: tiny_kda\nparallelism:\n  num_gpus: 8\n", encoding="utf-8")
    args = fast.args("schedule.iterations=3")
    # 8 planned GPUs x micro 4 exceed the global batch of 8; one process accumulates 2 micro-batches
    r = cli("train", str(recipe), *args, "--output", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    assert len(fast.losses(tmp_path / "run")) == 3
    # an explicit GPU count is kept, and checked
    r = cli(
        "train", str(recipe), *args, "--set", "parallelism.num_gpus=8", "--output", str(tmp_path)
    )
    assert r.exit_code == 2 and "not a multiple of micro batch 4" in r.stderr, r.output


def test_missing_data_is_a_usage_error(cli, tmp_path):
    none = tmp_path / "none"
    r = cli("train", "tiny_kda", "--set", f"data.paths=[{{path: {none}}}]", "-o", str(tmp_path))
    assert r.exit_code == 2 and "zebractl prepare --demo" in r.stderr


def test_running_out_of_data_says_so(fast, tmp_path, monkeypatch):
    from zebractl.train import data

    real = data.build_datasets

    def short(*a, **k):
        train, valid = real(*a, **k)
        return list(train)[:12], valid  # room for one global batch of 8, not two

    monkeypatch.setattr(data, "build_datasets", short)
    with pytest.raises(trainer_mod.TrainingError, match="out of data: the step after 8 samples"):
        fast.train("tiny_kda", tmp_path, "schedule.iterations=3")


@pytest.mark.slow
def test_the_config_record_and_a_changed_config_on_resume(fast, tmp_path):
    from zebractl.run import RunDir

    fast.train("tiny_kda", tmp_path, "schedule.iterations=2")
    record = RunDir(tmp_path).read_config()
    assert record.name == "tiny_kda" and record.config["schedule"]["iterations"] == 2
    assert record.provenance["schedule.iterations"] == "--set"
    msgs: list[str] = []
    fast.train("tiny_kda", tmp_path, "schedule.iterations=3", console=msgs.append)
    assert any("config differs" in m and "schedule.iterations" in m for m in msgs), msgs
    assert RunDir(tmp_path).read_config().config["schedule"]["iterations"] == 3


def test_train_json_is_one_typed_document(cli, fast, tmp_path, monkeypatch):
    import jsonschema

    from zebractl.schemas.reports import TrainReport
    from zebractl.train import trainer

    real = trainer.Trainer.setup

    def noisy_setup(self):  # third-party code printing on stdout (TileLang logs its compiles)
        print("a library printing on stdout")
        real(self)

    monkeypatch.setattr(trainer.Trainer, "setup", noisy_setup)
    r = cli("train", "tiny_kda", *fast.args("schedule.iterations=2"), "-o", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    report = TrainReport.model_validate_json(r.stdout)
    assert report.launched == "train" and report.stopped == "done" and report.iterations == 2
    assert report.checkpoint == str(tmp_path / "checkpoints" / "iter_0000002")
    assert "iter 2/2 (100%) | loss" in r.stderr  # progress goes to stderr
    # the run's account: wall time (setup included) and mean throughput; tokens = samples x seq
    assert report.total_iterations == 2 and report.tokens == 2 * 8 * 64
    assert report.wall_seconds > 0 and report.mean_tokens_per_s > 0
    assert "a library printing on stdout" in r.stderr
    schema = json.loads((REPO / "schemas" / "reports" / TrainReport.schema_file()).read_text())
    jsonschema.validate(json.loads(r.stdout), schema)


def test_the_log_shows_progress_and_the_header_the_resolved_run(cli, fast, tmp_path):
    # tiny_kda's description says 60 iterations: the header must say what --set made of it
    r = cli("train", "tiny_kda", *fast.args("schedule.iterations=3"), "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert "run: 3 iterations (schedule.iterations from --set) of 8 x 64 tokens = 1.54k tokens" in (
        lines
    ), lines
    logged = [line for line in lines if line.startswith("iter ")]
    assert [line.split(" | ")[0] for line in logged] == [
        "iter 1/3 (33%)",
        "iter 2/3 (66%)",
        "iter 3/3 (100%)",
    ], logged
    fields = [line.split(" | ") for line in logged]
    assert [f[-3] for f in fields] == ["512 tokens", "1.02k tokens", "1.54k tokens"]
    hms = r"\d+:\d\d:\d\d"
    for f in fields:
        assert re.fullmatch(r"step \d+\.\d+ s", f[-4]) and re.fullmatch(f"elapsed {hms}", f[-2]), f
    assert fields[0][-1] == "ETA n/a"  # the first step compiles: no estimate from it
    assert re.fullmatch(f"ETA {hms}", fields[1][-1]), fields[1]
    assert fields[-1][-1] == "ETA 0:00:00"
    done = next(line for line in lines if line.startswith("done: "))
    assert re.match(
        rf"done: 3/3 iterations, final loss \d+\.\d{{4}}; 1\.54k tokens, {hms} wall, "
        r"[\d,]+ tok/s mean; checkpoint ",
        done,
    ), done


@pytest.mark.slow
def test_a_resumed_run_counts_from_its_iteration(fast, tmp_path):
    sets = ("schedule.iterations=4", "checkpoint.interval=2")
    fast.train("tiny_kda", tmp_path, *sets, stop_after=2)

    class Bar(trainer_mod.NoBar):
        calls: list[tuple] = []

        def start(self, iteration, total):
            self.calls.append(("start", iteration, total))

        def advance(self, iteration, info=None):
            self.calls.append(("advance", iteration, info.rsplit(" | ", 1)[-1]))

        def stop(self):
            self.calls.append(("stop",))

    msgs: list[str] = []
    res = fast.train("tiny_kda", tmp_path, *sets, console=msgs.append, bar=Bar())
    assert res.resumed_from == 2 and res.iterations == res.total == 4
    assert res.tokens == 4 * 8 * 64 and res.wall_s > 0 and res.tokens_per_s > 0
    assert any("(iteration 2 of 4, 16 samples consumed)" in m for m in msgs), msgs
    logged = [m.split(" | ") for m in msgs if m.startswith("iter ")]
    assert [f[0] for f in logged] == ["iter 3/4 (75%)", "iter 4/4 (100%)"], msgs
    assert logged[0][-3:] == ["1.54k tokens", logged[0][-2], "ETA n/a"]  # this process's first
    assert logged[1][-3] == "2.05k tokens" and logged[1][-1] == "ETA 0:00:00"
    assert Bar.calls[0] == ("start", 2, 4) and Bar.calls[-1] == ("stop",)
    assert Bar.calls[1:3] == [("advance", 3, "ETA n/a"), ("advance", 4, "ETA 0:00:00")]

"""W&B tracking (`logging.wandb`, zebractl.run.tracking), offline: what wandb wrote under RUN/wandb/
is read back from its run-ID.wandb files (records of wandb's protobuf ``Record``, in LevelDB's log
layout), so nothing here needs a network or a login."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

wandb = pytest.importorskip("wandb")

from zebractl.errors import ConfigError  # noqa: E402
from zebractl.run import ResolvedConfigRecord, RunDir, TrainRow, ValRow  # noqa: E402
from zebractl.run.metrics import MetricsWriter  # noqa: E402
from zebractl.run.tracking import attach_eval, open_tracker  # noqa: E402
from zebractl.schemas.recipe import WandbConfig  # noqa: E402

_BLOCK = 32768  # LevelDB log blocks: records never straddle a 7-byte header across two


def _records(path: Path) -> list[Any]:
    """Every record of a run-ID.wandb file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, part, out = 7, b"", []
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # the block's tail is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        part += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE.../LAST
            rec = pb.Record()
            rec.ParseFromString(part)
            out.append(rec)
            part = b""
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def offline_runs(root: Path) -> list[dict[str, Any]]:
    """What each offline W&B session under ROOT/wandb/ wrote, oldest first: its run id, project,
    name, tags, config, history rows (``_step`` = the step), summary, files and exit code.

    ``run.finish()`` returns before wandb's service has written everything (the exit record came
    later in 7 of 15 tries): its teardown waits for that, as a process's exit does."""
    wandb.teardown()
    out = []
    for folder in sorted((root / "wandb").glob("offline-run-*")):
        (path,) = folder.glob("run-*.wandb")
        doc: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "exit_code": None}
        for rec in _records(path):
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                r = rec.run
                doc |= {"id": r.run_id, "project": r.project, "name": r.display_name}
                doc |= {"tags": list(r.tags)}
                doc["config"] |= {u.key: json.loads(u.value_json) for u in r.config.update}
            elif kind == "history":
                row = {_key(i): json.loads(i.value_json) for i in rec.history.item}
                doc["history"].append(row)
            elif kind == "summary":
                doc["summary"] |= {_key(u): json.loads(u.value_json) for u in rec.summary.update}
            elif kind == "exit":
                doc["exit_code"] = rec.exit.exit_code
        doc["files"] = sorted(
            str(p.relative_to(folder / "files")) for p in (folder / "files").rglob("*")
        )
        out.append(doc)
    return out


def _scalars(doc: dict[str, Any], key: str) -> dict[int, float]:
    return {row["_step"]: row[key] for row in doc["history"] if key in row}


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """wandb kept offline and inside tmp_path; its service process is gone afterwards."""
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # wandb.setup sets it: restored unset
    yield
    wandb.teardown()
    import psutil

    left = [p.name() for p in psutil.Process().children(recursive=True)]
    assert not any("wandb" in name for name in left), left


def _record() -> ResolvedConfigRecord:
    return ResolvedConfigRecord(
        name="tiny",
        recipe="recipes/tiny.yaml",
        config={"schedule": {"lr": 0.001, "iterations": 3}, "seed": 7},
        provenance={"schedule.lr": "recipes/tiny.yaml:3", "schedule.iterations": "--set",
                    "seed": "default"},
        zebractl_version="0.0.0",
        created="2026-12-04T00:00:00Z",
    )  # fmt: skip


def _row(it: int, loss: float) -> TrainRow:
    return TrainRow(iteration=it, loss=loss, lr=1e-3, grad_norm=0.5, tokens_per_s=100.0,
                    consumed_samples=8 * it, wall_time=0.0, run_id="s")  # fmt: skip


def test_a_tracked_run_logs_its_config_and_rows_and_a_resume_continues_it(tmp_path):
    run = RunDir(tmp_path / "my-run")
    run.create()
    cfg = WandbConfig(project="test", mode="offline", tags=["cpu"])
    notes: list[str] = []
    writer = MetricsWriter(run, resumed_at=0, jsonl=True, tensorboard=False, note=notes.append,
                           tracker=open_tracker(run, _record(), cfg, notes.append))  # fmt: skip
    for it, loss in ((1, 10.0), (2, 9.0)):
        writer.write(_row(it, loss))
    writer.write(ValRow(iteration=2, val_loss=9.5, val_ppl=13359.7, tokens=64, wall_time=0.0,
                        run_id="s"))  # fmt: skip
    writer.close()
    known = run.read_tracker()
    assert known is not None and known.mode == "offline" and known.url is None
    assert "offline run" in notes[0] and "wandb sync" in notes[0]
    (first,) = offline_runs(run.root)
    assert first["id"] == known.id and first["project"] == "test"
    assert first["name"] == "my-run" and first["tags"] == ["cpu"]  # the directory's name
    assert first["config"]["schedule"] == {"lr": 0.001, "iterations": 3}
    z = first["config"]["zebractl"]
    assert z["recipe"] == "recipes/tiny.yaml" and z["name"] == "tiny"
    assert z["provenance"] == {
        "schedule": {"lr": "recipes/tiny.yaml:3", "iterations": "--set"},
        "seed": "default",
    }
    assert _scalars(first, "train/loss") == {1: 10.0, 2: 9.0}
    assert _scalars(first, "train/grad_norm") == {1: 0.5, 2: 0.5}
    assert _scalars(first, "val/loss") == {2: 9.5}  # TensorBoard's names
    assert first["exit_code"] == 0

    # a resume: the same W&B run (the id from RUN/wandb.json), its end marked failed on an error
    tracker = open_tracker(run, _record(), cfg, notes.append)
    writer = MetricsWriter(run, resumed_at=2, jsonl=True, tensorboard=False, note=notes.append,
                           tracker=tracker)  # fmt: skip
    writer.write(_row(3, 8.0))
    writer.close(failed=True)
    assert "continuing offline run" in notes[-1]
    assert run.read_tracker() == known
    second = offline_runs(run.root)[1]
    assert second["id"] == known.id and _scalars(second, "train/loss") == {3: 8.0}
    assert second["exit_code"] == 1


def test_disabled_or_unset_tracks_nothing_and_a_damaged_record_is_named(tmp_path):
    run = RunDir(tmp_path)
    disabled = WandbConfig(project="test", mode="disabled")
    assert open_tracker(run, _record(), None, print) is None
    assert open_tracker(run, _record(), disabled, print) is None
    assert not run.tracker_path.exists() and not run.wandb_dir.exists()
    run.tracker_path.write_text('{"id": "x"}')
    with pytest.raises(ConfigError, match=r"wandb.json: not a valid W&B run record"):
        open_tracker(run, _record(), WandbConfig(project="test", mode="offline"), print)


def test_the_schema_is_strict(cli):
    recipe = str(Path(__file__).parents[2] / "recipes/tiny_kda.yaml")
    for bad, says in (
        ("logging.wandb.mode=off", "expected one of 'online', 'offline' or 'disabled'"),
        ("logging.wandb.projekt=x", "unknown key 'projekt'"),
        ("logging.wandb.tags=[a, '']", "logging.wandb.tags"),
    ):
        r = cli("train", recipe, "--check", "--set", "logging.wandb.project=x", "--set", bad)
        assert r.exit_code == 2 and says in r.stderr, (bad, r.output)
    r = cli("train", recipe, "--check", "--set", "logging.wandb.mode=offline")
    assert r.exit_code == 2 and "logging.wandb.project: required key is missing" in r.stderr


def test_a_tracked_recipe_without_wandb_installed_is_exit_2_naming_the_extra(cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
    )
    recipe = str(Path(__file__).parents[2] / "recipes/tiny_kda.yaml")
    for extra in ([], ["--check"]):
        r = cli("train", recipe, *extra, "--set", "logging.wandb.project=x")
        assert r.exit_code == 2, r.output
        assert "logging.wandb needs wandb, which is not installed" in r.stderr
        assert "pip install 'zebractl[wandb]'" in r.stderr
    # mode disabled needs no wandb: --check goes on to its checks
    r = cli("train", recipe, "--check", "--set", "logging.wandb={project: x, mode: disabled}")
    assert "not installed" not in r.stderr and "resolved and validated" in r.stdout, r.output


def _eval_report(run: Path) -> Any:
    from zebractl.schemas.reports import EvalMetric, EvalReport, EvalTaskResult

    task = EvalTaskResult(
        task="arc_easy", lm_eval_task="zebractl_arc_easy", status="ok", split="test",
        primary=["acc"], metrics={"acc": EvalMetric(value=0.4, stderr=0.01)}, samples=10,
    )  # fmt: skip
    skipped = EvalTaskResult(task="race", lm_eval_task="zebractl_race", status="skipped",
                             reason="offline", split="test", primary=["acc"])  # fmt: skip
    results = run / "eval/results.json"
    report = EvalReport(
        model=str(run), source="run", model_class="ZebraForCausalLM", iteration=4,
        fingerprint="0" * 64, lm_eval_version="0.4.13", data_package="x", device="cpu",
        dtype="fp32", batch_size="16", max_length=64, limit=10, wall_seconds=1.0,
        lm_eval_seconds=1.0, results_file=str(results), tasks=[task, skipped],
    )  # fmt: skip
    results.parent.mkdir(exist_ok=True)
    results.write_text(report.model_dump_json())
    return report


@pytest.mark.slow
def test_train_resume_eval_and_compare_end_in_one_w_and_b_run(cli, fast, tmp_path):
    """A tiny tracked run, killed and resumed, then eval and compare results attached to it."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("matplotlib")
    from zebractl.runtime.dist import scoped

    a, b = tmp_path / "a", tmp_path / "b"
    sets = ("schedule.iterations=4", "checkpoint.interval=2", "schedule.warmup_iterations=1",
            "logging.wandb.project=test", "logging.wandb.mode=offline")  # fmt: skip
    notes: list[str] = []
    with scoped():
        killed = fast.train("tiny_kda", a, *sets, stop_after=3, console=notes.append)
        assert killed.stopped == "limit"
        resumed = fast.train("tiny_kda", a, *sets, console=notes.append)
    assert resumed.resumed_from == 2 and resumed.iterations == 4
    known = RunDir(a).read_tracker()
    assert known is not None and sum("wandb: " in n for n in notes) == 2, notes
    first, second = offline_runs(a)
    assert first["id"] == second["id"] == known.id and first["name"] == "a"
    assert first["config"]["logging"]["wandb"]["mode"] == "offline"
    assert first["config"]["zebractl"]["provenance"]["logging"]["wandb"]["project"] == "--set"
    assert first["config"]["data"]["seq_length"] == 64
    logged = _scalars(first, "train/loss") | _scalars(second, "train/loss")
    assert _scalars(second, "train/loss").keys() == {3, 4}  # from the checkpoint of 2 on
    assert logged == fast.losses(a)  # metrics.jsonl, as the resume rewrote it
    assert first["exit_code"] == second["exit_code"] == 0

    attach_eval(_eval_report(a), a, notes.append)
    assert "eval results attached" in notes[-1]
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("wandb*"))
    r = cli("compare", str(a), str(b), "--json")
    assert r.exit_code == 0, r.output
    _, _, ev, cmp = offline_runs(a)
    assert ev["id"] == cmp["id"] == known.id
    assert ev["summary"]["eval/arc_easy/acc"] == 0.4
    assert (
        ev["summary"]["eval/arc_easy/acc_stderr"] == 0.01 and ev["summary"]["eval/iteration"] == 4
    )
    assert "eval/results.json" in ev["files"]
    assert (
        cmp["summary"]["compare/b/passed"] is True and cmp["summary"]["compare/b/kind"] == "parity"
    )
    assert cmp["summary"]["compare/b/iteration1_delta"] == 0.0
    assert cmp["summary"]["compare/b/check/iteration1_abs_ok"] is True
    assert {"reports/compare-b/compare.md", "reports/compare-b/compare.json"} <= set(cmp["files"])
    assert not (b / "wandb").exists()  # B is only read


def test_an_untracked_run_is_left_alone_and_a_missing_wandb_is_a_note(tmp_path, monkeypatch):
    import sys

    run = tmp_path / "run"
    (run / RunDir.CONFIG).parent.mkdir()
    (run / RunDir.CONFIG).write_text("{}")
    notes: list[str] = []
    attach_eval(_eval_report(run), run, notes.append)
    assert notes == [] and not (run / "wandb").exists()
    tracker = open_tracker(RunDir(run), _record(), WandbConfig(project="t", mode="offline"), print)
    assert tracker is not None
    tracker.finish()
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    attach_eval(_eval_report(run), run, notes.append)
    (note,) = notes
    assert note.startswith(f"note: {run} is tracked by W&B run ") and "zebractl[wandb]" in note


def test_the_readme_example_is_a_valid_tracker_config():
    import yaml

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Experiment tracking", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = WandbConfig.model_validate(yaml.safe_load(block)["logging"]["wandb"])
    assert cfg.project == "zebra-kda" and cfg.mode == "offline"


def test_a_run_that_fails_is_marked_failed(cli, fast, tmp_path, monkeypatch):
    pytest.importorskip("megatron.core")
    from zebractl.train import engine

    real = engine.TorchEngine.step
    monkeypatch.setattr(engine.TorchEngine, "step", lambda self: (real(self), float("inf"))[1])
    sets = fast.args("schedule.iterations=2", "logging.wandb={project: test, mode: offline}")
    r = cli("train", "tiny_kda", *sets, "--output", str(tmp_path / "run"))
    assert r.exit_code == 1 and "the gradient norm is inf" in r.stderr, r.output
    assert "wandb: logging to offline run" in r.stdout
    (doc,) = offline_runs(tmp_path / "run")
    assert doc["exit_code"] == 1 and doc["history"] == []

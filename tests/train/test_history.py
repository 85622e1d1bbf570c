"""A run's history is never overwritten (issue 42, items 1 and 3).

A run whose records (metrics rows, resumes in the config history) say it trained but whose
checkpoints are gone is refused (exit 2) instead of retraining from iteration 1 over its metrics;
every way of losing them is tried (each checkpoint folder, the whole folder, emptied, renamed). A
deliberate fresh start (`checkpoint.resume=never`) keeps the earlier rows in metrics.jsonl; readers
take the newest lineage. A rerun of a finished run appends nothing.
"""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _remove_all(ckpts):
    shutil.rmtree(ckpts)


def _empty_folder(ckpts):
    for p in ckpts.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def _rename_all(ckpts):
    for p in sorted(ckpts.iterdir()):
        p.rename(p.with_name("old-" + p.name))


LOSSES = {"whole folder": _remove_all, "every checkpoint": _empty_folder, "renamed": _rename_all}


@pytest.mark.parametrize("lose", sorted(LOSSES))
def test_a_progressed_run_without_its_checkpoints_is_refused(
    cli, fast, trained, tmp_path, lose, trained_sets
):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = (run / "metrics.jsonl").read_bytes()
    history = (run / "config.history.jsonl").read_bytes()
    LOSSES[lose](run / "checkpoints")
    r = cli("train", "tiny_kda", *fast.args(*trained_sets), "--output", str(run))
    assert r.exit_code == 2, r.output
    assert "trained to iteration 4" in r.stderr and "checkpoint.resume=never" in r.stderr
    assert str(run / "checkpoints") in r.stderr
    assert (run / "metrics.jsonl").read_bytes() == before
    assert (run / "config.history.jsonl").read_bytes() == history


def test_the_history_alone_says_the_run_progressed(cli, fast, trained, tmp_path, trained_sets):
    """metrics.jsonl gone too: a resume recorded in config.history.jsonl still counts."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    (run / "metrics.jsonl").unlink()
    lines = (run / "config.history.jsonl").read_text().splitlines()
    entry = json.loads(lines[-1]) | {"event": "resume", "iteration": 2, "run_id": "x"}
    (run / "config.history.jsonl").write_text("\n".join([*lines, json.dumps(entry)]) + "\n")
    shutil.rmtree(run / "checkpoints")
    r = cli("train", "tiny_kda", *fast.args(*trained_sets), "--output", str(run))
    assert r.exit_code == 2, r.output
    assert "config.history.jsonl says so" in r.stderr


def test_a_deliberate_fresh_start_keeps_the_old_rows(cli, fast, trained, tmp_path, trained_sets):
    from zebractl.run import RunDir
    from zebractl.run.metrics import MetricsReader

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    old = _lines(run / "metrics.jsonl")
    shutil.rmtree(run / "checkpoints")
    args = (*fast.args(*trained_sets, "schedule.iterations=2"), "--output", str(run))
    r = cli("train", "tiny_kda", *args, "--set", "checkpoint.resume=never")
    assert r.exit_code == 0, r.output
    rows = _lines(run / "metrics.jsonl")
    assert rows[: len(old)] == old and len(rows) > len(old)
    new_ids = {x["run_id"] for x in rows[len(old) :]}
    assert len(new_ids) == 1 and new_ids.isdisjoint({x["run_id"] for x in old})
    # readers take the new lineage only: iterations 1..2 once each
    train = MetricsReader.of(RunDir(run)).train()
    assert [t.iteration for t in train] == [1, 2] and {t.run_id for t in train} == new_ids
    # resumed later, the new lineage's replayed rows are dropped, never the old lineage's
    r = cli("train", "tiny_kda", *fast.args(*trained_sets), "--output", str(run))
    assert r.exit_code == 0, r.output
    rows = _lines(run / "metrics.jsonl")
    assert rows[: len(old)] == old
    assert [t.iteration for t in MetricsReader.of(RunDir(run)).train()] == [1, 2, 3, 4]


def test_without_checkpoints_by_design_a_rerun_starts_over_and_keeps_the_rows(cli, fast, tmp_path):
    args = (
        *fast.args("schedule.iterations=2", "checkpoint.enabled=false"),
        "--output",
        str(tmp_path),
    )
    assert cli("train", "tiny_kda", *args).exit_code == 0
    first = _lines(tmp_path / "metrics.jsonl")
    r = cli("train", "tiny_kda", *args)
    assert r.exit_code == 0, r.output
    rows = _lines(tmp_path / "metrics.jsonl")
    assert rows[: len(first)] == first and len(rows) == 2 * len(first)


def test_rerunning_a_finished_run_appends_nothing(cli, fast, trained, tmp_path, trained_sets):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    files = ("metrics.jsonl", "config.history.jsonl")
    before = {f: (run / f).read_bytes() for f in files}
    val = [x for x in _lines(run / "metrics.jsonl") if x["kind"] == "val"][-1]
    for _ in range(2):
        r = cli("train", "tiny_kda", *fast.args(*trained_sets), "--output", str(run), "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["val_loss"] == val["val_loss"]
    assert {f: (run / f).read_bytes() for f in files} == before


def test_init_from_names_the_damaged_checkpoints_it_skips(fast, trained, tmp_path):
    """Issue 42, item 2: --init-from a run whose newest checkpoint is damaged says so and which
    checkpoint it took the weights from (it took the older one silently)."""
    a = tmp_path / "a"
    shutil.copytree(trained, a)
    newest = a / "checkpoints" / "iter_0000004"
    shard = max((p for p in newest.rglob("*") if p.is_file() and p.name != "zebractl.json"),
                key=lambda p: p.stat().st_size)  # fmt: skip
    shard.write_bytes(shard.read_bytes()[:100])
    msgs: list[str] = []
    fast.train(
        "tiny_kda", tmp_path / "b", "schedule.iterations=2", init_from=a, console=msgs.append
    )
    skipped = [m for m in msgs if "skipped damaged checkpoint" in m]
    assert len(skipped) == 1 and str(newest) in skipped[0], msgs
    assert any("initialised weights from" in m and "iter_0000002" in m for m in msgs), msgs

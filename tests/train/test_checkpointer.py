"""The Checkpointer's policy with a fake saver: when a save is due, that the state is built only
then, that an asynchronous save waits for the one before it, and what it reports as saved. The
real writers are tested in tests/run (sync and async) and through the Trainer (tests/train)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zebractl.config.resolve import resolve_recipe
from zebractl.run import checkpoint as ckpt
from zebractl.run.records import CheckpointMarker
from zebractl.run.rundir import RunDir

pytest.importorskip("torch")

from zebractl.train.checkpointer import Checkpointer  # noqa: E402


class FakeSaver:
    """An AsyncSaver's interface: ``begin`` returns the folder at once, ``wait`` completes it."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self.calls: list[tuple] = []

    def begin(self, root: Path, iteration: int, state: dict, marker: CheckpointMarker, **kw):
        assert self.pending is None, "a save began while another was in flight"
        self.calls.append(("begin", iteration, state, kw))
        self.pending = iteration
        return ckpt.checkpoint_dir(root, iteration)

    def poll(self):
        self.calls.append(("poll", self.pending))

    def wait(self):
        self.calls.append(("wait", self.pending))
        self.pending = None

    def abort(self):
        self.calls.append(("abort", self.pending))
        self.pending = None


def _checkpointer(tmp_path, *sets: str) -> tuple[Checkpointer, list[str]]:
    cfg = resolve_recipe("tiny_kda", ["checkpoint.interval=5", *sets]).run
    said: list[str] = []
    return Checkpointer(cfg, RunDir(tmp_path / "run"), 0, 1, said.append, said.append), said


def _marker(iteration: int) -> CheckpointMarker:
    return CheckpointMarker(iteration=iteration, consumed_samples=iteration, zebractl_version="0")


def test_a_save_is_due_at_the_interval_and_the_last_step(tmp_path):
    c, _ = _checkpointer(tmp_path)
    assert [i for i in range(1, 13) if c.due(i, last=i == 12)] == [5, 10, 12]
    off, _ = _checkpointer(tmp_path, "checkpoint.enabled=false")
    assert not any(off.due(i, last=True) for i in range(1, 13))


def test_the_state_is_built_only_when_a_save_is_due(tmp_path):
    c, _ = _checkpointer(tmp_path)
    c.saver = FakeSaver()
    built = []

    def state():
        built.append(1)
        return {"x": 1}

    for i in range(1, 8):
        folder = c.maybe_save(i, False, state, lambda i=i: _marker(i), lambda: 1000)
        assert (folder is not None) == (i == 5)
    assert built == [1] and c.last_saved == 5 and c.pending(5)
    assert c.newest() == ckpt.checkpoint_dir(c.run.checkpoints, 5)


def test_an_async_save_waits_for_the_one_before_it_and_the_end_waits_for_the_last(tmp_path):
    c, said = _checkpointer(tmp_path)
    saver = c.saver = FakeSaver()
    c.save(5, {"a": 5}, _marker(5), 1000)
    c.poll()
    c.save(10, {"a": 10}, _marker(10), 1000)
    assert [k for k, *_ in saver.calls] == ["begin", "poll", "wait", "begin"]
    assert saver.calls[2] == ("wait", 5)  # the save of 5 completed before 10 began
    assert saver.calls[3][3] == {"keep_last": c.cfg.checkpoint.keep_last, "is_writer": True}
    c.wait()
    assert saver.pending is None and not c.pending(10) and c.last_saved == 10
    assert any("saving" in s and "iter_0000010" in s for s in said), said


def test_abort_leaves_the_save_in_flight_unfinished(tmp_path):
    c, _ = _checkpointer(tmp_path)
    c.abort()  # no saver: nothing to do
    saver = c.saver = FakeSaver()
    c.save(5, {}, _marker(5), 1000)
    c.abort()
    assert saver.calls[-1] == ("abort", 5)


def test_async_save_makes_a_saver_only_when_checkpoints_are_on(tmp_path, monkeypatch):
    from zebractl.run import async_save

    readied: list[bool] = []
    monkeypatch.setattr(async_save, "AsyncSaver", lambda group, staging: FakeSaver())
    monkeypatch.setattr(ckpt, "ready_writers", lambda: readied.append(True))
    c, _ = _checkpointer(tmp_path, "checkpoint.async_save=true")
    c.start_async(None, None)
    assert c.saver is not None and readied == [True]
    off, _ = _checkpointer(tmp_path, "checkpoint.async_save=true", "checkpoint.enabled=false")
    off.start_async(None, None)
    assert off.saver is None and readied == [True]  # a run that never saves starts no writers
    sync, _ = _checkpointer(tmp_path)
    sync.start_async(None, None)
    assert sync.saver is None and readied == [True, True]  # blocking saves use them too


def test_resume_takes_the_newest_checkpoint_that_loads(tmp_path):
    """Two complete checkpoints; the newest fails to load (damaged): the one before is taken,
    the damaged one named in a warning."""
    pytest.importorskip("megatron.core")
    from zebractl.runtime import dist

    c, said = _checkpointer(tmp_path)
    root = c.run.checkpoints
    with dist.scoped():
        for it in (5, 10):
            ckpt.save(root, it, {"iteration": it}, _marker(it), keep_last=0, is_writer=True)
    loaded = []

    def load(found):
        if found.iteration == 10:
            raise ckpt.DamagedCheckpoint(found.folder, "it does not load")
        loaded.append(found.iteration)

    assert c.resume_newest_intact(load) == 5
    assert loaded == [5] and c.last_saved == 5
    assert any("iter_0000010 is damaged: it does not load" in s for s in said), said
    empty, _ = _checkpointer(tmp_path / "other")
    assert empty.resume_newest_intact(load) is None


GB = 10**9


@pytest.mark.parametrize(
    ("setting", "staged", "world", "env", "available", "on", "says"),
    [
        (True, None, 1, {}, None, True, "checkpoint.async_save: true"),
        (False, 4 * GB, 1, {}, 10**12, False, "checkpoint.async_save: false"),
        ("auto", None, 1, {}, 10**12, False, "only on a GPU"),
        ("auto", 4 * GB, 1, {}, 9 * GB, True, "4.0 GB staged per rank, 9.0 GB available"),
        ("auto", 4 * GB, 1, {}, 7 * GB, False, "twice the staging"),
        # eight ranks of one node stage 8 x 4 GB: 64 GB needed on the node
        ("auto", 4 * GB, 8, {"LOCAL_WORLD_SIZE": "8"}, 63 * GB, False, "twice the staging"),
        ("auto", 4 * GB, 16, {"LOCAL_WORLD_SIZE": "8"}, 64 * GB, True, "in the background"),
        ("auto", 4 * GB, 16, {"SLURM_NTASKS_PER_NODE": "2(x8)"}, 16 * GB, True, "background"),
        ("auto", 4 * GB, 16, {"SLURM_NTASKS_PER_NODE": "4(x4)"}, 16 * GB, False, "twice"),
    ],
)
def test_auto_saves_in_the_background_where_host_memory_holds_twice_the_staging(
    monkeypatch, setting, staged, world, env, available, on, says
):
    from zebractl.train.checkpointer import background_saves

    for var in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got, line = background_saves(setting, staged, world, available)
    assert got is on and says in line, line


def test_async_save_takes_true_false_or_auto_only():
    from pydantic import ValidationError

    from zebractl.schemas.recipe import CheckpointConfig

    assert CheckpointConfig().async_save == "auto"
    for v in (True, False, "auto"):
        assert CheckpointConfig(async_save=v).async_save == v
    for bad in ("yes", 1, 0, None, "AUTO"):
        with pytest.raises(ValidationError, match="must be true, false or auto"):
            CheckpointConfig(async_save=bad)


def test_a_bad_async_save_is_one_plain_line(cli):
    r = cli("plan", "tiny_kda", "--set", "checkpoint.async_save=maybe")
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == (
        "error: --set: checkpoint.async_save: must be true, false or auto, not 'maybe'"
    ), r.stderr

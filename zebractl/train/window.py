"""The metrics rows: the logging window (the steps since the last logged row) and the row they
make, and the row of a validation.

The loss is summed on the device and read once per row (the one host sync of an interval); the
window's tokens/s counts its steps (skipped ones too) over its time, validation and saves paused out.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from zebractl.errors import TrainingError
from zebractl.run.records import TrainRow, ValRow

Tensor = torch.Tensor


class LogWindow:
    """The steps since the last logged row (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.loss = torch.zeros((), device=device)
        self.steps = self.skipped = 0
        self.grad_norm: Any = None  # the last update's
        self.start = time.perf_counter()

    def add(self, loss: Tensor | None, grad_norm: Any) -> None:
        """A step's loss and gradient norm; ``loss`` None: its update was skipped."""
        if loss is None:
            self.skipped += 1
            return
        self.loss += loss
        self.steps += 1
        self.grad_norm = grad_norm

    def due(self, iteration: int, interval: int, total: int) -> bool:
        """Whether ``iteration`` logs a row: every ``interval`` steps, the first (the loss at
        initialisation a parity report compares) and the last, when an update was made."""
        return bool(self.steps) and (iteration % interval == 0 or iteration in (1, total))

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` (validation, saves) out of the window's time."""
        self.start += seconds

    def reset(self) -> None:
        """Start the next window."""
        self.loss = torch.zeros_like(self.loss)
        self.steps = self.skipped = 0
        self.start = time.perf_counter()

    def mean_loss(self, world: int) -> float:
        """The mean loss of the window's updates over all ranks (a host sync)."""
        import torch.distributed as tdist

        mean = self.loss / self.steps
        if world > 1:  # SUM then divide: gloo has no AVG
            tdist.all_reduce(mean)
            mean = mean / world
        return mean.item()

    def tokens_per_s(self, tokens_per_step: int, world: int) -> float:
        """Training tokens/s per process over the window's steps."""
        steps = self.steps + self.skipped
        return steps * tokens_per_step / ((time.perf_counter() - self.start) * world)


def check_finite(loss: float, grad_norm: float, iteration: int) -> None:
    """A non-finite logged loss or gradient norm stops the run."""
    for what, x in (("loss", loss), ("gradient norm", grad_norm)):
        if not math.isfinite(x):
            raise TrainingError(
                f"the {what} is {x} at iteration {iteration} (the loss averaged over "
                "the last logging interval); stopping (--set nonfinite.action=skip drops "
                "such updates instead)"
            )


def train_row(
    window: LogWindow,
    *,
    iteration: int,
    world: int,
    tokens_per_step: int,
    flops_per_token: float,
    peak_flops: float | None,
    lr: float,
    cuda: bool,
    consumed: int,
    run_id: str,
) -> TrainRow:
    """The metrics row of ``window`` ending at ``iteration``."""
    loss = window.mean_loss(world)
    norm = float(window.grad_norm)
    check_finite(loss, norm, iteration)
    tps = window.tokens_per_s(tokens_per_step, world)
    tflops = tps * flops_per_token / 1e12
    return TrainRow(
        iteration=iteration,
        loss=loss,
        lr=lr,
        grad_norm=norm,
        tokens_per_s=tps,
        tflops_per_gpu=tflops if cuda else None,
        mfu=tflops * 1e12 / peak_flops if peak_flops else None,
        memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        consumed_samples=consumed,
        skipped=window.skipped,
        wall_time=time.time(),
        run_id=run_id,
    )


def val_row(iteration: int, loss_sum: float, tokens: float, run_id: str) -> ValRow:
    """The metrics row of a validation: the mean held-out loss and its perplexity (None where
    not finite, or the perplexity past a float's range)."""
    loss = loss_sum / tokens if tokens else math.nan
    finite = math.isfinite(loss)
    return ValRow(
        iteration=iteration,
        val_loss=loss if finite else None,
        val_ppl=math.exp(loss) if finite and loss < 700 else None,
        tokens=int(tokens),
        wall_time=time.time(),
        run_id=run_id,
    )

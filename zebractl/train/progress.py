"""How far a run is: the progress fields of the trainer's log line, and the bar on a terminal.

:class:`Clock` times a run in its process: ``elapsed`` since the run started here (setup included),
the training time (steps only: validation and saves are paused out, as in the rows' ``tokens_per_s``)
and the ETA, the steps left times the mean wall time of this process's steps after its first (the
first compiles the kernels; validation and saves are included, so the ETA is wall-clock). A resumed
run counts from its iteration: the total is always the run's resolved ``schedule.iterations``.

:class:`RichBar` is a rich progress bar on stderr, made only when stderr is a terminal (``zebractl
train`` without ``--json``); log lines keep printing above it. Everything else (CI logs, pipes,
``--json``) gets the plain lines only. No torch here.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO


def duration(seconds: float) -> str:
    """``h:mm:ss`` (hours unbounded), rounded down to the second."""
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def count(n: float) -> str:
    """A count in three significant figures with k/M/B/T: ``20.5k``, ``1.31M``, ``10.0B``."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            v = n / div
            digits = 2 if v < 10 else 1 if v < 100 else 0
            return f"{v:.{digits}f}{suffix}"
    return f"{n:.0f}"


def percent(iteration: int, total: int) -> int:
    """Whole percent done, rounded down (100 only at the end)."""
    return 100 * iteration // total if total > 0 else 100


@dataclass(frozen=True)
class Snapshot:
    """The progress fields of one log line."""

    iteration: int
    total: int
    step_s: float | None  # mean training time of the interval's steps
    tokens: int  # consumed samples x seq_length (the run's, resumed steps included)
    elapsed_s: float  # since the run started in this process
    eta_s: float | None  # None until a step after this process's first is done

    def fields(self) -> list[str]:
        """``iter N/total (p%)`` first, then the trailing fields of the log line."""
        return [self.head(), *self.tail()]

    def head(self) -> str:
        """``iter    10/60 (17%)``: the iteration right-aligned to the total's width."""
        width = len(str(self.total))
        return (
            f"iter {self.iteration:>{width}}/{self.total} ({percent(self.iteration, self.total)}%)"
        )

    def tail(self) -> list[str]:
        """``step 0.412 s | 20.5k tokens | elapsed 0:00:04 | ETA 0:00:20``."""
        step = "n/a" if self.step_s is None else _seconds(self.step_s)
        eta = "n/a" if self.eta_s is None else duration(self.eta_s)
        return [
            f"step {step}",
            f"{count(self.tokens)} tokens",
            f"elapsed {duration(self.elapsed_s)}",
            f"ETA {eta}",
        ]


def row_line(row: Any, snap: Snapshot) -> tuple[str, str]:
    """A logged :class:`~zebractl.run.records.TrainRow` as the console's line, and the progress
    bar's short form (loss and tokens/s)."""
    parts = [
        snap.head(),
        f"loss {row.loss:.4f}",
        f"lr {row.lr:.3e}",
        f"grad {row.grad_norm:.3f}",
        f"{row.tokens_per_s:,.0f} tok/s",
    ]
    if row.tflops_per_gpu is not None:
        parts.append(f"{row.tflops_per_gpu:.1f} TFLOP/s")
    if row.mfu is not None:
        parts.append(f"MFU {100 * row.mfu:.1f}%")
    if row.memory_gib is not None:
        parts.append(f"mem {row.memory_gib:.1f} GiB")
    return " | ".join(parts + snap.tail()), f"loss {row.loss:.4f} | {parts[4]}"


def val_line(row: Any, total: int) -> str:
    """A :class:`~zebractl.run.records.ValRow` as the console's line."""
    loss = "n/a" if row.val_loss is None else f"{row.val_loss:.4f}"
    ppl = "n/a" if row.val_ppl is None else f"{row.val_ppl:,.2f}"
    width = len(str(total))
    return (
        f"iter {row.iteration:>{width}}/{total} | val_loss {loss} | val_ppl {ppl} | "
        f"{row.tokens:,} tokens"
    )


def _seconds(s: float) -> str:
    return f"{s:.3f} s" if s < 10 else f"{s:.1f} s"


class Clock:
    """The run's times in this process (see the module docstring); ``now`` is injectable for tests."""

    def __init__(self, now=time.perf_counter) -> None:
        self.now = now
        self.started = now()  # the run's start in this process
        self.loop_start: float | None = None
        self.paused = 0.0  # validation and saves, not training
        self.steps = 0  # steps this process ran
        self.first_done: float | None = None  # wall time when this process's first step ended

    def begin(self) -> None:
        """The training loop starts (setup is over)."""
        self.loop_start = self.now()

    def step_done(self) -> None:
        """A step (an update, or one skipped for non-finite values) ended."""
        self.steps += 1
        if self.steps == 1:
            self.first_done = self.now()

    def pause(self, seconds: float) -> None:
        """Seconds spent on validation or a save: not training."""
        self.paused += seconds

    def elapsed(self) -> float:
        """Seconds since the run started in this process."""
        return self.now() - self.started

    def training(self) -> float:
        """Seconds of training steps in this process (validation and saves excluded)."""
        if self.loop_start is None:
            return 0.0
        return max(0.0, self.now() - self.loop_start - self.paused)

    def eta(self, remaining: int) -> float | None:
        """Seconds until the last of ``remaining`` steps: the mean wall time of the steps after
        this process's first; None while there is none."""
        if remaining <= 0:
            return 0.0
        if self.first_done is None or self.steps < 2:
            return None
        return remaining * (self.now() - self.first_done) / (self.steps - 1)

    def snapshot(self, iteration: int, total: int, tokens: int, step_s: float | None) -> Snapshot:
        """The progress fields at ``iteration`` of ``total``."""
        return Snapshot(
            iteration, total, step_s, tokens, self.elapsed(), self.eta(total - iteration)
        )


class NoBar:
    """No bar: plain lines only (not a terminal, ``--json``, not rank 0)."""

    def start(self, iteration: int, total: int) -> None:
        """The loop starts at ``iteration`` of ``total``."""

    def advance(self, iteration: int, info: str | None = None) -> None:
        """A step ended; ``info`` (loss, tokens/s, elapsed, ETA) when the step was logged."""

    def stop(self) -> None:
        """The loop ended (or failed)."""


class RichBar(NoBar):
    """A rich bar on ``stream`` (stderr): iteration/total, percent, and the last logged loss,
    tokens/s and ETA. Lines printed meanwhile (stdout when it is the same terminal,
    stderr) appear above it; it is removed when the loop ends, the log lines staying."""

    def __init__(self, stream: TextIO | None = None, *, force_terminal: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.force_terminal = force_terminal
        self.progress: Any = None
        self.task: Any = None
        self.total = 0

    def start(self, iteration: int, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(file=self.stream, force_terminal=self.force_terminal)
        self.progress = Progress(
            TextColumn("iter"),
            MofNCompleteColumn(),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[pct]:>3}%"),
            TextColumn("{task.fields[info]}"),
            console=console,
            transient=True,
            # stdout's lines go above the bar only when stdout is this terminal too
            redirect_stdout=_isatty(sys.stdout),
            redirect_stderr=True,
        )
        self.total = total
        self.task = self.progress.add_task(
            "train", total=total, completed=iteration, info="", pct=percent(iteration, total)
        )
        self.progress.start()

    def advance(self, iteration: int, info: str | None = None) -> None:
        if self.progress is None:
            return
        update: dict[str, Any] = {"completed": iteration, "pct": percent(iteration, self.total)}
        if info is not None:
            update["info"] = info
        self.progress.update(self.task, **update)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


NO_BAR_ENV = "ZEBRACTL_NO_BAR"
"""Set (to 1) by a launcher whose own output is ``--json`` for the workers it starts (torchrun):
they share its terminal but must not draw on it."""


def wants_bar(json_out: bool, stream: Any = None, env: Mapping[str, str] | None = None) -> bool:
    """Whether `zebractl train` shows a bar: stderr is a terminal, the output is not ``--json``
    and no launcher said otherwise (:data:`NO_BAR_ENV`)."""
    env = os.environ if env is None else env
    if json_out or env.get(NO_BAR_ENV, "") not in ("", "0"):
        return False
    return _isatty(stream if stream is not None else sys.stderr)

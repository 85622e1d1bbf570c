"""Stopping a run safely: SIGINT, SIGTERM and SIGUSR1 set a flag the trainer reads between steps.

The handler only records the signal (printing from a handler can hit a reentrant write); the
trainer finishes the step it is in, saves a checkpoint holding exactly that step, and exits with
128 + the signal number (130 Ctrl-C, 143 SIGTERM, 138 SIGUSR1: Slurm's warning before the time
limit, after which the batch script requeues the job). Further signals while stopping are ignored:
the save must complete (SIGKILL or Ctrl-\\ still end the process at once; the save is atomic).
The run's helper processes ignore them (:mod:`zebractl.runtime.stop_signals`): a signal sent to the
whole process group stops the trainer alone.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from zebractl.runtime.stop_signals import STOP_SIGNALS


class StopFlag:
    """Context manager installing the stop handlers (main thread only) and restoring the old ones."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def name(signum: int) -> str:
    """SIGTERM, SIGINT, ..."""
    return signal.Signals(signum).name

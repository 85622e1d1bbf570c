"""Stop signals belong to the training process: the helper processes of a run ignore them.

SIGINT, SIGTERM and SIGUSR1 ask a run to stop (:mod:`zebractl.train.signals`): the trainer finishes
the step, completes its checkpoint and exits with 128 + the signal. Launchers deliver them to a whole
process group (torchrun stopping a worker, Slurm, ``timeout``, Ctrl-C), so every helper process the
run started gets them too, and a helper killed by one fails what the stop waits for: a data loader
worker the last step, the multiprocessing manager megatron's checkpoint writers report through the
save (``ConnectionRefusedError`` in the writer, issue 42). A helper forked from the trainer inherits
its handler, which only records the signal; a spawned one starts with Python's defaults, under which
SIGTERM and SIGUSR1 kill. Such a helper is started inside :func:`held` (it inherits the mask, so a
signal waits until it is ready) and calls :func:`ignore` first (a process initializer). Nothing here
imports more than the standard library: a spawned helper imports this module to run :func:`ignore`.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
"""The signals that ask a run to stop (and save)."""


def ignore(*_: object) -> None:
    """In a helper process: ignore the stop signals from now on, and let through any that
    :func:`held` kept back (they are discarded). Takes and ignores any arguments: a DataLoader's
    ``worker_init_fn`` passes the worker's index."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Keep the stop signals back in this thread for the block; a process started inside inherits
    that mask (until it calls :func:`ignore`). A signal kept back here is delivered when the block
    ends (to the trainer's handler, which records it)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)

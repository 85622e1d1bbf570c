"""zebractl.runtime.stop_signals: a helper process started inside ``held()`` is not killed by a stop
signal that arrives before it called ``ignore()``, nor by one after (issue 42: a SIGTERM to the
run's process group killed megatron's checkpoint results manager); the starting thread gets its
signals once the block ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from zebractl.runtime import stop_signals

_HELPER = """
import sys, time
from pathlib import Path

go = Path(sys.argv[1])
while not go.exists():  # the stop signals arrive now, before it is ready
    time.sleep(0.01)
from zebractl.runtime import stop_signals

stop_signals.ignore()
print("ready", flush=True)
sys.stdin.read()  # more stop signals arrive now
print("done", flush=True)
"""


def _start(go: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _HELPER, str(go)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _signal_all(proc: subprocess.Popen) -> None:
    for sig in stop_signals.STOP_SIGNALS:
        proc.send_signal(sig)
    time.sleep(0.2)  # time to die, for a process that would


def test_a_helper_started_while_held_ignores_the_stop_signals(tmp_path):
    go = tmp_path / "go"
    with stop_signals.held():
        proc = _start(go)
    try:
        _signal_all(proc)  # before ignore(): held back by the inherited mask
        go.touch()
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        _signal_all(proc)  # after: ignored
        out, _ = proc.communicate("", timeout=30)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == "done\n", (proc.returncode, out)


def test_without_held_a_stop_signal_kills_a_helper_not_yet_ready(tmp_path):
    """What held() prevents (the control of the test above)."""
    proc = _start(tmp_path / "go")
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_held_delivers_the_signals_of_the_block_when_it_ends():
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: got.append(signum))
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        with stop_signals.held():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
            time.sleep(0.05)
            assert got == []
        assert got == [signal.SIGUSR1]
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
    finally:
        signal.signal(signal.SIGUSR1, previous)

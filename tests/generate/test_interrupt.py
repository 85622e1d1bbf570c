"""Ctrl-C in a real terminal mid-generation (issue 43, item 4): ``zebractl generate`` runs on a
pseudo-terminal, the test types Ctrl-C (the byte 0x03, which the terminal's line discipline turns
into SIGINT for the foreground process group, as a keyboard does) once the first generated text has
arrived, and the command ends with exit 130, what it had generated kept, no traceback, and the
terminal left clean: the output ends at the start of a line and every escape sequence that hid the
cursor or changed the style is undone.

The generation is slowed to 50 ms a token (a ``sitecustomize`` on the child's path wraps the
decoder's step, and marks a file once the first token has been decoded) so that the interrupt lands
mid-generation however fast the machine is.
"""

from __future__ import annotations

import os
import re
import select
import signal
import sys
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

pty = pytest.importorskip("pty")

SLOW = """
import os
import time
import zebractl.generate.engine as _engine

_feed = _engine.Decoder.feed


def _slow_feed(self, ids):
    out = _feed(self, ids)
    if len(ids) == 1:
        open(os.environ["ZEBRACTL_TEST_STEPPED"], "a").close()
        time.sleep(0.05)
    return out


_engine.Decoder.feed = _slow_feed
"""


def _read(fd: int, until: float, want: bytes | None = None) -> bytes:
    """What the terminal shows until EOF, the deadline, or ``want`` appearing."""
    got = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        got += chunk
        if want is not None and want in got:
            break
    return got


def test_ctrl_c_mid_generation_exits_130_and_leaves_the_terminal_clean(trained, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW)
    path = [str(site), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    env.pop("NO_COLOR", None)
    env["TERM"] = "xterm-256color"
    stepped = tmp_path / "stepped"
    env["ZEBRACTL_TEST_STEPPED"] = str(stepped)
    argv = [sys.executable, "-m", "zebractl", "generate", str(trained), "--prompt", "Once upon a time",
            "--max-new-tokens", "400", "--stop", "\u2603never\u2603"]  # fmt: skip
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pseudo-terminal is its controlling terminal
        # as an interactive shell starts a foreground job: SIGINT at its default, whatever this
        # process inherited (a pytest-xdist worker ignores it, and an ignored SIGINT survives exec)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execve(sys.executable, argv, env)
    try:
        shown = b""
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not stepped.exists():  # loading, pre-fill
            shown += _read(fd, time.monotonic() + 0.5)
        assert stepped.exists(), shown.decode(errors="replace")[-2000:]
        shown += _read(fd, time.monotonic() + 0.2)  # a few tokens on the screen
        os.write(fd, b"\x03")  # Ctrl-C, typed
        shown += _read(fd, time.monotonic() + 60)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = shown.decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    assert code == 130, (code, text[-2000:])
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-2000:]
    assert text.endswith("\n"), repr(text[-200:])  # the prompt comes back at a line's start
    hidden = text.count("\x1b[?25l")
    assert hidden == text.count("\x1b[?25h"), repr(text[-400:])  # the cursor shown again
    styles = re.findall(r"\x1b\[[0-9;]*m", text)
    assert not styles or styles[-1] in ("\x1b[0m", "\x1b[m"), styles[-5:]  # no style left on
    summary = re.search(r"\[(\d+) tokens, interrupted; .* decode (\S+) tokens/s\]", text)
    assert summary, text[-1000:]  # why it stopped, and the rate of what it decoded
    assert int(summary.group(1)) >= 1 and float(summary.group(2)) > 0, summary.group(0)

"""The checkpoint writers' result queue (zebractl.run.checkpoint.shield_writers): its server
process ignores the stop signals and imports what the writers report while it starts, and a run
starts it when it starts to save, so the first save does not wait for torch's import in that
process (1.6 s of a 2.1 s blocking save of a 3-iteration tiny run on a 2-core CPU before)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from zebractl.run import checkpoint as ckpt  # noqa: E402

_SERVER = """
import json, pickle, signal, sys, threading
from zebractl.run import checkpoint as ckpt
before = ckpt.RESULT_TYPES in sys.modules
ckpt.serve_results()  # as the server process runs it, before it serves
importing = [t for t in threading.enumerate() if t.name == "result-types"]
for t in importing:
    t.join(300)
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult
result = WriteResult(index=MetadataIndex("w"), size_in_bytes=1, storage_data=None)
print(json.dumps({
    "before": before,
    "thread": len(importing),
    "after": ckpt.RESULT_TYPES in sys.modules,
    "ignored": [signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)],
    "reads": pickle.loads(pickle.dumps(result)).size_in_bytes,
}))
"""


def test_the_server_imports_the_result_types_in_a_thread_and_ignores_stop_signals():
    done = subprocess.run(
        [sys.executable, "-c", _SERVER], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    # a fresh process has not imported them; the initializer's thread has, and it returned at once
    assert got == {"before": False, "thread": 1, "after": True, "ignored": [True, True], "reads": 1}


@pytest.mark.parametrize("enabled", [True, False])
def test_a_run_starts_the_queue_when_it_starts_to_save(fast, tmp_path, monkeypatch, enabled):
    from zebractl.run import RunDir
    from zebractl.train.checkpointer import Checkpointer

    started = []
    monkeypatch.setattr(ckpt, "shield_writers", lambda: started.append(True))
    r = fast.resolve("tiny_kda", f"checkpoint.enabled={str(enabled).lower()}")
    said: list[str] = []
    saver = Checkpointer(
        r.run, RunDir.for_recipe(r.run, r.name, tmp_path), 0, 1, said.append, print
    )
    saver.start_async(None, None)  # a CPU run: blocking saves
    assert started == ([True] if enabled else [])
    assert said == (
        ["checkpoint saves: blocking (checkpoint.async_save auto: background saves only on a GPU)"]
        if enabled
        else []
    )

"""Checkpoints in megatron's torch_dist format, atomic, newest-valid resume, keep-last-N.

Layout: ``DIR/iter_0000020/`` is a ``dist_checkpointing`` folder (model as sharded tensors; optimizer,
scheduler, RNG, consumed samples, iteration, resolved config with provenance and zebractl version in
its common state) plus ``zebractl.json`` written last. A checkpoint is saved into ``iter_XXXXXXX.tmp``
and renamed when complete, so a crash during a save never leaves a folder that looks finished; resume
takes the newest folder whose marker exists.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

MARKER = "zebractl.json"
_NAME = re.compile(r"^iter_(\d{7})$")


def checkpoint_dir(root: Path, iteration: int) -> Path:
    """Folder of the checkpoint of ``iteration``."""
    return root / f"iter_{iteration:07d}"


def valid_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(iteration, folder) of every complete checkpoint, oldest first."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / MARKER).is_file() and (p / "metadata.json").is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def save(
    root: Path,
    iteration: int,
    sharded: dict[str, Any],
    marker: dict[str, Any],
    keep_last: int,
    is_writer: bool,
) -> Path:
    """Save atomically; prune to the newest ``keep_last`` (0 keeps all)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    final = checkpoint_dir(root, iteration)
    tmp = final.with_name(final.name + ".tmp")
    if is_writer:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if dist.is_initialized():
        dist.barrier()
    dist_checkpointing.save(sharded, str(tmp))
    if dist.is_initialized():
        dist.barrier()
    if is_writer:
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        if keep_last > 0:
            for _, old in valid_checkpoints(root)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    if dist.is_initialized():
        dist.barrier()
    return final


def read_marker(folder: Path) -> dict[str, Any]:
    """The ``zebractl.json`` written when the checkpoint completed."""
    return json.loads((folder / MARKER).read_text(encoding="utf-8"))


def load(folder: Path, sharded_template: dict[str, Any]) -> dict[str, Any]:
    """Load a checkpoint into the structure of ``sharded_template``."""
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load(sharded_template, str(folder))

"""What every shard writer of ``zebractl prepare`` shares (plain text and chat alike): the record
problems it counts, the held-out split of a document, the shard's JSON, and publishing or discarding
an indexed dataset (``.bin``/``.idx``) written under a temporary name."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from zebractl.util import sha256_file

RECORD_PROBLEMS = (
    "malformed_json",
    "missing_text_key",
    "invalid_utf8",
    "invalid_unicode",
    "not_text",
)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """``doc`` as indented JSON at ``path``, written under a temporary name and renamed."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def is_valid(key: str, index: int, fraction: float) -> bool:
    """Whether document ``index`` of source ``key`` is held out (a hash below ``fraction``)."""
    if fraction <= 0:
        return False
    return zlib.crc32(f"{key}:{index}".encode()) / 2**32 < fraction


def publish(builder: Any, tmp: Path, final: Path) -> dict[str, dict[str, Any]]:
    """Finish the indexed dataset ``builder`` wrote at ``tmp`` (.bin/.idx), move it to ``final``
    and return its files' sizes and sha256s (a shard output's ``files``)."""
    builder.finalize(f"{tmp}.idx")
    files = {}
    for ext in ("bin", "idx"):
        src = Path(f"{tmp}.{ext}")
        files[ext] = {"bytes": src.stat().st_size, "sha256": sha256_file(src)}
        src.replace(f"{final}.{ext}")
    return files


def discard(builder: Any, tmp: Path) -> None:
    """Close an unfinished indexed dataset and remove its temporary files."""
    builder.data_file.close()
    for ext in ("bin", "idx"):
        Path(f"{tmp}.{ext}").unlink(missing_ok=True)

"""Small helpers shared by every layer (bottom layer: stdlib only, imports nothing from zebractl)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
"""Files are hashed in pieces of this many bytes (1 MiB): memory stays flat for any size."""


def sha256_file(path: Path) -> str:
    """The sha256 (hex) of a file's bytes, read in 1 MiB pieces (``hashlib`` releases the GIL
    while it hashes each piece, so other threads keep running)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def flatten(d: Mapping[str, Any], prefix: str = "", *, keep_empty: bool = False) -> dict[str, Any]:
    """Nested mappings as one dict of dotted keys: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``.

    Only mappings are descended: a list (or any other value) is one leaf, under its own key. An
    empty mapping has no leaves and leaves no key, unless ``keep_empty`` keeps it as the value
    ``{}`` under its key. ``prefix`` (when not empty) goes before every key, joined by a dot.
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and (v or not keep_empty):
            out |= flatten(v, key, keep_empty=keep_empty)
        else:
            out[key] = v
    return out

"""Small helpers shared by every layer (bottom layer: stdlib only, imports nothing from zebractl)."""

from __future__ import annotations

import hashlib
from pathlib import Path

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

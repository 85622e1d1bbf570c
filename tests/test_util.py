"""The shared helpers: ``zebractl.errors.first_line`` and ``zebractl.util``."""

from __future__ import annotations

import hashlib

from zebractl.errors import first_line
from zebractl.util import CHUNK, sha256_file


def test_first_line_strips_and_takes_the_first_line():
    assert first_line(ValueError("  \n bad value\nmore detail\n")) == "bad value"


def test_first_line_of_an_empty_message_is_the_default():
    assert first_line(ValueError()) == ""
    assert first_line(OSError("   "), type(OSError()).__name__) == "OSError"


def test_sha256_file_matches_hashlib_across_chunks(tmp_path):
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * (CHUNK // 256) + b"tail"  # one full piece and a short one
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()

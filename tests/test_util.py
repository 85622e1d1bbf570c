"""The shared helpers: ``zebractl.errors.first_line`` and ``zebractl.util``."""

from __future__ import annotations

import hashlib

from zebractl.errors import first_line
from zebractl.util import CHUNK, flatten, sha256_file


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


def test_flatten_gives_dotted_keys_and_keeps_lists_whole():
    d = {"a": {"b": 1, "c": {"d": None}}, "e": [1, {"f": 2}], "g": "x"}
    assert flatten(d) == {"a.b": 1, "a.c.d": None, "e": [1, {"f": 2}], "g": "x"}
    assert flatten({"b": {"c": 1}}, "a") == {"a.b.c": 1}


def test_flatten_drops_empty_mappings_unless_asked():
    d = {"a": {}, "b": {"c": {}}, "d": 0}
    assert flatten(d) == {"d": 0}
    assert flatten(d, keep_empty=True) == {"a": {}, "b.c": {}, "d": 0}

"""The shared helpers: ``zebractl.errors.first_line`` and ``zebractl.util``."""

from __future__ import annotations

from zebractl.errors import first_line


def test_first_line_strips_and_takes_the_first_line():
    assert first_line(ValueError("  \n bad value\nmore detail\n")) == "bad value"


def test_first_line_of_an_empty_message_is_the_default():
    assert first_line(ValueError()) == ""
    assert first_line(OSError("   "), type(OSError()).__name__) == "OSError"

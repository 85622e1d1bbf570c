"""YAML reading: 1.2 floats and booleans, line numbers, duplicate keys."""

from __future__ import annotations

import pytest

from zebractl.config.yamlio import load_with_lines, parse_scalar
from zebractl.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-6", 1e-6),
        ("1.0e-6", 1e-6),
        ("-2E3", -2000.0),
        (".5", 0.5),
        ("3", 3),
        ("true", True),
        ("false", False),
        ("null", None),
        ("yes", "yes"),
        ("on", "on"),
        ("[1, 2]", [1, 2]),
        ("'0.1'", "0.1"),
        ("abc", "abc"),
    ],
)
def test_scalars_follow_yaml_1_2(text, value):
    parsed = parse_scalar(text)
    assert parsed == value and type(parsed) is type(value)


def test_lines_of_nested_keys(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("# comment\na: 1\nb:\n  c:\n    d: 2\n  e: [1, 2]\n")
    data, lines = load_with_lines(path)
    assert data == {"a": 1, "b": {"c": {"d": 2}, "e": [1, 2]}}
    assert lines == {"a": 2, "b": 3, "b.c": 4, "b.c.d": 5, "b.e": 6, "b.e.0": 6, "b.e.1": 6}


def test_duplicate_key_is_an_error(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("a:\n  b: 1\n  b: 2\n")
    with pytest.raises(ConfigError, match=r"x.yaml:3: a.b: duplicate key \(first set on line 2\)"):
        load_with_lines(path, "x.yaml")


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_with_lines(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_with_lines(tmp_path / "nope.yaml")

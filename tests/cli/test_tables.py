"""Tables fit the terminal (issue 30, point 5): on 80 columns no line is wider, every key is
whole on one line (values wrap, keys do not), and `config diff` lists no row where both sides are
null or absent and never prints Python's ``None``.

The tables of `compare` and `eval` need a trained run: tests/cli/test_quiet.py checks their width
on the run it trains.
"""

from __future__ import annotations

import io
import json

import pytest

from zebractl.cli import _tables

WIDTH = 80


@pytest.fixture(autouse=True)
def _columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", str(WIDTH))


def _lines(text: str) -> list[str]:
    lines = text.splitlines()
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} line(s) wider than {WIDTH}:\n" + "\n".join(wide)
    return lines


def _whole(keys: list[str], lines: list[str]) -> None:
    """Each key is on one line, unbroken, between the table's borders or spaces."""
    cells = {c.strip() for line in lines for c in line.split("│")}
    broken = [k for k in keys if k not in cells]
    assert not broken, f"keys not whole on one line: {broken}"


def _run(cli, *args: str) -> str:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_presets_and_recipes_fit_80_columns(cli):
    for what in ("presets", "recipes"):
        names = [x["name"] for x in json.loads(_run(cli, what, "--json"))[what]]
        _whole(names, _lines(_run(cli, what)))


def test_config_show_fits_80_columns(cli):
    doc = json.loads(_run(cli, "config", "show", "zebra_mamba_8B_hybrid", "--json"))
    keys = list(doc["provenance"])
    assert "model.mla.yarn.original_max_position_embeddings" in keys  # the longest key
    lines = _lines(_run(cli, "config", "show", "zebra_mamba_8B_hybrid"))
    _whole(keys, lines)


def test_config_show_keeps_sources_whole_where_they_fit(cli):
    # each value's source (FILE:LINE, default) on a line of its own under the value: whole at 80
    # columns where the keys leave it room (tiny_kda; a 48-character key leaves 25 for the value)
    doc = json.loads(_run(cli, "config", "show", "tiny_kda", "--json"))
    lines = _lines(_run(cli, "config", "show", "tiny_kda"))
    _whole(sorted({f"({s})" for s in doc["provenance"].values()}), lines)


def test_config_diff_fits_80_columns_and_keys_stay_whole(cli):
    args = ("config", "diff", "tiny_kda", "zebra_mamba_8B_hybrid")
    keys = [d["key"] for d in json.loads(_run(cli, *args, "--json"))["differences"]]
    assert len(keys) > 40
    _whole(keys, _lines(_run(cli, *args)))


def test_config_diff_drops_rows_null_on_both_sides_and_prints_no_none(cli):
    # a recipe next to its preset: the preset has no batch, data, schedule... and many of the
    # recipe's keys are null by default (checkpoint.dir): null against absent is no difference
    args = ("config", "diff", "recipes/tiny_kda.yaml", "presets/tiny_kda.yaml")
    rows = json.loads(_run(cli, *args, "--json"))["differences"]
    assert rows and not [r["key"] for r in rows if r["a"] is None and r["b"] is None]
    text = _run(cli, *args)
    lines = _lines(text)
    assert "None" not in text  # not a value, not a source
    assert "checkpoint.dir" not in text  # null in the recipe, absent from the preset
    _whole([r["key"] for r in rows], lines)
    # the recipe's values carry their source (a default says so); the preset's side is "-"
    row = next(i for i, line in enumerate(lines) if "│ checkpoint.enabled " in line)
    assert "true" in lines[row] and lines[row].rstrip("│ ").endswith("-")
    assert "(default)" in lines[row + 1]


def test_plan_fits_80_columns(cli):
    lines = _lines(_run(cli, "plan", "zebra_mamba_8B_hybrid"))
    _whole(["embedding", "final norm", "output layer"], lines)


def test_helper_wraps_values_and_keeps_keys_whole():
    from rich.console import Console

    key = "model.mla.yarn.original_max_position_embeddings"
    t = _tables.table("t", [("key", "key"), ("value", "value"), ("n", "number")])
    t.add_row(_tables.text(key), _tables.text("word " * 40, "recipes/x.yaml:3"), "123456")
    console = Console(width=WIDTH, record=True, file=io.StringIO())
    console.print(t)
    lines = console.export_text().splitlines()
    assert max(map(len, lines)) <= WIDTH
    _whole([key, "123456"], lines)
    # a value with brackets is printed as it is, not read as rich markup
    t = _tables.table(None, [("value", "value")])
    t.add_row(_tables.text("[bold]x[/bold]"))
    console = Console(width=WIDTH, record=True, file=io.StringIO())
    console.print(t)
    assert "[bold]x[/bold]" in console.export_text()

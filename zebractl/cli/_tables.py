"""Every table zebractl prints, built one way: as wide as the terminal, no wider.

The console is rich's own on stdout: the terminal's width, else ``$COLUMNS``, else 80 columns
(a pipe or a log). A table never asks for more: values wrap (folding a word only when it is longer
than the column), keys and numbers stay whole on one line, and a key is folded only as a last
resort, when the keys alone are wider than the terminal. rich is imported when a table is printed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

Kind = Literal["key", "number", "value"]
"""key: a name to read whole (no wrap); number: right-aligned, no wrap; value: wraps."""


def table(title: str | None, columns: list[tuple[str, Kind]]) -> Table:
    """A table with ``columns`` as (header, kind) pairs, title on the left."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for header, kind in columns:
        if kind == "value":
            t.add_column(header, overflow="fold")
        else:
            t.add_column(
                header,
                no_wrap=True,
                overflow="fold",
                justify="right" if kind == "number" else "left",
            )
    return t


def text(value: str, source: str | None = None) -> Text:
    """A cell taken literally (no rich markup: a value may hold brackets), with its source dimmed
    on a line of its own under it."""
    from rich.text import Text

    cell = Text(value)
    if source is not None:
        cell.append("\n(" + source + ")", style="dim")
    return cell


def console() -> Console:
    """stdout as rich sees it: the terminal's width (``$COLUMNS``, else 80, off a terminal)."""
    from rich.console import Console

    return Console()


def show(t: Table) -> None:
    """Print one table on stdout, fitted to the width."""
    console().print(t)

"""Terminal tables that fit: the columns that fit the width, every cell whole,
and the names of the columns left out (summarize, tensors).  A pipe or a file
gets every column (width None)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["terminal_width", "fit", "rich_table", "console"]


def terminal_width(wide: bool = False) -> int | None:
    """The terminal's width, or None (every column) for a pipe, a file or --wide."""
    if wide or not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size((200, 24)).columns


def console(width: int | None) -> Any:
    """A console as wide as the table needs when every column is shown (the
    terminal wraps long lines; rich would otherwise squeeze cells into "...")."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, width=10_000 if width is None else width)


def fit(cols: dict[str, list[str]], headers: dict[str, str], width: int | None,
        droppable: Sequence[str]) -> tuple[list[str], list[str]]:
    """(shown, hidden): the columns to show at `width`, leaving out the ones in
    `droppable` (first named, first dropped) until the table fits."""
    def need(names: list[str]) -> int:  # rich's heavy-head box: 3 per column, 1 border
        return sum(max([len(headers.get(n, n))] + [len(c) for c in cols[n]]) + 3
                   for n in names) + 1

    shown = list(cols)
    hidden: list[str] = []
    if width is not None:
        queue = [d for d in droppable if d in cols]
        while need(shown) > width and queue:
            m = queue.pop(0)
            shown.remove(m)
            hidden.append(m)
    return shown, hidden


def rich_table(title: str, cols: dict[str, list[str]], shown: Sequence[str], *,
               headers: dict[str, str] | None = None, left: Sequence[str] = (),
               width: int | None = None) -> Any:
    """A rich Table of the `shown` columns (names are text, never rich markup)."""
    from rich.table import Table
    from rich.text import Text

    from profiler.formats.raw import printable

    headers = headers or {}
    t = Table(title=Text(printable(title)), title_justify="left")
    for name in shown:
        t.add_column(headers.get(name, name), justify="left" if name in left else "right",
                     no_wrap=width is None, overflow="fold")
    n = len(cols[shown[0]]) if shown else 0
    for i in range(n):
        t.add_row(*(Text(cols[c][i]) for c in shown))
    return t

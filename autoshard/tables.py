"""Terminal tables through `rich.table`: columns sized to their widest cell, so they never run
together and headers are never cut. On a terminal the table wraps its widest columns to the
terminal's width; into a pipe or a file nothing wraps (one row per line, for grep and diff), and
no colour or markup is written. Cells are plain text (`[tp4]` stays `[tp4]`)."""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast

from rich.console import Console
from rich.table import Table
from rich.text import Text

Justify = Literal["left", "right", "center"]
Column = str | tuple[str, str]  # a header, or (header, "left" | "right" | "center")
UNWRAPPED_WIDTH = 100_000  # columns of a table written into a pipe or file: no row wraps


def table_text(columns: Sequence[Column], rows: Iterable[Sequence[Any]], *,
               indent: int = 0, width: int | None = None) -> str:
    """The table as text, lines right-stripped, ending with a newline. `columns`: a header, or
    (header, justify); `width`: the terminal's when stdout is one, else unwrapped."""
    table = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1))
    for col in columns:
        header, justify = (col, "left") if isinstance(col, str) else col
        table.add_column(Text(header), justify=cast(Justify, justify), overflow="fold")
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    if width is None:
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else UNWRAPPED_WIDTH
    buf = io.StringIO()
    Console(file=buf, width=max(20, width - indent), color_system=None, highlight=False, emoji=False,
            markup=False, soft_wrap=False).print(table)
    pad = " " * indent
    return "".join(pad + line.rstrip() + "\n" for line in buf.getvalue().splitlines())

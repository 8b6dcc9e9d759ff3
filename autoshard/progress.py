"""Live progress of a solve on stderr (rich): configurations visited, the incumbent step time,
the proven bound and the gap. Quiet when stderr is not a terminal or with `--quiet`, so that
logs and pipes get nothing but the result.

    with solve_progress(quiet=False, label="llama3-70b") as progress:
        sol = solve(problem, progress=progress)     # progress is None when quiet
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, Callable, TextIO
import shutil


def wanted(quiet: bool) -> bool:
    """Progress is drawn only on a terminal (stderr), and never with --quiet."""
    return not quiet and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


class TerminalLine:
    """Base of the stderr `progress` callbacks of `batch` (ProgressBar) and `whatif` (ProgressLine):
    the stream (stderr unless given), whether it is a terminal, the start time, and a line left
    open (`pending`) that `close` ends."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False
        self.t0 = time.monotonic()
        self.pending = False  # a terminal line without its newline

    def close(self, erase: bool = False) -> None:
        """End a line left open (after an interrupt), so that the next message starts on its own; or,
        with `erase`, wipe it (a summary follows)."""
        if self.pending:
            try:
                self.stream.write("\r\x1b[K" if erase else "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self.pending = False

    def show(self, text: str) -> None:
        """Redraw the open line with `text`, cut to the terminal's width."""
        cols = shutil.get_terminal_size((80, 24)).columns
        try:
            self.stream.write("\r" + text[:max(10, cols - 1)] + "\x1b[K")
            self.stream.flush()
            self.pending = True
        except (OSError, ValueError):
            pass


def status_text(event: dict[str, Any]) -> str:
    """The solve's phase as it happens: `candidates: enumerating`, `bounds 405,956 configurations`,
    `warm start ...`, `search 1,024/27,512 configurations  best 4.925 s  bound 4.920 s  gap 0.10%`,
    `CP-SAT 1,030/27,512 ...` (after each round of CP-SAT descents: the incumbent and the gap), and
    the work spent so far (deterministic units)."""
    inc, lb, gap = event.get("incumbent_s"), event.get("bound_s"), event.get("gap")
    phase, total = event.get("phase", ""), event.get("total", 0)
    if phase == "candidates":
        return "candidates: enumerating the declared space"
    if phase == "bounds":
        return f"bounds: {total:,} configurations (numpy time and memory bounds)"
    parts = [f"{phase} {event.get('visited', 0):,}/{total:,} configurations"]
    parts.append(f"best {inc:.3f} s" if inc is not None else "no plan yet")
    if lb is not None:
        parts.append(f"bound {lb:.3f} s")
    if gap is not None:
        parts.append(f"gap {100 * gap:.2f}%")
    if event.get("work_s") is not None:
        parts.append(f"work {event['work_s']:.1f}")
    return "  ".join(parts)


@contextlib.contextmanager
def solve_progress(quiet: bool = False, label: str = "solve") -> Iterator[Callable[[dict[str, Any]], None] | None]:
    """A `progress` callback for `solve` drawing one live line on stderr, or None when quiet."""
    if not wanted(quiet):
        yield None
        return
    from rich.console import Console  # noqa: PLC0415  (only on a terminal)
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    bar = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                   TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task(label, total=None, status="starting")

    def update(event: dict[str, Any]) -> None:
        total = event.get("total") or None
        bar.update(task, total=total, completed=min(event.get("visited", 0), total or 0),
                   status=status_text(event))

    with bar:
        yield update

"""Exceptions that carry what a user needs to fix their input.

`InputError` is bad input (exit code 2): it names the file, the field path and
what is wrong, in one line. `InfeasibleError` is a well-formed problem that has
no plan fitting the hardware (exit code 1): it names the binding constraint and
the smallest change that would make it feasible.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AutoshardError(Exception):
    """Base class of every error autoshard raises on purpose."""


class InputError(AutoshardError, ValueError):
    """Malformed input: one line, `file: field.path: what is wrong`."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.message = message
        self.source = source
        self.field = field
        super().__init__(self.line())

    def line(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        text = ": ".join([*parts, self.message])
        # One line whatever a file name or a quoted value holds.
        return text.replace("\r", "\\r").replace("\n", "\\n")

    def at(self, source: str | None) -> "InputError":
        """The same error, attributed to a file (if it was not already)."""
        if self.source or not source:
            return self
        return InputError(self.message, source=source, field=self.field)


class InternalError(AutoshardError):
    """Not the input's fault: every option of a what-if study failed for reasons other than bad input
    (a bug, a worker process that died). The command line exits 3 for it, as for any other bug."""


class InfeasibleError(AutoshardError):
    """No plan in the declared space fits: `reason` is the binding constraint,
    `suggestions` the smallest changes that fix it; `memory`: HBM is what binds (a plan exists that
    does not fit), not the space or the framework's rules."""

    def __init__(self, reason: str, suggestions: Iterable[str] = (), memory: bool = False):
        self.reason = reason
        self.suggestions = list(suggestions)
        self.memory = memory
        text = reason
        if self.suggestions:
            text += "; to fix: " + "; or ".join(self.suggestions)
        super().__init__(text)


def closest(name: str, valid: Iterable[str], n: int = 3) -> str:
    """`(closest: a, b)` for an unknown name, or the full list when nothing is close."""
    valid = sorted(set(valid))
    close = difflib.get_close_matches(name.lower(), valid, n=n, cutoff=0.4)
    if close:
        return "closest: " + ", ".join(close)
    return "valid: " + ", ".join(valid)


def is_input_overflow(exc: BaseException) -> bool:
    """An integer overflow inside the solver: a size from the input too large to represent (exit 2, bad
    input), unlike any other failure of the solver or the code (exit 3, internal)."""
    return "overflow" in str(exc).lower()

"""Moved: the what-if report is `autoshard.whatif.report` (kept here so `from autoshard.report import
write_report` still works)."""

from .whatif.report import *  # noqa: F403
from .whatif.report import money, write_report  # noqa: F401

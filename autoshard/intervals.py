"""Prediction intervals: moved to `autoshard.cost.intervals` (the fit and the lookup, which the cost
model uses) and `autoshard.solver.robust` (the robust pick, which uses the solver's records).
This module re-exports both for existing callers."""

from __future__ import annotations

from .cost.intervals import (  # noqa: F401
    COMM_KEYS,
    COMM_SHARE,
    DATA_PATH,
    MIN_RUNS,
    PIPE_KEYS,
    PIPELINE_SHARE,
    QUANTILES,
    REGIMES,
    fit_intervals,
    interval,
    interval_source,
    overlaps,
    quantile,
    quantiles_of,
    regime,
    residuals,
    table,
    upper,
    with_interval,
    write_intervals,
)
from .solver.robust import robust_choice  # noqa: F401

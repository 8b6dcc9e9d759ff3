"""Prediction intervals of step times, from the validation residuals by regime.

Every `Estimate` that `evaluate` returns carries `step_time_interval_s = (low, high)`:
the predicted step time times the 10th and 90th percentiles of measured / predicted over the
published runs of the same regime (`validation/dev_runs.json` and
`modern_runs_dev.json`), so about 80% of such runs measured inside it. The quantiles live in
`autoshard/data/intervals.yaml`, written by `python benchmarks/bench_fidelity.py
--write-intervals` with the date and the files they came from; re-run it after every cost-model
change (the residuals are the model's).

Regimes, read from the estimate's time breakdown (seconds per step on the critical path):

- `moe`: the model has experts (all-to-all, grouped GEMMs and routing dominate what the model
  gets wrong);
- `pipeline-bound`: the pipeline bubble and PP sends are at least 8% of the step;
- `communication-bound`: exposed TP, CP, EP, ZeRO-3 and DP communication are at least 10% of the step;
- `compute-bound`: the rest.

The shares are low because published runs are tuned: on the dev and modern runs the exposed
communication is 0-24% of the step and the bubble 0-46%; 8% and 10% split them into groups of
10-20 runs whose errors differ. A regime with fewer than `MIN_RUNS` residuals uses the quantiles
of all runs (`all`). Because an interval is the predicted time times factors of its regime, plans
of one regime keep their order under `solve --robust`; the robust choice differs where the
alternatives fall in regimes the model gets differently wrong.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import statistics
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..fileio import atomic_write

REGIMES = ("compute-bound", "communication-bound", "pipeline-bound", "moe")
QUANTILES = (0.10, 0.90)  # an 80% interval
MIN_RUNS = 5
PIPELINE_SHARE = 0.08
COMM_SHARE = 0.10
COMM_KEYS = ("tp_comm", "cp_comm", "ep_comm", "zero3_comm", "dp_comm")
PIPE_KEYS = ("pipeline_bubble", "pp_comm")
DATA_PATH = Path(__file__).resolve().parents[1] / "data" / "intervals.yaml"


def regime(breakdown: Mapping[str, float], step_time_s: float, moe: bool) -> str:
    """The regime of an estimate (see the module docstring)."""
    if moe:
        return "moe"
    if step_time_s <= 0:
        return "compute-bound"
    if sum(breakdown.get(k, 0.0) for k in PIPE_KEYS) >= PIPELINE_SHARE * step_time_s:
        return "pipeline-bound"
    if sum(breakdown.get(k, 0.0) for k in COMM_KEYS) >= COMM_SHARE * step_time_s:
        return "communication-bound"
    return "compute-bound"


def quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(ratios: list[float]) -> dict[str, Any]:
    return {"n": len(ratios), "low": round(quantile(ratios, QUANTILES[0]), 4),
            "median": round(statistics.median(ratios), 4), "high": round(quantile(ratios, QUANTILES[1]), 4)}


def residuals(reports: Iterable[Any]) -> list[tuple[str, float]]:
    """(regime, measured / predicted) of every evaluated run of validation reports."""
    out = []
    for rep in reports:
        for r in rep.results:
            out.append((regime(r.time_breakdown_s, r.predicted_step_s, r.moe), r.measured_step_s / r.predicted_step_s))
    return out


def _file_id(path: str) -> str:
    p = Path(path)
    try:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    except OSError:
        return p.name
    return f"{p.name} (sha256 {digest})"


def fit_intervals(reports: list[Any]) -> dict[str, Any]:
    """The intervals document: per regime n, low/median/high of measured / predicted."""
    res = residuals(reports)
    doc: dict[str, Any] = {
        "written_by": "python benchmarks/bench_fidelity.py --write-intervals",
        "date": _dt.date.today().isoformat(),
        "sources": [_file_id(r.runs_path) for r in reports],
        "quantiles": list(QUANTILES),
        "definition": ("ratio = measured / predicted step time over the runs evaluated from the sources; "
                       "interval = predicted x [low, high]; regime from the estimate's time breakdown "
                       "(autoshard/cost/intervals.py)"),
        "regimes": {},
    }
    for name in REGIMES:
        ratios = [x for g, x in res if g == name]
        if ratios:
            doc["regimes"][name] = _stats(ratios)
    doc["regimes"]["all"] = _stats([x for _, x in res])
    return doc


def write_intervals(doc: Mapping[str, Any], path: str | Path = DATA_PATH) -> None:
    head = ("# Prediction intervals of step times: quantiles of measured / predicted by regime.\n"
            "# Written by `python benchmarks/bench_fidelity.py --write-intervals`; do not edit by hand,\n"
            "# re-run it after every cost-model change (see autoshard/cost/intervals.py).\n")

    atomic_write(path, head + yaml.safe_dump(dict(doc), sort_keys=False))


@functools.cache
def table() -> dict[str, Any] | None:
    """The bundled intervals document, or None when there is none."""
    try:
        text = resources.files("autoshard.data").joinpath("intervals.yaml").read_text(encoding="utf-8")
    except (OSError, FileNotFoundError):
        return None
    doc = yaml.safe_load(text)
    return doc if isinstance(doc, dict) and isinstance(doc.get("regimes"), dict) else None


def quantiles_of(regime_name: str, doc: Mapping[str, Any] | None = None) -> tuple[str, Mapping[str, Any]] | None:
    """(name, quantiles) of the residuals an interval in `regime_name` takes: the regime's own, or all
    runs' when the regime has too few."""
    doc = table() if doc is None else doc
    if doc is None:
        return None
    regs = doc["regimes"]
    q = regs.get(regime_name)
    if q is not None and q.get("n", 0) >= MIN_RUNS:
        return regime_name, q
    return ("all", regs["all"]) if regs.get("all") is not None else None


def interval(step_time_s: float, regime_name: str, doc: Mapping[str, Any] | None = None) -> tuple[float, float] | None:
    """predicted x [low, high] of the regime (or of all runs when the regime has too few)."""
    got = quantiles_of(regime_name, doc)
    if got is None or not step_time_s > 0:
        return None
    q = got[1]
    return (step_time_s * float(q["low"]), step_time_s * float(q["high"]))


def interval_source(estimate: Any, moe: bool) -> str | None:
    """Which validation runs an estimate's interval comes from, in words: its regime (the module
    docstring) and how many runs fall in it."""
    got = quantiles_of(regime(estimate.time_breakdown_s, estimate.step_time_s, moe))
    if got is None:
        return None
    name, q = got
    label = {"moe": "MoE"}.get(name, name)
    return f"the {q.get('n', 0)} {label} validation runs" if name != "all" else f"all {q.get('n', 0)} validation runs"


def with_interval(estimate: Any, moe: bool) -> Any:
    """The estimate with `step_time_interval_s` filled (unchanged when it has no step time)."""
    if not estimate.step_time_s > 0 or not estimate.fits and not estimate.stages:
        return estimate
    iv = interval(estimate.step_time_s, regime(estimate.time_breakdown_s, estimate.step_time_s, moe))
    return estimate if iv is None else estimate.model_copy(update={"step_time_interval_s": iv})


def overlaps(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    """Whether two intervals overlap (the model cannot tell the two plans apart)."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def upper(estimate: Any) -> float:
    """The upper end of an estimate's interval (its step time when it has none)."""
    iv = getattr(estimate, "step_time_interval_s", None)
    return iv[1] if iv else estimate.step_time_s

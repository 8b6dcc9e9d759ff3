"""Fit the catalog's efficiency factors to measured runs: `calibrate(measurements, out)`.

The runs file has the shape of `validation/dev_runs.json` (a JSON list of rows) or
is a CSV with the same column names; rows become cases through `validate.run_to_case`.
The result is a catalog overlay (YAML `gpus: {<gpu id>: {efficiency: {...}}}`) that a
problem uses with `cluster: {catalog: my-catalog.yaml}`.

Procedure (deterministic: fixed grid, fixed iteration counts, fixed order):

1. Per GPU type (catalog id, sorted), the cases of that GPU whose plan is valid and fits
   in memory (a plan that does not fit is not what ran: fitting it would bend the factors
   to explain a different configuration).
2. Start point: the base catalog's factors (the built-in catalog, or `base_catalog`, an
   overlay file).
3. Identification: the elasticity of every run's predicted step time to every factor,
   d log(step) / d log(factor), by a finite difference of 10 %. In the fixed order
   matmul.<precision> (bf16, then fp8), hbm, scaleup, scaleout, a factor is fitted when
   the part of its elasticity column that the factors chosen before it cannot reproduce
   (least-squares residual) has an RMS over the runs of at least 0.02 and at least 25 % of
   the column's norm; otherwise the runs cannot tell it apart from the others and it keeps
   its base value. matmul.fp8 needs fp8 runs. At most one factor per two runs is fitted
   (at least one), so a handful of runs cannot be matched exactly by as many factors.
4. Objective: sum over the runs of (log(predicted step / measured step))^2.
   With `common_ratio` (`autoshard calibrate --common-ratio`), the first candidate is the common
   step-level ratio: one number multiplying every candidate factor (each capped at 1.0), so every
   GPU-bound term of every run moves by the same ratio; then, up to the limit (one per two runs, plus
   `extra_terms`), the factor whose elasticity the chosen ones reproduce least (for two runs: the
   factor whose elasticity differs most between them: a network factor when they differ mainly in
   communication, the matmul factor when in computation), if it passes the same test. Two runs then
   fit the ratio alone: what they measure best. The ratio is searched on [0.2, 2.0]; a factor it takes
   below 0.2 is warned (the runs are slower than any efficiency can explain: a term the cost model does
   not price for them, such as host time).
5. Coordinate descent, 3 sweeps over the chosen factors in that order; each factor is
   minimized alone on a 17-point log-spaced grid over [0.2, 1.0], then by 12 golden-section
   steps on log(factor) between the grid neighbours of the best grid point.
6. The factors are rounded to 4 decimals, written atomically with a header stating the
   procedure, the runs used and the factors before/after, and the "after" errors are those
   of the written file.

Every trial writes a fresh overlay file in a temporary directory (the overlay cache keys on
path and modification time) and points the problems at it through `cluster.catalog`.
"""

from __future__ import annotations

import dataclasses

import math
import os
import statistics
import tempfile
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from .errors import InputError
from .fileio import atomic_write, guard_output
from .validate import Case, completed_plan, convert, load_runs, with_catalog
from .catalog import get_gpu, load_overlay
from .cost import evaluate

LO, HI = 0.2, 1.0
GRID_POINTS = 17
GOLDEN_STEPS = 12
SWEEPS = 3
FD_STEP = 0.9  # finite-difference factor for the elasticities
MIN_RESIDUAL_RMS = 0.02
MIN_RESIDUAL_SHARE = 0.25
RUNS_PER_FACTOR = 2  # at most one fitted factor per two runs (at least one)
DECIMALS = 4
FACTOR_ORDER = ("matmul.bf16", "matmul.fp8", "hbm", "scaleup", "scaleout")
# The README's range for achievable network bandwidth (NCCL-like: 0.75-0.85 of the link rate); a fitted
# scale-up / scale-out factor outside it is reported as a warning (`network_warnings`).
NETWORK_RANGE = (0.75, 0.85)
NETWORK_FACTORS = ("scaleup", "scaleout")
# The common step-level ratio (`common_ratio=True`): one number that multiplies every efficiency factor
# the runs may fit (each capped at 1.0), so every GPU-bound term of every plan moves by the same ratio;
# what two trial runs of one model on one cluster measure best. Searched on this range (a ratio below
# LO / factor takes a factor below LO: warned, as a factor at its bound).
STEP = "step"
STEP_LO, STEP_HI = 0.2, 2.0


@dataclass
class ErrorSummary:
    n: int
    median_abs_error_pct: float
    worst_id: str
    worst_error_pct: float


@dataclass
class GpuFit:
    gpu: str
    runs: list[str]
    fitted: list[str]  # factors fitted, in order
    kept: dict[str, str]  # factor -> why it kept its base value
    elasticity_rms: dict[str, float]  # RMS over runs of d log step / d log factor
    before: dict[str, Any]  # efficiency mapping (Efficiency fields)
    after: dict[str, Any]
    objective_before: float
    objective_after: float
    warnings: list[str] = field(default_factory=list)
    step_ratio: float = 1.0  # the common ratio fitted (`common_ratio`), already applied in `after`


@dataclass
class CalibrationResult:
    out_path: str
    measurements_path: str
    runs_used: list[str]
    excluded: list[dict[str, str]]  # {id, reason}
    fits: list[GpuFit]
    before: ErrorSummary
    after: ErrorSummary
    errors_before_pct: dict[str, float] = field(default_factory=dict)  # run id -> signed error %
    errors_after_pct: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """What `autoshard calibrate` prints: factors and errors before / after."""
        lines = [f"calibrated on {len(self.runs_used)} runs ({len(self.excluded)} excluded); wrote {self.out_path}"]
        for f in self.fits:
            lines.append(f"  {f.gpu}: fitted {', '.join(f.fitted) or 'nothing'}"
                         + (f" (common ratio {f.step_ratio:g})" if STEP in f.fitted else ""))
            lines.append(f"    before {f.before}")
            lines.append(f"    after  {f.after}")
        b, a = self.before, self.after
        lines.append(f"median |error| {b.median_abs_error_pct:.1f}% -> {a.median_abs_error_pct:.1f}%; "
                     f"worst {b.worst_id} {b.worst_error_pct:+.1f}% -> {a.worst_id} {a.worst_error_pct:+.1f}%")
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def _get(eff: dict[str, Any], name: str) -> float:
    if name.startswith("matmul."):
        return float(eff["matmul"][name.split(".", 1)[1]])
    return float(eff[name])


def _set(eff: dict[str, Any], name: str, value: float) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in eff.items()}
    if name.startswith("matmul."):
        out["matmul"][name.split(".", 1)[1]] = value
    else:
        out[name] = value
    return out


def base_efficiencies(base_catalog: str | None) -> dict[str, dict[str, Any]]:
    """The entries of the base overlay file as plain dicts ({} for the built-in catalog)."""
    if base_catalog is None:
        return {}
    return {gid: e.model_dump() for gid, e in load_overlay(base_catalog).items()}


def efficiency_of(gpu: str, base: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if gpu in base:
        return _copy(base[gpu])
    return get_gpu(gpu).efficiency.model_dump()


def _copy(eff: dict[str, Any]) -> dict[str, Any]:
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in eff.items()}


def _overlay_text(entries: dict[str, dict[str, Any]]) -> str:
    doc = {"gpus": {g: {"efficiency": _copy(e)} for g, e in sorted(entries.items())}}
    return yaml.safe_dump(doc, sort_keys=True, default_flow_style=False)


class _Trials:
    """Evaluates cases under trial efficiency factors through fresh overlay files."""

    def __init__(self, tmpdir: str, cases: list[Case]):
        self.dir = Path(tmpdir)
        self.cases = cases
        self.count = 0

    def steps(self, gpu: str, eff: dict[str, Any]) -> np.ndarray:
        self.count += 1
        path = self.dir / f"trial-{self.count:06d}.yaml"
        path.write_text(_overlay_text({gpu: eff}), encoding="utf-8")
        out = []
        for c in self.cases:
            est = evaluate(with_catalog(c, path).problem, c.plan)
            out.append(est.step_time_s)
        return np.array(out, dtype=float)

    def objective(self, gpu: str, eff: dict[str, Any], measured: np.ndarray) -> float:
        s = self.steps(gpu, eff)
        if not np.all(s > 0):
            return math.inf
        return float(np.sum(np.log(s / measured) ** 2))


def _compose(eff0: dict[str, Any], params: dict[str, float], scaled: tuple[str, ...]) -> dict[str, Any]:
    """The efficiency mapping of a trial: `params` (factor -> value) set on `eff0`, then every factor of
    `scaled` multiplied by the common ratio `params[STEP]` (absent: 1) and capped at HI."""
    eff = _copy(eff0)
    for name, v in params.items():
        if name != STEP:
            eff = _set(eff, name, v)
    ratio = params.get(STEP, 1.0)
    if ratio != 1.0:
        for name in scaled:
            eff = _set(eff, name, min(HI, _get(eff, name) * ratio))
    return eff


def _identify(trials: _Trials, gpu: str, eff: dict[str, Any], candidates: list[str], *,
              scaled: tuple[str, ...] = (), by_elasticity: bool = False,
              extra_terms: int = 0) -> tuple[list[str], dict[str, str], dict[str, float]]:
    """Factors the runs can identify (see module docstring, step 3). `STEP` among the candidates is the
    common ratio over `scaled`. `by_elasticity`: after the candidates that lead (the common ratio), the
    next factor is the one whose elasticity the factors chosen so far reproduce least (the largest
    independent residual: for two runs, the factor whose elasticity differs most between them), not
    the next in FACTOR_ORDER. `extra_terms`: factors allowed beyond one per RUNS_PER_FACTOR runs."""
    s0 = trials.steps(gpu, eff)
    cols: dict[str, np.ndarray] = {}
    for name in candidates:
        if name == STEP:
            s = trials.steps(gpu, _compose(eff, {STEP: FD_STEP}, scaled))
            cols[name] = (np.log(s) - np.log(s0)) / math.log(FD_STEP)
            continue
        v = _get(eff, name)
        trial = v * FD_STEP if v * FD_STEP >= LO else min(HI, v / FD_STEP)
        s = trials.steps(gpu, _set(eff, name, trial))
        cols[name] = (np.log(s) - np.log(s0)) / math.log(trial / v)
    chosen: list[str] = []
    kept: dict[str, str] = {}
    n = len(s0)
    limit = max(1, n // RUNS_PER_FACTOR) + extra_terms

    def residual(name: str) -> tuple[float, float]:
        col = cols[name]
        if chosen:
            basis = np.stack([cols[c] for c in chosen], axis=1)
            coef, *_ = np.linalg.lstsq(basis, col, rcond=None)
            resid = col - basis @ coef
        else:
            resid = col
        return (float(np.linalg.norm(resid) / math.sqrt(n)),
                float(np.linalg.norm(resid) / max(float(np.linalg.norm(col)), 1e-300)))

    todo = list(candidates)
    while todo:
        if by_elasticity and chosen:  # the most independent of the rest; ties by FACTOR_ORDER
            scores = {name: residual(name) for name in todo}
            name = max(todo, key=lambda k: (scores[k][0] if scores[k][1] >= MIN_RESIDUAL_SHARE else -1.0,
                                            -todo.index(k)))
        else:
            name = todo[0]
        todo.remove(name)
        rms, share = residual(name)
        if len(chosen) >= limit:
            kept[name] = f"{n} runs identify at most {limit} factor(s)"
        elif rms >= MIN_RESIDUAL_RMS and share >= MIN_RESIDUAL_SHARE:
            chosen.append(name)
        else:
            kept[name] = (f"not identified by these runs (independent elasticity RMS {rms:.3f}, "
                          f"{share:.0%} of its column)")
    rms_all = {k: float(np.linalg.norm(v) / math.sqrt(n)) for k, v in cols.items()}
    return chosen, kept, rms_all


def _minimize_factor(f, lo: float = LO, hi: float = HI) -> float:
    """Minimize f(x) for x in [lo, hi]: log grid, then golden section on log x."""
    grid = [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (GRID_POINTS - 1))
            for i in range(GRID_POINTS)]
    vals = [f(x) for x in grid]
    best = min(range(GRID_POINTS), key=lambda i: (vals[i], i))
    a = math.log(grid[max(0, best - 1)])
    b = math.log(grid[min(GRID_POINTS - 1, best + 1)])
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    x, fx = (math.exp(c), fc) if fc <= fd else (math.exp(d), fd)
    if vals[best] < fx:
        x = grid[best]
    return min(hi, max(lo, x))


def _summary(errs: dict[str, float]) -> ErrorSummary:
    if not errs:
        return ErrorSummary(0, math.nan, "", math.nan)
    worst = max(errs, key=lambda k: (abs(errs[k]), k))
    return ErrorSummary(len(errs), statistics.median(abs(v) for v in errs.values()), worst, errs[worst])


def _errors(cases: list[Case], catalog: str | None) -> dict[str, float]:
    out = {}
    for c in cases:
        est = evaluate(with_catalog(c, catalog).problem, c.plan)
        out[c.id] = (est.step_time_s - c.measured_step_s) / c.measured_step_s * 100.0
    return out


# ---------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------


def network_warnings(result: CalibrationResult) -> list[str]:
    """One line when fitted network efficiencies (scaleup / scaleout) fall outside NETWORK_RANGE, the
    NCCL-like range the README states; [] otherwise (factors kept at their base values are not checked)."""
    lo, hi = NETWORK_RANGE
    off = []
    for fit in result.fits:
        vals = [f"{n} {_get(fit.after, n):.3g}" for n in NETWORK_FACTORS
                if n in fit.fitted and not lo <= _get(fit.after, n) <= hi]
        if vals:
            off.append(f"{fit.gpu} {', '.join(vals)}")
    if not off:
        return []
    return [f"fitted network efficiencies outside the NCCL-like range {lo:g}-{hi:g} of the link rate (README): "
            f"{'; '.join(off)}; the fit is likely absorbing a term the cost model misprices (overlap, stragglers, "
            "the topology) rather than measuring the network: check those runs before using the overlay"]


def calibrate(measurements_path: str | os.PathLike[str], out_path: str | os.PathLike[str], *,
              base_catalog: str | os.PathLike[str] | None = None, verbose: bool = False,
              progress: Callable[[str], None] | None = None, cases: list[Case] | None = None,
              keep_factors: tuple[str, ...] = (), common_ratio: bool = False,
              extra_terms: int = 0) -> CalibrationResult:
    """Fit per-GPU efficiency factors to measured step times and write a catalog overlay.
    `progress(text)`: called at each stage of the fit (pricing the runs, each factor of each sweep per
    GPU, measuring the result), for a live line on a terminal.
    `cases`: runs already converted (autoshard.artifacts reads them from training logs); then
    `measurements_path` only names them. `keep_factors`: factors measured elsewhere (nccl-tests,
    traces) that keep their base value, whatever the runs identify."""
    def say(text: str) -> None:
        if progress is not None:
            progress(text)

    base_path = str(base_catalog) if base_catalog is not None else None
    base = base_efficiencies(base_path)
    if cases is None:
        guard_output(out_path, [measurements_path, base_path])  # never an input; a read-only or impossible -o
        rows = load_runs(measurements_path)                     # fails before the fit, not after
        cases, skipped = convert(rows)
    else:
        guard_output(out_path, [base_path])
        skipped = []
    say(f"pricing {len(cases)} runs under the base catalog")
    # Runs that do not publish their recompute get it chosen once, under the base catalog;
    # the fit then prices those fixed plans.
    cases = [dataclasses.replace(c, plan=completed_plan(with_catalog(c, base_path)), recompute_published=True)
             for c in cases]
    usable, excluded = _usable(cases, skipped, base_path)
    if not usable:
        raise InputError("no run of the file can be used for calibration "
                         f"({len(excluded)} excluded: {excluded[0]['reason'] if excluded else 'empty'})",
                         source=str(measurements_path))

    by_gpu: dict[str, list[Case]] = {}
    for c in usable:
        by_gpu.setdefault(c.gpu, []).append(c)

    fits: list[GpuFit] = []
    entries: dict[str, dict[str, Any]] = {g: _copy(e) for g, e in base.items()}
    with tempfile.TemporaryDirectory(prefix="autoshard-calibrate-") as tmp:
        for g_i, gpu in enumerate(sorted(by_gpu)):
            fit = _fit_gpu(_Trials(tmp, by_gpu[gpu]), gpu, by_gpu[gpu], efficiency_of(gpu, base),
                           f"GPU {g_i + 1}/{len(by_gpu)} {gpu}", say, keep_factors=keep_factors,
                           common_ratio=common_ratio, extra_terms=extra_terms)
            entries[gpu] = fit.after
            fits.append(fit)

    say(f"measuring the fitted overlay on the {len(usable)} runs")
    errs_before = _errors(usable, base_path)
    result = CalibrationResult(
        out_path=str(out_path), measurements_path=str(measurements_path), runs_used=[c.id for c in usable],
        excluded=excluded, fits=fits, before=_summary(errs_before), after=_summary({}),
        errors_before_pct=errs_before)
    # Measure the overlay as it will be written (a scratch copy: -o may be a pipe or /dev/stdout),
    # then write it once, with the final header.
    with tempfile.TemporaryDirectory(prefix="autoshard-calibrate-") as tmp:
        scratch = Path(tmp) / "overlay.yaml"
        scratch.write_text(_header(result) + _overlay_text(entries), encoding="utf-8")
        result.errors_after_pct = _errors(usable, str(scratch))
    result.after = _summary(result.errors_after_pct)
    _write(out_path, _header(result) + _overlay_text(entries))
    if verbose:
        print(format_calibration(result))
    return result


def _usable(cases: list[Case], skipped: list[Any], base_path: str | None) -> tuple[list[Case], list[dict[str, str]]]:
    """(the runs the fit can use, the excluded ones with their reason): a run whose plan the cost model
    rejects, or that does not fit in memory under the base catalog, is not what ran."""
    excluded: list[dict[str, str]] = [{"id": s.id, "reason": s.reason} for s in skipped]
    usable: list[Case] = []
    for c in cases:
        est = evaluate(with_catalog(c, base_path).problem, c.plan)
        if not est.step_time_s > 0:
            excluded.append({"id": c.id, "reason": "plan rejected by the cost model: " + "; ".join(est.reasons)})
        elif not est.fits:
            excluded.append({"id": c.id, "reason": f"priced plan does not fit in memory (peak "
                                                     f"{est.peak_memory_gib:.1f} GiB): not what ran"})
        else:
            usable.append(c)
    return usable, excluded


def _candidates(eff0: dict[str, Any], precisions: set[str], keep_factors: tuple[str, ...]) -> list[str]:
    """The factors a GPU's runs may determine, in FACTOR_ORDER: a matmul factor only for a precision
    the runs trained in (bf16 always) and the catalog has; none measured elsewhere (`keep_factors`)."""
    candidates = []
    for name in FACTOR_ORDER:
        if name in keep_factors:
            continue
        if name.startswith("matmul."):
            if name.split(".", 1)[1] not in precisions and name != "matmul.bf16":
                continue
            if name.split(".", 1)[1] not in eff0["matmul"]:
                continue
        candidates.append(name)
    return candidates


def _fit_gpu(trials: _Trials, gpu: str, gcases: list[Case], eff0: dict[str, Any], where: str,
             say: Callable[[str], None], *, keep_factors: tuple[str, ...], common_ratio: bool,
             extra_terms: int) -> GpuFit:
    """One GPU's fit: identify the factors its runs determine, fit them by coordinate sweeps (each
    factor a 1-D minimization of the objective), round, keep the start point where the fit is worse,
    and say where a factor ends at its bound."""
    say(f"{where}: which factors its {len(gcases)} runs determine")
    measured = np.array([c.measured_step_s for c in gcases])
    candidates = _candidates(eff0, {c.precision for c in gcases}, keep_factors)
    scaled = tuple(candidates)
    if common_ratio:
        candidates = [STEP, *candidates]
    chosen, kept, rms = _identify(trials, gpu, eff0, candidates, scaled=scaled,
                                  by_elasticity=common_ratio, extra_terms=extra_terms)
    for name in FACTOR_ORDER:
        if name in keep_factors:
            kept[name] = "measured from the artifacts (kept as given)"
        elif name not in candidates:
            kept[name] = "no runs of this precision" if name.startswith("matmul.") else "not a candidate"
    params = {name: (1.0 if name == STEP else _get(eff0, name)) for name in chosen}
    obj0 = trials.objective(gpu, eff0, measured)
    for sweep in range(SWEEPS):
        for name in chosen:
            say(f"{where}: sweep {sweep + 1}/{SWEEPS}, fitting {name}")
            current = dict(params)

            def f(x: float, name: str = name, current: dict = current) -> float:
                return trials.objective(gpu, _compose(eff0, {**current, name: x}, scaled), measured)

            params[name] = (_minimize_factor(f, STEP_LO, STEP_HI) if name == STEP else _minimize_factor(f))
    params = {k: round(v, DECIMALS) for k, v in params.items()}
    eff = _compose(eff0, params, scaled)
    for name in scaled if STEP in params else chosen:
        eff = _set(eff, name, round(_get(eff, name), DECIMALS))
    obj1 = trials.objective(gpu, eff, measured)
    if obj1 > obj0:  # never write something worse than the start point
        eff, obj1, params = _copy(eff0), obj0, {k: (1.0 if k == STEP else _get(eff0, k)) for k in params}
    warnings = _bound_warnings(eff, params, chosen, scaled)
    return GpuFit(gpu=gpu, runs=[c.id for c in gcases], fitted=chosen,
                  kept={k: kept[k] for k in FACTOR_ORDER if k in kept}, elasticity_rms=rms,
                  before=eff0, after=eff, objective_before=obj0, objective_after=obj1,
                  warnings=warnings, step_ratio=params.get(STEP, 1.0))


def _bound_warnings(eff: dict[str, Any], params: dict[str, float], chosen: list[str],
                    scaled: tuple[str, ...]) -> list[str]:
    """Warnings where a fitted factor, or the common ratio, ends at the bound of its search, or the
    ratio takes factors below the physical range."""
    warnings = [f"{name} = {_get(eff, name):g} is at the bound of the search [{LO}, {HI}]: the fit may be "
                "compensating a term the cost model misprices rather than measuring this efficiency"
                for name in chosen if name != STEP and min(_get(eff, name) - LO, HI - _get(eff, name)) < 1e-3]
    ratio = params.get(STEP, 1.0)
    if STEP in params and min(ratio - STEP_LO, STEP_HI - ratio) < 1e-3:
        warnings.append(f"the common ratio {ratio:g} is at the bound of its search [{STEP_LO}, {STEP_HI}]")
    low = [f"{name} {_get(eff, name):.3g}" for name in scaled if STEP in params and _get(eff, name) < LO]
    if low:
        warnings.append(f"the common ratio {ratio:g} takes {', '.join(low)} below {LO}: the measured steps are "
                        "slower than these efficiencies can physically explain; the ratio stands in for a "
                        "term the cost model does not price for these runs (host time, launches, syncs)")
    return warnings


def _write(path: str | os.PathLike[str], text: str) -> None:
    try:
        atomic_write(path, text)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path), field="--output") from None


def _fmt_eff(eff: dict[str, Any]) -> str:
    mm = ", ".join(f"{k} {v:.4g}" for k, v in sorted(eff["matmul"].items()))
    return f"matmul {{{mm}}}, hbm {eff['hbm']:.4g}, scaleup {eff['scaleup']:.4g}, scaleout {eff['scaleout']:.4g}"


def _header(r: CalibrationResult) -> str:
    lines = [
        "autoshard calibrated catalog overlay, written by autoshard.calibrate.",
        "Use it from a problem with `cluster: {catalog: <this file>}`; entries replace the efficiency",
        "factors of the named GPUs (see autoshard/catalog.py).",
        "",
        "Procedure: per GPU type, minimize the sum over runs of (log(predicted / measured step time))^2;",
        f"coordinate descent, {SWEEPS} sweeps in the order {', '.join(FACTOR_ORDER)}; per factor a "
        f"{GRID_POINTS}-point log grid",
        f"on [{LO}, {HI}] then {GOLDEN_STEPS} golden-section steps on log(factor); factors rounded to "
        f"{DECIMALS} decimals.",
        "A factor is fitted only when the runs identify it: the part of its elasticity column",
        f"(d log step / d log factor) not explained by the factors before it has RMS >= {MIN_RESIDUAL_RMS} and",
        f">= {MIN_RESIDUAL_SHARE:.0%} of the column norm, and at most one factor per {RUNS_PER_FACTOR} runs; other "
        "factors keep",
        "their base values. Runs whose priced plan is invalid or does not fit in memory are excluded.",
        *(["Common ratio (--common-ratio): the first factor is one ratio multiplying every candidate factor",
           f"(each capped at {HI}), searched on [{STEP_LO}, {STEP_HI}]; the next is the factor the ratio "
           "reproduces least."] if any(STEP in f.fitted for f in r.fits) else []),
        "",
        f"Measurements: {Path(r.measurements_path).name} ({len(r.runs_used)} runs used, "
        f"{len(r.excluded)} excluded)",
    ]
    for fit in r.fits:
        lines.append(f"{fit.gpu}: {len(fit.runs)} runs:")
        lines.extend(textwrap.wrap(", ".join(fit.runs), width=96, initial_indent="  ", subsequent_indent="  ",
                                   break_on_hyphens=False))
        lines.append(f"  fitted: {', '.join(fit.fitted) or 'none'}"
                     + (f" (common ratio {fit.step_ratio:g})" if STEP in fit.fitted else ""))
        lines.append(f"  before: {_fmt_eff(fit.before)}")
        lines.append(f"  after:  {_fmt_eff(fit.after)}")
        lines.append(f"  sum of squared log errors: {fit.objective_before:.5f} -> {fit.objective_after:.5f}")
        lines.extend(f"  warning: {w}" for w in fit.warnings)
    for e in r.excluded:
        lines.append(f"excluded {e['id']}: {e['reason']}")
    b, a = r.before, r.after
    if a.n:
        lines.append(f"median |error| {b.median_abs_error_pct:.1f}% -> {a.median_abs_error_pct:.1f}%; worst "
                     f"{b.worst_id} {b.worst_error_pct:+.1f}% -> {a.worst_id} {a.worst_error_pct:+.1f}%")
    return "".join(f"# {ln}".rstrip() + "\n" for ln in lines)


def format_calibration(r: CalibrationResult) -> str:
    lines = [f"calibrated catalog written to {r.out_path}"]
    for fit in r.fits:
        lines.append(f"{fit.gpu} ({len(fit.runs)} runs): fitted {', '.join(fit.fitted) or 'nothing'}"
                     + (f" (common ratio {fit.step_ratio:g})" if STEP in fit.fitted else ""))
        lines.append(f"  before: {_fmt_eff(fit.before)}")
        lines.append(f"  after:  {_fmt_eff(fit.after)}")
        for k, why in fit.kept.items():
            lines.append(f"  kept {k}: {why}")
        lines.extend(f"  warning: {w}" for w in fit.warnings)
    if r.excluded:
        lines.append(f"excluded ({len(r.excluded)}):")
        lines.extend(f"  {e['id']}: {e['reason']}" for e in r.excluded)
    b, a = r.before, r.after
    lines.append(f"median |error|: {b.median_abs_error_pct:.1f}% -> {a.median_abs_error_pct:.1f}% (n={a.n})")
    lines.append(f"worst: {b.worst_id} {b.worst_error_pct:+.1f}% -> {a.worst_id} {a.worst_error_pct:+.1f}%")
    return "\n".join(lines)

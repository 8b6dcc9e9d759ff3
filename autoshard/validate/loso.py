"""Leave-one-source-out (LOSO): how well the model predicts a source family it was never fitted to.

    from autoshard.validate.loso import loso, format_loso
    print(format_loso(loso(dev_path, modern_path, ablations_path)))

The unit left out is a **source family**: a row's (or an ablation group's) `source_family` field, the
publication series it comes from (validation/README.md lists them); a row without one falls back to its
`source` up to the first comma (`modern.source_family`). No family is named here: what a family's rows
state is read from them.

Fitted factors (`FACTORS`): the end-to-end matmul factors of autoshard/data/matmul.yaml, one per precision
family (bf16, fp8, fp4) and GPU generation (or every generation), each multiplying the SOURCED GEMM rate of
every GPU it covers (gpus.yaml gemm_achievable, published MAMF, x the sustained-clock fraction under the
GPU's power limit; neither fitted), and the framework factors documented as fitted
(autoshard/data/frameworks.yaml). The rows a factor is fitted on: for a matmul factor, the dev and modern
rows on its GPUs in its precision family; for a framework factor, the dev and modern rows whose predicted
step moves when it moves (a 10% finite difference, as calibrate's identification). A GPU whose rows are
all left out is still priced from its own sourced rate x the factor fitted on the other GPUs of its
generation.

Procedure per factor and set of rows S (calibrate's, reduced so that a whole LOSO runs in about a minute
on two cores, deterministic):
- objective: sum over S of (log(predicted / measured step))^2, as `calibrate`;
- calibrate's 17-point grid (log-spaced on [0.2, 1] for an efficiency; linear on the factor's own range
  for a framework factor), each point priced once for every row (the other factors at their catalog
  values); the golden-section refinement is replaced by a parabola through the best grid point and its
  two neighbours (no further pricing); one sweep instead of three (the rows of different factors barely
  overlap: a matmul factor's rows are its GPUs' rows of its precision);
- S empty (the left-out family held every row of the factor): the factor's prior: for an end-to-end matmul
  factor the geometric mean of the same precision's other end-to-end factors fitted in that fold; for a
  per-GPU matmul factor (the trial structure PER_GPU_FACTORS) the GPU's sourced rate x the geometric mean
  of the others' fitted / sourced ratios; for a framework factor the value without the term (0).
Factors fitted on ablation groups rather than on step times (`Factor.on_ablations`: DeepSpeed's
allocator_overhead on an OOM boundary, Megatron's recompute_module_host_ms on a module ablation) keep
their catalog value unless every group that states it fitted them (the group's `fitted_factors` field,
validation/README.md) belongs to the family left out; then they take their prior.

For each family F: every factor is refitted on its rows outside F, F's rows are priced with all of the
refitted factors together, and F's ablation groups are ranked with them. The in-sample reference is the
same procedure on every row ('refit in-sample'), beside the catalog as shipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import yaml

from ..calibrate import GRID_POINTS, HI, LO  # calibrate's search range and grid
from . import Case, completed_plan, convert, load_runs, p90, with_catalog
from .ablations import group_result, load_groups, summarize_ablations
from .modern import precision_family, source_family
from .. import frameworks as fw
from ..catalog import GemmDtype, _gpus, _matmul_model, end_to_end_factor, get_gpu, matmul_generation
from ..cost import evaluate
from ..frameworks import profiles
from ..tables import Column, table_text

FD = 1.1  # finite-difference step that finds the rows a framework factor moves


@dataclass(frozen=True)
class Factor:
    """One fitted factor: `gpus.<ids>.matmul.<precision>` or `frameworks.<name>.<attribute>`."""

    name: str
    kind: str  # "scaled" (an end-to-end factor over its GPUs' sourced GEMM rates, GPU.sourced_gemm_rate),
    # "matmul" (one GPU group's efficiency itself, the structure before 2026-11-27) or "framework"
    targets: tuple[str, ...] = ()  # matmul: the GPU ids that share the value (the first holds the rows' data)
    precision: str = ""  # matmul / scaled: bf16 / fp8 / fp4
    framework: str = ""  # framework: the profile
    attribute: str = ""  # framework: the FrameworkProfile attribute (in its own unit)
    grid: tuple[float, float] = (LO, HI)  # framework: the linear range searched
    scale: float = 1.0  # framework: the attribute in the unit of `name` (ms -> s: 1e-3)
    on_ablations: bool = False  # fitted on ablation groups (those whose `fitted_factors` name it), not step times
    fitted_on: str = ""  # what the catalog's note says it was fitted on
    generation: str = ""  # scaled: the matmul.yaml generation (or `all`) whose end-to-end factor it is


FRAMEWORK_FACTORS: tuple[Factor, ...] = (
    Factor("megatron moe_layer_host_ms", "framework", framework="megatron", attribute="moe_layer_host_s",
           grid=(0.0, 4.0), scale=1e-3, fitted_on="the 33 Megatron MoE rows (frameworks.yaml)"),
    Factor("megatron moe_expert_host_ms", "framework", framework="megatron", attribute="moe_expert_host_s",
           grid=(0.0, 0.6), scale=1e-3, fitted_on="the 33 Megatron MoE rows (frameworks.yaml)"),
    Factor("megatron ep_overlap_host_factor", "framework", framework="megatron", attribute="ep_overlap_host_factor",
           grid=(0.0, 6.0), fitted_on="one Megatron MoE row with the EP overlap (frameworks.yaml)"),
    Factor("megatron recompute_module_host_ms", "framework", framework="megatron",
           attribute="recompute_module_host_s", grid=(0.0, 1.0), scale=1e-3, on_ablations=True,
           fitted_on="a recompute-module ablation group (frameworks.yaml)"),
    Factor("deepspeed allocator_overhead", "framework", framework="deepspeed", attribute="allocator_overhead",
           grid=(1.0, 1.5), on_ablations=True,
           fitted_on="the OOM boundary of DeepSpeed ablation groups (memory, not step time; frameworks.yaml)"),
)
def _generation_factors() -> tuple[Factor, ...]:
    """The catalog's fitted matmul factors (autoshard/data/matmul.yaml `end_to_end`): one per precision family
    and GPU generation (or `all` generations), each applied to the sourced GEMM rate of every GPU it covers."""
    out = []
    for family, table in _matmul_model()["end_to_end"].items():
        for gen in table:
            ids = tuple(sorted(g.id for g in _gpus().values() if family in g.gemm_achievable
                               and (gen == "all" or matmul_generation(g.arch) == gen)))
            out.append(Factor(f"{gen} end_to_end.{family}", "scaled", ids, str(family), generation=str(gen),
                              fitted_on=f"the {family} rows of {'every GPU' if gen == 'all' else gen + ' GPUs'} "
                                        "(matmul.yaml)"))
    return tuple(out)


# The catalog as shipped (2026-11-27): the end-to-end matmul factors of matmul.yaml over each GPU's sourced
# GEMM rate (gpus.yaml gemm_achievable x clock fraction, not fitted), and the framework factors. A GPU or a
# family left out is predicted from its sourced rate and the factors fitted on the others.
FACTORS: tuple[Factor, ...] = _generation_factors() + FRAMEWORK_FACTORS

# Trial structures measured beside FACTORS by bench_fidelity --markdown (the catalog is not changed by them):
# the structure before 2026-11-27, one free matmul factor per GPU (group) and precision (a factor left without
# rows takes its GPU's sourced rate x the others' fitted / sourced ratio); and one end-to-end factor per
# precision family for every GPU.
PER_GPU_FACTORS_MATMUL: tuple[Factor, ...] = (
    Factor("a100 matmul.bf16", "matmul", ("a100-sxm-80gb", "a100-sxm-40gb"), "bf16",
           fitted_on="the A100 rows (gpus.yaml a100-sxm-80gb)"),
    Factor("hopper matmul.bf16", "matmul", ("h100-sxm", "h100-pcie", "h800-sxm", "h200-sxm", "gh200"), "bf16",
           fitted_on="the H100 bf16 rows (gpus.yaml h100-sxm)"),
    Factor("hopper matmul.fp8", "matmul", ("h100-sxm", "h100-pcie", "h800-sxm", "h200-sxm", "gh200"), "fp8",
           fitted_on="dev + modern fp8 rows (gpus.yaml h100-sxm)"),
    Factor("h100-96gb matmul.bf16", "matmul", ("h100-hbm2e-96gb",), "bf16",
           fitted_on="the H100 96GB rows (gpus.yaml h100-hbm2e-96gb)"),
    Factor("h100-96gb matmul.fp8", "matmul", ("h100-hbm2e-96gb",), "fp8", fitted_on="with the other fp8 factors"),
    Factor("b200 matmul.bf16", "matmul", ("b200", "b100"), "bf16", fitted_on="the B200 bf16 rows"),
    Factor("b200 matmul.fp8", "matmul", ("b200", "b100"), "fp8", fitted_on="with the other fp8 factors"),
    Factor("gb200 matmul.bf16", "matmul", ("gb200",), "bf16", fitted_on="Blackwell bf16 rows"),
    Factor("gb200 matmul.fp8", "matmul", ("gb200",), "fp8", fitted_on="with the other fp8 factors"),
    Factor("gb200 matmul.fp4", "matmul", ("gb200", "b200", "b100"), "fp4",
           fitted_on="the GB200 NVFP4 rows"),
    Factor("b300 matmul.fp8", "matmul", ("b300",), "fp8", fitted_on="the four B300 rows"),
    Factor("gb300 matmul.bf16", "matmul", ("gb300", "b300"), "bf16", fitted_on="B300/GB300 rows"),
    Factor("gb300 matmul.fp8", "matmul", ("gb300",), "fp8", fitted_on="the six GB300 fp8 / mxfp8 rows"),
    Factor("gb300 matmul.fp4", "matmul", ("gb300",), "fp4", fitted_on="GB300 NVFP4 rows"),
)
PER_GPU_FACTORS: tuple[Factor, ...] = PER_GPU_FACTORS_MATMUL + FRAMEWORK_FACTORS
GLOBAL_FACTORS: tuple[Factor, ...] = tuple(
    Factor(f"all end_to_end.{f}", "scaled", tuple(sorted({g for x in FACTORS if x.precision == f for g in x.targets})),
           f, generation="all", fitted_on=f"every {f} row of every GPU") for f in ("bf16", "fp8", "fp4")
) + FRAMEWORK_FACTORS
FRAMEWORK_PRIOR = {"allocator_overhead": 1.0}  # the value without the fitted term; others 0

# ---------------------------------------------------------------------------------------
# Setting factors
# ---------------------------------------------------------------------------------------


def sourced_rate(f: Factor) -> float:
    """A matmul factor's sourced GEMM rate: its first GPU's achievable large-GEMM fraction (gpus.yaml
    gemm_achievable) x its sustained-clock fraction under its power limit; 0 where the GPU states none."""
    return get_gpu(f.targets[0]).sourced_gemm_rate(f.precision) if f.kind == "matmul" else 0.0


def catalog_value(f: Factor) -> float:
    """The factor's value as shipped (in the unit of its name)."""
    if f.kind == "scaled":  # matmul.yaml's end-to-end factor (for `all` over several: the first GPU's)
        gen = f.generation if f.generation != "all" else matmul_generation(get_gpu(f.targets[0]).arch)
        return end_to_end_factor(f.precision, gen)
    if f.kind == "matmul":
        return float(get_gpu(f.targets[0]).efficiency.matmul[cast(GemmDtype, f.precision)])  # (a GEMM dtype)
    return float(getattr(profiles()[f.framework], f.attribute)) / f.scale


class Pricer:
    """Prices cases under trial factor values: matmul factors through a fresh catalog overlay file (the
    overlay cache keys on path), framework factors by swapping the cached profile."""

    def __init__(self, tmpdir: str):
        self.dir = Path(tmpdir)
        self.count = 0

    def overlay(self, values: Mapping[Factor, float]) -> str | None:
        entries: dict[str, dict[str, Any]] = {}
        for f, v in values.items():
            if f.kind not in ("matmul", "scaled"):
                continue
            for gid in f.targets:
                eff = entries.get(gid) or get_gpu(gid).efficiency.model_dump()
                if f.kind == "scaled":  # the physics form: sourced rate x clock x the end-to-end factor v
                    if f.precision in eff["matmul"] and f.precision in get_gpu(gid).gemm_achievable:
                        rate = get_gpu(gid).sourced_gemm_rate(f.precision) * float(v)
                        eff["matmul"] = dict(eff["matmul"], **{f.precision: round(rate, 6)})
                    entries[gid] = eff
                    continue
                if f.precision in eff["matmul"]:
                    eff["matmul"] = dict(eff["matmul"], **{f.precision: round(float(v), 6)})
                entries[gid] = eff
        if not entries:
            return None
        self.count += 1
        path = self.dir / f"loso-{self.count:06d}.yaml"
        path.write_text(yaml.safe_dump({"gpus": {g: {"efficiency": e} for g, e in sorted(entries.items())}},
                                       sort_keys=True), encoding="utf-8")
        return str(path)

    @contextlib.contextmanager
    def frameworks(self, values: Mapping[Factor, float]) -> Iterator[None]:
        table = fw.profiles()
        saved = dict(table)
        try:
            for f, v in values.items():
                if f.kind == "framework":
                    change: dict[str, Any] = {f.attribute: float(v) * f.scale}  # (the attribute is named by data)
                    table[f.framework] = dataclasses.replace(table[f.framework], **change)
            fw.get_framework.cache_clear()
            yield
        finally:
            table.clear()
            table.update(saved)
            fw.get_framework.cache_clear()

    def steps(self, cases: list[Case], values: Mapping[Factor, float]) -> np.ndarray:
        path = self.overlay(values)
        with self.frameworks(values):
            return np.array([evaluate(with_catalog(c, path).problem, c.plan).step_time_s for c in cases], dtype=float)


# ---------------------------------------------------------------------------------------
# Fitting on cached grids
# ---------------------------------------------------------------------------------------


def grid_of(f: Factor) -> list[float]:
    if f.kind in ("matmul", "scaled"):
        return [math.exp(math.log(LO) + (math.log(HI) - math.log(LO)) * i / (GRID_POINTS - 1))
                for i in range(GRID_POINTS)]
    lo, hi = f.grid
    return [lo + (hi - lo) * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)]


def fit_on(grid: list[float], logs: np.ndarray, log_meas: np.ndarray, log_axis: bool) -> float:
    """The least-squares value on the grid (rows x grid points of log predicted steps), refined by a
    parabola through the best point and its neighbours (in log x for an efficiency)."""
    obj = np.sum((logs - log_meas[:, None]) ** 2, axis=0)
    i = int(min(range(len(grid)), key=lambda k: (float(obj[k]), k)))
    xs = [math.log(g) if log_axis else g for g in grid]
    x = xs[i]
    if 0 < i < len(grid) - 1:
        y0, y1, y2 = float(obj[i - 1]), float(obj[i]), float(obj[i + 1])
        den = y0 - 2 * y1 + y2
        if den > 0:
            x = xs[i] + 0.5 * (xs[i + 1] - xs[i]) * (y0 - y2) / den
    return math.exp(x) if log_axis else x


@dataclass
class FactorFit:
    factor: Factor
    catalog: float
    rows: list[str]  # ids of the rows it is fitted on
    families: list[str]  # their families
    refit: float  # on every row
    loso: dict[str, float] = field(default_factory=dict)  # family -> value without it (only families it touches)
    ablation_families: list[str] = field(default_factory=list)  # families of the groups that state it fitted
    in_sample_median_pct: float = math.nan  # median |err| of its rows, catalog
    loso_median_pct: float = math.nan  # median |err| of its rows, each predicted without its own family


@dataclass
class FamilyResult:
    family: str
    runs: int
    catalog_median_pct: float
    refit_median_pct: float
    loso_median_pct: float
    loso_p90_pct: float
    loso_worst_id: str
    loso_worst_pct: float
    pairs_compared: int = 0
    pairs_in_sample: int = 0  # concordant under the catalog
    pairs_loso: int = 0  # concordant with the factors fitted without this family


@dataclass
class LosoReport:
    families: list[FamilyResult]
    factors: list[FactorFit]
    catalog: dict[str, float]  # median / p90 / worst |err| over every run, catalog as shipped
    refit: dict[str, float]  # the procedure on every row
    loso: dict[str, float]
    pairs: dict[str, int]  # compared, concordant in-sample (catalog), refit, LOSO
    errors: dict[str, dict[str, float]]  # run id -> {catalog, refit, loso} signed error %


def _stats(errs: list[float]) -> dict[str, float]:
    a = [abs(e) for e in errs]
    worst = max(errs, key=abs) if errs else math.nan
    return {"n": len(errs), "median_abs_pct": statistics.median(a) if a else math.nan, "p90_abs_pct": p90(a),
            "worst_pct": worst}


def _rank(groups: list[dict[str, Any]], overlay: str | None, pricer: Pricer, values: Mapping[Factor, float]) -> Any:
    with pricer.frameworks(values):
        return [group_result(g, overlay) for g in groups]


@dataclass
class _Folds:
    """What every fold refits from: the rows each factor moves, their log steps on its grid, the
    family of each row, and the families whose ablation groups fitted a factor."""

    factors: tuple[Factor, ...]
    rows_of: dict[Factor, list[int]]
    grids: dict[Factor, np.ndarray]
    family: list[str]  # of each case
    log_meas: np.ndarray
    ablation_families: dict[str, set[str]]

    def fit(self, f: Factor, leave: str | None) -> float | None:
        """The factor refitted on its rows outside the family `leave` (None: on all); None where it has none."""
        keep = [j for j, k in enumerate(self.rows_of[f]) if self.family[k] != leave]
        if f.on_ablations:  # kept at its catalog value unless every group that fitted it is left out
            fams = self.ablation_families.get(f.name, set())
            return None if fams and fams <= {leave} else catalog_value(f)
        if not keep:
            return None
        return fit_on(grid_of(f), self.grids[f][keep], self.log_meas[[self.rows_of[f][j] for j in keep]],
                      f.kind in ("matmul", "scaled"))

    def values(self, leave: str | None) -> dict[Factor, float]:
        """Every factor's value in the fold that leaves out `leave`: refitted, or the prior of a factor
        left without rows."""
        vals: dict[Factor, float] = {}
        empty = []
        for f in self.factors:
            v = self.fit(f, leave)
            if v is None:
                empty.append(f)
            else:
                vals[f] = v
        for f in empty:
            vals[f] = _prior(f, vals)
        return vals


def _prior(f: Factor, vals: Mapping[Factor, float]) -> float:
    """The value of a factor left without rows in a fold, from the factors fitted in it."""
    if f.kind == "matmul" and all(sourced_rate(g) for g in vals if g.kind == "matmul"
                                  and g.precision == f.precision) and sourced_rate(f):
        # its sourced GEMM rate x the others' fitted / sourced ratio (geometric mean)
        same = [math.log(v / sourced_rate(g)) for g, v in vals.items()
                if g.kind == "matmul" and g.precision == f.precision]
        return sourced_rate(f) * (math.exp(statistics.fmean(same)) if same else 1.0)
    if f.kind == "matmul":
        same = [v for g, v in vals.items() if g.kind == "matmul" and g.precision == f.precision]
        return math.exp(statistics.fmean(math.log(v) for v in same)) if same else catalog_value(f)
    if f.kind == "scaled":  # the same precision's other end-to-end factors, else matmul.yaml's
        same = [v for g, v in vals.items() if g.kind == "scaled" and g.precision == f.precision]
        return math.exp(statistics.fmean(math.log(v) for v in same)) if same else catalog_value(f)
    return FRAMEWORK_PRIOR.get(f.attribute, 0.0)


def _factor_rows(pricer: Pricer, cases: list[Case], base: np.ndarray,
                 factors: tuple[Factor, ...]) -> dict[Factor, list[int]]:
    """The rows each factor prices: a GEMM or end-to-end factor its GPUs' rows of its precision, a
    framework factor the rows whose step a finite-difference step of it moves."""
    rows_of: dict[Factor, list[int]] = {}
    for f in factors:
        if f.kind in ("matmul", "scaled"):
            rows_of[f] = [k for k, c in enumerate(cases) if c.gpu in f.targets
                          and precision_family(c.recipe or c.precision).lower() == f.precision]
        else:
            cv = catalog_value(f)
            moved = pricer.steps(cases, {f: cv * FD if cv else (f.grid[1] - f.grid[0]) / 10})
            rows_of[f] = [k for k in range(len(cases)) if abs(math.log(moved[k] / base[k])) > 1e-9]
    return rows_of


def _factor_grids(pricer: Pricer, cases: list[Case], rows_of: dict[Factor, list[int]],
                  factors: tuple[Factor, ...]) -> dict[Factor, np.ndarray]:
    """Each factor's rows' log steps at every point of its grid (rows x GRID_POINTS)."""
    grids: dict[Factor, np.ndarray] = {}
    for f in factors:
        sub = [cases[k] for k in rows_of[f]]
        if not sub:
            grids[f] = np.zeros((0, GRID_POINTS))
            continue
        cols = [np.log(pricer.steps(sub, {f: x})) for x in grid_of(f)]
        grids[f] = np.stack(cols, axis=1)
    return grids


def loso(runs_paths: list[str | Path], ablations_path: str | Path | None = None,
         families: list[str] | None = None, factors: tuple[Factor, ...] = FACTORS) -> LosoReport:
    """Leave-one-source-out over the runs files and the ablation groups (module docstring); `factors`:
    another set of fitted factors to try (e.g. one merged per GPU generation)."""
    rows = [r for p in runs_paths for r in load_runs(p)]
    family_of = {str(r.get("id")): source_family(r) for r in rows}
    cases, _ = convert(rows)
    cases = [dataclasses.replace(c, plan=completed_plan(c), recompute_published=True) for c in cases]
    groups = load_groups(ablations_path) if ablations_path else []
    # The families whose ablation groups a factor was fitted on: each group states it (`fitted_factors`).
    ablation_families: dict[str, set[str]] = {}
    for g in groups:
        for name in g.get("fitted_factors") or ():
            ablation_families.setdefault(str(name), set()).add(str(g.get("source_family") or ""))
    meas = np.array([c.measured_step_s for c in cases])
    ids = [c.id for c in cases]
    fam_list = sorted({family_of[i] for i in ids} | {str(g.get("source_family") or "") for g in groups} - {""})
    if families:
        fam_list = [f for f in fam_list if f in families]

    with tempfile.TemporaryDirectory(prefix="autoshard-loso-") as tmp:
        pricer = Pricer(tmp)
        base = pricer.steps(cases, {})
        rows_of = _factor_rows(pricer, cases, base, factors)
        folds = _Folds(factors, rows_of, _factor_grids(pricer, cases, rows_of, factors),
                       [family_of[i] for i in ids], np.log(meas), ablation_families)
        refit_vals = folds.values(None)
        refit_steps = pricer.steps(cases, refit_vals)
        loso_steps = np.array(base)
        fold_vals: dict[str, dict[Factor, float]] = {}
        results: list[FamilyResult] = []
        pairs = {"compared": 0, "catalog": 0, "refit": 0, "loso": 0}
        catalog_groups = [group_result(g, None) for g in groups]
        refit_groups = _rank(groups, pricer.overlay(refit_vals), pricer, refit_vals)
        for fam in fam_list:
            fold_vals[fam] = folds.values(fam)
            fr = _leave_out(fam, fold_vals[fam], pricer, cases, folds.family, groups, catalog_groups, base,
                            refit_steps, loso_steps, meas)
            pairs["compared"] += fr.pairs_compared
            pairs["catalog"] += fr.pairs_in_sample
            pairs["loso"] += fr.pairs_loso
            results.append(fr)
        pairs["refit"] = summarize_ablations(refit_groups).pairs_concordant

    def err(s: np.ndarray) -> list[float]:
        return [float((s[k] - meas[k]) / meas[k] * 100) for k in range(len(cases))]

    e_cat, e_ref, e_los = err(base), err(refit_steps), err(loso_steps)
    factor_fits = []
    for f in factors:
        rk = rows_of[f]
        fams = sorted({family_of[ids[k]] for k in rk})
        ff = FactorFit(f, catalog_value(f), [ids[k] for k in rk], fams, refit_vals[f],
                       {fam: fold_vals[fam][f] for fam in fam_list
                        if fam in fams or fam in ablation_families.get(f.name, ())},
                       ablation_families=sorted(ablation_families.get(f.name, ())))
        if rk:
            ff.in_sample_median_pct = statistics.median(abs(e_cat[k]) for k in rk)
            ff.loso_median_pct = statistics.median(abs(e_los[k]) for k in rk)
        factor_fits.append(ff)
    covered = [k for k in range(len(cases)) if family_of[ids[k]] in fam_list]
    return LosoReport(
        families=results, factors=factor_fits,
        catalog=_stats([e_cat[k] for k in covered]), refit=_stats([e_ref[k] for k in covered]),
        loso=_stats([e_los[k] for k in covered]), pairs=pairs,
        errors={ids[k]: {"catalog": e_cat[k], "refit": e_ref[k], "loso": e_los[k]} for k in covered})


def _leave_out(fam: str, vals: dict[Factor, float], pricer: Pricer, cases: list[Case], family: list[str],
               groups: list[dict[str, Any]], catalog_groups: list[Any], base: np.ndarray, refit_steps: np.ndarray,
               loso_steps: np.ndarray, meas: np.ndarray) -> FamilyResult:
    """One fold: the family's runs priced with the factors refitted without it (written into
    `loso_steps`), and its ablation groups ranked under them; its errors and concordant pairs."""
    mine = [k for k in range(len(cases)) if family[k] == fam]
    if mine:
        loso_steps[mine] = pricer.steps([cases[k] for k in mine], vals)
    gi = [j for j, g in enumerate(groups) if str(g.get("source_family") or "") == fam]
    ranked = _rank([groups[j] for j in gi], pricer.overlay(vals), pricer, vals) if gi else []
    errs = [(loso_steps[k] - meas[k]) / meas[k] * 100 for k in mine]
    st = _stats(errs)
    worst_k = max(mine, key=lambda k: (abs(loso_steps[k] / meas[k] - 1), cases[k].id)) if mine else None
    fr = FamilyResult(
        fam, len(mine),
        _stats([(base[k] - meas[k]) / meas[k] * 100 for k in mine])["median_abs_pct"],
        _stats([(refit_steps[k] - meas[k]) / meas[k] * 100 for k in mine])["median_abs_pct"],
        st["median_abs_pct"], st["p90_abs_pct"], cases[worst_k].id if worst_k is not None else "",
        st["worst_pct"])
    cat_s = summarize_ablations([catalog_groups[j] for j in gi])
    los_s = summarize_ablations(ranked)
    fr.pairs_compared, fr.pairs_in_sample, fr.pairs_loso = (cat_s.pairs_compared, cat_s.pairs_concordant,
                                                           los_s.pairs_concordant)
    return fr


# ---------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}%"


def format_loso(r: LosoReport) -> str:
    head: list[Column] = ["left-out family", ("runs", "right"), ("catalog", "right"), ("refit", "right"),
                          ("LOSO", "right"), ("LOSO p90", "right"), ("pairs in/LOSO", "right"), "LOSO worst"]
    rows = [[f.family, str(f.runs), _pct(f.catalog_median_pct), _pct(f.refit_median_pct), _pct(f.loso_median_pct),
             _pct(f.loso_p90_pct),
             f"{f.pairs_in_sample}/{f.pairs_loso} of {f.pairs_compared}" if f.pairs_compared else "-",
             f"{f.loso_worst_id} ({f.loso_worst_pct:+.1f}%)" if f.runs else ""] for f in r.families]
    lines = ["leave-one-source-out: every fitted factor refitted without the family, its runs and ablation pairs "
             "predicted (median |err| per family)", table_text(head, rows).rstrip("\n")]
    c, rf, lo, p = r.catalog, r.refit, r.loso, r.pairs
    n = p["compared"]
    lines += ["",
              f"step time over {int(c['n'])} runs: catalog (in-sample) median {_pct(c['median_abs_pct'])} p90 "
              f"{_pct(c['p90_abs_pct'])} worst {c['worst_pct']:+.1f}%; refit in-sample median "
              f"{_pct(rf['median_abs_pct'])} p90 {_pct(rf['p90_abs_pct'])}; LOSO median {_pct(lo['median_abs_pct'])} "
              f"p90 {_pct(lo['p90_abs_pct'])} worst {lo['worst_pct']:+.1f}%",
              f"ablation pairs measured >= 8% apart: concordant {p['catalog']}/{n} in-sample (catalog), "
              f"{p['refit']}/{n} refit in-sample, {p['loso']}/{n} LOSO", "",
              format_factors(r)]
    return "\n".join(lines)


def format_factors(r: LosoReport) -> str:
    head: list[Column] = ["fitted factor", ("catalog", "right"), ("refit", "right"), ("rows", "right"),
                          ("its rows: in-sample -> LOSO", "right"), "values without a family"]
    rows = []
    for ff in r.factors:
        vals = ", ".join(f"{fam}: {v:.3g}" for fam, v in sorted(ff.loso.items()))
        eff = (f"{_pct(ff.in_sample_median_pct)} -> {_pct(ff.loso_median_pct)}" if ff.rows else
               f"(ablations of {', '.join(ff.ablation_families)})" if ff.ablation_families else "no rows")
        rows.append([ff.factor.name, f"{ff.catalog:.4g}", f"{ff.refit:.4g}", str(len(ff.rows)), eff, vals])
    return table_text(head, rows).rstrip("\n")


def worst_factors(r: LosoReport, n: int = 6) -> list[FactorFit]:
    """The factors whose rows lose most when their family is left out (LOSO minus in-sample median)."""
    fitted = [ff for ff in r.factors if ff.rows]
    return sorted(fitted, key=lambda ff: (-(ff.loso_median_pct - ff.in_sample_median_pct), ff.factor.name))[:n]


def markdown_loso(r: LosoReport) -> list[str]:
    """The LOSO tables for docs/fidelity.md."""
    out = ["| left-out family | runs | catalog median | refit median | LOSO median | LOSO p90 | LOSO worst | "
           "pairs concordant (in-sample / LOSO of compared) |", "|---|---|---|---|---|---|---|---|"]
    for f in r.families:
        pairs = f"{f.pairs_in_sample} / {f.pairs_loso} of {f.pairs_compared}" if f.pairs_compared else "-"
        worst = f"{f.loso_worst_pct:+.1f}% ({f.loso_worst_id})" if f.runs else "-"
        out.append(f"| {f.family} | {f.runs} | {_pct(f.catalog_median_pct)} | {_pct(f.refit_median_pct)} | "
                   f"{_pct(f.loso_median_pct)} | {_pct(f.loso_p90_pct)} | {worst} | {pairs} |")
    c, rf, lo, p = r.catalog, r.refit, r.loso, r.pairs
    out.append(f"| **all** | **{int(c['n'])}** | **{_pct(c['median_abs_pct'])}** (p90 {_pct(c['p90_abs_pct'])}) | "
               f"**{_pct(rf['median_abs_pct'])}** (p90 {_pct(rf['p90_abs_pct'])}) | **{_pct(lo['median_abs_pct'])}** | "
               f"**{_pct(lo['p90_abs_pct'])}** | {lo['worst_pct']:+.1f}% | {p['catalog']} / {p['loso']} of "
               f"{p['compared']} (refit in-sample {p['refit']}) |")
    out += ["", "| fitted factor | catalog value | refit on all its rows | rows fitted on (families) | "
            "its rows' median \\|err\\|: in-sample -> LOSO | value with a family left out |",
            "|---|---|---|---|---|---|"]
    for ff in r.factors:
        vals = "; ".join(f"{fam}: {v:.3g}" for fam, v in sorted(ff.loso.items())) or "-"
        rows = f"{len(ff.rows)} ({', '.join(ff.families)})" if ff.rows else (
            f"ablation groups of {', '.join(ff.ablation_families)}" if ff.ablation_families else "none")
        eff = f"{_pct(ff.in_sample_median_pct)} -> {_pct(ff.loso_median_pct)}" if ff.rows else "-"
        out.append(f"| `{ff.factor.name}` | {ff.catalog:.4g} | {ff.refit:.4g} | {rows} | {eff} | {vals} |")
    losing = worst_factors(r)
    out += ["", "Factors whose rows lose most when their family is left out (LOSO minus in-sample median |err| of "
            "the rows each prices): " + "; ".join(
                f"`{ff.factor.name}` {_pct(ff.in_sample_median_pct)} -> {_pct(ff.loso_median_pct)} "
                f"({len(ff.families)} famil{'y' if len(ff.families) == 1 else 'ies'})" for ff in losing) + ". "
            "A factor fitted on one family has no data when that family is left out and falls back to its prior."]
    return out


def markdown_trial(base: LosoReport, trials: list[tuple[str, LosoReport]]) -> list[str]:
    """A table comparing trial factor structures with FACTORS: factor count, refit in-sample, LOSO."""
    def cells(r: LosoReport, k: int) -> str:
        return (f"| {k} | {_pct(r.refit['median_abs_pct'])} / {_pct(r.refit['p90_abs_pct'])} | "
                f"{_pct(r.loso['median_abs_pct'])} / {_pct(r.loso['p90_abs_pct'])} | {r.pairs['loso']} of "
                f"{r.pairs['compared']} |")
    return ["| factor structure | fitted factors | refit in-sample median / p90 | LOSO median / p90 | "
            "LOSO pairs |", "|---|---|---|---|---|",
            "| as shipped: one end-to-end factor per GPU generation and precision over sourced GEMM rates "
            + cells(base, len(base.factors))] + [f"| {title} " + cells(t, len(t.factors)) for title, t in trials]

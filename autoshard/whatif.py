"""What-if studies of hardware purchases: time, money and energy to train one or more models.

A study file names workloads (model + training setup + token budget), candidate hardware
options (GPU type x count x topology / network tier, with ranges to sweep), prices (cloud
$/GPU-hour, or capex + power) and constraints (budget, power cap, deadline). `run_study`
solves the best plan of every option (in parallel), adds goodput (failures, checkpoints,
restarts), cost and energy, sensitivities to faster hardware, the Pareto front of time vs
cost, and a purchase decision made with CP-SAT; it writes `results.json`, `results.csv`,
`report.md`, `report.html` and PNG plots. The options are solved by a local process pool, or
(`executor="dask"`, the `autoshard[dask]` extra) on a Dask cluster for sweeps larger than one machine.

Assumptions (all overridable in the study file, all written into results.json):

- Time to train = steps x step time / goodput, steps = ceil(tokens / tokens per step).
- Goodput (Meta's "effective training-time ratio"): failures arrive at a per-GPU rate
  (default from the Llama 3 paper: 419 unexpected interruptions in 54 days on 16,384 H100s),
  so the cluster MTBF is M = 1 / (rate x GPUs). Checkpoints of C bytes (14 B/param) are written
  at the storage bandwidth in delta seconds, every tau = sqrt(2 M delta) seconds of work
  (Young 1974; Daly 2006 to first order). Each failure costs the restart time R plus on average
  half an interval of lost work; the useful fraction of wall time is
  (1 - (R + (tau + delta) / 2) / M) / (1 + delta / tau), which falls as the cluster grows.
- Power per GPU = TDP + node overhead (CPUs, NICs, switches, fans; default 30% of TDP, 10% for
  GB200 whose catalog TDP is already a rack share); facility power = GPUs x that x PUE; energy =
  facility power x wall-clock hours (GPUs taken at TDP throughout: an upper bound).
- Cloud cost = $/GPU-hour x GPUs x wall-clock hours (power included in the rate).
  Owned cost = capex x training days / (amortization years x 365) + energy x $/kWh, with capex =
  GPUs x purchase price (catalog: per GPU incl. its server share) + nodes x $/node + scale-out
  ports x $/port. One purchase: a mix of GPU types is not modelled.

Public API: `load_study`, `run_study`, `optimize_purchase`, `pareto_front`, `goodput`,
`young_daly_interval_s`, `solve_option`, `sensitivities`.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import hashlib
import io
import math
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator

from .catalog import get_gpu, get_topology, gpu_ids, load_overlay, resolve_model
from .errors import AutoshardError, InfeasibleError, InputError
from .loader import atomic_write, dumps_json, file_folder, named_file_error, read_document, resolve_path, validate
from .render import json_safe
from .report import money
from .spec import MAX_GPUS, ModelSpec, Plan, Problem, SearchSpec, Strict, TopologyLevel, TrainingSpec

Mode = Literal["cloud", "own"]
Objective = Literal["auto", "time", "cost"]
SensitivityMode = Literal["solve", "evaluate", "off"]
Positive = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]

DEFAULT_TIME_LIMIT_S = 10.0
SCHEMA_VERSION = 1

# ---- price and power defaults (sources in the comments; the study can override each) --------
USD_PER_KWH = 0.08  # US EIA Electric Power Monthly: average industrial retail price ~8 cents/kWh (2023-24)
PUE = 1.3  # assumption: modern colocation; Uptime Institute survey average ~1.58 (2023), hyperscale ~1.1
AMORTIZATION_YEARS = 4.0  # assumption: GPU servers' economic life (hyperscalers depreciate over 5-6 years)
NODE_OVERHEAD_FRACTION = 0.30  # assumption: CPUs, NICs, switches, fans as a share of GPU TDP. A DGX H100
# draws 10.2 kW at most (datasheet) for 8 x 700 W GPUs (+82% at peak); average draw is well below peak.
NODE_OVERHEAD_FRACTION_GPU = {"gb200": 0.10}  # catalog tdp_w of GB200 is already the rack share (Grace, NVSwitch)
USD_PER_PORT_PER_GB_S = 100.0  # assumption: scale-out fabric (NIC share, switch ports, optics) ~$5,000 per
# 400 Gb/s (50 GB/s) GPU port, about 10-15% of an H100 cluster's capex; only for clusters of more than one node.

# Larger-HBM siblings for the "+HBM" sensitivity (same compute die, more and faster memory).
HBM_SIBLING = {"h100-sxm": "h200-sxm", "a100-sxm-40gb": "a100-sxm-80gb"}

SLOWDOWN = 1.25  # resource slow-down used to measure how much of the step time each resource carries

CSV_COLUMNS = (
    "workload", "option", "gpu", "num_gpus", "topology", "mode", "feasible", "meets_constraints", "pareto",
    "recommended", "plan", "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "ideal_days",
    "goodput", "time_to_train_days", "cost_usd", "capex_usd", "energy_mwh", "power_mw", "tokens_per_usd",
    "mtbf_h", "checkpoint_s", "checkpoint_interval_s", "binding", "gain_internode_2x_pct",
    "gain_nvlink_2x_pct", "gain_hbm_plus_pct", "gain_fp8_pct", "violations", "reason", "solver_status",
    "solve_time_s",
)
TIMING_FIELDS = ("solve_time_s", "elapsed_s", "task_time_s")


# =============================================================================================
# Study schema
# =============================================================================================


class RangeSpec(Strict):
    """GPU counts from `start` to `stop` (inclusive): `step` apart, or multiplied by `factor`."""

    start: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    stop: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    step: Annotated[int, Field(ge=1)] | None = None
    factor: Annotated[float, Field(gt=1)] | None = None

    @model_validator(mode="after")
    def _check(self) -> "RangeSpec":
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop}) is below start ({self.start})")
        if self.step is not None and self.factor is not None:
            raise ValueError("give step or factor, not both")
        if len(self.values()) > 4096:
            raise ValueError("the range has more than 4096 values")
        return self

    def values(self) -> list[int]:
        out, n = [], self.start
        if self.step is not None:
            return list(range(self.start, self.stop + 1, self.step))[:4097]
        factor = self.factor or 2.0
        while n <= self.stop and len(out) <= 4096:
            out.append(n)
            n = max(n + 1, int(round(n * factor)))
        return out


class NetworkSpec(Strict):
    """A named network tier: explicit levels (innermost first) and its port price."""

    description: str = ""
    levels: list[TopologyLevel] = Field(min_length=1)
    usd_per_network_port: NonNeg | None = None


class WorkloadSpec(Strict):
    name: str | None = None
    model: ModelSpec
    training: TrainingSpec
    tokens: Positive | list[Positive]
    search: SearchSpec = SearchSpec()

    @model_validator(mode="before")
    @classmethod
    def _resolve_model(cls, data: Any) -> Any:  # a preset name or {preset: ..., overrides} -> explicit fields
        if isinstance(data, dict) and "model" in data:
            data = {**data, "model": resolve_model(data["model"])}
        return data


class OptionSpec(Strict):
    """One or more hardware options: every combination of the listed values."""

    gpu: str | list[str]
    num_gpus: Annotated[int, Field(ge=1, le=MAX_GPUS)] | list[Annotated[int, Field(ge=1, le=MAX_GPUS)]] | RangeSpec
    topology: str | list[str] | None = None  # catalog preset or a study `networks:` name; default: the GPU's
    mode: Mode | list[Mode] | None = None  # default: pricing.mode
    catalog: str | None = None  # calibrated catalog overlay


class PricingSpec(Strict):
    mode: Mode | list[Mode] = "cloud"
    usd_per_gpu_hour: dict[str, Positive] = {}
    purchase_usd_per_gpu: dict[str, Positive] = {}
    usd_per_node: NonNeg = 0.0
    usd_per_network_port: NonNeg | None = None
    usd_per_kwh: NonNeg = USD_PER_KWH
    pue: Annotated[float, Field(ge=1.0, le=3.0)] = PUE
    amortization_years: Positive = AMORTIZATION_YEARS
    node_overhead_w: NonNeg | dict[str, NonNeg] | None = None


class ReliabilitySpec(Strict):
    enabled: bool = True
    failures_per_gpu_hour: NonNeg | dict[str, NonNeg] | None = None
    restart_s: NonNeg | None = None
    checkpoint_bytes_per_param: Positive | None = None
    storage_gb_per_s_per_gpu: Positive | None = None
    storage_min_gb_per_s: Positive | None = None
    storage_max_gb_per_s: Positive | None = None
    checkpoint_overhead_s: NonNeg | None = None
    checkpoint_interval_s: Positive | None = None  # fixed interval instead of Young/Daly


class ConstraintSpec(Strict):
    budget_usd: Positive | None = None  # cost to train
    capex_budget_usd: Positive | None = None  # upfront purchase (owned options)
    power_cap_mw: Positive | None = None  # facility power incl. PUE
    deadline_days: Positive | None = None  # wall-clock time to train incl. failures
    objective: Objective = "auto"  # auto: cost when only a deadline is given, else time


class StudySpec(Strict):
    name: str | None = None
    description: str | None = None
    workloads: list[WorkloadSpec] = Field(min_length=1)
    options: list[OptionSpec] = Field(min_length=1)
    networks: dict[str, NetworkSpec] = {}
    pricing: PricingSpec = PricingSpec()
    reliability: ReliabilitySpec = ReliabilitySpec()
    constraints: ConstraintSpec = ConstraintSpec()
    combine: Literal["each", "sum"] = "each"  # each workload its own question, or one cluster for all
    sensitivity: SensitivityMode = "evaluate"
    time_limit_s: Positive | None = None  # per solve


# ---- expanded study -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
    index: int
    name: str
    model: ModelSpec
    training: TrainingSpec
    search: SearchSpec
    tokens: float
    base: str  # the name without the token budget (token scenarios share their solves)

    def problem(self, option: "Option", networks: Mapping[str, NetworkSpec]) -> Problem:
        topo: Any = list(networks[option.topology].levels) if option.topology in networks else option.topology
        return Problem(name=f"{self.name} on {option.id}", model=self.model, training=self.training,
                       cluster={"gpu": option.gpu, "num_gpus": option.num_gpus, "topology": topo,
                                "catalog": option.catalog}, search=self.search)

    @property
    def problem_key(self) -> str:
        return dumps_json([self.model.model_dump(mode="json"), self.training.model_dump(mode="json"),
                           self.search.model_dump(mode="json")])


@dataclasses.dataclass(frozen=True)
class Option:
    gpu: str  # catalog id
    num_gpus: int
    topology: str  # preset id or network name
    mode: str
    catalog: str | None = None

    @property
    def hw_id(self) -> str:
        cal = f"+{Path(self.catalog).stem}" if self.catalog else ""
        return f"{self.gpu}/{self.num_gpus}/{self.topology}{cal}"

    @property
    def id(self) -> str:
        return f"{self.hw_id}/{self.mode}"

    def sort_key(self) -> tuple:
        order = {g: i for i, g in enumerate(gpu_ids())}
        return (order.get(self.gpu, 999), self.gpu, self.topology, self.num_gpus, self.mode, self.catalog or "")


@dataclasses.dataclass(frozen=True)
class Study:
    spec: StudySpec
    workloads: tuple[Workload, ...]
    options: tuple[Option, ...]
    source: str | None
    notes: tuple[str, ...]  # which documented defaults were used

    @property
    def name(self) -> str:
        return self.spec.name or (Path(self.source).stem if self.source else "study")


def _norm_gpu(name: str, field: str, source: str | None) -> str:
    try:
        return get_gpu(name).id
    except InputError as exc:
        raise InputError(exc.message, source=source, field=field) from None


def load_study(source: str | os.PathLike[str] | Mapping[str, Any] | StudySpec) -> Study:
    """A validated, expanded study from a YAML/JSON path, a dict or a StudySpec.

    Raises a one-line `InputError` (`file: field.path: what is wrong`) on bad input.
    """
    src: str | None = None
    if isinstance(source, StudySpec):
        spec = source
    else:
        folder: str | None = None  # paths in a study file are relative to its folder; in a dict, to the working dir
        if isinstance(source, Mapping):
            data: Any = dict(source)
        else:
            src = str(source)
            data = read_document(source)
            folder = file_folder(source)
        if isinstance(data, dict) and isinstance(data.get("workloads"), list):
            wls = []
            for i, w in enumerate(data["workloads"]):
                if isinstance(w, dict) and "model" in w:
                    model = w["model"]
                    if isinstance(model, dict) and "hf_config" in model:
                        model = {**model, "hf_config": resolve_path(model["hf_config"], folder)}
                    try:
                        w = {**w, "model": resolve_model(model)}
                    except InputError as exc:
                        if exc.source:  # in the config.json the workload names
                            raise named_file_error(exc, src, f"workloads.{i}.model.hf_config") from None
                        raise InputError(exc.message, source=src, field=f"workloads.{i}.model") from None
                wls.append(w)
            data = {**data, "workloads": wls}
        if folder is not None and isinstance(data, dict) and isinstance(data.get("options"), list):
            data = {**data, "options": [{**o, "catalog": resolve_path(o["catalog"], folder)}
                                        if isinstance(o, dict) and "catalog" in o else o for o in data["options"]]}
        spec = validate(StudySpec, data, source=src)

    # Workloads: one per token budget.
    workloads: list[Workload] = []
    for i, w in enumerate(spec.workloads):
        budgets = w.tokens if isinstance(w.tokens, list) else [w.tokens]
        if not budgets:
            raise InputError("an empty list allows nothing", source=src, field=f"workloads.{i}.tokens")
        base = w.name or w.model.name
        for t in budgets:
            name = base if len(budgets) == 1 else f"{base} @ {_fmt_tokens(t)} tokens"
            workloads.append(Workload(len(workloads), name, w.model, w.training, w.search, float(t), base))
    names = [w.name for w in workloads]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise InputError(f"two workloads are named {dup!r}; give each a distinct name", source=src, field="workloads")

    # Networks.
    for name, net in spec.networks.items():
        lv = net.levels
        for i in range(1, len(lv)):
            if lv[i].size <= lv[i - 1].size or lv[i].size % lv[i - 1].size:
                raise InputError(f"level sizes must grow and each divide the next ({lv[i - 1].size} -> {lv[i].size})",
                                 source=src, field=f"networks.{name}.levels.{i}.size")

    # Pricing dictionaries keyed by GPU.
    for key in ("usd_per_gpu_hour", "purchase_usd_per_gpu"):
        for g in getattr(spec.pricing, key):
            _norm_gpu(g, f"pricing.{key}.{g}", src)
    if isinstance(spec.pricing.node_overhead_w, dict):
        for g in spec.pricing.node_overhead_w:
            _norm_gpu(g, f"pricing.node_overhead_w.{g}", src)
    if isinstance(spec.reliability.failures_per_gpu_hour, dict):
        for g in spec.reliability.failures_per_gpu_hour:
            _norm_gpu(g, f"reliability.failures_per_gpu_hour.{g}", src)

    # Options: the cartesian product of every option entry.
    default_modes = spec.pricing.mode if isinstance(spec.pricing.mode, list) else [spec.pricing.mode]
    options: dict[str, Option] = {}
    for i, o in enumerate(spec.options):
        gpus = o.gpu if isinstance(o.gpu, list) else [o.gpu]
        counts = o.num_gpus.values() if isinstance(o.num_gpus, RangeSpec) else (
            o.num_gpus if isinstance(o.num_gpus, list) else [o.num_gpus])
        modes = default_modes if o.mode is None else (o.mode if isinstance(o.mode, list) else [o.mode])
        if not gpus or not counts or not modes:
            raise InputError("an empty list allows nothing", source=src, field=f"options.{i}")
        if o.catalog:  # a missing or malformed calibrated catalog is bad input, reported before any solve
            try:
                load_overlay(o.catalog)
            except InputError as exc:
                if exc.source:
                    raise named_file_error(exc, src, f"options.{i}.catalog") from None
                raise InputError(exc.message, source=src, field=f"options.{i}.catalog") from None
        for g in gpus:
            gid = _norm_gpu(g, f"options.{i}.gpu", src)
            topos = [get_gpu(gid).default_topology] if o.topology is None else (
                o.topology if isinstance(o.topology, list) else [o.topology])
            for t in topos:
                if t not in spec.networks:
                    try:
                        t = get_topology(t).id
                    except InputError as exc:
                        raise InputError(exc.message + (f"; or a study network ({', '.join(spec.networks)})"
                                                         if spec.networks else ""),
                                         source=src, field=f"options.{i}.topology") from None
                for n in counts:
                    for m in modes:
                        opt = Option(gid, int(n), t, m, o.catalog)
                        options.setdefault(opt.id, opt)
    opts = tuple(sorted(options.values(), key=Option.sort_key))
    return Study(spec, tuple(workloads), opts, src, tuple(_default_notes(spec, opts)))


def _fmt_tokens(t: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if t >= div:
            return f"{t / div:g}{unit}"
    return f"{t:g}"


# =============================================================================================
# Reliability and goodput
# =============================================================================================


@functools.cache
def reliability_defaults() -> dict[str, Any]:
    text = resources.files("autoshard.data").joinpath("failures.yaml").read_text(encoding="utf-8")
    return dict(yaml.safe_load(text))


def young_daly_interval_s(mtbf_s: float, checkpoint_s: float) -> float:
    """Young's optimal checkpoint interval sqrt(2 x MTBF x checkpoint time) (seconds of work)."""
    return math.sqrt(2.0 * mtbf_s * checkpoint_s)


@dataclasses.dataclass(frozen=True)
class Goodput:
    ratio: float  # useful work / wall-clock time (effective training-time ratio)
    mtbf_s: float  # of the whole cluster
    checkpoint_bytes: float
    checkpoint_s: float  # write time per checkpoint
    interval_s: float  # work between checkpoints
    restart_s: float  # per failure, incl. reading the checkpoint back
    failures_per_gpu_hour: float


def _rel(spec: ReliabilitySpec, key: str) -> float:
    v = getattr(spec, key)
    return float(reliability_defaults()[key] if v is None else v)


def failure_rate(spec: ReliabilitySpec, gpu: str) -> float:
    v = spec.failures_per_gpu_hour
    if isinstance(v, dict):
        table = {get_gpu(k).id: x for k, x in v.items()}
        if gpu in table:
            return float(table[gpu])
        return float(reliability_defaults()["failures_per_gpu_hour"])
    return float(reliability_defaults()["failures_per_gpu_hour"] if v is None else v)


def goodput(num_gpus: int, params: float, spec: ReliabilitySpec | None = None, gpu: str = "h100-sxm") -> Goodput:
    """Effective training-time ratio of a cluster of `num_gpus` training a `params`-parameter model."""
    spec = spec or ReliabilitySpec()
    size = params * _rel(spec, "checkpoint_bytes_per_param")
    bw = max(_rel(spec, "storage_min_gb_per_s"), num_gpus * _rel(spec, "storage_gb_per_s_per_gpu"))
    if spec.storage_max_gb_per_s is not None:
        bw = min(bw, spec.storage_max_gb_per_s)
    io_s = size / (bw * 1e9)
    delta = _rel(spec, "checkpoint_overhead_s") + io_s
    restart = _rel(spec, "restart_s") + io_s
    lam = failure_rate(spec, gpu)
    if not spec.enabled or lam <= 0:
        return Goodput(1.0, math.inf, size, delta, math.inf, restart, lam)
    mtbf = 3600.0 / (lam * num_gpus)
    tau = spec.checkpoint_interval_s or young_daly_interval_s(mtbf, delta)
    ratio = (1.0 - (restart + (tau + delta) / 2.0) / mtbf) / (1.0 + delta / tau)
    return Goodput(max(0.0, ratio), mtbf, size, delta, tau, restart, lam)


# =============================================================================================
# Solving one option, and the sensitivities
# =============================================================================================


@dataclasses.dataclass(frozen=True)
class SolvedOption:
    plan: Plan
    estimate: Any  # autoshard.cost.Estimate
    status: str
    solve_time_s: float


def solve_option(problem: Problem, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> SolvedOption:
    """The best plan of one option. Raises InfeasibleError when nothing fits."""
    from .solver import solve  # noqa: PLC0415  (CP-SAT is imported in the worker only)

    sol = solve(problem, time_limit_s=time_limit_s, top_k=0)
    return SolvedOption(sol.plan, sol.estimate, sol.solver.status, sol.solver.solve_time_s)


def _levels_problem(problem: Problem, factor: Callable[[int], float]) -> Problem:
    """The problem with explicit topology levels, bandwidth of level i multiplied by factor(i)."""
    from .topology import resolve_levels  # noqa: PLC0415

    gpu = get_gpu(problem.cluster.gpu, problem.cluster.catalog)
    levels = resolve_levels(problem.cluster, gpu)
    out, prev = [], 1
    for i, lv in enumerate(levels):
        size = lv.size if lv.size % prev == 0 else math.ceil(lv.size / prev) * prev
        out.append(TopologyLevel(name=lv.name, size=size, bandwidth_gb_per_s=lv.link_bytes_per_s / 1e9 * factor(i),
                                 latency_us=lv.latency_s * 1e6, sharp=lv.sharp,
                                 efficiency=min(1.0, lv.bytes_per_s / lv.link_bytes_per_s)))
        prev = size
    return problem.model_copy(update={"cluster": problem.cluster.model_copy(update={"topology": out})})


def _level_names(problem: Problem) -> list[str]:
    from .topology import resolve_levels  # noqa: PLC0415

    return [lv.name for lv in resolve_levels(problem.cluster, get_gpu(problem.cluster.gpu, problem.cluster.catalog))]


def _overlay_problem(problem: Problem, scratch: str, *, matmul: float = 1.0, hbm: float = 1.0) -> Problem:
    """The problem with the GPU's matmul / HBM efficiency divided by the given factors
    (through a calibrated-catalog overlay file in `scratch`)."""
    gpu = get_gpu(problem.cluster.gpu, problem.cluster.catalog)
    eff = gpu.efficiency.model_dump()
    eff["matmul"] = {k: v / matmul for k, v in eff["matmul"].items()}
    eff["hbm"] = eff["hbm"] / hbm
    text = yaml.safe_dump({"gpus": {gpu.id: {"efficiency": eff}}}, sort_keys=True)
    path = Path(scratch) / f"overlay-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        atomic_write(path, text)
    return problem.model_copy(update={"cluster": problem.cluster.model_copy(update={"catalog": str(path)})})


def _step(problem: Problem, plan: Plan) -> float | None:
    from .cost import evaluate  # noqa: PLC0415

    est = evaluate(problem, plan)
    return est.step_time_s if est.fits else None


def sensitivities(problem: Problem, solved: SolvedOption, *, mode: SensitivityMode = "evaluate",
                  time_limit_s: float = DEFAULT_TIME_LIMIT_S, scratch: str | None = None) -> dict[str, Any]:
    """Step-time gains (%) from faster hardware and the share of the step each resource carries.

    Gains: 2x inter-node bandwidth (every level above the innermost), 2x NVLink (innermost
    level), +HBM (the larger-HBM sibling GPU: more capacity and bandwidth), fp8 instead of
    bf16. Each re-evaluates the best plan on the modified problem; with mode 'solve' it also
    re-solves and keeps the faster (a re-solve can use the extra memory). A gain is
    (1 - new step / step) x 100; None when not applicable.

    Shares: each resource slowed down by 1.25x alone (compute: matmul efficiency; HBM
    bandwidth: HBM efficiency; each network level: its bandwidth), share = (t'/t - 1) / 0.25,
    the fraction of the step that scales with that resource. `binding` is the largest share,
    or `hbm_capacity` when memory is >= 90% full and more HBM would help more than its
    bandwidth alone explains (re-solve) or the plan pays for memory (recompute / ZeRO-3).
    """
    base = solved.estimate.step_time_s
    plan = solved.plan
    out: dict[str, Any] = {"gains_pct": {}, "shares": {}, "hbm_plus_gpu": None, "notes": []}
    if mode == "off":
        return out

    def best(variant: Problem) -> float | None:
        t = _step(variant, plan)
        if mode == "solve":
            try:
                s = solve_option(variant, time_limit_s=time_limit_s).estimate.step_time_s
                t = s if t is None else min(t, s)
            except InfeasibleError:
                pass
        return t

    def gain(t: float | None) -> float | None:
        return None if t is None else 100.0 * (1.0 - t / base)

    nlev = len(_level_names(problem))
    out["gains_pct"]["internode_2x"] = gain(best(_levels_problem(problem, lambda i: 2.0 if i > 0 else 1.0))) \
        if nlev > 1 else 0.0
    out["gains_pct"]["nvlink_2x"] = gain(best(_levels_problem(problem, lambda i: 2.0 if i == 0 else 1.0)))
    sib = HBM_SIBLING.get(get_gpu(problem.cluster.gpu).id)
    hbm_bw_only = None
    if sib:
        out["hbm_plus_gpu"] = sib
        vp = problem.model_copy(update={"cluster": problem.cluster.model_copy(update={"gpu": sib})})
        out["gains_pct"]["hbm_plus"] = gain(best(vp))
        hbm_bw_only = gain(_step(vp, plan))
    else:
        out["gains_pct"]["hbm_plus"] = None
        out["notes"].append("no larger-HBM sibling in the catalog")
    gpu = get_gpu(problem.cluster.gpu, problem.cluster.catalog)
    if problem.training.precision == "fp8":
        out["gains_pct"]["fp8"] = 0.0
    elif "fp8" not in gpu.peak_tflops:
        out["gains_pct"]["fp8"] = None
        out["notes"].append("no fp8 tensor cores")
    else:
        vp = problem.model_copy(update={"training": problem.training.model_copy(update={"precision": "fp8"})})
        t = best(vp)
        if t is None and mode != "solve":  # fp8 keeps an extra weight copy: the plan may no longer fit
            try:
                t = solve_option(vp, time_limit_s=time_limit_s).estimate.step_time_s
            except InfeasibleError:
                t = None
        out["gains_pct"]["fp8"] = gain(t)

    # Shares by slow-down.
    shares: dict[str, float] = {}
    own_scratch = scratch is None
    scratch = scratch or tempfile.mkdtemp(prefix="autoshard-whatif-")
    try:
        def share(variant: Problem) -> float:
            t = _step(variant, plan)
            return 0.0 if t is None else max(0.0, (t / base - 1.0) / (SLOWDOWN - 1.0))

        shares["compute"] = share(_overlay_problem(problem, scratch, matmul=SLOWDOWN))
        shares["hbm_bandwidth"] = share(_overlay_problem(problem, scratch, hbm=SLOWDOWN))
        for i, name in enumerate(_level_names(problem)):
            shares[f"net:{name}"] = share(_levels_problem(problem, lambda j, i=i: 1.0 / SLOWDOWN if j == i else 1.0))
    finally:
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    out["shares"] = {k: round(v, 6) for k, v in shares.items()}
    est = solved.estimate
    util = est.peak_memory_gib / est.memory_capacity_gib if est.memory_capacity_gib else 0.0
    out["memory_utilization"] = util
    binding = max(shares, key=lambda k: (shares[k], k)) if shares else "unknown"
    pays = plan.zero_stage == 3 or plan.recompute != "none"  # the plan trades time for memory
    hp = out["gains_pct"].get("hbm_plus")
    if mode == "solve" and hp is not None and hbm_bw_only is not None:
        capacity = hp - hbm_bw_only >= 2.0  # the re-solve on more HBM gains beyond the faster HBM
    else:
        capacity = pays
    if util >= 0.9 and capacity:
        binding = "hbm_capacity"
    out["binding"] = binding
    return out


# =============================================================================================
# Tasks (run in worker processes)
# =============================================================================================


@dataclasses.dataclass(frozen=True)
class Task:
    key: str
    problem: Problem
    label: str
    num_gpus: int
    time_limit_s: float
    sensitivity: SensitivityMode
    scratch: str


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_task(task: Task) -> dict[str, Any]:
    """Solve one (workload, hardware) pair: JSON-ready dict, never raises for a bad option.

    Module-level and picklable: the process pool and the Dask executor both run it."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"key": task.key}
    # A worker on another machine (Dask scheduler) does not see the client's scratch directory:
    # the sensitivities then use a temporary directory of their own.
    scratch = task.scratch if task.scratch and os.path.isdir(task.scratch) else None
    try:
        solved = solve_option(task.problem, time_limit_s=task.time_limit_s)
    except InfeasibleError as exc:
        out.update(status="infeasible", reason=exc.reason, suggestions=list(exc.suggestions))
    except Exception as exc:  # noqa: BLE001  (one broken option must not sink the sweep; reported per row)
        out.update(status="error", reason=f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
    else:
        est = solved.estimate
        out.update(
            status="ok", plan=est.plan.model_dump(mode="json", exclude_none=True), plan_short=est.plan.short(),
            step_time_s=est.step_time_s, tokens_per_s=est.tokens_per_s, mfu=est.mfu,
            peak_memory_gib=est.peak_memory_gib, memory_capacity_gib=est.memory_capacity_gib,
            time_breakdown_s=dict(est.time_breakdown_s), bottleneck=est.bottleneck,
            solver_status=solved.status, solve_time_s=solved.solve_time_s)
        try:
            out["sensitivity"] = sensitivities(task.problem, solved, mode=task.sensitivity,
                                               time_limit_s=task.time_limit_s, scratch=scratch)
        except Exception as exc:  # noqa: BLE001
            out["sensitivity"] = {"gains_pct": {}, "shares": {}, "binding": "unknown",
                                  "notes": [f"sensitivity failed: {type(exc).__name__}: {exc}"[:300]]}
    out["task_time_s"] = time.perf_counter() - t0
    return out


# =============================================================================================
# Cost, energy, Pareto front, purchase optimizer
# =============================================================================================


def _gpu_value(table: Mapping[str, float], gpu: str) -> float | None:
    for k, v in table.items():
        if get_gpu(k).id == gpu:
            return float(v)
    return None


def node_overhead_w(pricing: PricingSpec, gpu: str) -> float:
    v = pricing.node_overhead_w
    if isinstance(v, dict):
        x = _gpu_value(v, gpu)
        if x is not None:
            return x
    elif v is not None:
        return float(v)
    return get_gpu(gpu).tdp_w * NODE_OVERHEAD_FRACTION_GPU.get(gpu, NODE_OVERHEAD_FRACTION)


def _topology_levels(study: Study, option: Option) -> list[TopologyLevel]:
    if option.topology in study.spec.networks:
        return list(study.spec.networks[option.topology].levels)
    return list(get_topology(option.topology).levels)


def port_price_usd(study: Study, option: Option) -> float:
    """Scale-out capex per GPU: 0 on a single node, else the study's price or the default rule."""
    levels = _topology_levels(study, option)
    if option.num_gpus <= levels[0].size or len(levels) < 2:
        return 0.0
    net = study.spec.networks.get(option.topology)
    if net is not None and net.usd_per_network_port is not None:
        return net.usd_per_network_port
    if study.spec.pricing.usd_per_network_port is not None:
        return study.spec.pricing.usd_per_network_port
    return USD_PER_PORT_PER_GB_S * levels[1].bandwidth_gb_per_s


def price_option(study: Study, option: Option, wall_s: float) -> dict[str, float]:
    """Cost (USD), capex, energy (MWh) and facility power (MW) of running `option` for `wall_s`."""
    pr = study.spec.pricing
    gpu = get_gpu(option.gpu)
    hours = wall_s / 3600.0
    per_gpu_w = gpu.tdp_w + node_overhead_w(pr, option.gpu)
    power_w = option.num_gpus * per_gpu_w * pr.pue
    energy_kwh = power_w * hours / 1000.0
    out = {"power_mw": power_w / 1e6, "energy_mwh": energy_kwh / 1000.0}
    if option.mode == "cloud":
        rate = _gpu_value(pr.usd_per_gpu_hour, option.gpu) or gpu.price.usd_per_gpu_hour
        out.update(cost_usd=rate * option.num_gpus * hours, capex_usd=0.0, cloud_usd=rate * option.num_gpus * hours,
                   amortized_capex_usd=0.0, power_usd=0.0, usd_per_gpu_hour=rate)
    else:
        purchase = _gpu_value(pr.purchase_usd_per_gpu, option.gpu) or gpu.price.purchase_usd
        node = _topology_levels(study, option)[0].size
        nodes = math.ceil(option.num_gpus / node)
        capex = option.num_gpus * purchase + nodes * pr.usd_per_node + option.num_gpus * port_price_usd(study, option)
        amort = capex * (hours / 24.0) / (pr.amortization_years * 365.0)
        power_usd = energy_kwh * pr.usd_per_kwh
        out.update(cost_usd=amort + power_usd, capex_usd=capex, cloud_usd=0.0, amortized_capex_usd=amort,
                   power_usd=power_usd, purchase_usd_per_gpu=purchase)
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (time, cost) point, whether no other point is <= in both and < in one."""
    flags = []
    for i, (t, c) in enumerate(points):
        dominated = any((t2 <= t and c2 <= c) and (t2 < t or c2 < c) for j, (t2, c2) in enumerate(points) if j != i)
        flags.append(not dominated)
    return flags


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One purchasable choice for the optimizer: totals over the workloads it must serve."""

    id: str
    time_s: float
    cost_usd: float
    capex_usd: float
    power_mw: float


@dataclasses.dataclass(frozen=True)
class Decision:
    index: int | None  # into the candidates; None: nothing meets the constraints
    objective: str  # time | cost
    status: str  # CP-SAT status of the first solve
    meets: tuple[bool, ...]  # per candidate


def resolve_objective(constraints: ConstraintSpec) -> str:
    if constraints.objective != "auto":
        return constraints.objective
    return "cost" if constraints.deadline_days is not None and constraints.budget_usd is None else "time"


# Integer scaling of the optimizer: seconds, cents, watts.
def _scaled(c: Candidate) -> dict[str, int]:
    return {"time": int(round(c.time_s)), "cost": int(round(c.cost_usd * 100)),
            "capex": int(round(c.capex_usd * 100)), "power": int(round(c.power_mw * 1e6))}


def _scaled_limits(cons: ConstraintSpec) -> dict[str, int | None]:
    return {"time": None if cons.deadline_days is None else int(math.floor(cons.deadline_days * 86400)),
            "cost": None if cons.budget_usd is None else int(math.floor(cons.budget_usd * 100)),
            "capex": None if cons.capex_budget_usd is None else int(math.floor(cons.capex_budget_usd * 100)),
            "power": None if cons.power_cap_mw is None else int(math.floor(cons.power_cap_mw * 1e6))}


def violations(c: Candidate, cons: ConstraintSpec) -> list[str]:
    """The constraints a candidate breaks, in words (same integer scaling as the optimizer)."""
    v, lim = _scaled(c), _scaled_limits(cons)
    out = []
    if lim["cost"] is not None and v["cost"] > lim["cost"]:
        out.append(f"cost {money(c.cost_usd)} > budget {money(cons.budget_usd)}")
    if lim["capex"] is not None and v["capex"] > lim["capex"]:
        out.append(f"capex {money(c.capex_usd)} > capex budget {money(cons.capex_budget_usd)}")
    if lim["power"] is not None and v["power"] > lim["power"]:
        out.append(f"power {c.power_mw:.2f} MW > cap {cons.power_cap_mw:g} MW")
    if lim["time"] is not None and v["time"] > lim["time"]:
        out.append(f"{c.time_s / 86400:.1f} days > deadline {cons.deadline_days:g} days")
    return out


def optimize_purchase(cands: Sequence[Candidate], constraints: ConstraintSpec) -> Decision:
    """Choose exactly one candidate with CP-SAT: one boolean each, budget / capex / power /
    deadline as linear constraints on integer-scaled values (cents, watts, seconds),
    minimizing time (or cost), then the other, then the candidate index (deterministic:
    one worker, fixed seed)."""
    from ortools.sat.python import cp_model  # noqa: PLC0415

    objective = resolve_objective(constraints)
    meets = tuple(not violations(c, constraints) for c in cands)
    if not cands:
        return Decision(None, objective, "NO_CANDIDATES", meets)
    vals = [_scaled(c) for c in cands]
    lim = _scaled_limits(constraints)
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{i}") for i in range(len(cands))]
    m.add_exactly_one(x)
    for key, bound in lim.items():
        if bound is not None:
            m.add(sum(v[key] * xi for v, xi in zip(vals, x)) <= bound)
    second = "cost" if objective == "time" else "time"
    status_name = "OPTIMAL"
    for i, key in enumerate((objective, second, "index")):
        expr = sum((v[key] if key != "index" else j) * xi for j, (v, xi) in enumerate(zip(vals, x)))
        m.minimize(expr)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 0
        solver.parameters.max_time_in_seconds = 30.0
        st = solver.solve(m)
        if i == 0:
            status_name = solver.status_name(st)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return Decision(None, objective, status_name, meets)
        m.add(expr == int(round(solver.objective_value)))
    chosen = next(i for i, xi in enumerate(x) if solver.boolean_value(xi))
    return Decision(chosen, objective, status_name, meets)


def _constraint_text(cons: ConstraintSpec) -> str:
    parts = []
    if cons.budget_usd is not None:
        parts.append(f"budget {money(cons.budget_usd)}")
    if cons.capex_budget_usd is not None:
        parts.append(f"capex budget {money(cons.capex_budget_usd)}")
    if cons.power_cap_mw is not None:
        parts.append(f"power cap {cons.power_cap_mw:g} MW")
    if cons.deadline_days is not None:
        parts.append(f"deadline {cons.deadline_days:g} days")
    return ", ".join(parts)


def explain_decision(cands: Sequence[Candidate], dec: Decision, cons: ConstraintSpec) -> str:
    """Why this candidate: what it achieves, which constraints it meets, what better one was excluded."""
    obj = dec.objective
    ctext = _constraint_text(cons)
    key = (lambda c: (c.time_s, c.cost_usd)) if obj == "time" else (lambda c: (c.cost_usd, c.time_s))
    word = "fastest" if obj == "time" else "cheapest"
    if dec.index is None:
        if not cands:
            return "no option has a feasible plan"
        lines = [f"no option meets {ctext}"]
        for label, pick in (("fastest", min(cands, key=lambda c: (c.time_s, c.cost_usd))),
                            ("cheapest", min(cands, key=lambda c: (c.cost_usd, c.time_s)))):
            lines.append(f"the {label} option {pick.id} breaks: {'; '.join(violations(pick, cons))}")
        return "; ".join(lines)
    c = cands[dec.index]
    n_ok = sum(dec.meets)
    text = (f"{c.id}: {c.time_s / 86400:.1f} days, {money(c.cost_usd)}"
            + (f" (capex {money(c.capex_usd)})" if c.capex_usd else "") + f", {c.power_mw:.2f} MW; the {word} "
            + (f"of the {n_ok} options (of {len(cands)} with a feasible plan) that meet {ctext}" if ctext and n_ok > 1
               else f"and only option (of {len(cands)} with a feasible plan) that meets {ctext}" if ctext
               else f"of the {len(cands)} options with a feasible plan (no constraints given)"))
    better = [d for d in cands if key(d) < key(c)]
    if better:
        b = min(better, key=key)
        text += f"; the {word} overall, {b.id} ({b.time_s / 86400:.1f} days, {money(b.cost_usd)}), breaks: " \
                + "; ".join(violations(b, cons))
    return text


# =============================================================================================
# The study run
# =============================================================================================


@dataclasses.dataclass
class StudyResult:
    out_dir: Path
    complete: bool
    rows: list[dict[str, Any]]
    recommended: dict[str, Any] | None
    recommendations: list[dict[str, Any]]
    files: list[Path]
    elapsed_s: float
    document: dict[str, Any]

    def summary_text(self) -> str:
        """A few lines for a terminal: the recommendation(s), warnings and where the files are."""
        lines = []
        for rec in self.recommendations:
            lines.append(f"{rec['scope']}: {rec['option'] or 'no option meets the constraints'}")
            lines.append(f"  {rec['reason']}")
        feas = sum(1 for r in self.rows if r.get("feasible"))
        lines.append(f"{feas} of {len(self.rows)} rows have a feasible plan; {len(self.document.get('warnings', []))} "
                     f"warning(s); {self.elapsed_s:.1f} s")
        lines.append(f"wrote {self.out_dir / 'results.json'}, results.csv"
                     + (", report.md, report.html" if any(p.name == "report.html" for p in self.files) else "")
                     + f" and {sum(1 for p in self.files if p.suffix == '.png')} plot(s) in {self.out_dir}")
        return "\n".join(lines) + "\n"


ProgressFn = Callable[[int, int, str], None]


def _default_notes(spec: StudySpec, options: Sequence[Option]) -> list[str]:
    notes = []
    pr = spec.pricing
    modes = {o.mode for o in options}
    for gid in sorted({o.gpu for o in options}, key=lambda g: gpu_ids().index(g) if g in gpu_ids() else 999):
        g = get_gpu(gid)
        if "cloud" in modes and _gpu_value(pr.usd_per_gpu_hour, gid) is None:
            notes.append(f"{gid}: cloud price ${g.price.usd_per_gpu_hour:g}/GPU-h from the catalog "
                         f"({g.sources.get('price', 'no source')})")
        if "own" in modes and _gpu_value(pr.purchase_usd_per_gpu, gid) is None:
            notes.append(f"{gid}: purchase price ${g.price.purchase_usd:,.0f}/GPU from the catalog")
        notes.append(f"{gid}: {g.tdp_w:g} W TDP ({g.sources.get('tdp_w', 'catalog')}) + "
                     f"{node_overhead_w(pr, gid):g} W node overhead per GPU")
    if "own" in modes:
        notes.append(f"owned: ${pr.usd_per_kwh:g}/kWh, PUE {pr.pue:g}, {pr.amortization_years:g}-year amortization, "
                     f"${pr.usd_per_node:,.0f}/node; scale-out port "
                     + (f"${pr.usd_per_network_port:,.0f}/GPU" if pr.usd_per_network_port is not None else
                        f"${USD_PER_PORT_PER_GB_S:g} per GB/s of per-GPU scale-out bandwidth (assumption)"))
    else:
        notes.append(f"facility: PUE {pr.pue:g} (energy only; cloud rates include power)")
    rel = spec.reliability
    if rel.enabled:
        d = reliability_defaults()
        notes.append(f"failures: {failure_rate(rel, 'h100-sxm'):.3g}/GPU-h"
                     + (" (Llama 3 paper: 419 unexpected interruptions in 54 days on 16,384 H100)"
                        if rel.failures_per_gpu_hour is None else " (study)")
                     + f"; restart {_rel(rel, 'restart_s'):g} s + checkpoint read; checkpoint "
                     f"{_rel(rel, 'checkpoint_bytes_per_param'):g} B/param at "
                     f"{_rel(rel, 'storage_gb_per_s_per_gpu'):g} GB/s per GPU "
                     f"(min {_rel(rel, 'storage_min_gb_per_s'):g} GB/s)"
                     + ("" if rel.storage_gb_per_s_per_gpu is not None else
                        f" ({d['storage_source'].strip()[:60]}...)"))
    else:
        notes.append("reliability disabled: no failure losses")
    notes.append("one purchase per decision: a mix of GPU types is not modelled")
    return notes


def _tasks(study: Study, time_limit_s: float, scratch: str) -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    for w in study.workloads:
        for o in study.options:
            key = _task_key(w, o)
            if key not in tasks:
                tasks[key] = Task(key, w.problem(o, study.spec.networks), f"{w.base} on {o.hw_id}", o.num_gpus,
                                  time_limit_s, study.spec.sensitivity, scratch)
    return tasks


def _task_key(w: Workload, o: Option) -> str:
    h = hashlib.sha256(w.problem_key.encode()).hexdigest()[:12]
    return f"{h}:{o.hw_id}:{o.catalog or ''}"


def _execute(tasks: Sequence[Task], jobs: int, progress: ProgressFn | None, done: dict[str, dict], *,
             executor: str = "local", scheduler: str | None = None) -> None:
    """Run tasks, filling `done` as they finish (so an interrupt keeps what finished)."""
    total = len(tasks)
    order = sorted(tasks, key=lambda t: (-t.num_gpus, t.key))  # big clusters first: better balance
    if progress:
        progress(0, total, "")
    if executor == "dask":
        _execute_dask(order, jobs, progress, done, scheduler)
        return
    if jobs <= 1 or total <= 1:
        for t in order:
            done[t.key] = run_task(t)
            if progress:
                progress(len(done), total, t.label)
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    pool = ctx.Pool(processes=min(jobs, total), initializer=_ignore_sigint)
    labels = {t.key: t.label for t in order}
    try:
        for res in pool.imap_unordered(run_task, order, chunksize=1):
            done[res["key"]] = res
            if progress:
                progress(len(done), total, labels[res["key"]])
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()


# ---- Dask executor (optional extra: pip install 'autoshard[dask]') ------------------------------

EXECUTORS = ("local", "dask")
DASK_EXTRA_HINT = "the dask executor needs `pip install 'autoshard[dask]'`"


def _import_distributed() -> Any:
    """The `distributed` module, or a one-line InputError naming the extra."""
    try:
        import distributed  # noqa: PLC0415
    except ImportError:
        raise InputError(DASK_EXTRA_HINT) from None
    return distributed


# Run by each worker of a LocalCluster started here (a Dask "preload" given as source text), in the
# worker's main thread: the workers ignore Ctrl-C, like the local pool's workers, and the interrupt
# is handled by the client (cancel, close) instead of by a traceback from every worker.
_WORKER_PRELOAD = """
import signal


def dask_setup(worker):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
"""


@contextlib.contextmanager
def _sigint_deferred() -> Any:
    """Hold a Ctrl-C that arrives inside the block and raise it on exit: a cluster being started is
    assigned first, so the caller can close it."""
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None or previous == signal.SIG_IGN or previous == signal.SIG_DFL:
        yield
        return
    hit: list[Any] = []
    signal.signal(signal.SIGINT, lambda signum, frame: hit.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if hit:
            if previous is signal.default_int_handler or not callable(previous):
                raise KeyboardInterrupt
            previous(signal.SIGINT, hit[0])


def _local_cluster(distributed: Any, n_workers: int) -> Any:
    import logging  # noqa: PLC0415

    # On 127.0.0.1, no dashboard, the scheduler's HTTP routes (health, metrics) on a free port instead of
    # 8787 (which another cluster may hold); worker logs only at ERROR (a cancel logs warnings).
    return distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                    dashboard_address=None,
                                    scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
                                    silence_logs=logging.ERROR, preload=[_WORKER_PRELOAD])


def _dask_failure(task: Task, exc: BaseException) -> dict[str, Any]:
    """A task that the cluster could not run (worker lost, autoshard missing on a worker): an error row."""
    return {"key": task.key, "status": "error",
            "reason": f"dask: {type(exc).__name__}: {exc}".splitlines()[0][:300]}


def _execute_dask(order: Sequence[Task], jobs: int, progress: ProgressFn | None, done: dict[str, dict],
                  scheduler: str | None) -> None:
    """Run tasks on a Dask cluster: the scheduler at `scheduler`, else a LocalCluster of `jobs`
    single-threaded worker processes started for this run. The same `run_task` as the local pool;
    results are gathered as they complete. On an interrupt the pending futures are cancelled and the
    client (and a cluster started here) closed; what finished stays in `done`."""
    distributed = _import_distributed()
    total = len(order)
    cluster = client = None
    futures: list[Any] = []
    by_key: dict[str, Task] = {}
    try:
        if scheduler:
            try:
                client = distributed.Client(scheduler, set_as_default=False)
            except (OSError, TimeoutError, ValueError) as exc:
                raise InputError(f"cannot connect to the dask scheduler: {' '.join(str(exc).split())}",
                                 source=scheduler) from None
        else:
            with _sigint_deferred():  # a Ctrl-C while it starts is raised after `cluster` is set
                cluster = _local_cluster(distributed, min(jobs, total))
            client = distributed.Client(cluster, set_as_default=False)
        run_id = uuid.uuid4().hex[:12]  # unique keys: a shared scheduler may run other sweeps too
        for i, t in enumerate(order):  # big clusters first, as in the local pool
            key = f"autoshard-whatif-{run_id}-{i}"
            by_key[key] = t
            futures.append(client.submit(run_task, t, key=key, pure=False, priority=total - i))
        for fut in distributed.as_completed(futures, loop=client.loop):
            task = by_key[fut.key]
            try:
                res = fut.result()
            except Exception as exc:  # noqa: BLE001  (a lost worker must not sink the sweep; reported per row)
                res = _dask_failure(task, exc)
            done[res["key"]] = res
            if progress:
                progress(len(done), total, task.label)
    except BaseException:
        if client is not None and futures:
            try:
                client.cancel(futures)
            except Exception:  # noqa: BLE001, S110  (closing below releases them anyway)
                pass
        raise
    finally:  # a failure to close must not hide the result or the interrupt
        for closable in (client, cluster):
            if closable is not None:
                try:
                    closable.close()
                except Exception:  # noqa: BLE001, S110
                    pass


def _row(study: Study, w: Workload, o: Option, res: dict[str, Any] | None) -> dict[str, Any]:
    from .cost import total_params  # noqa: PLC0415

    row: dict[str, Any] = {"workload": w.name, "option": o.id, "gpu": o.gpu, "num_gpus": o.num_gpus,
                           "topology": o.topology, "mode": o.mode, "tokens": w.tokens}
    if res is None or res.get("status") != "ok":
        row.update(feasible=False, status=(res or {}).get("status", "not run"),
                   reason=(res or {}).get("reason", "not run"),
                   suggestions=(res or {}).get("suggestions", []))
        return row
    row["status"] = "ok"
    gp = goodput(o.num_gpus, total_params(w.model), study.spec.reliability, o.gpu)
    steps = math.ceil(w.tokens / w.training.tokens_per_step)
    ideal_s = steps * res["step_time_s"]
    row.update({k: res[k] for k in ("plan", "plan_short", "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib",
                                    "memory_capacity_gib", "time_breakdown_s", "bottleneck", "solver_status",
                                    "solve_time_s")})
    sens = res.get("sensitivity") or {}
    gains = sens.get("gains_pct", {})
    row.update(binding=sens.get("binding"), resource_shares=sens.get("shares", {}),
               hbm_plus_gpu=sens.get("hbm_plus_gpu"), sensitivity_notes=sens.get("notes", []),
               memory_utilization=sens.get("memory_utilization"))
    for k in ("internode_2x", "nvlink_2x", "hbm_plus", "fp8"):
        row[f"gain_{k}_pct"] = gains.get(k)
    row.update(steps=steps, ideal_days=ideal_s / 86400, goodput=gp.ratio, mtbf_h=gp.mtbf_s / 3600,
               checkpoint_gb=gp.checkpoint_bytes / 1e9, checkpoint_s=gp.checkpoint_s,
               checkpoint_interval_s=gp.interval_s, restart_s=gp.restart_s)
    if gp.ratio <= 0:
        row.update(feasible=False, reason=f"the cluster fails (MTBF {gp.mtbf_s / 3600:.2f} h) faster than it can "
                                          f"checkpoint and restart: no progress")
        return row
    wall_s = ideal_s / gp.ratio
    row.update(time_to_train_days=wall_s / 86400, **price_option(study, o, wall_s))
    row["tokens_per_usd"] = w.tokens / row["cost_usd"] if row["cost_usd"] > 0 else None
    row["feasible"] = True
    return row


def _candidate(row_group: Sequence[dict[str, Any]], cid: str) -> Candidate | None:
    if not all(r.get("feasible") for r in row_group):
        return None
    return Candidate(cid, sum(r["time_to_train_days"] for r in row_group) * 86400,
                     sum(r["cost_usd"] for r in row_group), max(r["capex_usd"] for r in row_group),
                     max(r["power_mw"] for r in row_group))


def _recommend(study: Study, rows: list[dict[str, Any]], scope: str, group: list[Workload]) -> dict[str, Any]:
    cons = study.spec.constraints
    by = {(r["workload"], r["option"]): r for r in rows}
    cands: list[Candidate] = []
    for o in study.options:
        grp = [by.get((w.name, o.id)) for w in group]
        if any(g is None for g in grp):
            continue
        c = _candidate(grp, o.id)  # type: ignore[arg-type]
        if c is not None:
            cands.append(c)
    dec = optimize_purchase(cands, cons)
    chosen = cands[dec.index] if dec.index is not None else None
    return json_safe({
        "scope": scope, "workloads": [w.name for w in group], "option": chosen.id if chosen else None,
        "objective": dec.objective, "status": dec.status, "constraints": cons.model_dump(exclude_none=True),
        "time_to_train_days": chosen.time_s / 86400 if chosen else None,
        "cost_usd": chosen.cost_usd if chosen else None, "capex_usd": chosen.capex_usd if chosen else None,
        "power_mw": chosen.power_mw if chosen else None,
        "candidates": len(cands), "meeting_constraints": sum(dec.meets),
        "reason": explain_decision(cands, dec, cons),
    })


def _warnings(study: Study, rows: list[dict[str, Any]]) -> list[str]:
    """Checks a reader should see: non-monotone scaling (often a solver time limit), unproven plans, errors."""
    out: list[str] = []
    seen: set[str] = set()
    for w in study.workloads:
        if w.base in seen:
            continue
        seen.add(w.base)
        wr = [r for r in rows if r["workload"] == w.name and r.get("step_time_s") is not None]
        series: dict[tuple[str, str], dict[int, dict]] = {}
        for r in wr:
            series.setdefault((r["gpu"], r["topology"]), {})[r["num_gpus"]] = r
        for (g, t), pts in series.items():
            ns = sorted(pts)
            for a, b in zip(ns, ns[1:]):
                ra, rb = pts[a], pts[b]
                if rb["tokens_per_s"] < ra["tokens_per_s"] * 0.999:
                    why = (f"its plan is {rb['solver_status']}, not proven optimal: a longer time_limit_s may find a "
                           "better one" if rb.get("solver_status") != "OPTIMAL" else
                           "more GPUs do not help this global batch size")
                    out.append(f"{w.base}: {g} x{b} ({t}) is slower than x{a} ({rb['tokens_per_s']:,.0f} vs "
                               f"{ra['tokens_per_s']:,.0f} tokens/s); {why}")
        unproven = sorted({f"{r['gpu']} x{r['num_gpus']}" for r in wr
                           if r.get("solver_status") not in (None, "OPTIMAL")})
        if unproven:
            out.append(f"{w.base}: {len(unproven)} plan(s) hit the solver time limit (FEASIBLE, not proven optimal): "
                       + ", ".join(unproven[:12]) + (" ..." if len(unproven) > 12 else ""))
        errs = {r["option"].rsplit("/", 1)[0]: r for r in rows
                if r["workload"] == w.name and r.get("status") == "error"}
        for r in errs.values():
            out.append(f"{w.base}: {r['gpu']} x{r['num_gpus']} ({r['topology']}) failed: {r['reason']}")
    return out


def _document(study: Study, results: dict[str, dict], complete: bool, elapsed: float, jobs: int,
              time_limit_s: float, *, recommend: bool = True,
              executor: str = "local") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    for w in study.workloads:
        for o in study.options:
            res = results.get(_task_key(w, o))
            if res is None and not complete:
                continue
            rows.append(_row(study, w, o, res))
    cons = study.spec.constraints
    pareto: dict[str, list[str]] = {}
    for w in study.workloads:
        wr = [r for r in rows if r["workload"] == w.name]
        feas = [r for r in wr if r.get("feasible")]
        flags = pareto_front([(r["time_to_train_days"], r["cost_usd"]) for r in feas])
        for r, f in zip(feas, flags):
            r["pareto"] = f
        for r in wr:
            r.setdefault("pareto", False)
            if r.get("feasible"):
                v = violations(Candidate(r["option"], r["time_to_train_days"] * 86400, r["cost_usd"],
                                         r["capex_usd"], r["power_mw"]), cons)
                r["violations"] = v
                r["meets_constraints"] = not v
            else:
                r["violations"] = []
                r["meets_constraints"] = False
        pareto[w.name] = [r["option"] for r in feas if r["pareto"]]
    recs = []
    warnings = _warnings(study, rows)
    if not recommend:
        pass
    elif study.spec.combine == "sum":
        recs.append(_recommend(study, rows, "all workloads on one cluster, one after another", list(study.workloads)))
    else:
        for w in study.workloads:
            recs.append(_recommend(study, rows, f"workload {w.name}", [w]))
    recommended = recs[0] if recs else None
    for r in rows:
        r["recommended"] = any(rec["option"] == r["option"] and r["workload"] in rec["workloads"] for rec in recs)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "study": study.name,
        "description": study.spec.description,
        "source": study.source,
        "complete": complete,
        "combine": study.spec.combine,
        "sensitivity_mode": study.spec.sensitivity,
        "workloads": [{"name": w.name, "model": w.model.name, "tokens": w.tokens,
                       "training": w.training.model_dump(mode="json")} for w in study.workloads],
        "options": [o.id for o in study.options],
        "constraints": cons.model_dump(exclude_none=True),
        "assumptions": list(study.notes),
        "rows": rows,
        "warnings": warnings,
        "pareto": pareto,
        "recommended": recommended,
        "recommendations": recs,
        "timing": {"elapsed_s": elapsed, "jobs": jobs, "executor": executor, "time_limit_s": time_limit_s,
                   "tasks_done": len(results)},
    }
    return json_safe(doc), rows


def results_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), extrasaction="ignore", lineterminator="\n")
    wr.writeheader()
    for r in rows:
        out = {}
        for k in CSV_COLUMNS:
            v = r.get("plan_short") if k == "plan" else r.get(k)
            if isinstance(v, float):
                v = f"{v:.6g}"
            elif isinstance(v, list):
                v = "; ".join(str(x) for x in v)
            elif v is None:
                v = ""
            out[k] = v
        wr.writerow(out)
    return buf.getvalue()


def _write_results(out_dir: Path, doc: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[Path]:
    paths = [out_dir / "results.json", out_dir / "results.csv"]
    atomic_write(paths[1], results_csv(rows))
    atomic_write(paths[0], dumps_json(doc))
    return paths


def run_study(study: str | os.PathLike[str] | Mapping[str, Any] | StudySpec | Study, out_dir: str | os.PathLike[str],
              *, jobs: int = 1, time_limit_s: float | None = None, progress: ProgressFn | None = None,
              report: bool = True, executor: str = "local", scheduler: str | None = None) -> StudyResult:
    """Run a what-if study and write its results and report into `out_dir`.

    `jobs`: worker processes (0: one per CPU). `time_limit_s`: per solve (default: the
    study's `time_limit_s`, else 10 s). `progress(done, total, label)` is called with
    done=0 before the first task and after each finished task (label: "workload on
    gpu/num_gpus/topology"). On KeyboardInterrupt the finished rows are written to
    results.json (`complete: false`) and results.csv, and the interrupt is re-raised.

    `executor`: "local" (default: a process pool on this machine) or "dask" (needs the
    `autoshard[dask]` extra): the options are solved on the Dask scheduler at `scheduler`
    (e.g. "tcp://host:8786"; `jobs` is then unused: the cluster's workers decide), else on a
    `distributed.LocalCluster` of `jobs` single-threaded worker processes started for this run.
    Remote workers need the same autoshard installed and any catalog files a study names at the
    same paths. The results are the same as the local executor's (timing fields aside).
    """
    if executor not in EXECUTORS:
        raise InputError(f"unknown executor {executor!r} (valid: {', '.join(EXECUTORS)})", field="executor")
    if scheduler and executor != "dask":
        raise InputError("a scheduler address needs the dask executor", field="scheduler")
    if executor == "dask":
        _import_distributed()  # fail on the missing extra before any work
    st = study if isinstance(study, Study) else load_study(study)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", source=str(out))
    limit = float(time_limit_s if time_limit_s is not None else (st.spec.time_limit_s or DEFAULT_TIME_LIMIT_S))
    jobs = (os.cpu_count() or 1) if jobs == 0 else max(1, int(jobs))
    t0 = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="autoshard-whatif-")
    results: dict[str, dict] = {}
    written = False
    try:
        tasks = _tasks(st, limit, scratch)
        _execute(list(tasks.values()), jobs, progress, results, executor=executor, scheduler=scheduler)
        doc, rows = _document(st, results, True, time.perf_counter() - t0, jobs, limit, executor=executor)
        files = _write_results(out, doc, rows)
        written = True
    except KeyboardInterrupt:
        # Keep what finished: rows and Pareto flags, no purchase decision (complete: false).
        if not written:
            doc, rows = _document(st, results, False, time.perf_counter() - t0, jobs, limit, recommend=False,
                                  executor=executor)
            _write_results(out, doc, rows)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    errors = [r["reason"] for r in results.values() if r.get("status") == "error"]
    if results and len(errors) == len(results):
        raise AutoshardError(f"every option failed to solve (see {out / 'results.json'}); the first: {errors[0]}")
    if report:
        from .report import write_report  # noqa: PLC0415  (matplotlib is imported there, on use)

        files += write_report(doc, out)
    return StudyResult(out, True, rows, doc["recommended"], doc["recommendations"], files,
                       time.perf_counter() - t0, doc)

"""What-if study files: the schema (pydantic) and the records `load_study` (whatif/study.py) expands it into."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from ..catalog import get_gpu, gpu_ids, resolve_model
from ..fileio import dumps_json
from ..spec import MAX_GPUS, ModelSpec, Problem, SearchSpec, Strict, TopologyLevel, TrainingSpec
from ..schema_errors import format_validation_error

Mode = Literal["cloud", "own", "spot"]  # spot: rented preemptible capacity (cloud price less spot_discount)
Objective = Literal["auto", "time", "cost"]
SensitivityMode = Literal["solve", "evaluate", "off"]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]

DEFAULT_TIME_LIMIT_S = 10.0
SCHEMA_VERSION = 1

# ---- price and power defaults (sources in the comments; the study can override each) --------
USD_PER_KWH = 0.08  # US EIA Electric Power Monthly: average industrial retail price ~8 cents/kWh (2023-24)
PUE = 1.3  # assumption: modern colocation; Uptime Institute survey average ~1.58 (2023), hyperscale ~1.1
AMORTIZATION_YEARS = 4.0  # assumption: GPU servers' economic life (hyperscalers depreciate over 5-6 years)
SPOT_DISCOUNT = 0.7  # seed 003: spot instances save 60-90% vs on-demand; its worked example uses 70% ($6,291 -> $1,887)


# =============================================================================================
# Study schema
# =============================================================================================


MAX_SWEEP_VALUES = 4096  # GPU counts one option entry may sweep
MAX_OPTIONS = 20_000  # hardware options of a whole study (at ~0.5 s a solve on 2 cores: ~1.5 hours)
MAX_TOKENS = 1e16  # 10 quadrillion: ~250x the largest published pretraining corpus (Llama 4: ~40T tokens)


class RangeSpec(Strict):
    """GPU counts from `start` to `stop` (inclusive): `step` apart, or multiplied by `factor`
    (default: doubling)."""

    start: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    stop: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    step: Annotated[int, Field(ge=1)] | None = None
    factor: Annotated[float, Field(gt=1, le=1024)] | None = None

    @model_validator(mode="after")
    def _check(self) -> "RangeSpec":
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop}) is below start ({self.start}): give start <= stop")
        if self.step is not None and self.factor is not None:
            raise ValueError(f"give step ({self.step}) or factor ({self.factor:g}), not both")
        n = self.count()
        if n > MAX_SWEEP_VALUES:
            has = f"{n:,}" if self.step is not None else f"more than {MAX_SWEEP_VALUES:,}"
            raise ValueError(f"the range from {self.start} to {self.stop} has {has} values, more than the "
                             f"{MAX_SWEEP_VALUES:,} allowed: use a larger step or factor")
        return self

    def count(self) -> int:
        if self.step is not None:
            return (self.stop - self.start) // self.step + 1
        return len(self.values())

    def values(self) -> list[int]:
        out: list[int] = []
        n = self.start
        if self.step is not None:
            return list(range(self.start, self.stop + 1, self.step))[:MAX_SWEEP_VALUES + 1]
        factor = self.factor or 2.0
        while n <= self.stop and len(out) <= MAX_SWEEP_VALUES:
            out.append(n)
            n = max(n + 1, int(round(n * factor)))
        return out


def _number(v: Any) -> Any:
    """A number written as text (YAML 1.1 reads `5.0e10` as a string) as a number; else unchanged."""
    if isinstance(v, str):
        try:
            f = float(v.strip().replace("_", ""))
        except ValueError:
            return v
        return int(f) if f.is_integer() and abs(f) < 2**63 and "." not in v and "e" not in v.lower() else f
    return v


def _gpu_count(v: Any, what: str = "a GPU count") -> int:
    v = _number(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(f"{what} must be a whole number, got {v!r}"[:200])
    if not 1 <= v <= MAX_GPUS:
        raise ValueError(f"{what} must be from 1 to {MAX_GPUS:,}, got {v:g}")
    return int(v)


def _gpu_counts(v: Any) -> Any:
    """`num_gpus`: a count, a list of counts or a range, each error in one plain line (no pydantic
    union member names)."""
    if isinstance(v, RangeSpec):
        return v
    if isinstance(v, dict):
        try:
            return RangeSpec(**v)
        except ValidationError as exc:
            loc, msg = format_validation_error(exc, RangeSpec)
            raise ValueError(f"range {loc}: {msg}" if loc else f"range: {msg}") from None
        except TypeError:
            raise ValueError("a range needs text field names (start, stop, step or factor)") from None
    if isinstance(v, list):
        if not v:
            raise ValueError("an empty list allows nothing")
        return [_gpu_count(x, f"item {i} ({x!r})"[:60]) for i, x in enumerate(v)]
    if isinstance(_number(v), (int, float)) and not isinstance(v, bool):
        return _gpu_count(v)
    raise ValueError(f"expected a GPU count, a list of counts or a range {{start, stop, step or factor}}, got "
                     f"{v!r}"[:200])


def _token_budget(v: Any) -> Any:
    def one(x: Any, what: str) -> float:
        x = _number(x)
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise ValueError(f"{what} must be a number of tokens, got {x!r}"[:200])
        if not (math.isfinite(x) and x >= 1):
            raise ValueError(f"{what} must be a number of tokens >= 1, got {x!r}")
        if x > MAX_TOKENS:
            raise ValueError(f"{what} {x:.3g} is more than the {MAX_TOKENS:.0e} allowed (10 quadrillion; the "
                             f"largest published pretraining runs use ~4e13)")
        return float(x)

    if isinstance(v, list):
        return [one(x, f"item {i}") for i, x in enumerate(v)]
    return one(v, "the budget")


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

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, v: Any) -> Any:
        return _token_budget(v)

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

    @field_validator("num_gpus", mode="before")
    @classmethod
    def _counts(cls, v: Any) -> Any:
        return _gpu_counts(v)


class PoolSpec(Strict):
    """A pool of one GPU type of a fleet: owned already, or a candidate purchase (`owned: false`).
    Each training job runs on one pool (no job spans two generations or networks)."""

    name: Annotated[str, Field(min_length=1, max_length=80)]
    gpu: str
    num_gpus: Annotated[int, Field(ge=1, le=MAX_GPUS)]
    topology: str | None = None  # catalog preset or a study `networks:` name; default: the GPU's
    owned: bool = True  # false: to be bought (its capex counts once, in the scenarios that buy it)
    catalog: str | None = None  # calibrated catalog overlay


# Sanity bounds of prices and reliability inputs: far beyond any real figure (an H100 rents for ~$2-3/h,
# a GPU costs $10-70k, a restart takes minutes), they keep every derived figure finite and readable.
def _between(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Any:
    return Field(gt=lo if lo_open else None, ge=None if lo_open else lo,
                 lt=hi if hi_open else None, le=None if hi_open else hi)


def _number_or_table(v: Any, lo: float, hi: float, hi_open: bool = False) -> Any:
    """A number, or a table {gpu: number}, each checked against [lo, hi] (hi excluded when `hi_open`)
    with a plain message (no pydantic union member names)."""
    def one(x: Any, what: str) -> float:
        x = _number(x)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"{what} must be a number, got {x!r}"[:200])
        if x < lo or x > hi or (hi_open and x == hi):
            raise ValueError(f"{what} must be from {lo:g} to {hi:g}{' (excluded)' if hi_open else ''}, got {x:g}")
        return float(x)

    if v is None:
        return v
    if isinstance(v, dict):
        return {k: one(x, str(k)) for k, x in v.items()}
    return one(v, "the value")


class PricingSpec(Strict):
    mode: Mode | list[Mode] = "cloud"
    usd_per_gpu_hour: dict[str, Annotated[float, _between(0, 1e4, lo_open=True)]] = {}
    purchase_usd_per_gpu: dict[str, Annotated[float, _between(0, 1e7, lo_open=True)]] = {}
    usd_per_node: Annotated[float, _between(0, 1e8)] = 0.0
    usd_per_network_port: Annotated[float, _between(0, 1e7)] | None = None
    usd_per_kwh: Annotated[float, _between(0, 100)] = USD_PER_KWH
    pue: Annotated[float, Field(ge=1.0, le=3.0)] = PUE
    amortization_years: Annotated[float, _between(0.1, 100)] = AMORTIZATION_YEARS
    node_overhead_w: float | dict[str, float] | None = None  # W per GPU, 0 to 100,000
    spot_discount: float | dict[str, float] = SPOT_DISCOUNT  # fraction off the cloud rate (0 to <1), per GPU or all
    power_figure: str = "catalog"  # catalog: tdp_w + node overhead; or a source of the catalog's system_power_w

    @field_validator("node_overhead_w", mode="before")
    @classmethod
    def _overhead(cls, v: Any) -> Any:
        return _number_or_table(v, 0, 1e5)

    @field_validator("spot_discount", mode="before")
    @classmethod
    def _discount(cls, v: Any) -> Any:
        return _number_or_table(v, 0, 1, hi_open=True)


class ReliabilitySpec(Strict):
    enabled: bool = True
    failures_per_gpu_hour: float | dict[str, float] | None = None  # 0 to 1
    restart_s: Annotated[float, _between(0, 1e6)] | None = None
    checkpoint_bytes_per_param: Annotated[float, _between(0, 1e3, lo_open=True)] | None = None
    storage_gb_per_s_per_gpu: Annotated[float, _between(0, 1e6, lo_open=True)] | None = None
    storage_min_gb_per_s: Annotated[float, _between(0, 1e6, lo_open=True)] | None = None
    storage_max_gb_per_s: Annotated[float, _between(0, 1e6, lo_open=True)] | None = None
    checkpoint_overhead_s: Annotated[float, _between(0, 1e5)] | None = None
    checkpoint_interval_s: Annotated[float, _between(1, 1e8)] | None = None  # fixed interval instead of Young/Daly
    spot_preemptions_per_gpu_hour: Annotated[float, _between(0, 1)] | None = None  # on top of failures, spot only
    other_loss_fraction: Annotated[float, _between(0, 0.99)] | None = None  # wall time lost outside the cost model

    @field_validator("failures_per_gpu_hour", mode="before")
    @classmethod
    def _failures(cls, v: Any) -> Any:
        return _number_or_table(v, 0, 1)


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
    options: list[OptionSpec] = []  # at least one option or one fleet pool
    # A fleet: pools owned and to be bought; the study also answers which pool each job (workload)
    # runs on, the job mix's time, cost and energy, and what to buy next (whatif/fleet.py).
    fleet: list[PoolSpec] = []
    networks: dict[str, NetworkSpec] = {}
    pricing: PricingSpec = PricingSpec()
    reliability: ReliabilitySpec = ReliabilitySpec()
    constraints: ConstraintSpec = ConstraintSpec()
    combine: Literal["each", "sum"] = "each"  # each workload its own question, or one cluster for all
    sensitivity: SensitivityMode = "evaluate"
    time_limit_s: Positive | None = None  # per solve

    @field_validator("sensitivity", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML 1.1 reads a bare `off` as false

    @model_validator(mode="after")
    def _something_to_price(self) -> "StudySpec":
        if not self.options and not self.fleet:
            raise ValueError("give `options` or a `fleet` of pools: the study has no hardware to price")
        names = [p.name for p in self.fleet]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"two fleet pools are named {dup!r}; give each a distinct name")
        return self


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
class Pool:
    name: str
    option: Option  # priced as owned hardware (mode own)
    owned: bool  # False: a candidate purchase


@dataclasses.dataclass(frozen=True)
class Study:
    spec: StudySpec
    workloads: tuple[Workload, ...]
    options: tuple[Option, ...]
    source: str | None
    notes: tuple[str, ...]  # which documented defaults were used
    pools: tuple[Pool, ...] = ()  # the fleet, in the study's order

    @property
    def name(self) -> str:
        return self.spec.name or (Path(self.source).stem if self.source else "study")


def power_figures(options: Sequence[Option]) -> list[str]:
    """`catalog` and the other sources of per-GPU power (`system_power_w`) of the options' GPUs."""
    out = ["catalog"]
    for o in options:
        out += [k for k in get_gpu(o.gpu).system_power_w if k not in out]
    return out


def fmt_tokens(t: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if t >= div:
            return f"{t / div:g}{unit}"
    return f"{t:g}"

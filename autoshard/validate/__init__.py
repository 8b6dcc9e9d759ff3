"""Check `evaluate` against published, measured training runs (`validation/dev_runs.json`).

    from autoshard.validate import validate, format_report
    print(format_report(validate()))

Rows of `modern_runs_dev.json` (2024-2026 stacks, with the extra fields `etp`, `moe_ffn`,
`first_k_dense`, `head_dim`, `nvlink_domain_gpus`) are converted by `autoshard.validate.modern`;
the report then has per-source and per-regime tables (dense/MoE, GPU architecture, BF16/FP8/FP4).
Groups of measured configurations (`ablations_dev.json`) are ranked by `autoshard.validate.ablations`.

Every row of the runs file becomes a `Case` (a Problem, a Plan and the measured step time)
or a `Skip` with the reason. We compare **step times** (sources count FLOPs differently,
so MFU is not comparable): `step_time_s` where the source gives it; for a row whose
`tflops_formula` is `megatron-eq3` (Narayanan et al. 2021 Table 1 gives only TFLOP/s per GPU,
computed with their eq. (3)), ``step = F / (tflops_per_gpu * 1e12 * gpu_count)`` with
``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))``. A row that states `measured_peak_memory_gib` (or
`_gb`) is also checked for memory (`Report.memory`).

Every fact is read from a field of the row (validation/README.md, "Fields that state facts"), never
from a source's or a model's name; a missing fact takes the documented default.

Mapping of a row to a Problem and a Plan
----------------------------------------

=========================  ===========================================================================
row field / situation      autoshard
=========================  ===========================================================================
gpu                        through the catalog's aliases (`catalog.resolve_gpu_id`: 'A100-SXM4-80GB',
                           'H100 80GB HBM3', 'NVIDIA H100 SXM5'); unknown: bad input, one line with
                           the closest names
topology                   `topology` (a preset), else the GPU's default topology
precision                  'fp16 mixed' -> bf16 (same tensor rate on A100); 'BF16' -> bf16;
                           'FP8' -> fp8
model                      layers, hidden, ffn, heads, kv_heads (default heads), vocab; hidden_act
                           (default silu), dropout (false), tie_word_embeddings (false); a value
                           the source did not print is stated with its origin in `filled` (notes)
hidden / heads / ffn /     skipped ("model dimensions not published"; Grok-1 rows)
  vocab null; ep > 1
  without experts
training                   seq_len, global_batch_size = global_batch_seqs, optimizer adam;
                           flash_attention (default true)
tp, pp, cp, ep             as given, null -> 1
dp                         as given, else gpu_count / (tp pp cp)
micro_batch                micro_batch_size
vpp                        vpp_chunks (or (layers/pp) / layers_per_virtual_stage); schedule
                           'interleaved' when vpp > 1, else '1f1b'
sequence_parallel          `sp`, default on when tp > 1
zero_stage                 fsdp true -> 3 (and tp = pp = 1, dp = gpu_count); else `zero_stage`,
                           default 1 (Megatron's distributed optimizer)
data-parallel facts        overlap_grad_reduce, overlap_param_gather (default true), reshard_after_forward
                           (always / never / N / default; default: the framework's policy),
                           dp_replicate (default 1): `modern.dp_knobs_of`
recompute                  'full ...' -> full; 'selective: m1, m2' -> those recompute modules
                           (spec.RECOMPUTE_MODULES); 'selective ...' -> selective; null -> the least
                           recompute that fits (solver, every published degree fixed)
measured step              step_time_s; else eq. (3) where `tflops_formula` says so; else
                           global_batch_tokens / tokens_per_sec
framework                  `framework` (default megatron): the profile that prices the run; with pp = 1
                           the schedule is 1f1b, or the framework's own where it has none (MaxText: gpipe)
source group               `source_group`, else `source_family`, else `source` up to the first comma
=========================  ===========================================================================

`korthikanti_check()` compares the activation memory of the cost model with Korthikanti
et al. 2022 (Table 2) for a GPT-3 175B layer.
"""

from __future__ import annotations

import dataclasses

import math
import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..errors import InputError
from .. import cost
from ..catalog import resolve_gpu_id, unknown_gpu_message
from ..cost import evaluate
from ..cost.layers import _activation_bytes
from ..errors import InfeasibleError
from ..frameworks import get_framework
from ..loader import load_problem, read_runs
from ..solver import solve
from ..spec import Plan, canonical_recompute
from ..tables import Column, table_text
from .cases import (  # noqa: F401  (re-exported: the run records and row readers, cases.py)
    Case,
    GB_PER_GIB,
    PRECISION_MAP,
    Skip,
    as_int,
    filled_notes,
    global_batch_seqs,
    measured_peak_memory_gib,
    measured_step,
    narayanan_flops,
    row_dp,
    source_group,
)
from .modern import dp_knobs_of, row_flag, gpu_arch, is_modern_row, modern_row_to_case, precision_family, topology_of

RUNS_ENV = "AUTOSHARD_VALIDATION"

def _recompute(value: Any) -> str | None:
    if value is None:
        return "none"
    text = str(value).strip().lower()
    if text in ("", "none", "no", "off", "false"):
        return "none"
    if text.startswith("full"):
        return "full"
    head, _, modules = text.partition(":")
    if head.strip() == "selective" and modules.strip():  # "selective: core_attn, mlp_up, layernorm"
        try:
            return canonical_recompute(modules)
        except ValueError:
            return None
    if text.startswith("selective"):
        return "selective"
    return None


def run_to_case(row: Mapping[str, Any]) -> Case | Skip:
    """One dev_runs row -> a Case (Problem, Plan, measured step) or a Skip with the reason.

    Rows of modern_runs_dev.json (with its extra fields) go through `modern.modern_row_to_case`."""
    if is_modern_row(row):
        try:
            return modern_row_to_case(row)
        except InputError:
            raise
        except (ValueError, TypeError, KeyError, ZeroDivisionError) as exc:  # a cell of the wrong kind
            return Skip(str(row.get("id") or "?"), source_group(row), f"does not convert: {exc}")

    rid = str(row.get("id") or "?")
    group = source_group(row)
    notes: list[str] = []

    def skip(reason: str) -> Skip:
        return Skip(rid, group, reason)

    # ---- measured step
    meas, how = measured_step(row)
    if meas is None or not meas > 0:
        return skip(how)
    notes.append(f"measured step {how}")

    # ---- hardware

    gpu_name = str(row.get("gpu") or "").strip()
    gpu = resolve_gpu_id(gpu_name)
    if gpu is None:
        raise InputError(unknown_gpu_message(gpu_name), field=f"{rid}.gpu")
    prec_name = str(row.get("precision") or "").strip()
    precision = PRECISION_MAP.get(prec_name.lower())
    if precision is None:
        return skip(f"precision {prec_name!r} has no mapping")
    n = as_int(row.get("gpu_count"))
    if not n:
        return skip("gpu_count not published")

    # ---- model
    if row.get("moe_experts") is None and row.get("ep") not in (None, 1):
        return skip("model dimensions not published (MoE expert count / top-k missing)")
    if row.get("moe_experts"):
        return skip("MoE rows are not mapped (expert FFN size not in the row)")
    missing = [k for k in ("layers", "hidden", "vocab", "seq_len") if row.get(k) in (None, "")]
    if missing:
        return skip(f"model dimensions not published ({', '.join(missing)} null)")
    layers, hidden = int(row["layers"]), int(row["hidden"])
    heads, ffn = as_int(row.get("heads")), as_int(row.get("ffn"))
    if heads is None:
        return skip("model dimensions not published (heads null)")
    if ffn is None:
        return skip("model dimensions not published (ffn null)")
    notes += filled_notes(row)
    # The architecture from the row's fields (validation/README.md), never from the model's name.
    model = dict(hidden_act=str(row.get("hidden_act") or "silu"), dropout=row_flag(row, "dropout", False),
                 tie_word_embeddings=row_flag(row, "tie_word_embeddings", False),
                 num_key_value_heads=as_int(row.get("kv_heads"), heads))
    model.update(name=str(row.get("model") or rid), num_hidden_layers=layers, hidden_size=hidden,
                 intermediate_size=ffn, num_attention_heads=heads, vocab_size=int(row["vocab"]),
                 source=f"dev_runs {rid}")

    # ---- parallel plan
    fsdp = bool(row.get("fsdp"))
    tp, pp = as_int(row.get("tp"), 1), as_int(row.get("pp"), 1)
    cp, ep = as_int(row.get("cp"), 1), as_int(row.get("ep"), 1)
    dp: int | None
    if fsdp:
        if tp != 1 or pp != 1:
            notes.append(f"fsdp row with tp={tp} pp={pp}: priced as tp=pp=1")
        tp = pp = 1
        dp = n // cp
        zero = 3
    else:
        dp, why = row_dp(row, n, tp, pp, cp, notes)
        if dp is None:
            return skip(why or "")
        zero = as_int(row.get("zero_stage"), 1)  # absent: 1, Megatron's distributed optimizer
    mbs = as_int(row.get("micro_batch"), 1)
    gbs = global_batch_seqs(row)
    if gbs is None:
        return skip("global batch not published")
    vpp = as_int(row.get("vpp_chunks"))
    if vpp is None and row.get("layers_per_virtual_stage"):
        vpp = max(1, layers // pp // int(row["layers_per_virtual_stage"]))
    vpp = vpp or 1
    framework = str(row.get("framework") or "megatron")
    # one stage runs no pipeline schedule: 1f1b, or the framework's own name where it has no 1f1b (MaxText: gpipe)
    schedules = get_framework(framework).schedules
    schedule = "interleaved" if vpp > 1 else ("1f1b" if pp > 1 or "1f1b" in schedules else schedules[0])
    sp = row_flag(row, "sp", tp > 1)  # absent: on with TP (the Megatron / NeMo recipes)
    rc = _recompute(row.get("activation_recompute"))
    if rc is None:
        return skip(f"activation_recompute {row.get('activation_recompute')!r} has no mapping")
    published_rc = row.get("activation_recompute") is not None
    if not published_rc:
        notes.append("activation_recompute not published: the least recompute that fits, chosen per layer "
                     "by the solver with every published degree fixed")
    ga = as_int(row.get("grad_accum"))
    if ga is not None and dp * mbs * ga != gbs:
        notes.append(f"dp*mbs*grad_accum = {dp * mbs * ga} != global batch {gbs}")

    problem_doc = {
        "name": rid,
        "model": model,
        "training": {"seq_len": int(row["seq_len"]), "global_batch_size": gbs, "precision": precision,
                     "optimizer": "adam", "flash_attention": row_flag(row, "flash_attention", True)},
        "cluster": {"gpu": gpu, "num_gpus": n, "topology": str(row.get("topology") or topology_of(gpu)),
                    "power_cap_w": row.get("power_cap_w")},
        "framework": framework,
    }
    try:
        problem = load_problem(problem_doc)

        plan = Plan(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, schedule=schedule, sequence_parallel=sp,
                    zero_stage=zero, micro_batch_size=mbs, recompute=rc, **dp_knobs_of(row)[0])
    except (InputError, ValidationError, ValueError) as exc:
        return skip(f"does not convert: {str(exc).splitlines()[0]}")
    return Case(rid, group, gpu, precision, n, problem, plan, float(meas), tuple(notes), published_rc,
                measured_peak_memory_gib=measured_peak_memory_gib(row))


# Plan settings of a run that are not degrees of the search (solve leaves them to the framework).
RUN_KNOBS = ("tp_comm_overlap", "ep_overlap", "overlap_grad_reduce", "overlap_param_gather", "optimizer_offload",
             "cp_comm_type", "cuda_graphs", "cuda_graph_scope", "reshard_after_forward", "dp_replicate",
             "pipeline_rounds")


def completed_plan(case: Case) -> Any:
    """The case's plan, with recompute chosen per layer by the solver when the source does not
    publish it (a run recomputes what it must to fit; the degrees, micro-batch and schedule
    stay as published and the stages even)."""
    if case.recompute_published:
        return case.plan

    p = case.plan
    fixed = {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "vpp": p.vpp,
             "sequence_parallel": p.sp, "zero_stage": p.zero_stage, "micro_batch_size": p.micro_batch_size,
             "schedule": p.schedule, "placement": p.placement, "uniform_stages": True,
             # the dispatcher the run used (stated, else the framework's default), not the planner's pick
             "moe_dispatcher": p.moe_dispatcher or get_framework(case.problem.framework).moe_dispatchers[0],
             # the run's sharding, so the recompute chosen fits the memory it kept
             "dp_replicate": p.dp_replicate, "reshard_after_forward": p.reshard_after_forward,
             # the run fitted: no default search margin (its recompute is what fits at the edge, as evaluate prices)
             "headroom_gib": 0.0}
    problem = case.problem.model_copy(update={"search": case.problem.search.model_copy(update=fixed)})
    # The search space has no overlap, offload or CUDA-graph knobs: the run's own settings are kept.
    knobs = {k: getattr(p, k) for k in RUN_KNOBS}
    try:
        return solve(problem, time_limit_s=60, top_k=0).plan.model_copy(update=knobs)
    except InfeasibleError:
        return p.model_copy(update={"recompute": "full"})


# ---------------------------------------------------------------------------------------
# Reading runs
# ---------------------------------------------------------------------------------------


# The project's copies of the validation files (validation/README.md names each source). An editable
# install (`pip install -e .`) and a clone resolve this folder; a non-editable install does not carry
# it: pass the file (`autoshard validate RUNS.json`) or set $AUTOSHARD_VALIDATION.
VALIDATION_DIR = Path(__file__).resolve().parents[2] / "validation"
RUNS_FILE, MODERN_FILE, ABLATIONS_FILE = "dev_runs.json", "modern_runs_dev.json", "ablations_dev.json"


def validation_dir() -> Path:
    """The folder of the validation files: $AUTOSHARD_VALIDATION when set (a folder, or a runs file:
    then its folder), else the project's `validation/`."""
    env = os.environ.get(RUNS_ENV)
    if env:
        q = Path(env)
        return q if q.is_dir() else q.parent
    return VALIDATION_DIR


def validation_file(name: str) -> Path:
    """One of the validation files (`dev_runs.json`, `modern_runs_dev.json`, `ablations_dev.json`) in
    `validation_dir()`; whether it exists is for the reader to check (one line naming the path)."""
    return validation_dir() / name


def default_runs_path() -> Path:
    """$AUTOSHARD_VALIDATION (a dev_runs.json, or a folder holding one) when set, else the project's
    `validation/dev_runs.json`; bad input (one line) when that file is missing."""
    env = os.environ.get(RUNS_ENV)
    if env:
        q = Path(env)
        if q.is_dir():
            q = q / RUNS_FILE
        if q.is_file():
            return q
        raise InputError(f"${RUNS_ENV} points to no runs file", source=str(q))
    p = VALIDATION_DIR / RUNS_FILE
    if p.is_file():
        return p
    raise InputError(f"validation runs not found (a non-editable install does not carry the project's "
                     f"validation/ folder): pass RUNS.json or set ${RUNS_ENV}", source=str(p))


def load_runs(path: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Rows from a dev_runs-shaped JSON file (a list, or {runs: [...]}) or a CSV with the same columns,
    every cell checked: one line naming the file, row and column (see `autoshard.loader.read_runs`)."""
    return read_runs(path if path is not None else default_runs_path())


def with_catalog(case: Case, catalog: str | os.PathLike[str] | None) -> Case:
    """The case with its problem pointing at a calibrated catalog overlay."""
    if catalog is None:
        return case
    problem = case.problem
    cluster = problem.cluster.model_copy(update={"catalog": str(catalog)})
    return dataclasses.replace(case, problem=problem.model_copy(update={"cluster": cluster}))


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


@dataclass
class RunResult:
    id: str
    source_group: str
    gpu: str
    precision: str
    gpu_count: int
    plan: str
    measured_step_s: float
    predicted_step_s: float
    error_pct: float  # signed: (predicted - measured) / measured, in %
    abs_error_pct: float
    fits: bool
    reasons: list[str]
    time_breakdown_s: dict[str, float]
    peak_memory_gib: float
    notes: list[str]
    recipe: str = ""
    framework: str = "megatron"
    arch: str = ""
    moe: bool = False
    step_time_interval_s: tuple[float, float] | None = None  # the estimate's prediction interval
    measured_peak_memory_gib: float | None = None  # as the row states it (torch.cuda.max_memory_allocated)
    memory_error_pct: float | None = None  # signed: (predicted peak - measured) / measured, in %

    @property
    def regimes(self) -> list[str]:
        """The regimes this run counts in: dense/MoE, the GPU architecture, the precision family."""
        return ["MoE" if self.moe else "dense", self.arch or "other",
                precision_family(self.recipe or self.precision)]


@dataclass
class GroupSummary:
    source_group: str
    runs: int
    median_abs_error_pct: float
    median_error_pct: float  # signed: the systematic bias of the group
    worst_id: str
    worst_error_pct: float
    p90_abs_error_pct: float = math.nan


@dataclass
class Summary:
    n: int
    median_abs_error_pct: float
    p90_abs_error_pct: float
    worst_id: str
    worst_error_pct: float


@dataclass
class MemorySummary:
    """Predicted peak memory (`Estimate.peak_memory_gib`: allocated tensors, without the runtime reserve,
    as torch.cuda.max_memory_allocated counts) against the runs that state a measured peak."""

    n: int
    median_abs_error_pct: float
    p90_abs_error_pct: float
    worst_id: str
    worst_error_pct: float
    predicted_oom_that_ran: int  # runs with a measured peak whose priced plan is predicted not to fit


def summarize_memory(results: list["RunResult"]) -> MemorySummary:
    rs = [r for r in results if r.memory_error_pct is not None]
    if not rs:
        return MemorySummary(0, math.nan, math.nan, "", math.nan, 0)
    errs = [abs(r.memory_error_pct) for r in rs]  # type: ignore[arg-type]
    worst = max(rs, key=lambda r: (abs(r.memory_error_pct), r.id))  # type: ignore[arg-type]
    return MemorySummary(len(rs), statistics.median(errs), p90(errs), worst.id, worst.memory_error_pct,  # type: ignore[arg-type]
                         sum(not r.fits for r in rs))


@dataclass
class Report:
    runs_path: str
    catalog: str | None
    results: list[RunResult]
    skipped: list[Skip]
    summary: Summary
    by_source: list[GroupSummary] = field(default_factory=list)
    by_regime: list[GroupSummary] = field(default_factory=list)
    memory: MemorySummary | None = None  # where some runs state a measured peak memory

    def to_json(self) -> dict[str, Any]:
        return {
            "runs_path": self.runs_path,
            "catalog": self.catalog,
            "summary": asdict(self.summary),
            "memory": asdict(self.memory) if self.memory is not None else None,
            "by_source": [asdict(g) for g in self.by_source],
            "by_regime": [asdict(g) for g in self.by_regime],
            "results": [asdict(r) for r in self.results],
            "skipped": [asdict(s) for s in self.skipped],
        }


def p90(values: list[float]) -> float:
    """90th percentile, linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=10, method="inclusive")[8]


def summarize(results: list[RunResult]) -> Summary:
    if not results:
        return Summary(0, math.nan, math.nan, "", math.nan)
    errs = [r.abs_error_pct for r in results]
    worst = max(results, key=lambda r: (r.abs_error_pct, r.id))
    return Summary(len(results), statistics.median(errs), p90(errs), worst.id, worst.error_pct)


def summarize_groups(results: list[RunResult], key: Any = None) -> list[GroupSummary]:
    """Median, p90 and worst |error| per group; `key(result)` gives a result's groups (default:
    its source group)."""
    groups: dict[str, list[RunResult]] = {}
    for r in results:
        for g in (key(r) if key is not None else [r.source_group]):
            groups.setdefault(g, []).append(r)
    out = []
    for g, rs in groups.items():
        worst = max(rs, key=lambda r: (r.abs_error_pct, r.id))
        out.append(GroupSummary(g, len(rs), statistics.median(r.abs_error_pct for r in rs),
                                statistics.median(r.error_pct for r in rs), worst.id, worst.error_pct,
                                p90([r.abs_error_pct for r in rs])))
    return out


REGIME_ORDER = ("dense", "MoE", "Ampere", "Hopper", "Blackwell", "CDNA3", "CDNA4", "other", "BF16", "FP8", "FP4")


def summarize_regimes(results: list[RunResult]) -> list[GroupSummary]:
    """Per regime: dense/MoE, GPU architecture, precision family (a run counts in three)."""
    out = summarize_groups(results, key=lambda r: r.regimes)
    rank = {k: i for i, k in enumerate(REGIME_ORDER)}
    return sorted(out, key=lambda g: rank.get(g.source_group, len(rank)))


def evaluate_case(case: Case) -> RunResult | Skip:
    est = evaluate(case.problem, completed_plan(case))
    if not est.step_time_s > 0:
        return Skip(case.id, case.source_group, "plan rejected by the cost model: " + "; ".join(est.reasons))
    err = (est.step_time_s - case.measured_step_s) / case.measured_step_s * 100.0
    mem = case.measured_peak_memory_gib
    return RunResult(
        id=case.id, source_group=case.source_group, gpu=case.gpu, precision=case.precision,
        gpu_count=case.gpu_count, plan=est.plan.short(), measured_step_s=case.measured_step_s,
        predicted_step_s=est.step_time_s, error_pct=err, abs_error_pct=abs(err), fits=est.fits,
        reasons=list(est.reasons), time_breakdown_s=dict(est.time_breakdown_s),
        peak_memory_gib=est.peak_memory_gib, notes=list(case.notes), recipe=case.recipe or case.precision,
        framework=case.framework, arch=case.arch or gpu_arch(case.gpu), moe=case.problem.model.is_moe,
        step_time_interval_s=getattr(est, "step_time_interval_s", None), measured_peak_memory_gib=mem,
        memory_error_pct=None if mem is None else (est.peak_memory_gib - mem) / mem * 100.0)


def convert(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Case], list[Skip]]:
    cases: list[Case] = []
    skipped: list[Skip] = []
    for row in rows:
        c = run_to_case(row)
        (cases if isinstance(c, Case) else skipped).append(c)  # type: ignore[arg-type]
    return cases, skipped


def report_from_cases(cases: list[Case], skipped: list[Skip], *, runs_path: str = "",
                      catalog: str | None = None) -> Report:
    results: list[RunResult] = []
    skipped = list(skipped)
    for case in cases:
        r = evaluate_case(with_catalog(case, catalog))
        (results if isinstance(r, RunResult) else skipped).append(r)  # type: ignore[arg-type]
    memory = summarize_memory(results)
    return Report(runs_path, catalog, results, skipped, summarize(results), summarize_groups(results),
                  summarize_regimes(results), memory if memory.n else None)


def validate(runs_path: str | os.PathLike[str] | None = None, *,
             catalog: str | os.PathLike[str] | None = None) -> Report:
    """Predict every run of the file and compare with the measured step times.

    `catalog`: a calibrated catalog overlay (from `calibrate`) applied to every run.
    """
    path = Path(runs_path) if runs_path is not None else default_runs_path()
    if catalog is not None and not Path(catalog).is_file():
        raise InputError("calibrated catalog not found", source=str(catalog))
    try:
        cases, skipped = convert(load_runs(path))
    except InputError as exc:
        raise exc.at(str(path)) from None
    return report_from_cases(cases, skipped, runs_path=str(path),
                             catalog=str(catalog) if catalog is not None else None)


BREAKDOWN_COLS = (("compute", "comp"), ("recompute", "recomp"), ("tp_comm", "tp"), ("pp_comm", "pp"),
                  ("zero3_comm", "z3"), ("pipeline_bubble", "bubble"), ("dp_comm", "dp"),
                  ("optimizer", "opt"))


def format_report(report: Report) -> str:
    """A readable text table: every run, the skipped rows, the summary and the per-source table."""
    lines: list[str] = []
    lines.append(f"runs: {report.runs_path}" + (f"   catalog: {report.catalog}" if report.catalog else ""))
    lines.append("time breakdown columns: seconds per step on the critical path "
                 "(comp=compute, recomp=recompute, tp/pp=TP/PP comm, z3=ZeRO-3 comm, dp=exposed DP comm)")
    head: list[Column] = ["run", "gpu", "precision", ("N", "right"), ("meas s", "right"), ("pred s", "right"),
                          ("err %", "right"), "fits", *((short, "right") for _, short in BREAKDOWN_COLS),
                          ("other", "right")]
    rows: list[list[str]] = []
    group = None
    for r in sorted(report.results, key=lambda r: (r.source_group, r.precision, r.gpu_count, r.id)):
        if r.source_group != group:
            group = r.source_group
            rows.append([f"[{group}]"] + [""] * (len(head) - 1))
        bd = r.time_breakdown_s
        other = sum(v for k, v in bd.items() if k not in dict(BREAKDOWN_COLS))
        rows.append([r.id, r.gpu, r.recipe or r.precision, str(r.gpu_count), f"{r.measured_step_s:.3f}",
                     f"{r.predicted_step_s:.3f}", f"{r.error_pct:+.1f}", "yes" if r.fits else "NO",
                     *(f"{bd.get(k, 0.0):.2f}" for k, _ in BREAKDOWN_COLS), f"{other:.2f}"])
    lines.append(table_text(head, rows).rstrip("\n"))
    if report.skipped:
        lines.append("")
        lines.append(f"skipped ({len(report.skipped)}):")
        lines.append(table_text(["run", "why"], [[sk.id, sk.reason] for sk in report.skipped], indent=2).rstrip("\n"))
    not_fit = [r for r in report.results if not r.fits]
    if not_fit:
        lines.append("")
        lines.append(f"runs whose priced plan does not fit in memory ({len(not_fit)}; the source must use "
                     "memory savings the row does not state):")
        lines.append(table_text(["run", ("peak GiB", "right")], [[r.id, f"{r.peak_memory_gib:.1f}"] for r in not_fit],
                                indent=2).rstrip("\n"))
    s = report.summary
    lines.append("")
    lines.append(f"summary: n={s.n}  median |err| {s.median_abs_error_pct:.1f}%  p90 |err| "
                 f"{s.p90_abs_error_pct:.1f}%  worst {s.worst_id} ({s.worst_error_pct:+.1f}%)")
    if report.memory is not None:
        lines.append(memory_line(report.memory))
    lines.append("")
    lines += format_groups(report.by_source, "source")
    if report.by_regime:
        lines.append("")
        lines += format_groups(report.by_regime, "regime")
    return "\n".join(lines)


def memory_line(m: MemorySummary) -> str:
    """The memory summary: predicted peak (allocated, without the runtime reserve) vs measured."""
    return (f"memory: n={m.n} runs with a measured peak  median |err| {m.median_abs_error_pct:.1f}%  p90 |err| "
            f"{m.p90_abs_error_pct:.1f}%  worst {m.worst_id} ({m.worst_error_pct:+.1f}%)  predicted not to fit "
            f"but ran: {m.predicted_oom_that_ran}")


def format_groups(groups: list[GroupSummary], title: str) -> list[str]:
    """The per-source (or per-regime) table: runs, median / p90 |error|, median signed error, worst."""
    head: list[Column] = [title, ("runs", "right"), ("median |err| %", "right"), ("p90 |err| %", "right"),
                          ("median err %", "right"), "worst"]
    rows = [[g.source_group, str(g.runs), f"{g.median_abs_error_pct:.1f}", f"{g.p90_abs_error_pct:.1f}",
             f"{g.median_error_pct:+.1f}", f"{g.worst_id} ({g.worst_error_pct:+.1f}%)"] for g in groups]
    return table_text(head, rows).splitlines()


# ---------------------------------------------------------------------------------------
# Activation memory vs Korthikanti et al. 2022
# ---------------------------------------------------------------------------------------


def _gpt3_layer_problem(s: int, h: int, a: int, layers: int, vocab: int, b: int, num_gpus: int):
    return load_problem({
        "name": "korthikanti-check",
        "model": {"name": "gpt3-style", "num_hidden_layers": layers, "hidden_size": h,
                  "intermediate_size": 4 * h, "num_attention_heads": a, "num_key_value_heads": a,
                  "vocab_size": vocab, "hidden_act": "gelu", "dropout": True, "tie_word_embeddings": True},
        "training": {"seq_len": s, "global_batch_size": b * num_gpus, "precision": "bf16",
                     "flash_attention": False},
        "cluster": {"gpu": "h100-sxm", "num_gpus": num_gpus},
    })


def korthikanti_check(s: int = 2048, h: int = 12288, a: int = 96, b: int = 1, t: int = 8) -> list[dict[str, Any]]:
    """Per-layer activation bytes of `cost.layers._activation_bytes` vs Korthikanti et al. 2022 Table 2.

    GPT-3 style layer (gelu MLP of 4h, dropout, materialized attention scores: FlashAttention
    off). Rows: configuration, formula, cost-model bytes, formula bytes, ratio.
    """
    problem = _gpt3_layer_problem(s, h, a, layers=max(8, t), vocab=51200, b=b, num_gpus=t)
    ctx = cost.context(problem)

    def acts(tp: int, sp: bool) -> dict[str, float]:
        cfg = cost.Config(tp=tp, cp=1, ep=1, pp=1, dp=t // tp, vpp=1, sp=sp, zero=1, mbs=b,
                          schedule="1f1b", placement="tp-cp-ep-dp-pp")
        return _activation_bytes(ctx, cfg, cost.Shapes(ctx, cfg), "dense")

    sbh = s * b * h
    rows = [
        ("no parallelism", "sbh(34 + 5as/h)", acts(1, False)["none"], sbh * (34 + 5 * a * s / h)),
        (f"TP t={t}", "sbh(10 + 24/t + 5as/(ht))", acts(t, False)["none"],
         sbh * (10 + 24 / t + 5 * a * s / (h * t))),
        (f"TP+SP t={t}", "sbh(34/t + 5as/(ht))", acts(t, True)["none"], sbh * (34 / t + 5 * a * s / (h * t))),
        (f"TP+SP t={t}, selective recompute", "34 sbh/t", acts(t, True)["selective"], 34 * sbh / t),
        ("full recompute, no SP", "2 sbh", acts(1, False)["full"], 2 * sbh),
        (f"full recompute, TP+SP t={t}", "2 sbh/t", acts(t, True)["full"], 2 * sbh / t),
    ]
    return [{"config": c, "formula": f, "cost_model_bytes": m, "korthikanti_bytes": k, "ratio": m / k}
            for c, f, m, k in rows]


def format_korthikanti(rows: list[dict[str, Any]]) -> str:
    head: list[Column] = ["configuration", "formula", ("autoshard GiB", "right"), ("paper GiB", "right"),
                          ("ratio", "right")]
    return table_text(head, [[r["config"], r["formula"], f"{r['cost_model_bytes'] / 2**30:.3f}",
                              f"{r['korthikanti_bytes'] / 2**30:.3f}", f"{r['ratio']:.3f}"] for r in rows]).rstrip("\n")

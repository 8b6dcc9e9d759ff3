"""Rendering a solved (or failed) problem: machine JSON records, a Markdown report, terminal text.

- `solution_record(path, problem, solution)`: the JSON document of a solved problem (what
  `autoshard solve --json` prints and `autoshard batch` writes as `<name>.json`). Every
  value is deterministic except `solver.solve_time_s`; `strip_timing` removes it (and the
  matching line of the Markdown report) so that two runs compare byte for byte.
- `error_record(path, kind, message)`: the same document shape for a problem that could not
  be solved: `kind` is `input` (bad input, exit code 2), `infeasible` (exit code 1, with the
  binding constraint and suggestions) or `internal` (a bug; exit code 2).
- `solution_markdown(problem, solution)`: the human report.
- `estimate_text(problem, estimate)` / `solution_text(problem, solution)`: compact terminal text.

Nothing here imports CP-SAT: records are built from the pydantic models' dumps.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from . import __version__
from .catalog import gemm_peak_flops_per_s, get_gpu, get_recipe
from .cost import Config, context, dp_overlaps_refused, ep_overlap_state
from .cost.params import active_params, total_params
from .errors import AutoshardError
from .frameworks import get_framework
from .cost.intervals import interval_source, overlaps, upper
from .spec import mode_order
from .tables import Column, table_text

ERROR_KINDS = {"input": 2, "infeasible": 1, "internal": 3}
TIME_LABELS = {"compute": "compute", "recompute": "recompute", "tp_comm": "TP comm", "cp_comm": "CP comm",
               "ep_comm": "EP comm", "pp_comm": "PP comm", "zero3_comm": "ZeRO-3 gathers",
               "host": "host time", "offload": "host offload", "pipeline_bubble": "pipeline bubble", "dp_comm": "DP comm (exposed)", "optimizer": "optimizer step"}
MEMORY_COLUMNS = (("weights", "weights"), ("gradients", "grads"), ("optimizer_states", "optimizer"),
                  ("activations", "activations"))
PLAN_KNOBS = ("tp", "cp", "ep", "pp", "vpp", "dp", "sequence_parallel", "zero_stage", "micro_batch_size",
              "schedule", "recompute", "stage_layers", "placement")
SOLVE_TIME_ROW = "| solve time |"


def autoshard_version() -> str:
    return str(__version__)


# ---- hashing -------------------------------------------------------------------------------------


def input_hash(data: bytes, settings: Mapping[str, Any] | None = None, extra: Iterable[bytes] = ()) -> str:
    """sha256 of a problem file's bytes, the autoshard version and the solver settings (and
    the bytes of files it refers to, `extra`): equal hashes give equal solutions."""
    h = hashlib.sha256()
    h.update(b"autoshard-input\0" + autoshard_version().encode() + b"\0")
    h.update(json.dumps(dict(settings or {}), sort_keys=True).encode() + b"\0")
    h.update(len(data).to_bytes(8, "big") + data)
    for blob in extra:
        h.update(b"\0" + len(blob).to_bytes(8, "big") + blob)
    return h.hexdigest()


def file_hash(path: str | os.PathLike[str] | None, settings: Mapping[str, Any] | None = None) -> str | None:
    """`input_hash` of a file (None when there is no readable file)."""
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    return input_hash(data, settings)


# ---- JSON records --------------------------------------------------------------------------------


def json_safe(x: Any) -> Any:
    """JSON-safe: NaN and infinities become null (json would write invalid `NaN`)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def _gpu_id(problem: Any) -> str:
    try:
        return get_gpu(problem.cluster.gpu, problem.cluster.catalog).id
    except Exception:  # noqa: BLE001  (a label only; the solver reports a bad GPU properly)
        return str(problem.cluster.gpu)


def problem_info(path: str | os.PathLike[str] | None, problem: Any | None = None, name: str | None = None) -> dict:
    """The `problem` section of a record: name, path, model, gpu, num_gpus."""
    stem = Path(path).stem if path is not None else None
    info: dict[str, Any] = {"name": name or (problem.name if problem is not None else None) or stem or "problem",
                            "path": None if path is None else str(path)}
    if problem is not None:
        info.update(model=problem.model.name, gpu=_gpu_id(problem), num_gpus=problem.cluster.num_gpus)
    return info


def status_of(solution: Any) -> str:
    return str(solution.solver.status).lower()


def solution_record(problem_path: str | os.PathLike[str] | None, problem: Any, solution: Any, *,
                    input_sha256: str | None = None, settings: Mapping[str, Any] | None = None,
                    name: str | None = None, point: Any = None) -> dict[str, Any]:
    """The machine JSON of a solved problem.

    `input_sha256` defaults to `input_hash` of the file at `problem_path` with `settings`
    (None when there is no file). Only `solver.solve_time_s` depends on timing.
    `point`: the solver's point-estimate solution when `solve --robust` re-pointed `solution`
    (`intervals.robust_choice`): `solver.selection` is then `robust` (else `point`), and
    `solver.point_estimate` names the point-estimate optimum that `solver.objective_s` prices.
    """
    if input_sha256 is None:
        input_sha256 = file_hash(problem_path, settings)
    est = solution.estimate
    rec: dict[str, Any] = {
        "autoshard_version": autoshard_version(),
        "status": status_of(solution),
        "problem": problem_info(problem_path, problem, name),
        "input_sha256": input_sha256,
        "plan": solution.plan.model_dump(mode="json"),
        "plan_summary": solution.plan.short(),
        "estimate": est.model_dump(mode="json"),
        "solver": solution.solver.model_dump(mode="json"),
        "alternatives": [{
            "plan": alt.plan.model_dump(mode="json"), "plan_summary": alt.plan.short(), "differs": alt.differs,
            "family": getattr(alt, "family", ""),
            "slower_pct": alt.slower_pct, "step_time_s": alt.estimate.step_time_s,
            "tokens_per_s": alt.estimate.tokens_per_s, "mfu": alt.estimate.mfu, "hfu": alt.estimate.hfu,
            "peak_memory_gib": alt.estimate.peak_memory_gib, "fits": alt.estimate.fits,
            "step_time_interval_s": getattr(alt.estimate, "step_time_interval_s", None),
            "indistinguishable": indistinguishable(est, alt.estimate),
        } for alt in solution.alternatives],
    }
    rec["solver"]["selection"] = "point" if point is None else "robust"
    if point is not None:
        rec["solver"]["point_estimate"] = {
            "plan": point.plan.model_dump(mode="json"), "plan_summary": point.plan.short(),
            "step_time_s": point.estimate.step_time_s,
            "step_time_interval_s": getattr(point.estimate, "step_time_interval_s", None),
            "same_plan": point.plan == solution.plan}
    if settings is not None:
        rec["settings"] = dict(settings)
    return json_safe(rec)


def error_record(path: str | os.PathLike[str] | None, kind: str, message: str, suggestions: Iterable[str] = (), *,
                 problem: Any | None = None, input_sha256: str | None = None,
                 settings: Mapping[str, Any] | None = None, name: str | None = None) -> dict[str, Any]:
    """The JSON of a problem that has no solution: kind `input` (exit code 2), `infeasible`
    (exit code 1; `suggestions` are the smallest fixes) or `internal` (exit code 2)."""
    if kind not in ERROR_KINDS:
        raise ValueError(f"error kind must be one of {', '.join(ERROR_KINDS)}, got {kind!r}")
    rec: dict[str, Any] = {
        "autoshard_version": autoshard_version(),
        "status": "infeasible" if kind == "infeasible" else "error",
        "problem": problem_info(path, problem, name),
        "input_sha256": input_sha256,
        "error": {"kind": kind, "message": str(message), "suggestions": list(suggestions),
                  "exit_code": ERROR_KINDS[kind]},
    }
    if settings is not None:
        rec["settings"] = dict(settings)
    return rec


def record_exit_code(record: Mapping[str, Any]) -> int:
    """0 for a solution, else the error's exit code (1 infeasible, 2 bad input, 3 internal error)."""
    err = record.get("error")
    if not err:
        return 0
    return int(err.get("exit_code", ERROR_KINDS.get(err.get("kind", "input"), 2)))


def strip_timing(record: Any) -> Any:
    """A copy without the values that depend on timing: `solver.solve_time_s` of a record
    (dict), or the solve-time row of a Markdown report (str)."""
    if isinstance(record, str):
        return "".join(line for line in record.splitlines(keepends=True) if not line.startswith(SOLVE_TIME_ROW))
    rec = copy.deepcopy(record)
    if isinstance(rec, dict) and isinstance(rec.get("solver"), dict):
        rec["solver"].pop("solve_time_s", None)
    return rec


# ---- number formatting ---------------------------------------------------------------------------


def fmt_s(x: float | None) -> str:
    """Seconds, with a unit that keeps 3-4 significant digits: `1.23 s`, `45.6 ms`, `789 us`."""
    if x is None or not math.isfinite(x):
        return "-"
    a = abs(x)
    if a == 0:
        return "0 s"
    if a >= 100:
        return f"{x:,.0f} s"
    if a >= 1:
        return f"{x:.3g} s" if a < 10 else f"{x:.1f} s"
    if a >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} us"


def fmt_ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def fmt_num(x: float | None) -> str:
    """`1.23M`, `45.6k`, `789`."""
    if x is None or not math.isfinite(x):
        return "-"
    a = abs(x)
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if a >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def fmt_pct(x: float | None, scale: float = 100.0) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{scale * x:.1f}%"


def fmt_gib(x: float) -> str:
    return f"{x:.2f}"


def _md_cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]], align: str | None = None) -> list[str]:
    """A Markdown table; `align` one char per column (`l` / `r`), right by default for numbers."""
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---" for a in align]
    out = ["| " + " | ".join(_md_cell(h) for h in header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return out


def _recompute_counts(counts: Mapping[str, int]) -> str:
    parts = [f"{m} {n}" for m, n in counts.items() if n]
    return ", ".join(parts) or "-"


def _plan_value(plan: Any, knob: str) -> str:
    v = getattr(plan, knob)
    if knob == "sequence_parallel":
        return "on" if plan.sp else "off"
    if knob == "recompute" and not isinstance(v, str):
        return "per layer: " + ", ".join(f"{m} {v.count(m)}" for m in mode_order(v) if v.count(m))
    if knob == "stage_layers":
        return "even" if v is None else ", ".join(str(x) for x in v)
    return str(v)


def plan_short(plan: Any, num_gpus: int | None = None) -> str:
    """`Plan.short()`; a dp the plan leaves to the cluster is the GPUs over tp*cp*pp when `num_gpus`
    is given and they divide, else it is left out and said in words (only when that is the case:
    an invalid plan whose degrees divide is invalid for its other reasons)."""
    text = plan.short()
    if getattr(plan, "dp", 0) is None:
        mp = plan.tp * plan.cp * plan.pp
        if num_gpus and num_gpus % mp == 0:
            return text.replace("dpNone", f"dp{num_gpus // mp}")
        text = text.replace(" dpNone", "").replace("dpNone", "")
        if num_gpus:  # known not to divide
            text += f" (no dp: tp*cp*pp = {mp} does not divide the {num_gpus} GPUs)"
        else:
            text += " (dp: the GPUs over tp*cp*pp)"
    return text


def capacity_note(problem: Any) -> str:
    """` (deepspeed's 1.2x allocator overhead)` where the framework's allocator holds more than the cost
    model counts (`FrameworkProfile.allocator_overhead` divides the usable HBM), else ""."""
    if problem is None:
        return ""

    note = get_framework(problem.framework).allocator_note()
    return f" ({note})" if note else ""


def headroom_text(peak_gib: float, capacity_gib: float) -> str:
    """`12.3 GiB free, 15.8% headroom`, or `over by 3.4 GiB` (never a negative headroom)."""
    if peak_gib > capacity_gib:
        return f"over by {peak_gib - capacity_gib:.1f} GiB"
    share = (capacity_gib - peak_gib) / capacity_gib if capacity_gib else 0.0
    return f"{capacity_gib - peak_gib:.1f} GiB free, {fmt_pct(share)} headroom"


def training_settings(t: Any) -> list[str]:
    """The run settings of `training` beyond the defaults that change the price (for the reports)."""
    out = []
    if getattr(t, "fp8_params", False):
        out.append("FP8 weights")
    if getattr(t, "main_grads", None):
        out.append(f"{t.main_grads} main grads")
    if getattr(t, "moe_capacity_factor", None) is not None:
        out.append(f"token drop at capacity {t.moe_capacity_factor:g}")
    if getattr(t, "moe_load_imbalance", 1.0) > 1.0:
        out.append(f"MoE load imbalance {t.moe_load_imbalance:g}")
    if getattr(t, "launch_blocking", False):
        out.append("blocking launches")
    if getattr(t, "cross_entropy_fusion", False):
        out.append("fused cross entropy")
    if getattr(t, "defer_embedding_wgrad", False):
        lim = getattr(t, "wgrad_deferral_limit", 0)
        out.append(f"output-layer wgrad deferred ({lim or 'all'} micro-batches)")
    if not getattr(t, "flash_attention", True) and getattr(t, "softmax_fusion", "megatron") != "megatron":
        out.append(f"softmax fusion {t.softmax_fusion}")
    if getattr(t, "finetune", "full") != "full":
        out.append(f"{t.finetune} rank {t.lora_rank}")
    return out


def mfu_denominator(problem: Any) -> str:
    """` of the fp8 peak (1,979 TFLOP/s)` for a plan whose GEMMs run below 16 bits (MFU is against the
    dense peak of the recipe's GEMM data type, `catalog.gemm_peak_flops_per_s`), else "" (16-bit peak)."""
    try:
        dtype = get_recipe(problem.training.precision).gemm_dtype
        if dtype in ("bf16", "fp16"):
            return ""
        peak = gemm_peak_flops_per_s(get_gpu(problem.cluster.gpu, problem.cluster.catalog), problem.training.precision)
    except (AutoshardError, KeyError, AttributeError):  # an unknown GPU or recipe: the label is left out
        return ""
    return f" of the {dtype} peak ({peak / 1e12:,.0f} TFLOP/s)"


def fmt_params(n: float) -> str:
    """`70.6B`, `350M`: a parameter count as model cards write it."""
    return f"{n / 1e9:,.1f}B" if n >= 1e9 else f"{n / 1e6:,.0f}M"


def model_text(problem: Any) -> str:
    """`70.6B parameters, all active; priced for megatron` (MoE: `671.0B parameters, 37.6B active per
    token`): what the model file was read as and which framework's launcher the plan is priced for."""
    m = problem.model
    total, active = total_params(m), active_params(m)
    share = "all active" if active >= total else f"{fmt_params(active)} active per token"
    return f"{fmt_params(total)} parameters, {share}; priced for {problem.framework}"


def _title(problem: Any) -> str:
    name = problem.name or problem.model.name
    return f"{name}: {problem.model.name} on {problem.cluster.num_gpus}x {_gpu_id(problem)}"


def _tightest_stage(est: Any) -> tuple[Any, float] | None:
    """The stage closest to its HBM limit and its headroom (fraction of capacity left)."""
    if not est.stages:
        return None
    st = max(est.stages, key=lambda s: (s.peak_memory_gib, -s.rank))
    cap = est.memory_capacity_gib
    return st, ((cap - st.peak_memory_gib) / cap if cap else 0.0)


def _time_rows(est: Any) -> list[tuple[str, float, float]]:
    """(label, seconds, fraction of step) for every non-zero part of the step."""
    step = est.step_time_s
    keys = list(TIME_LABELS) + [k for k in est.time_breakdown_s if k not in TIME_LABELS]
    rows: list[tuple[str, float, float]] = []
    for k in keys:
        v = est.time_breakdown_s.get(k, 0.0)
        if v > 0:
            rows.append((TIME_LABELS.get(k, str(k)), v, v / step if step else 0.0))
    return rows


def binding_text(est: Any) -> str:
    """`bottleneck: compute (96.6% of the step); tightest memory: stage 0, 51.1 of 78.0 GiB (34.5% headroom)`."""
    parts = []
    if est.time_breakdown_s:
        b = est.bottleneck
        share = est.time_breakdown_s.get(b, 0.0) / est.step_time_s if est.step_time_s else 0.0
        parts.append(f"bottleneck: {TIME_LABELS.get(b, b)} ({fmt_pct(share)} of the step)")
    tight = _tightest_stage(est)
    if tight:
        st, head = tight
        parts.append(f"tightest memory: stage {st.rank}, {st.peak_memory_gib:.1f} of {est.memory_capacity_gib:.1f} "
                      f"GiB ({headroom_text(st.peak_memory_gib, est.memory_capacity_gib)})")
    return "; ".join(parts)


# ---- Markdown ------------------------------------------------------------------------------------


def _interval_source(problem: Any, est: Any) -> str:
    """Which validation runs the estimate's interval comes from (`intervals.interval_source`)."""
    moe = problem is not None and problem.model.is_moe
    return interval_source(est, moe) or "the validation runs"


def flop_budget_lines(est: Any) -> list[str]:
    """The training FLOP budget in words: per token (model under the named convention, hardware
    with recompute) and, with `training.tokens`, over the run. [] when the estimate has none."""
    b = getattr(est, "flop_budget", None)
    if b is None:
        return []
    k = b.flops_per_param_per_token
    out = [f"FLOP budget ({k} N + causal attention per token, the convention MFU counts): model "
           f"{b.model_flops_per_token:.3g} FLOP/token ({k}N {b.weight_flops_per_token:.3g} + attention "
           f"{b.attention_flops_per_token:.3g}; N = {b.matmul_params:.4g} matmul weights per token), hardware "
           f"{b.hardware_flops_per_token:.3g} with recompute (x{b.recompute_factor:.3f})"]
    if b.tokens is not None:
        out.append(f"over {b.tokens:.4g} tokens: model {b.model_flops:.3g} FLOP ({k} N T alone {b.weight_flops:.3g}), "
                   f"hardware {b.hardware_flops:.3g}; {b.steps:,} steps, {b.compute_days:,.1f} days of compute "
                   f"({b.gpu_hours:,.0f} GPU-hours, before failures and restarts)")
    return out


def _estimate_markdown(est: Any, problem: Any = None) -> list[str]:
    out: list[str] = []
    out += ["## Performance", ""]
    out += _table(["metric", "value"], [
        ["step time", fmt_s(est.step_time_s)],
        *([["likely step time (80% interval)", f"{fmt_s(est.step_time_interval_s[0])} to "
            f"{fmt_s(est.step_time_interval_s[1])} (from {_interval_source(problem, est)})"]]
          if getattr(est, "step_time_interval_s", None) else []),
        ["tokens / s", f"{est.tokens_per_s:,.0f}"],
        ["MFU", fmt_pct(est.mfu) + (mfu_denominator(problem) if problem is not None else "")],
        ["HFU", fmt_pct(est.hfu)],
        ["model TFLOP/s per GPU", f"{est.model_tflops_per_gpu:.1f}"],
        ["micro-batches per step", str(est.num_microbatches)],
        *([["FLOP budget", " ".join(flop_budget_lines(est))]] if getattr(est, "flop_budget", None) else []),
        ["peak memory", f"{est.peak_memory_gib:.2f} GiB of {est.memory_capacity_gib:.2f} GiB usable "
                        f"({fmt_pct(est.peak_memory_gib / est.memory_capacity_gib if est.memory_capacity_gib else 0)})"
                        f"{capacity_note(problem)}"],
    ])
    if est.stages and (overlap := ep_overlap_text(problem, est.plan)):
        out += ["", overlap + "."]
    if est.stages and (tail := dp_overlap_text(problem, est.plan)):
        out += ["", tail + "."]
    if est.warnings:
        out += ["", "Warnings:", ""] + [f"- {w}" for w in est.warnings]
    if est.reasons:
        out += ["", "**Does not fit:**", ""] + [f"- {r}" for r in est.reasons]
    out += ["", "## Where the step time goes", ""]
    rows = [[label, fmt_s(v), fmt_pct(share)] for label, v, share in _time_rows(est)]
    rows.append(["**total**", f"**{fmt_s(est.step_time_s)}**", "**100.0%**"])
    out += _table(["part", "time", "% of step"], rows)
    if est.stages:
        out += ["", "## Pipeline stages", "",
                "Forward and backward times are per micro-batch; memory in GiB per GPU "
                "(`other`: working buffers and ZeRO-3 gathered weights).", ""]
        header = ["rank", "layers", "dense / moe", "recompute", "fwd ms", "bwd ms", "in-flight micro-batches",
                  *[c for _, c in MEMORY_COLUMNS], "other", "peak GiB"]
        rows = []
        for st in est.stages:
            mem = st.memory_gib
            shown = sum(mem.get(k, 0.0) for k, _ in MEMORY_COLUMNS)
            extra = [("emb" if st.has_embedding else ""), ("head" if st.has_lm_head else "")]
            layers = str(st.layers) + (f" (+{'+'.join(e for e in extra if e)})" if any(extra) else "")
            rows.append([st.rank, layers, f"{st.dense_layers} / {st.moe_layers}", _recompute_counts(st.recompute),
                         fmt_ms(st.forward_s), fmt_ms(st.backward_s), f"{st.inflight_microbatches:.3g}",
                         *[fmt_gib(mem.get(k, 0.0)) for k, _ in MEMORY_COLUMNS],
                         fmt_gib(max(0.0, st.peak_memory_gib - shown)), fmt_gib(st.peak_memory_gib)])
        out += _table(header, rows, "rlll" + "r" * (len(header) - 4))
    out += ["", "## Binding constraint", ""]
    if est.time_breakdown_s:
        b = est.bottleneck
        share = est.time_breakdown_s.get(b, 0.0) / est.step_time_s if est.step_time_s else 0.0
        out.append(f"- Bottleneck: **{TIME_LABELS.get(b, b)}**, {fmt_s(est.time_breakdown_s.get(b, 0.0))} "
                   f"({fmt_pct(share)} of the step).")
    tight = _tightest_stage(est)
    if tight:
        st, head = tight
        out.append(f"- Memory: stage {st.rank} is closest to its HBM limit: {st.peak_memory_gib:.2f} of "
                   f"{est.memory_capacity_gib:.2f} GiB usable, {headroom_text(st.peak_memory_gib, est.memory_capacity_gib)}.")
    return out


def robust_text(point: Any, solution: Any) -> str:
    """What `solve --robust` did, in one sentence: which plan it picked and why, against the
    point-estimate optimum (`point`) that the solver's objective and status are about."""
    if point.plan == solution.plan:
        return (f"--robust: the point-estimate optimum also has the lowest upper end of the 80% interval "
                f"({fmt_s(upper(solution.estimate))}): kept")
    pe, re_ = point.estimate, solution.estimate
    return (f"--robust picked the plan with the lowest upper end of the 80% interval: {fmt_s(upper(re_))} "
            f"(point estimate {re_.step_time_s:.3f} s/step) against {fmt_s(upper(pe))} for the point-estimate "
            f"optimum `{point.plan.short()}` ({pe.step_time_s:.3f} s/step, "
            f"{100 * (re_.step_time_s - pe.step_time_s) / pe.step_time_s:.1f}% faster by point estimate)")


def dualpipe_line(st: Any) -> str:
    """What the DualPipe plans priced beside the proof gave (`solver/dualpipe_plans.py`)."""
    head = (f"DualPipe: {st.dualpipe_plans} plans priced beside the CP-SAT proof (one recompute mode on every "
            "layer, a balanced stage split each; not covered by the proof): ")
    if st.dualpipe_chosen:
        return head + "the chosen plan is the fastest of them that fits with the search's headroom"
    if st.dualpipe_best_s is None:
        return head + "none fits with the search's headroom"
    return head + (f"the fastest that fits with the search's headroom, {st.dualpipe_best_plan}, takes "
                   f"{st.dualpipe_best_s:.2f} s, no faster than the chosen plan")


def solver_status_text(solution: Any, point: Any = None) -> str:
    """`OPTIMAL`, or under --robust with another plan picked `OPTIMAL (point estimate 1.225 s/step)`:
    the status and the objective are the point-estimate optimum's, not the picked plan's."""
    st = solution.solver
    if point is None or point.plan == solution.plan:
        return str(st.status)
    return f"{st.status} (point estimate {point.estimate.step_time_s:.3f} s/step)"


def solution_markdown(problem: Any, solution: Any, point: Any = None) -> str:
    """The human report of a solved problem (Markdown); `point` as in `solution_record`."""
    plan, est, st = solution.plan, solution.estimate, solution.solver
    out = [f"# {_title(problem)}", ""]
    if getattr(st, "limit_fired", None):  # first: the answer is not proven (or may depend on the machine)
        out += [f"**Limit fired ({st.limit_fired}):** {st.status}, proven gap {100 * (st.gap or 0):.2f}%; to prove "
                f"the optimum, solve again with `{st.prove_command}`.", ""]
    if getattr(problem, "description", None):
        out += [problem.description.strip(), ""]
    out += [f"**Plan:** `{plan.short()}`: {fmt_s(est.step_time_s)} per step, {fmt_num(est.tokens_per_s)} tokens/s, "
            f"MFU {fmt_pct(est.mfu)}, peak {est.peak_memory_gib:.1f} / {est.memory_capacity_gib:.1f} GiB "
            f"({st.status.lower() if point is None or point.plan == plan else 'picked by --robust'}).", ""]
    if point is not None:
        out += [robust_text(point, solution) + ".", ""]
    t = problem.training
    extra = "".join(f", {s}" for s in training_settings(t))
    out += [f"Training: sequence length {t.seq_len}, global batch {t.global_batch_size} sequences "
            f"({t.tokens_per_step:,} tokens), {t.precision}, {t.optimizer}{extra}.", "",
            f"Model: {model_text(problem)}.", ""]
    out += ["## Plan", ""]
    out += _table(["knob", "value"], [[k, _plan_value(plan, k)] for k in PLAN_KNOBS], "ll")
    out += [""] + _estimate_markdown(est, problem)
    out += ["", "## Alternatives", ""]
    if solution.alternatives:
        rows = [[i + 1, fmt_s(a.estimate.step_time_s), f"{a.slower_pct:+.2f}%",
                 "indistinguishable" if indistinguishable(est, a.estimate) else "", getattr(a, "family", ""),
                 f"`{a.plan.short()}`", a.differs]
                for i, a in enumerate(solution.alternatives)]
        out += _table(["#", "step time", "slower", "vs the plan", "family", "plan", "differs"], rows, "rrrllll")
        out += ["", "Indistinguishable: the two 80% prediction intervals overlap (the model cannot tell "
                "which is faster; autoshard/cost/intervals.py)."]
        note = alternatives_note(st)
        if note:
            out += ["", note[0].upper() + note[1:] + "."]
    else:
        out.append("None: every other configuration was proven slower by its bound, or none fits.")
    out += ["", "## Solver", ""]
    gap = "-" if st.gap is None else f"{100 * st.gap:.3f}%"
    out += _table(["statistic", "value"], [
        ["status", solver_status_text(solution, point)],
        *([["selection", "robust (--robust: lowest upper end of the 80% interval)"]] if point is not None else []),
        ["objective", fmt_s(st.objective_s)],
        ["lower bound", fmt_s(st.objective_bound_s)],
        ["gap", gap],
        ["candidate configurations", st.candidates],
        ["pruned by memory bound", st.pruned_by_memory],
        ["pruned by time bound", st.pruned_by_bound],
        ["CP-SAT solves", st.cp_sat_solves],
        *([["DualPipe", dualpipe_line(st).removeprefix("DualPipe: ")]] if getattr(st, "dualpipe_plans", 0) else []),
        ["memory headroom kept by the search", f"{getattr(st, 'headroom_gib', 0.0):g} GiB per GPU"
         + (" (default: 5% of HBM, the memory model's measured error; --headroom 0 for the edge)"
            if getattr(st, "headroom_default", False) else "")],
        ["limit fired", {"wall": "the wall-clock safety net (the answer may depend on the machine's load)",
                         "work": "the work budget (the proof stopped; the gap is proven)"}.get(
                             getattr(st, "limit_fired", None) or "", "none (the search ended by itself)")
         + (f"; to prove the optimum: {st.prove_command}" if getattr(st, "prove_command", "") else "")],
        ["solve time", f"{st.solve_time_s:.2f} s"],
    ], "lr")
    return "\n".join(out) + "\n"


def error_markdown(record: Mapping[str, Any]) -> str:
    """The human report of an error record (bad input or infeasible)."""
    info, err = record.get("problem", {}), record.get("error", {})
    title = info.get("name") or "problem"
    if info.get("model"):
        title += f": {info['model']} on {info.get('num_gpus')}x {info.get('gpu')}"
    what = "Infeasible" if err.get("kind") == "infeasible" else ("Internal error" if err.get("kind") == "internal"
                                                                else "Input error")
    out = [f"# {title}", "", f"**{what}** (exit code {err.get('exit_code')}): {err.get('message', '')}", ""]
    if info.get("path"):
        out += [f"Input: `{info['path']}`", ""]
    if err.get("suggestions"):
        out += ["To fix it, any of:", ""] + [f"- {s}" for s in err["suggestions"]]
    return "\n".join(out).rstrip("\n") + "\n"


# ---- terminal text -------------------------------------------------------------------------------


def ep_overlap_text(problem: Any, plan: Any) -> str | None:
    """What the estimate assumed of the EP overlap where the plan could run it and does not ask for it
    (`cost.ep_overlap_state`): exports set the same; None where there is nothing to say."""
    if problem is None or plan is None or getattr(plan, "ep_overlap", True) is True or plan.ep <= 1:
        return None
    state = ep_overlap_state(problem, plan)
    if state == "refused":
        refused = "/".join(get_framework(problem.framework).ep_overlap_excludes_recompute)
        return f"EP overlap off: {problem.framework} refuses it beside this recompute ({refused})"
    return {"on": "EP overlap on: expert all-to-all under the other micro-batch's compute",
            "choice": "EP overlap off: the plan's choice",
            "unpaid": "EP overlap off: running it would expose more host launch time than the all-to-all it "
                      "hides (set `ep_overlap: true` to price it)"}.get(str(state))


def dp_overlap_text(problem: Any, plan: Any) -> str | None:
    """Which data-parallel overlaps the plan asks for and its framework's engine does not run
    (`cost.dp_overlaps`), None where none is refused."""
    if problem is None or plan is None or not plan.dp:
        return None
    grad, param = dp_overlaps_refused(context(problem), Config.of(plan, plan.dp))
    refused = []
    if grad:
        refused.append("reduces gradients after the last micro-batch" + (" (pipeline engine)" if plan.pp > 1 else ""))
    if param:
        refused.append("gathers the updated weights after the optimizer step")
    return f"DP tail exposed: {problem.framework} " + " and ".join(refused) if refused else None


def estimate_text(problem: Any, estimate: Any, *, reasons: bool = True) -> str:
    """Compact terminal summary of an estimate (ends with a newline). `reasons=False`: a plan
    that does not fit says how many reasons there are, the caller prints them (on stderr)."""
    est = estimate
    out = [f"{_title(problem)}", f"model: {model_text(problem)}", f"plan: {plan_short(est.plan, problem.cluster.num_gpus)}"]
    if est.stages and (overlap := ep_overlap_text(problem, est.plan)):
        out.append(overlap)
    if est.stages and (tail := dp_overlap_text(problem, est.plan)):
        out.append(tail)
    settings = training_settings(problem.training)
    if settings:
        out.insert(1, "training: " + ", ".join(settings))
    if not est.fits:
        head = "DOES NOT FIT" if est.stages else "INVALID PLAN"
        if reasons:
            out.append(head + ":")
            out += [f"  - {r}" for r in est.reasons]
        else:
            n = len(est.reasons)
            out.append(f"{head}: {n} reason{'s' if n != 1 else ''} (on stderr)")
    if est.stages:
        out.append(f"step time {fmt_s(est.step_time_s)}  tokens/s {est.tokens_per_s:,.0f}  "
                   f"MFU {fmt_pct(est.mfu)}{mfu_denominator(problem)}  "
                   f"HFU {fmt_pct(est.hfu)}  ({est.num_microbatches} micro-batches)")
        if getattr(est, "step_time_interval_s", None):
            lo, hi = est.step_time_interval_s
            out.append(f"likely step time {fmt_s(lo)} to {fmt_s(hi)} (80% interval from {_interval_source(problem, est)})")
        out.append(f"peak memory {est.peak_memory_gib:.1f} / {est.memory_capacity_gib:.1f} GiB usable{capacity_note(problem)}")
        parts = [f"{label} {fmt_pct(share)}" for label, _, share in sorted(_time_rows(est), key=lambda r: -r[1])]
        out.append("time: " + ", ".join(parts))
        out += flop_budget_lines(est)
        out.append(binding_text(est))
        if len(est.stages) > 1:
            out.append("stages:")
            columns: list[Column] = [("rank", "right"), ("layers (dense/moe)", "right"), "recompute",
                                     ("fwd/bwd ms per micro-batch", "right"), ("in-flight", "right"),
                                     ("peak GiB", "right"), "headroom"]
            rows = [[str(st.rank), f"{st.layers} ({st.dense_layers}/{st.moe_layers})", _recompute_counts(st.recompute),
                     f"{fmt_ms(st.forward_s)}/{fmt_ms(st.backward_s)}", f"{st.inflight_microbatches:.3g}",
                     f"{st.peak_memory_gib:.1f}", headroom_text(st.peak_memory_gib, est.memory_capacity_gib)]
                    for st in est.stages]
            out.append(table_text(columns, rows, indent=2).rstrip("\n"))
    for w in est.warnings:
        out.append(f"warning: {w}")
    return "\n".join(out) + "\n"


def solution_text(problem: Any, solution: Any) -> str:
    """`estimate_text` plus the solver statistics and the alternatives (ends with a newline)."""
    st = solution.solver
    out = [estimate_text(problem, solution.estimate).rstrip("\n")]
    gap = "-" if st.gap is None else f"{100 * st.gap:.2f}%"
    out.append(f"solver: {st.status} in {st.solve_time_s:.2f} s (gap {gap}), {st.candidates} candidates, "
               f"{st.pruned_by_memory} pruned by memory, {st.pruned_by_bound} by bound, {st.cp_sat_solves} CP-SAT solves")
    if getattr(st, "dualpipe_plans", 0):
        out.append(dualpipe_line(st))
    for a in solution.alternatives:
        out.append(alternative_line(solution.estimate, a))
    if note := alternatives_note_line(solution):
        out.append(note)
    return "\n".join(out) + "\n"


def alternatives_note(st: Any) -> str:
    """What the alternatives are when their share of the search ran out (`SolverStats.
    alternatives_complete` false): the best found, not each family's proven best; "" otherwise."""
    if getattr(st, "alternatives_complete", True):
        return ""
    return ("alternatives: the best found within their share of the search's work (a quarter of the proof's, "
            "solver.alternatives_complete false); a family the share did not reach may be closer")


def alternatives_note_line(solution: Any) -> str:
    """The text reports' line under the alternatives (`alternatives_note`), "" where none is due."""
    note = alternatives_note(solution.solver) if solution.alternatives else ""
    return f"  ({note})" if note else ""


def indistinguishable(best: Any, other: Any) -> bool:
    """Whether the 80% prediction intervals of two estimates overlap."""
    return overlaps(getattr(best, "step_time_interval_s", None), getattr(other, "step_time_interval_s", None))


def alternative_line(best: Any, a: Any) -> str:
    """One alternative: how much slower, its step time, whether the model can tell it apart."""
    tag = ", indistinguishable: intervals overlap" if indistinguishable(best, a.estimate) else ""
    family = getattr(a, "family", "")
    return (f"  alternative{f' [{family}]' if family else ''}: {a.slower_pct:+.1f}% "
            f"{fmt_s(a.estimate.step_time_s)}/step ({a.differs}{tag})")


def safe_name(text: str) -> str:
    """A file-name-safe version of text: [A-Za-z0-9._-] kept, the rest `_`, no leading dot."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")
    return s.lstrip(".") or "problem"

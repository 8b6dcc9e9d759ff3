"""Solving one option's best plan, and the sensitivity of its step time to faster hardware."""

from __future__ import annotations

import functools

import dataclasses
import hashlib
import math
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ..catalog import get_gpu
from ..errors import InfeasibleError
from ..fileio import atomic_write
from ..spec import Plan, Problem, TopologyLevel
from .schema import DEFAULT_TIME_LIMIT_S, SensitivityMode
from ..cost import evaluate
from ..solver import solve
from ..topology import resolve_levels

# Larger-HBM siblings for the "+HBM" sensitivity (same compute die, more and faster memory).
HBM_SIBLING = {"h100-sxm": "h200-sxm", "a100-sxm-40gb": "a100-sxm-80gb"}

BINDING_MIN_GAIN_PCT = 5.0  # a resource is called binding only when relaxing it cuts the step by >= 5%
SLOWDOWN = 1.25  # resource slow-down used to measure how much of the step time each resource carries


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
    sol = solve(problem, time_limit_s=time_limit_s, top_k=0)
    return SolvedOption(sol.plan, sol.estimate, sol.solver.status, sol.solver.solve_time_s)


def levels_problem(problem: Problem, factor: Callable[[int], float]) -> Problem:
    """The problem with explicit topology levels, bandwidth of level i multiplied by factor(i)."""
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
    the fraction of the step that scales with that resource.

    `binding`: the resource whose relaxation gains the most (`relax_gain_pct`), named only when
    that gain is at least BINDING_MIN_GAIN_PCT (5%), else "none". Relaxing a resource: twice its
    speed, estimated as half its share; HBM capacity (a plan that fills >= 90% of its memory, a
    GPU with a larger-HBM sibling): the plan re-solved on the sibling minus the gain of the same
    plan there (its faster HBM alone), measured with one extra solve.
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
    out["gains_pct"]["internode_2x"] = gain(best(levels_problem(problem, lambda i: 2.0 if i > 0 else 1.0))) \
        if nlev > 1 else 0.0
    out["gains_pct"]["nvlink_2x"] = gain(best(levels_problem(problem, lambda i: 2.0 if i == 0 else 1.0)))
    sib = HBM_SIBLING.get(get_gpu(problem.cluster.gpu).id)
    hbm_bw_only = None
    sib_problem = problem
    if sib:
        out["hbm_plus_gpu"] = sib
        sib_problem = problem.model_copy(update={"cluster": problem.cluster.model_copy(update={"gpu": sib})})
        out["gains_pct"]["hbm_plus"] = gain(best(sib_problem))
        hbm_bw_only = gain(_step(sib_problem, plan))
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
            shares[f"net:{name}"] = share(levels_problem(problem, functools.partial(_slow_level, i)))
    finally:
        if own_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    out["shares"] = {k: round(v, 6) for k, v in shares.items()}
    est = solved.estimate
    util = est.peak_memory_gib / est.memory_capacity_gib if est.memory_capacity_gib else 0.0
    out["memory_utilization"] = util
    # What relaxing each resource would gain: twice its speed cuts its share of the step in half
    # (estimated from the share); more HBM capacity: the plan re-solved on the larger-HBM sibling
    # minus what the same plan gains there from the faster HBM alone (measured).
    relax = {k: 50.0 * v for k, v in shares.items()}
    hp = out["gains_pct"].get("hbm_plus")
    if sib and util >= 0.9 and hbm_bw_only is not None:
        if mode != "solve":  # one re-solve, only for a plan that fills its memory
            try:
                resolved = gain(solve_option(sib_problem, time_limit_s=time_limit_s).estimate.step_time_s)
            except InfeasibleError:
                resolved = None
            hp = max((g for g in (hp, resolved) if g is not None), default=None)
        if hp is not None:
            relax["hbm_capacity"] = hp - hbm_bw_only
    out["relax_gain_pct"] = {k: round(v, 4) for k, v in relax.items()}
    top = max(relax, key=lambda k: (relax[k], k)) if relax else None
    binding = top if top is not None and relax[top] >= BINDING_MIN_GAIN_PCT else "none"
    out["binding"] = binding
    return out


def _slow_level(slowed: int, j: int) -> float:
    """The efficiency scale of topology level `j` when level `slowed` runs SLOWDOWN times slower."""
    return 1.0 / SLOWDOWN if j == slowed else 1.0

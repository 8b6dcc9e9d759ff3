"""Words for users: what distinguishes two plans, and why no plan fits."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import product

import numpy as np

from ..catalog import get_gpu, gpu_ids
from ..cost import GIB, Config, Context, config_reasons, launch_reasons
from ..cost import evaluate as _evaluate
from ..spec import mode_order, Plan, Problem
from ..cost import context, with_modes
from ..frameworks import profiles
from .bounds import _bounds
from .candidates import _space, candidates, planned_cp_comm
from ..layouts import search_modes


def run_length(xs: list[int]) -> str:
    """[1, 2, 2, 2, 1] -> `1,2x3,1`."""
    out, i = [], 0
    while i < len(xs):
        j = i
        while j < len(xs) and xs[j] == xs[i]:
            j += 1
        out.append(f"{xs[i]}x{j - i}" if j - i > 1 else str(xs[i]))
        i = j
    return ",".join(out)


def describe_difference(a: Plan, b: Plan) -> str:
    """What distinguishes plan b from plan a, in knob=value terms."""
    diffs = []
    for knob in ("tp", "cp", "ep", "pp", "vpp", "dp", "sp", "zero_stage", "micro_batch_size", "schedule"):
        va, vb = getattr(a, knob), getattr(b, knob)
        if va != vb:
            diffs.append(f"{'sequence_parallel' if knob == 'sp' else knob} {va} -> {vb}")

    def live(p: Plan) -> list[str]:  # the order of the axes larger than 1 is all a placement decides
        sizes = {"tp": p.tp, "cp": p.cp, "ep": p.ep, "dp": (p.dp or 1) // p.ep, "pp": p.pp}
        return [x for x in p.axes if sizes[x] > 1]

    both = set(live(a)) & set(live(b))  # an axis of size 1 in either plan has no place to compare
    if a.placement != b.placement and [x for x in live(a) if x in both] != [x for x in live(b) if x in both]:
        diffs.append(f"placement {a.placement} -> {b.placement}")
    if a.stage_layers != b.stage_layers:
        diffs.append(f"stage_layers {run_length(b.stage_layers or [])}")
    def rc(p: Plan) -> str:  # "none", or the per-layer mix as counts
        if isinstance(p.recompute, str):
            return p.recompute
        return ",".join(f"{m}:{p.recompute.count(m)}" for m in mode_order(p.recompute) if p.recompute.count(m))

    if rc(a) != rc(b):
        diffs.append(f"recompute {rc(a)} -> {rc(b)}")
    return ", ".join(diffs) or "same degrees, different layer split"


# ---------------------------------------------------------------------------------------
# Explaining infeasibility
# ---------------------------------------------------------------------------------------


EXPLAIN_TRIES = 4000  # degree sets `explain_no_candidates` checks against the framework's rules (a count)


def explain_no_candidates(problem: Problem, ctx: Context) -> tuple[str, list[str]]:
    """Why the search space holds no configuration: where some degree sets divide the GPUs and the
    global batch but the framework's launch rules refuse every one of them (`config_reasons`,
    `launch_reasons`), the rule that refused the most, with the field to relax; else divisibility."""
    n, gbs = problem.cluster.num_gpus, problem.training.global_batch_size
    by_field: Counter[str] = Counter()
    example: dict[str, str] = {}
    tried = 0
    for plan in _dividing_plans(problem, ctx):
        tried += 1
        _, refused = config_reasons(problem, plan)
        refused = refused or launch_reasons(problem, plan)
        if not refused:  # (another rule of the space removed it: the divisibility message below)
            by_field.clear()
            break
        for r in refused[:1]:
            by_field[r.field or "search"] += 1
            example.setdefault(r.field or "search", str(r))
        if tried >= EXPLAIN_TRIES:
            break
    if by_field:
        field, count = by_field.most_common(1)[0]
        reason = (f"{problem.framework} refuses every combination of degrees in the search space that divides the "
                  f"{n} GPUs and the global batch ({count} of the {tried} checked for {field}, e.g. {example[field]})")
        knob = field if field in type(problem.search).model_fields else None
        return reason, [f"relax search.{knob}" if knob else "relax the `search:` restrictions",
                        f"another framework (`framework:`, {problem.framework} now)"]
    reason = (f"no combination of degrees in the search space divides the {n} GPUs, the heads "
              f"({problem.model.num_attention_heads}) and the global batch ({gbs} sequences)")
    fixes = [f"use a global_batch_size that is a multiple of {n}", "relax the `search:` restrictions"]
    return reason, fixes


def _dividing_plans(problem: Problem, ctx: Context) -> Iterator[Plan]:
    """Plans of the search space (`candidates._space`) whose tp x cp x pp divides the GPUs and whose
    dp x micro-batch divides the global batch, in the space's order (the first micro-batch that does,
    vpp 2 for the interleaved schedule; SP off and the planned CP exchange, as `candidates` probes)."""
    sp = _space(problem, ctx)
    n, gbs = problem.cluster.num_gpus, problem.training.global_batch_size
    cp_comm = planned_cp_comm(problem, ctx)  # (as `candidates` probes: the exchange planned, SP off)
    for tp, cp, pp, ep, zero, sched in product(sp["tp"], sp["cp"], sp["pp"], sp["ep"], sp["zero_stage"],
                                               sp["schedule"] or ["1f1b"]):
        if n % (tp * cp * pp) or (pp == 1 and sched != "1f1b"):
            continue
        dp = n // (tp * cp * pp)
        mbs = next((b for b in sp["micro_batch_size"] if gbs % (dp * b) == 0), None)
        if mbs is None or dp not in sp["dp"]:
            continue
        try:
            yield Plan(tp=tp, cp=cp, pp=pp, ep=ep, dp=dp, zero_stage=zero, micro_batch_size=mbs, schedule=sched,
                       vpp=2 if sched == "interleaved" else 1, sequence_parallel=False,
                       cp_comm_type=cp_comm if cp > 1 else "p2p")
        except ValueError:  # (a combination the plan's own validation refuses)
            continue


def explain_infeasible(problem: Problem, ctx: Context, cands: Sequence[Config], m_lb: np.ndarray) -> tuple[str, list[str]]:
    """The binding constraint (the least memory-hungry plan and what it still needs) and
    the smallest changes that fix it."""
    i = int(np.argmin(m_lb))
    cfg = cands[i]
    plan = cfg.plan("full")
    est = _evaluate(problem, plan)
    need_gib = est.peak_memory_gib if est.stages else m_lb[i] / GIB
    cap_gib = ctx.capacity_bytes / GIB
    stage = max(est.stages, key=lambda s: s.peak_memory_gib).rank if est.stages else 0
    reason = (f"even with tp={cfg.tp}, pp={cfg.pp}, cp={cfg.cp}, ep={cfg.ep}, ZeRO-{cfg.zero}, micro-batch "
              f"{cfg.mbs} and full recompute, stage {stage} needs {need_gib:.1f} GiB of {cap_gib:.1f} GiB usable "
              f"on {ctx.gpu.id}")
    fixes = []
    n = problem.cluster.num_gpus
    node = ctx.levels[0].size
    more = int(math.ceil(n * need_gib / cap_gib / node) * node)
    fixes.append(f"more GPUs (about {max(more, n + node)} instead of {n})")
    head = problem.search.headroom_gib  # --headroom: kept free on any GPU
    bigger = sorted((g for g in (get_gpu(x) for x in gpu_ids())
                     if g.hbm_gib - 2 - head > need_gib and g.hbm_gib > ctx.gpu.hbm_gib), key=lambda g: g.hbm_gib)
    if bigger:
        fixes.append(f"a larger-HBM GPU ({', '.join(g.id for g in bigger[:3])})")
    if head and need_gib <= cap_gib + head:
        fixes.append(f"less headroom (--headroom {max(0.0, cap_gib + head - need_gib):.1f} or less; {head:g} GiB now)")
    mem = est.memory_breakdown_gib if est.stages else {}
    if mem.get("activations", 0) > 0.3 * need_gib:
        fixes.append(f"a shorter sequence (seq_len {problem.training.seq_len // 2})")
    if not getattr(cands, "opt_offload", False) and (offload := offload_fix(problem, cap_gib)):
        fixes.insert(0, offload)  # the smallest fix: the same GPUs, the optimizer states in host memory
    if problem.search.model_dump(exclude_defaults=True):
        fixes.append("relax the `search:` restrictions")
    return reason, fixes


OFFLOAD_TRIES = 8  # offload configurations evaluated (leanest memory bound first) for the suggestion


def offload_fix(problem: Problem, cap_gib: float) -> str | None:
    """Where no plan fits: whether keeping the optimizer states in host memory, stepped by the CPU
    (Plan.optimizer_offload; Megatron --optimizer-cpu-offload, DeepSpeed ZeRO-Offload), makes one fit,
    on this framework or, where it has no offload, on the first one that has (frameworks.yaml). The
    fix names the plan and its memory; None where offload alone does not make one fit."""
    names = [problem.framework] + [n for n in profiles() if n != problem.framework]
    target = next((n for n in names if profiles()[n].optimizer_offload_zero_stages), None)
    if target is None:
        return None
    search = problem.search.model_copy(update={"optimizer_offload": None})
    alt = problem.model_copy(update={"framework": target, "search": search})
    try:
        ctx = context(alt)
        ctx = with_modes(ctx, search_modes(alt, ctx))
        cands = candidates(alt, ctx, opt_offload=True)
        if not cands:
            return None
        _, m_lb, could_fit = _bounds(ctx, cands, memory=False)  # (unrefined: the tries are evaluated)
    except Exception:  # noqa: BLE001  (a suggestion never turns an infeasible answer into an error)
        return None
    order = sorted(np.flatnonzero(could_fit).tolist(), key=lambda i: (m_lb[i], i))
    for i in order[:OFFLOAD_TRIES]:
        plan = cands[i].plan("full")
        est = _evaluate(alt, plan)
        if est.fits:
            how = ("search: {optimizer_offload: true}" if target == problem.framework
                   else f"framework: {target}, which has it")
            return (f"CPU optimizer offload (the optimizer states in host memory, stepped by the CPU; "
                    f"{profiles()[target].optimizer_offload_name or target}): {est.plan.short()} then needs {est.peak_memory_gib:.1f} GiB "
                    f"of {cap_gib:.1f} at {est.step_time_s:.3g} s per step ({how})")
    return None

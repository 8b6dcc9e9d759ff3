"""DualPipe planned beside the CP-SAT search, by enumeration (`dualpipe_pass`).

The CP-SAT stage model has no mirrored layout (DualPipe's rank r holds stage r of one direction and
stage P-1-r of the other), so where the framework runs DualPipe (frameworks.yaml `schedules`, not
in `unplanned_schedules`) and the search allows it, every configuration of the search that DualPipe
can run (an even PP >= 2, no virtual stages) is priced with DualPipe under each recompute mode the
search plans, one mode on every layer (DeepSeek's launcher runs one), on one stage split
(`balanced_split`), by `evaluate` (the replay of DualPipe's code, `cost.dualpipe`). The fastest one
that fits with the search's headroom replaces the CP-SAT answer where it is faster. That comparison
is exact for the plans enumerated; it is not a proof over every recompute mix and stage split of
DualPipe, and `SolverStats.dualpipe_plans` says how many were priced.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..cost import Context, Estimate, Table, layer_table
from ..cost import evaluate as _evaluate
from ..spec import Plan, Problem
from .candidates import candidates
from .explain import describe_difference
from .families import family_key, family_name
from .records import Alternative, Solution

SCHEDULE = "dualpipe"


def dualpipe_planned(problem: Problem, ctx: Context) -> bool:
    """Whether the solver plans DualPipe: the framework runs it and plans it (frameworks.yaml), and the
    problem's `search.schedule` allows it (by default: whatever the framework plans)."""
    fw = ctx.framework
    plans = [x for x in fw.schedules if x not in fw.unplanned_schedules]
    return SCHEDULE in plans and SCHEDULE in problem.search.allowed("schedule", plans)


def balanced_split(table: Table, kinds: list[str], mode: str, pp: int) -> list[int]:
    """Layers per stage for DualPipe on `pp` ranks. Ranks r and P-1-r hold the same two stages, so a
    rank's work is its pair's layers (and, for ranks 0 and P-1, the embedding and the head): the
    split that minimises the busiest pair's forward + backward time, then the longest stage (the
    bubble's chunk). The middle pairs share the layers the end pair leaves as evenly as counts go
    (stage r the larger half); the end pair's two stages are split to balance stage 0 (its layers and
    the embedding) against stage P-1 (its layers and the head)."""
    n, pairs = len(kinds), pp // 2
    cost = [table.layers[(k, mode)].total_s for k in kinds]
    prefix = [0.0]
    for c in cost:
        prefix.append(prefix[-1] + c)
    embed, head = table.embed.total_s, table.head.total_s
    best: tuple[tuple[float, float], list[int]] | None = None
    for ends in range(0, n + 1):
        rest = n - ends
        if pairs == 1 and rest:
            continue
        q, extra = divmod(rest, pairs - 1) if pairs > 1 else (0, 0)
        sizes = [q + 1 if i < extra else q for i in range(pairs - 1)]  # pairs 1 .. P/2-1
        for first in range(ends + 1):
            split = [0] * pp
            split[0], split[pp - 1] = first, ends - first
            for i, size in enumerate(sizes, start=1):
                split[i], split[pp - 1 - i] = (size + 1) // 2, size // 2
            bounds = [0]
            for s in split:
                bounds.append(bounds[-1] + s)
            stage = [prefix[bounds[s + 1]] - prefix[bounds[s]] for s in range(pp)]
            stage[0] += embed
            stage[pp - 1] += head
            key = (max(stage[r] + stage[pp - 1 - r] for r in range(pairs)), max(stage))
            if best is None or key < best[0]:
                best = (key, split)
    assert best is not None
    return best[1]


def dualpipe_estimates(problem: Problem, ctx: Context, modes: list[str], headroom_gib: float) -> tuple[int, list[Estimate]]:
    """(plans priced, those that fit with `headroom_gib` to spare, fastest first): every DualPipe
    re-plan of the search's configurations (`module docstring`). Deterministic: the candidates'
    fixed order, ties broken by it."""
    kinds = ctx.model.layer_kinds()
    seen: set[tuple] = set()
    priced, fitting = 0, []
    cands = candidates(problem, ctx)
    c = cands.cols  # (filtered on the columns: a `Config` is built only for the DualPipe-shaped ones)
    shaped = (c["pp"] >= 2) & (c["pp"] % 2 == 0) & (c["vpp"] == 1) & ~cands.overlap_off
    for i in np.flatnonzero(shaped).tolist():
        cfg = cands[i]
        key = (cfg.tp, cfg.cp, cfg.ep, cfg.etp, cfg.pp, cfg.dp, cfg.sp, cfg.zero, cfg.mbs, cfg.placement)
        if key in seen:
            continue
        seen.add(key)
        dual = dataclasses.replace(cfg, schedule=SCHEDULE)
        base = dual.plan()
        table = layer_table(ctx, dual)
        for mode in modes:
            plan = base.model_copy(update={"recompute": mode,
                                           "stage_layers": balanced_split(table, kinds, mode, cfg.pp)})
            est = _evaluate(problem, plan)
            priced += 1
            if est.fits and est.peak_memory_gib + headroom_gib <= est.memory_capacity_gib:
                fitting.append(est)
    fitting.sort(key=lambda e: e.step_time_s)  # (stable: the enumeration's order breaks ties)
    return priced, fitting


def dualpipe_pass(problem: Problem, shown: Problem, ctx: Context, modes: list[str], headroom_gib: float,
                  sol: Solution) -> Solution:
    """`sol` (the CP-SAT search's answer) against the DualPipe plans (`dualpipe_estimates`): the fastest
    that fits with the headroom replaces it where faster, the CP-SAT answer becoming its first
    alternative; `SolverStats` records how many were priced and the fastest that fits."""
    if not dualpipe_planned(problem, ctx):
        return sol
    priced, fitting = dualpipe_estimates(problem, ctx, modes, headroom_gib)
    best = fitting[0] if fitting else None
    stats = sol.solver.model_copy(update={
        "dualpipe_plans": priced, "dualpipe_best_s": best.step_time_s if best else None,
        "dualpipe_best_plan": best.plan.short() if best else ""})
    if best is None or best.step_time_s >= sol.estimate.step_time_s:
        return sol.model_copy(update={"solver": stats})
    plan: Plan = best.plan
    est = _evaluate(shown, plan)
    was = Alternative(plan=sol.plan, estimate=sol.estimate, differs=describe_difference(plan, sol.plan),
                      slower_pct=100.0 * (sol.estimate.step_time_s / est.step_time_s - 1.0),
                      family=family_name(family_key(sol.plan)))
    others = [a.model_copy(update={"slower_pct": 100.0 * (a.estimate.step_time_s / est.step_time_s - 1.0),
                                   "differs": describe_difference(plan, a.plan)})
              for a in sol.alternatives if family_key(a.plan) != family_key(plan)]
    return sol.model_copy(update={"plan": plan, "estimate": est, "alternatives": [was, *others],
                                  "solver": stats.model_copy(update={"dualpipe_chosen": True})})

"""Branch and bound over the configurations (`_Search`) and the entry point `solve`."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cost import Config, Context, Table, context, layer_table
from ..cost import evaluate as _evaluate
from ..errors import InfeasibleError
from ..loader import load_problem
from ..spec import DEFAULT_GAP_LIMIT, RECOMPUTES, Plan, Problem
from .bounds import _optimistic_table, _table_bound, bounds
from .candidates import _config_key, _placements, candidates
from .explain import describe_difference, explain_infeasible, explain_no_candidates
from .records import Alternative, Solution, SolverStats
from .stage_model import TIME_UNIT_S, StageModel, _rounding_tolerance, _t
from .warm_start import WARM_START_CONFIGS, _warm_start


@dataclass(order=True)
class _Found:
    step_s: float
    order: int
    plan: Plan = None  # type: ignore[assignment]
    objective_s: float = 0.0
    tolerance_s: float = 0.0


RUNNER_UP_SLOWER = 0.25  # runners-up more than 25% slower than the chosen plan are not reported
RUNNER_UP_CONFIGS = 3000  # configurations ranked for runners-up (in numpy-bound order)


class _Search:
    """Branch-and-bound state: the incumbents, the proven bounds, the configurations whose
    proof a time cap stopped (retried with the time left at the end).

    After the proof, `alternatives` runs the same search again with a looser target (the
    `keep`-th best plan found) to fill the runners-up; it no longer touches the proven bound."""

    def __init__(self, problem: Problem, ctx: Context, modes: list[str], keep: int, gap_limit: float,
                 time_limit_s: float, t0: float):
        self.problem, self.ctx, self.modes, self.keep, self.gap_limit = problem, ctx, modes, keep, gap_limit
        self.time_limit_s, self.t0 = time_limit_s, t0
        self.deadline = t0 + time_limit_s
        self.found: list[_Found] = []  # best per configuration, kept sorted, at most `keep`
        self.lower = math.inf  # proven lower bound of every closed configuration not solved to optimality
        self.open: list[tuple[float, int, Table]] = []  # stopped by a time cap: (proven bound, order, table)
        self.solved: set[Config] = set()  # configurations (with placement) whose optimum is known
        self.solves = self.seq = 0
        self.timed_out = False
        self.proving = True  # False while looking for runners-up
        self.cap_s = max(1.0, time_limit_s / 60)  # CP-SAT work per proof before moving on
        self.tables: dict = {}  # layer costs shared between placements (`cost.layer_table`)
        self.orders: dict = {}  # distinct placements per set of degrees (`_placements`)

    def target(self) -> float:
        """What a configuration must beat to matter: the incumbent less the gap limit (while
        proving), else the worst of the `keep` plans kept (once there are that many)."""
        if not self.proving:  # runners-up: within RUNNER_UP_SLOWER of the best, and better than the worst kept
            bar = self.found[-1].step_s if len(self.found) >= self.keep else math.inf
            return min(bar, self.found[0].step_s * (1 + RUNNER_UP_SLOWER))
        return self.found[0].step_s * (1 - self.gap_limit) if self.found else math.inf

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def close(self, bound: float) -> None:
        if self.proving:
            self.lower = min(self.lower, bound)

    def bound(self) -> float:
        return min([self.lower] + [b for b, _, _ in self.open])

    def add(self, plan: Plan, step_s: float, objective_s: float, tolerance_s: float) -> None:
        """Keep the plan if it is among the `keep` best, one per configuration (degrees,
        schedule, ZeRO, micro-batch, placement): runners-up that differ only in the layer
        split or recompute mix of the same configuration would tell a user nothing."""
        same = [f for f in self.found if _config_key(f.plan) == _config_key(plan)]
        if same and same[0].step_s <= step_s:
            return
        for f in same:
            self.found.remove(f)
        self.seq += 1
        self.found.append(_Found(step_s, self.seq, plan, objective_s, tolerance_s))
        self.found.sort()
        del self.found[self.keep:]

    def attempt(self, table: Table, tbound: float, cap_s: float) -> None:
        """CP-SAT on one configuration and placement, with the incumbent as cutoff."""
        goal = self.target()
        cutoff = _t(goal) if goal < math.inf else None
        sm = StageModel(self.ctx, table, self.modes, self.problem.search.uniform_stages, cutoff)
        status, obj, bnd = sm.solve(min(self.left(), cap_s), wall_s=self.left())
        self.solves += 1
        if status == "OPTIMAL":
            self.solved.add(table.cfg)
        if obj is None and not self.proving:  # nothing under the bar: no runner-up here
            return
        if obj is None:
            if status == "UNKNOWN":
                self.timed_out = True
                cp_bound = bnd * TIME_UNIT_S / sm.scale if bnd is not None else -math.inf
                self.seq += 1
                self.open.append((max(tbound, cp_bound), self.seq, table))
            elif cutoff is not None:  # proven: nothing in this configuration reaches the goal
                self.close(goal)  # (up to the integer rounding, reported separately)
            return
        if status == "FEASIBLE" and self.proving:
            self.timed_out = True
            self.seq += 1
            self.open.append((max(tbound, bnd * TIME_UNIT_S / sm.scale), self.seq, table))
        counts = sm.read_counts()
        if self.proving:  # (a runner-up needs no tie-break: it is one per configuration anyway)
            sm.tiebreak(obj)
            if sm.solve(min(self.left(), cap_s), wall_s=self.left())[1] is not None:
                counts = sm.read_counts()
        stage_layers, recompute = sm.read_plan(counts)
        rc: Any = recompute[0] if len(set(recompute)) == 1 else recompute
        est = _evaluate(self.problem, table.cfg.plan(rc, stage_layers))
        self.add(est.plan, est.step_time_s, obj * TIME_UNIT_S / sm.scale, _rounding_tolerance(self.ctx, table))

    def visit(self, cfg: Config, opt_cache: dict) -> bool:
        """Bound, then solve, every placement of one configuration. False if it was pruned."""
        ctx, modes = self.ctx, self.modes
        optimistic = _optimistic_table(ctx, cfg, opt_cache)
        opt_bound = _table_bound(ctx, optimistic, modes, exact_windows=False)
        if opt_bound < self.target():  # the costlier bound only where the cheap one does not prune
            opt_bound = _table_bound(ctx, optimistic, modes, exact_windows=False, memory=True)
        if opt_bound >= self.target():
            self.close(opt_bound)
            return False
        tables = [layer_table(ctx, c, self.tables) for c in _placements(self.problem, ctx, cfg, self.orders)]
        ranked = sorted(((max(opt_bound, _table_bound(ctx, tb, modes)), j, tb) for j, tb in enumerate(tables)),
                        key=lambda x: x[:2])
        for tbound, _, table in ranked:
            if tbound >= self.target():
                self.close(tbound)
                break
            if table.cfg in self.solved:  # (looking for alternatives: its best plan is known)
                continue
            with_memory = _table_bound(ctx, table, modes, memory=True)
            if with_memory >= self.target():  # HBM forces enough recompute to lose: no CP-SAT needed
                self.close(with_memory)
                continue
            # One hard configuration must not hold up the rest: cap each proof, keep its bound,
            # resume it at the end with the time left (`retry`).
            self.attempt(table, with_memory, self.cap_s)
        return True

    def alternatives(self, order: list[int], cands: list[Config], t_lb: np.ndarray, opt_cache: dict) -> None:
        """Fill the `keep - 1` runners-up: the search again, with the worst plan kept as the
        bar, in at most as many CP-SAT solves again as the proof took (a count, not a clock,
        so that the runners-up are reproducible) and within the time limit."""
        self.proving = False
        budget = self.solves + max(8, self.solves)
        # Visit in order of the placement-free bound (tighter than numpy's, so the closest
        # runners-up come first), over the configurations numpy does not rule out.
        ranked = []
        for i in order[:RUNNER_UP_CONFIGS]:
            if t_lb[i] >= self.target():
                break
            optimistic = _optimistic_table(self.ctx, cands[i], opt_cache)
            ranked.append((_table_bound(self.ctx, optimistic, self.modes, exact_windows=False, memory=True), i))
        for bound, i in sorted(ranked):
            if bound >= self.target() or self.left() <= 0 or self.solves >= budget:
                break
            self.visit(cands[i], opt_cache)

    def retry(self) -> None:
        """With the time left, resume the proofs a cap stopped, the weakest bound first."""
        pending, self.open = sorted(self.open, key=lambda x: x[:2]), []
        for k, (bnd, _, table) in enumerate(pending):
            if bnd >= self.target():
                self.close(bnd)
            elif self.left() < 0.1:
                self.open += pending[k:]
                return
            else:
                self.attempt(table, bnd, self.left())


def solve(problem: Problem | Any, *, time_limit_s: float = 30.0, top_k: int = 3,
          gap_limit: float = DEFAULT_GAP_LIMIT) -> Solution:
    """The fastest plan that fits, with proof.

    `solver.status == 'OPTIMAL'` means no plan in the declared space is faster than the one
    returned by more than `gap_limit` (relative; default 0.1%, far below the cost model's
    own accuracy; `gap_limit=0` proves exact optimality). `solver.gap` is the proven gap.
    'FEASIBLE' means the time limit stopped the proof; the gap is still proven.

    Raises `InfeasibleError` with the binding constraint and the smallest fixes when no
    plan in the declared space fits.
    """
    t0 = time.perf_counter()
    problem = load_problem(problem)
    ctx = context(problem)
    cands = candidates(problem, ctx)
    if not cands:
        raise InfeasibleError(*explain_no_candidates(problem, ctx))
    opt_cache: dict = {}  # per-layer costs on consecutive GPUs, shared by the bounds below
    t_lb, m_lb = bounds(ctx, cands, opt_cache)
    fits = m_lb <= ctx.capacity_bytes
    pruned_mem = int((~fits).sum())
    order = sorted(np.flatnonzero(fits).tolist(), key=lambda i: (t_lb[i], i))
    modes = [r for r in RECOMPUTES if r in problem.search.allowed("recompute", list(RECOMPUTES))]
    search = _Search(problem, ctx, modes, max(1, top_k + 1), gap_limit, time_limit_s, t0)
    pruned_bound = 0

    # Warm start: greedy recompute mixes and stage splits on the most promising configurations
    # (no CP-SAT); a strong incumbent early makes every cutoff and bound bite.
    warm = _warm_start(problem, ctx, [cands[i] for i in order[:WARM_START_CONFIGS]], modes,
                       deadline=t0 + time_limit_s / 2, opt_cache=opt_cache, table_cache=search.tables)
    if warm is not None:
        search.add(warm.plan, warm.step_time_s, warm.step_time_s, 0.0)

    for pos, i in enumerate(order):
        if t_lb[i] >= search.target():  # candidates come in order of their numpy bound
            pruned_bound += len(order) - pos
            search.close(float(t_lb[i]))
            break
        if search.left() <= 0:
            search.timed_out = True
            search.close(float(t_lb[i]))
            break
        pruned_bound += not search.visit(cands[i], opt_cache)
    search.retry()
    bound_s = search.bound()
    if top_k > 0 and search.found:
        search.alternatives(order, cands, t_lb, opt_cache)
    found = search.found
    elapsed = time.perf_counter() - t0
    if not found:
        if search.timed_out:
            raise InfeasibleError(f"no plan found within the {time_limit_s:g} s time limit",
                                  ["raise --time-limit", "restrict the search space with `search:`"])
        raise InfeasibleError(*explain_infeasible(problem, ctx, cands, m_lb))
    best = found[0]
    est = _evaluate(problem, best.plan)
    bound = min(best.step_s, bound_s)
    gap = max(0.0, (best.step_s - bound) / best.step_s)
    # Every configuration not solved to optimality contributed a proven bound (numpy, table,
    # memory, CP-SAT bound or cutoff), so the gap is proven even when limits fired.
    optimal = gap <= gap_limit + 1e-12
    stats = SolverStats(
        status="OPTIMAL" if optimal else "FEASIBLE", solve_time_s=elapsed, objective_s=best.objective_s,
        objective_bound_s=bound, gap=gap, gap_limit=gap_limit, candidates=len(cands),
        pruned_by_memory=pruned_mem, pruned_by_bound=pruned_bound, cp_sat_solves=search.solves,
        rounding_tolerance_s=best.tolerance_s)
    alts = [Alternative(plan=f.plan, estimate=_evaluate(problem, f.plan), differs=describe_difference(best.plan, f.plan),
                        slower_pct=100 * (f.step_s / best.step_s - 1)) for f in found[1:top_k + 1]]
    return Solution(plan=est.plan, estimate=est, solver=stats, alternatives=alts)

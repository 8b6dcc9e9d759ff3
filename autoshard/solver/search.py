"""Branch and bound over the configurations (`_Search`) and the entry point `solve`.

The budget is deterministic work (`_Budget`): CP-SAT's deterministic time, summed over every
solve, plus counted Python work at fixed charges (`UNIT_*`: candidates, warm start, visits, memory
bounds, placement tables, stage models). The wall-clock limit is only a safety net; when it fires,
`SolverStats.limit_fired` ('wall') and `stopped_by` say so. So a solve stopped by its budget
returns the same plan and gap on a busy or a quiet machine.

CP-SAT runs as a descent: each solve stops at its first solution under the cutoff (the
incumbent less the gap limit), the cutoff drops below it, and a configuration is closed when
CP-SAT proves nothing is left under the cutoff. Proving "nothing below 99.9% of the incumbent"
is far cheaper than proving a configuration's exact optimum, which is all a 0.1% gap needs.

Alternatives come from the same search: every plan found is kept as the best of its family
(`families.family_key`); after the proof, configurations of other families are visited in order
of their bound with each family's own target, within a share of the proof's work.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..catalog import get_gpu
from ..cost import GIB, Config, Context, Table, context, layer_table, with_modes
from ..cost.layers import KIND_COSTS
from ..cost import evaluate as _evaluate
from ..errors import InfeasibleError, InputError
from ..loader import load_problem
from ..spec import DEFAULT_GAP_LIMIT, DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT, Plan, Problem
from .bounds import RefinedOrder, _lazy_bounds, _optimistic_table, _table_bound, beside_ep_overlap
from .candidates import _placements, _with_fields, candidates, offload_passes
from .dualpipe_plans import dualpipe_pass
from .explain import describe_difference, explain_infeasible, explain_no_candidates
from .families import Family, Named, family_key, family_name, named
from ..layouts import search_modes
from .records import Alternative, Solution, SolverStats
from .stage_model import TIME_UNIT_S, StageModel, _rounding_tolerance, _t
from .warm_start import WARM_START_CONFIGS, _warm_start
from .. import __version__

FIRST_CAP = 0.1  # deterministic time per configuration on the first pass (stopped proofs resume later)
RETRY_CAP = 0.5  # ... on the first round of resumed proofs (x4 each round)
TIEBREAK_WORK = 0.5  # the final tie-break pass (fewest recomputed layers, earliest layers)
ALT_SHARE = 0.25  # the alternatives' share of the proof's work (CP-SAT time and configurations)
ALT_MIN_WORK = 0.2  # ... at least this much deterministic time
ALT_CAP = 0.1  # deterministic time per configuration while looking for alternatives
ALT_MIN_SOLVES = 200  # ... and at least this many CP-SAT calls (cheap without presolve: the work share binds first)
ALT_MIN_VISITS = 200  # ... and configurations visited
ALT_GAP = 0.002  # an alternative is its family's best to within 0.2% when its search completes
ROUND = 2  # placements whose descents start from the same incumbent (run in threads with jobs > 1)
RUNNER_UP_SLOWER = 0.5  # families more than 50% slower than the chosen plan are not reported
NEAR_TIE = 0.005  # alternatives within 0.5% of each other share one line naming what differs (far below the model's error)
RUNNER_UP_CONFIGS = 3000  # configurations ranked for alternatives (in numpy-bound order)

# Python work, counted in the budget's units (about a second of one core each, like CP-SAT's
# deterministic time): fixed charges per counted operation, measured with cProfile on the bundled
# problems and the issue-30 list (2-core x86 machine). Fixed counts, never a clock: the same problem
# spends the same work on a busy or a quiet machine, so the budget stops it at the same point.
UNIT_CANDIDATE = 2e-5  # per configuration enumerated and bounded with numpy (`candidates`, `_bounds`)
UNIT_WARM = 4e-3  # per configuration the warm start tries (greedy recompute and split, evaluated)
UNIT_VISIT = 5e-4  # per configuration visited (its placement-free bound)
UNIT_MEMORY_BOUND = 2e-3  # per bound with the recompute HBM forces (`_memory_tmax`)
UNIT_TABLE = 3e-4  # per placement's layer table bounded
UNIT_SOLVE = 4e-3  # per CP-SAT call beyond its deterministic time: the stage model built, the plan evaluated
# CPU seconds per unit of CP-SAT's deterministic time on the stage models (one worker, no presolve): the sum
# of each call's thread CPU over the sum of its deterministic time measured 3.2-5.4 on bench_solve --issue
# and the bundled problems (DeepSeek-V3 122 layers 3.2, Llama 3 405B 4.0, Llama 3 70B on 640 H100 4.6,
# Kimi-K2-like 5.4; 2-core x86 machine). CP-SAT time counts in the budget at this rate, so a unit of work
# is about a CPU second whatever part of the search spends it.
CP_SAT_WORK_PER_DET = 4.0

# The HBM the search keeps free per GPU where the problem sets no `search.headroom_gib` (nor
# `--headroom`): 5% of the GPU's HBM. The memory model's error against measured peaks: on the BLOOM
# logbook's 21 nvidia-smi readings (validation ablations_dev.json, A100 80GB, DeepSpeed), measured
# peaks exceed the priced peak x the profile's 1.2 allocator overhead by a median of 6.8 GiB (4.8
# beyond the 2 GiB reserve), scattered with a standard deviation of 2.29 GiB. The allocator factor
# was fitted on that logbook's OOM boundary, so the scatter is what a plan at the edge risks: two
# standard deviations, 4.6 GiB, are 5.7% of the A100's 80 GiB, rounded down to 5%. Applied in the
# search only: `evaluate`'s fit predicate (and validation's OOM/fit figures) keep no headroom.
DEFAULT_HEADROOM_FRACTION = 0.05

ProgressFn = Callable[[dict[str, Any]], None]

# Python's full (generation-2) garbage collections during a solve: each walks every live object (the
# layer tables, memos and candidates a MoE solve keeps), 8 of them about 1 s of a 12-15 s DeepSeek-V3
# solve (gc.callbacks, bench_solve --issue). They are held off while solves run (the younger
# generations still collect, peak RSS the same within 1%) and the caller's thresholds restored after.
_GC_LOCK = threading.Lock()
_GC_STATE: dict[str, Any] = {"depth": 0, "saved": None}


@contextmanager
def _fewer_full_collections() -> Iterator[None]:
    """No full garbage collections while any solve of this process runs (threads count: the first in
    saves the thresholds, the last out restores them); nothing changes where gc is disabled."""
    with _GC_LOCK:
        if _GC_STATE["depth"] == 0 and gc.isenabled():
            _GC_STATE["saved"] = gc.get_threshold()
            g0, g1, _ = _GC_STATE["saved"]
            gc.set_threshold(g0, g1, 1_000_000)
        _GC_STATE["depth"] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_STATE["depth"] -= 1
            if _GC_STATE["depth"] == 0 and _GC_STATE["saved"] is not None:
                gc.set_threshold(*_GC_STATE["saved"])
                _GC_STATE["saved"] = None


def search_headroom(problem: Problem) -> tuple[float, bool]:
    """(GiB per GPU the search keeps free, whether it is the default): the problem's
    `search.headroom_gib` where it (or `--headroom`) sets one, else DEFAULT_HEADROOM_FRACTION of HBM."""
    if "headroom_gib" in problem.search.model_fields_set:
        return float(problem.search.headroom_gib), False
    gpu = get_gpu(problem.cluster.gpu, problem.cluster.catalog)
    return round(DEFAULT_HEADROOM_FRACTION * gpu.hbm_bytes / GIB, 1), True


@dataclass(order=True)
class _Found:
    step_s: float
    order: int
    plan: Plan = None  # type: ignore[assignment]
    objective_s: float = 0.0
    tolerance_s: float = 0.0
    table: Any = None  # the layer table it was solved on (for the final tie-break)
    objective_units: int = 0


@dataclass
class _Outcome:
    """What one CP-SAT descent found and proved (see `_Search.descend`)."""

    table: Any
    tbound: float
    goal: float
    kind: str = "none"  # closed (nothing under goal) | open (cap reached) | solved (its optimum) | none
    cp_bound: float = -math.inf
    found: list = field(default_factory=list)
    solves: int = 0
    work: float = 0.0
    wall_fired: bool = False


class _Budget:
    """Deterministic work (CP-SAT deterministic time plus counted Python work, `UNIT_*`) and a
    wall-clock safety net."""

    def __init__(self, work_limit: float, deadline: float):
        self.work_limit, self.deadline = work_limit, deadline
        self.work = 0.0  # everything: CP-SAT and Python
        self.cp_sat = 0.0  # of which CP-SAT's deterministic time
        self.wall_fired = False

    def work_left(self) -> float:
        return self.work_limit - self.work

    def cp_sat_left(self) -> float:
        """The CP-SAT deterministic time the work left pays for."""
        return self.work_left() / CP_SAT_WORK_PER_DET

    def wall_left(self) -> float:
        return self.deadline - time.perf_counter()

    def spend(self, work_s: float, wall_fired: bool = False) -> None:
        """CP-SAT's deterministic time `work_s`, counted at CP_SAT_WORK_PER_DET units of work each."""
        self.work += CP_SAT_WORK_PER_DET * work_s
        self.cp_sat += work_s
        self.wall_fired |= wall_fired

    def count(self, units: float) -> None:
        """Python work (`UNIT_*` x a count): deterministic, whatever the machine's load."""
        self.work += units

    def exhausted(self) -> bool:
        if self.wall_left() <= 0:
            self.wall_fired = True
            return True
        return self.work_left() <= 1e-3


class _Search:
    """Branch-and-bound state: the best plan of every family found, the proven bounds, the
    configurations whose proof a work cap stopped (resumed at the end, `retry`).

    `allow` (a named alternative) restricts the configurations and placements searched."""

    def __init__(self, problem: Problem, ctx: Context, modes: list[str], gap_limit: float, budget: _Budget,
                 uniform: bool, allow: Callable[[Config], bool] | None = None,
                 admit: Callable[[Config], bool] | None = None,
                 progress: ProgressFn | None = None):
        self.problem, self.ctx, self.modes, self.gap_limit = problem, ctx, modes, gap_limit
        self.budget, self.uniform, self.allow, self.progress = budget, uniform, allow, progress
        self.admit = admit or allow  # (before placements: whether some placement may be allowed)
        self.found: dict[Family, _Found] = {}  # the best plan of each family
        self.best: _Found | None = None
        self.lower = math.inf  # proven lower bound of every closed configuration not solved to optimality
        self.open: list[tuple[float, int, Table]] = []  # stopped by a work cap: (proven bound, order, table)
        self.solved: set[Config] = set()  # configurations (with placement) whose optimum is known
        self.solves = self.seq = self.visited = 0
        self.timed_out = False
        self.proving = True  # False while looking for alternatives
        self.top_k = 0  # families wanted by the alternatives pass
        self.cap_s = FIRST_CAP
        self.tables: dict = {}  # layer costs shared between placements (`cost.layer_table`)
        self.orders: dict = {}  # distinct placements per set of degrees (`_placements`)
        self.opt_bounds: dict = {}  # per configuration: its placement-free bound, cheap and with memory
        self.pool: Any = None  # a thread pool when jobs > 1 (CP-SAT releases the GIL)
        self.total = 0  # configurations to visit (for progress)
        self.frontier = -math.inf  # the numpy bound of the configuration being visited: bounds all those after it
        self.inflight: set = set()  # stage models being solved (stopped on Ctrl-C)
        self._bar: tuple = ()  # `bar`'s last answer, with what it read: (seq, top_k, best, bar)
        # the planned modes a configuration that runs the EP overlap may use (`modes_for`)
        self.overlap_modes = beside_ep_overlap(ctx, modes)

    def modes_for(self, table: Table) -> list[str]:
        """The recompute modes a configuration's plans may use: all planned ones, less those its
        framework refuses beside the EP overlap where the configuration runs it (an overlap left
        open that pays, `cost.ep_overlap_pays`; its twin with the overlap off takes every mode)."""
        if table.cfg.ep_overlap is None and table.memo.get("ep_overlap"):
            return self.overlap_modes
        return self.modes

    def redundant_twin(self, table: Table) -> bool:
        """A configuration planned with the EP overlap off (`candidates`) whose twin left open does not
        run it on this placement either: the twin prices the same plans with every mode."""
        if table.cfg.ep_overlap is not False:
            return False
        twin = layer_table(self.ctx, _with_fields(table.cfg, ep_overlap=None), self.tables)
        return not twin.memo.get("ep_overlap")

    # ---- targets -----------------------------------------------------------------------------

    def bar(self) -> float:
        """While looking for alternatives: what a family must beat to be among the `top_k`."""
        best = self.best
        assert best is not None
        # (it reads only `found`, `best` and `top_k`: `add` counts seq up with every plan it keeps, and
        # the tie-break's plan is a new best, so an answer for the same three stands)
        if self._bar and self._bar[0] == self.seq and self._bar[1] == self.top_k and self._bar[2] is best:
            return self._bar[3]
        mine = family_key(best.plan)
        others = sorted(f.step_s for k, f in self.found.items() if k != mine)
        cap = best.step_s * (1 + RUNNER_UP_SLOWER)
        # (families within NEAR_TIE of a faster one share its line in the report: the bar is the
        # top_k-th line's, so near-ties do not stop the search for a family a team would argue about)
        heads: list[float] = []
        for step_s in others:
            if not heads or step_s > heads[-1] * (1 + NEAR_TIE):
                heads.append(step_s)
        got = min(cap, heads[self.top_k - 1]) if len(heads) >= self.top_k else cap
        self._bar = (self.seq, self.top_k, best, got)
        return got

    def target(self, cfg: Config | None = None) -> float:
        """What a configuration must beat to matter: the incumbent less the gap limit (while
        proving); for alternatives, its family's best so far or the bar, less ALT_GAP (the
        chosen plan's family: nothing). `cfg=None`: the loosest target of any family."""
        if self.proving:
            return self.best.step_s * (1 - self.gap_limit) if self.best else math.inf
        bar = self.bar() * (1 - ALT_GAP)
        if cfg is None:
            return bar
        fam = family_key(cfg)
        assert self.best is not None  # (alternatives are searched once the proof has a best plan)
        if fam == family_key(self.best.plan):
            return -math.inf
        mine = self.found.get(fam)
        return min(bar, mine.step_s * (1 - ALT_GAP)) if mine else bar

    def close(self, bound: float) -> None:
        if self.proving:
            self.lower = min(self.lower, bound)

    def bound(self) -> float:
        return min([self.lower] + [b for b, _, _ in self.open])

    def add(self, plan: Plan, step_s: float, objective_s: float, tolerance_s: float, table: Table | None = None,
            units: int = 0) -> None:
        """Keep the plan if it is the best of its family so far."""
        fam = family_key(plan)
        cur = self.found.get(fam)
        if cur is not None and cur.step_s <= step_s:
            return
        self.seq += 1
        f = _Found(step_s, self.seq, plan, objective_s, tolerance_s, table, units)
        self.found[fam] = f
        if self.best is None or step_s < self.best.step_s:
            self.best = f

    def report(self, phase: str, done: int, total: int, bound_s: float | None = None) -> None:
        """Tell `progress` where the search stands: `done` of `total` configurations settled
        (visited or pruned), the incumbent, the proven bound (with `bound_s`, the numpy bound of
        the configurations not yet visited) and the gap."""
        if self.progress is None:
            return
        inc = self.best.step_s if self.best else None
        lb = self.bound() if bound_s is None else min(self.bound(), bound_s)
        gap = max(0.0, (inc - lb) / inc) if inc and math.isfinite(lb) else None
        self.progress({"phase": phase, "visited": done, "total": total, "incumbent_s": inc,
                       "bound_s": lb if math.isfinite(lb) else None, "gap": gap, "work_s": self.budget.work})

    # ---- one configuration ---------------------------------------------------------------------

    def descend(self, table: Table, tbound: float, goal: float, cap_s: float, work_left: float,
                resumed: bool = False) -> "_Outcome":
        """CP-SAT descent on one configuration and placement, from `goal`: first solution under the
        cutoff, then a lower cutoff, until nothing is left under it (closed) or `cap_s` of work is
        spent (open, with its proven bound). Reads nothing another descent of the same round
        changes (the incumbent is the round's), so a round's descents can run in threads and
        their merge, in order, is the same with one thread or two. `resumed` (a proof a cap
        stopped): the stage model with its per-rank least-time constraints (`StageModel`
        rank_cuts), which shorten hard proofs under memory pressure and slow easy ones."""
        out = _Outcome(table, tbound, goal)
        if min(cap_s, work_left) <= 1e-3:  # no work left for it: stays open with its bound
            out.kind = "open"
            return out
        cutoff = _t(goal) if goal < math.inf else None
        modes = self.modes_for(table)
        if not modes:  # (a search that plans only modes the overlap excludes: its twin plans them)
            out.kind = "closed" if cutoff is not None else "none"
            return out
        sm = StageModel(self.ctx, table, modes, self.uniform, cutoff, rank_cuts=resumed)
        self.inflight.add(sm)
        try:
            return self._descend(sm, out, cutoff, cap_s, work_left)
        finally:
            self.inflight.discard(sm)

    def _descend(self, sm: StageModel, out: "_Outcome", cutoff: int | None, cap_s: float,
                 work_left: float) -> "_Outcome":
        table, goal = out.table, out.goal
        keep = self.gap_limit if self.proving else ALT_GAP
        while True:
            work = min(cap_s, work_left) - out.work
            if work <= 1e-3 or self.budget.wall_left() <= 0:
                out.kind = "open"
                return out
            status, obj, bnd = sm.solve(work, wall_s=self.budget.wall_left(), first_solution=True)
            out.solves += 1
            out.work += sm.work_s
            out.wall_fired |= sm.wall_fired
            if status == "INFEASIBLE":  # proven: nothing in this configuration reaches the goal
                out.kind = "closed" if cutoff is not None else "none"
                return out
            if obj is None:  # stopped by its cap: keep the proven bound, resume at the end
                out.kind = "open"
                out.cp_bound = bnd * TIME_UNIT_S / sm.scale if bnd is not None else -math.inf
                return out
            stage_layers, recompute = sm.read_plan(sm.read_counts())
            rc: Any = recompute[0] if len(set(recompute)) == 1 else recompute
            est = _evaluate(self.problem, table.cfg.plan(rc, stage_layers))
            out.found.append((est.plan, est.step_time_s, obj * TIME_UNIT_S / sm.scale,
                              _rounding_tolerance(self.ctx, table), table, obj))
            if status == "OPTIMAL":
                out.kind = "solved"
                return out
            out.goal = goal = min(goal, est.step_time_s * (1 - keep))
            cutoff = min(_t(goal), obj - 1)
            sm.tighten(cutoff)

    def merge(self, out: "_Outcome") -> None:
        """Fold one descent's outcome into the search (in the round's order)."""
        self.solves += out.solves
        self.budget.spend(out.work, out.wall_fired)
        self.budget.count(UNIT_SOLVE * out.solves)
        for f in out.found:
            self.add(*f)
        if out.kind == "closed":
            self.close(out.goal)  # (up to the integer rounding, reported separately)
        elif out.kind == "solved":
            self.solved.add(out.table.cfg)
        elif out.kind == "open" and self.proving:
            self.timed_out = True
            self.seq += 1
            self.open.append((max(out.tbound, out.cp_bound), self.seq, out.table))

    def round(self, batch: list[tuple[Table, float]], cap_s: float, resumed: bool = False) -> None:
        """Descents on up to ROUND placements from the same incumbent, in threads when `jobs` > 1,
        merged in order: the answer does not depend on the number of threads."""
        goals = [self.target(t.cfg) for t, _ in batch]
        todo = [(t, b, g) for (t, b), g in zip(batch, goals) if g != -math.inf]
        # Each descent gets its own share of the work left, in order (the first up to its cap,
        # the next what the first may leave), so a round never spends more than the budget:
        # the descents run at the same time and cannot see each other's spending.
        left, shares = self.budget.cp_sat_left(), []
        for _ in todo:
            shares.append(max(0.0, min(cap_s, left)))
            left -= shares[-1]
        if self.pool is not None and len(todo) > 1:
            futures = [self.pool.submit(self.descend, t, b, g, w, w, resumed) for (t, b, g), w in zip(todo, shares)]
            try:
                outs = [f.result() for f in futures]
            except BaseException:  # Ctrl-C: stop the solves still running in the other thread
                for sm in list(self.inflight):
                    sm.stop()
                raise
        else:
            outs = [self.descend(t, b, g, w, w, resumed) for (t, b, g), w in zip(todo, shares)]
        for out in outs:
            self.merge(out)
        self.report("CP-SAT" if self.proving else "alternatives (CP-SAT)", self.visited, self.total,
                    self.frontier if self.proving else None)

    def attempt(self, table: Table, tbound: float, cap_s: float) -> None:
        """One descent on its own (a round of one)."""
        self.round([(table, tbound)], cap_s)

    def opt_bound(self, cfg: Config, opt_cache: dict, target: float) -> float:
        """The placement-free bound of cfg: the cheap one, and the costlier one with the recompute
        HBM forces where the cheap one does not reach `target` (memoized per configuration)."""
        got = self.opt_bounds.get(cfg)
        if got is None:
            self.budget.count(UNIT_VISIT)
            optimistic = _optimistic_table(self.ctx, cfg, opt_cache)
            got = [_table_bound(self.ctx, optimistic, self.modes, exact_windows=False), None, optimistic]
            self.opt_bounds[cfg] = got
        if got[0] >= target:
            return got[0]
        if got[1] is None:
            self.budget.count(UNIT_MEMORY_BOUND)
            got[1] = _table_bound(self.ctx, got[2], self.modes, exact_windows=False, memory=True)
        return got[1]

    def tables_of(self, cfg: Config) -> list[Table]:
        """The layer tables of cfg's placements (those `allow` admits)."""
        placed = _placements(self.problem, self.ctx, cfg, self.orders)
        if self.allow is not None:
            placed = [c for c in placed if self.allow(c)]
        return [layer_table(self.ctx, c, self.tables) for c in placed]

    def visit(self, cfg: Config, opt_cache: dict, cap_s: float | None = None) -> bool:
        """Bound, then solve, every placement of one configuration. False if it was pruned."""
        ctx, modes = self.ctx, self.modes
        tables = None
        if cfg.ep_overlap is False:  # a twin (`candidates`): only the placements its twin does not cover
            tables = [tb for tb in self.tables_of(cfg) if not self.redundant_twin(tb)]
            if not tables:
                return True  # nothing of its own to visit
        else:
            self.visited += 1  # (a twin's visit counts as its configuration's: the caps count visits)
        opt_bound = self.opt_bound(cfg, opt_cache, self.target(cfg))
        if opt_bound >= self.target(cfg):
            self.close(opt_bound)
            return False
        if tables is None:
            tables = self.tables_of(cfg)
        self.budget.count(UNIT_TABLE * len(tables))
        ranked = sorted(((max(opt_bound, _table_bound(ctx, tb, self.modes_for(tb) or modes)), j, tb)
                         for j, tb in enumerate(tables)),
                        key=lambda x: x[:2])
        i, done = 0, False
        while i < len(ranked) and not done:
            batch: list[tuple[Table, float]] = []  # up to ROUND placements, each checked against the incumbent
            while i < len(ranked) and len(batch) < ROUND:
                tbound, _, table = ranked[i]
                i += 1
                if tbound >= self.target(table.cfg):
                    self.close(tbound)
                    done = True
                    break
                if table.cfg in self.solved:  # (looking for alternatives: its best plan is known)
                    continue
                self.budget.count(UNIT_MEMORY_BOUND)
                with_memory = _table_bound(ctx, table, self.modes_for(table) or modes, memory=True)
                if with_memory >= self.target(table.cfg):  # HBM forces enough recompute to lose: no CP-SAT needed
                    self.close(with_memory)
                    continue
                batch.append((table, with_memory))
            # One hard configuration must not hold up the rest: cap each proof, keep its bound,
            # resume it at the end with the work left (`retry`).
            if batch:
                self.round(batch, self.cap_s if cap_s is None else cap_s)
        return True

    # ---- phases ------------------------------------------------------------------------------

    def run(self, order: Sequence[int], cands: Sequence[Config], t_lb: np.ndarray, opt_cache: dict) -> int:
        """The proof: candidates in order of their numpy bound until the next bound cannot beat the
        target or the budget is spent. Returns how many the numpy bound pruned."""
        pruned = 0
        total = self.total = len(order)
        for pos, i in enumerate(order):
            if t_lb[i] >= self.target():  # candidates come in order of their numpy bound
                pruned += len(order) - pos
                self.close(float(t_lb[i]))
                break
            if self.budget.exhausted():
                self.timed_out = True
                self.close(float(t_lb[i]))
                break
            if self.admit is not None and not self.admit(cands[i]):
                continue
            self.frontier = float(t_lb[i])
            pruned += not self.visit(cands[i], opt_cache)
            if self.visited % 8 == 0:
                self.report("search", pos + 1, total, float(t_lb[i]))
        self.report("search", total, total)
        return pruned

    def retry(self) -> None:
        """With the work left, resume the proofs a cap stopped, the weakest bound first, in rounds
        of growing caps (RETRY_CAP, then x4): one hard configuration cannot take the whole budget
        while others would close under the incumbent the previous round improved."""
        cap = RETRY_CAP
        while self.open:
            pending, self.open = sorted(self.open, key=lambda x: x[:2]), []
            k = 0
            while k < len(pending):
                batch: list[tuple[Table, float]] = []
                while k < len(pending) and len(batch) < ROUND:
                    bnd, _, table = pending[k]
                    if bnd >= self.target():
                        self.close(bnd)
                    elif self.budget.exhausted():
                        break
                    else:
                        batch.append((table, bnd))
                    k += 1
                if not batch:
                    self.open += pending[k:]
                    if k < len(pending):
                        return
                    break
                self.round(batch, min(cap, self.budget.cp_sat_left()), resumed=True)
            cap *= 4

    def alternatives(self, top_k: int, order: Sequence[int], cands: Sequence[Config], t_lb: np.ndarray, opt_cache: dict,
                     proof_work: float, proof_visits: int) -> bool:
        """The best plan of each of the `top_k` best families other than the chosen plan's: the
        same search again with each family's own target, within ALT_SHARE of the proof's work
        (CP-SAT deterministic time, CP-SAT calls and configurations visited: counts, not a clock). The warm
        start's greedy plans seed every family it tried. True if it completed within that share."""
        self.proving, self.top_k = False, top_k
        work_cap = self.budget.work + max(ALT_MIN_WORK, ALT_SHARE * proof_work)
        visit_cap = self.visited + max(ALT_MIN_VISITS, int(ALT_SHARE * proof_visits))
        solve_cap = self.solves + max(ALT_MIN_SOLVES, int(ALT_SHARE * self.solves))  # each call also costs its setup
        assert self.best is not None  # (called after a proof that found a plan)
        mine = family_key(self.best.plan)
        total = min(len(order), RUNNER_UP_CONFIGS)
        for n, i in enumerate(order[:RUNNER_UP_CONFIGS]):  # in order of the numpy bound, as the proof
            if t_lb[i] >= self.target():
                break
            if family_key(cands[i]) == mine or t_lb[i] >= self.target(cands[i]):
                continue
            if cands[i].ep_overlap is False:  # twins (`candidates`) are left to the proof: their CP-SAT
                continue  # calls would eat the alternatives' share for plans their families rarely need
            if (self.budget.work >= work_cap or self.visited >= visit_cap or self.solves >= solve_cap
                    or self.budget.exhausted()):
                return False
            self.visit(cands[i], opt_cache, cap_s=min(ALT_CAP, (work_cap - self.budget.work) / CP_SAT_WORK_PER_DET))
            if self.visited % 8 == 0:
                self.report("alternatives", n + 1, total)
        return True

    def tiebreak(self) -> None:
        """Among plans as fast as the chosen one in its configuration: fewest recomputed layers,
        then layers as early as possible (deterministic, a small fixed work cap)."""
        best = self.best
        if best is None or best.table is None:
            return
        sm = StageModel(self.ctx, best.table, self.modes_for(best.table), self.uniform, best.objective_units)
        # (CP-SAT time: at most TIEBREAK_WORK, and past the budget by at most half of it in units of work)
        work = min(TIEBREAK_WORK, (max(0.0, self.budget.work_left()) + TIEBREAK_WORK / 2) / CP_SAT_WORK_PER_DET)
        status, obj, _ = sm.solve(work / 2, wall_s=max(0.05, self.budget.wall_left()), first_solution=True)
        self.budget.spend(sm.work_s, sm.wall_fired)
        if obj is None:
            return
        sm.tiebreak(obj)
        status, obj2, _ = sm.solve(work / 2, wall_s=max(0.05, self.budget.wall_left()))
        self.budget.spend(sm.work_s, sm.wall_fired)
        if obj2 is None:
            return
        stage_layers, recompute = sm.read_plan(sm.read_counts())
        rc: Any = recompute[0] if len(set(recompute)) == 1 else recompute
        est = _evaluate(self.problem, best.table.cfg.plan(rc, stage_layers))
        if est.fits and est.step_time_s <= best.step_s + best.tolerance_s:
            f = _Found(min(est.step_time_s, best.step_s), best.order, est.plan, best.objective_s, best.tolerance_s,
                       best.table, best.objective_units)
            self.found[family_key(est.plan)] = f
            self.best = f


def fingerprint(problem: Problem, settings: dict[str, Any]) -> str:
    """sha256 of what determines a solve's answer: the problem, the autoshard and OR-Tools
    versions, and the budget settings (not the wall-clock limit, only a safety net)."""
    try:
        # (ortools' __init__.py sets __version__, but only its sat/python subpackage ships py.typed, so
        # mypy sees `ortools` as a namespace package without it)
        from ortools import __version__ as ortools_version  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:  # pragma: no cover
        ortools_version = "?"
    doc = {"problem": problem.model_dump(mode="json"), "autoshard": __version__, "ortools": ortools_version,
           "settings": settings}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _number(value: Any) -> float | None:
    """`value` as a float when it is a real number (not a bool, not text), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float range
        return math.inf


def check_solve_arguments(*, time_limit_s: Any, top_k: Any, gap_limit: Any, work_limit: Any = None,
                          jobs: Any = None) -> None:
    """The library's `solve` arguments checked as strictly as the command line's flags: a time
    limit that is not a positive finite number of seconds (NaN, 0, -1, inf), a negative `top_k`, a
    gap outside [0, 1), a work limit that is not positive and finite, fewer than 1 job: one
    InputError naming the argument (never an unbounded or a meaningless search)."""
    t = _number(time_limit_s)
    if t is None or not (math.isfinite(t) and t > 0):
        raise InputError(f"must be a number of seconds > 0, got {time_limit_s!r}", field="time_limit_s")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise InputError(f"must be a whole number >= 0, got {top_k!r}", field="top_k")
    g = _number(gap_limit)
    if g is None or not (math.isfinite(g) and 0 <= g < 1):
        raise InputError(f"must be a fraction in [0, 1), got {gap_limit!r}", field="gap_limit")
    w = _number(work_limit) if work_limit is not None else 1.0
    if w is None or not (math.isfinite(w) and w > 0):
        raise InputError(f"must be a positive amount of work, got {work_limit!r}", field="work_limit")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise InputError(f"must be a whole number >= 1, got {jobs!r}", field="jobs")


def solve(problem: Problem | Any, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, top_k: int = 3,
          gap_limit: float = DEFAULT_GAP_LIMIT, work_limit: float | None = None,
          alternatives: Sequence[str] = (), progress: ProgressFn | None = None, jobs: int | None = None) -> Solution:
    """The fastest plan that fits, with proof.

    `solver.status == 'OPTIMAL'` means no plan in the declared space is faster than the one
    returned by more than `gap_limit` (relative; default 0.1%, far below the cost model's
    own accuracy; `gap_limit=0` proves exact optimality). `solver.gap` is the proven gap.
    'FEASIBLE' means the budget stopped the proof; the gap is still proven.

    The budget is `work_limit` units of CP-SAT deterministic time (default
    DEFAULT_WORK_LIMIT; about a second of one core each) and counted configurations, so the
    answer does not depend on the machine or its load; `time_limit_s` of wall-clock time is a
    safety net (`solver.stopped_by` says when it fired).

    `top_k`: the best plan of each of the `top_k` best families (degrees tp, cp, ep, etp, pp and
    the schedule kind) other than the chosen plan's, from the same search. `alternatives`:
    named alternatives (`no-cp`, `tp-in-node`, `1f1b`, `even-stages`, `no-recompute`, `no-pp`,
    `no-ep`, or a fixed degree such as `tp8`), each the best plan under that restriction.
    `progress`: called with a dict (phase, visited, total, incumbent_s, bound_s, gap, work_s).
    `jobs`: threads for CP-SAT (default: 2 where the machine has them). Descents of up to ROUND
    placements start from the same incumbent and are merged in order, so the answer is the same
    with any `jobs`.

    Raises `InfeasibleError` with the binding constraint and the smallest fixes when no
    plan in the declared space fits.
    """
    t0 = time.perf_counter()
    check_solve_arguments(time_limit_s=time_limit_s, top_k=top_k, gap_limit=gap_limit, work_limit=work_limit,
                          jobs=jobs)
    shown = load_problem(problem)  # what the answer is evaluated against: no headroom unless it sets one
    headroom_gib, default_headroom = search_headroom(shown)
    problem = shown.model_copy(update={"search": shown.search.model_copy(update={"headroom_gib": headroom_gib})})
    try:
        with _fewer_full_collections():
            return _solve_with(problem, shown, headroom_gib, default_headroom, t0, time_limit_s, top_k, gap_limit,
                               work_limit, alternatives, progress, jobs)
    except InfeasibleError as exc:
        if exc.memory and default_headroom and headroom_gib > 0:  # the default margin may be what rules every plan out
            raise InfeasibleError(exc.reason, [*exc.suggestions, f"--headroom 0 (the search kept {headroom_gib:g} GiB "
                                               "per GPU free by default)"], memory=True) from None
        raise


def _solve_with(problem: Problem, shown: Problem, headroom_gib: float, default_headroom: bool, t0: float,
                time_limit_s: float, top_k: int, gap_limit: float, work_limit: float | None,
                alternatives: Sequence[str], progress: ProgressFn | None, jobs: int | None) -> Solution:
    ctx = context(problem)
    # The default modes (with the framework's recompute-module sets), or those `search: recompute` names.
    modes = search_modes(problem, ctx)
    ctx = with_modes(ctx, modes)  # the layer tables price every planned mode
    requests = [named(n, ctx) for n in dict.fromkeys(alternatives)]  # bad names fail before any work
    work_limit = DEFAULT_WORK_LIMIT if work_limit is None else work_limit
    if not (math.isfinite(work_limit) and work_limit > 0):
        raise InputError(f"must be a positive amount of work, got {work_limit:g}", field="--work-limit")
    passes, fallback = offload_passes(problem, ctx)
    # Each layer kind's costs, shared by the passes (`cost.layers._kind_costs`: keyed on what
    # `layer_costs` reads, which is not where the optimizer lives): a pass with the optimizer offloaded
    # after one where nothing fits prices no shape twice.
    kind_costs: dict = {}
    found: list[Solution] = []
    failed: InfeasibleError | _NothingFits | None = None
    for offload in passes:  # (CPU optimizer offload: searched where asked, or where nothing fits without it)
        try:
            found.append(_solve_space(problem, shown, headroom_gib, default_headroom, ctx, modes, requests, work_limit,
                                      t0, time_limit_s, top_k, gap_limit, alternatives, progress, jobs, offload,
                                      kind_costs))
        except (InfeasibleError, _NothingFits) as exc:
            failed = failed or exc
    if not found and fallback:
        offload_cands = candidates(problem, ctx, opt_offload=True)
        if offload_cands:
            try:
                found.append(_solve_space(problem, shown, headroom_gib, default_headroom, ctx, modes, requests,
                                          work_limit, t0, time_limit_s, top_k, gap_limit, alternatives, progress,
                                          jobs, True, kind_costs, offload_cands))
            except (InfeasibleError, _NothingFits):
                pass  # the plain search's reason stands (it names offload where offload alone would not do)
    if not found:
        assert failed is not None
        raise failed.error() if isinstance(failed, _NothingFits) else failed
    best = min(found, key=lambda s: s.estimate.step_time_s)  # (ties: the first pass, without offload)
    return dualpipe_pass(problem, shown, ctx, modes, headroom_gib, best)  # (where the framework plans DualPipe)


class _NothingFits(Exception):
    """`_solve`'s answer where no configuration fits in HBM, with what `explain_infeasible` reads: its
    explanation (which searches the space again with the optimizer offloaded, for the smallest fix)
    is made only where no pass finds a plan (`error`), not where the offload pass that follows does."""

    def __init__(self, problem: Problem, ctx: Context, cands: Sequence[Config], m_lb: np.ndarray):
        super().__init__("no configuration fits in HBM")
        self.inputs = (problem, ctx, cands, m_lb)

    def error(self) -> InfeasibleError:
        return InfeasibleError(*explain_infeasible(*self.inputs), memory=True)


def _solve_space(problem: Problem, shown: Problem, headroom_gib: float, default_headroom: bool, ctx: Context,
                 modes: list[str], requests: list[Named], work_limit: float, t0: float, time_limit_s: float,
                 top_k: int, gap_limit: float, alternatives: Sequence[str], progress: ProgressFn | None,
                 jobs: int | None, opt_offload: bool, kind_costs: dict | None = None,
                 cands: Sequence[Config] | None = None) -> Solution:
    """`solve` over the configurations with the optimizer in host memory (`opt_offload`) or without.
    `kind_costs`: the layer kinds' costs priced so far (`cost.layers.KIND_COSTS`), shared by the passes;
    `cands`: `candidates(problem, ctx, opt_offload=opt_offload)` where the caller has them."""
    budget = _Budget(work_limit, t0 + time_limit_s)
    if progress is not None:
        progress({"phase": "candidates", "visited": 0, "total": 0, "incumbent_s": None, "bound_s": None, "gap": None,
                  "work_s": budget.work})
    if cands is None:
        cands = candidates(problem, ctx, opt_offload=opt_offload)
    budget.count(UNIT_CANDIDATE * len(cands))
    if not cands:
        raise InfeasibleError(*explain_no_candidates(problem, ctx))
    if progress is not None:
        progress({"phase": "bounds", "visited": 0, "total": len(cands), "incumbent_s": None, "bound_s": None,
                  "gap": None, "work_s": budget.work})
    opt_cache: dict = {}  # per-layer costs on consecutive GPUs, shared by the bounds below
    if kind_costs is not None:
        opt_cache[KIND_COSTS] = kind_costs
    t_lb, m_lb, could_fit, refine = _lazy_bounds(ctx, cands, opt_cache)
    fits = (m_lb <= ctx.capacity_bytes) & could_fit
    pruned_mem = int((~fits).sum())
    # In order of the bound with the recompute HBM forces, (t_lb[i], i), refined as far as read
    # (`RefinedOrder`: t_lb is updated in place).
    order = RefinedOrder(np.flatnonzero(fits), t_lb, refine)
    search = _Search(problem, ctx, modes, gap_limit, budget, problem.search.uniform_stages, progress=progress)
    # (the placement-free and the placed tables share each layer kind's costs: `cost.layers._kind_costs`)
    search.tables[KIND_COSTS] = opt_cache.setdefault(KIND_COSTS, {})
    jobs = min(2, os.cpu_count() or 1) if jobs is None else jobs
    if jobs > 1:
        search.pool = ThreadPoolExecutor(max_workers=min(jobs, ROUND), thread_name_prefix="autoshard-cpsat")
    try:
        sol = _solve(problem, ctx, search, cands, order, t_lb, m_lb, pruned_mem, opt_cache, requests, budget,
                     t0, time_limit_s, top_k, gap_limit, work_limit, alternatives, modes)
    finally:
        if search.pool is not None:
            search.pool.shutdown(wait=True)
    # The answer as `evaluate` prices it on the problem as given (its fit predicate keeps no default
    # headroom): the free memory the reports show is the plan's real margin.
    return sol.model_copy(update={
        "estimate": _evaluate(shown, sol.plan),
        "alternatives": [a.model_copy(update={"estimate": _evaluate(shown, a.plan)}) for a in sol.alternatives],
        "solver": sol.solver.model_copy(update={"headroom_gib": headroom_gib, "headroom_default": default_headroom})})


def _solve(problem: Problem, ctx: Context, search: _Search, cands: Sequence[Config], order: Sequence[int], t_lb: np.ndarray,
           m_lb: np.ndarray, pruned_mem: int, opt_cache: dict, requests: list[Named], budget: _Budget, t0: float,
           time_limit_s: float, top_k: int, gap_limit: float, work_limit: float, alternatives: Sequence[str],
           modes: list[str]) -> Solution:
    """`solve` after the bounds: warm start, proof, tie-break, alternatives, the record."""
    # Warm start: greedy recompute mixes and stage splits on the most promising configurations
    # (no CP-SAT, a counted number of configurations); a strong incumbent early makes every
    # cutoff and bound bite. Its wall-clock deadline is only a safety net.
    search.report("warm start", 0, len(order))
    warm_deadline = budget.deadline  # (a safety net only: the warm start's effort is a count)
    # (Twins with the EP overlap off are left out: their greedy plans are their twins', priced as
    # evaluate prices them.)
    firsts = [cands[i] for i in order[:2 * WARM_START_CONFIGS] if cands[i].ep_overlap is not False]
    warm = _warm_start(problem, ctx, firsts[:WARM_START_CONFIGS], modes,
                       deadline=warm_deadline, opt_cache=opt_cache, table_cache=search.tables,
                       sink=(lambda e: search.add(e.plan, e.step_time_s, e.step_time_s, 0.0)) if top_k else None)
    if time.perf_counter() > warm_deadline:
        budget.wall_fired = True
    budget.count(UNIT_WARM * len(firsts[:WARM_START_CONFIGS]))
    if warm is not None:
        search.add(warm.plan, warm.step_time_s, warm.step_time_s, 0.0)

    pruned_bound = search.run(order, cands, t_lb, opt_cache)
    search.retry()
    stopped = bool(search.open) or search.timed_out
    search.tiebreak()
    bound_s = search.bound()
    proof_work, proof_visits = budget.work, search.visited
    alternatives_complete = True
    if top_k > 0 and search.best is not None:
        alternatives_complete = search.alternatives(top_k, order, cands, t_lb, opt_cache, proof_work, proof_visits)
    best = search.best
    if best is None:
        if search.timed_out:
            raise InfeasibleError("no plan found within the solver's budget "
                                  f"({work_limit:g} units of work, {time_limit_s:g} s wall-clock limit)",
                                  ["raise --work-limit or --time-limit", "restrict the search space with `search:`"])
        raise _NothingFits(problem, ctx, cands, m_lb)
    est = _evaluate(problem, best.plan)
    bound = min(best.step_s, bound_s)
    gap = max(0.0, (best.step_s - bound) / best.step_s)
    # Every configuration not solved to optimality contributed a proven bound (numpy, table,
    # memory, CP-SAT bound or cutoff), so the gap is proven even when limits fired.
    optimal = gap <= gap_limit + 1e-12
    mine = family_key(best.plan)
    others = sorted((f for k, f in search.found.items() if k != mine), key=lambda f: (f.step_s, f.order))
    alts: list[Alternative] = []
    for f in others:  # near-ties (within NEAR_TIE of the line's first family) are collapsed into its line
        if f.step_s > best.step_s * (1 + RUNNER_UP_SLOWER):
            break
        fam = family_name(family_key(f.plan))
        if alts and f.step_s <= alts[-1].estimate.step_time_s * (1 + NEAR_TIE) + f.tolerance_s:
            head = alts[-1]
            what = describe_difference(head.plan, f.plan)
            alts[-1] = head.model_copy(update={"differs": f"{head.differs}; within {100 * NEAR_TIE:g}%: {fam} "
                                                          f"(+{100 * (f.step_s / best.step_s - 1):.2f}%: {what})"})
            continue
        if len(alts) == top_k:
            break
        alts.append(_alternative(problem, best, f, fam))
    for req in requests:
        named = _named_alternative(problem, ctx, req, search, best, order, cands, t_lb, opt_cache,
                                   work_limit, budget.deadline)
        if named is not None:  # (none: the named family has no plan that fits)
            alts.append(named)
    stopped_by = ("wall-clock safety net" if budget.wall_fired else "work budget") if stopped and not optimal else (
        "wall-clock safety net" if budget.wall_fired else "")
    limit_fired = "wall" if budget.wall_fired else ("work" if stopped and not optimal else None)
    # What lets the proof finish: a work budget four times as large, or a safety net that leaves the
    # budget, not the clock, to end the search (four times as long, at least the default).
    prove = ""
    if limit_fired == "work":
        prove = f"--work-limit {4 * work_limit:g}"
    elif limit_fired == "wall":
        prove = f"--time-limit {max(4 * time_limit_s, DEFAULT_TIME_LIMIT_S):g}"
    settings = {"work_limit": work_limit, "gap_limit": gap_limit, "top_k": top_k,
                "alternatives": list(dict.fromkeys(alternatives))}
    stats = SolverStats(
        status="OPTIMAL" if optimal else "FEASIBLE", solve_time_s=time.perf_counter() - t0,
        objective_s=best.objective_s, objective_bound_s=bound, gap=gap, gap_limit=gap_limit, candidates=len(cands),
        pruned_by_memory=pruned_mem, pruned_by_bound=pruned_bound, cp_sat_solves=search.solves,
        rounding_tolerance_s=best.tolerance_s, work_s=round(budget.work, 3), cp_sat_work_s=round(budget.cp_sat, 3),
        work_limit=work_limit, stopped_by=stopped_by, limit_fired=limit_fired, prove_command=prove,
        alternatives_complete=alternatives_complete,
        fingerprint=fingerprint(problem, settings))
    return Solution(plan=est.plan, estimate=est, solver=stats, alternatives=alts)


def _alternative(problem: Problem, best: _Found, f: _Found, family: str) -> Alternative:
    return Alternative(plan=f.plan, estimate=_evaluate(problem, f.plan), differs=describe_difference(best.plan, f.plan),
                       slower_pct=100 * (f.step_s / best.step_s - 1), family=family)


def _named_alternative(problem: Problem, ctx: Context, req: Named, main: _Search, best: _Found, order: Sequence[int],
                       cands: Sequence[Config], t_lb: np.ndarray, opt_cache: dict, work: float,
                       deadline: float) -> Alternative | None:
    """The best plan under a named restriction: the chosen plan when it already qualifies, else a
    search of the admitted configurations with its own work budget. None if none fits."""
    plan = best.plan
    even = main.uniform or plan.stage_layers is None or max(plan.stage_layers) - min(plan.stage_layers) <= 1
    used = {plan.recompute} if isinstance(plan.recompute, str) else set(plan.recompute)
    qualifies = (req.allow(Config.of(plan, plan.dp or 1)) and (even or not req.uniform)
                 and (req.modes is None or used <= set(req.modes)))
    if qualifies:
        return Alternative(plan=best.plan, estimate=_evaluate(problem, best.plan),
                           differs=f"the chosen plan already has {req.description}", slower_pct=0.0,
                           family=req.name)
    modes = [m for m in main.modes if req.modes is None or m in req.modes]
    sub = _Search(problem, ctx, modes, main.gap_limit, _Budget(work, deadline), main.uniform or req.uniform,
                  allow=req.allow, admit=req.admit)
    sub.tables, sub.orders, sub.pool = main.tables, main.orders, main.pool
    sub.run(order, cands, t_lb, opt_cache)
    sub.retry()
    sub.tiebreak()
    if sub.best is None:
        return None
    f = sub.best
    return Alternative(plan=f.plan, estimate=_evaluate(problem, f.plan),
                       differs=f"{req.description}: {describe_difference(best.plan, f.plan)}",
                       slower_pct=100 * (f.step_s / best.step_s - 1), family=req.name)

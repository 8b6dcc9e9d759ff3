"""What `solve` returns: the plan, its estimate, solver statistics, alternatives."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from ..cost import Estimate
from ..spec import Plan


class SolverStats(BaseModel):
    model_config = ConfigDict(frozen=True)
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE
    solve_time_s: float
    objective_s: float | None  # the CP-SAT objective of the chosen plan, in seconds
    objective_bound_s: float | None  # proven lower bound on the optimum
    gap: float | None  # proven (objective - bound) / objective
    gap_limit: float = 0.0  # OPTIMAL means gap <= gap_limit
    candidates: int  # global configurations in the declared space (after divisibility)
    pruned_by_memory: int  # proven not to fit by the numpy memory bound
    pruned_by_bound: int  # proven no faster than the incumbent by the numpy time bound
    cp_sat_solves: int
    rounding_tolerance_s: float  # |objective - evaluated step time| allowed by integer rounding
    # The budget is deterministic work: CP-SAT's deterministic time (about a second per unit on a
    # current core) and counted configurations, so a solve stopped by it returns the same plan and
    # gap on a busy or a quiet machine. The wall-clock limit is only a safety net.
    work_s: float = 0.0  # deterministic work spent: CP-SAT deterministic time + counted Python work
    cp_sat_work_s: float = 0.0  # of which CP-SAT's deterministic time
    work_limit: float = 0.0  # the budget of deterministic work
    stopped_by: str = ""  # "" (proof complete) | "work budget" | "wall-clock safety net"
    # Which limit stopped the search: "wall" (the wall-clock safety net: the answer may then depend on
    # the machine and its load), "work" (the deterministic budget stopped the proof: FEASIBLE with its
    # proven gap, the same on any machine), or None (the proof and alternatives completed by budget).
    limit_fired: str | None = None
    prove_command: str = ""  # where a limit fired: the options that let the proof finish (e.g. --work-limit 160)
    # HBM per GPU the search kept free beside each stage's peak (on top of the 2 GiB reserve), and
    # whether it is the default (`search.DEFAULT_HEADROOM_FRACTION` of HBM: the memory model's measured
    # error) rather than the problem's `search.headroom_gib` / `--headroom`
    headroom_gib: float = 0.0
    headroom_default: bool = False
    alternatives_complete: bool = True  # False: the alternatives' share of the budget ran out
    fingerprint: str = ""  # sha256 of the problem, autoshard and OR-Tools versions and the budget
    # DualPipe, planned beside the proof by enumeration where the framework plans it
    # (solver/dualpipe_plans.py): plans priced, the fastest that fits with the headroom, whether chosen
    dualpipe_plans: int = 0
    dualpipe_best_s: float | None = None
    dualpipe_best_plan: str = ""
    dualpipe_chosen: bool = False


class Alternative(BaseModel):
    model_config = ConfigDict(frozen=True)
    plan: Plan
    estimate: Estimate
    differs: str  # what distinguishes it from the chosen plan
    slower_pct: float
    family: str = ""  # its family (degrees and schedule kind, e.g. `tp2 cp4 pp8 interleaved`) or the named request


class Solution(BaseModel):
    model_config = ConfigDict(frozen=True)
    plan: Plan
    estimate: Estimate
    solver: SolverStats
    alternatives: list[Alternative] = []

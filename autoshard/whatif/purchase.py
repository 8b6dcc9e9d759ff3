"""The purchase model: Pareto front of time vs cost, constraints, and the CP-SAT choice of one option."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from .report import money, money_vs, power, power_cap, power_vs
from .schema import ConstraintSpec

# =============================================================================================
# Pareto front and purchase optimizer
# =============================================================================================


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


# Integer scaling of the optimizer: seconds, cents, watts (Python integers: unbounded).
_INFINITE = 10**400  # stands for an infinite (or NaN) value: above every finite one
CPSAT_SAFE = 2**50  # the largest sum of one key's values given to CP-SAT (its objective is a double: 2^53)


def _int(x: float, how: Callable[[float], float] = round) -> int:
    return int(how(x)) if math.isfinite(x) else (-_INFINITE if x == -math.inf else _INFINITE)


def _scaled(c: Candidate) -> dict[str, int]:
    return {"time": _int(c.time_s), "cost": _int(c.cost_usd * 100),
            "capex": _int(c.capex_usd * 100), "power": _int(c.power_mw * 1e6)}


def _scaled_limits(cons: ConstraintSpec) -> dict[str, int | None]:
    def lim(x: float | None, scale: float) -> int | None:
        return None if x is None else _int(x * scale, math.floor)

    return {"time": lim(cons.deadline_days, 86400), "cost": lim(cons.budget_usd, 100),
            "capex": lim(cons.capex_budget_usd, 100), "power": lim(cons.power_cap_mw, 1e6)}


def violations(c: Candidate, cons: ConstraintSpec) -> list[str]:
    """The constraints a candidate breaks, in words (same integer scaling as the optimizer)."""
    v, lim = _scaled(c), _scaled_limits(cons)
    out = []
    if cons.budget_usd is not None and lim["cost"] is not None and v["cost"] > lim["cost"]:
        out.append("cost {} > budget {}".format(*money_vs(c.cost_usd, cons.budget_usd)))
    if cons.capex_budget_usd is not None and lim["capex"] is not None and v["capex"] > lim["capex"]:
        out.append("capex {} > capex budget {}".format(*money_vs(c.capex_usd, cons.capex_budget_usd)))
    if cons.power_cap_mw is not None and lim["power"] is not None and v["power"] > lim["power"]:
        out.append("power {} > cap {}".format(*power_vs(c.power_mw, cons.power_cap_mw)))
    if lim["time"] is not None and v["time"] > lim["time"]:
        out.append(f"{c.time_s / 86400:.1f} days > deadline {cons.deadline_days:g} days")
    return out


def optimize_purchase(cands: Sequence[Candidate], constraints: ConstraintSpec) -> Decision:
    """Choose exactly one candidate with CP-SAT: one boolean each, budget / capex / power /
    deadline as linear constraints on integer-scaled values (cents, watts, seconds),
    minimizing time (or cost), then the other, then the candidate index (deterministic:
    one worker, fixed seed).

    Values too large for CP-SAT's 64-bit integers and double objective (a key's values summing
    past 2^50: e.g. centuries of training, or an infinite price) are chosen by enumeration with
    the same lexicographic rule instead (status "ENUMERATED"), never a MODEL_INVALID."""
    from ortools.sat.python import cp_model  # noqa: PLC0415

    objective = resolve_objective(constraints)
    meets = tuple(not violations(c, constraints) for c in cands)
    if not cands:
        return Decision(None, objective, "NO_CANDIDATES", meets)
    vals = [_scaled(c) for c in cands]
    lim = _scaled_limits(constraints)
    second = "cost" if objective == "time" else "time"
    if any(sum(abs(v[k]) for v in vals) > CPSAT_SAFE or abs(lim[k] or 0) > CPSAT_SAFE for k in lim):
        ok = [i for i, good in enumerate(meets) if good]
        if not ok:
            return Decision(None, objective, "ENUMERATED", meets)
        return Decision(min(ok, key=lambda i: (vals[i][objective], vals[i][second], i)), objective, "ENUMERATED",
                        meets)
    m = cp_model.CpModel()
    x = [m.new_bool_var(f"x{i}") for i in range(len(cands))]
    m.add_exactly_one(x)
    for key, bound in lim.items():
        if bound is not None:
            m.add(sum(v[key] * xi for v, xi in zip(vals, x)) <= bound)
    status_name = "OPTIMAL"
    for i, key in enumerate((objective, second, "index")):
        expr = sum((v[key] if key != "index" else j) * xi for j, (v, xi) in enumerate(zip(vals, x)))
        m.minimize(expr)
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 0
        solver.parameters.catch_sigint_signal = False  # Ctrl-C interrupts autoshard, not one CP-SAT search
        solver.parameters.max_time_in_seconds = 30.0
        st = solver.solve(m)
        if i == 0:
            status_name = solver.status_name(st)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return Decision(None, objective, status_name, meets)
        m.add(expr == int(round(solver.objective_value)))
    chosen = next(i for i, xi in enumerate(x) if solver.boolean_value(xi))
    return Decision(chosen, objective, status_name, meets)


def runner_up(cands: Sequence[Candidate], dec: Decision,
              group: Callable[[Candidate], str] = lambda c: c.id) -> Candidate | None:
    """The next best candidate after the chosen one, by the decision's objective then the other key,
    among those that meet the constraints and differ from the chosen one by `group` (e.g. the
    hardware: the same cluster bought or rented runs the same plan); None when there is none."""
    if dec.index is None:
        return None
    key = (lambda i: (cands[i].time_s, cands[i].cost_usd, i)) if dec.objective == "time" else \
        (lambda i: (cands[i].cost_usd, cands[i].time_s, i))
    mine = group(cands[dec.index])
    rest = [i for i, ok in enumerate(dec.meets) if ok and group(cands[i]) != mine]
    return cands[min(rest, key=key)] if rest else None


def _constraint_text(cons: ConstraintSpec) -> str:
    parts = []
    if cons.budget_usd is not None:
        parts.append(f"budget {money(cons.budget_usd)}")
    if cons.capex_budget_usd is not None:
        parts.append(f"capex budget {money(cons.capex_budget_usd)}")
    if cons.power_cap_mw is not None:
        parts.append(f"power cap {power_cap(cons.power_cap_mw)}")
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
            + (f" (capex {money(c.capex_usd)})" if c.capex_usd else "") + f", {power(c.power_mw)}; the {word} "
            + (f"of the {n_ok} options (of {len(cands)} with a feasible plan) that meet {ctext}" if ctext and n_ok > 1
               else f"and only option (of {len(cands)} with a feasible plan) that meets {ctext}" if ctext
               else f"of the {len(cands)} options with a feasible plan (no constraints given)"))
    better = [d for d in cands if key(d) < key(c)]
    if better:
        b = min(better, key=key)
        text += f"; the {word} overall, {b.id} ({b.time_s / 86400:.1f} days, {money(b.cost_usd)}), breaks: " \
                + "; ".join(violations(b, cons))
    return text

"""`solve --robust`: re-point a solution at the plan whose prediction interval's upper end is lowest."""

from __future__ import annotations

from typing import Any

from ..cost.intervals import upper
from .explain import describe_difference
from .records import Alternative


def robust_choice(solution: Any) -> Any:
    """`solve --robust`: the solution re-pointed at the plan whose interval's upper bound is lowest
    among the chosen plan and its alternatives that fit (the least bad case the validation
    residuals allow); the other plans, the point-estimate optimum included, become its alternatives.
    Unchanged when the point-estimate optimum also has the lowest upper bound."""
    pool = [(solution.plan, solution.estimate, "")] + [
        (a.plan, a.estimate, getattr(a, "family", "")) for a in solution.alternatives
        if a.estimate.fits and a.estimate.step_time_s > 0]
    best = min(range(len(pool)), key=lambda i: (upper(pool[i][1]), i))
    if best == 0:
        return solution
    plan, est, _ = pool[best]
    has_family = "family" in Alternative.model_fields
    alts = [Alternative(plan=p, estimate=e, differs=describe_difference(plan, p),
                        slower_pct=100.0 * (e.step_time_s - est.step_time_s) / est.step_time_s,
                        **({"family": f or "the point-estimate optimum"} if has_family else {}))
            for i, (p, e, f) in enumerate(pool) if i != best]
    return solution.model_copy(update={"plan": plan, "estimate": est, "alternatives": alts})

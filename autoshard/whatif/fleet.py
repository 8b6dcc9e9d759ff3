"""Fleets: several pools of GPUs (owned, and candidates to buy; different generations and networks),
each training job (workload) on one pool, jobs on one pool one after another.

For every scenario (the owned pools; the owned pools plus each candidate; plus all candidates) the
assignment of jobs to pools is searched exhaustively (pools^jobs, at most MAX_ASSIGNMENTS; beyond that
longest-job-first onto the pool that finishes it soonest): the mix's makespan (the busiest pool's sum
of its jobs' times to train, failures included), running cost (each job's energy plus the amortized
capex of the pool for its time, `pricing.own`), energy, and the capex of the pools bought. "What to buy
next": among the scenarios that meet the constraints (deadline on the makespan, budget on running cost
plus capex, capex budget, power cap on the pools running together), the fastest (objective time) or
the cheapest in running cost plus capex (objective cost; `auto`: cost when only a deadline is given).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from ..cost.intervals import overlaps
from .schema import Pool, Study

INTERVAL_KEYS = ("time_to_train_days_low", "time_to_train_days_high", "cost_usd_low", "cost_usd_high",
                 "energy_mwh_low", "energy_mwh_high")  # a job's 80% bounds (see runner._interval_bounds)
MAX_ASSIGNMENTS = 200_000  # pools^jobs enumerated exactly; past it a greedy assignment (said in the answer)


def _times(study: Study, rows: Sequence[dict[str, Any]], pools: Sequence[Pool]) -> dict[tuple[str, str], dict]:
    by = {(r["workload"], r["option"]): r for r in rows}
    out = {}
    for w in study.workloads:
        for p in pools:
            r = by.get((w.name, p.option.id))
            if r is not None and r.get("feasible"):
                out[(w.name, p.name)] = r
    return out


def _assign(jobs: list[str], pools: list[Pool], table: dict[tuple[str, str], dict],
            objective: str, deadline_days: float | None) -> tuple[dict[str, str] | None, bool]:
    """(job -> pool name, exact) minimizing the objective; None when some job runs on no pool."""
    choices = [[p.name for p in pools if (j, p.name) in table] for j in jobs]
    if any(not c for c in choices):
        return None, True

    def score(assign: Sequence[str]) -> tuple:
        busy: dict[str, float] = {}
        cost = 0.0
        for j, p in zip(jobs, assign):
            r = table[(j, p)]
            busy[p] = busy.get(p, 0.0) + r["time_to_train_days"]
            cost += r["cost_usd"]
        span = max(busy.values())
        if objective == "cost":
            late = 0.0 if deadline_days is None else max(0.0, span - deadline_days)
            return (late, cost, span, tuple(assign))
        return (span, cost, tuple(assign))

    if math.prod(len(c) for c in choices) <= MAX_ASSIGNMENTS:
        best = min(itertools.product(*choices), key=score)
        return dict(zip(jobs, best)), True
    busy = {p.name: 0.0 for p in pools}  # longest job first onto the pool that finishes it soonest
    out: dict[str, str] = {}
    for j in sorted(jobs, key=lambda j: -max(table[(j, p)]["time_to_train_days"] for p in choices[jobs.index(j)])):
        p = min(choices[jobs.index(j)], key=lambda p: (busy[p] + table[(j, p)]["time_to_train_days"], p))
        busy[p] += table[(j, p)]["time_to_train_days"]
        out[j] = p
    return out, False


def _makespan_overlap(best: dict[str, Any], base: dict[str, Any]) -> str:
    """A clause saying whether two scenarios' makespans lie within each other's 80% interval."""
    keys = ("makespan_days_low", "makespan_days_high")
    if not all(k in best and k in base for k in keys):
        return ""
    a, b = (best[keys[0]], best[keys[1]]), (base[keys[0]], base[keys[1]])
    span = f"{a[0]:.1f}-{a[1]:.1f} vs {b[0]:.1f}-{b[1]:.1f} days"
    if overlaps(a, b):
        return (f"; the two makespans are within each other's 80% interval ({span}): the model cannot tell them "
                "apart; decide on cost and availability")
    return f"; the two makespans' 80% intervals do not overlap ({span})"


def fleet_answer(study: Study, rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The fleet section of a study's results (None without a fleet): scenarios, assignments, what to buy."""
    if not study.pools:
        return None
    pools = list(study.pools)
    owned = [p for p in pools if p.owned]
    cands = [p for p in pools if not p.owned]
    table = _times(study, rows, pools)
    cons = study.spec.constraints
    objective = cons.objective
    if objective == "auto":
        only_deadline = cons.deadline_days is not None and cons.budget_usd is None and cons.capex_budget_usd is None
        objective = "cost" if only_deadline else "time"
    jobs = [w.name for w in study.workloads]
    power = {p.name: next((r["power_mw"] for r in rows if r["option"] == p.option.id and r.get("power_mw")), None)
             for p in pools}
    capex = {p.name: next((r["capex_usd"] for r in rows if r["option"] == p.option.id and r.get("capex_usd")), 0.0)
             for p in pools}
    sets: list[tuple[str, list[Pool]]] = []
    if owned:
        sets.append(("owned pools only", owned))
    for c in cands:
        sets.append((f"{'owned + ' if owned else ''}buy {c.name}", owned + [c]))
    if len(cands) > 1:
        sets.append((f"{'owned + ' if owned else ''}buy all candidates", pools))
    scenarios = []
    for label, ps in sets:
        assign, exact = _assign(jobs, ps, table, objective, cons.deadline_days)
        bought = [p.name for p in ps if not p.owned]
        sc: dict[str, Any] = {"scenario": label, "pools": [p.name for p in ps], "buys": bought,
                              "capex_usd": sum(capex[b] for b in bought)}
        if assign is None:
            missing = [j for j in jobs if not any((j, p.name) in table for p in ps)]
            sc.update(feasible=False, reason=f"no pool of this scenario runs {', '.join(missing)}")
            scenarios.append(sc)
            continue
        busy = {p.name: 0.0 for p in ps}
        for j, p in assign.items():
            busy[p] += table[(j, p)]["time_to_train_days"]
        running = sum(table[(j, p)]["cost_usd"] for j, p in assign.items())
        energy = sum(table[(j, p)]["energy_mwh"] for j, p in assign.items())
        pw = sum(power[p.name] or 0.0 for p in ps)
        sc.update(feasible=True, exact=exact, assignment=assign,
                  jobs=[{"job": j, "pool": p, "time_to_train_days": table[(j, p)]["time_to_train_days"],
                         "cost_usd": table[(j, p)]["cost_usd"], "energy_mwh": table[(j, p)]["energy_mwh"],
                         **{k: table[(j, p)][k] for k in INTERVAL_KEYS if table[(j, p)].get(k) is not None},
                         "plan": table[(j, p)].get("plan_short", "")} for j, p in assign.items()],
                  pool_busy_days=busy, makespan_days=max(busy.values()), running_cost_usd=running,
                  total_cost_usd=running + sc["capex_usd"], energy_mwh=energy, power_mw=pw)
        if all(table[(j, p)].get(k) is not None for j, p in assign.items() for k in INTERVAL_KEYS):
            for tag in ("low", "high"):  # the makespan with every job at the same end of its 80% interval
                span = {p.name: 0.0 for p in ps}
                for j, p in assign.items():
                    span[p] += table[(j, p)][f"time_to_train_days_{tag}"]
                sc[f"makespan_days_{tag}"] = max(span.values())
        v = []
        if cons.deadline_days is not None and sc["makespan_days"] > cons.deadline_days * (1 + 1e-9):
            v.append(f"makespan {sc['makespan_days']:.1f} days > deadline {cons.deadline_days:g}")
        if cons.budget_usd is not None and sc["total_cost_usd"] > cons.budget_usd * (1 + 1e-9):
            v.append(f"cost ${sc['total_cost_usd']:,.0f} > budget ${cons.budget_usd:,.0f}")
        if cons.capex_budget_usd is not None and sc["capex_usd"] > cons.capex_budget_usd * (1 + 1e-9):
            v.append(f"capex ${sc['capex_usd']:,.0f} > capex budget ${cons.capex_budget_usd:,.0f}")
        if cons.power_cap_mw is not None and pw > cons.power_cap_mw * (1 + 1e-9):
            v.append(f"power {pw:.2f} MW with every pool running > cap {cons.power_cap_mw:g} MW")
        sc["violations"] = v
        scenarios.append(sc)
    ok = [s for s in scenarios if s.get("feasible") and not s["violations"]]
    key = ((lambda s: (s["makespan_days"], s["capex_usd"], s["running_cost_usd"])) if objective == "time" else
           (lambda s: (s["total_cost_usd"], s["makespan_days"])))
    best = min(ok, key=key) if ok else None
    base = next((s for s in scenarios if not s["buys"] and s.get("feasible")), None)
    if best is None:
        feas = [s for s in scenarios if s.get("feasible")]
        why = ("no scenario runs every job" if not feas else
               "no scenario meets the constraints: " + "; ".join(f"{s['scenario']}: {', '.join(s['violations'])}"
                                                                 for s in feas))
        buy = {"buy": None, "scenario": None, "reason": why}
    else:
        what = ", ".join(best["buys"]) or "nothing"
        reason = (f"{best['scenario']}: the job mix in {best['makespan_days']:.1f} days, "
                  f"${best['running_cost_usd']:,.0f} running + ${best['capex_usd']:,.0f} capex, "
                  f"{best['energy_mwh']:,.0f} MWh")
        if base is not None and best is not base:
            saved = base["makespan_days"] - best["makespan_days"]
            reason += (f"; against the owned pools alone ({base['makespan_days']:.1f} days"
                       + (f", {', '.join(base['violations'])}" if base["violations"] else "") + f"): "
                       f"{saved:+.1f} days sooner" + (f", ${best['capex_usd'] / saved / 1e6:,.2f}M of capex per day saved"
                                                      if saved > 0 and best["capex_usd"] else ""))
            reason += _makespan_overlap(best, base)
        buy = {"buy": best["buys"], "scenario": best["scenario"], "reason": f"buy {what}: " + reason}
    return {"objective": objective, "pools": [{"name": p.name, "option": p.option.id, "gpu": p.option.gpu,
                                               "num_gpus": p.option.num_gpus, "topology": p.option.topology,
                                               "owned": p.owned, "capex_usd": capex[p.name],
                                               "power_mw": power[p.name]} for p in pools],
            "scenarios": scenarios, "recommendation": buy}

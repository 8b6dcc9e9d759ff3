"""Published parallelism plans vs the solver's choice, on the bundled problems that reproduce them.

    python benchmarks/bench_published.py                       # all cases, bundled `search:`, 120 s per solve
    python benchmarks/bench_published.py --unrestricted        # solve without the problems' `search:` too
    python benchmarks/bench_published.py --only deepseek --time-limit 30 --jobs 1 --json out.json
    python benchmarks/bench_published.py --from-json out.json   # print an earlier run again

For each case: the published plan is priced with `autoshard.evaluate` (on the problem with its
`search:` restrictions removed, so that nothing about the plan is filtered), and the problem is
solved (`solve(problem, time_limit_s=...)`), with its bundled `search:` and, with
`--unrestricted`, also without it. The output is one Markdown table (published plan, its predicted
step time, chosen plan, its predicted step time, solver status, how they differ), then per case
the time breakdowns (`Estimate.time_breakdown_s`), peak memory, why a published plan does not fit
(`Estimate.reasons`) and the variants of the published plan that were also priced.

Every number is a prediction of autoshard's cost model, not a measurement. Where the publication
leaves a knob open, the case says what was assumed (see `notes`). docs/published-plans.md holds
the results of a run and what they mean.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from autoshard import Plan, SearchSpec, evaluate, load_plan, load_problem  # noqa: E402
from autoshard.errors import InfeasibleError  # noqa: E402
from autoshard.solver import describe_difference, run_length  # noqa: E402

# Llama 3 405B: 126 layers over pp16 x vpp4 = 64 virtual stages of 2 layers, one layer fewer on
# the first and on the last virtual stage (paper: "we reduce one Transformer layer each from the
# first and the last stages" so that embedding and output/loss do not unbalance them).
LLAMA3_405B_STAGES = [1] + [2] * 62 + [1]


@dataclass
class Case:
    key: str
    title: str
    problem: str  # path relative to the repository root
    source: str
    plan: dict[str, Any] | str  # the published plan, or "problem" for the problem file's `plan:`
    notes: list[str]
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> overrides of `plan`


CASES = [
    Case(
        key="llama3-405b",
        title="Llama 3 405B on 16,384 H100",
        problem="problems/llama3-405b-16384xh100.yaml",
        source="Meta, The Llama 3 Herd of Models (2024), sec. 3.3.2 and Table 4",
        plan=dict(tp=8, sequence_parallel=True, cp=1, pp=16, dp=128, vpp=4, schedule="interleaved",
                  zero_stage=2, micro_batch_size=1, recompute="none", stage_layers=LLAMA3_405B_STAGES,
                  placement="tp-cp-pp-dp"),
        notes=[
            "published: TP8, CP1, PP16, DP128 at seq 8,192, 16M tokens per batch (16 sequences per DP rank), "
            "bf16; rank order [TP, CP, PP, DP]; interleaved pipeline schedule; one transformer layer fewer "
            "on the first and the last stage; 'pre-train ... on sequences of 8K tokens without activation "
            "checkpointing' (recompute none)",
            "assumed: vpp=4 (the paper does not give the number of virtual stages; the removed layers are "
            "taken from the first and the last of 64 two-layer virtual stages); micro-batch 1; sequence "
            "parallelism on (not stated); FSDP that shards gradients and optimizer states but keeps the "
            "parameters gathered from forward to backward is modelled as ZeRO-2",
        ],
        variants={"ZeRO-1 instead of ZeRO-2": {"zero_stage": 1},
                  "1F1B, no interleaving (even split)": {"vpp": 1, "schedule": "1f1b", "stage_layers": None}},
    ),
    Case(
        key="deepseek-v3",
        title="DeepSeek-V3 on 2,048 H800",
        problem="problems/deepseek-v3-2048xh800.yaml",
        source="DeepSeek-AI, DeepSeek-V3 Technical Report (2024), sec. 3.2",
        plan=dict(tp=1, ep=64, pp=16, dp=128, zero_stage=1, micro_batch_size=1, schedule="zero_bubble",
                  recompute="layernorm+mla_up_proj", moe_dispatcher="deepep"),
        notes=[
            "published: 16-way PP, 64-way EP over 8 nodes, ZeRO-1 DP, no TP; DualPipe; FP8 training; "
            "recomputation of RMSNorm and the MLA up-projections; batch 15,360 x 4,096 tokens",
            "assumed: DualPipe priced as the zero-bubble (ZB-H1) schedule on the problem's Megatron profile "
            "(Megatron has no DualPipe); the DualPipeV variant prices the V schedule with its all-to-all "
            "overlap on torchtitan's profile; their partial recompute as the recompute modules "
            "`layernorm+mla_up_proj`; their dispatch kernels (DeepEP: a token crosses IB once per node, "
            "fanned out over NVLink; node-limited routing to 4 nodes priced from the preset's "
            "moe_max_nodes_per_token) as `deepep`; micro-batch 1; an even layer split. DeepSeek's own stack "
            "(DualPipe, FP8 dispatch, ZeRO-1) is the `deepseek` profile: docs/deepseek-v3.md",
        ],
        variants={"full recompute (the least memory-hungry version)": {"recompute": "full"},
                  "DualPipeV with full recompute, on torchtitan's profile (DualPipeV beside FSDP, fp32 master "
                  "weights; DeepSeek's own profile: docs/deepseek-v3.md)": {"framework": "torchtitan", "schedule": "dualpipev",
                                                          "vpp": 2, "zero_stage": 3, "recompute": "full",
                                                          "moe_dispatcher": None}},
    ),
    Case(
        key="llama3-70b",
        title="Llama 3 70B on 640 H100",
        problem="problems/llama3-70b-640xh100.yaml",
        source="seed plan (shared/seeds/004, REFERENCE sec. 7): a written recommendation, not a measured run",
        plan="problem",
        notes=["published: TP8 + SP, PP4, DP20, ZeRO-1 (distributed optimizer), at seq 4,096; the problem "
               "file's `plan:` (micro-batch 1, 1F1B, no recompute)"],
    ),
    Case(
        key="gpt3-175b",
        title="GPT-3 175B on 1,024 A100",
        problem="problems/gpt3-175b-1024xa100.yaml",
        source="Narayanan et al., Efficient Large-Scale Language Model Training on GPU Clusters Using "
               "Megatron-LM (SC21), Table 1",
        plan=dict(tp=8, sequence_parallel=False, pp=8, dp=16, vpp=2, schedule="interleaved", zero_stage=0,
                  micro_batch_size=2, recompute="full"),
        notes=[
            "not a published run at this size: the recipe of the paper's Table 1 145.6B row (TP8, PP8, "
            "2 virtual stages per rank, micro-batch 2, full recompute, no distributed optimizer, no "
            "sequence parallelism, which came later) applied to the 96-layer GPT-3 175B on 1,024 GPUs",
            "bf16 instead of the paper's fp16 mixed precision",
        ],
        variants={"micro-batch 1": {"micro_batch_size": 1}},
    ),
]


# ---- running one case ------------------------------------------------------------------------


def published_plan(case: Case) -> Plan:
    if case.plan == "problem":
        return load_plan(REPO / case.problem)
    return Plan(**case.plan)


def unrestricted(problem):
    return problem.model_copy(update={"search": SearchSpec()})


def _solve(args: tuple[str, bool, float]) -> dict[str, Any]:
    """Solve one problem (in a worker process): a JSON-able summary or the infeasibility."""
    from autoshard.solver import solve  # noqa: PLC0415

    path, drop_search, limit = args
    problem = load_problem(REPO / path)
    if drop_search:
        problem = unrestricted(problem)
    t0 = time.perf_counter()
    try:
        sol = solve(problem, time_limit_s=limit, top_k=0)
    except InfeasibleError as exc:
        return {"status": "INFEASIBLE", "reason": exc.reason, "wall_s": time.perf_counter() - t0}
    return {"status": sol.solver.status, "gap": sol.solver.gap, "wall_s": time.perf_counter() - t0,
            "plan": sol.plan.model_dump(mode="json"), "estimate": sol.estimate.model_dump(mode="json")}


def estimate_summary(est) -> dict[str, Any]:
    return {"fits": est.fits, "reasons": list(est.reasons), "warnings": list(est.warnings),
            "plan": est.plan.model_dump(mode="json"), "plan_summary": est.plan.short(),
            "step_time_s": est.step_time_s, "mfu": est.mfu, "tokens_per_s": est.tokens_per_s,
            "peak_memory_gib": est.peak_memory_gib, "memory_capacity_gib": est.memory_capacity_gib,
            "time_breakdown_s": {k: v for k, v in est.time_breakdown_s.items() if v},
            "memory_breakdown_gib": est.memory_breakdown_gib}


def plan_text(plan: Plan) -> str:
    s = plan.short()
    if plan.placement != "tp-cp-ep-dp-pp":
        s += f" [{plan.placement}]"
    return s


def run(cases: list[Case], limit: float, jobs: int, also_unrestricted: bool) -> list[dict[str, Any]]:
    tasks: list[tuple[str, bool, float]] = []
    for c in cases:
        tasks.append((c.problem, False, limit))
        if also_unrestricted:
            tasks.append((c.problem, True, limit))
    t0 = time.perf_counter()
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)),
                                 mp_context=multiprocessing.get_context("spawn")) as ex:
            solved = list(ex.map(_solve, tasks))
    else:
        solved = [_solve(t) for t in tasks]
    print(f"# solved {len(tasks)} problems in {time.perf_counter() - t0:.0f} s "
          f"(time limit {limit:g} s each, {jobs} jobs)", file=sys.stderr)
    by_task = dict(zip([(t[0], t[1]) for t in tasks], solved))
    results = []
    for c in cases:
        problem = unrestricted(load_problem(REPO / c.problem))
        pub = published_plan(c)
        est = evaluate(problem, pub)
        variants = {}
        for label, over in c.variants.items():
            data = pub.model_dump()
            over = dict(over)
            fw = over.pop("framework", None)  # a variant may run on another framework's profile
            data.update(over)
            prob = problem if fw is None else problem.model_copy(update={"framework": fw})
            variants[label] = estimate_summary(evaluate(prob, Plan(**data)))
        entry: dict[str, Any] = {"key": c.key, "title": c.title, "problem": c.problem, "source": c.source,
                                 "notes": c.notes, "published": estimate_summary(est), "variants": variants}
        for tag, drop in (("solved", False), ("solved_unrestricted", True)):
            s = by_task.get((c.problem, drop))
            if s is None:
                continue
            if "plan" in s:
                chosen = Plan(**s["plan"])
                s = dict(s, plan_summary=chosen.short(), differs=describe_difference(est.plan, chosen),
                         speedup_vs_published=(est.step_time_s / s["estimate"]["step_time_s"]
                                               if est.fits and est.step_time_s else None))
                s["estimate"] = {k: v for k, v in s["estimate"].items() if k != "stages"}
            entry[tag] = s
        results.append(entry)
    return results


# ---- printing -----------------------------------------------------------------------------------


def fmt_step(x: float | None) -> str:
    return "-" if not x else f"{x:.2f} s"


def table(results: list[dict[str, Any]], tag: str) -> str:
    head = ("| case | published plan | predicted step | chosen plan | predicted step | status | "
            "where they differ |\n|---|---|---|---|---|---|---|")
    rows = [head]
    for r in results:
        pub = r["published"]
        pub_step = fmt_step(pub["step_time_s"]) + ("" if pub["fits"] else " (does not fit)")
        s = r.get(tag)
        if s is None:
            continue
        if "plan" in s:
            chosen = Plan(**s["plan"])
            status = s["status"] + (f" (gap {100 * s['gap']:.1f}%)" if s.get("gap") else "")
            differs = describe_difference(Plan(**pub["plan"]), chosen)
            rows.append(f"| {r['title']} | `{plan_text(Plan(**pub['plan']))}` | {pub_step} | `{plan_text(chosen)}` | "
                        f"{fmt_step(s['estimate']['step_time_s'])} | {status} | {differs} |")
        else:
            rows.append(f"| {r['title']} | `{plan_text(Plan(**pub['plan']))}` | {pub_step} | - | - | {s['status']} | "
                        f"{s.get('reason', '')} |")
    return "\n".join(rows)


def breakdown(bd: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(bd.items(), key=lambda kv: -kv[1]))


def details(results: list[dict[str, Any]]) -> str:
    out = []
    for r in results:
        pub = r["published"]
        out.append(f"\n## {r['title']} ({r['problem']})\nsource: {r['source']}")
        out += [f"note: {n}" for n in r["notes"]]
        out.append(f"published `{plan_text(Plan(**pub['plan']))}`: step {fmt_step(pub['step_time_s'])}, "
                   f"MFU {pub['mfu']:.1%}, peak {pub['peak_memory_gib']:.1f} / {pub['memory_capacity_gib']:.1f} GiB"
                   + ("" if pub["fits"] else " - DOES NOT FIT"))
        out.append(f"  time (s): {breakdown(pub['time_breakdown_s'])}")
        out.append(f"  memory (GiB, peak stage): {breakdown(pub['memory_breakdown_gib'])}")
        for reason in pub["reasons"]:
            out.append(f"  does not fit: {reason}")
        for w in pub["warnings"]:
            out.append(f"  warning: {w}")
        for label, v in r["variants"].items():
            out.append(f"variant ({label}) `{v['plan_summary']}`: step {fmt_step(v['step_time_s'])}, "
                       f"MFU {v['mfu']:.1%}, peak {v['peak_memory_gib']:.1f} GiB" + ("" if v["fits"] else " - DOES NOT FIT"))
            out.append(f"  time (s): {breakdown(v['time_breakdown_s'])}")
        for tag, label in (("solved", "chosen (bundled search)"), ("solved_unrestricted", "chosen (no search limits)")):
            s = r.get(tag)
            if s is None:
                continue
            if "plan" not in s:
                out.append(f"{label}: {s['status']}: {s.get('reason', '')}")
                continue
            e = s["estimate"]
            chosen = Plan(**s["plan"])
            out.append(f"{label} `{plan_text(chosen)}` stages {run_length(chosen.stage_layers or [])}: "
                       f"step {fmt_step(e['step_time_s'])}, MFU {e['mfu']:.1%}, peak {e['peak_memory_gib']:.1f} GiB, "
                       f"{s['status']} in {s['wall_s']:.0f} s")
            out.append(f"  time (s): {breakdown({k: v for k, v in e['time_breakdown_s'].items() if v})}")
            out.append(f"  memory (GiB, peak stage): {breakdown(e['memory_breakdown_gib'])}")
            out.append(f"  differs from published: {describe_difference(Plan(**pub['plan']), chosen)}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per solve (default 120)")
    ap.add_argument("--jobs", type=int, default=4, help="solves in parallel (default 4)")
    ap.add_argument("--only", default=None, help="run the cases whose key contains this text")
    ap.add_argument("--unrestricted", action="store_true", help="also solve without the problems' `search:`")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--from-json", metavar="FILE", help="print the results of an earlier --json run (no solving)")
    a = ap.parse_args()
    if a.from_json:
        results = json.loads(Path(a.from_json).read_text(encoding="utf-8"))
    else:
        cases = [c for c in CASES if a.only is None or a.only in c.key]
        if not cases:
            ap.error(f"no case matches {a.only!r}; cases: {', '.join(c.key for c in CASES)}")
        results = run(cases, a.time_limit, a.jobs, a.unrestricted)
    print("Solved with the bundled problems' `search:` restrictions:\n")
    print(table(results, "solved"))
    if any("solved_unrestricted" in r for r in results):
        print("\nSolved without `search:` restrictions:\n")
        print(table(results, "solved_unrestricted"))
    print(details(results))
    if a.json and not a.from_json:
        Path(a.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

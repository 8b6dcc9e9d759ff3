"""One notion of runnable: `cost.launch_reasons` is what the frameworks' launchers refuse, `evaluate`
flags it (exit 1 under --strict), and the solver never returns it.

Independent references, transcribed here:
- Megatron-LM megatron/training/initialize.py (NVIDIA/Megatron-LM d98e8a64dd, 2026-08-22) passes
  order='tp-cp-ep-dp-pp', or 'tp-cp-ep-pp-dp' with --use-tp-pp-dp-mapping, to
  parallel_state.initialize_model_parallel, which asserts `order.endswith("pp") or
  pipeline_model_parallel_size == 1 or expert_data_parallel_size == data_parallel_size`, with
  expert_data_parallel_size = world_size // (expert_tp * ep * pp). Axes of size 1 place no rank.
- DeepSpeed deepspeed/runtime/pipe/engine.py (deepspeedai/DeepSpeed edaa722, 2026-08-22):
  `assert self.zero_optimization_stage() < ZeroStageEnum.gradients, "ZeRO-2 and ZeRO-3 are
  incompatible with pipeline parallelism"`.
"""

import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard import Plan, load_problem
from autoshard.cost import context, launch_reasons
from autoshard.solver import candidates, solve
from autoshard.solver.candidates import _placements

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys; from autoshard.cli import main; sys.exit(main(sys.argv[1:]))"
MEGATRON_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")


def megatron_accepts(plan: Plan, n: int) -> bool:
    """Megatron's rule, from its source (module docstring), for a plan's placement."""
    dp = n // (plan.tp * plan.cp * plan.pp)
    etp = plan.etp or plan.tp
    edp = n // (etp * plan.ep * plan.pp)
    folded = etp != plan.tp or dp % plan.ep != 0
    sizes = {"tp": plan.tp, "cp": plan.cp, "ep": 1 if folded else plan.ep,
             "dp": dp if folded else dp // plan.ep, "pp": plan.pp}
    live = [a for a in plan.placement.split("-") if sizes[a] > 1]
    for order in MEGATRON_ORDERS:
        if [a for a in order.split("-") if sizes[a] > 1] == live:
            if order.endswith("pp") or plan.pp == 1 or edp == dp:
                return True
    return False


def test_launch_reasons_are_megatrons_rank_order_rule():
    p = load_problem({"model": "mixtral-8x7b", "training": {"seq_len": 4096, "global_batch_size": 512},
                      "cluster": {"gpu": "h100-sxm", "num_gpus": 64}})
    rng = random.Random(3)
    seen = {True: 0, False: 0}
    for _ in range(300):
        tp, cp, pp = rng.choice([1, 2, 4]), rng.choice([1, 2]), rng.choice([1, 2, 4])
        dp = 64 // (tp * cp * pp)
        ep = rng.choice([e for e in (1, 2, 4, 8) if e <= dp and dp % e == 0])
        order = "-".join(rng.sample(["tp", "cp", "ep", "dp", "pp"], 5))
        plan = Plan(tp=tp, cp=cp, ep=ep, pp=pp, placement=order)
        ok = megatron_accepts(plan, 64)
        seen[ok] += 1
        assert (not launch_reasons(p, plan)) == ok, (plan.short(), order)
    assert seen[True] > 30 and seen[False] > 30  # both sides exercised
    # pp inside dp: accepted only where attention and experts have the same data-parallel size
    assert not launch_reasons(p, Plan(tp=2, ep=1, pp=2, placement="tp-cp-ep-pp-dp"))
    why = launch_reasons(p, Plan(tp=2, ep=8, pp=2, placement="tp-cp-ep-pp-dp"))
    assert why and why[0].field == "placement" and "expert dp=2" in why[0]
    # hand-mapped ranks (search.placement_layout: any) take every order
    anyp = p.model_copy(update={"search": p.search.model_copy(update={"placement_layout": "any"})})
    assert not launch_reasons(anyp, Plan(tp=2, ep=8, pp=2, placement="tp-cp-ep-pp-dp"))


def test_deepspeed_refuses_zero2_and_zero3_with_a_pipeline():
    p = load_problem({"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64},
                      "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 16}, "framework": "deepspeed"})
    for zero, pp in itertools.product([0, 1, 2, 3], [1, 2]):
        refused = launch_reasons(p, Plan(tp=2, pp=pp, zero_stage=zero))
        assert bool(refused) == (zero >= 2 and pp > 1), (zero, pp)
    assert "ZeRO-2 and ZeRO-3 are incompatible" in launch_reasons(p, Plan(tp=2, pp=2, zero_stage=3))[0]


def test_deepspeed_solves_never_return_zero2_or_zero3_with_pp():
    # The same search under Megatron (no such rule) keeps ZeRO-2/3 beside pipelines; under DeepSpeed
    # none is left, while ZeRO-3 without a pipeline and ZeRO-1 with one stay.
    doc = {"model": "llama3-70b", "training": {"seq_len": 4096, "global_batch_size": 256},
           "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 64}, "framework": "deepspeed",
           "search": {"tp": [4, 8], "pp": [1, 2, 4], "micro_batch_size": [1], "headroom_gib": 0}}
    p = load_problem(doc)
    kinds = {(r[7], r[3] > 1) for r in candidates(p, context(p)).rows}
    mega = load_problem({**doc, "framework": "megatron"})
    assert {(2, True), (3, True)} <= {(r[7], r[3] > 1) for r in candidates(mega, context(mega)).rows}
    assert (3, False) in kinds and (1, True) in kinds  # both kinds remain in the space
    assert not any(z >= 2 and pp for z, pp in kinds)
    sol = solve(p, top_k=3)
    for plan in [sol.plan, *(a.plan for a in sol.alternatives)]:
        assert not (plan.zero_stage >= 2 and plan.pp > 1), plan.short()
        assert not launch_reasons(p, plan)


def test_solver_placements_obey_megatrons_rule_even_when_the_search_names_the_order():
    doc = {"model": "mixtral-8x7b", "training": {"seq_len": 4096, "global_batch_size": 512},
           "cluster": {"gpu": "h100-sxm", "num_gpus": 64},
           "search": {"placement": ["tp-cp-ep-pp-dp", "tp-cp-ep-dp-pp"], "pp": [2, 4], "ep": [1, 8]}}
    p = load_problem(doc)
    ctx = context(p)
    cands = candidates(p, ctx)
    checked = 0
    for i in range(0, len(cands), max(1, len(cands) // 200)):
        for c in _placements(p, ctx, cands[i]):
            assert megatron_accepts(c.plan(), 64), (c.plan().short(), c.placement)
            checked += 1
    assert checked > 50
    sol = solve(p, top_k=3)
    for plan in [sol.plan, *(a.plan for a in sol.alternatives)]:
        assert megatron_accepts(plan, 64) and not launch_reasons(p, plan), plan.short()


@pytest.mark.parametrize("placement,strict,code", [("tp-cp-ep-pp-dp", False, 0), ("tp-cp-ep-pp-dp", True, 1),
                                                   ("tp-cp-ep-dp-pp", True, 0)])
def test_evaluate_flags_a_refused_rank_order_and_strict_fails(placement, strict, code):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", CLI, "evaluate", str(ROOT / "problems" / "mixtral-8x7b-64xh100.yaml"),
            "--plan", f"tp=2,ep=8,pp=2,placement={placement}", "--json"] + (["--strict"] if strict else [])
    out = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == code, out.stderr
    doc = json.loads(out.stdout)
    refused = placement == "tp-cp-ep-pp-dp"
    assert doc["launchable"] is (not refused)
    assert bool(doc["launch_reasons"]) == refused and doc["step_time_s"] > 0  # priced either way
    if refused:
        assert "not launchable" in out.stderr and "tp-cp-ep-dp-pp" in doc["launch_reasons"][0]

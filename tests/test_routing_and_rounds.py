"""Two framework behaviours as stated facts (issue 29 part 2), both read from NeMo AutoModel's code:
`training.moe_routing: contiguous` (its fake_balanced_gate sends token i to experts (i k + j) mod E,
which a deduplicating dispatcher sends to one or two EP ranks of one node) and `plan.pipeline_rounds`
(gradient accumulation around the pipeline schedule: one schedule.step per accumulation step, each
filling and draining the pipeline). Checked against hand-worked arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.cost import Config, context, pipeline_time
from autoshard.cost.context import config_reasons
from autoshard.cost.moe import contiguous_reach
from autoshard.export import export_plan
from autoshard.topology import all_to_all_s, contiguous_profile
from autoshard.validate import run_to_case

ROOT = Path(__file__).resolve().parents[1]
DSV3 = ROOT / "problems" / "deepseek-v3-2048xh800.yaml"
LLAMA70B = ROOT / "problems" / "llama3-70b-640xh100.yaml"


def test_contiguous_reach_is_the_hand_worked_count():
    # DeepSeek-V3 on EP64: 4 experts a rank; token i gets experts 8i .. 8i+7 (mod 256), which start on a
    # multiple of 8: ranks 2i and 2i+1, both in one node of 8 ranks
    assert contiguous_reach(256, 8, 64, (8,)) == (2.0, (1.0,))
    # Qwen3-30B-A3B on EP8: 16 experts a rank, a block of 8 starting on a multiple of 8: one rank
    assert contiguous_reach(128, 8, 8, ()) == (1.0, ())
    # Kimi K2 on EP32: 12 experts a rank; block starts 8i mod 384 are 0, 8, 4 (mod 12) in turn: 1, 2, 1
    # ranks; a node of 8 ranks holds 96 experts, a multiple of 8, so no block crosses a node
    ranks, (nodes,) = contiguous_reach(384, 8, 32, (8,))
    assert ranks == pytest.approx(4 / 3) and nodes == 1.0
    # E = 10, k = 4, 5 ranks of 2: starts 0, 4, 8, 2, 6 (period 5), each block on two ranks (8, 9, 0, 1
    # wraps onto ranks 4 and 0)
    assert contiguous_reach(10, 4, 5, ()) == (2.0, ())


def _dsv3(routing: str, dispatcher: str = "deepep"):
    p = load_problem(DSV3)
    data = p.model_dump(exclude={"search"})
    data["model"] = {**p.model.model_dump(exclude_none=True), "moe_max_nodes_per_token": None}
    data["training"] = {**data["training"], "moe_routing": routing, "precision": "bf16"}
    return load_problem(data)


def test_contiguous_routing_cuts_the_scale_out_bytes_of_a_deduplicating_dispatcher():
    # EP64 over 8 nodes, top-8. Spread: a token reaches 7 (1 - (7/8)^8) = 4.594 remote nodes (DeepEP sends
    # it once to each). Contiguous: 1 node, remote for 7 of 8 senders: 7/8 = 0.875 copies. The scale-out
    # time per byte (every GPU sends k copies' bytes) falls by 0.875 / 4.594 = 0.1905.
    ctx = context(_dsv3("contiguous"))
    prof = contiguous_profile(ctx.graph, 64)
    assert prof.members[:2] == (8, 64)
    reach, (nodes,) = contiguous_reach(256, 8, 64, (8,))
    shares = (reach * 7 / 64 / 8, nodes * (1 - 8 / 64) / 8)  # what cost.moe.contiguous_shares gives

    def per_byte(sh):
        return all_to_all_s(ctx.levels, prof, 2e9, 8, None, sh) - all_to_all_s(ctx.levels, prof, 1e9, 8, None, sh)

    spread, contiguous = per_byte(None), per_byte(shares)
    assert contiguous / spread == pytest.approx(0.875 / (7 * (1 - (7 / 8) ** 8)), rel=1e-9)
    assert 0.875 / (7 * (1 - (7 / 8) ** 8)) == pytest.approx(0.1905, abs=1e-4)


def test_moe_routing_moves_only_what_a_deduplicating_dispatcher_sends():
    plan = Plan(tp=1, pp=16, ep=64, dp=128, zero_stage=1, micro_batch_size=1, schedule="1f1b", moe_dispatcher="deepep")
    spread = evaluate(_dsv3("spread"), plan)
    contiguous = evaluate(_dsv3("contiguous"), plan)
    assert contiguous.time_breakdown_s["ep_comm"] < 0.35 * spread.time_breakdown_s["ep_comm"]
    assert contiguous.time_breakdown_s["compute"] == pytest.approx(spread.time_breakdown_s["compute"], rel=1e-12)
    # the all-to-all dispatcher sends every copy (one per expert): the pattern does not change its bytes
    a2a = plan.model_copy(update={"moe_dispatcher": "alltoall"})
    assert evaluate(_dsv3("contiguous"), a2a).step_time_s == pytest.approx(evaluate(_dsv3("spread"), a2a).step_time_s,
                                                                           rel=1e-12)


def test_pipeline_rounds_fill_and_drain_the_pipeline_each_round():
    # 1F1B with P = 4 equal stages of t = 1: one schedule of 8 micro-batches takes (8 + 3) t = 11;
    # two rounds of 4 take 2 (4 + 3) t = 14
    cfg = Config(1, 1, 1, 4, 1, 1, False, 1, 1, "1f1b", "tp-cp-ep-dp-pp")
    assert pipeline_time(cfg, 8, [1.0] * 4, [0.0] * 4, []) == pytest.approx(11.0)
    assert 2 * pipeline_time(cfg, 4, [1.0] * 4, [0.0] * 4, []) == pytest.approx(14.0)
    # through evaluate: Llama 3 70B on 640 H100, TP8 PP4 DP20, 48 micro-batches; 4 rounds of 12 add three
    # more fills and drains of (P - 1) stage times each: (sum t - max t) x (rounds - 1) under 1F1B
    p = load_problem(LLAMA70B)
    plan = Plan(tp=8, sequence_parallel=True, pp=4, dp=20, zero_stage=1, micro_batch_size=1, schedule="1f1b")
    one = evaluate(p, plan)
    four = evaluate(p, plan.model_copy(update={"pipeline_rounds": 4}))
    t = [s.forward_s + s.backward_s for s in one.stages]
    assert one.num_microbatches == 48
    assert four.step_time_s - one.step_time_s == pytest.approx(3 * (sum(t) - max(t)), rel=1e-6)
    assert four.time_breakdown_s["compute"] == pytest.approx(one.time_breakdown_s["compute"], rel=1e-12)
    assert "rounds4" in four.plan.short()


def test_pipeline_rounds_must_divide_the_micro_batches():
    p = load_problem(LLAMA70B)
    plan = Plan(tp=8, sequence_parallel=True, pp=4, dp=20, zero_stage=1, micro_batch_size=1, schedule="1f1b",
                pipeline_rounds=5)
    _, reasons = config_reasons(p, plan)
    assert [r.field for r in reasons] == ["pipeline_rounds"]
    assert "pipeline_rounds=5 does not divide the 48 micro-batches" in reasons[0]


def test_runs_rows_state_both_facts():
    rows = json.loads((ROOT / "validation" / "modern_runs_dev.json").read_text())
    row = next(r for r in rows if r["id"] == "automodel_kimik2_h100_bf16_256gpu")
    base = run_to_case(row)
    assert base.problem.training.moe_routing == "spread" and base.plan.pipeline_rounds == 1
    case = run_to_case({**row, "moe_routing": "contiguous", "pipeline_rounds": row["grad_accum"]})
    assert case.problem.training.moe_routing == "contiguous"
    assert case.plan.pipeline_rounds == 2  # the table's GA column: two schedule.step calls of 8 micro-batches


def test_neither_fact_is_written_by_an_exporter_and_each_says_so():
    p = load_problem(LLAMA70B)
    plan = Plan(tp=8, sequence_parallel=True, pp=4, dp=20, zero_stage=1, micro_batch_size=1, schedule="1f1b")
    for fmt in ("megatron", "torchtitan"):
        assert not any("pipeline_rounds" in w for w in export_plan(p, plan, fmt).warnings)
        rounds = export_plan(p, plan.model_copy(update={"pipeline_rounds": 4}), fmt)
        assert any("pipeline_rounds 4 is not exported" in w for w in rounds.warnings), rounds.warnings
    moe = Plan(tp=1, pp=16, ep=64, dp=128, zero_stage=1, micro_batch_size=1, schedule="1f1b")
    assert not any("moe_routing" in w for w in export_plan(_dsv3("spread"), moe, "megatron").warnings)
    assert any("moe_routing contiguous" in w for w in export_plan(_dsv3("contiguous"), moe, "megatron").warnings)

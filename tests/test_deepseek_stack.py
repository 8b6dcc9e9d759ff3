"""DeepSeek's own stack as a framework profile (issue 34): the published DeepSeek-V3 plan on 2,048 H800
(PP16 DualPipe, EP64 over 8 nodes, ZeRO-1, no TP, FP8 block-wise, RMSNorm + MLA up-projection recompute,
node-limited routing to 4 nodes), priced against the step time its report implies. Derivation:
docs/seeds.md, "DeepSeek-V3 as it ran"."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.frameworks import get_framework

ROOT = Path(__file__).resolve().parents[1]
# DeepSeek-V3 report: 2.664M H800 GPU-hours of pre-training for 14.8T tokens at 15,360 x 4,096 tokens.
IMPLIED_STEP_S = 2.664e6 * 3600 / 2048 / (14.8e12 / (15360 * 4096))
PUBLISHED = Plan(tp=1, ep=64, pp=16, vpp=2, zero_stage=1, schedule="dualpipev", micro_batch_size=1,
                 recompute="layernorm+mla_up_proj", moe_dispatcher="deepep")


def _problem(framework="deepseek", precision="fp8-blockwise", limited=True):
    doc = load_problem(ROOT / "problems" / "deepseek-v3-2048xh800.yaml").model_dump(mode="json", exclude_none=True)
    doc.pop("search")
    model = {**doc["model"], **({"n_group": 8, "topk_group": 4} if limited else {})}
    return load_problem({**doc, "model": model, "framework": framework,
                         "training": {**doc["training"], "precision": precision}})


def test_implied_step_time():
    # 14.8e12 / 62,914,560 = 235,240 steps; 2.664e6 GPU-h / 235,240 = 11.32 GPU-h per step on 2,048 GPUs
    assert IMPLIED_STEP_S == pytest.approx(19.9, abs=0.05)


def test_profile_runs_dualpipe_with_zero1():
    fw = get_framework("deepseek")
    assert "dualpipev" in fw.schedules and 1 in fw.zero_stages and fw.moe_dispatchers == ("deepep",)
    assert fw.master_bytes + fw.adam_state_bytes == 8  # fp32 master + bf16 AdamW moments (report §3.3.3)
    assert not evaluate(_problem("megatron", "fp8"), PUBLISHED).fits  # Megatron has no DualPipe


def test_published_plan_fits_and_is_priced():
    est = evaluate(_problem(), PUBLISHED)
    assert est.fits and est.peak_memory_gib < est.memory_capacity_gib  # 66.9 of 77.7 GiB
    # DualPipeV hides most of the all-to-all (12.3 s exposed on Megatron's 1F1B): what is left is the
    # part of the pairs that outlasts the computation beside it.
    bd = est.time_breakdown_s
    assert bd["ep_comm"] < 2.5 and est.step_time_s == pytest.approx(16.25, abs=0.1)
    # Priced 18% below what the report implies: the report's GPU-hours include what is not priced
    # (the MTP module, host and framework overheads, the batch-size ramp, evaluation, restarts);
    # without node-limited routing the plan prices 18.3 s, within 10%.
    assert -0.20 < est.step_time_s / IMPLIED_STEP_S - 1 < -0.15
    unlimited = evaluate(_problem(limited=False), PUBLISHED)
    assert abs(unlimited.step_time_s / IMPLIED_STEP_S - 1) < 0.10
    # Node-limited routing (4 of 8 nodes) cuts the inter-node dispatch: per token 3.15 remote node copies
    # instead of 4.59 ((7/8) x 4 x (1 - (3/4)^8) against 7 x (1 - (7/8)^8)).
    assert (7 / 8 * 4 * (1 - 0.75**8)) / (7 * (1 - (7 / 8) ** 8)) == pytest.approx(0.686, abs=1e-3)
    assert est.time_breakdown_s["ep_comm"] < unlimited.time_breakdown_s["ep_comm"]


def test_node_limited_routing_prices_fewer_inter_node_bytes():
    from autoshard.topology import all_to_all_s, cluster_graph, contiguous_profile
    from autoshard.catalog import get_gpu
    from autoshard.spec import ClusterSpec
    from autoshard.topology import resolve_levels

    cl = ClusterSpec(gpu="h800", num_gpus=64, topology="h800-cluster")
    lv = tuple(x.__class__(**{**x.__dict__, "latency_s": 0.0}) for x in resolve_levels(cl, get_gpu("h800")))
    prof = contiguous_profile(cluster_graph(lv, 64), 64)
    free = all_to_all_s(lv, prof, 8e9, 8)
    limited = all_to_all_s(lv, prof, 8e9, 8, (8, 4))
    assert limited / free == pytest.approx((7 / 8 * 4 * (1 - 0.75**8)) / (7 * (1 - (7 / 8) ** 8)), rel=1e-9)
    assert all_to_all_s(lv, prof, 8e9, 8, (8, 8)) == free  # every group reachable: no limit

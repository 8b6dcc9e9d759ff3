"""DeepSeek's own training stack (framework `deepseek`, docs/deepseek-v3.md; issue 34 item 1): DualPipe,
ZeRO-1, node-limited routing (`model.moe_max_nodes_per_token`, the one priced form), FP8 dispatch, the 20
communication SMs, multi-token prediction, eager host launches, and the published DeepSeek-V3 plan
against the report's GPU-hours and DeepSeek's own profile of a DualPipe chunk pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.cli import main
from autoshard.cost import Config, context, layer_table, pipeline_time, with_modes
from autoshard.cost.context import config_reasons
from autoshard.cost.moe import priced_config
from autoshard.frameworks import get_framework
from autoshard.hf import model_from_hf_config
from autoshard.loader import load_plan
from autoshard.topology import all_to_all_s, contiguous_profile

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "deepseek-v3-2048xh800-deepseek.yaml"

# DeepSeek-V3 Technical Report (arXiv 2412.19437) sec. 1 / Table 1: 2,664K H800 GPU hours of
# pre-training for 14.8T tokens; sec. 4.2: batch 15,360 sequences of 4,096 tokens; 2,048 H800 (sec. 3.1).
PRETRAIN_GPU_HOURS = 2.664e6
PRETRAIN_TOKENS = 14.8e12
STEP_TOKENS = 15360 * 4096
GPUS = 2048


def implied_step_s() -> float:
    """The step time the report's GPU-hours imply: tokens per GPU-second, then one batch on 2,048 GPUs."""
    tokens_per_gpu_s = PRETRAIN_TOKENS / (PRETRAIN_GPU_HOURS * 3600)  # 1,543.3
    return STEP_TOKENS / tokens_per_gpu_s / GPUS


def test_implied_step_time_is_the_hand_worked_figure():
    # 14.8e12 / 9.5904e9 GPU-s = 1,543.2 tokens per GPU-second; 62,914,560 tokens / 1,543.2 / 2,048 = 19.91 s
    assert implied_step_s() == pytest.approx(19.907, abs=0.005)
    # the same by steps: 14.8e12 / 62,914,560 = 235,240 steps; 2.664e6 GPU-h / 235,240 = 11.32 GPU-h a step
    assert PRETRAIN_GPU_HOURS * 3600 / GPUS / (PRETRAIN_TOKENS / STEP_TOKENS) == pytest.approx(implied_step_s())


def test_profile_holds_what_the_report_states():
    fw = get_framework("deepseek")
    assert fw.zero_stages == (1,) and fw.moe_dispatchers == ("deepep",)  # sec. 3.2: ZeRO-1; sec. 3.2.2
    assert fw.master_bytes + fw.adam_state_bytes == 8  # sec. 3.3.3: fp32 master + AdamW moments in BF16
    assert fw.ep_comm_sms == 20  # sec. 3.2.2 / 3.5.1: 20 of the H800's 132 SMs run the communication


def test_dualpipe_bubble_is_the_readme_formula():
    # DualPipe README: bubble (PP/2 - 1)(F&B + B - 3W) on PP ranks, each holding two stages (one per
    # direction), each micro-batch passing one of them. Per rank (both stages): F + B = t = 6, B = b = 4,
    # W = w = 2, so per stage F&B = 3, B = 2, W = 1; 8 micro-batches, 4 ranks:
    # 8 x 6 / 2 + (4/2 - 1)(3 + 2 - 3) = 24 + 2.
    cfg = Config(1, 1, 1, 4, 1, 1, False, 1, 1, "dualpipe", "tp-cp-ep-dp-pp")
    assert pipeline_time(cfg, 8, [6.0] * 4, [2.0] * 4, [], [4.0] * 4) == pytest.approx(26.0)


def test_node_limited_routing_bounds_the_remote_nodes_a_token_reaches():
    # EP64 over 8 H800 nodes, top-8: a token's experts on 8 nodes reach 7 (1 - (7/8)^8) = 4.594 remote
    # nodes on average; limited to M = 4 nodes (report sec. 2.1.2) they reach (7/8) 4 (1 - (3/4)^8) = 3.150.
    p = load_problem(PROBLEM)
    ctx = context(p)
    prof = contiguous_profile(ctx.graph, 64)

    def per_byte(limit):
        return all_to_all_s(ctx.levels, prof, 2e9, 8, limit) - all_to_all_s(ctx.levels, prof, 1e9, 8, limit)

    free, limited = per_byte(None), per_byte(4)
    assert (7 / 8 * 4 * (1 - 0.75 ** 8)) / (7 * (1 - (7 / 8) ** 8)) == pytest.approx(0.686, abs=1e-3)
    assert limited / free == pytest.approx((7 / 8 * 4 * (1 - 0.75 ** 8)) / (7 * (1 - (7 / 8) ** 8)), rel=1e-9)
    assert per_byte(8) == pytest.approx(free, rel=1e-12)  # M >= the nodes spanned: no limit
    # through the whole plan, under 1F1B (nothing hides the all-to-all): the preset's M = 4 prices the
    # exposed all-to-all at the remote-node ratio (the fixed latencies aside), against routing anywhere
    plan = load_plan(str(PROBLEM)).model_copy(update={"schedule": "1f1b", "stage_layers": None})
    free_p = load_problem({**p.model_dump(exclude={"search"}), "model": {
        **p.model.model_dump(exclude_none=True), "moe_max_nodes_per_token": None}})
    ratio = evaluate(p, plan).time_breakdown_s["ep_comm"] / evaluate(free_p, plan).time_breakdown_s["ep_comm"]
    assert ratio == pytest.approx(0.686, rel=0.01)


def test_group_limited_routing_in_a_config_json_is_noted_not_priced():
    # DeepSeek-V3's config.json: n_group 8, topk_group 4. Megatron-LM's --moe-router-num-groups help: the
    # groups are the EP ranks for device-limited routing (DeepSeek-V2) or the EP group's nodes for
    # node-limited routing (DeepSeek-V3); the config does not say which, so no node bound is read from it.
    m = model_from_hf_config(ROOT / "tests" / "data" / "hf" / "DeepSeek-V3.json")
    assert m.moe_max_nodes_per_token is None
    assert "group-limited routing (n_group 8, topk_group 4) not priced" in m.source


def _published():
    return load_problem(PROBLEM), load_plan(str(PROBLEM))  # the problem file's `plan:`


def test_published_plan_fits_with_the_reserve_and_holds_two_model_copies():
    p, plan = _published()
    est = evaluate(p, plan)
    assert est.fits, est.reasons
    # 80 GB H800: 79.65 GiB usable less the 2 GiB reserve
    assert est.memory_capacity_gib == pytest.approx(79.65 - 2.0)
    assert est.peak_memory_gib <= est.memory_capacity_gib
    # DualPipe: PP + 1 stages' activations (8.5 in units of a rank's two stages) and 2x parameters: rank 1
    # holds stages 1 and 14 (4 MoE layers each), twice what 1F1B's rank 1 holds.
    one = evaluate(p, plan.model_copy(update={"schedule": "1f1b"}))
    assert est.stages[1].inflight_microbatches == pytest.approx((16 + 1) / 2)
    assert est.stages[1].memory_gib["weights"] == pytest.approx(2 * one.stages[1].memory_gib["weights"], rel=1e-9)
    # ranks 0 and 15 both hold the embedding (stage 0) and the head (stage 15, with the MTP module)
    assert est.stages[0].has_embedding and est.stages[0].has_lm_head
    assert est.stages[-1].has_embedding and est.stages[-1].has_lm_head


def test_a_dualpipe_chunk_pair_prices_as_deepseeks_own_profile_measured_it():
    """github.com/deepseek-ai/profile-data train.json: one DualPipe forward chunk and one backward chunk
    of 4 MoE layers each, EP64, TP1, 4K tokens, balanced routing, without PP communication, on H800: its
    GPU kernels span 129.0 ms (first kernel start to last kernel end)."""
    p, plan = _published()
    ctx = with_modes(context(p), plan.recompute)
    dp, _ = config_reasons(p, plan)
    cfg = priced_config(ctx, Config.of(plan, dp), {plan.recompute})
    moe = layer_table(ctx, cfg).layers[("moe", plan.recompute)]
    assert 4 * moe.total_s == pytest.approx(0.1290, rel=0.05)


def test_eager_host_launches_hide_under_the_gpu_as_deepseek_s_trace_shows():
    """DeepSeek's stack launches eagerly (profile-data train.json: 963 kernels by 923 cudaLaunchKernel(ExC)
    and 40 cuLaunchKernel calls, no CUDA graph), yet the GPU is busy 128.5 ms of the pair's 129.0 ms
    span: the host runs ahead. The eager launch term prices the host too, and it hides likewise."""
    assert get_framework("deepseek").eager_launches
    p, plan = _published()
    est = evaluate(p, plan)
    assert est.time_breakdown_s["host"] == 0.0


def test_published_plan_prices_below_the_rate_the_report_implies():
    """The priced step is the steady state with balanced routing; the report's GPU-hours also cover what
    no step pricing sees (routing imbalance, the batch-size ramp, checkpoints, restarts). It must not
    exceed the implied 19.9 s, and lands 17% below it (docs/deepseek-v3.md: the 10% target is not met)."""
    p, plan = _published()
    est = evaluate(p, plan)
    ratio = est.step_time_s / implied_step_s()
    assert 0.80 <= ratio < 1.0, ratio


def test_fp8_dispatch_and_comm_sms_are_the_profile_s_and_not_megatron_s():
    p, plan = _published()
    one = plan.model_copy(update={"schedule": "1f1b", "stage_layers": None})
    ds = evaluate(p, one)
    mg = evaluate(load_problem({**p.model_dump(exclude={"framework", "search"}), "framework": "megatron"}),
                  one.model_copy(update={"moe_dispatcher": "deepep", "recompute": "layernorm+mla_up_proj"}))
    # Report sec. 3.3.3: dispatch in FP8 (1 B + a 4-byte scale per 128), combine in BF16: (1.03125 + 2) / 4
    # of the BF16 all-to-all bytes (latency aside), no overlap under 1F1B on either profile.
    assert ds.time_breakdown_s["ep_comm"] / mg.time_breakdown_s["ep_comm"] == pytest.approx((1.03125 + 2) / 4, rel=0.02)
    # DualPipe hides the all-to-all under the paired chunk; the 20 SMs it holds slow the computation by 20/112
    dual = evaluate(p, plan)
    assert dual.time_breakdown_s["ep_comm"] < 0.5 * ds.time_breakdown_s["ep_comm"]


def test_dualpipe_rules():
    p, plan = _published()
    pp8 = evaluate(p, plan.model_copy(update={"pp": 8, "stage_layers": None, "ep": 32}))
    assert not [r for r in pp8.reasons if "dualpipe" in r], pp8.reasons  # an even pp: valid
    odd = evaluate(load_problem({**p.model_dump(exclude={"search"}),
                                 "cluster": {"gpu": "h800", "num_gpus": 1920, "topology": "h800-cluster"}}),
                   Plan(tp=1, ep=64, pp=15, zero_stage=1, schedule="dualpipe"))
    assert any("even pp" in r for r in odd.reasons)
    # half the micro-batches enter from each end: 2,560 sequences over DP128 are 20 < 2 x 16
    few = load_problem({**p.model_dump(exclude={"search"}), "training": {**p.training.model_dump(), "global_batch_size": 2560}})
    assert any("dualpipe: 20 micro-batches" in r for r in evaluate(few, plan).reasons)
    mg = load_problem({**p.model_dump(exclude={"framework", "search"}), "framework": "megatron"})
    assert any("'dualpipe'" in r for r in evaluate(mg, plan).reasons)


def test_a_search_naming_only_two_stage_schedules_is_one_line_bad_input(tmp_path, capsys):
    doc = PROBLEM.read_text(encoding="utf-8").replace("zero_stage: [1]}", "zero_stage: [1], schedule: [dualpipe]}")
    f = tmp_path / "p.yaml"
    f.write_text(doc, encoding="utf-8")
    assert main(["solve", str(f)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "search.schedule" in err and "the solver does not plan" in err
    # beside a schedule the solver plans, the two-stage one is left out (no internal error)
    f.write_text(doc.replace("[dualpipe]", "[dualpipe, 1f1b]"), encoding="utf-8")
    assert main(["solve", str(f), "--top", "0"]) == 0
    assert " 1f1b " in capsys.readouterr().out

"""What production frameworks do, priced: MoE parallel folding, overlapped TP and expert
communication, the CP ring, pipeline layouts and framework profiles (issue 11)."""

import math

import numpy as np
import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.cost import (ATTN_BWD_FACTOR, BF16, Config, Shapes, attention_backward_s, context, core_attention_s,
                            cp_comm_s, layer_table, tp_comm_s)
from autoshard.cost.constants import EAGER_LAUNCH_HOST_S
from autoshard.cost.kernels import _gemm_s, _mem_s
from autoshard.frameworks import get_framework
from autoshard.topology import _expert_groups, all_gather_s, contiguous_profile, reduce_scatter_s


def _moe(name="qwen3-235b-a22b", gpus=256, gpu="h100", seq=4096, gbs=2048, **extra):
    return load_problem({"model": name, "training": {"seq_len": seq, "global_batch_size": gbs,
                                                     "precision": "bf16"},
                         "cluster": {"gpu": gpu, "num_gpus": gpus}, **extra})


def test_published_folded_moe_configurations_evaluate():
    # Qwen3-235B TP2 EP32 on 256 H100 (Megatron-Bridge recipe): EP spans TP ranks (ep > dp / ...).
    e = evaluate(_moe(), Plan(tp=2, pp=8, ep=32, etp=1, zero_stage=1, recompute="full"))
    assert not [r for r in e.reasons if "GiB" not in r], e.reasons
    # DeepSeek-V3 TP2 EP64 PP8 on 512 H100: dp = 32 < ep = 64, folded over TP.
    e = evaluate(_moe("deepseek-v3", gpus=512), Plan(tp=2, pp=8, ep=64, etp=1, zero_stage=1, recompute="full"))
    assert not [r for r in e.reasons if "GiB" not in r], e.reasons
    # A folding the ranks cannot hold is still rejected, naming the rule.
    e = evaluate(_moe(gpus=64, gbs=64), Plan(tp=2, pp=1, ep=128, etp=1))
    assert any("ep*etp" in r for r in e.reasons)


def test_folded_expert_groups_follow_megatron_rank_generator():
    # Megatron's expert RankGenerator (order tp-ep-dp-pp with tp = etp): within a pipeline stage
    # rank = etp_i + etp * ep_i + etp * ep * edp_i, over the attention ranks tp-cp-dp (pp outermost).
    order = ("tp", "cp", "ep", "dp", "pp")
    sizes = {"tp": 2, "cp": 2, "ep": 1, "dp": 4, "pp": 2}
    etp_g, ep_g, edp_g = _expert_groups(order, sizes, etp=1, ep=8)
    assert sorted(map(tuple, ep_g.tolist())) == [tuple(range(s, s + 8)) for s in range(0, 32, 8)]
    assert sorted(map(tuple, edp_g.tolist()))[0] == (0, 8)  # edp = 16 / 8 = 2 per stage
    etp_g, ep_g, edp_g = _expert_groups(order, sizes, etp=2, ep=4)
    assert [0, 2, 4, 6] in ep_g.tolist() and [1, 3, 5, 7] in ep_g.tolist()
    assert [0, 1] in etp_g.tolist() and [16, 17] in etp_g.tolist()
    assert ep_g.shape == (8, 4) and edp_g.shape == (16, 2)


def test_folding_shards_experts_over_etp_times_ep():
    p = _moe(gpus=256)
    a = evaluate(p, Plan(tp=2, pp=8, ep=16, zero_stage=1, recompute="full"))  # etp = tp = 2
    b = evaluate(p, Plan(tp=2, pp=8, ep=16, etp=1, zero_stage=1, recompute="full"))
    # Expert weights per GPU double when experts are no longer TP-sharded (etp 1 vs 2): the extra
    # bf16 bytes are exactly the stage's expert weights / (2 x 16).
    from autoshard.cost import layer_params

    layers = a.stages[1].moe_layers
    experts = layers * layer_params(p.model, "moe")[1]
    extra = (b.stages[1].memory_gib["weights"] - a.stages[1].memory_gib["weights"]) * 2**30
    assert extra == pytest.approx(2 * experts / 32, rel=1e-6)


def test_tp_overlap_exposes_first_ag_chunk_and_last_rs_chunk():
    p = load_problem({"model": "llama3-70b", "training": {"seq_len": 4096, "global_batch_size": 640},
                      "cluster": {"gpu": "h100", "num_gpus": 640}})
    ctx = context(p)
    on = Config(8, 1, 1, 4, 20, 1, True, 1, 1, "1f1b", "tp-cp-ep-dp-pp")
    off = Config(8, 1, 1, 4, 20, 1, True, 1, 1, "1f1b", "tp-cp-ep-dp-pp", tp_overlap=False)
    t_on, t_off = layer_table(ctx, on), layer_table(ctx, off)
    pl = t_on.placement
    act = BF16 * 4096 * 8192
    ag = all_gather_s(ctx.levels, pl.tp, act)
    exposed_alone = ag / 8 + ag / 4  # AG chunk 1/tp, RS chunk 1/4 (reduce-scatter = all-gather here)
    # With a huge GEMM to hide under, only those chunks plus 15% interference of the rest remain.
    assert tp_comm_s(ctx, on, pl, act, 1.0) == pytest.approx(exposed_alone + 0.15 * (2 * ag - exposed_alone))
    assert tp_comm_s(ctx, off, pl, act, 1.0) == pytest.approx(2 * ag)
    f_on = t_on.layers[("dense", "none")].fwd["tp_comm"]
    f_off = t_off.layers[("dense", "none")].fwd["tp_comm"]
    assert f_on < 0.6 * f_off
    # Across NVLink domains userbuffers cannot run: TP16 on 8-GPU nodes is priced unoverlapped.
    wide = Config(16, 1, 1, 4, 10, 1, True, 1, 1, "1f1b", "tp-cp-ep-dp-pp")
    tw = layer_table(ctx, wide)
    assert tp_comm_s(ctx, wide, tw.placement, act, 1.0) == pytest.approx(
        2 * all_gather_s(ctx.levels, tw.placement.tp, act))


def test_cp_ring_moves_cp_minus_one_chunks():
    # Issue 11 item 1: one layer's forward K/V exchange = an all-gather of the whole K/V (each GPU
    # sends cp - 1 chunks), by the collective functions' own figure; hidden under attention at most.
    p = load_problem({"model": "llama3-70b", "training": {"seq_len": 16384, "global_batch_size": 32},
                      "cluster": {"gpu": "h200", "num_gpus": 256}})
    ctx = context(p)
    cfg = Config(8, 4, 1, 1, 8, 1, True, 1, 1, "1f1b", "tp-cp-ep-dp-pp")
    sh = Shapes(ctx, cfg)
    prof = contiguous_profile(ctx.graph, 4)
    chunk = BF16 * sh.tokens * sh.kv_local * (sh.d_qk + sh.d_v)
    ring = all_gather_s(ctx.levels, prof, 4 * chunk)
    fwd, bwd = cp_comm_s(ctx, 4, prof, sh, core_s=0.0)  # nothing to hide under
    assert fwd == pytest.approx(ring) and bwd == pytest.approx(2 * ring)
    fwd, _ = cp_comm_s(ctx, 4, prof, sh, core_s=10 * ring)
    assert fwd == pytest.approx(0.15 * ring)
    # 3 of the 4 chunks cross the NVLink of every GPU (the old price moved about one).
    assert ring >= 3 * chunk / ctx.levels[0].bytes_per_s


def test_attention_backward_runs_at_the_kernels_backward_rate():
    # FlashAttention's backward (2.5x the forward FLOPs) at the framework's measured backward rate:
    # cuDNN (Megatron) 0.84, SDPA FlashAttention-2 (torchtitan) 0.90; materialized scores (no flash)
    # run their backward GEMMs at the forward's rate.
    cfg = Config(8, 1, 1, 1, 1, 1, True, 1, 1, "1f1b", "tp-cp-ep-dp-pp")
    for framework, rate in (("megatron", 0.84), ("torchtitan", 0.90)):
        p = load_problem({"model": "llama3-70b", "framework": framework,
                          "training": {"seq_len": 16384, "global_batch_size": 32},
                          "cluster": {"gpu": "h100", "num_gpus": 64}})
        ctx = context(p)
        core, _, _ = core_attention_s(ctx, Shapes(ctx, cfg))
        assert attention_backward_s(ctx, core) == pytest.approx(ATTN_BWD_FACTOR * core / rate)
    p = load_problem({"model": "llama3-70b", "training": {"seq_len": 2048, "global_batch_size": 32,
                                                          "flash_attention": False},
                      "cluster": {"gpu": "h100", "num_gpus": 64}})
    ctx = context(p)
    core, _, _ = core_attention_s(ctx, Shapes(ctx, cfg))
    assert attention_backward_s(ctx, core) == pytest.approx(ATTN_BWD_FACTOR * core)


def test_ep_overlap_hides_all_to_all_where_megatron_allows_it():
    p = _moe("qwen3-235b-a22b", gpus=64, gbs=256)
    base = dict(tp=1, ep=16, zero_stage=1, recompute="selective")
    off = evaluate(p, Plan(pp=1, ep_overlap=False, **base))
    on = evaluate(p, Plan(pp=1, **base))  # profile default: on (pp = 1)
    assert on.time_breakdown_s["ep_comm"] < 0.5 * off.time_breakdown_s["ep_comm"]
    assert on.step_time_s < off.step_time_s
    # PP > 1 without interleaving: Megatron refuses; asking for it is an invalid plan.
    bad = evaluate(p, Plan(pp=4, ep_overlap=True, **base))
    assert any("ep_overlap needs" in r for r in bad.reasons)
    # Megatron's TransformerConfig refuses it beside full recompute or the moe recompute module: left
    # open, the plan runs without it (priced so); asked for, the plan is invalid.
    full = dict(base, recompute="full")
    assert evaluate(p, Plan(pp=1, **full)).step_time_s == evaluate(p, Plan(pp=1, ep_overlap=False, **full)).step_time_s
    for rc in ("full", "moe", "moe+layernorm", ["full"] * 10 + ["none"] * 84):
        assert any("refuses ep_overlap beside recompute" in r
                   for r in evaluate(p, Plan(pp=1, ep_overlap=True, **dict(base, recompute=rc))).reasons), rc
    moe_act = evaluate(p, Plan(pp=1, ep_overlap=True, **dict(base, recompute="moe_act"))).reasons
    assert not [r for r in moe_act if "ep_overlap" in r], moe_act  # (only its memory: 235B on one stage)


def test_ep_overlap_exposes_host_launches_where_the_gpu_is_fast():
    # Megatron-Bridge PR #1760 ("Disable moe_a2a_overlap due to CPU overhead"), Qwen3-235B-A22B on 64
    # B200, GBS 1024, TP1 PP8 EP8 micro-batch 1: BF16 with VP4 ran 17.2 s with the overlap and 16.0 s
    # without; MXFP8 ran 20.1 s with the overlap and VP4, 16.9 s with neither. Megatron-Bridge keeps the
    # overlap on for the communication-bound H100 recipe (TP2 EP32 across nodes).
    from autoshard import cost

    base = dict(tp=1, pp=8, ep=8, zero_stage=1, micro_batch_size=1)
    vp4 = dict(vpp=4, schedule="interleaved")
    bf16 = _moe(gpus=64, gbs=1024, gpu="b200")
    mx = load_problem({**bf16.model_dump(exclude_unset=True),
                       "training": {**bf16.training.model_dump(exclude_unset=True), "precision": "mxfp8"}})
    on, off = (evaluate(bf16, Plan(ep_overlap=v, **base, **vp4)) for v in (True, False))
    assert on.step_time_s > off.step_time_s  # measured 17.2 / 16.0 = 1.075
    assert on.step_time_s / off.step_time_s == pytest.approx(17.2 / 16.0, abs=0.05)
    assert on.time_breakdown_s["ep_comm"] < off.time_breakdown_s["ep_comm"]  # it still hides the all-to-all
    mx_on, mx_off = evaluate(mx, Plan(ep_overlap=True, **base, **vp4)), evaluate(mx, Plan(ep_overlap=False, **base))
    assert mx_on.step_time_s / mx_off.step_time_s > 17.2 / 16.0  # measured 20.1 / 16.9 = 1.19
    # Left open (None), the plan runs the overlap only where it pays, and exports say so.
    auto = evaluate(bf16, Plan(**base, **vp4))
    assert auto.step_time_s == pytest.approx(off.step_time_s, rel=1e-9)
    assert not cost.ep_overlap_priced(bf16, Plan(**base, **vp4))
    h100 = _moe(gpus=256, gbs=2048)
    folded = dict(tp=2, pp=8, ep=32, etp=1, vpp=4, schedule="interleaved", zero_stage=1, micro_batch_size=1)
    h_on, h_off = (evaluate(h100, Plan(ep_overlap=v, **folded)) for v in (True, False))
    assert h_on.step_time_s < h_off.step_time_s
    assert cost.ep_overlap_priced(h100, Plan(**folded))
    assert evaluate(h100, Plan(**folded)).step_time_s == pytest.approx(h_on.step_time_s, rel=1e-9)
    # Token dropping has no count sync to stall on; CUDA graphs launch nothing from the host.
    drop = load_problem({**bf16.model_dump(exclude_unset=True), "training": {
        **bf16.training.model_dump(exclude_unset=True), "moe_capacity_factor": 1.0}})
    d_on, d_off = (evaluate(drop, Plan(ep_overlap=v, **base, **vp4)) for v in (True, False))
    assert d_on.step_time_s < d_off.step_time_s
    g_on, g_off = (evaluate(bf16, Plan(ep_overlap=v, cuda_graphs=True, **base, **vp4)) for v in (True, False))
    assert g_on.step_time_s < g_off.step_time_s


def test_estimates_say_what_they_assumed_of_an_open_ep_overlap():
    # Text and Markdown reports say whether the priced plan runs the EP overlap where the plan leaves it
    # open, and say so when Megatron would refuse it beside full recompute (the export leaves it off).
    from autoshard.render import estimate_text

    bf16 = _moe(gpus=64, gbs=1024, gpu="b200")
    vp4 = dict(tp=1, pp=8, ep=8, zero_stage=1, micro_batch_size=1, vpp=4, schedule="interleaved")
    assert "EP overlap off: running it would expose more host launch time" in estimate_text(bf16, evaluate(bf16, Plan(**vp4)))
    h100 = _moe(gpus=256, gbs=2048)
    folded = dict(tp=2, pp=8, ep=32, etp=1, vpp=4, schedule="interleaved", zero_stage=1, micro_batch_size=1)
    assert "EP overlap on:" in estimate_text(h100, evaluate(h100, Plan(**folded)))
    full = Plan(recompute="full", **folded)
    assert "EP overlap off: megatron refuses it beside this recompute (full/moe)" in estimate_text(h100, evaluate(h100, full))
    # A plan that turns it off says so (the solver plans such twins); one that cannot run it (1F1B
    # with PP > 1) gets no line.
    assert "EP overlap off: the plan's choice" in estimate_text(h100, evaluate(h100, Plan(ep_overlap=False, **folded)))
    assert "EP overlap" not in estimate_text(h100, evaluate(h100, Plan(tp=2, pp=8, ep=32, etp=1, zero_stage=1)))


def test_solver_plans_the_ep_overlap_as_megatron_runs_it():
    # Qwen3-30B on 8 B200 at micro-batch 8: memory asks for full recompute on some layers, which
    # Megatron refuses beside the EP overlap. The solver plans the overlap as a choice: its plan is
    # what evaluate prices, never the overlap beside full recompute, and no Megatron block layout
    # (K full layers, or one mode everywhere), with the overlap open or off, is faster.
    from autoshard import solve
    from autoshard.cost import context, ep_overlap_blocked, ep_overlap_priced

    p = load_problem({"model": "qwen3-30b-a3b", "training": {"seq_len": 4096, "global_batch_size": 512,
                                                             "precision": "mxfp8"},
                      "cluster": {"gpu": "b200", "num_gpus": 8},
                      "search": {"tp": [1], "cp": [1], "pp": [1], "ep": [8], "micro_batch_size": [8],
                                 "zero_stage": [3], "moe_dispatcher": ["alltoall"],
                                 "headroom_gib": 0}})  # the edge, as evaluate's fit predicate (no default margin)
    sol = solve(p, top_k=0)
    assert sol.solver.status == "OPTIMAL"
    assert sol.estimate == evaluate(p, sol.plan)
    modes = set(sol.plan.recompute_per_layer(48))
    assert not (ep_overlap_priced(p, sol.plan) and ep_overlap_blocked(context(p), modes))
    best = math.inf
    layouts = [[m] * 48 for m in ("none", "selective", "full", "moe_act", "moe_act+layernorm")]
    layouts += [["full"] * k + ["none"] * (48 - k) for k in range(1, 48)]
    for rc in layouts:
        for overlap in (None, False):
            e = evaluate(p, Plan(tp=1, pp=1, ep=8, zero_stage=3, micro_batch_size=8, recompute=rc,
                                 ep_overlap=overlap))
            if e.fits:
                best = min(best, e.step_time_s)
    assert best < math.inf
    assert sol.estimate.step_time_s <= best * (1 + 1e-3)


def test_ep_overlap_pairs_each_all_to_all_with_one_piece_of_the_other_pass():
    # Megatron's combined 1F1B layer (model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):
    #   comm: combine_bwd      | dispatch_fwd -> dispatch_bwd            | combine_fwd
    #   comp: attention fwd    | mlp dgrad -> mlp wgrad -> mlp fwd       | attention bwd
    # so the forward's dispatch hides under the MLP's input gradients, its combine under the attention
    # backward; the backward's dispatch under the MLP's weight gradients and forward, its combine under
    # the attention forward. A window shorter than its all-to-all leaves the rest exposed.
    from autoshard import cost

    p = _moe("deepseek-v3", gpus=256, gbs=512, gpu="h800")
    ctx = cost.context(p)
    cfg = cost.Config.of(Plan(tp=1, ep=64, pp=8, vpp=2, schedule="interleaved", zero_stage=1), 4)
    assert cost.ep_overlap_on(ctx, cfg)
    table = cost.layer_table(ctx, cfg)
    sh = cost.Shapes(ctx, cfg)
    afwd, abwd, _, _, _ = cost.layers._attention_cost(ctx, cfg, table.placement, sh)
    mfwd, mbwd, mwgrad, _ = cost.layers._mlp_cost(ctx, cfg, table.placement, sh, "moe")
    half = mfwd["ep_comm"] / 2  # dispatch = combine
    want_f = cost.overlapped(half, mbwd["compute"] - mwgrad) + cost.overlapped(half, abwd["compute"])
    want_b = cost.overlapped(half, mwgrad + mfwd["compute"]) + cost.overlapped(half, afwd["compute"])
    got = table.layers[("moe", "none")]
    assert got.fwd["ep_comm"] == pytest.approx(want_f) and got.bwd["ep_comm"] == pytest.approx(want_b)
    # Over 64 ranks of 8-GPU H800 nodes the backward's combine outlasts the attention forward it is
    # paired with: part of it is exposed, beyond the interference of fully hidden traffic.
    assert half > afwd["compute"]
    assert got.bwd["ep_comm"] > half - afwd["compute"] > 0
    assert got.bwd["ep_comm"] > 2 * cost.COMM_INTERFERENCE * half  # what hiding it all would cost


def test_framework_profiles_limit_the_plan():
    tt = load_problem({"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64},
                       "cluster": {"gpu": "h100", "num_gpus": 16}, "framework": "torchtitan"})
    assert any("ZeRO stages" in r for r in evaluate(tt, Plan(zero_stage=1)).reasons)
    assert evaluate(tt, Plan(zero_stage=3)).fits
    ds = load_problem({"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64},
                       "cluster": {"gpu": "h100", "num_gpus": 16}, "framework": "deepspeed"})
    assert any("pipeline schedule" in r for r in evaluate(ds, Plan(pp=2, schedule="zero_bubble")).reasons)


def test_embedding_and_loss_take_pipeline_slots():
    # NVIDIA's Llama 3.1 405B recipe on GB200: PP8 x VP16 = 128 virtual stages for 126 layers, the
    # embedding and the loss each alone in a slot (--pipeline-model-parallel-layout).
    p = load_problem({"model": "llama3-405b", "training": {"seq_len": 8192, "global_batch_size": 256},
                      "cluster": {"gpu": "gb200", "num_gpus": 256}})
    e = evaluate(p, Plan(tp=4, pp=8, vpp=16, schedule="interleaved", recompute="full"))
    assert not [r for r in e.reasons if "GiB" not in r], e.reasons
    split = e.plan.stage_layers
    assert len(split) == 128 and split[0] == 0 and split[-1] == 0 and sum(split) == 126
    assert e.stages[0].has_embedding and e.stages[-1].has_lm_head
    too_many = evaluate(p, Plan(tp=4, pp=8, vpp=17, schedule="interleaved"))
    assert any("embedding and a loss slot" in r for r in too_many.reasons)


def test_sequence_parallel_needs_divisible_tokens():
    p = load_problem({"model": "llama3-8b", "training": {"seq_len": 4097, "global_batch_size": 8},
                      "cluster": {"gpu": "h100", "num_gpus": 8}})
    assert any("sequence parallelism" in r for r in evaluate(p, Plan(tp=8, sequence_parallel=True)).reasons)
    assert not [r for r in evaluate(p, Plan(tp=8, sequence_parallel=False)).reasons if "sequence" in r]


def test_dualpipev_bubble_memory_and_overlap():
    from autoshard.cost import pipeline_time

    # DualPipe README: bubble (PP/2 - 1)(F&B + B - 3W) with PP stages on PP/2 ranks (DualPipeV);
    # per rank F + B = t = 3, B = b = 2, W = w = 1 over two chunks: F&B = 1.5, B = 1, W = 0.5 each.
    cfg = Config(1, 1, 1, 4, 1, 2, False, 1, 1, "dualpipev", "tp-cp-ep-dp-pp")
    assert pipeline_time(cfg, 8, [3.0] * 4, [1.0] * 4, [1.5] * 8, [2.0] * 4) == pytest.approx(
        8 * 3.0 + (4 - 1) * (1.5 + 1.0 - 3 * 0.5))
    p = load_problem({"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 4096,
                                                          "precision": "fp8"},
                      "cluster": {"gpu": "h800", "num_gpus": 2048, "topology": "h800-cluster"},
                      "framework": "torchtitan"})
    zb = evaluate(p, Plan(tp=1, ep=64, pp=16, zero_stage=3, schedule="zero_bubble", recompute="full"))
    dv = evaluate(p, Plan(tp=1, ep=64, pp=16, vpp=2, zero_stage=3, schedule="dualpipev", recompute="full"))
    assert not [r for r in dv.reasons if "GiB" not in r], dv.reasons
    # Rank 0 holds the first and the last virtual stage: embedding and loss.
    assert dv.stages[0].has_embedding and dv.stages[0].has_lm_head and not dv.stages[-1].has_lm_head
    # Forward and backward chunks of two micro-batches run together: the all-to-all hides.
    assert dv.time_breakdown_s["ep_comm"] < 0.6 * zb.time_breakdown_s["ep_comm"]
    assert dv.step_time_s < zb.step_time_s
    # Megatron has no DualPipe.
    mg = load_problem({**p.model_dump(exclude={"framework", "search"}), "framework": "megatron"})
    assert any("no 'dualpipev'" in r for r in evaluate(mg, Plan(tp=1, ep=64, pp=16, vpp=2, schedule="dualpipev")).reasons)


def test_recompute_modules_trade_memory_for_time():
    # Megatron --recompute-modules on a DeepSeek-style MLA + MoE layer: each module keeps less and
    # re-runs more; `core_attn` alone is `selective`; unknown module names are bad input.
    p = load_problem({"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 256},
                      "cluster": {"gpu": "h100", "num_gpus": 256}})
    base = dict(tp=1, pp=8, ep=32, zero_stage=1)
    none = evaluate(p, Plan(**base, recompute="none"))
    for rc in ("moe_act", "layernorm", "mla_up_proj", "moe_act+layernorm", "moe"):
        e = evaluate(p, Plan(**base, recompute=rc))
        assert e.stages[1].memory_gib["activations"] < none.stages[1].memory_gib["activations"], rc
        assert e.time_breakdown_s["recompute"] > 0, rc
    both = evaluate(p, Plan(**base, recompute="layernorm+moe_act"))
    act = evaluate(p, Plan(**base, recompute="moe_act"))
    assert both.stages[1].memory_gib["activations"] < act.stages[1].memory_gib["activations"]
    assert Plan(recompute="core_attn").recompute == "selective"
    assert Plan(recompute="layernorm+moe_act").recompute == "moe_act+layernorm"
    with pytest.raises(Exception, match="unknown recompute"):
        Plan(recompute="attention")
    # `mla_up_proj` does nothing on a model without MLA.
    llama = load_problem({"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64},
                          "cluster": {"gpu": "h100", "num_gpus": 8}})
    a, b = evaluate(llama, Plan(recompute="none")), evaluate(llama, Plan(recompute="mla_up_proj"))
    assert a.step_time_s == pytest.approx(b.step_time_s) and a.peak_memory_gib == pytest.approx(b.peak_memory_gib)


def test_data_parallel_overlap_knobs():
    from autoshard.cost import total_params
    from autoshard.topology import reduce_scatter_s
    from autoshard.export import export_plan

    p = load_problem({"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64},
                      "cluster": {"gpu": "h100", "num_gpus": 64}})
    on = evaluate(p, Plan(zero_stage=1))
    off = evaluate(p, Plan(zero_stage=1, overlap_grad_reduce=False, overlap_param_gather=False))
    ctx = context(p)
    # Exposed whole: the fp32 gradient reduce-scatter and the bf16 parameter all-gather of the
    # rank's parameters over the 64 data-parallel GPUs (Megatron's distributed optimizer).
    prof = layer_table(ctx, Config.of(Plan(zero_stage=1), 64)).placement.dp_cp
    n = total_params(p.model) - p.model.hidden_size  # the final norm is not on a rank's table
    expected = reduce_scatter_s(ctx.levels, prof, 4 * n) + all_gather_s(ctx.levels, prof, 2 * n)
    assert off.time_breakdown_s["dp_comm"] == pytest.approx(expected, rel=0.02)
    assert on.time_breakdown_s["dp_comm"] < 0.5 * off.time_breakdown_s["dp_comm"]
    text = export_plan(p, off.plan, "megatron").text
    assert "--overlap-grad-reduce" not in text and "--overlap-param-gather" not in text
    assert "--overlap-grad-reduce" in export_plan(p, on.plan, "megatron").text


def test_deepspeed_pipeline_engine_reduces_after_the_schedule():
    # DeepSpeed's PipelineEngine turns the per-backward reduction off and reduces every gradient at
    # ReduceGrads after the last micro-batch; its ZeRO-1/2 all-gathers the updated weights at the end of
    # step() (deepspeed/runtime/pipe/engine.py, pipe/schedule.py, zero/stage_1_and_2.py). With pp = 1
    # the overlap_comm hooks reduce under the backward; Megatron overlaps both.
    from autoshard.cost import dp_overlaps, total_params
    from autoshard.topology import reduce_scatter_s

    def problem(framework):
        return load_problem({"model": "llama3-8b", "framework": framework,
                             "training": {"seq_len": 4096, "global_batch_size": 64},
                             "cluster": {"gpu": "h100", "num_gpus": 64}})

    ds, mg = problem("deepspeed"), problem("megatron")
    for plan, want in ((Plan(pp=2, zero_stage=1), (False, False)), (Plan(pp=1, zero_stage=1), (True, False))):
        assert dp_overlaps(context(ds), Config.of(plan, 64 // plan.pp)) == want
        assert dp_overlaps(context(mg), Config.of(plan, 64 // plan.pp)) == (True, True)
    # Exposed whole at pp = 2: the bf16 gradient reduce-scatter and the bf16 weight all-gather of the
    # first stage's parameters over its 32 data-parallel GPUs, whatever the plan asks for.
    plan = Plan(pp=2, zero_stage=1, stage_layers=[16, 16])
    est = evaluate(ds, plan)
    ctx = context(ds)
    prof = layer_table(ctx, Config.of(plan, 32)).placement.dp_cp
    m = ds.model
    n = (total_params(m) - m.hidden_size - m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)) / 2 \
        + m.vocab_size * m.hidden_size  # half the layers and one embedding table per stage
    expected = reduce_scatter_s(ctx.levels, prof, 2 * n) + all_gather_s(ctx.levels, prof, 2 * n)
    assert est.time_breakdown_s["dp_comm"] == pytest.approx(expected, rel=0.03)
    assert evaluate(mg, plan).time_breakdown_s["dp_comm"] < 0.5 * expected
    # ... and the reports say so
    from autoshard.render import estimate_text

    assert "DP tail exposed: deepspeed reduces gradients after the last micro-batch (pipeline engine) and gathers" \
        in estimate_text(ds, est)
    assert "DP tail" not in estimate_text(mg, evaluate(mg, plan))
    assert "DP tail" not in estimate_text(ds, evaluate(ds, plan.model_copy(update={"overlap_grad_reduce": False,
                                                                                   "overlap_param_gather": False})))
    # Only where there is a tail: none under ZeRO-3, none without replicated weights.
    from autoshard.cost import dp_overlaps_refused

    assert dp_overlaps_refused(ctx, Config.of(plan, 32)) == (True, True)
    assert dp_overlaps_refused(ctx, Config.of(plan.model_copy(update={"zero_stage": 3}), 32)) == (False, False)
    assert dp_overlaps_refused(ctx, Config.of(Plan(pp=64, zero_stage=1), 1)) == (False, False)


def test_offloading_prices_the_host_link():
    from autoshard.catalog import get_gpu

    def problem(gpu):
        # (per_layer: Megatron offloads activations only at PP 1 and fewer than all layers, layouts.py;
        # this prices offloading itself, on a stack that takes any list)
        return load_problem({"model": "llama3-70b", "training": {"seq_len": 8192, "global_batch_size": 64},
                             "cluster": {"gpu": gpu, "num_gpus": 16}, "search": {"recompute_layout": "per_layer"}})

    p = problem("h100")
    base = evaluate(p, Plan(tp=8, pp=2, zero_stage=1))
    opt = evaluate(p, Plan(tp=8, pp=2, zero_stage=1, optimizer_offload=True))
    assert opt.stages[0].memory_gib["optimizer_states"] == 0.0
    assert base.stages[0].memory_gib["optimizer_states"] > 40
    # Optimizer step on the host: (4 B fp32 gradient down + 2 B bf16 weight up) per parameter over
    # PCIe Gen5 (63 GB/s) + 28 B per parameter at 77 GB/s of host memory, for the rank's 1/dp share.
    params = base.stages[0].memory_gib["weights"] * 2**30 / 2  # bf16 weights, dp = 1 (no sharding)
    expected = params * (6 / 63e9 + 28 / 77e9)
    assert opt.time_breakdown_s["optimizer"] == pytest.approx(expected, rel=0.02)
    # Activation offloading keeps what full recompute keeps, and pays the host link instead.
    off = evaluate(p, Plan(tp=8, pp=2, zero_stage=1, recompute="offload"))
    full = evaluate(p, Plan(tp=8, pp=2, zero_stage=1, recompute="full"))
    assert off.stages[0].memory_gib["activations"] == pytest.approx(full.stages[0].memory_gib["activations"])
    assert off.time_breakdown_s["offload"] > 0 and off.time_breakdown_s.get("recompute", 0) == 0
    # NVLink-C2C (GH200, 450 GB/s each way) moves the same bytes 7x faster than PCIe Gen5.
    assert get_gpu("gh200").host_link_bytes_per_s / get_gpu("h100").host_link_bytes_per_s == pytest.approx(450 / 63)
    gh = evaluate(problem("gh200"), Plan(tp=8, pp=2, zero_stage=1, recompute="offload", placement=off.plan.placement))
    assert gh.time_breakdown_s["offload"] < off.time_breakdown_s["offload"]


def test_cp_comm_types():
    from autoshard.topology import all_to_all_s

    p = load_problem({"model": "llama3-70b", "training": {"seq_len": 32768, "global_batch_size": 16},
                      "cluster": {"gpu": "h100", "num_gpus": 64}})
    plans = {t: Plan(tp=1, cp=8, pp=8, zero_stage=1, recompute="full", cp_comm_type=t)
             for t in ("p2p", "allgather", "a2a")}
    est = {t: evaluate(p, pl) for t, pl in plans.items()}
    assert all(not [r for r in e.reasons if "GiB" not in r] for e in est.values())
    # The ring hides under 32k-token attention; the all-gather is exposed whole.
    assert est["p2p"].time_breakdown_s["cp_comm"] < est["allgather"].time_breakdown_s["cp_comm"]
    # Ulysses: one all-to-all of q, k, v and one of the output per layer and pass, by the collective's figure.
    ctx = context(p)
    table = layer_table(ctx, Config.of(plans["a2a"], 1))
    sh = Shapes(ctx, table.cfg)
    qkvo = BF16 * sh.tokens * (2 * sh.a_local * sh.d_qk + sh.kv_local * (sh.d_qk + sh.d_v))
    layer = table.layers[("dense", "full")]
    assert layer.fwd["cp_comm"] == pytest.approx(all_to_all_s(ctx.levels, table.placement.cp, qkvo))
    # a2a scatters heads: 8 key/value heads over tp 8 leave one per GPU, which cp 8 cannot split.
    bad = evaluate(p, Plan(tp=8, cp=8, cp_comm_type="a2a"))
    assert any("scatters heads" in r for r in bad.reasons)


def test_lora_and_qlora_fine_tuning():
    from autoshard.cost import lora_fraction
    from autoshard.cost.params import _attention_params, _mlp_params

    m = load_problem({"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 16},
                      "cluster": {"gpu": "rtx-4090", "num_gpus": 1}}).model
    # PEFT's print for Llama-3-8B, LoRA r=16 on every linear layer: "trainable params: 41,943,040".
    linear = _attention_params(m) + _mlp_params(m, m.intermediate_size)
    assert lora_fraction(m, 16) * linear * m.num_hidden_layers == pytest.approx(41_943_040)

    def est(ft, **plan):
        p = load_problem({"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 16,
                                                            "finetune": ft},
                          "cluster": {"gpu": "rtx-4090", "num_gpus": 1}})
        return evaluate(p, Plan(recompute="full", **plan))

    full, lora, qlora = est("full"), est("lora"), est("qlora")
    # Seed 003's small-team question: Llama 3 8B on one 24 GB RTX 4090 fits with LoRA and QLoRA only.
    assert not full.fits and lora.fits and qlora.fits
    # Frozen bf16 base (2 B/param) vs NF4 with double quantization (4.127 bits/param).
    assert lora.memory_breakdown_gib["weights"] / qlora.memory_breakdown_gib["weights"] == pytest.approx(
        (2 + 2 * 0.0052) / (4.127 / 8 + 2 * 0.0052), rel=0.03)
    # No weight gradients for the frozen base: the backward shrinks (QLoRA pays dequantization).
    assert lora.step_time_s < full.step_time_s < 1.5 * lora.step_time_s
    assert qlora.step_time_s > lora.step_time_s


def test_moe_imbalance_and_redundant_experts():
    def est(imb, redundant):
        p = load_problem({"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 1024,
                                                              "moe_load_imbalance": imb,
                                                              "moe_redundant_experts": redundant},
                          "cluster": {"gpu": "h100", "num_gpus": 256}})
        return evaluate(p, Plan(tp=1, pp=8, ep=32, zero_stage=1, recompute="full"))

    balanced, skewed, half, eplb = est(1.0, 0), est(1.3, 0), est(1.3, 16), est(1.3, 32)
    # The busiest EP rank sets the pace: 30% more routed tokens there, 30% more all-to-all bytes.
    assert skewed.time_breakdown_s["ep_comm"] == pytest.approx(1.3 * balanced.time_breakdown_s["ep_comm"], rel=0.01)
    assert balanced.step_time_s < half.step_time_s < skewed.step_time_s
    # One redundant expert per EP rank (EPLB, as DeepSeek-V3 deploys) evens the load out again, and
    # costs the copies' weights: 32 of 256 experts more, so 9 local experts instead of 8, each with its
    # share of the grouped-MLP host time (Megatron profile: moe_expert_host_ms per local expert).
    host_b, host_e = balanced.time_breakdown_s["host"], eplb.time_breakdown_s["host"]
    prof = get_framework("megatron")
    per_layer = prof.moe_layer_host_s + 8 * prof.moe_expert_host_s
    assert host_e == pytest.approx(host_b * (per_layer + prof.moe_expert_host_s) / per_layer, rel=1e-6)
    # The step grows by that host time (plus its share of the pipeline bubble and the copies' optimizer step).
    extra = eplb.step_time_s - balanced.step_time_s
    assert host_e - host_b <= extra <= 1.3 * (host_e - host_b)
    assert eplb.stages[1].memory_gib["weights"] > balanced.stages[1].memory_gib["weights"]


def test_moe_host_time_grows_with_local_experts_and_vanishes_under_cuda_graphs():
    # Megatron profile: a dropless MoE layer costs the dispatcher's host sync plus TE GroupedLinear's
    # per-expert host work for each local expert (E / ep), per micro-batch; full-iteration CUDA
    # graphs replay the step without the host. (EP overlap off: it adds host time of its own,
    # test_ep_overlap_exposes_host_launches_where_the_gpu_is_fast.)
    p = load_problem({"model": "qwen3-30b-a3b", "training": {"seq_len": 4096, "global_batch_size": 512},
                      "cluster": {"gpu": "b200", "num_gpus": 16}})
    prof = get_framework("megatron")
    host = {}
    for ep in (8, 16):
        e = evaluate(p, Plan(tp=1, pp=1, ep=ep, zero_stage=1, micro_batch_size=4, ep_overlap=False))
        assert e.fits, e.reasons
        n = 48 * 512 // 16 // 4  # MoE layers x micro-batches per rank
        local = 128 // ep
        host[ep] = e.time_breakdown_s["host"]
        assert host[ep] == pytest.approx(n * (prof.moe_layer_host_s + local * prof.moe_expert_host_s), rel=1e-6)
    assert host[16] < host[8]
    graphs = evaluate(p, Plan(tp=1, pp=1, ep=8, zero_stage=1, micro_batch_size=4, cuda_graphs=True, ep_overlap=False))
    assert graphs.time_breakdown_s["host"] == 0.0
    plain = evaluate(p, Plan(tp=1, pp=1, ep=8, zero_stage=1, micro_batch_size=4, ep_overlap=False))
    assert graphs.step_time_s == pytest.approx(plain.step_time_s - host[8], rel=1e-9)
    # Only a framework that captures the step can run it that way.
    titan = load_problem({"model": "qwen3-30b-a3b", "framework": "torchtitan",
                          "training": {"seq_len": 4096, "global_batch_size": 512},
                          "cluster": {"gpu": "b200", "num_gpus": 16}})
    bad = evaluate(titan, Plan(tp=1, pp=1, ep=8, zero_stage=3, micro_batch_size=4, cuda_graphs=True))
    assert any("CUDA graphs" in r for r in bad.reasons)


def test_fp8_pays_quantization_and_keeps_router_and_head_in_bf16():
    from autoshard.catalog import get_recipe
    from autoshard.cost.kernels import _gemm_s

    def ctx_of(precision, gpu="h100"):
        return context(load_problem({"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64,
                                                                          "precision": precision},
                                     "cluster": {"gpu": gpu, "num_gpus": 8}}))

    bf16, cur, row = ctx_of("bf16"), ctx_of("fp8-current"), ctx_of("fp8-rowwise")
    assert bf16.quant_bytes == (0.0, 0.0)
    m, k, n = 8192.0, 4096.0, 14336.0
    # Transformer Engine caches the fp8 weights for the step: only the activation is quantized each pass.
    q = get_recipe("fp8-current").per_arch(get_recipe("fp8-current").quant_hbm_bytes_per_element, cur.gpu)
    assert cur.quant_bytes == (q, 0.0)
    no_quant = _gemm_s(cur, m, k, n, cur.mm_flops_per_s)
    # Forward and backward (priced at 3x this forward) quantize X (m x k) and dY (m x n) once each.
    assert 3 * _gemm_s(cur, m, k, n) == pytest.approx(3 * no_quant + q * m * (k + n) / cur.hbm_bytes_per_s)
    # torchao recasts the weights every micro-batch (no fp8 weight copy kept): W (k x n) once too.
    qa, qw = row.quant_bytes
    assert qa == qw > 0
    assert 3 * _gemm_s(row, m, k, n) == pytest.approx(3 * _gemm_s(row, m, k, n, row.mm_flops_per_s)
                                                      + qa * (m * k + m * n + k * n) / row.hbm_bytes_per_s)
    # A 16-bit rate for the router and LM head: the same in bf16 and fp8 recipes.
    assert cur.hp_flops_per_s == bf16.mm_flops_per_s < cur.mm_flops_per_s
    # The overhead is O(m k) against the GEMM's O(m k n): fp8 gains less on narrow layers.
    def gain(n_out):
        return _gemm_s(bf16, m, k, n_out) / _gemm_s(cur, m, k, n_out)
    assert gain(512) < gain(14336) < 2.0


def test_torchtitan_recasts_fp8_weights_with_torchaos_measured_casts():
    # torchao's Float8Linear (torchtitan) casts the weight in every forward and keeps no FP8 copy for the
    # step; Transformer Engine (Megatron) caches the FP8 weight and, below sm100, its transpose. The
    # memory of the copies and the weights' casts follow the framework, at its measured bytes.
    def ctx_of(framework):
        return context(load_problem({"model": "llama3-8b", "framework": framework,
                                     "training": {"seq_len": 8192, "global_batch_size": 64, "precision": "fp8-current"},
                                     "cluster": {"gpu": "h100", "num_gpus": 8}}))

    te, titan = ctx_of("megatron"), ctx_of("torchtitan")
    assert te.weight_copy_bytes_per_param == 2.0 and titan.weight_copy_bytes_per_param == 0.0
    assert te.quant_bytes == (6.0, 0.0)
    assert titan.quant_bytes == (8.1, 8.1)
    # torchao has no delayed scaling: `fp8` (the frameworks' default, delayed) runs as tensorwise there.
    fp8 = context(load_problem({"model": "llama3-8b", "framework": "torchtitan",
                                "training": {"seq_len": 8192, "global_batch_size": 64, "precision": "fp8"},
                                "cluster": {"gpu": "h100", "num_gpus": 8}}))
    assert fp8.quant_bytes == titan.quant_bytes
    plan = Plan(tp=1, pp=1, zero_stage=0, micro_batch_size=1)  # DDP in both: unsharded weights
    for c, copies in ((te, 2.0), (titan, 0.0)):  # bf16 (Megatron) or fp32 (FSDP2) weights + FP8 copies
        weights = evaluate(c.problem, plan).memory_breakdown_gib["weights"]
        assert weights == pytest.approx((c.framework.weight_bytes + copies) * 8.03e9 / 2**30, rel=0.01)


def test_hierarchical_dispatch_sends_a_token_once_per_remote_node():
    # DeepEP / HybridEP: a token bound for k experts crosses the scale-out network once per remote
    # node hosting any of them, not once per copy. Checked against a direct count over every way of
    # placing the k copies on n nodes.
    import itertools

    from autoshard.topology import all_to_all_s

    def expected_remote_nodes(n, k):  # brute force: mean distinct remote nodes over all n^k placements
        total = sum(len({d for d in dest if d != 0}) for dest in itertools.product(range(n), repeat=k))
        return total / n ** k

    p = load_problem({"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 1024},
                      "cluster": {"gpu": "h100", "num_gpus": 256}})
    ctx = context(p)
    for ep, nodes in ((16, 2), (32, 4), (64, 8)):
        prof = contiguous_profile(ctx.graph, ep)
        flat, dedup = all_to_all_s(ctx.levels, prof, 1e9), all_to_all_s(ctx.levels, prof, 1e9, 8)
        lat = all_to_all_s(ctx.levels, prof, 1e-9)  # the latency term alone
        ratio = (dedup - lat) / (flat - lat)
        copies_remote = 8 * (nodes - 1) / nodes
        assert ratio == pytest.approx(expected_remote_nodes(nodes, 8) / copies_remote, rel=1e-3), ep
    # One copy per token (k = 1) is the flat all-to-all.
    assert all_to_all_s(ctx.levels, contiguous_profile(ctx.graph, 64), 1e9, 1) == all_to_all_s(
        ctx.levels, contiguous_profile(ctx.graph, 64), 1e9)
    # Inside one NVLink domain the dispatch sends a token once to each peer GPU hosting any of its
    # experts (DeepEP tests/legacy/test_intranode.py: rank_idx = topk_idx // experts per rank, made
    # unique per token; the receiver's buffer holds num_tokens_per_rank tokens, not their k copies):
    # the same brute-force count over the g GPUs of the group instead of nodes.
    for g, k in ((8, 4), (4, 8), (8, 2)):
        prof = contiguous_profile(ctx.graph, g)
        flat, dedup = all_to_all_s(ctx.levels, prof, 1e9), all_to_all_s(ctx.levels, prof, 1e9, k)
        lat = all_to_all_s(ctx.levels, prof, 1e-9)
        assert (dedup - lat) / (flat - lat) == pytest.approx(
            expected_remote_nodes(g, k) / (k * (g - 1) / g), rel=1e-3), (g, k)
    # In a plan: DeepEP cuts EP64's exposed all-to-all; frameworks without it reject the choice.
    base = dict(tp=1, pp=8, ep=32, zero_stage=1, recompute="full", ep_overlap=False)
    a2a = evaluate(p, Plan(**base)).time_breakdown_s["ep_comm"]
    deep = evaluate(p, Plan(**base, moe_dispatcher="deepep")).time_breakdown_s["ep_comm"]
    assert deep < 0.6 * a2a
    titan = load_problem({"model": "deepseek-v3", "framework": "torchtitan",
                          "training": {"seq_len": 4096, "global_batch_size": 1024},
                          "cluster": {"gpu": "h100", "num_gpus": 256}})
    bad = evaluate(titan, Plan(tp=1, pp=8, ep=32, zero_stage=3, moe_dispatcher="deepep"))
    assert any("dispatcher" in r for r in bad.reasons)


def test_solver_plans_with_the_hierarchical_dispatcher_the_framework_runs():
    from autoshard.cost import context
    from autoshard.errors import InputError
    from autoshard.solver.candidates import planned_dispatcher

    def disp(model="deepseek-v3", gpu="h800", n=256, framework="megatron", allowed=None):
        p = load_problem({"model": model, "framework": framework, "training": {"seq_len": 4096,
                                                                                "global_batch_size": 1024},
                          "cluster": {"gpu": gpu, "num_gpus": n}})
        ctx = context(p)
        return planned_dispatcher(p, ctx, allowed or list(ctx.framework.moe_dispatchers))

    assert disp() == "deepep"  # 8-GPU NVLink nodes
    assert disp(gpu="gb200", n=288) == "hybridep"  # NVL72: only HybridEP spans a multi-node NVLink domain
    assert disp(model="llama3-70b") is None  # dense: no dispatcher
    assert disp(framework="torchtitan") is None  # its only dispatcher, the default
    assert disp(framework="automodel") == "deepep"
    assert disp(allowed=["alltoall"]) is None  # DeepEP not installed: the flat all-to-all
    with pytest.raises(InputError, match="search.moe_dispatcher|runs the alltoall"):
        disp(framework="torchtitan", allowed=["deepep"])
    # The hierarchical dispatcher never prices above the flat one: the choice loses no optimum.
    p = load_problem({"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 1024},
                      "cluster": {"gpu": "h800", "num_gpus": 256}})
    for ep in (8, 16, 32):
        base = dict(tp=1, pp=8, ep=ep, zero_stage=1, recompute="full")
        flat, deep = evaluate(p, Plan(**base)), evaluate(p, Plan(**base, moe_dispatcher="deepep"))
        # inside one node too: a token goes once to each GPU hosting any of its experts, not k times
        assert deep.step_time_s < flat.step_time_s


def test_cached_expert_profiles_match_the_rank_generator_groups_for_every_order():
    # _place prices folded expert groups through a cache keyed on the pipeline axis only; the groups
    # must be those of _expert_groups (Megatron's expert RankGenerator) for every placement order.
    import itertools

    from autoshard.topology import _expert_profiles, cluster_graph, resolve_levels
    from autoshard.catalog import get_gpu

    p = load_problem({"model": "qwen3-235b-a22b", "training": {"seq_len": 4096, "global_batch_size": 1024},
                      "cluster": {"gpu": "gb200", "num_gpus": 288}})
    levels = resolve_levels(p.cluster, get_gpu("gb200"))
    graph = cluster_graph(levels, 288)
    sizes = {"tp": 2, "cp": 3, "ep": 1, "dp": 12, "pp": 4}
    for order in itertools.permutations(("tp", "cp", "ep", "dp", "pp")):
        stride = int(np.prod([sizes[a] for a in order[:order.index("pp")]]))
        for etp, ep in ((1, 8), (2, 4), (1, 24)):
            want = tuple(graph.group_profile(g) for g in _expert_groups(order, sizes, etp, ep))
            assert _expert_profiles(graph, 4, stride, etp, ep) == want, (order, etp, ep)


def test_mla_up_proj_recompute_reruns_what_megatron_reruns():
    # Megatron's qkv_up_proj_and_rope_apply (multi_latent_attention.py) re-runs the query projection
    # (linear_q_proj on the hidden state when q_lora_rank is None, as Moonlight-16B), the kv
    # up-projection and RoPE; with SP both column-parallel projections all-gather their inputs again.
    from pathlib import Path

    import yaml

    from autoshard.cost.layers import _module_recompute

    m = yaml.safe_load((Path(__file__).parents[1] / "autoshard/data/models.yaml").read_text())["deepseek-v3"]
    m.pop("source")
    m.update(q_lora_rank=None, num_hidden_layers=4, first_k_dense_replace=1, hidden_size=2048,
             num_attention_heads=16, num_key_value_heads=16, num_experts=64, num_experts_per_tok=6,
             moe_intermediate_size=1408, intermediate_size=11264, num_shared_experts=2)
    p = load_problem({"model": m, "training": {"seq_len": 4096, "global_batch_size": 8},
                      "cluster": {"gpu": "h100", "num_gpus": 8}})
    ctx = context(p)
    times = {}
    for sp in (False, True):
        table = layer_table(ctx, Config.of(Plan(tp=2, etp=1, ep=8, sequence_parallel=sp), 1))
        sh = Shapes(ctx, table.cfg)
        layer = table.layers[("moe", "none")]
        t_s, saved, flops = _module_recompute(ctx, table.cfg, table.placement, sh, "moe", "mla_up_proj",
                                              layer.fwd, layer.fwd, 0.0, {})
        # 8 local heads: kv up-projection 512 -> 8 x (128 + 128), query projection 2048 -> 8 x 192.
        assert flops == pytest.approx(2 * 4096 * (512 * 8 * 256 + 2048 * 8 * 192))
        assert saved == pytest.approx(2 * 4096 * 8 * (2 * 192 + 128))  # q, k, v in bf16
        times[sp] = t_s, all_gather_s(ctx.levels, table.placement.tp, 2 * 4096 * (2048 + 512))
    assert times[True][0] == pytest.approx(times[False][0] + times[True][1])


def test_token_drop_pads_every_expert_to_its_capacity():
    # Megatron's drop-and-pad (--moe-expert-capacity-factor + --moe-pad-expert-input-to-capacity):
    # every expert computes capacity_factor x its mean share whatever the routing imbalance, and the
    # dispatcher knows the counts without a device-to-host sync (token_dispatcher.py, "no_sync").
    def est(framework="megatron", plan=None, **training):
        p = load_problem({"model": "qwen3-30b-a3b", "framework": framework,
                          "training": {"seq_len": 4096, "global_batch_size": 256, **training},
                          "cluster": {"gpu": "h100", "num_gpus": 16}})
        return evaluate(p, plan or Plan(tp=1, pp=2, ep=8, micro_batch_size=1))

    balanced = est()
    skewed = est(moe_load_imbalance=1.5)
    dropped = est(moe_load_imbalance=1.5, moe_capacity_factor=1.0)
    padded = est(moe_capacity_factor=1.25)
    tb = {k: e.time_breakdown_s for k, e in
          (("balanced", balanced), ("skewed", skewed), ("dropped", dropped), ("padded", padded))}
    # The busiest rank's imbalance is gone: computation and all-to-all as balanced routing.
    assert tb["skewed"]["compute"] > 1.1 * tb["balanced"]["compute"]
    assert tb["dropped"]["compute"] == pytest.approx(tb["balanced"]["compute"])
    assert tb["dropped"]["ep_comm"] == pytest.approx(tb["balanced"]["ep_comm"])
    # Padding to 1.25x the mean moves and computes 1.25x the routed copies.
    assert tb["padded"]["ep_comm"] == pytest.approx(1.25 * tb["balanced"]["ep_comm"], rel=0.02)
    assert tb["padded"]["compute"] > tb["balanced"]["compute"]
    # No sync: the host pays only the per-expert work, moe_layer_host_ms less per MoE layer and micro-batch,
    # and in this host-bound layer also what the sync adds: the forward's launches no longer stall behind
    # the MoE host work (at most its forward third, cost.layers._eager_host) and the token counts' gather
    # and host copies are not launched (2 counted launches, cost.kernels.dispatch_stage_launches).
    fw = get_framework("megatron")
    layers_mbs = 48 / 2 * balanced.num_microbatches  # pp 2: 24 MoE layers per stage
    saved = tb["balanced"]["host"] - tb["dropped"]["host"]
    stall = (fw.moe_layer_host_s + 16 * fw.moe_expert_host_s) / 3  # 128 experts / EP 8 = 16 local
    assert fw.moe_layer_host_s * layers_mbs < saved
    assert saved <= (fw.moe_layer_host_s + stall + 2 * EAGER_LAUNCH_HOST_S) * layers_mbs * (1 + 1e-9)
    # Launchers that route dropless cannot, and DeepEP cannot pad.
    assert any("routes dropless" in r for r in est("torchtitan", Plan(tp=1, ep=8, zero_stage=3),
                                                   moe_capacity_factor=1.0).reasons)
    assert any("DeepEP" in r for r in est(plan=Plan(tp=1, pp=2, ep=8, moe_dispatcher="deepep"),
                                         moe_capacity_factor=1.0).reasons)


def test_mla_gathers_its_latents_not_the_hidden_state():
    # With sequence parallelism, MLA's down-projections run on the sequence shard and the
    # column-parallel up-projections all-gather q_lora + kv_lora + the RoPE key (DeepSeek-V3: 1536 +
    # 512 + 64 = 2112 of 7168 per token); the output projection reduce-scatters the hidden state.
    from autoshard.cost.layers import _attention_cost
    from autoshard.topology import reduce_scatter_s

    p = load_problem({"model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 1024},
                      "cluster": {"gpu": "h100", "num_gpus": 1024}})
    ctx = context(p)
    table = layer_table(ctx, Config.of(Plan(tp=2, pp=8, ep=32, etp=1, tp_comm_overlap=False), 1))
    sh = Shapes(ctx, table.cfg)
    fwd, bwd, *_ = _attention_cost(ctx, table.cfg, table.placement, sh)
    tp = table.placement.tp
    want = all_gather_s(ctx.levels, tp, 2 * sh.tokens * 2112) + reduce_scatter_s(ctx.levels, tp, 2 * sh.tokens * 7168)
    assert fwd["tp_comm"] == pytest.approx(want) and bwd["tp_comm"] == pytest.approx(want)
    assert want < 2 * all_gather_s(ctx.levels, tp, 2 * sh.tokens * 7168)  # less than a GQA block's AG + RS


def test_bf16_main_grads_halve_the_gradient_buffers_and_their_reduction():
    # Megatron-LM keeps fp32 main grads for bf16 training; --grad-reduce-in-bf16 (every Megatron-Bridge
    # performance recipe: grad_reduce_in_fp32 false) keeps and reduces them in bf16.
    from autoshard.export import export_plan

    def problem(**training):
        return load_problem({"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64, **training},
                             "cluster": {"gpu": "h100", "num_gpus": 64}})

    plan = Plan(tp=1, zero_stage=1, overlap_grad_reduce=False)
    fp32, bf16 = evaluate(problem(), plan), evaluate(problem(main_grads="bf16"), plan)
    assert bf16.stages[0].memory_gib["gradients"] == pytest.approx(fp32.stages[0].memory_gib["gradients"] / 2)
    ctx32, ctx16 = context(problem()), context(problem(main_grads="bf16"))
    assert (ctx32.framework.grad_reduce_bytes, ctx16.framework.grad_reduce_bytes) == (4, 2)
    assert bf16.time_breakdown_s["dp_comm"] < 0.6 * fp32.time_breakdown_s["dp_comm"]  # exposed: half the bytes
    assert "--grad-reduce-in-bf16" in export_plan(problem(main_grads="bf16"), plan, "megatron").text
    assert "--grad-reduce-in-bf16" not in export_plan(problem(), plan, "megatron").text
    tt = load_problem({**problem(main_grads="bf16").model_dump(exclude={"framework", "search"}), "framework": "torchtitan"})
    assert 'mixed_precision_reduce = "bfloat16"' in export_plan(tt, Plan(tp=1, zero_stage=3), "torchtitan").text
    mt = load_problem({**problem(main_grads="bf16").model_dump(exclude={"framework", "search"}), "framework": "maxtext"})
    assert any("keeps its gradients in fp32, not bf16" in r for r in evaluate(mt, Plan(tp=1, zero_stage=3)).reasons)


def test_te_keeps_fp8_linear_inputs_for_the_backward():
    # Transformer Engine keeps a linear layer's quantized input (columnwise, rowwise dropped) for its
    # weight gradient: per dense layer the QKV, proj, fc1 and fc2 inputs drop from 2 bytes to 1 (FP8)
    # or 0.5625 (NVFP4) per element. torchtitan's float8 keeps them in bf16 here.
    from autoshard.cost.layers import _activation_bytes

    def acts(precision, framework="megatron", gpu="b200"):
        p = load_problem({"model": "llama3-70b", "framework": framework,
                          "training": {"seq_len": 8192, "global_batch_size": 64, "precision": precision},
                          "cluster": {"gpu": gpu, "num_gpus": 64}})
        ctx = context(p)
        cfg = Config.of(Plan(tp=4, pp=2, zero_stage=1 if framework == "megatron" else 3), 1)
        return _activation_bytes(ctx, cfg, Shapes(ctx, cfg), "dense")["none"], Shapes(ctx, cfg)

    bf16, sh = acts("bf16")
    T, h, ad, ffn = sh.tokens, sh.h, sh.a_local * sh.d, 28672 / 4
    linear_inputs = 2 * T * h / 4 + T * ad + T * ffn  # QKV + fc1 inputs (SP-sharded), proj, fc2 inputs
    assert bf16 - acts("fp8-current")[0] == pytest.approx(1.0 * linear_inputs)
    # NVFP4 (every layer in FP4, as Megatron runs it): 4-bit inputs with an E4M3 scale per 16.
    assert bf16 - acts("nvfp4")[0] == pytest.approx((2 - 0.5625) * linear_inputs)
    assert acts("mxfp8")[0] == pytest.approx(bf16 - (2 - 1.03125) * linear_inputs)
    assert acts("fp8-current", "torchtitan", "h100")[0] == pytest.approx(acts("bf16", "torchtitan", "h100")[0])


def test_fp8_primary_weights_replace_the_bf16_copy_and_halve_the_gathers():
    # Megatron --fp8-param-gather (Megatron-Bridge's FP8 mixed-precision configs): the FP8 copy is the
    # weight (no bf16 weights beside it) and the distributed optimizer all-gathers it in FP8.
    from autoshard.cost import gathered_weight_bytes
    from autoshard.export import export_plan

    def problem(framework="megatron", **training):
        return load_problem({"model": "llama3-70b", "framework": framework,
                             "training": {"seq_len": 8192, "global_batch_size": 128, "precision": "fp8-current",
                                          **training},
                             "cluster": {"gpu": "b200", "num_gpus": 64}})

    plan = Plan(tp=2, pp=4, zero_stage=1, overlap_param_gather=False)
    base, fp8 = evaluate(problem(), plan), evaluate(problem(fp8_params=True), plan)
    w = base.stages[1].memory_gib["weights"]
    assert fp8.stages[1].memory_gib["weights"] == pytest.approx(w / 3)  # bf16 2 B + FP8 copy 1 B -> 1 B (B200)
    assert gathered_weight_bytes(context(problem(fp8_params=True))) == 1.0 == gathered_weight_bytes(context(problem())) / 2
    assert fp8.time_breakdown_s["dp_comm"] < base.time_breakdown_s["dp_comm"]
    assert "--fp8-param-gather" in export_plan(problem(fp8_params=True), plan, "megatron").text
    # Megatron-FSDP (ZeRO-3) gathers the FP8 copies too: the two layers it holds unsharded (the one
    # computing, the one prefetched) take half the bytes; the shards' own memory is the same.
    z3 = Plan(tp=2, pp=4, zero_stage=3, overlap_param_gather=False)
    z_base, z_fp8 = evaluate(problem(), z3), evaluate(problem(fp8_params=True), z3)
    gathered = z_base.stages[1].memory_gib["zero3_gathered"]
    assert gathered > 0 and z_fp8.stages[1].memory_gib["zero3_gathered"] == pytest.approx(gathered / 2)
    # Llama 3 70B layer on tp2: q and o 8192^2, k and v 8192 x 1024, three 8192 x 28672 MLP matrices
    layer = (8192 * (2 * 8192 + 2 * 1024) + 3 * 8192 * 28672) / 2
    assert gathered * 2**30 == pytest.approx(2 * 2 * layer, rel=1e-3)  # two layers' bf16 weights
    assert any("cannot keep its weights in FP8" in r
               for r in evaluate(problem("torchtitan", fp8_params=True), Plan(tp=2, zero_stage=3)).reasons)
    # NVFP4 (--fp4-param-gather): the FP4 copies (1.125 B) replace the bf16 weights (every layer runs in
    # FP4, as Megatron does by default). 16-bit training cannot.
    nv = load_problem({**problem(fp8_params=True).model_dump(exclude={"search"}),
                       "training": {**problem().training.model_dump(), "precision": "nvfp4", "fp8_params": True}})
    nv_base = load_problem({**nv.model_dump(exclude={"search"}), "training": {**nv.training.model_dump(), "fp8_params": False}})
    w_nv, w_base = (evaluate(x, plan).stages[1].memory_gib["weights"] for x in (nv, nv_base))
    assert w_nv == pytest.approx(w_base * 1.125 / (2 + 1.125))
    assert "--fp4-param-gather" in export_plan(nv, plan, "megatron").text
    bf = load_problem({**nv.model_dump(exclude={"search"}), "training": {**nv.training.model_dump(), "precision": "bf16"}})
    assert any("needs an FP8 or FP4 recipe" in r for r in evaluate(bf, plan).reasons)


def test_reports_name_the_run_settings_that_change_the_price():
    from autoshard.render import estimate_text

    p = load_problem({"model": "qwen3-30b-a3b", "training": {"seq_len": 4096, "global_batch_size": 64,
                      "precision": "fp8-current", "fp8_params": True, "main_grads": "bf16",
                      "moe_capacity_factor": 1.25}, "cluster": {"gpu": "h100", "num_gpus": 8}})
    text = estimate_text(p, evaluate(p, Plan(tp=1, ep=8)))
    assert text.splitlines()[1] == "training: FP8 weights, bf16 main grads, token drop at capacity 1.25"
    plain = load_problem({"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64},
                          "cluster": {"gpu": "h100", "num_gpus": 8}})
    assert not estimate_text(plain, evaluate(plain, Plan(tp=1))).splitlines()[1].startswith("training:")


def test_sliding_window_attention_attends_the_window():
    # A window of W keys: query i attends min(i, W) keys; counted one by one against the formula.
    spec = load_problem({"model": {"name": "swa", "num_hidden_layers": 4, "hidden_size": 2880, "intermediate_size": 11520,
                                   "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                                   "vocab_size": 201088, "sliding_window": 128, "sliding_window_layers": 0.5},
                         "training": {"seq_len": 4096, "global_batch_size": 64},
                         "cluster": {"gpu": "h100", "num_gpus": 16}})
    S, W = 4096, 128
    counted = sum(min(i, W) for i in range(1, S + 1)) / sum(range(1, S + 1))
    assert spec.model.attention_key_share(S) == pytest.approx(0.5 * counted + 0.5)
    assert spec.model.attention_key_share(64) == 1.0  # a window longer than the sequence: full attention
    full = load_problem({**spec.model_dump(exclude={"model", "search"}),
                         "model": {**spec.model.model_dump(), "sliding_window": None}})
    ctx_w, ctx_f = context(spec), context(full)
    cfg = Config.of(Plan(tp=2, pp=2), 1)
    from autoshard.cost import core_attention_s
    t_w, _, f_w = core_attention_s(ctx_w, Shapes(ctx_w, cfg))
    t_f, _, f_f = core_attention_s(ctx_f, Shapes(ctx_f, cfg))
    assert f_w == pytest.approx(f_f * spec.model.attention_key_share(S)) and t_w < t_f
    # CUDA graphs: this 4-layer model's micro-batches are otherwise host-bound (cost.layers._eager_host),
    # and a cheaper attention then cannot show in the step
    graphs = Plan(tp=2, pp=2, cuda_graphs=True)
    assert evaluate(spec, graphs).step_time_s < evaluate(full, graphs).step_time_s


def test_windowed_attention_splits_its_context_with_all_to_all_on_transformer_engine():
    # Transformer Engine's attn_forward_func_with_cp asserts a sliding window runs with cp_comm_type a2a
    # (or all-gather without fused attention): Megatron's default ring would not start. The solver plans
    # the all-to-all, the export writes it, and a ring plan is refused with the fix.
    from autoshard import solve
    from autoshard.export import export_plan

    def problem(framework="megatron", window=128):
        return load_problem({"model": {**load_problem({"model": "gpt-oss-120b", "training": {"seq_len": 4096,
                             "global_batch_size": 64}, "cluster": {"gpu": "h100", "num_gpus": 64}}).model.model_dump(),
                             "sliding_window": window},
                             "framework": framework, "training": {"seq_len": 65536, "global_batch_size": 64},
                             "cluster": {"gpu": "h100", "num_gpus": 64}})

    ring = Plan(tp=1, cp=8, ep=64, zero_stage=3, recompute="full")  # (fits: 64k-token sequences)
    assert any("only with cp_comm_type a2a, not p2p" in r for r in evaluate(problem(), ring).reasons)
    ulysses = ring.model_copy(update={"cp_comm_type": "a2a"})
    assert not evaluate(problem(), ulysses).reasons
    assert not evaluate(problem(window=None), ring).reasons  # full attention: the ring is fine
    best = solve(problem(), top_k=0).plan
    assert best.cp > 1 and best.cp_comm_type == "a2a" and "cp8(a2a)" in best.short()
    assert "--cp-comm-type a2a" in export_plan(problem(), best, "megatron").text
    full = solve(problem(window=None), top_k=0).plan
    assert full.cp > 1 and full.cp_comm_type == "p2p"  # the same degrees, on the ring


def test_gpt_oss_presets_match_the_model_card():
    # OpenAI's gpt-oss model card: 116.83B and 20.91B total parameters (the presets leave out the
    # attention sinks and the expert / router biases, ~0.04%).
    from autoshard.cost import total_params

    for name, card in (("gpt-oss-120b", 116.83e9), ("gpt-oss-20b", 20.91e9)):
        p = load_problem({"model": name, "training": {"seq_len": 4096, "global_batch_size": 64},
                          "cluster": {"gpu": "h100", "num_gpus": 64}})
        assert total_params(p.model) == pytest.approx(card, rel=1e-3)
        assert (p.model.sliding_window, p.model.sliding_window_layers) == (128, 0.5)


def test_gpt_oss_expert_bias_is_an_fp32_pass_over_the_fc2_output():
    # Megatron's TEGroupedMLP._apply_packed_bias adds bias x router probability to the fc2 output in
    # fp32 outside the grouped GEMM: 36 bytes per element forward, 40 backward (frameworks.yaml, counted
    # from experts.py). gpt-oss-120b at micro-batch 4 x 4096 on one GB200 rank of EP64: 65,536 routed
    # rows of 2,880 -> 14.3 GB per layer and micro-batch, memory-bound.
    from autoshard import cost

    def problem(bias, framework="megatron"):
        base = load_problem({"model": "gpt-oss-120b", "training": {"seq_len": 4096, "global_batch_size": 1280},
                             "cluster": {"gpu": "gb200", "num_gpus": 64}})
        return load_problem({"model": {**base.model.model_dump(), "expert_bias": bias}, "framework": framework,
                             "training": {"seq_len": 4096, "global_batch_size": 1280},
                             "cluster": {"gpu": "gb200", "num_gpus": 64}})

    plan = Plan(tp=1, pp=1, ep=64, zero_stage=1, micro_batch_size=4, ep_overlap=False)
    assert problem(True).model.expert_bias  # the preset has it
    with_b, without = evaluate(problem(True), plan), evaluate(problem(False), plan)
    ctx = cost.context(problem(True))
    moved = 76 * 4 * 4096 * 4 * 2880  # bytes x routed rows x hidden
    assert moved == pytest.approx(14.3e9, rel=0.01)
    per_step = 36 * 5 * moved / ctx.hbm_bytes_per_s  # 36 layers x 5 micro-batches
    assert with_b.step_time_s - without.step_time_s == pytest.approx(per_step, rel=0.02)
    titan = (evaluate(problem(b, "torchtitan"), plan.model_copy(update={"ep_overlap": None})) for b in (True, False))
    assert next(titan).step_time_s == next(titan).step_time_s  # no byte count for its path: not priced


def test_attention_rate_by_head_dim_follows_the_exponential_units():
    # A score costs 4 x head_dim tensor FLOPs and one MUFU.EX2 exponential. Hopper (989 TFLOP/s, 3.9 T
    # exponentials/s, FlashAttention-3 sec. 3) against FlashAttention-3's measured forward (Fig. 5, causal,
    # bf16): ~500 / 650 / 750 TFLOP/s at head dims 64 / 128 / 256.
    from autoshard.catalog import get_gpu
    from autoshard.cost import attention_head_dim_factor

    h100, gb200, gb300 = get_gpu("h100-sxm"), get_gpu("gb200"), get_gpu("gb300")
    assert attention_head_dim_factor(64, h100) == pytest.approx(500 / 650, rel=0.05)
    assert attention_head_dim_factor(256, h100) == pytest.approx(750 / 650, rel=0.05)
    assert attention_head_dim_factor(128, gb200) == 1.0
    # Blackwell quadrupled the tensor rate per exponential: small heads lose more (cudnn-frontend's GB200
    # benchmark: 574 vs 1,408 TFLOP/s forward at 64 vs 128), MLA's 192-wide keys gain; Blackwell Ultra's
    # doubled exponential rate brings 64 back near Hopper's ratio to 128.
    assert attention_head_dim_factor(64, gb200) < attention_head_dim_factor(64, h100) - 0.08
    assert attention_head_dim_factor(192, gb200) > attention_head_dim_factor(192, h100)
    assert attention_head_dim_factor(64, gb300) / attention_head_dim_factor(128, gb300) == pytest.approx(
        attention_head_dim_factor(64, h100), abs=0.02)
    # a GPU without the figure keeps FlashAttention-3's d / (d + 32)
    assert attention_head_dim_factor(64, get_gpu("mi300x")) == pytest.approx((64 / 96) / (128 / 160))


def test_blackwell_ultra_doubled_exponential_rate_is_priced_against_blackwell():
    # Blackwell Ultra is Blackwell's SM with 32 MUFU.EX2 per clock instead of 16 (NVIDIA, 'Inside NVIDIA
    # Blackwell Ultra' spec table: attention acceleration 10.7 vs 5 TeraExponentials/s per GPU; 'Making
    # Softmax More Efficient with Blackwell Ultra', 2026: SFU throughput doubled). Its generation's fitted
    # factors are referenced to Blackwell's 16 per clock (matmul.yaml attention_exp_reference_per_sm_clock),
    # so at head dim 128 its attention runs (1 + 2R) / (1 + R) of the rate the factor alone gives, R = its
    # bf16 tensor rate per exponential / 512: GB300 2,500 TFLOP/s / (512 x 10.06 T/s) = 0.4854 -> 1.327.
    from autoshard.catalog import attention_exp_reference_per_sm_clock, get_gpu
    from autoshard.cost import attention_head_dim_factor

    gb200, gb300, b300 = get_gpu("gb200"), get_gpu("gb300"), get_gpu("b300")
    assert gb300.exp_tera_per_s / gb200.exp_tera_per_s == pytest.approx(10.7 / 5.0, rel=0.02)
    assert gb300.exp_per_sm_clock == b300.exp_per_sm_clock == 2 * attention_exp_reference_per_sm_clock("blackwell-ultra")
    assert attention_exp_reference_per_sm_clock("blackwell") is None
    assert attention_exp_reference_per_sm_clock("hopper") is None
    r = 2500e12 / (512 * 10.06e12)
    assert attention_head_dim_factor(128, gb300) == pytest.approx((1 + 2 * r) / (1 + r), rel=1e-9)
    assert attention_head_dim_factor(128, gb300) == pytest.approx(1.327, abs=1e-3)
    # The same GPU with Blackwell's exponential rate is priced exactly at its factor (1.0 at head dim 128):
    # what moves is the doubled rate alone.
    halved = gb300.model_copy(update={"exp_tera_per_s": gb300.exp_tera_per_s / 2, "exp_per_sm_clock": 16})
    assert attention_head_dim_factor(128, halved) == pytest.approx(1.0, rel=1e-12)
    assert attention_head_dim_factor(64, halved) < attention_head_dim_factor(64, gb300) / 1.3
    # Against GB200 at one tensor rate: NVIDIA reports ~35% more FP8 attention forward throughput on GB300
    # than on GB200 for DeepSeek-V3 ('Making Softmax More Efficient with Blackwell Ultra'); the model gives
    # 1.33x at head dim 128 and 1.23x at MLA's 192 (1.0x and 0.93x before the doubled rate was priced).
    assert attention_head_dim_factor(128, gb300) / attention_head_dim_factor(128, gb200) == pytest.approx(1.35, rel=0.05)
    assert 1.15 < attention_head_dim_factor(192, gb300) / attention_head_dim_factor(192, gb200) < 1.35
    # The backward recomputes one exponential per score beside 2.5x the forward's tensor FLOPs, so a score
    # costs 2.5 x 4d / T + 1 / X there: the doubled rate speeds it (2.5 + 2R) / (2.5 + R) = 1.163x, and
    # the backward, priced at the forward's time x 2.5 / rate, takes 1.327 / 1.163 = 1.141 of that time.
    from autoshard.cost.kernels import _exp_reference_backward

    assert (1 + 2 * r) / (1 + r) / _exp_reference_backward(gb300) == pytest.approx((2.5 + 2 * r) / (2.5 + r), rel=1e-9)
    assert _exp_reference_backward(gb300) == pytest.approx(1.141, abs=1e-3)
    assert _exp_reference_backward(gb200) == _exp_reference_backward(get_gpu("h100-sxm")) == 1.0


def test_attention_pays_its_call_and_causal_tail_per_context_parallel_step():
    # The core attention's forward beyond its FLOPs: one fixed time per kernel call (a call per CP ring
    # step) and the causal tail, a third of the longest query tile's key loop over the sequence a GPU's
    # diagonal step holds. So TP8 (8 heads per GPU) runs attention at a lower rate than TP1 (64 heads).
    from autoshard.cost import Config, Shapes, context, core_attention_flops, core_attention_s
    from autoshard.cost.constants import ATTN_CALL_S, ATTN_CAUSAL_TAIL, ATTN_TILE
    from autoshard.cost.kernels import attention_head_dim_factor

    ctx = context(load_problem({"model": "llama3-70b", "training": {"seq_len": 8192, "global_batch_size": 64},
                                "cluster": {"gpu": "h100", "num_gpus": 64}}))
    rate = ctx.attn_flops_per_s * attention_head_dim_factor(128, ctx.gpu)
    tile_s = 2 * ATTN_TILE**2 * 256 / (rate / ctx.gpu.sm_count)
    rates = {}
    for tp, cp in ((1, 1), (8, 1), (8, 4)):
        sh = Shapes(ctx, Config(tp, cp, 1, 1, 64 // (tp * cp), 1, True, 1, 1, "1f1b", "tp-cp-ep-dp-pp"))
        t, _, flops = core_attention_s(ctx, sh)
        assert t == pytest.approx(flops / rate + cp * ATTN_CALL_S + ATTN_CAUSAL_TAIL * 8192 / cp / ATTN_TILE * tile_s)
        assert flops == core_attention_flops(sh)
        rates[tp, cp] = flops / t
    assert rates[8, 1] < rates[1, 1] < rate
    assert rates[8, 1] / rate == pytest.approx(0.86, abs=0.05)  # measured 0.86 (8 heads, 8k tokens)


def test_torchtitan_selective_is_per_op_sac_rerunning_every_second_matmul():
    # torchtitan's per-op SAC (selective_ac_option "op", what the export writes for selective) saves
    # every aten.mm output but every second one of a block, the SDPA output and the TP reduce-scatters,
    # and re-runs everything else (torchtitan 9dec370 parallelize_llama.py _save_list / _custom_policy;
    # HEAD distributed/activation_checkpoint.py SelectiveAC). A Llama block calls wq, wk, wv, wo, w1, w3,
    # w2: wk (4096 x 1024), wo (4096 x 4096) and w3 (4096 x 14336) are re-run, attention is not.
    # Megatron's selective re-runs the attention core only.
    def table(framework, tp=1, mbs=1):
        p = load_problem({"model": "llama3-8b", "framework": framework,
                          "training": {"seq_len": 8192, "global_batch_size": 64},
                          "cluster": {"gpu": "h100", "num_gpus": 8}})
        ctx = context(p)
        cfg = Config(tp, 1, 1, 1, 8 // tp, 1, tp > 1, 3 if framework == "torchtitan" else 1, mbs, "1f1b",
                     "tp-cp-ep-dp-pp")
        return ctx, cfg, layer_table(ctx, cfg)

    T = 8192
    ctx, cfg, t = table("torchtitan")
    none, sel = t.layers[("dense", "none")], t.layers[("dense", "selective")]
    # FLOPs re-run: 2 T h (kv d + a d + ffn), hand-worked; no attention FLOPs among them
    assert sel.hfu_flops - none.hfu_flops == pytest.approx(2 * T * 4096 * (1024 + 4096 + 14336))
    # Kept per token: the block input, the wq, wv, w1 and w2 outputs and the attention output (bf16),
    # and the attention's fp32 log-sum-exp per head: 2 (4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4 x 32
    assert sel.act_bytes == pytest.approx(T * (2 * 31744 + 4 * 32))
    assert sel.act_bytes < 0.5 * none.act_bytes
    # The recompute is the three GEMMs' forward plus the block's elementwise forward (norms, residual
    # adds, RoPE, SiLU x w3)
    gemms = _gemm_s(ctx, T, 4096, 1024, ctx.module_flops_per_s("attention"))
    gemms += _gemm_s(ctx, T, 4096, 4096, ctx.module_flops_per_s("attention"))
    gemms += _gemm_s(ctx, T, 4096, 14336, ctx.module_flops_per_s("dense_mlp"))
    elem = _mem_s(ctx, BF16 * (T * 4096 * 5 + T * (32 + 8) * 128 * 2)) + _mem_s(ctx, BF16 * (T * 14336 * 3 + T * 4096 * 5))
    assert sel.bwd["recompute"] == pytest.approx(gemms + elem)
    mctx, mcfg, mt = table("megatron")
    assert mt.layers[("dense", "selective")].bwd["recompute"] == pytest.approx(core_attention_s(mctx, Shapes(mctx, mcfg))[0])
    # With TP's sequence parallelism the forward's all-gathers (half its TP time) are re-run, the
    # reduce-scatters saved
    ctx8, cfg8, t8 = table("torchtitan", tp=8, mbs=8)
    n8, s8 = t8.layers[("dense", "none")], t8.layers[("dense", "selective")]
    sh8 = Shapes(ctx8, cfg8)
    g8 = _gemm_s(ctx8, 8 * T, 4096, 1024 // 8, ctx8.module_flops_per_s("attention"))  # wk
    g8 += _gemm_s(ctx8, 8 * T, 4096 // 8, 4096, ctx8.module_flops_per_s("attention"))  # wo
    g8 += _gemm_s(ctx8, 8 * T, 4096, 14336 // 8, ctx8.module_flops_per_s("dense_mlp"))  # w3
    e8 = _mem_s(ctx8, BF16 * (sh8.res_tokens * 4096 * 5 + 8 * T * (4 + 1) * 128 * 2)) \
        + _mem_s(ctx8, BF16 * (8 * T * 14336 // 8 * 3 + sh8.res_tokens * 4096 * 5))
    assert s8.bwd["recompute"] == pytest.approx(g8 + e8 + n8.fwd["tp_comm"] / 2)


def test_torchtitan_sequence_parallel_collectives_copy_around_nccl():
    # torchtitan shards [batch, seq, hidden] on dim 1 for sequence parallelism; PyTorch's functional
    # collectives gather and scatter on dim 0, so they copy the tensor with torch.cat of its chunks after
    # the all-gather (not for one sequence a micro-batch in newer releases: a view) and before the
    # reduce-scatter: a read and a write of the whole tensor each. Megatron's SP gathers on dim 0 of its
    # [seq, batch, hidden] layout: no copy. AsyncTP is left as priced before.
    from autoshard.cost.communication import sequence_dim_copies_s

    def parts(framework, mbs, overlap=False):
        p = load_problem({"model": "llama3-8b", "framework": framework,
                          "training": {"seq_len": 8192, "global_batch_size": 96},
                          "cluster": {"gpu": "h100", "num_gpus": 64}})
        ctx = context(p)
        cfg = Config(8, 1, 1, 1, 8, 1, True, 3, mbs, "1f1b", "tp-cp-ep-dp-pp", tp_overlap=overlap)
        pl = layer_table(ctx, cfg).placement
        return ctx, cfg, pl

    act = BF16 * 12 * 8192 * 4096  # one micro-batch of 12 sequences, gathered
    ctx, cfg, pl = parts("torchtitan", 12)
    copies = 2 * act / ctx.hbm_bytes_per_s + 2 * act / ctx.hbm_bytes_per_s
    assert sequence_dim_copies_s(ctx, cfg, act, act) == pytest.approx(copies)
    ag, rs = all_gather_s(ctx.levels, pl.tp, act), reduce_scatter_s(ctx.levels, pl.tp, act)
    assert tp_comm_s(ctx, cfg, pl, act, 1.0) == pytest.approx(ag + rs + copies)
    one = BF16 * 8192 * 4096
    ctx1, cfg1, _ = parts("torchtitan", 1)  # one sequence: the gather is a view, the scatter still copies
    assert sequence_dim_copies_s(ctx1, cfg1, one, one) == pytest.approx(2 * one / ctx1.hbm_bytes_per_s)
    mctx, mcfg, mpl = parts("megatron", 12)
    assert sequence_dim_copies_s(mctx, mcfg, act, act) == 0.0
    octx, ocfg, opl = parts("torchtitan", 12, overlap=True)
    assert tp_comm_s(octx, ocfg, opl, act, 1e3) < ag + rs  # AsyncTP: overlapped, no copies added


def test_torchtitan_projections_are_separate_gemms():
    # torchtitan's Attention has separate wq, wk, wv and its FeedForward separate w1, w3
    # (torchtitan/models/llama3/model.py): each GEMM reads the input again and pads its own tiles, where
    # Megatron runs one linear_qkv and one gated linear_fc1. At TP 8 Llama 3 8B's key and value
    # projections are 128 columns wide, half of the H100's 256-wide tile. The input's FP8 cast is one.
    from autoshard.cost.layers import _unfused_s

    def ctx_of(framework, precision="bf16"):
        return context(load_problem({"model": "llama3-8b", "framework": framework,
                                     "training": {"seq_len": 8192, "global_batch_size": 96, "precision": precision},
                                     "cluster": {"gpu": "h100", "num_gpus": 64}}))

    titan, mega = ctx_of("torchtitan"), ctx_of("megatron")
    T, h = 12 * 8192, 4096
    r = titan.mm_flops_per_s
    widths = (512, 128, 128)  # wq, wk, wv at TP 8
    extra = sum(_gemm_s(titan, T, h, w, r) for w in widths) - _gemm_s(titan, T, h, 768, r)
    assert _unfused_s(titan, T, h, widths, None) == pytest.approx(extra) and extra > 0
    # wk and wv (128 wide) each re-read the 805 MB input: together at least that read once more than fused
    assert extra > BF16 * T * h / titan.hbm_bytes_per_s
    assert _unfused_s(mega, T, h, widths, None) == 0.0
    fp8 = ctx_of("torchtitan", "fp8-current")  # priced without quantization: the cast of X is shared
    r8 = fp8.mm_flops_per_s
    assert _unfused_s(fp8, T, h, widths, None) == pytest.approx(
        sum(_gemm_s(fp8, T, h, w, r8) for w in widths) - _gemm_s(fp8, T, h, 768, r8))


def test_torchtitan_gathers_tensorwise_fp8_inputs_for_tensor_parallelism():
    # torchtitan's float8 TP (models/llama3/infra/parallelize.py, enable_float8_tensorwise_tp): with the
    # tensorwise recipe, torchao's PrepareFloat8ModuleInput / Float8ColwiseParallel cast a block's input
    # to float8 before the sequence-parallel all-gather: 1 B per element instead of 2. The backward's
    # gradient all-gather and both reduce-scatters stay bf16; the row-wise recipe gathers in bf16.
    from autoshard.cost.layers import tp_gather_bytes

    def ctx_of(precision):
        return context(load_problem({"model": "llama3-70b", "framework": "torchtitan",
                                     "training": {"seq_len": 8192, "global_batch_size": 64, "precision": precision},
                                     "cluster": {"gpu": "h100", "num_gpus": 64}}))

    cur, row, bf16 = ctx_of("fp8-current"), ctx_of("fp8-rowwise"), ctx_of("bf16")
    e = 8192.0 * 8192
    assert tp_gather_bytes(cur, e, "dense_mlp") == (1.0 * e, 2.0 * e)
    assert tp_gather_bytes(row, e, "dense_mlp") == tp_gather_bytes(bf16, e, "dense_mlp") == (2.0 * e, 2.0 * e)
    cfg = Config(8, 1, 1, 8, 1, 1, True, 1, 1, "1f1b", "tp-cp-ep-dp-pp", tp_overlap=False)
    lc, lb = layer_table(cur, cfg).layers[("dense", "none")], layer_table(bf16, cfg).layers[("dense", "none")]
    pl = layer_table(cur, cfg).placement
    # Unoverlapped, the attention and MLP blocks' two forward all-gathers each move half the bytes.
    saved = 2 * (all_gather_s(cur.levels, pl.tp, 2.0 * e) - all_gather_s(cur.levels, pl.tp, 1.0 * e))
    assert saved > 0
    assert lb.fwd["tp_comm"] - lc.fwd["tp_comm"] == pytest.approx(saved)
    assert lc.bwd["tp_comm"] == pytest.approx(lb.bwd["tp_comm"])

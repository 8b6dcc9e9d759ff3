"""Data-parallel / sharding knobs (issue 29 part 2): the ZeRO / FSDP overlaps as the framework's engine
runs them, FSDP reshard_after_forward (always / never / a group of N ranks: FSDP2's int, ZeRO++ hpZ)
and hierarchical sharding (torchtitan HSDP, Megatron --num-distributed-optimizer-instances, DeepSpeed
MiCS): schema, memory, traffic, runnable predicate, search, exports and the validate row format.

Independent numbers: Llama 3 8B has 8,030,261,248 parameters (its Hugging Face safetensors index;
32 layers of 4096 hidden, 14336 FFN, 8 KV heads of 128: 218,112,000 per layer by hand below), the
collective costs are the topology's ring formulas on process groups read from the cluster graph
(not from the split the cost model makes), and the framework facts are quoted from their code."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.cost import BF16, Config, context, dp_overlaps, layer_table, total_params
from autoshard.cost.layers import _zero3_layer_comm_s
from autoshard.export import export_plan
from autoshard.frameworks import profiles
from autoshard.solver import solve
from autoshard.topology import all_gather_s, all_reduce_s, contiguous_profile, reduce_scatter_s, split_profile
from autoshard.validate.modern import dp_knobs_of

GIB = 2**30
LLAMA3_8B_PARAMS = 8_030_261_248
# one Llama 3 8B layer by hand: q, o 4096^2; k, v 4096 x 1024; gate, up, down 4096 x 14336; two norms
LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096


def problem(framework: str, gpus: int = 64, **search):
    return load_problem({"model": "llama3-8b", "framework": framework,
                         "training": {"seq_len": 8192, "global_batch_size": 64},
                         "cluster": {"gpu": "h100", "num_gpus": gpus}, "search": search})


def rank_params(p) -> float:
    """The parameters on one pp = 1 rank: the model less its final norm (not on a rank's table)."""
    return total_params(p.model) - p.model.hidden_size


def test_hand_counts_agree_with_the_model():
    p = problem("torchtitan")
    assert total_params(p.model) == LLAMA3_8B_PARAMS
    assert LAYER == 218_112_000


# ---- 1. overlaps as the engine runs them -----------------------------------------------------------

def test_framework_facts_of_the_data_parallel_overlaps():
    fw = profiles()
    # Megatron: --overlap-grad-reduce and --overlap-param-gather both exist (param_and_grad_buffer.py)
    assert fw["megatron"].dp_overlap_flags == ("grad_reduce", "param_gather")
    # DeepSpeed: overlap_comm switches the reduction; ZeRO-1/2 gathers at the end of step(), exposed
    assert fw["deepspeed"].dp_overlap_flags == ("grad_reduce",) and not fw["deepspeed"].param_gather_overlap
    # torchtitan: FSDP2 prefetch and DDP bucket hooks always run; no switch in its config
    assert fw["torchtitan"].dp_overlap_flags == ()


def test_deepspeed_zero1_gathers_after_the_step_whatever_the_plan_asks():
    p = problem("deepspeed")
    plan = Plan(tp=1, zero_stage=1, recompute="full")
    ctx = context(p)
    assert dp_overlaps(ctx, Config.of(plan, 64)) == (True, False)  # pp = 1: overlap_comm; the gather exposed
    est = evaluate(p, plan)
    prof = layer_table(ctx, Config.of(plan, 64)).placement.dp_cp
    n = rank_params(p)
    # exposed: the whole bf16 all-gather of the rank's parameters over the 64 GPUs, plus what of the
    # bf16 reduce-scatter the backward does not hide
    gather = all_gather_s(ctx.levels, prof, BF16 * n)
    assert gather <= est.time_breakdown_s["dp_comm"] <= gather + reduce_scatter_s(ctx.levels, prof, BF16 * n)
    # overlap_grad_reduce false (overlap_comm false): the reduce-scatter exposed too, to the byte
    off = evaluate(p, plan.model_copy(update={"overlap_grad_reduce": False}))
    assert off.fits
    assert off.time_breakdown_s["dp_comm"] == pytest.approx(gather + reduce_scatter_s(ctx.levels, prof, BF16 * n),
                                                             rel=0.02)
    cfg = json.loads(export_plan(p, off.plan, "deepspeed").text)
    assert cfg["zero_optimization"]["overlap_comm"] is False
    assert json.loads(export_plan(p, plan, "deepspeed").text)["zero_optimization"]["overlap_comm"] is True


def test_an_overlap_the_launcher_always_runs_cannot_be_turned_off():
    est = evaluate(problem("torchtitan"), Plan(tp=1, zero_stage=3, overlap_grad_reduce=False))
    assert not est.fits and any("no switch turns it off" in r for r in est.reasons)
    assert evaluate(problem("megatron"), Plan(tp=1, zero_stage=1, overlap_param_gather=False, recompute="full")).fits
    # DeepSpeed's ZeRO-1 gather runs exposed anyway: asking it off is the run it makes, priced the same
    ds = problem("deepspeed")
    on, off = (evaluate(ds, Plan(tp=1, zero_stage=1, recompute="full", overlap_param_gather=v)) for v in (True, False))
    assert off.fits and off.step_time_s == on.step_time_s
    assert not evaluate(ds, Plan(tp=1, zero_stage=3, recompute="full", overlap_param_gather=False)).fits


# ---- 2. reshard_after_forward ------------------------------------------------------------------------

def test_reshard_never_keeps_every_gathered_weight_and_drops_the_backward_gather():
    p = problem("torchtitan")
    always = evaluate(p, Plan(tp=1, zero_stage=3))
    never = evaluate(p, Plan(tp=1, zero_stage=3, reshard_after_forward="never"))
    assert "gathered_kept" not in always.memory_breakdown_gib
    # FSDP2 reshard_after_forward=False: every layer's bf16 weights stay gathered until its backward
    assert never.memory_breakdown_gib["gathered_kept"] == pytest.approx(2 * rank_params(p) / GIB)
    assert never.memory_breakdown_gib["gathered_kept"] == pytest.approx(2 * 8.03e9 / GIB, rel=1e-3)
    assert never.peak_memory_gib - always.peak_memory_gib == pytest.approx(2 * rank_params(p) / GIB)
    # traffic of one layer: the forward gathers its bf16 weights over the 64 ranks; "always" again in
    # the backward, "never" not; both reduce-scatter the fp32 gradients
    ctx = context(p)
    g64 = contiguous_profile(ctx.graph, 64)
    for plan, bwd_gathers in ((always.plan, 1), (never.plan, 0)):
        cfg = Config.of(plan, 64)
        pl = layer_table(ctx, cfg).placement
        ag, ag_bwd, rs = _zero3_layer_comm_s(ctx, cfg, pl, LAYER, 0.0)
        assert ag == pytest.approx(all_gather_s(ctx.levels, g64, 2 * LAYER))
        assert ag_bwd == pytest.approx(bwd_gathers * ag)
        assert rs == pytest.approx(reduce_scatter_s(ctx.levels, g64, 4 * LAYER))
    assert never.time_breakdown_s["zero3_comm"] < always.time_breakdown_s["zero3_comm"]


def test_torchtitan_default_reshard_policy_is_never_with_pipeline_parallelism():
    # torchtitan apply_fsdp: case "default": reshard_after_forward = not pp_enabled
    p = problem("torchtitan")
    pp1 = evaluate(p, Plan(tp=1, pp=1, zero_stage=3))
    pp2 = evaluate(p, Plan(tp=1, pp=2, zero_stage=3))
    pp2_always = evaluate(p, Plan(tp=1, pp=2, zero_stage=3, reshard_after_forward="always"))
    assert "gathered_kept" not in pp1.memory_breakdown_gib and "gathered_kept" not in pp2_always.memory_breakdown_gib
    stage = pp2.stages[1]
    per_param = 2.0  # bf16 gathered
    params = stage.memory_gib["weights"] * GIB / (4 / 32)  # fp32 shards over 32 data-parallel ranks
    assert stage.memory_gib["gathered_kept"] == pytest.approx(per_param * params / GIB)
    text = export_plan(p, pp2.plan, "torchtitan").text
    assert 'fsdp_reshard_after_forward = "default"' in text
    assert 'fsdp_reshard_after_forward = "always"' in export_plan(p, pp2_always.plan, "torchtitan").text


def test_hpz_secondary_shard_gathers_inside_the_node():
    # ZeRO++ hpZ (zero_hpz_partition_size 8): 1/8 of the bf16 weights kept, the backward gather over
    # the 8 GPUs of one node (NVLink) instead of the 64
    p = problem("deepspeed")
    plan = Plan(tp=1, zero_stage=3, reshard_after_forward=8)
    est = evaluate(p, plan)
    assert est.fits, est.reasons
    assert est.memory_breakdown_gib["gathered_kept"] == pytest.approx(2 * rank_params(p) / 8 / GIB)
    ctx = context(p)
    cfg = Config.of(plan, 64)
    ag, ag_bwd, _ = _zero3_layer_comm_s(ctx, cfg, layer_table(ctx, cfg).placement, LAYER, 0.0)
    node = contiguous_profile(ctx.graph, 8)
    assert ag_bwd == pytest.approx(all_gather_s(ctx.levels, node, 2 * LAYER))
    lv = ctx.levels[0]  # NVLink: the ring formula B (G - 1) / (G W) plus its 7 steps' latency
    assert ag_bwd == pytest.approx(2 * LAYER * 7 / 8 / lv.bytes_per_s + 7 * lv.latency_s, rel=1e-6)
    assert ag_bwd < ag
    z = json.loads(export_plan(p, plan, "deepspeed").text)["zero_optimization"]
    assert z["zero_hpz_partition_size"] == 8
    # torchtitan's config has no int form; DeepSpeed has no "never"
    assert not evaluate(problem("torchtitan"), plan).fits
    assert not evaluate(p, Plan(tp=1, zero_stage=3, reshard_after_forward="never")).fits
    assert not evaluate(p, Plan(tp=1, zero_stage=1, reshard_after_forward=8)).fits  # ZeRO-3 only
    bad = evaluate(p, Plan(tp=1, zero_stage=3, reshard_after_forward=48))
    assert any("must divide" in r for r in bad.reasons)


# ---- 3. hierarchical sharding ------------------------------------------------------------------------

def test_split_profile_matches_the_groups_read_from_the_cluster():
    ctx = context(problem("torchtitan"))
    g = ctx.graph
    whole = contiguous_profile(g, 64)
    inner, outer = split_profile(whole, 8)
    for got, ranks in ((inner, np.arange(64).reshape(8, 8)),  # 8 consecutive ranks: one node
                       (outer, np.arange(64).reshape(8, 8).T)):  # one rank of each node
        want = g.group_profile(ranks)
        assert (got.size, got.members) == (want.size, want.members)


def test_hsdp_shards_within_a_node_and_all_reduces_across_replicas():
    p = problem("torchtitan")
    flat = evaluate(p, Plan(tp=1, zero_stage=3))
    hsdp = evaluate(p, Plan(tp=1, zero_stage=3, dp_replicate=8))
    assert hsdp.fits
    n = rank_params(p)
    # fp32 weights, fp32 gradients, two fp32 Adam moments: 16 B per parameter over 8 ranks, not 64
    for key, per in (("weights", 4), ("gradients", 4), ("optimizer_states", 8)):
        assert hsdp.memory_breakdown_gib[key] == pytest.approx(per * n / 8 / GIB)
        assert flat.memory_breakdown_gib[key] == pytest.approx(per * n / 64 / GIB)
    ctx = context(p)
    g = ctx.graph
    node, across = g.group_profile(np.arange(64).reshape(8, 8)), g.group_profile(np.arange(64).reshape(8, 8).T)
    cfg = Config.of(hsdp.plan, 64)
    ag, ag_bwd, rs = _zero3_layer_comm_s(ctx, cfg, layer_table(ctx, cfg).placement, LAYER, 0.0)
    assert ag == ag_bwd == pytest.approx(all_gather_s(ctx.levels, node, 2 * LAYER))
    # reduce-scatter of the fp32 gradients in the node, then the 1/8 shard all-reduced over the 8 nodes
    assert rs == pytest.approx(reduce_scatter_s(ctx.levels, node, 4 * LAYER)
                               + all_reduce_s(ctx.levels, across, 4 * LAYER / 8))
    text = export_plan(p, hsdp.plan, "torchtitan").text
    assert "data_parallel_replicate_degree = 8" in text and "data_parallel_shard_degree = 8" in text
    ds = json.loads(export_plan(problem("deepspeed"), Plan(tp=1, zero_stage=3, dp_replicate=4), "deepspeed").text)
    assert ds["zero_optimization"]["mics_shard_size"] == 16


def test_megatron_distributed_optimizer_instances():
    # --num-distributed-optimizer-instances 4 on 64 GPUs: fp32 master weights and two moments (12 B per
    # parameter) sharded over 16 ranks; fp32 gradients reduce-scattered in the 16-rank instance and the
    # 1/16 shard all-reduced over the 4 instances; the bf16 weights gathered in the instance
    p = problem("megatron")
    plan = Plan(tp=1, zero_stage=1, dp_replicate=4, overlap_grad_reduce=False, overlap_param_gather=False,
                recompute="full")
    est = evaluate(p, plan)
    assert est.fits, est.reasons
    n = rank_params(p)
    assert est.memory_breakdown_gib["optimizer_states"] == pytest.approx(12 * n / 16 / GIB)
    ctx = context(p)
    g = ctx.graph
    inst, across = g.group_profile(np.arange(64).reshape(4, 16)), g.group_profile(np.arange(64).reshape(4, 16).T)
    expected = (reduce_scatter_s(ctx.levels, inst, 4 * n) + all_reduce_s(ctx.levels, across, 4 * n / 16)
                + all_gather_s(ctx.levels, inst, 2 * n))
    assert est.time_breakdown_s["dp_comm"] == pytest.approx(expected, rel=0.02)
    assert "--num-distributed-optimizer-instances 4" in export_plan(p, plan, "megatron").text
    # the knob's predicate: a stage it does not shard that way, a count not dividing dp
    assert any("ZeRO stage 1 or 3, not 2" in r for r in evaluate(p, Plan(tp=1, zero_stage=2, dp_replicate=4)).reasons)
    # Megatron-FSDP's HSDP: the same flag beside --use-megatron-fsdp
    fsdp = export_plan(p, Plan(tp=1, zero_stage=3, dp_replicate=4), "megatron").text
    assert "--use-megatron-fsdp" in fsdp and "--num-distributed-optimizer-instances 4" in fsdp
    assert any("must divide dp" in r for r in evaluate(p, Plan(tp=1, zero_stage=1, dp_replicate=3)).reasons)
    assert not evaluate(problem("maxtext"), Plan(tp=1, zero_stage=3, dp_replicate=2)).fits


def test_defaults_leave_plans_as_they_were():
    p = problem("megatron")
    a = evaluate(p, Plan(tp=2, pp=2, zero_stage=1))
    b = evaluate(p, Plan(tp=2, pp=2, zero_stage=1, dp_replicate=1))
    assert a.step_time_s == b.step_time_s and a.peak_memory_gib == b.peak_memory_gib


# ---- search and validate -----------------------------------------------------------------------------

def test_search_plans_with_the_stated_knobs():
    sol = solve(problem("torchtitan", tp=1, pp=1, cp=1, dp_replicate=8, micro_batch_size=1), time_limit_s=30, top_k=0)
    assert sol.plan.dp_replicate == 8 and sol.plan.zero_stage == 3
    assert sol.estimate.memory_breakdown_gib["weights"] == pytest.approx(4 * rank_params(problem("torchtitan")) / 8 / GIB)
    sol = solve(problem("torchtitan", tp=1, pp=1, cp=1, reshard_after_forward="never", micro_batch_size=1),
                time_limit_s=30, top_k=0)
    assert sol.plan.reshard_after_forward == "never" and "gathered_kept" in sol.estimate.memory_breakdown_gib
    from autoshard.errors import InputError

    with pytest.raises(InputError, match="reshard_after_forward"):
        solve(problem("torchtitan", reshard_after_forward=8), time_limit_s=5, top_k=0)


def test_validate_rows_state_the_data_parallel_facts():
    knobs, notes = dp_knobs_of({"overlap_param_gather": False, "reshard_after_forward": "never", "dp_replicate": 4})
    assert knobs == {"overlap_param_gather": False, "reshard_after_forward": "never", "dp_replicate": 4}
    assert len(notes) == 3
    assert dp_knobs_of({"reshard_after_forward": "default"}) == ({}, [])  # torchtitan's word for its policy
    assert dp_knobs_of({}) == ({}, [])  # documented defaults: overlaps on, the framework's policy, 1
    for bad in ({"reshard_after_forward": "sometimes"}, {"reshard_after_forward": 1}, {"dp_replicate": 0}):
        with pytest.raises(ValueError):
            dp_knobs_of(bad)


def test_torchtitan_pipeline_reduces_fsdp_gradients_once_per_step():
    # torch.distributed.pipelining (stage.py): every micro-batch's backward with
    # set_requires_gradient_sync(False) / set_reshard_after_backward(False), FSDP's post_backward once
    # after the last: gradients accumulate unsharded in reduce_dtype (fp32: 4 B per parameter, bf16
    # reduce: 2 B), one exposed reduce-scatter per step; with reshard "never" (torchtitan's PP default)
    # the weights are gathered once, under the first forward, and no layer gathers or reduces again
    from autoshard.cost import zero3_step_sync

    p = problem("torchtitan")
    plan = Plan(tp=1, pp=2, zero_stage=3, recompute="full")
    est = evaluate(p, plan)
    ctx = context(p)
    cfg = Config.of(est.plan, 32)
    assert zero3_step_sync(ctx.framework, cfg) and not zero3_step_sync(ctx.framework, Config.of(Plan(zero_stage=3), 64))
    stage = est.stages[0]
    params = stage.memory_gib["weights"] * GIB * 32 / 4  # fp32 shards over the 32 data-parallel ranks
    assert stage.memory_gib["unsharded_gradients"] == pytest.approx(4 * params / GIB)
    assert stage.memory_gib["gathered_kept"] == pytest.approx(2 * params / GIB)
    assert est.time_breakdown_s.get("zero3_comm", 0.0) == 0.0
    group = contiguous_profile(ctx.graph, 32)  # dp innermost: 32 consecutive ranks, four nodes
    rs = reduce_scatter_s(ctx.levels, group, 4 * params)
    ag = all_gather_s(ctx.levels, group, 2 * params)
    assert rs <= est.time_breakdown_s["dp_comm"] <= rs + ag  # the reduction exposed, the gather under a forward
    bf16 = load_problem({**p.model_dump(exclude={"search"}), "training": {**p.training.model_dump(), "main_grads": "bf16"}})
    assert evaluate(bf16, plan).stages[0].memory_gib["unsharded_gradients"] == pytest.approx(2 * params / GIB)
    # AutoModel's pipeline code was not read for it: its ZeRO-3 stages reduce per micro-batch as before
    assert not zero3_step_sync(profiles()["automodel"], cfg)


def test_zero3_overlaps_turned_off_where_the_launcher_has_the_switch():
    # Megatron-FSDP without --overlap-param-gather / --overlap-grad-reduce: every layer's all-gathers
    # and reduce-scatter exposed, to the second; DeepSpeed ZeRO-3 overlap_comm false: the reduction
    p = problem("megatron")
    on = evaluate(p, Plan(tp=1, zero_stage=3, recompute="full"))
    off = evaluate(p, Plan(tp=1, zero_stage=3, recompute="full", overlap_param_gather=False, overlap_grad_reduce=False))
    ctx = context(p)
    g64 = contiguous_profile(ctx.graph, 64)
    per_layer = 2 * all_gather_s(ctx.levels, g64, 2 * LAYER) + reduce_scatter_s(ctx.levels, g64, 4 * LAYER)
    mb = off.num_microbatches
    # 32 layers exposed per micro-batch (the embedding and LM head are not ZeRO-3 units here)
    assert off.time_breakdown_s["zero3_comm"] == pytest.approx(32 * mb * per_layer)
    assert off.time_breakdown_s["zero3_comm"] > 3 * on.time_breakdown_s["zero3_comm"]
    text = export_plan(p, off.plan, "megatron").text
    assert "--overlap-param-gather" not in text and "--overlap-grad-reduce" not in text


def test_run_logs_read_the_sharding_facts(tmp_path):
    # torchtitan's mesh line with dp_replicate 8 x dp_shard 8 is HSDP; its TOML's fsdp_reshard_after_forward
    # "never" is the plan's; a Megatron log's num_distributed_optimizer_instances is dp_replicate
    from pathlib import Path

    from autoshard.artifacts import read_log, read_toml
    from autoshard.artifacts.runs import RunContext, measured_run

    src = Path(__file__).parent / "data" / "artifacts" / "torchtitan" / "selective-layer"
    log = tmp_path / "train.log"
    log.write_text((src / "train.log").read_text().replace("dp_replicate=1, dp_shard=64", "dp_replicate=8, dp_shard=8"))
    toml = tmp_path / "llama3_8b.toml"
    toml.write_text((src / "llama3_8b.toml").read_text().replace(
        "data_parallel_replicate_degree = 1\n", 'data_parallel_replicate_degree = 8\nfsdp_reshard_after_forward = "never"\n'))
    ctx = RunContext(model=load_problem({"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64},
                                         "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 64}}).model)
    run_log = read_log(log)
    ctx.configs[run_log.path] = read_toml(toml)
    plan = measured_run(run_log, ctx, 1).plan
    assert (plan.dp, plan.zero_stage, plan.dp_replicate, plan.reshard_after_forward) == (64, 3, 8, "never")
    meg = tmp_path / "gpt.log"
    text = (src.parent.parent / "megatron" / "gpt-7.5b.log").read_text()
    meg.write_text(text.replace("  use_distributed_optimizer ....................... False",
                                "  use_distributed_optimizer ....................... True\n"
                                "  num_distributed_optimizer_instances ............. 2"))
    run = measured_run(read_log(meg), RunContext(gpu="a100-sxm-80gb", topology="dgx-a100-superpod"), 1)
    assert (run.plan.zero_stage, run.plan.dp_replicate) == (1, 2)
    assert "--num-distributed-optimizer-instances 2" in export_plan(run.problem, run.plan, "megatron").text


def test_completed_plans_keep_the_runs_sharding():
    # A run that publishes no recompute has it chosen by the solver with its degrees fixed: the
    # sharding facts it states (HSDP replicas, reshard "never") are planned with, not only copied over
    import dataclasses

    from autoshard.validate import Case, completed_plan

    p = problem("torchtitan")
    # 16 replicas of a 2-rank shard: 16 B per parameter over 2 ranks, so some layers must be fully
    # recomputed to fit (none or selective everywhere need 88 GiB of 78; sharded 32 ways none fits in 60)
    plan = Plan(tp=1, pp=2, dp=32, zero_stage=3, dp_replicate=16, reshard_after_forward="never")
    assert evaluate(p, plan.model_copy(update={"dp_replicate": 1})).fits
    case = Case("x", "g", "h100", "bf16", 64, p, plan, 1.0, (), False)
    done = completed_plan(case)
    assert (done.dp_replicate, done.reshard_after_forward) == (16, "never") and done.recompute != "none"
    est = evaluate(p, done)
    assert est.fits and est.memory_breakdown_gib["gathered_kept"] > 0
    assert completed_plan(dataclasses.replace(case, recompute_published=True)) == plan

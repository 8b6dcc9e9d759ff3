"""Per-layer (scoped) CUDA graphs, `Plan.cuda_graph_scope` (Megatron --cuda-graph-impl transformer_engine
--cuda-graph-scope ...): schema, Megatron's validity rules, pricing and the runs format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from autoshard import evaluate, load_problem
from autoshard.cost import Config, context, with_modes
from autoshard.cost.constants import EAGER_LAUNCH_HOST_S
from autoshard.cost.context import config_reasons
from autoshard.cost.kernels import Shapes, captured_launches, layer_kernels
from autoshard.cost.layers import layer_costs
from autoshard.cost.moe import moe_host_s
from autoshard.topology import place_axes
from autoshard.spec import Plan
from autoshard.validate.modern import modern_row_to_case
from published_cases import nemo_cuda_graph_ablation

ROOT = Path(__file__).resolve().parents[1]


def test_scope_is_canonical_and_follows_megatrons_rules():
    """transformer_config.py __post_init__ (Megatron-LM d98e8a64dd): moe and moe_router exclusive,
    moe_preprocess only with moe_router; the whole layer is an empty module list, so it stands alone."""
    assert Plan(cuda_graph_scope=["moe_preprocess", "moe_router", "attn", "attn"]).cuda_graph_scope == [
        "attn", "moe_router", "moe_preprocess"]
    assert Plan().cuda_graph_scope == [] and "graphs=" not in Plan().short()
    assert "graphs=attn+mlp" in Plan(cuda_graph_scope=["mlp", "attn"]).short()
    for bad in (["moe", "moe_router"], ["moe_preprocess"], ["layer", "attn"], ["full_iteration"]):
        with pytest.raises(ValidationError):
            Plan(cuda_graph_scope=bad)


def _mixtral(capacity: float | None = None, framework: str = "megatron"):
    training = {"seq_len": 4096, "global_batch_size": 256, "moe_capacity_factor": capacity}
    return load_problem({"model": "mixtral-8x7b", "framework": framework, "training": training,
                         "cluster": {"gpu": "h100-sxm", "num_gpus": 64}})


def _reasons(problem, plan) -> str:
    return " | ".join(str(r) for r in config_reasons(problem, plan)[1])


def test_scope_refused_where_megatron_refuses_it():
    plan = Plan(tp=2, pp=2, ep=8, zero_stage=1)
    # "moe cuda graph is only supported with drop-padding MoE" (dropless: dynamic shapes)
    assert "drop-and-pad" in _reasons(_mixtral(), plan.model_copy(update={"cuda_graph_scope": ["moe"]}))
    assert "drop-and-pad" in _reasons(_mixtral(), plan.model_copy(update={"cuda_graph_scope": ["layer"]}))
    assert _reasons(_mixtral(1.0), plan.model_copy(update={"cuda_graph_scope": ["moe"]})) == ""
    assert _reasons(_mixtral(), plan.model_copy(update={"cuda_graph_scope": ["attn", "moe_router"]})) == ""
    # every Mixtral layer is MoE: no dense MLP to capture
    assert "dense MLP" in _reasons(_mixtral(), plan.model_copy(update={"cuda_graph_scope": ["mlp"]}))
    # modules must be empty with cuda_graph_impl full_iteration
    both = plan.model_copy(update={"cuda_graph_scope": ["attn"], "cuda_graphs": True})
    assert "full-iteration" in _reasons(_mixtral(), both)
    # "full recompute is only supported with full iteration CUDA graph"
    full = plan.model_copy(update={"cuda_graph_scope": ["attn"], "recompute": "full"})
    assert "full recompute" in _reasons(_mixtral(), full)
    # "moe recompute is not supported with moe_router CUDA graph" (a module must not cover a graph)
    moe_rc = plan.model_copy(update={"cuda_graph_scope": ["moe_router"], "recompute": "moe"})
    assert "moe recompute" in _reasons(_mixtral(), moe_rc)
    assert _reasons(_mixtral(), moe_rc.model_copy(update={"recompute": "moe_act"})) == ""
    titan = Plan(tp=2, pp=2, zero_stage=3, cuda_graph_scope=["attn"])
    assert "cannot capture" in _reasons(_mixtral(framework="torchtitan"), titan)


def _small_dense():
    """A small dense model whose layers are host-bound (the issue's short-step case): 1024 hidden, TP 1."""
    model = {"name": "small", "num_hidden_layers": 12, "hidden_size": 1024, "intermediate_size": 4096,
             "num_attention_heads": 16, "vocab_size": 32000, "hidden_act": "silu", "model_type": "llama"}
    return load_problem({"model": model, "framework": "megatron",
                         "training": {"seq_len": 1024, "global_batch_size": 8},
                         "cluster": {"gpu": "h100-sxm", "num_gpus": 1}})


def _layer(problem, plan, kind="dense"):
    mode = plan.recompute if isinstance(plan.recompute, str) else "none"
    ctx = with_modes(context(problem), mode)
    dp, _ = config_reasons(problem, plan)
    cfg = Config.of(plan, dp)
    pl = place_axes(ctx.graph, cfg.placement, cfg.tp, cfg.cp, cfg.ep, cfg.dp, cfg.pp, cfg.etp)
    return ctx, cfg, layer_costs(ctx, cfg, pl, kind)[mode]


def test_captured_launches_replace_the_host_time_by_one_replay_per_graph():
    """Hand arithmetic on a host-bound layer: eager, the forward's host time is its counted launches x
    EAGER_LAUNCH_HOST_S less the GPU time that hides it; the whole-layer graph leaves one replay, which the
    GPU hides; attention alone leaves the MLP's launches and one replay. The parts (attention + MLP)
    add up to the layer's own count."""
    problem = _small_dense()
    ctx, cfg, eager = _layer(problem, Plan(micro_batch_size=1))
    sh = Shapes(ctx, cfg)
    fwd_k, bwd_k, _ = layer_kernels(ctx, cfg, sh, "dense")
    attn_f, attn_b, _ = layer_kernels(ctx, cfg, sh, "attention")
    mlp_f, mlp_b, _ = layer_kernels(ctx, cfg, sh, "mlp")
    assert (attn_f + mlp_f, attn_b + mlp_b) == (fwd_k, bwd_k)
    assert eager.fwd["host"] == pytest.approx(fwd_k * EAGER_LAUNCH_HOST_S - eager.fwd_s + eager.fwd["host"])
    assert eager.fwd["host"] > 0  # host-bound: the case graphs are for
    _, gcfg, whole = _layer(problem, Plan(micro_batch_size=1, cuda_graph_scope=["layer"]))
    assert captured_launches(ctx, gcfg, sh, "dense") == (fwd_k, bwd_k, 1)
    assert whole.fwd["host"] == 0.0 and whole.bwd["host"] == 0.0
    _, acfg, attn = _layer(problem, Plan(micro_batch_size=1, cuda_graph_scope=["attn"]))
    gpu_f = attn.fwd_s - attn.fwd["host"]
    assert attn.fwd["host"] == pytest.approx(max(0.0, (mlp_f + 1) * EAGER_LAUNCH_HOST_S - gpu_f))
    assert 0.0 <= attn.fwd["host"] < eager.fwd["host"]


def test_router_graphs_keep_the_moe_host_sync_and_experts():
    """moe_router + moe_preprocess capture the router alone: the host still waits for the token counts
    (transformer_layer.py _forward_mlp_partial_cudagraphs) and the experts run eagerly, so the layer keeps
    moe_layer_host_ms + moe_expert_host_ms per local expert (frameworks.yaml: 1.5 + 0.19 x 8 / 8 ms on
    Mixtral EP8); a full-iteration graph replays it all (0)."""
    plan = Plan(tp=2, pp=2, ep=8, zero_stage=1, cuda_graph_scope=["attn", "moe_router", "moe_preprocess"])
    problem = _mixtral()
    ctx = context(problem)
    dp, _ = config_reasons(problem, plan)
    assert moe_host_s(ctx, Config.of(plan, dp)) == pytest.approx(1.5e-3 + 0.19e-3 * 8 / 8)
    assert moe_host_s(ctx, Config.of(Plan(tp=2, pp=2, ep=8, zero_stage=1, cuda_graphs=True), dp)) == 0.0
    sh = Shapes(ctx, Config.of(plan, dp))
    cap_f, cap_b, graphs = captured_launches(ctx, Config.of(plan, dp), sh, "moe")
    attn_f, attn_b, _ = layer_kernels(ctx, Config.of(plan, dp), sh, "attention")
    # two graphs: attention; the pre-MLP norm, router GEMM and top-k (Mixtral has no shared expert)
    assert (cap_f, cap_b, graphs) == (attn_f + 3, attn_b + 2 + 2 + 1 + 1, 2)


def test_per_layer_graphs_against_nemos_measured_ablation():
    """NeMo's CUDA-graph ablation (docs/source/features/optimizations/cudagraphs.md, per-layer Transformer
    Engine graphs): GPT-3 20B on 16 GH200, TP 4, MBS 2, FP8, 750 -> 836 TFLOP/s, a step 0.897x as long.
    Its global batch is not stated; at 256 sequences whole-layer graphs price a step 0.80-0.95x as long,
    no faster than the full-iteration graph and no slower than eager."""
    problem = nemo_cuda_graph_ablation()
    eager = evaluate(problem, Plan(tp=4, dp=4, micro_batch_size=2))
    layer = evaluate(problem, Plan(tp=4, dp=4, micro_batch_size=2, cuda_graph_scope=["layer"]))
    full = evaluate(problem, Plan(tp=4, dp=4, micro_batch_size=2, cuda_graphs=True))
    assert layer.fits and 0.80 < layer.step_time_s / eager.step_time_s < 0.95
    assert full.step_time_s <= layer.step_time_s <= eager.step_time_s


def test_runs_format_reads_the_recipes_graph_scope():
    """validation/README.md: a Megatron row's framework_recipe `cuda_graphs` local / transformer_engine with
    `cuda_graph_scope` (+-joined) becomes Plan.cuda_graph_scope; local without a scope is the whole layer
    (Megatron-Bridge 25.09 enable_cuda_graph: whole TransformerLayer graphs)."""
    rows = {r["id"]: r for r in json.loads((ROOT / "validation" / "modern_runs_dev.json").read_text())}
    te = modern_row_to_case(rows["mbridge_2511_deepseekv3womtp_gb300_bf16_256gpu"])
    assert te.plan.cuda_graph_scope == ["moe_router", "moe_preprocess"] and not te.plan.cuda_graphs
    local = modern_row_to_case(rows["mbridge_2509_llama38b_b200_fp8_8gpu"])
    assert local.plan.cuda_graph_scope == ["layer"]
    full = modern_row_to_case(rows["mbridge_2608_gptoss120b_gb200_mxfp8_64gpu"])
    assert full.plan.cuda_graphs and full.plan.cuda_graph_scope == []
    own = dict(rows["mbridge_2509_llama38b_b200_fp8_8gpu"], cuda_graph_scope=["mlp", "attn"])  # the row's own wins
    assert modern_row_to_case(own).plan.cuda_graph_scope == ["attn", "mlp"]
    bad = dict(rows["mbridge_2509_llama38b_b200_fp8_8gpu"], cuda_graph_scope="attn+everything")
    assert "cuda_graph_scope 'everything'" in modern_row_to_case(bad).reason


def test_a_recompute_module_inside_a_graph_has_no_wrapper_host_time():
    """Megatron's recompute modules run a checkpoint wrapper from Python (frameworks.yaml
    recompute_module_host_ms, 0.25 ms a module); inside a per-layer graph it runs at capture only. The
    dense `mlp` module under an `mlp` graph loses exactly that time against the same module beside an
    `attn` graph (which leaves the MLP eager)."""
    problem = _small_dense()
    ctx, _, beside = _layer(problem, Plan(micro_batch_size=1, recompute="mlp", cuda_graph_scope=["attn"]))
    _, _, inside = _layer(problem, Plan(micro_batch_size=1, recompute="mlp", cuda_graph_scope=["mlp"]))
    assert ctx.framework.recompute_module_host_s == pytest.approx(0.25e-3)
    assert beside.bwd["recompute"] - inside.bwd["recompute"] == pytest.approx(0.25e-3)

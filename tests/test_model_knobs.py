"""Model-structure and per-module facts (issue 29 part 2): per-module precision, multi-token prediction,
narrower shared experts and Megatron's all-gather dispatcher, each priced, exported and read from the
validation formats, checked against independently known numbers (framework source, the model's
published parameter counts, hand-worked arithmetic)."""

from __future__ import annotations

import pytest

from autoshard.cost import Config, context, evaluate, layer_table
from autoshard.cost.kernels import Shapes, _gemm_s, layer_kernels
from autoshard.cost.layers import layer_costs
from autoshard.cost.params import flops_per_token_parts, layer_params, mamba_in_proj_width, total_params
from autoshard.errors import InputError
from autoshard.export import export_plan, model_family, titan_flavor
from autoshard.hf import model_from_hf_config, read_hf_config
from autoshard.loader import load_problem
from autoshard.solver import solve
from autoshard.spec import ModelSpec, Plan
from autoshard.topology import place_axes
from autoshard.validate.modern import modern_row_to_case

from tests.test_hf import DATA

MOE = {"num_hidden_layers": 8, "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 16,
       "num_key_value_heads": 4, "vocab_size": 32000, "num_experts": 64, "num_experts_per_tok": 8,
       "moe_intermediate_size": 1024, "num_shared_experts": 1, "first_k_dense_replace": 1}
DENSE = {"num_hidden_layers": 8, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_key_value_heads": 8, "vocab_size": 128256}
# One NVLink domain of 8 and a 50 GB/s network, at their nominal rates (efficiency 1), so that collective
# times can be worked by hand.
LEVELS = [{"name": "nvlink", "size": 8, "bandwidth_gb_per_s": 450, "latency_us": 2.0, "efficiency": 1.0},
          {"name": "ib", "size": 64, "bandwidth_gb_per_s": 50, "latency_us": 5.0, "efficiency": 1.0}]


def problem(model, precision="bf16", gpu="b200", num_gpus=8, levels=None, **training):
    return load_problem({"model": model, "training": {"seq_len": 4096, "global_batch_size": 64,
                                                      "precision": precision, **training},
                         "cluster": {"gpu": gpu, "num_gpus": num_gpus, **({"topology": levels} if levels else {})}})


def moe_layer(prob, plan):
    ctx = context(prob)
    return layer_table(ctx, Config.of(plan, plan.dp)).layers[("moe", "none")]


# ---- 1. per-module precision ----------------------------------------------------------------

def test_every_module_in_bf16_prices_an_fp8_run_as_bf16():
    """Brute force: an MXFP8 run that keeps attention, dense MLP, routed and shared experts in BF16 runs
    every linear GEMM in BF16 (the router and output layer are 16-bit in every recipe, core attention
    too), so its step time is the BF16 run's exactly and it keeps no low-precision weight copy."""
    plan = Plan(tp=1, pp=1, dp=8, ep=8, ep_overlap=False)
    bf16 = evaluate(problem(MOE, "bf16"), plan)
    allbf16 = evaluate(problem(MOE, "mxfp8", bf16_modules=["attention", "dense_mlp", "routed_experts",
                                                             "shared_experts"]), plan)
    fp8 = evaluate(problem(MOE, "mxfp8"), plan)
    assert allbf16.step_time_s == pytest.approx(bf16.step_time_s, rel=1e-12)
    assert allbf16.memory_breakdown_gib["weights"] == pytest.approx(bf16.memory_breakdown_gib["weights"], rel=1e-12)
    # the recipe's GEMMs are faster, so the knob did something (this small host-bound layer's step is not:
    # the all-to-all dispatcher pads each expert's rows for the FP8 GEMMs, cost.kernels.dispatch_stage_launches)
    assert fp8.time_breakdown_s["compute"] < bf16.time_breakdown_s["compute"]


def test_bf16_attention_with_mxfp8_experts_prices_attention_projections_at_the_bf16_rate():
    """Only the attention projections change: the layer's forward compute grows by exactly the
    projections' time at the BF16 rate less their time at the MXFP8 rate (with its quantization)."""

    plan = Plan(tp=1, pp=1, dp=8, ep=8, ep_overlap=False)
    base, mixed = problem(MOE, "mxfp8"), problem(MOE, "mxfp8", bf16_modules=["attention"])
    ctx = context(base)
    sh = Shapes(ctx, Config.of(plan, 8))
    T, h, d = sh.tokens, 2048, 128
    gemms = [(T, h, (16 + 2 * 4) * d), (T, 16 * d, h)]  # QKV (16 query + 2 x 4 KV heads) and output
    low = sum(_gemm_s(ctx, *g) for g in gemms)
    high = sum(_gemm_s(ctx, *g, ctx.hp_flops_per_s) for g in gemms)
    assert high > low
    delta = moe_layer(mixed, plan).fwd["compute"] - moe_layer(base, plan).fwd["compute"]
    assert delta == pytest.approx(high - low, rel=1e-9)


def test_bf16_routed_experts_drop_their_share_of_the_weight_copies():
    """Weight copies scale with the low-precision share of the linear weights: with routed experts in
    BF16 only the attention, dense and shared-expert weights keep MXFP8 copies (hand-counted)."""
    prob = problem(MOE, "mxfp8", bf16_modules=["routed_experts"])
    full = context(problem(MOE, "mxfp8")).weight_copy_bytes_per_param
    h, L, moe_layers = 2048, 8, 7
    attn = L * h * 128 * (2 * 16 + 2 * 4)
    dense = 1 * 3 * h * 8192
    routed = moe_layers * 64 * 3 * h * 1024
    shared = moe_layers * 3 * h * 1024
    share = (attn + dense + shared) / (attn + dense + routed + shared)
    assert context(prob).weight_copy_bytes_per_param == pytest.approx(full * share, rel=1e-12)


def test_first_last_layers_in_bf16_blend_the_gemm_rate_and_export_megatron_flags():
    """Megatron --first-last-layers-bf16 with 1 leading and 3 trailing of 8 layers: half the layers'
    GEMMs at the BF16 rate, the FLOP-weighted harmonic mean 1 / (0.5 / bf16 + 0.5 / fp8)."""
    prob = problem(DENSE, "fp8-current", bf16_layers_at_start=1, bf16_layers_at_end=3)
    ctx, ref = context(prob), context(problem(DENSE, "fp8-current"))
    assert ctx.mm_flops_per_s == pytest.approx(1 / (0.5 / ref.hp_flops_per_s + 0.5 / ref.mm_flops_per_s), rel=1e-12)
    assert ctx.quant_bytes[0] == pytest.approx(0.5 * ref.quant_bytes[0], rel=1e-12)
    text = export_plan(prob, Plan(tp=1, pp=1, dp=8), "megatron").text
    # TransformerConfig.first_last_layers_bf16 / num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16
    # (Megatron-LM d98e8a64dd; the counts default to 1, so both are written)
    assert "--first-last-layers-bf16" in text
    assert "--num-layers-at-start-in-bf16 1" in text and "--num-layers-at-end-in-bf16 3" in text
    assert "first-last-layers" not in export_plan(problem(DENSE, "fp8-current"), Plan(tp=1, pp=1, dp=8),
                                                  "megatron").text


def test_bf16_modules_without_megatron_flag_warn_and_bad_layer_counts_are_refused():
    prob = problem(MOE, "mxfp8", bf16_modules=["attention", "attention"])
    assert prob.training.bf16_modules == ("attention",)
    warnings = export_plan(prob, Plan(tp=1, pp=1, dp=8, ep=8), "megatron").warnings
    assert any("attention planned in BF16" in w for w in warnings)
    with pytest.raises(InputError, match="bf16_layers_at_start"):
        problem(DENSE, "fp8-current", bf16_layers_at_start=5, bf16_layers_at_end=4)
    with pytest.raises(InputError, match="bf16_modules"):
        problem(DENSE, "fp8-current", bf16_modules=["output_head"])


# ---- 2. multi-token prediction ----------------------------------------------------------------

def test_deepseek_v3_mtp_module_has_its_published_parameter_count():
    """DeepSeek-V3 README_WEIGHTS.md: the MTP module has 11.5B unique parameters (excluding the shared
    embedding and output head). The last stage holds them on top of the head: one MoE layer, eh_proj
    (2 x 7168 -> 7168) and three norms."""
    m = model_from_hf_config(DATA / "DeepSeek-V3.json")
    assert m.num_nextn_predict_layers == 1
    prob = load_problem({"model": m.model_dump(), "training": {"seq_len": 4096, "global_batch_size": 64},
                         "cluster": {"gpu": "h100-sxm", "num_gpus": 8}})
    no_mtp = load_problem({"model": m.model_dump() | {"num_nextn_predict_layers": 0},
                           "training": {"seq_len": 4096, "global_batch_size": 64},
                           "cluster": {"gpu": "h100-sxm", "num_gpus": 8}})
    plan = Plan(tp=1, pp=1, dp=8, ep=8, ep_overlap=False)
    cfg = Config.of(plan, 8)
    extra = layer_table(context(prob), cfg).head.params - layer_table(context(no_mtp), cfg).head.params
    full_layer = layer_params(m, "moe")[0]
    h = 7168
    # per GPU: routed experts over ep 8, everything else whole
    experts = 256 * 3 * h * 2048
    assert extra == pytest.approx(full_layer - experts + experts / 8 + 2 * h * h + 3 * h, rel=1e-12)
    assert full_layer + 2 * h * h + 3 * h == pytest.approx(11.5e9, rel=0.01)


def test_mtp_adds_a_layer_projection_and_output_pass_on_the_last_stage_only():
    """Hand-worked FLOPs: one MTP depth adds to the last stage's head the FLOPs of one layer of the
    model's last kind, eh_proj (3 x 2 T 2h h) and the output layer's pass (3 x 2 T h V); the first stage is
    unchanged and the exported Megatron layout puts the MTP layer (`m`) before the loss."""
    with_mtp, without = problem(MOE | {"num_nextn_predict_layers": 1}), problem(MOE)
    plan = Plan(tp=1, pp=2, dp=4, ep=4, ep_overlap=False)
    cfg = Config.of(plan, 4)
    ctx = context(with_mtp)
    a, b = layer_table(ctx, cfg), layer_table(context(without), cfg)
    T, h, V = 4096, 2048, 32000
    pl = place_axes(ctx.graph, cfg.placement, cfg.tp, cfg.cp, cfg.ep, cfg.dp, cfg.pp, cfg.etp)
    layer = layer_costs(ctx, cfg, pl, "moe")["none"]
    assert a.head.base_flops - b.head.base_flops == pytest.approx(
        layer.base_flops + 3 * 2 * T * 2 * h * h + 3 * 2 * T * h * V, rel=1e-12)
    assert a.embed.total_s == b.embed.total_s
    ea, eb = evaluate(with_mtp, plan), evaluate(without, plan)
    assert ea.stages[-1].peak_memory_gib > eb.stages[-1].peak_memory_gib
    assert ea.step_time_s > eb.step_time_s
    text = export_plan(with_mtp, Plan(tp=1, pp=2, dp=4, ep=4, stage_layers=[4, 4]), "megatron").text
    assert "--mtp-num-layers 1" in text
    assert "--mtp-num-layers" not in export_plan(without, Plan(tp=1, pp=2, dp=4, ep=4), "megatron").text


# ---- 3. narrower shared experts, all-gather dispatcher ------------------------------------------

def test_shared_expert_width_prices_its_own_mlp():
    """A shared expert of width 3000 (not a multiple of the 1024 expert width): the layer holds
    3 x h x 3000 shared weights and computes 2 x 3 x T x h x 3000 shared-MLP FLOPs per forward."""
    narrow = MOE | {"shared_expert_intermediate_size": 3000}
    h, T = 2048, 4096

    wide, thin = ModelSpec(**MOE), ModelSpec(**narrow)
    assert layer_params(thin, "moe")[0] - layer_params(wide, "moe")[0] == 3 * h * (3000 - 1024)
    plan = Plan(tp=1, pp=1, dp=8, ep=8, ep_overlap=False)
    da = moe_layer(problem(narrow), plan).base_flops - moe_layer(problem(MOE), plan).base_flops
    assert da == pytest.approx(3 * 2 * T * h * 3 * (3000 - 1024), rel=1e-12)
    text = export_plan(problem(narrow), plan, "megatron").text
    assert "--moe-shared-expert-intermediate-size 3000" in text


def test_allgather_dispatcher_moves_every_token_of_the_ep_group():
    """Megatron's MoEAllGatherTokenDispatcher: each of 8 ranks in one NVLink domain gathers the 8 x T
    hidden states (bf16) and reduce-scatters the outputs: per pass 2 rings of 7 steps, each step moving
    T h 2 bytes at 450 GB/s and paying 2 us: 2 x (7 x 2 T h / 450e9 + 7 x 2e-6) s."""
    plan = Plan(tp=1, pp=1, dp=8, ep=8, ep_overlap=False, moe_dispatcher="allgather")
    prob = problem(MOE, levels=LEVELS, gpu="h100-sxm")
    T, h = 4096, 2048
    expected = 2 * (7 * 2 * T * h / 450e9 + 7 * 2e-6)
    layer = moe_layer(prob, plan)
    assert layer.fwd["ep_comm"] == pytest.approx(expected, rel=1e-9)
    assert layer.bwd["ep_comm"] == pytest.approx(expected, rel=1e-9)
    text = export_plan(prob, plan, "megatron").text
    assert "--moe-token-dispatcher-type allgather" in text
    # the solver plans it where the search names it

    got = solve(load_problem({"model": MOE, "training": {"seq_len": 4096, "global_batch_size": 64},
                              "cluster": {"gpu": "h100-sxm", "num_gpus": 8, "topology": LEVELS},
                              "search": {"moe_dispatcher": "allgather", "ep": 8, "tp": 1, "pp": 1}}))
    assert got.plan.moe_dispatcher == "allgather"


# ---- validation formats -----------------------------------------------------------------------

def test_validation_rows_carry_the_new_facts():
    row = {"id": "knobs_row", "source": "test, hand-made", "model": "m", "layers": 8, "hidden": 2048, "ffn": 8192,
           "heads": 16, "kv_heads": 4, "vocab": 32000, "seq_len": 4096, "moe_experts": 64, "moe_top_k": 8,
           "moe_ffn": 1024, "moe_shared_experts": 1, "moe_shared_ffn": 3000, "first_k_dense": 1, "mtp_layers": 1,
           "bf16_modules": ["attention"], "bf16_layers_at_start": 1, "bf16_layers_at_end": 1,
           "moe_dispatcher": "allgather", "gpu": "B200", "gpu_count": 8, "nvlink_domain_gpus": 8,
           "precision": "MXFP8", "tp": 1, "pp": 1, "ep": 8, "dp": 8, "micro_batch": 1, "global_batch_seqs": 64,
           "step_time_s": 1.0}
    case = modern_row_to_case(row)
    m, t = case.problem.model, case.problem.training
    assert (m.num_nextn_predict_layers, m.shared_ffn) == (1, 3000)
    assert (t.bf16_modules, t.bf16_layers_at_start, t.bf16_layers_at_end) == (("attention",), 1, 1)
    assert case.plan.moe_dispatcher == "allgather"


# ---- 4. hybrid Mamba2 / attention models, squared ReLU ---------------------------------------------

NEMOTRON_H_8B = DATA / "Nemotron-H-8B-Base-8K.json"


def test_nemotron_h_8b_from_its_config_has_the_checkpoints_parameter_count():
    """nvidia/Nemotron-H-8B-Base-8K: 24 Mamba2, 4 attention and 24 squared-ReLU MLP blocks; its
    checkpoint holds 8,100,852,736 parameters (the sum of its tensors' shapes; in_proj 18560 x 4096 =
    (2 x 8192 + 2 x 8 x 128 + 128) x 4096)."""

    m = model_from_hf_config(NEMOTRON_H_8B)
    assert (m.num_mamba_layers, m.num_attention_layers, m.num_dense_layers) == (24, 4, 24)
    assert m.hidden_act == "relu2" and not m.gated  # mlp_hidden_act, read before the Mamba mixer's silu
    assert mamba_in_proj_width(m) == 18560
    assert total_params(m) == 8_100_852_736


def test_mamba_block_flops_are_megatrons_estimate():
    """Megatron-LM training.py mamba_layer_flops (d98e8a64dd), forward: 2 T h (2 d_in + 2 G N + heads)
    (in_proj) + 7 T d_in N (scan) + 2 T d_in h (out_proj), with d_in = 2h; the layer table prices three
    passes. An attention block's FLOPs are attention alone, an MLP block's the 2-matrix squared-ReLU MLP."""
    prob = load_problem({"model": {"hf_config": str(NEMOTRON_H_8B)},
                         "training": {"seq_len": 8192, "global_batch_size": 64},
                         "cluster": {"gpu": "h100-sxm", "num_gpus": 8}})
    plan = Plan(tp=1, pp=1, dp=8)
    table = layer_table(context(prob), Config.of(plan, 8)).layers
    T, h, d_in, N, G, heads = 8192, 4096, 8192, 128, 8, 128
    megatron = 2 * T * h * (2 * d_in + 2 * G * N + heads) + 7 * T * d_in * N + 2 * T * d_in * h
    assert table[("mamba", "none")].base_flops == pytest.approx(3 * megatron, rel=1e-12)
    assert table[("mlp", "none")].base_flops == pytest.approx(3 * 2 * T * h * 21504 * 2, rel=1e-12)
    qkvo = 2 * T * h * (32 + 2 * 8 + 32) * 128
    core = 2 * T * T * 32 * 256 * 0.5  # causal QK^T and PV
    assert table[("attention", "none")].base_flops == pytest.approx(3 * (qkvo + core), rel=1e-12)
    est = evaluate(prob, Plan(tp=2, pp=1, dp=4))
    assert est.fits and 0.2 < est.mfu < 0.7, est.reasons


def test_hybrid_blocks_count_their_own_kernel_launches():
    """`layer_kernels` counts a hybrid block's launches from its structure (hand-counted, tp 1, cp 1,
    FlashAttention): a Mamba2 block launches its norm, in_proj and out_proj, the conv1d, the five SSD
    scan kernels and the gated norm (mamba_ssm ssd_combined.py _mamba_chunk_scan_combined_fwd), and its
    residual: 1 + 2 + 7 + 1 = 11 forward; backward each GEMM twice, the norm twice, the conv1d's, the
    scan's 15 (4 recomputed + 11 gradient kernels) and the gated norm's, the residual, the norm weight's
    accumulation: 4 + 2 + 17 + 1 + 1 = 25. An attention block: norm, QKV, the attention call, proj,
    residual = 5 forward; an MLP block: norm, fc1, activation, fc2, residual = 5. A transformer layer
    of a dense model keeps its two norms and residuals: 2 + 4 GEMMs + 1 + 1 + 2 = 10 forward and
    8 + 4 + 2 + 1 + 2 + 2 = 19 backward."""
    prob = load_problem({"model": {"hf_config": str(NEMOTRON_H_8B)},
                         "training": {"seq_len": 8192, "global_batch_size": 64},
                         "cluster": {"gpu": "h100-sxm", "num_gpus": 8}})
    ctx, cfg = context(prob), Config.of(Plan(tp=1, pp=1, dp=8), 8)
    sh = Shapes(ctx, cfg)
    assert layer_kernels(ctx, cfg, sh, "mamba") == (11, 25, 0)
    assert layer_kernels(ctx, cfg, sh, "attention") == (5, 2 * 2 + 2 + 2 + 1 + 1, 1)
    assert layer_kernels(ctx, cfg, sh, "mlp") == (5, 2 * 2 + 2 + 1 + 1 + 1, 0)
    dense = context(problem(DENSE))
    assert layer_kernels(dense, cfg, Shapes(dense, cfg), "dense") == (10, 19, 1)


def test_hybrid_export_and_validation_row():
    prob = load_problem({"model": {"hf_config": str(NEMOTRON_H_8B)},
                         "training": {"seq_len": 8192, "global_batch_size": 64},
                         "cluster": {"gpu": "h100-sxm", "num_gpus": 16}})
    out = export_plan(prob, Plan(tp=2, pp=2, dp=4, stage_layers=[26, 26]), "megatron")
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    # Megatron-LM arguments.py --hybrid-layer-pattern: `|` marks pipeline stage boundaries
    assert f"--hybrid-layer-pattern '{pattern[:26]}|{pattern[26:]}'" in out.text
    for flag in ("--mamba-num-heads 128", "--mamba-head-dim 64", "--mamba-state-dim 128", "--mamba-num-groups 8",
                 "--squared-relu"):
        assert flag in out.text
    assert "--pipeline-model-parallel-layout" not in out.text
    titan = export_plan(prob, Plan(tp=2, pp=2, dp=4), "torchtitan").warnings  # no Mamba2 there: said, not hidden
    assert any("Megatron-only" in w for w in titan)
    row = {"id": "hybrid_row", "source": "test, hand-made", "model": "nemotron-h-8b", "layers": 52, "hidden": 4096,
           "ffn": 21504, "heads": 32, "kv_heads": 8, "head_dim": 128, "vocab": 131072, "seq_len": 8192,
           "hidden_act": "relu2", "mamba_layers": 24, "hybrid_override_pattern": pattern, "mamba_num_heads": 128,
           "gpu": "H100", "gpu_count": 8, "nvlink_domain_gpus": 8, "precision": "BF16", "tp": 1, "pp": 1, "dp": 8,
           "micro_batch": 1, "global_batch_seqs": 64, "step_time_s": 1.0}
    case = modern_row_to_case(row)
    assert case.problem.model.layer_kinds().count("mamba") == 24
    skipped = modern_row_to_case({k: v for k, v in row.items() if k != "hybrid_override_pattern"})
    assert "hybrid_override_pattern" in str(skipped)
    with pytest.raises(InputError, match="hybrid_override_pattern"):
        model_from_hf_config(read_hf_config(NEMOTRON_H_8B) | {"hybrid_override_pattern": "M-M"})


# ---- 5. chunked / NoPE attention, packed documents ---------------------------------------------------

LLAMA4_TEXT = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 202048, "attention_chunk_size": 8192, "hidden_act": "silu"}}


def test_llama4_chunked_attention_on_its_rope_layers():
    """transformers' Llama4TextConfig: without `no_rope_layers`, every 4th layer is NoPE (global
    attention), the other 3 in 4 attend within chunks of attention_chunk_size. At 32k tokens a chunked
    layer attends 4 x 8192 x 8193 / 2 keys against 32768 x 32769 / 2 causal ones."""
    m = model_from_hf_config(LLAMA4_TEXT)
    assert (m.attention_chunk_size, m.chunked_attention_layers) == (8192, 0.75)
    chunked = 4 * 8192 * 8193 / (32768 * 32769)
    assert m.attention_key_share(32768) == pytest.approx(0.75 * chunked + 0.25, rel=1e-12)
    assert m.attention_key_share(8192) == 1.0  # a chunk as long as the sequence changes nothing
    explicit = model_from_hf_config({**LLAMA4_TEXT, "text_config": {**LLAMA4_TEXT["text_config"],
                                                                     "no_rope_layers": [1, 0] * 24}})
    assert explicit.chunked_attention_layers == 0.5
    prob = load_problem({"model": m.model_dump(), "training": {"seq_len": 32768, "global_batch_size": 16},
                         "cluster": {"gpu": "h100-sxm", "num_gpus": 8}})
    out = export_plan(prob, Plan(tp=8, pp=1, dp=1), "megatron")
    assert "--no-rope-freq 4" in out.text  # TransformerConfig.no_rope_freq: one NoPE layer in 4
    assert any("chunked attention" in w for w in out.warnings)


def test_packed_documents_price_attention_by_the_sum_of_squared_lengths():
    """Megatron-LM training.py attn_layer_flops: core attention 2 x sum(L_i^2) x h x p per layer forward
    (causal); 8 documents of 1024 in a 8192-token sequence: 8 x 1024^2 instead of 8192^2. Our share keeps
    the diagonal, 8 x D(D+1)/2 over s(s+1)/2: (1025/1024) x (8192/8193) of Megatron's figure."""

    dense = load_problem({"model": DENSE, "training": {"seq_len": 8192, "global_batch_size": 64},
                          "cluster": {"gpu": "h100-sxm", "num_gpus": 8}})
    packed = load_problem({"model": DENSE, "training": {"seq_len": 8192, "global_batch_size": 64,
                                                        "mean_document_tokens": 1024},
                           "cluster": {"gpu": "h100-sxm", "num_gpus": 8}})
    _, _, attn = flops_per_token_parts(packed.model, packed.training)
    L, a, d, s = 8, 32, 128, 8192
    megatron_per_token = 3 * L * 2 * (8 * 1024 ** 2) * a * d / s
    assert attn == pytest.approx(megatron_per_token * 1025 / 1024 * 8192 / 8193, rel=1e-12)
    _, _, full = flops_per_token_parts(dense.model, dense.training)
    assert full == pytest.approx(3 * L * 2 * s ** 2 * a * d / s, rel=1e-12)  # one document: Megatron's exactly
    plan = Plan(tp=1, pp=1, dp=8)
    core = [layer_table(context(p), Config.of(plan, 8)).layers[("dense", "none")] for p in (dense, packed)]
    assert core[1].base_flops < core[0].base_flops
    assert evaluate(packed, plan).step_time_s < evaluate(dense, plan).step_time_s
    text = export_plan(packed, plan, "megatron").text
    assert "--dataloader-inter-document-masking" in text  # cu_seqlens per document (arguments.py)
    assert "--dataloader-inter-document-masking" not in export_plan(dense, plan, "megatron").text


# ---- 6. families from config fields, never from the name ---------------------------------------------

def test_family_facts_come_from_model_type_and_rope_theta_not_the_name():
    """The exports' architecture facts follow the config's model_type and rope_theta: a DeepSeek-V3
    config under another name keeps its router flags (config.json scoring_func sigmoid, n_group 8,
    topk_group 4), a model named like it without its model_type gets none, and a Llama config's rotary
    base is its own rope_theta (Llama 2: 10000, Llama 3: 500000)."""

    dsv3 = model_from_hf_config(DATA / "DeepSeek-V3.json")
    renamed = dsv3.model_copy(update={"name": "my-moe"})
    assert model_family(renamed)["family"] == "deepseek-v3"
    assert model_family(dsv3.model_copy(update={"model_type": None, "name": "deepseek-v3"})) is None
    prob = load_problem({"model": renamed.model_dump(), "training": {"seq_len": 4096, "global_batch_size": 64},
                         "cluster": {"gpu": "h100-sxm", "num_gpus": 64}})
    text = export_plan(prob, Plan(tp=1, pp=8, dp=8, ep=8), "megatron").text
    assert "--moe-router-score-function sigmoid" in text and "--moe-router-num-groups 8" in text
    assert "--mtp-num-layers 1" in text  # config.json num_nextn_predict_layers
    l2 = load_problem({"model": "llama2-70b", "training": {"seq_len": 4096, "global_batch_size": 64},
                       "cluster": {"gpu": "h100-sxm", "num_gpus": 64}})
    l3 = model_from_hf_config(DATA / "Meta-Llama-3-8B.json")
    assert "--rotary-base 10000 " in export_plan(l2, Plan(tp=8, pp=1, dp=8), "megatron").text + " "
    assert l3.rope_theta == 500000 and model_family(l3)["rotary_base"] == 500000
    # torchtitan's llama3 8B flavor for the config read from Meta-Llama-3-8B, whatever its name
    assert titan_flavor(l3.model_copy(update={"name": "anything"})) == ("llama3", "8B")

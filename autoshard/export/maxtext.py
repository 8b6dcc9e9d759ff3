"""A MaxText config (base.yml keys)."""

from __future__ import annotations

import json
from typing import Any

from ..errors import InputError
from .common import _most_conservative, _recompute_counts
from .context import MAXTEXT_PARAM, _Ctx
from .jax import _ici_dcn, _jax_mesh
from .megatron import megatron_order
from .model_facts import model_family

# MaxText decoder_block per model family (maxtext common_types.DecoderBlockType).
MAXTEXT_DECODER = {"llama3": "llama2", "mixtral": "mixtral", "deepseek-v3": "deepseek",
                   "qwen3": "qwen3", "gpt3": "gpt3"}


def _yaml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_yaml_value(x) for x in v) + "]"
    raise TypeError(f"no YAML form for {type(v).__name__}")


def _maxtext(ctx: _Ctx) -> str:
    """A MaxText config (its base.yml key names), to pass as `python -m maxtext.train <this file>`: one
    part per technique (the model, the mesh, the batch and pipeline, rematerialization, precision)."""
    fam = model_family(ctx.model) or {}
    names, axis_size, inner_first = _jax_mesh(ctx)
    split = _ici_dcn(inner_first, ctx.gpus_per_node, ctx)
    cfg: dict[str, Any] = {}
    block = _maxtext_model(ctx, fam, cfg)
    _maxtext_mesh(ctx, split, cfg)
    _maxtext_batch(ctx, block, cfg)
    _maxtext_remat(ctx, cfg)
    _maxtext_precision(ctx, cfg)
    lines = [f"# {line}" for line in ctx.header()]
    lines.append("# MaxText config (src/maxtext/configs/base.yml key names): python -m maxtext.train <this file>")
    for w in ctx.warnings:
        lines.append(f"# warning: {w}")
    lines += [f"{k}: {_yaml_value(v)}" for k, v in cfg.items()]
    return "\n".join(lines) + "\n"


def _maxtext_model(ctx: _Ctx, fam: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The decoder block and the model's shape (MoE, MLA, MTP); returns the decoder block."""
    m = ctx.model
    block = MAXTEXT_DECODER.get(fam.get("family", ""))
    if block is None:
        block = "llama2" if m.gated else "gpt3"
        ctx.warn(f"no MaxText decoder_block known for {m.name}: {block!r} used (check norms, activations and "
                 "positions)")
    if block == "qwen3" and m.is_moe:
        block = "qwen3_moe"
    cfg["model_name"] = "default"
    cfg["decoder_block"] = block
    cfg["base_emb_dim"] = m.hidden_size
    cfg["base_num_query_heads"] = m.num_attention_heads
    cfg["base_num_kv_heads"] = m.kv_heads
    cfg["base_mlp_dim"] = m.intermediate_size
    cfg["base_num_decoder_layers"] = m.num_hidden_layers
    cfg["head_dim"] = m.head_size
    cfg["vocab_size"] = m.vocab_size
    cfg["mlp_activations"] = ["silu", "linear"] if m.gated else ["gelu"]
    cfg["logits_via_embedding"] = bool(m.tie_word_embeddings)
    cfg["enable_dropout"] = bool(m.dropout)
    cfg["dropout_rate"] = 0.1 if m.dropout else 0.0
    rotary = m.rope_theta or fam.get("rotary_base")  # the config's rope_theta first
    if rotary:
        cfg["rope_max_timescale"] = int(rotary) if float(rotary).is_integer() else rotary
    if fam.get("norm_epsilon"):
        cfg["normalization_layer_epsilon"] = fam["norm_epsilon"]
    if fam.get("family") == "qwen3":
        cfg["use_qk_norm"] = True
    if m.is_moe:
        cfg["num_experts"] = m.num_experts
        cfg["num_experts_per_tok"] = m.num_experts_per_tok
        cfg["base_moe_mlp_dim"] = m.expert_ffn
        if ctx.training.moe_capacity_factor is not None:
            cfg["capacity_factor"] = ctx.training.moe_capacity_factor
        if m.num_shared_experts:
            cfg["shared_experts"] = m.num_shared_experts
        if m.first_k_dense_replace:
            cfg["first_num_dense_layers"] = m.first_k_dense_replace
        if fam.get("family") == "deepseek-v3":
            cfg.update(routed_score_func="sigmoid", routed_bias=True, routed_bias_update_rate=1e-3,
                       routed_scaling_factor=2.5, n_routing_groups=8, topk_routing_group=4)
        if m.num_nextn_predict_layers:
            cfg["mtp_num_layers"] = m.num_nextn_predict_layers
    if m.is_mla:
        cfg["attention_type"] = "mla"
        if m.q_lora_rank is not None:
            cfg["q_lora_rank"] = m.q_lora_rank
        cfg.update(kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_nope_head_dim,
                   qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim)
    return block


def _maxtext_mesh(ctx: _Ctx, split: dict[str, tuple[int, int]], cfg: dict[str, Any]) -> None:
    """ici_* / dcn_* parallelism per mesh axis and the slice count."""
    p = ctx.plan
    r = p.dp_replicate if p.zero_stage == 3 else 1
    if r > 1:  # HSDP: the replicas on the outer `data` axis, the shards on `fsdp` (frameworks.yaml maxtext)
        ici, dcn = split.get("fsdp", (1, 1))
        if dcn % r == 0:
            split = {**split, "fsdp": (ici, dcn // r), "data": (1, r)}
        elif (ici * dcn) % r == 0 and r % dcn == 0:
            split = {**split, "fsdp": (ici * dcn // r, 1), "data": (r // dcn, dcn)}
        else:
            ctx.warn(f"dp_replicate {r} does not divide the fsdp axis's {ici} x {dcn} (ici x dcn): the weights "
                     "are sharded over all of it")
    ici_total = 1
    for name in ("data", "fsdp", "stage", "context", "expert", "tensor"):
        ici, dcn = split.get(name, (1, 1))
        cfg[f"ici_{MAXTEXT_PARAM[name]}_parallelism"] = ici
        ici_total *= ici
    for name in ("data", "fsdp", "stage", "context", "expert", "tensor"):
        ici, dcn = split.get(name, (1, 1))
        cfg[f"dcn_{MAXTEXT_PARAM[name]}_parallelism"] = dcn
    cfg["num_slices"] = ctx.world // ici_total
    if megatron_order(p) != "tp-cp-ep-dp-pp" and p.pp > 1:
        ctx.warn(f"placement {p.placement}: MaxText orders its mesh by mesh_axes (data, stage, fsdp, context, "
                 "tensor, expert) within and across slices; the plan's rank order is not kept")


def _maxtext_batch(ctx: _Ctx, block: str, cfg: dict[str, Any]) -> None:
    """Sequence length, per-device batch, gradient accumulation, and the pipeline (stages, repeats,
    micro-batches, layers pipelined)."""
    p, m, t = ctx.plan, ctx.model, ctx.training
    cfg["max_target_length"] = t.seq_len
    if p.pp > 1:
        per_device = t.global_batch_size / ctx.world
        cfg["num_pipeline_microbatches"] = ctx.microbatches
        chunks = p.pp * p.vpp
        # MaxText pipelines the MoE layers of a deepseek block and every layer otherwise
        # (configs/types.py); the product stages x repeats x layers/stage must equal that count.
        pipelined = m.num_moe_layers if block == "deepseek" else m.num_hidden_layers
        per_stage = pipelined // chunks
        if per_stage == 0:
            raise InputError(f"MaxText cannot pipeline {pipelined} layers over pp*vpp = {chunks} stages",
                             field="plan.pp")
        cfg["num_layers_per_pipeline_stage"] = per_stage
        cfg["num_pipeline_repeats"] = p.vpp
        if per_stage * chunks != pipelined or not ctx.even or block == "deepseek":
            cfg["pipeline_parallel_layers"] = per_stage * chunks
            left = m.num_hidden_layers - per_stage * chunks
            if left:
                ctx.warn(f"MaxText runs one layer count per stage: {per_stage * chunks} layers pipelined "
                         f"({per_stage} per stage x {p.pp} stages x {p.vpp} repeats), the other {left} run outside "
                         "the pipeline with the stage axis acting as data parallelism (planned split "
                         + ",".join(map(str, ctx.stages)) + ")")
        if ctx.microbatches % p.pp:
            ctx.warn(f"MaxText needs num_pipeline_microbatches ({ctx.microbatches}) divisible by the "
                     f"stage count ({p.pp}): it will reject this config")
        if p.schedule != "gpipe":
            ctx.warn(f"schedule {p.schedule} is not expressible: MaxText's SPMD pipeline runs a GPipe-style "
                     "circular schedule (more in-flight activations than 1F1B)")
        gas = 1
    else:
        per_device = p.micro_batch_size * ctx.dp / ctx.world
        gas = ctx.microbatches
    cfg["per_device_batch_size"] = int(per_device) if per_device == int(per_device) else per_device
    cfg["gradient_accumulation_steps"] = gas


# MaxText's named tensors of a dense layer (checkpoint_name in layers/models.py, attentions.py, linears.py;
# base.yml at 8e55ab1 of 2024-12-09 and src/maxtext/configs/base.yml at e591f30 of 2026-08-22) that the recompute modules it can express re-run ('remat') rather than keep
# ('device') under remat_policy: custom; every tensor it does not name (the norms' outputs, the activation's)
# is re-run too. decoder_layer_input is the checkpoint each layer's recomputation starts from.
MAXTEXT_REMAT_NAMES = {"context": ("core_attn",), "mlpwi": ("mlp", "mlp_up"), "mlpwi_0": ("mlp", "mlp_up"),
                       "mlpwi_1": ("mlp", "mlp_up"), "mlpwo": ("mlp",), "query_proj": (), "key_proj": (),
                       "value_proj": (), "kv_proj": (), "qkv_proj": (), "out_proj": ()}


def _maxtext_custom_remat(ctx: _Ctx, cfg: dict[str, Any]) -> bool:
    """remat_policy: custom for a plan that runs one set of recompute modules on every layer, each of
    which MaxText names (core_attn, mlp, mlp_up, layernorm) on a dense model without MLA: its tensors at
    'remat', the rest at 'device'. False where the plan's recompute is no such set."""
    if ctx.model.is_moe or ctx.model.is_mla:
        return False
    modes = set(ctx.recompute)
    mode = next(iter(modes)) if len(modes) == 1 else ""
    mods = set(("core_attn",) if mode == "selective" else mode.split("+")) if mode not in ("", "none", "full") else set()
    if not mods or mode == "selective" or not mods <= {"core_attn", "mlp", "mlp_up", "layernorm"}:
        return False
    cfg["remat_policy"] = "custom"
    cfg["decoder_layer_input"] = "device"
    for name, by in MAXTEXT_REMAT_NAMES.items():
        cfg[name] = "remat" if mods & set(by) else "device"
    if "layernorm" not in mods:
        ctx.warn(f"recompute {mode}: MaxText names no norm output, so its custom policy re-runs the norms too")
    return True


def _maxtext_remat(ctx: _Ctx, cfg: dict[str, Any]) -> None:
    """remat_policy (one for all layers) and what ZeRO cannot express."""
    p = ctx.plan
    remat_of = {"none": "minimal_with_context", "selective": "minimal", "full": "full"}
    if _maxtext_custom_remat(ctx, cfg):
        if p.zero_stage in (1, 2):
            ctx.warn(f"ZeRO-{p.zero_stage}: MaxText has no switch for it: parameters and optimizer state stay "
                     "replicated over 'data' (use the jax export's optimizer_state specs in your own loop)")
        return
    mode = _most_conservative(sorted(set(ctx.recompute)))
    if ctx.mixed:
        mix = ", ".join(f"{k}:{v}" for k, v in _recompute_counts(ctx).items())
        ctx.warn(f"per-layer recompute mix ({mix}) is not expressible in MaxText (one remat_policy for all "
                 f"layers): exported as {remat_of[mode]!r} ({mode}), more recompute than planned")
    cfg["remat_policy"] = remat_of[mode] if mode != "none" else "minimal_with_context"
    if p.zero_stage in (1, 2):
        ctx.warn(f"ZeRO-{p.zero_stage}: MaxText has no switch for it: parameters and optimizer state stay "
                 "replicated over 'data' (use the jax export's optimizer_state specs in your own loop)")


def _maxtext_precision(ctx: _Ctx, cfg: dict[str, Any]) -> None:
    """Activation and weight dtypes, and the quantization recipe."""
    t = ctx.training
    cfg["dtype"] = "float16" if t.precision == "fp16" else "bfloat16"
    cfg["weight_dtype"] = "float32"
    recipe = str(t.precision)
    if recipe not in ("bf16", "fp16"):
        # MaxText base.yml `quantization`: "fp8" (per-tensor current scaling, the only FP8 GPU recipe).
        cfg["quantization"] = "" if recipe == "nvfp4" else "fp8"
        if recipe != "fp8-current":
            ctx.warn(f"precision {recipe}: MaxText quantization {cfg['quantization'] or 'none (bf16)'!r} is "
                     "the closest")

"""Architecture facts a Hugging Face-shaped ModelSpec does not carry (router, norms, QK norm), per model
family, recognised from the config's `model_type` (ModelSpec.model_type), never from the model's name;
the rotary base is the model's `rope_theta` and the MTP depth its `num_nextn_predict_layers`. Also the
target's names for the GPU and precision."""

from __future__ import annotations

from typing import Any

from ..spec import Plan, Problem
from ..catalog import get_gpu, get_model, precision_id
from ..cost import Config, context, cp_hierarchy
from ..topology import place_axes

FAMILIES: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("deepseek_v3",), {
        "family": "deepseek-v3", "rotary_base": 10000, "norm_epsilon": 1e-6,
        # DeepSeek-V3 config.json: yarn factor 40 over 4096, sigmoid scoring, noaux_tc bias, 8 groups
        # top-4, routed_scaling_factor 2.5, 1 MTP layer; Megatron-LM
        # examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh (d98e8a64dd) for the flag spellings.
        "megatron": [("--rotary-scaling-factor", 40), ("--mscale", 1.0), ("--mscale-all-dim", 1.0),
                     ("--qk-layernorm", None),
                     ("--moe-router-load-balancing-type", "seq_aux_loss"), ("--moe-aux-loss-coeff", 1e-4),
                     ("--moe-router-score-function", "sigmoid"), ("--moe-router-pre-softmax", None),
                     ("--moe-router-enable-expert-bias", None), ("--moe-router-bias-update-rate", 1e-3),
                     ("--moe-router-num-groups", 8), ("--moe-router-group-topk", 4),
                     ("--moe-router-topk-scaling-factor", 2.5), ("--moe-router-dtype", "fp32"),
                     ("--mtp-loss-scaling-factor", 0.1)],  # MTP depth: ModelSpec.num_nextn_predict_layers
        "titan": ("deepseek_v3", "671B"),
        "source": "DeepSeek-V3 config.json; Megatron-LM sbatch_mfsdp_deepseek_v3.sh",
    }),
    (("qwen3", "qwen3_moe"), {
        "family": "qwen3", "rotary_base": 1000000, "norm_epsilon": 1e-6,
        # Qwen3 q_norm/k_norm, rope_theta 1e6, router_aux_loss_coef 1e-3: Megatron-LM
        # examples/post_training/modelopt/conf/Qwen/Qwen3-235B-A22B.sh (d98e8a64dd).
        "megatron": [("--qk-layernorm", None), ("--moe-router-load-balancing-type", "aux_loss"),
                     ("--moe-aux-loss-coeff", 1e-3), ("--moe-router-dtype", "fp32")],
        "titan_flavors": {"qwen3-235b-a22b": ("qwen3", "235B-A22B"), "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
                          "qwen3-8b": ("qwen3", "8B")},
        "source": "Qwen3 config.json; Megatron-LM Qwen3-235B-A22B.sh",
    }),
    (("mixtral",), {
        "family": "mixtral", "rotary_base": 1000000, "norm_epsilon": 1e-5,
        # Mixtral config.json rope_theta 1e6, router_aux_loss_coef 0.02 (Megatron-LM
        # examples/mixtral/train_mixtral_8x7b_distributed.sh uses 1e-2).
        "megatron": [("--moe-router-load-balancing-type", "aux_loss"), ("--moe-aux-loss-coeff", 0.02)],
        "source": "mistralai/Mixtral-8x7B-v0.1 config.json",
    }),
    (("llama",), {
        # Llama 2 and 3 share model_type llama; their rotary bases (10000, 500000) are rope_theta
        "family": "llama3", "rotary_base": None, "norm_epsilon": 1e-5,
        "titan_flavors": {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
                          "llama3-405b": ("llama3", "405B")},
        "source": "meta-llama Llama 2 / 3 config.json rms_norm_eps 1e-5 (torchtitan llama3 flavors)",
    }),
    (("gpt2",), {
        "family": "gpt3", "rotary_base": None, "norm_epsilon": 1e-5,
        "source": "Brown et al. 2020: learned absolute positions, LayerNorm, GeLU, dropout 0.1",
    }),
)


def model_family(model) -> dict[str, Any] | None:
    """The FAMILIES row of the model's config `model_type` (ModelSpec.model_type), or None; its
    `rotary_base` is the model's own rope_theta where the model states one. Never the model's name."""
    mtype = str(model.model_type or "").lower()
    for keys, facts in FAMILIES:
        if mtype in keys:
            theta = getattr(model, "rope_theta", None)
            return {**facts, "rotary_base": theta} if theta else facts
    return None


def _same_shape(preset, model) -> bool:
    skip = {"name", "source"}
    return preset.model_dump(exclude=skip) == model.model_dump(exclude=skip)


def titan_flavor(model) -> tuple[str, str] | None:
    """torchtitan (model name, flavor) for a model whose shape is one torchtitan ships: the family's
    flavors are those of catalog presets, and a model gets one only while it has that preset's shape
    exactly, whatever its name (a preset with overrides, fewer layers or another width, is not that
    flavor; tests/launchers read each mapped flavor's shape from torchtitan's own model args)."""
    fam = model_family(model) or {}
    flavors = dict(fam.get("titan_flavors", {}))
    if "titan" in fam:
        flavors = {fam["family"]: fam["titan"]}
    for preset_name, flavor in flavors.items():
        try:
            preset = get_model(preset_name)
        except Exception:  # noqa: BLE001 - no such preset: that flavor's shape cannot be vouched for
            continue
        if _same_shape(preset, model):
            return flavor
    return None


def titan_llama3_args(model) -> tuple[dict[str, Any] | None, str]:
    """torchtitan 0.2.2 `TransformerModelArgs` (torchtitan/models/llama3/model/args.py) that build this
    model's shape with torchtitan's llama3 `Transformer`, or (None, why not). That model: RMSNorm,
    SwiGLU FFN (hidden = multiple_of-rounded int(ffn_dim_multiplier * int(2 * 4 * dim / 3))), RoPE,
    head_dim = dim // n_heads, untied output, no biases, full causal attention."""
    m = model
    why = []
    if m.is_moe or m.is_mla:
        why.append("mixture-of-experts / latent attention layers (llama3 is dense)")
    if not m.gated or m.hidden_act not in ("silu", "swiglu"):
        why.append(f"{m.hidden_act} FFN (llama3 is SwiGLU)")
    if m.hidden_size % m.num_attention_heads or (m.head_dim and m.head_dim != m.hidden_size // m.num_attention_heads):
        why.append(f"head_dim {m.head_size} (llama3 derives dim // n_heads = "
                   f"{m.hidden_size // m.num_attention_heads})")
    if m.tie_word_embeddings:
        why.append("tied embeddings (llama3 keeps a separate output layer)")
    if m.sliding_window:
        why.append("sliding-window attention")
    if why:
        return None, "; ".join(why)
    base = int(2 * (4 * m.hidden_size) / 3)
    ffn = {"multiple_of": m.intermediate_size, "ffn_dim_multiplier": None} if 0 < base <= m.intermediate_size \
        else {"multiple_of": 1, "ffn_dim_multiplier": (m.intermediate_size + 0.5) / base}
    fam = model_family(m) or {}
    args = {"dim": m.hidden_size, "n_layers": m.num_hidden_layers, "n_heads": m.num_attention_heads,
            "n_kv_heads": m.kv_heads, "vocab_size": m.vocab_size, **ffn,
            "rope_theta": fam.get("rotary_base") or 10000}
    if fam.get("norm_epsilon"):
        args["norm_eps"] = fam["norm_epsilon"]
    return args, ""


def hierarchical_cp_sizes(problem: Problem, plan: Plan, dp: int) -> tuple[int, int]:
    """(inner a2a, outer p2p) sizes the cost model priced for cp_comm_type a2a+p2p (cost.cp_hierarchy),
    `dp` the plan's data-parallel size."""
    ctx = context(problem)
    cfg = Config.of(plan, dp)
    pl = place_axes(ctx.graph, cfg.placement, cfg.tp, cfg.cp, cfg.ep, cfg.dp, cfg.pp, cfg.etp)
    return cp_hierarchy(ctx, cfg, pl)


def gpu_arch(problem: Problem) -> str:
    try:
        return str(get_gpu(problem.cluster.gpu, problem.cluster.catalog).arch)
    except Exception:  # noqa: BLE001 - unknown GPU: treated as pre-Blackwell
        return "unknown"


# training.precision (autoshard/data/precisions.yaml) -> launcher settings. Megatron-LM arguments.py /
# TransformerConfig (d98e8a64dd): --fp8-format {e4m3,hybrid}, --fp8-recipe {tensorwise,delayed,mxfp8,
# blockwise,custom}, --fp4-format e2m1 --fp4-recipe nvfp4. torchtitan 0.2.2 job_config.py: converters
# "quantize.linear.float8" ([quantize.linear.float8] recipe_name tensorwise | rowwise |
# rowwise_with_gw_hp; torchao dropped delayed scaling) and "quantize.linear.mx" (recipe_name mxfp8_cublas).
# `*_note`: what the closest setting changes (a warning). Keyed by recipe id (`fp8` is fp8-delayed:
# look up through `_recipe_settings`).
PRECISION_RECIPES: dict[str, dict[str, Any]] = {
    "bf16": {"megatron": [], "titan": None},
    "fp16": {"megatron": [], "titan": None},
    "fp8-delayed": {"megatron": [("--fp8-format", "hybrid"), ("--fp8-recipe", "delayed")],
                    "titan": ("quantize.linear.float8", "tensorwise"),
                    "titan_note": "torchtitan/torchao has no delayed scaling: exported as tensorwise (current) "
                                  "scaling, one more read of each GEMM input per step for its amax"},
    "fp8-current": {"megatron": [("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")],
                    "titan": ("quantize.linear.float8", "tensorwise")},
    "fp8-rowwise": {"megatron": [("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise")],
                    "megatron_note": "Megatron has no row-wise FP8 recipe: exported as tensorwise current scaling "
                                     "(coarser scales than planned, same GEMM rate)",
                    "titan": ("quantize.linear.float8", "rowwise")},
    "fp8-blockwise": {"megatron": [("--fp8-format", "e4m3"), ("--fp8-recipe", "blockwise")],
                      "titan": ("quantize.linear.float8", "rowwise"),
                      "titan_note": "torchtitan has no 128x128 block scaling: exported as row-wise float8 "
                                    "(finer scales for activations, coarser for weights)"},
    "mxfp8": {"megatron": [("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")],
              "titan": ("quantize.linear.mx", "mxfp8_cublas")},
    "nvfp4": {"megatron": [("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")], "titan": None,
              "titan_note": "torchtitan has no NVFP4 recipe: the exported job trains in bf16 (about half the "
                            "planned GEMM rate)"},
}


def _recipe_settings(precision: str) -> dict[str, Any] | None:
    """The launcher settings of a training precision, its aliases resolved (`fp8` -> fp8-delayed)."""
    return PRECISION_RECIPES.get(precision_id(str(precision)) or str(precision))

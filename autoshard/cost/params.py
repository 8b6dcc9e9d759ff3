"""Parameters per layer and per GPU, their bytes under ZeRO, and model FLOPs per step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..spec import Problem
from .constants import BF16
from ..catalog import get_recipe, saved_input_bytes_per_element

if TYPE_CHECKING:  # (context imports module_params: no import cycle at run time)
    from .context import Config, Context
    from .table import Cost


def mla_dim(value: int | None) -> int:
    """A multi-head latent attention dimension of a model with MLA (ModelSpec requires kv_lora_rank,
    qk_nope_head_dim, qk_rope_head_dim and v_head_dim together, so none is None there)."""
    if value is None:
        raise ValueError("multi-head latent attention needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim "
                         "and v_head_dim")
    return value


def _attention_params(m) -> float:
    h = m.hidden_size
    if m.is_mla:
        a = m.num_attention_heads
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * a * qk) if m.q_lora_rank else h * a * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + a * m.v_head_dim * h
    d = m.head_size
    return h * d * (2 * m.num_attention_heads + 2 * m.kv_heads)


def _mlp_params(m, ffn: int) -> float:
    return (3 if m.gated else 2) * m.hidden_size * ffn


def mamba_in_proj_width(m) -> int:
    """Output width of a Mamba2 mixer's in_proj: z and x (d_inner each), B and C (groups x state each)
    and dt (one per head) (Megatron mamba_mixer.py, Dao & Gu 2024 §7)."""
    return 2 * m.mamba_d_inner + 2 * m.mamba_n_groups * m.ssm_state_size + m.mamba_heads


def mamba_linear_params(m) -> float:
    """in_proj and out_proj weights of one Mamba2 mixer."""
    return m.hidden_size * mamba_in_proj_width(m) + m.mamba_d_inner * m.hidden_size


def mamba_params(m) -> float:
    """One Mamba2 mixer: in_proj, the depthwise causal conv1d over x, B, C (weights and bias), dt_bias,
    A_log and D per head, the gated RMSNorm over d_inner, out_proj (Megatron mamba_mixer.py)."""
    conv_dim = m.mamba_d_inner + 2 * m.mamba_n_groups * m.ssm_state_size
    return mamba_linear_params(m) + conv_dim * (m.conv_kernel + 1) + 3 * m.mamba_heads + m.mamba_d_inner


def layer_params(m, kind: str) -> tuple[float, float]:
    """(all params, expert params) of one layer of `kind` (full model, not sharded): a transformer layer
    (dense, moe), or one block of a hybrid model (mamba, attention, mlp, moe_mlp), each with its norms."""
    norms = 2 * m.hidden_size
    if kind == "mamba":
        return mamba_params(m) + m.hidden_size, 0.0
    if kind == "attention":
        return _attention_params(m) + m.hidden_size, 0.0
    if kind == "mlp":
        return _mlp_params(m, m.intermediate_size) + m.hidden_size, 0.0
    if kind == "moe_mlp":
        experts = m.num_experts * _mlp_params(m, m.expert_ffn)
        return experts + _mlp_params(m, m.shared_ffn) + m.hidden_size * m.num_experts + m.hidden_size, experts
    attn = _attention_params(m)
    if kind == "dense":
        return attn + _mlp_params(m, m.intermediate_size) + norms, 0.0
    experts = m.num_experts * _mlp_params(m, m.expert_ffn)
    shared = _mlp_params(m, m.shared_ffn)
    router = m.hidden_size * m.num_experts
    return attn + experts + shared + router + norms, experts


def module_params(m) -> dict[str, float]:
    """Linear weights of the whole model's transformer layers per module class (`spec.MODULE_CLASSES`):
    attention projections, dense MLPs, routed experts, shared experts (the router and norms apart)."""
    moe = m.num_moe_layers
    return {"attention": m.num_attention_layers * _attention_params(m),
            "mamba": m.num_mamba_layers * mamba_linear_params(m),
            "dense_mlp": m.num_dense_layers * _mlp_params(m, m.intermediate_size),
            "routed_experts": moe * m.num_experts * _mlp_params(m, m.expert_ffn),
            "shared_experts": moe * _mlp_params(m, m.shared_ffn)}


def lora_fraction(m, rank: int) -> float:
    """Adapter parameters per frozen linear parameter of a layer: rank x (in + out) per matrix over
    in x out (q, k, v, o and the MLP's up/gate/down), as PEFT's LoRA on all linear layers."""
    h = m.hidden_size
    if m.is_mla:
        q = m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        mats = [(h, q), (h, m.kv_lora_rank), (m.kv_lora_rank, m.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim)),
                (m.num_attention_heads * m.v_head_dim, h)]
    else:
        d = m.head_size
        mats = [(h, m.num_attention_heads * d), (h, m.kv_heads * d), (h, m.kv_heads * d), (m.num_attention_heads * d, h)]
    ffn = m.intermediate_size if not m.is_moe else m.expert_ffn
    mats += [(h, ffn), (ffn, h)] + ([(h, ffn)] if m.gated else [])
    return rank * sum(a + b for a, b in mats) / sum(a * b for a, b in mats)


QLORA_BYTES_PER_PARAM = 4.127 / 8  # NF4 + double-quantized scales (Dettmers et al. 2023, sec. 3)


def gathered_weight_bytes(ctx: "Context") -> float:
    """Bytes per parameter a ZeRO / FSDP parameter all-gather moves: bf16, or with FP8 primary weights
    (`training.fp8_params`) one FP8 / FP4 copy with its scales (the recipe's bf16 layers: bf16)."""
    if not ctx.training.fp8_params:
        return float(BF16)

    return saved_input_bytes_per_element(ctx.training.precision, ctx.gpu)


def zero3_bytes_per_param(ctx: "Context") -> tuple[float, float]:
    """(bytes gathered, bytes reduce-scattered) per parameter by ZeRO-3 / FSDP each layer: bf16 weights
    (QLoRA: the 4-bit base) and the framework's reduction dtype (LoRA: the adapters' gradients)."""
    tr = ctx.training
    if tr.finetune == "full":
        return gathered_weight_bytes(ctx), ctx.framework.grad_reduce_bytes
    frac = lora_fraction(ctx.model, tr.lora_rank)
    base = QLORA_BYTES_PER_PARAM if tr.finetune == "qlora" else BF16
    return base + frac * BF16, frac * ctx.framework.grad_reduce_bytes


ZERO3_GATHERED_LAYERS = 2  # the layer being computed and the next one, prefetched


def zero3_gathered_bytes(ctx: "Context", biggest_layer_params: Any) -> Any:
    """Unsharded weights a ZeRO-3 / FSDP rank holds beside its shards: the layer it computes and the
    next one, prefetched (FSDP2's and DeepSpeed's default prefetch of one layer ahead; Megatron-FSDP's
    double buffer), each gathered at `zero3_bytes_per_param` (bf16, FP8/FP4 with `training.fp8_params`,
    the 4-bit base under QLoRA). Linear in the layer's parameters (numpy arrays welcome)."""
    return ZERO3_GATHERED_LAYERS * zero3_bytes_per_param(ctx)[0] * biggest_layer_params


def zero3_gathered_for(ctx: "Context", cfg: "Config", layers: Iterable["Cost"]) -> float:
    """`zero3_gathered_bytes` of a plan's biggest layer where it shards weights (ZeRO-3 over a data-
    parallel group); 0 otherwise."""
    if not (cfg.zero == 3 and cfg.data_parallel):
        return 0.0
    return zero3_gathered_bytes(ctx, max(c.params for c in layers))


def param_bytes(ctx: "Context") -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes per model parameter as the run keeps them: the
    framework's (full training), or a frozen base plus trained adapters (LoRA / QLoRA)."""
    fw, tr = ctx.framework, ctx.training
    opt_b = fw.optimizer_state_bytes(tr.optimizer)
    if tr.finetune == "full":  # FP8/FP4 primary weights: no 16-bit copy but in the recipe's bf16 layers
        if tr.fp8_params:  # (the low-precision copies are counted apart: weight_copy_bytes_per_param)

            return BF16 * get_recipe(tr.precision).bf16_layer_fraction, fw.grad_bytes, opt_b
        return fw.weight_bytes, fw.grad_bytes, opt_b
    frac = lora_fraction(ctx.model, tr.lora_rank)
    base = QLORA_BYTES_PER_PARAM if tr.finetune == "qlora" else BF16
    return base + frac * BF16, frac * fw.grad_bytes, frac * opt_b


def total_params(m) -> float:
    emb = (m.vocab_size + m.learned_position_embeddings) * m.hidden_size
    head = 0 if m.tie_word_embeddings else emb
    layers = sum(layer_params(m, k)[0] for k in m.layer_kinds())
    return emb + head + layers + m.hidden_size


def active_params(m) -> float:
    """Parameters one token passes through: `total_params` with each MoE layer's routed experts
    counted top-k times instead of num_experts (DeepSeek-V3: 671B total, 37B activated)."""
    idle = (m.num_experts - m.num_experts_per_tok) * _mlp_params(m, m.expert_ffn) if m.is_moe else 0.0
    return total_params(m) - m.num_moe_layers * idle


# `active_matmul_params` per model object (a frozen ModelSpec: the same object, the same answer; the
# object is kept beside its figure so a recycled id never matches). Every evaluation needs it, and
# its loop over the layers cost the solver's warm start a second on a 61-layer MoE.
_ACTIVE_MATMUL: dict[int, tuple[Any, float]] = {}


def active_matmul_params(m) -> float:
    """Matmul weights a token passes through (LM head included, input embedding excluded)."""
    if not getattr(m, "model_config", {}).get("frozen"):  # (only objects that cannot change)
        return _active_matmul_params(m)
    got = _ACTIVE_MATMUL.get(id(m))
    if got is not None and got[0] is m:
        return got[1]
    total = _active_matmul_params(m)
    if len(_ACTIVE_MATMUL) >= 256:
        _ACTIVE_MATMUL.clear()
    _ACTIVE_MATMUL[id(m)] = (m, total)
    return total


def _active_matmul_params(m) -> float:
    total = m.vocab_size * m.hidden_size
    for kind in m.layer_kinds():
        if kind in ("dense", "moe", "attention"):
            total += _attention_params(m)
        if kind in ("dense", "mlp"):
            total += _mlp_params(m, m.intermediate_size)
        elif kind in ("moe", "moe_mlp"):
            total += m.num_experts_per_tok * _mlp_params(m, m.expert_ffn)
            total += _mlp_params(m, m.shared_ffn)
            total += m.hidden_size * m.num_experts
        elif kind == "mamba":
            total += mamba_linear_params(m)
    return total


FLOP_CONVENTION = ("PaLM's 6 N + attention per token (4 N with frozen LoRA weights), N = the matmul weights a "
                   "token passes through (active experts and the LM head; the input embedding excluded), "
                   "attention over the causal half of the score matrix, no recompute")


def model_flops_per_token_parts(problem: Problem) -> tuple[int, float, float]:
    """(FLOPs per weight per token: 6, or 4 for frozen LoRA weights; N, the matmul weights a token
    passes through; attention FLOPs per token) of `model_flops_per_step` (FLOP_CONVENTION)."""
    return flops_per_token_parts(problem.model, problem.training)


def flops_per_token_parts(m: Any, t: Any) -> tuple[int, float, float]:
    """`model_flops_per_token_parts` of a model and a training setup (ModelSpec, TrainingSpec)."""
    s = t.seq_len
    if m.is_mla:
        d_qk, d_v = mla_dim(m.qk_nope_head_dim) + mla_dim(m.qk_rope_head_dim), mla_dim(m.v_head_dim)
    else:
        d_qk = d_v = m.head_size
    # Frozen weights (LoRA) need no weight gradients: forward + input gradients, 4 N per token.
    per_n = 6 if t.finetune == "full" else 4
    share = m.attention_key_share(s, getattr(t, "mean_document_tokens", None))  # windows, chunks, documents
    attn = 3 * m.num_attention_layers * m.num_attention_heads * s * (d_qk + d_v) * share
    # Mamba2 scan: Megatron's estimate 7 x d_inner x state FLOPs per token forward (training.py
    # mamba_layer_flops), three passes
    attn += 3 * m.num_mamba_layers * 7 * m.mamba_d_inner * m.ssm_state_size
    return per_n, active_matmul_params(m), attn  # (a sliding window: the keys it attends)


def model_flops_per_step(problem: Problem) -> float:
    """Model FLOPs per step: PaLM's 6 N + attention, with attention counted **causal** (half the
    score matrix; what a causal kernel must compute), no recompute. PaLM and NVIDIA count it
    non-causal, which overstates long-context MFU (past 100% at 128k tokens)."""
    per_n, n, attn = model_flops_per_token_parts(problem)
    per_token = per_n * n + attn
    return per_token * problem.training.tokens_per_step

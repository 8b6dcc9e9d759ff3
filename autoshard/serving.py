"""Inference memory sizing: weights + KV cache + activations, and the fewest GPUs to hold and to serve.

- Weights: parameters x bytes per weight of the serving precision (bf16/fp16 2 B; FP8 1 B; MXFP8
  1 + 1/32 B; NVFP4 0.5 + 1/16 B: values plus their block scales).
- KV cache per token and layer: standard / GQA attention keeps K and V for every KV head,
  `2 x kv_heads x head_dim` values; multi-head latent attention (DeepSeek-V2/V3) keeps the
  compressed latent and the decoupled RoPE key, `kv_lora_rank + qk_rope_head_dim` values
  (DeepSeek-V2 paper §2.1.2, Table 1). Times batch x context x layers x bytes per KV value.
- Activations: the transient working set of one layer while a prefill chunk of
  `min(batch x context, prefill_tokens)` tokens passes (FlashAttention: no score matrix): the
  residual stream in and out, the Q/K/V projections, the MLP's intermediate (gated: two) and, for
  MoE, the routed tokens' expert intermediates; plus the last position's logits in fp32 per sequence.
- To hold: the weights over the usable HBM of one GPU (the driver's figure, `hbm_usable_gib`),
  nothing else (seed 002: 100T parameters in 16 bit need ~1,000 B200 just to load).
- To serve: the smallest power-of-two GPU count whose share fits in `memory_utilization` of the
  usable HBM (vLLM's `gpu_memory_utilization`, default 0.9), with tensor parallelism inside a node
  (at most `gpus_per_node`) and pipeline stages beyond; KV heads are replicated where TP exceeds the
  KV head count (the MLA latent is replicated on every TP rank).
"""

from __future__ import annotations

import math
from typing import Any

from .catalog import GPU, check_precision
from .cost import total_params
from .errors import InputError
from .spec import ModelSpec

GIB = 2**30
BYTES_PER_WEIGHT = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8-delayed": 1.0, "fp8-current": 1.0,
                    "fp8-rowwise": 1.0,
                    "fp8-blockwise": 1.0 + 4 / 16384, "mxfp8": 1.0 + 1 / 32, "nvfp4": 0.5 + 1 / 16}
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
DEFAULT_MEMORY_UTILIZATION = 0.9  # vLLM EngineArgs.gpu_memory_utilization default
DEFAULT_PREFILL_TOKENS = 8192  # vLLM chunked prefill: max_num_batched_tokens default for online serving


def kv_values_per_token_layer(m: ModelSpec) -> int:
    """Values cached per token per layer: 2 x kv_heads x head_dim (MHA/GQA/MQA), or the MLA latent
    plus the decoupled RoPE key."""
    if m.is_mla:
        return int(m.kv_lora_rank + m.qk_rope_head_dim)  # type: ignore[operator]
    return 2 * m.kv_heads * m.head_size


def activation_bytes(m: ModelSpec, tokens: int, batch: int) -> float:
    """One layer's transient working set for `tokens` prefill tokens (16-bit), plus fp32 logits of the
    last position of each of the `batch` sequences."""
    h = m.hidden_size
    q = m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim if m.is_mla else m.head_size)
    kv = kv_values_per_token_layer(m) if m.is_mla else 2 * m.kv_heads * m.head_size
    mult = 2 if m.gated else 1
    if m.is_moe:
        ffn = mult * m.expert_ffn * (m.num_experts_per_tok + m.num_shared_experts)
        ffn = max(ffn, mult * m.intermediate_size if m.num_dense_layers else 0)
    else:
        ffn = mult * m.intermediate_size
    per_token = 2 * h + q + kv + ffn
    return 2.0 * tokens * per_token + 4.0 * batch * m.vocab_size


def serve_memory(gpu: GPU, *, model: ModelSpec | None = None, params: float | None = None,
                 batch: int = 1, context: int = 4096, precision: str = "bf16", kv_precision: str = "bf16",
                 prefill_tokens: int = DEFAULT_PREFILL_TOKENS, memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
                 gpus_per_node: int = 8) -> dict[str, Any]:
    """Memory to serve a model (or to hold `params` weights alone) and the fewest GPUs that hold and
    serve it. JSON-ready dict; sizes in bytes and GiB."""
    if model is None and params is None:
        raise InputError("give a model or a parameter count", field="model")
    if precision not in BYTES_PER_WEIGHT:
        raise InputError(f"unknown serving precision {precision!r} (one of {', '.join(BYTES_PER_WEIGHT)})",
                         field="--precision")
    if kv_precision not in KV_BYTES:
        raise InputError(f"unknown KV-cache precision {kv_precision!r} (one of {', '.join(KV_BYTES)})",
                         field="--kv-precision")
    for name, v in (("--batch", batch), ("--context", context), ("--prefill-tokens", prefill_tokens),
                    ("--gpus-per-node", gpus_per_node)):
        if not isinstance(v, int) or v < 1:
            raise InputError(f"must be a whole number >= 1, got {v!r}", field=name)
    if not (0 < memory_utilization <= 1):
        raise InputError(f"must be in (0, 1], got {memory_utilization:g}", field="--memory-utilization")
    if params is not None and not (math.isfinite(params) and params > 0):
        raise InputError(f"must be a positive number of parameters, got {params!r}", field="--params")
    check_precision(gpu, precision)
    n_params = float(params) if params is not None else total_params(model)
    weights = n_params * BYTES_PER_WEIGHT[precision]
    kv_per_seq = kv = act = 0.0
    kv_heads_split = 1
    if model is not None and params is None:
        kv_per_seq = context * model.num_hidden_layers * kv_values_per_token_layer(model) * KV_BYTES[kv_precision]
        kv = batch * kv_per_seq
        act = activation_bytes(model, min(batch * context, prefill_tokens), batch)
        kv_heads_split = 1 if model.is_mla else model.kv_heads
    usable = gpu.hbm_bytes
    budget = usable * memory_utilization
    hold = math.ceil(weights / usable)
    serve = None
    n = 1
    while n <= 1 << 20:
        tp = min(n, gpus_per_node)
        replicate = max(1.0, tp / kv_heads_split)
        per_gpu = weights / n + kv * replicate / n + act / tp
        if per_gpu <= budget:
            serve = {"gpus": n, "tp": tp, "pp": n // tp, "per_gpu_bytes": per_gpu, "per_gpu_gib": per_gpu / GIB,
                     "kv_replication": replicate}
            break
        n *= 2
    total = weights + kv + act
    return {
        "model": model.name if model is not None and params is None else None,
        "params": n_params, "gpu": gpu.id, "precision": precision, "kv_precision": kv_precision,
        "batch": batch if params is None else None, "context": context if params is None else None,
        "weights_bytes": weights, "weights_gib": weights / GIB, "weights_tb": weights / 1e12,
        "kv_cache_bytes": kv, "kv_cache_gib": kv / GIB, "kv_cache_per_sequence_gib": kv_per_seq / GIB,
        "activations_bytes": act, "activations_gib": act / GIB,
        "total_bytes": total, "total_gib": total / GIB,
        "gpu_hbm_gb": gpu.hbm_gb, "gpu_usable_gib": gpu.hbm_usable_gib, "memory_utilization": memory_utilization,
        "min_gpus_to_hold_weights": hold, "min_nodes_to_hold_weights": math.ceil(hold / gpus_per_node),
        "min_gpus_to_serve": serve["gpus"] if serve else None, "serve_layout": serve,
        "min_gpus_to_serve_unrounded": math.ceil(total / budget),
    }


def render(r: dict[str, Any]) -> str:
    what = r["model"] or f"{r['params']:.3g} parameters"
    lines = [f"Serving memory: {what} in {r['precision']} on {r['gpu']} "
             f"({r['gpu_hbm_gb']:g} GB, {r['gpu_usable_gib']:g} GiB usable)"]
    lines.append(f"  weights      {r['weights_gib']:>14,.1f} GiB  ({r['weights_tb']:,.1f} TB)")
    if r["model"]:
        lines.append(f"  KV cache     {r['kv_cache_gib']:>14,.1f} GiB  ({r['batch']} x {r['context']:,} tokens, "
                     f"{r['kv_cache_per_sequence_gib']:,.2f} GiB per sequence, {r['kv_precision']})")
        lines.append(f"  activations  {r['activations_gib']:>14,.1f} GiB  (one layer's prefill working set + logits)")
        lines.append(f"  total        {r['total_gib']:>14,.1f} GiB")
    lines.append(f"  to hold the weights: {r['min_gpus_to_hold_weights']:,} GPUs "
                 f"({r['min_nodes_to_hold_weights']:,} nodes of 8), all of each GPU's usable HBM")
    s = r["serve_layout"]
    if s:
        lines.append(f"  to serve: {s['gpus']:,} GPUs (TP {s['tp']} x PP {s['pp']}, {s['per_gpu_gib']:,.1f} GiB each, "
                     f"within {r['memory_utilization']:.0%} of usable HBM; "
                     f"{r['min_gpus_to_serve_unrounded']:,} if memory divided perfectly)")
    else:
        lines.append("  to serve: no power-of-two GPU count up to 2^20 fits")
    return "\n".join(lines) + "\n"

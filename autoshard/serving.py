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

Disaggregated serving (`disaggregated`; DistServe, Zhong et al. OSDI 2024; Splitwise, Patel et al.
ISCA 2024): prefill and decode run on separate pools, the prompt's KV cache sent from one to the other.
For a request rate R, prompt P and output O tokens, at full utilization (queueing not modelled):
- Prefill is compute-bound: 2 x (matmul weights a token passes, LM head aside) x P + the LM head for the
  last position + causal attention L x heads x (d_qk + d_v) x P^2 FLOPs per request, at the catalog's
  achievable matmul rate (peak x the GPU's fitted matmul efficiency, the rate training is priced at).
  GPU-seconds per request x R = the pool's GPUs, in instances of the smallest layout that holds the
  weights and one prefill chunk.
- Decode is HBM-bound: one step of a batch of B sequences reads the weights (all experts of an MoE:
  a large batch touches every one) and the B sequences' KV at their mean length P + O/2, at HBM
  bandwidth x the GPU's HBM efficiency. B is the most the instance's memory holds at the full length
  P + O (or fewer, to meet a time-per-output-token target); instance tokens/s = B / step time; the pool
  serves R x O tokens/s.
- KV transfer: P x layers x KV values per token x KV bytes per request, over the prefill instance's
  scale-out NICs (the GPU's default topology beyond its NVLink domain, at its scale-out efficiency).
"""

from __future__ import annotations

import math
from typing import Any

from .catalog import GPU, attention_flops_per_s, check_precision, gemm_flops_per_s, get_topology
from .cost import active_matmul_params, total_params
from .cost.params import mla_dim
from .errors import InputError
from .spec import ModelSpec
from .tables import Column, table_text

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
    q = m.num_attention_heads * (mla_dim(m.qk_nope_head_dim) + mla_dim(m.qk_rope_head_dim) if m.is_mla else m.head_size)
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


def prefill_flops(m: ModelSpec, prompt: int) -> tuple[float, float]:
    """(matmul FLOPs, causal attention FLOPs) of prefilling one prompt of `prompt` tokens: every token
    through every matmul weight but the LM head, the LM head for the last position only; attention
    over the causal half, forward only (the training convention's attention term / 3 x P)."""
    head = m.vocab_size * m.hidden_size
    matmul = 2.0 * (active_matmul_params(m) - head) * prompt + 2.0 * head
    if m.is_mla:
        d_qk, d_v = mla_dim(m.qk_nope_head_dim) + mla_dim(m.qk_rope_head_dim), mla_dim(m.v_head_dim)
    else:
        d_qk = d_v = m.head_size
    attn = float(m.num_hidden_layers * m.num_attention_heads * (d_qk + d_v)) * prompt * prompt \
        * m.attention_key_share(prompt)
    return matmul, attn


def scaleout_bytes_per_s(gpu: GPU) -> tuple[float, str]:
    """Per-GPU bandwidth between instances (the first level of the GPU's default topology beyond its
    NVLink domain, at the GPU's scale-out efficiency) and that level's name."""
    levels = get_topology(gpu.default_topology).levels
    lv = levels[1] if len(levels) > 1 else levels[0]
    return lv.bandwidth_gb_per_s * 1e9 * gpu.efficiency.scaleout, f"{gpu.default_topology} {lv.name}"


def disaggregated(gpu: GPU, model: ModelSpec, *, request_rate: float, prompt_tokens: int, output_tokens: int,
                  precision: str = "bf16", kv_precision: str = "bf16", tpot_ms: float | None = None,
                  memory_utilization: float = DEFAULT_MEMORY_UTILIZATION, gpus_per_node: int = 8) -> dict[str, Any]:
    """Prefill and decode pools for `request_rate` requests/s of `prompt_tokens` in, `output_tokens`
    out: each pool's instance layout and GPU count, and the KV transfer between them (module
    docstring). JSON-ready dict."""
    if not (math.isfinite(request_rate) and request_rate > 0):
        raise InputError(f"must be a positive number of requests per second, got {request_rate!r}",
                         field="--request-rate")
    for name, v in (("--prompt-tokens", prompt_tokens), ("--output-tokens", output_tokens)):
        if not isinstance(v, int) or v < 1:
            raise InputError(f"must be a whole number >= 1, got {v!r}", field=name)
    if tpot_ms is not None and not (math.isfinite(tpot_ms) and tpot_ms > 0):
        raise InputError(f"must be a positive number of milliseconds, got {tpot_ms!r}", field="--tpot-ms")
    common: dict[str, Any] = dict(precision=precision, kv_precision=kv_precision, memory_utilization=memory_utilization,
                  gpus_per_node=gpus_per_node)
    # Prefill: compute-bound, one prompt (a chunk of it) at a time per instance.
    pre = serve_memory(gpu, model=model, batch=1, context=prompt_tokens,
                       prefill_tokens=min(prompt_tokens, DEFAULT_PREFILL_TOKENS), **common)
    if pre["serve_layout"] is None:
        raise InputError(f"{model.name} does not fit on any power-of-two count of {gpu.id} up to 2^20",
                         field="--gpu")
    n_pre = pre["serve_layout"]["gpus"]
    mm, attn = prefill_flops(model, prompt_tokens)
    gemm, attn_rate = gemm_flops_per_s(gpu, precision), attention_flops_per_s(gpu)
    gpu_s = mm / gemm + attn / attn_rate  # GPU-seconds of one prefill
    pre_gpus_exact = request_rate * gpu_s
    pre_instances = max(1, math.ceil(pre_gpus_exact / n_pre - 1e-9))
    # Decode: HBM-bound; the batch the instance holds at the full length, or fewer for a TPOT target.
    full = prompt_tokens + output_tokens
    dec = serve_memory(gpu, model=model, batch=1, context=full, prefill_tokens=1, **common)
    if dec["serve_layout"] is None:
        raise InputError(f"{model.name} does not fit on any power-of-two count of {gpu.id} up to 2^20",
                         field="--gpu")
    weights, act = dec["weights_bytes"], dec["activations_bytes"]
    kv_token = model.num_hidden_layers * kv_values_per_token_layer(model) * KV_BYTES[kv_precision]
    split = 1 if model.is_mla else model.kv_heads
    mean_ctx = prompt_tokens + output_tokens / 2
    need_tokens_s = request_rate * output_tokens
    # Every power-of-two instance from the smallest that holds one sequence up to a node (TP inside it):
    # a larger one holds a larger batch per weight read; the fewest decode GPUs win (ties: the smaller).
    options = []
    n = dec["serve_layout"]["gpus"]
    while True:
        tp = min(n, gpus_per_node)
        rep = max(1.0, tp / split)
        room = gpu.hbm_bytes * memory_utilization * n - weights - act * (n // tp)  # (act / tp on n GPUs)
        batch_mem = math.floor(room / (kv_token * full * rep))
        bw = gpu.hbm_bytes_per_s * gpu.efficiency.hbm * n  # the instance's HBM, at the GPU's efficiency
        if batch_mem >= 1:
            batch, meets = batch_mem, True
            if tpot_ms is not None:  # the largest batch whose step meets the target
                most = math.floor((tpot_ms / 1e3 * bw - weights) / (kv_token * mean_ctx * rep))
                meets = most >= 1
                batch = max(1, min(batch_mem, most))
            t_step = (weights + batch * kv_token * mean_ctx * rep) / bw
            inst = batch / t_step
            count = max(1, math.ceil(need_tokens_s / inst - 1e-9))
            options.append({"instance_gpus": n, "tp": tp, "pp": n // tp, "kv_replication": rep,
                            "batch_by_memory": batch_mem, "batch": batch, "meets_tpot": meets, "step_s": t_step,
                            "tokens_per_s_per_instance": inst, "instances": count, "gpus": count * n})
        if n >= gpus_per_node:
            break
        n *= 2
    if not options:
        raise InputError(f"no instance of up to {max(n, gpus_per_node)} {gpu.id} holds one {full:,}-token sequence "
                         f"of {model.name} beside its weights", field="--gpu")
    met = [o for o in options if o["meets_tpot"]] or options
    dec_best = min(met, key=lambda o: (o["gpus"], o["instance_gpus"]))
    # KV transfer: the prompt's cache from a prefill instance to a decode instance.
    kv_req = prompt_tokens * kv_token
    link, link_name = scaleout_bytes_per_s(gpu)
    out: dict[str, Any] = {
        "request_rate_per_s": request_rate, "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
        "tpot_ms_target": tpot_ms,
        "prefill": {
            "instance_gpus": n_pre, "tp": pre["serve_layout"]["tp"], "pp": pre["serve_layout"]["pp"],
            "matmul_flops_per_request": mm, "attention_flops_per_request": attn,
            "matmul_flops_per_s_per_gpu": gemm, "attention_flops_per_s_per_gpu": attn_rate,
            "gpu_seconds_per_request": gpu_s, "gpus_exact": pre_gpus_exact, "instances": pre_instances,
            "gpus": pre_instances * n_pre, "seconds_per_prompt": gpu_s / n_pre,
            "utilization": pre_gpus_exact / (pre_instances * n_pre)},
        "decode": {
            **dec_best, "kv_bytes_per_token": kv_token, "tokens_per_s_needed": need_tokens_s,
            "hbm_bytes_per_s_per_gpu": gpu.hbm_bytes_per_s * gpu.efficiency.hbm,
            "utilization": need_tokens_s / (dec_best["instances"] * dec_best["tokens_per_s_per_instance"]),
            "instance_options": options},
        "kv_transfer": {
            "bytes_per_request": kv_req, "gib_per_request": kv_req / GIB, "link": link_name,
            "bytes_per_s_per_gpu": link, "seconds_per_request": kv_req / (link * n_pre),
            "bytes_per_s_total": request_rate * kv_req,
            "link_utilization": request_rate * kv_req / (link * pre_instances * n_pre)},
    }
    out["total_gpus"] = out["prefill"]["gpus"] + out["decode"]["gpus"]
    return out


def render_disaggregated(d: dict[str, Any]) -> str:
    """The two pools as a table (GPUs, instances, layout, the load that sized them), the KV transfer
    between them and the total."""
    p, dc, k = d["prefill"], d["decode"], d["kv_transfer"]
    prefill_load = (f"{p['matmul_flops_per_request'] + p['attention_flops_per_request']:.3g} FLOP per prompt "
                    f"({p['attention_flops_per_request']:.3g} attention), {p['gpu_seconds_per_request']:.3g} GPU-s each at "
                    f"{p['matmul_flops_per_s_per_gpu'] / 1e12:,.0f} TFLOP/s achievable; {p['seconds_per_prompt'] * 1e3:,.0f} ms "
                    f"per prompt per instance; {p['gpus_exact']:.3g} GPUs busy ({p['utilization']:.0%})")
    decode_load = (f"batch {dc['batch']:,} per instance (memory holds {dc['batch_by_memory']:,}), {dc['step_s'] * 1e3:.1f} ms "
                   f"per step = {dc['tokens_per_s_per_instance']:,.0f} tokens/s per instance for "
                   f"{dc['tokens_per_s_needed']:,.0f} needed ({dc['utilization']:.0%})"
                   + ("" if dc["meets_tpot"] else f"; the {d['tpot_ms_target']:g} ms TPOT target is out of reach even at batch 1"))
    head: list[Column] = ["pool", ("GPUs", "right"), ("instances", "right"), "each instance", "load"]
    rows = [["prefill", f"{p['gpus']:,}", f"{p['instances']:,}", f"TP {p['tp']} x PP {p['pp']}", prefill_load],
            ["decode", f"{dc['gpus']:,}", f"{dc['instances']:,}", f"TP {dc['tp']} x PP {dc['pp']}", decode_load],
            ["total", f"{d['total_gpus']:,}", "", "", ""]]
    return (f"Disaggregated serving: {d['request_rate_per_s']:g} requests/s, {d['prompt_tokens']:,} prompt + "
            f"{d['output_tokens']:,} output tokens (full utilization; queueing not modelled)\n"
            + table_text(head, rows, indent=2)
            + f"  KV transfer: {k['gib_per_request'] * 1024:,.1f} MiB per request, "
              f"{k['seconds_per_request'] * 1e3:,.1f} ms over the prefill instance's {k['link']} links "
              f"({k['bytes_per_s_per_gpu'] / 1e9:,.1f} GB/s per GPU); {k['bytes_per_s_total'] / 1e9:,.2f} GB/s in all "
              f"({k['link_utilization']:.1%} of the prefill pool's links)\n")


def render(r: dict[str, Any]) -> str:
    """The memory of one server as a table (weights, KV cache, activations, total), then the GPUs to
    hold the weights and to serve."""
    what = r["model"] or f"{r['params']:.3g} parameters"
    lines = [f"Serving memory: {what} in {r['precision']} on {r['gpu']} "
             f"({r['gpu_hbm_gb']:g} GB, {r['gpu_usable_gib']:g} GiB usable)"]
    rows = [["weights", f"{r['weights_gib']:,.1f}", f"{r['weights_tb']:,.1f} TB"]]
    if r["model"]:
        rows += [["KV cache", f"{r['kv_cache_gib']:,.1f}", f"{r['batch']} x {r['context']:,} tokens, "
                  f"{r['kv_cache_per_sequence_gib']:,.2f} GiB per sequence, {r['kv_precision']}"],
                 ["activations", f"{r['activations_gib']:,.1f}", "one layer's prefill working set + logits"],
                 ["total", f"{r['total_gib']:,.1f}", ""]]
    lines.append(table_text(["memory", ("GiB", "right"), "what"], rows, indent=2).rstrip("\n"))
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

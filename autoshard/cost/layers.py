"""One layer, the embedding and the LM head priced per kind and recompute mode (`layer_table`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..catalog import get_recipe, saved_input_bytes_per_element
from ..spec import Recompute
from ..topology import (
    Placement,
    Profile,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    p2p_s,
    place_axes,
    reduce_scatter_s,
    shard_profiles,
    split_profile,
)
from .communication import _qkvo_bytes, cp_comm_s, cp_hierarchy, tp_comm_s, tp_overlap_on
from .constants import (
    BF16,
    BLOCKING_LAYER_HOST_S,
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACES_PER_PROCESS,
    FUSED_CE_EXTRA_BYTES,
    LOGIT_WORK_BYTES,
    BATCH_MASKS,
    EAGER_LAUNCH_HOST_S,
    ELEMENTWISE_BWD_FACTOR,
    SM90_ARCHS,
    TIME_KEYS,
    overlapped,
)
from .context import Config, Context, num_microbatches, reshard_policy, zero3_step_sync
from .kernels import (
    Shapes,
    captured_launches,
    _frozen_adjust,
    _gemm_s,
    _mem_s,
    attention_backward_s,
    core_attention_flops,
    core_attention_s,
    cp_ring_merge_s,
    layer_kernels,
    module_in_graph,
    unfused_softmax_reason,
    unfused_softmax_s,
)
from .moe import (
    no_ep_overlap,
    contiguous_shares,
    dispatcher_of,
    ep_overlap_host_s,
    ep_overlap_on,
    ep_overlap_pays,
    moe_host_s,
    moe_imbalance,
    routed_tokens,
)
from .params import QLORA_BYTES_PER_PARAM, layer_params, mamba_in_proj_width, mla_dim, param_bytes, zero3_bytes_per_param
from .table import Cost, Table  # noqa: F401  (re-exported: moved to cost/table.py)

# The MLP kind of a hybrid model's MLP-only blocks (spec.HYBRID_KINDS); other kinds map to themselves.
MLP_KIND = {"mlp": "dense", "moe_mlp": "moe"}
MAMBA_SCAN_FLOPS_PER_STATE = 7  # forward FLOPs per token, d_inner element and state (Megatron training.py mamba_layer_flops)
MAMBA_SCAN_BWD_FACTOR = 2.0  # SSD backward: the chunk states recomputed and two chunked contractions (estimate)


def _unfused_s(ctx: Context, m: float, k: float, widths: tuple[float, ...], rate: float | None) -> float:
    """What a framework whose projections sharing one input are separate linear layers
    (`FrameworkProfile.fused_projections` False: torchtitan's wq, wk, wv and w1, w3) pays over one GEMM
    of their summed width: each GEMM reads the input again and pads its own output tiles (a TP-sharded
    key or value projection of 128 columns fills half a 256-wide tile). The input's low-precision cast
    is not paid again: the same tensor's casts are one computation (compiled graphs deduplicate them),
    so the difference is priced at the recipe's GEMM rate without quantization."""
    if ctx.framework.fused_projections or len(widths) < 2:
        return 0.0
    r = rate or ctx.mm_flops_per_s
    return sum(_gemm_s(ctx, m, k, w, r) for w in widths) - _gemm_s(ctx, m, k, sum(widths), r)


def _attention_elem_s(ctx: Context, sh: Shapes) -> float:
    """Forward time of the attention block's elementwise work: its norm, the residual add and RoPE."""
    return _mem_s(ctx, BF16 * (sh.res_tokens * sh.h * (2 + 3) + sh.tokens * (sh.a_local + sh.kv_local) * sh.d * 2))


def _mlp_elem_s(ctx: Context, sh: Shapes, ffn_elem: float) -> float:
    """Forward time of the MLP block's elementwise work: its activation over `ffn_elem` elements, its
    norm and the residual add."""
    return _mem_s(ctx, BF16 * (ffn_elem + sh.res_tokens * sh.h * (2 + 3)))


def _attention_cost(ctx: Context, cfg: Config, pl: Placement, sh: Shapes) -> tuple[dict, dict, float, float, float]:
    """Forward/backward of the attention block (projections, core, TP and CP comm).

    Returns (fwd, bwd, core_fwd_s, wgrad_s, flops_fwd).
    """
    m, T, h = sh.m, sh.tokens, sh.h
    fwd = dict.fromkeys(TIME_KEYS, 0.0)
    bwd = dict.fromkeys(TIME_KEYS, 0.0)
    a, kv = sh.a_local, sh.kv_local
    gemms: list[tuple[float, float, float]] = []
    if m.is_mla:
        kv_rank, nope, rope = mla_dim(m.kv_lora_rank), mla_dim(m.qk_nope_head_dim), mla_dim(m.qk_rope_head_dim)
        if m.q_lora_rank:
            gemms += [(T, h, m.q_lora_rank), (T, m.q_lora_rank, a * sh.d_qk)]
        else:
            gemms += [(T, h, a * sh.d_qk)]
        gemms += [(T, h, kv_rank + rope), (T, kv_rank, a * (nope + sh.d_v))]
        gemms += [(T, a * sh.d_v, h)]
    else:
        gemms = [(T, h, (a + 2 * kv) * sh.d), (T, a * sh.d, h)]
    proj = sum(_gemm_s(ctx, *g, ctx.module_flops_per_s("attention")) for g in gemms)
    if not m.is_mla:
        proj += _unfused_s(ctx, T, h, (a * sh.d, kv * sh.d, kv * sh.d), ctx.module_flops_per_s("attention"))
    flops = sum(2 * x * y * z for x, y, z in gemms)
    hierarchical = cfg.cp > 1 and cfg.cp_comm == "a2a+p2p"
    inner, outer = cp_hierarchy(ctx, cfg, pl) if hierarchical else (1, None)  # outer: its ring's steps
    core, scores, core_flops = core_attention_s(ctx, sh, outer)
    soft_f, soft_b = unfused_softmax_s(ctx, sh)  # a softmax Megatron's fused kernel refuses
    flops += core_flops
    elem = _attention_elem_s(ctx, sh)
    # the p2p ring's merges and gradient accumulation between its per-step attention calls
    ring_steps = int(outer or 1) if hierarchical else (cfg.cp if cfg.cp > 1 and cfg.cp_comm == "p2p" else 1)
    merge_f, merge_b = cp_ring_merge_s(ctx, sh, ring_steps)
    fwd["compute"] = proj + core + scores + soft_f + elem + merge_f
    proj_b, wgrad = _frozen_adjust(ctx, proj)
    bwd["compute"] = (proj_b + attention_backward_s(ctx, core) + ELEMENTWISE_BWD_FACTOR * (elem + scores) + soft_b
                      + merge_b)
    core += scores + soft_f + merge_f  # what selective recompute re-runs
    # Tensor parallel: AG + RS (SP) or one AllReduce per block and pass. With SP, MLA's down-projections
    # run on the sequence shard (duplicated weights) and the column-parallel up-projections gather the
    # latents (q_lora or the hidden state, kv_lora) and the RoPE key instead of the hidden state
    # (Megatron multi_latent_attention.py, _qkv_down_projection).
    mla = BF16 * T * ((m.q_lora_rank or h) + mla_dim(m.kv_lora_rank) + mla_dim(m.qk_rope_head_dim)) if m.is_mla else None
    g_f, g_b = (mla, mla) if mla else tp_gather_bytes(ctx, T * h, "attention")
    fwd["tp_comm"] += tp_comm_s(ctx, cfg, pl, BF16 * T * h, proj, g_f)
    bwd["tp_comm"] += tp_comm_s(ctx, cfg, pl, BF16 * T * h, 2 * proj, g_b)
    # Context parallel: ring exchange of K and V, overlapped with the core attention.
    if cfg.cp > 1 and cfg.cp_comm == "a2a":
        # Ulysses: all-to-all q, k, v before attention (sequence-sharded -> head-sharded) and the
        # output after, each GPU sending (cp - 1)/cp of its share; the backward moves the gradients.
        fwd["cp_comm"] = bwd["cp_comm"] = all_to_all_s(ctx.levels, pl.cp, _qkvo_bytes(sh))
    elif hierarchical:
        # Hierarchical (Megatron a2a+p2p): Ulysses all-to-all among the `inner` CP ranks of one NVLink
        # domain (heads scattered, their sequence gathered), then the p2p ring over the `outer` groups,
        # each passing K/V of its inner group's tokens for its share of the heads (the same bytes as
        # one rank's K/V), overlapped with attention.
        n, rings = len(pl.cp.members), int(outer or 1)
        a2a = all_to_all_s(ctx.levels, Profile(inner, (inner,) * n), _qkvo_bytes(sh)) if inner > 1 else 0.0
        f, b = (cp_comm_s(ctx, rings, Profile(rings, tuple(max(1, x // inner) for x in pl.cp.members)), sh, core)
                if rings > 1 else (0.0, 0.0))
        fwd["cp_comm"], bwd["cp_comm"] = a2a + f, a2a + b
    elif cfg.cp > 1 and cfg.cp_comm == "allgather":
        # K/V all-gathered before attention (exposed); the backward reduce-scatters their gradients.
        f, _ = cp_comm_s(ctx, cfg.cp, pl.cp, sh, 0.0)
        fwd["cp_comm"], bwd["cp_comm"] = f, 2 * f
    elif cfg.cp > 1:
        fwd["cp_comm"], bwd["cp_comm"] = cp_comm_s(ctx, cfg.cp, pl.cp, sh, core)
    return fwd, bwd, core, wgrad, flops


def tp_gather_bytes(ctx: Context, elements: float, module: str) -> tuple[float, float]:
    """(forward, backward) bytes of a sequence-parallel all-gather of `elements` of a module class's
    linear-layer input (forward) or output gradient (backward): the recipe's quantized size
    (precisions.yaml saved_input_bytes_per_element: 1 B for per-tensor FP8, 1 + 1/32 for MXFP8) in the passes where
    the framework gathers them quantized (`FrameworkProfile.quantized_tp_gather`) and the module runs
    below 16 bits, else bf16."""
    bf16 = float(BF16) * elements
    if not ctx.low_precision:
        return bf16, bf16
    modes = dict(ctx.framework.quantized_tp_gather)
    mode = modes.get(get_recipe(ctx.training.precision).id) or modes.get("all")
    if not mode:
        return bf16, bf16
    if ctx.module_flops_per_s(module) is not None:  # the module kept in bf16 (training.bf16_modules)
        return bf16, bf16
    f = ctx.bf16_layer_share  # whole layers in bf16 gather bf16 (a mean over the layers)
    q = (f * BF16 + (1.0 - f) * min(float(BF16), saved_input_bytes_per_element(ctx.training.precision, ctx.gpu))) * elements
    return q, (q if mode == "both" else bf16)


def _mlp_cost(ctx: Context, cfg: Config, pl: Placement, sh: Shapes, kind: str) -> tuple[dict, dict, float, float]:
    """Forward/backward of the MLP or MoE block; returns (fwd, bwd, wgrad_s, flops_fwd)."""
    m, T, h = sh.m, sh.tokens, sh.h
    fwd = dict.fromkeys(TIME_KEYS, 0.0)
    bwd = dict.fromkeys(TIME_KEYS, 0.0)
    mats = 3 if m.gated else 2
    act = BF16 * T * h

    def mlp(tokens: float, ffn_local: float, weight_sets: float = 1.0, module: str = "dense_mlp") -> tuple[float, float]:
        """(time, flops) of `weight_sets` MLPs of a module class that together see `tokens` tokens."""
        per = tokens / weight_sets
        rate = ctx.module_flops_per_s(module)  # None: the recipe's; bf16 where training.bf16_modules says
        up = _gemm_s(ctx, per, h, (mats - 1) * ffn_local, rate, groups=weight_sets)
        if weight_sets == 1:
            up += _unfused_s(ctx, per, h, (ffn_local,) * (mats - 1), rate)
        down = _gemm_s(ctx, per, ffn_local, h, rate, groups=weight_sets)
        return up + down, 2 * tokens * h * ffn_local * mats

    if kind == "dense":
        t_mlp, flops = mlp(T, m.intermediate_size / cfg.tp)
        ffn_elem = T * m.intermediate_size / cfg.tp * (3 if m.gated else 2)
        g_f, g_b = tp_gather_bytes(ctx, T * h, "dense_mlp")
        tp_f, tp_b = tp_comm_s(ctx, cfg, pl, act, t_mlp, g_f), tp_comm_s(ctx, cfg, pl, act, 2 * t_mlp, g_b)
        a2a = 0.0
    else:
        k, E, etp = m.num_experts_per_tok, m.num_experts, cfg.expert_tp
        routed = routed_tokens(ctx, cfg, sh)
        t_exp, flops = mlp(routed, m.expert_ffn / etp, E / cfg.ep, "routed_experts")
        t_mlp = t_exp
        tp_f = tp_b = 0.0
        if m.shared_ffn:
            ts, fs = mlp(T, m.shared_ffn / cfg.tp, module="shared_experts")
            t_mlp, flops = t_mlp + ts, flops + fs
            g_f, g_b = tp_gather_bytes(ctx, T * h, "shared_experts")
            tp_f, tp_b = tp_comm_s(ctx, cfg, pl, act, ts, g_f), tp_comm_s(ctx, cfg, pl, act, 2 * ts, g_b)
        if etp > 1:  # the ETP group gathers its routed tokens and reduce-scatters the expert outputs
            etp_prof = pl.etp or pl.tp
            et = 2 * all_gather_s(ctx.levels, etp_prof, BF16 * routed * h)
            tp_f += et
            tp_b += et
        t_mlp += _gemm_s(ctx, T, h, E, ctx.hp_flops_per_s)  # router (16-bit in every recipe)
        flops += 2 * T * h * E
        ffn_elem = routed * m.expert_ffn / etp * (3 if m.gated else 2)
        # Permute / unpermute of the routed copies (read + write, dispatch and combine).
        t_mlp += _mem_s(ctx, 4 * BF16 * routed * h)
        if m.expert_bias:  # fc2 bias x router probability, elementwise in fp32 over the fc2 output
            bias_f, bias_b = ctx.framework.expert_bias_bytes
            fwd["compute"], bwd["compute"] = _mem_s(ctx, bias_f * routed * h), _mem_s(ctx, bias_b * routed * h)
        a2a = 0.0
        if cfg.ep > 1 and dispatcher_of(ctx, cfg) == "allgather":
            # Megatron's MoEAllGatherTokenDispatcher: each rank all-gathers the hidden states of its EP
            # group (every token once, not top-k copies; ep x T tokens gathered) and the combine
            # reduce-scatters the expert outputs back (token_dispatcher.py token_permutation /
            # token_unpermutation); the TP part of its TP x EP group is priced with the TP collectives.
            a2a = 2 * all_gather_s(ctx.levels, pl.ep, BF16 * T * cfg.ep * h)
        elif cfg.ep > 1:
            elems = (T / cfg.tp if cfg.sp else T) * k * h * moe_imbalance(ctx, cfg)
            dedup = k if dispatcher_of(ctx, cfg) in ("deepep", "hybridep") else 0
            # node-limited routing bounds the remote nodes a token reaches (hierarchical dispatchers)
            limit = m.moe_max_nodes_per_token if dedup else None
            # a fixed routing pattern (training.moe_routing contiguous) states the ranks and nodes reached
            shares = contiguous_shares(ctx, cfg, pl.ep.members, bool(dedup))
            combine = all_to_all_s(ctx.levels, pl.ep, BF16 * elems, dedup, limit, shares)
            q = ctx.module_saved_input_bytes("routed_experts")  # bf16 where training.bf16_modules keeps them
            if ctx.framework.low_precision_dispatch and q < BF16:
                # DeepSeek-V3 report sec. 3.3.3: the dispatch (and the gradient entering the experts'
                # down-projection in the backward) in FP8 with its scales, both combines in BF16
                a2a = all_to_all_s(ctx.levels, pl.ep, q * elems, dedup, limit, shares) + combine
            else:
                a2a = 2 * combine  # dispatch + combine
    elem = _mlp_elem_s(ctx, sh, ffn_elem)
    fwd["compute"] += t_mlp + elem
    t_b, t_w = _frozen_adjust(ctx, t_mlp)
    bwd["compute"] += t_b + ELEMENTWISE_BWD_FACTOR * elem
    fwd["ep_comm"], bwd["ep_comm"] = a2a, a2a
    fwd["tp_comm"] += tp_f
    bwd["tp_comm"] += tp_b
    return fwd, bwd, t_w, flops


def _mlp_saved_bytes_per_ffn(m, q: float, act_in: float = BF16, act_out: float = 0.0) -> float:
    """Bytes an MLP keeps per token and ffn element: the fc1 output(s) at `act_in` (bf16, two for a
    gated MLP, for its activation's backward) and the fc2 input at `q` (as the framework keeps it);
    a gated MLP run as separate eager ops also keeps its activation's output (`act_out`, the product's
    other operand: `_eager_gate_bytes`)."""
    return (2 if m.gated else 1) * act_in + q + (act_out if m.gated else 0.0)


def eager_step(ctx: Context, cfg: Config, pl: Placement) -> bool:
    """Whether the framework runs this plan's step eagerly: not where it compiles the step with the TP
    overlap it prices (`FrameworkProfile.compiled_with_tp_overlap`: torchtitan's AsyncTP needs
    torch.compile, and the export turns compile on with it and only then). The facts measured on the
    eager step (`unfused_gated_activation`, `loss_logit_bytes`) hold there."""
    return not (ctx.framework.compiled_with_tp_overlap and tp_overlap_on(ctx, cfg, pl))


def _eager_gate_bytes(ctx: Context, eager: bool = True) -> float:
    """Bytes per token and ffn element a gated MLP keeps beyond a fused SwiGLU's where the framework
    runs silu(fc1_gate) * fc1_up as separate eager ops (`FrameworkProfile.unfused_gated_activation`,
    on an `eager_step`): the bf16 activation output (measured on torchtitan 0.2.2: frameworks.yaml)."""
    return BF16 if ctx.framework.unfused_gated_activation and eager else 0.0


def _expert_saved_bytes_per_ffn(ctx: Context, m, q: float, eager: bool = True) -> float:
    """`_mlp_saved_bytes_per_ffn` of the routed experts: their activation's inputs at `q` too where the
    framework caches them quantized (DeepSeek-V3 report sec. 3.3.3: "we cache the inputs of the SwiGLU
    operator ... These activations are also stored in FP8")."""
    return _mlp_saved_bytes_per_ffn(m, q, q if ctx.framework.quantized_expert_act_inputs else BF16,
                                    _eager_gate_bytes(ctx, eager))


def _mamba_cost(ctx: Context, cfg: Config, pl: Placement, sh: Shapes) -> tuple[dict, dict, float, float, float]:
    """Forward/backward of a Mamba2 mixer block (Megatron mamba_mixer.py; Dao & Gu 2024, SSD):
    in_proj (h -> z, x, B, C, dt; column-parallel), the depthwise causal conv1d over x, B, C, the
    chunked SSD scan (Megatron's 7 x d_inner x state FLOPs per token, at the 16-bit rate or HBM bound
    on its inputs and output), the gated RMSNorm, out_proj (row-parallel); TP collectives as around
    attention, and with context parallelism an all-to-all of the mixer's sequence shards to head shards
    and back (MambaContextParallel). Returns (fwd, bwd, 0, wgrad_s, flops_fwd) as `_attention_cost`."""
    m, T, h, tp = sh.m, sh.tokens, sh.h, cfg.tp
    fwd = dict.fromkeys(TIME_KEYS, 0.0)
    bwd = dict.fromkeys(TIME_KEYS, 0.0)
    width, d_in = mamba_in_proj_width(m) / tp, m.mamba_d_inner / tp
    conv_dim = (m.mamba_d_inner + 2 * m.mamba_n_groups * m.ssm_state_size) / tp
    rate = ctx.module_flops_per_s("mamba")
    gemms = [(T, h, width), (T, d_in, h)]
    proj = sum(_gemm_s(ctx, *g, rate) for g in gemms)
    scan_flops = MAMBA_SCAN_FLOPS_PER_STATE * T * d_in * m.ssm_state_size
    scan = max(scan_flops / ctx.attn_flops_per_s, _mem_s(ctx, BF16 * T * (conv_dim + 2 * d_in)))
    conv = _mem_s(ctx, 2 * BF16 * T * conv_dim)
    elem = _mem_s(ctx, BF16 * (sh.res_tokens * h * (2 + 3) + 4 * T * d_in))  # norms, residual, gate
    fwd["compute"] = proj + scan + conv + elem
    proj_b, wgrad = _frozen_adjust(ctx, proj)
    bwd["compute"] = proj_b + MAMBA_SCAN_BWD_FACTOR * scan + ELEMENTWISE_BWD_FACTOR * (conv + elem)
    fwd["tp_comm"] = tp_comm_s(ctx, cfg, pl, BF16 * T * h, proj)
    bwd["tp_comm"] = tp_comm_s(ctx, cfg, pl, BF16 * T * h, 2 * proj)
    if cfg.cp > 1:
        fwd["cp_comm"] = bwd["cp_comm"] = all_to_all_s(ctx.levels, pl.cp, BF16 * T * (conv_dim + d_in))
    flops = sum(2 * x * y * z for x, y, z in gemms) + scan_flops
    return fwd, bwd, 0.0, wgrad, flops


def _mamba_saved_bytes(ctx: Context, cfg: Config, sh: Shapes) -> float:
    """Activation bytes a Mamba2 mixer keeps per micro-batch beside its block's input: in_proj's output
    (z, x, B, C, dt), the conv output, the scan output, the fp32 dt per head and the out_proj input
    (at the recipe's saved-input size), all sharded over TP; in_proj's input is in the stream term."""
    m, T, tp = sh.m, sh.tokens, cfg.tp
    d_in = m.mamba_d_inner / tp
    conv_dim = (m.mamba_d_inner + 2 * m.mamba_n_groups * m.ssm_state_size) / tp
    q = ctx.module_saved_input_bytes("mamba")
    return (BF16 * T * (mamba_in_proj_width(m) / tp + conv_dim + d_in) + 4 * T * m.mamba_heads / tp
            + q * T * d_in)


def _activation_bytes(ctx: Context, cfg: Config, sh: Shapes, kind: str, eager: bool = True) -> dict[str, float]:
    """Activation bytes kept per micro-batch by one layer, per recompute mode (Korthikanti 2022). The
    inputs of the linear layers (QKV, MLA up-projections, attention output projection, fc1, fc2 and
    the experts' fc1) are kept at `Context.saved_input_bytes` per element: bf16, or the recipe's
    FP8/FP4 size where the framework keeps them quantized (Transformer Engine)."""
    m, T, h, t = sh.m, sh.tokens, sh.h, cfg.tp
    div = t if cfg.sp else 1
    block, kind = kind, MLP_KIND.get(kind, kind)  # a hybrid model's block, its MLP kind
    q = ctx.module_saved_input_bytes("attention")  # per module class (training.bf16_modules)
    q_mlp = ctx.module_saved_input_bytes("dense_mlp" if kind == "dense" else "routed_experts")
    q_shared = ctx.module_saved_input_bytes("shared_experts")
    # Residual-stream tensors: LN1 in, QKV in, LN2 in, MLP in (+ 2 one-byte dropout masks).
    stream = (2 * BF16 + q + q_mlp + (2 if m.dropout else 0)) * T * h / div
    if m.is_mla:  # the up-projections' latent inputs, the RoPE key; q, k, v and the proj input
        attn = q * T * (mla_dim(m.kv_lora_rank) + (m.q_lora_rank or 0)) + BF16 * T * mla_dim(m.qk_rope_head_dim)
        attn += BF16 * T * sh.a_local * (2 * sh.d_qk + sh.d_v) + q * T * sh.a_local * sh.d_v
    else:  # q, k, v, proj input
        attn = BF16 * T * sh.d * (sh.a_local + 2 * sh.kv_local) + q * T * sh.d * sh.a_local
    if m.qk_layernorm and not m.is_mla:  # the normalized q and k (new tensors attention saves), each row's fp32 mean and
        # 1/std (TE LayerNorm's saved statistics), beside the raw q and k the norms keep as their input
        attn += (BF16 * sh.d + 2 * 4) * T * (sh.a_local + sh.kv_local)
    mats = _mlp_saved_bytes_per_ffn(m, q_mlp, act_out=_eager_gate_bytes(ctx, eager))
    if kind == "dense":
        mlp = mats * T * m.intermediate_size / t
    else:
        etp = cfg.expert_tp
        routed = routed_tokens(ctx, cfg, sh)
        mlp = _expert_saved_bytes_per_ffn(ctx, m, q_mlp, eager) * routed * m.expert_ffn / etp + q_mlp * routed * h \
            + 4 * T * m.num_experts
        mlp += _mlp_saved_bytes_per_ffn(m, q_shared, act_out=_eager_gate_bytes(ctx, eager)) * T * m.shared_ffn / t
    if ctx.training.flash_attention:
        scores = 4.0 * T * sh.a_local  # log-sum-exp per query and head (fp32)
    else:
        # fused softmax: its bf16 output (shared with PV) + dropout's mask and output; in PyTorch
        # (unfused_softmax_reason) the fp32 softmax output as well as the bf16 probabilities
        fused = unfused_softmax_reason(ctx, sh) is None
        per = ((5 if m.dropout else 2) if fused else (7 if m.dropout else 6)) * cfg.mbs * sh.a_local * (sh.seq / cfg.cp) * sh.seq
        scores = per
    if block in ("mamba", "attention", "mlp", "moe_mlp"):  # a hybrid block: one norm and one mixer or MLP
        first = {"mamba": ctx.module_saved_input_bytes("mamba"), "attention": q}.get(block, q_mlp)
        stream = (BF16 + first + (1 if m.dropout else 0)) * T * h / div
        if block != "attention":
            attn = scores = 0.0
        if block == "mamba":
            attn = _mamba_saved_bytes(ctx, cfg, sh)
        if block in ("mamba", "attention"):
            mlp = 0.0
    none = stream + attn + mlp + scores
    # Selective recompute drops the attention scores (FlashAttention never stores them); a per-op policy
    # keeps what it saves (`op_sac_applies`).
    core_attention = none if ctx.training.flash_attention else none - scores
    selective = min(none, _op_sac_saved_bytes(ctx, cfg, sh)) if op_sac_applies(ctx, block) else core_attention
    return {"none": none, "selective": selective, "full": BF16 * T * h / div, "core_attn": core_attention}


def _priced_once(cache: dict, key: tuple, price: Callable[[], Any], fresh: Callable[[], Any] | None = None) -> Any:
    """price() from `cache[key]`, priced and stored on the first ask (the shared pricings: `_attention_of`,
    `_mlp_of`, `_kind_costs`, `_end_cost`; the stored value must not be modified). Under
    CHECK_KIND_CACHE (tests) every hit is compared with a fresh pricing (`fresh`, default price)."""
    got = cache.get(key)
    if got is None:
        got = cache[key] = price()
    elif CHECK_KIND_CACHE:
        assert (fresh or price)() == got, key
    return got


ATTENTION_TAG = ("attention block",)  # first element of `_attention_of`'s keys (kind keys start with a str)


def _attention_of(ctx: Context, cfg: Config, pl: Placement, sh: Shapes, cache: dict | None) -> tuple:
    """`_attention_cost`, from `cache` where a configuration with the same TP / CP / SP / micro-batch
    shape and TP / CP groups was priced: `_attention_cost` reads nothing else of (cfg, pl) (its
    Shapes: tp, cp, sp, mbs, cp_comm; `tp_comm_s`: tp, sp, tp_overlap, pl.tp; `cp_hierarchy` and the
    CP terms: cp, cp_comm, pl.cp), so the dense and MoE kinds and every expert layout share one
    pricing. Fresh dicts are returned (the cached ones stay unmodified)."""
    if cache is None:
        return _attention_cost(ctx, cfg, pl, sh)
    key = (ATTENTION_TAG, cfg.tp, cfg.sp, cfg.tp_overlap, cfg.cp, cfg.cp_comm, cfg.mbs, pl.tp, pl.cp)
    fwd, bwd, core, wgrad, flops = _priced_once(cache, key, lambda: _attention_cost(ctx, cfg, pl, sh))
    return dict(fwd), dict(bwd), core, wgrad, flops


MLP_TAG = ("mlp block",)  # first element of `_mlp_of`'s keys


def _mlp_of(ctx: Context, cfg: Config, pl: Placement, sh: Shapes, kind: str, cache: dict | None) -> tuple:
    """`_mlp_cost` of an MLP kind ("dense" or "moe"), from `cache` where a configuration with the same
    inputs was priced: `_mlp_cost` reads the tokens per GPU (`Shapes`: micro-batch x sequence / cp, so
    configurations that trade one for the other share it), tp and SP (the residual stream, the
    dispatched copies), the TP overlap and group (`tp_comm_s`) and, for routed experts, ep, the
    expert TP degree, the dispatcher and their groups (`moe_imbalance`, `routed_tokens`,
    `contiguous_shares`, the all-to-all and the ETP gathers): nothing else of (cfg, pl). Fresh dicts
    are returned (the cached ones stay unmodified)."""
    if cache is None:
        return _mlp_cost(ctx, cfg, pl, sh, kind)
    key: tuple = (MLP_TAG, kind, sh.tokens, cfg.tp, cfg.sp, cfg.tp_overlap, pl.tp)
    if kind != "dense":
        key += (cfg.ep, pl.ep, cfg.expert_tp, pl.etp, cfg.dispatcher)
    fwd, bwd, wgrad, flops = _priced_once(cache, key, lambda: _mlp_cost(ctx, cfg, pl, sh, kind))
    return dict(fwd), dict(bwd), wgrad, flops


def layer_costs(ctx: Context, cfg: Config, pl: Placement, kind: str, cache: dict | None = None) -> dict[str, Cost]:
    """One layer of `kind` under every recompute mode (the forward pass, communication and
    activations are priced once and shared by the modes). `cache` (`_kind_costs`'): the attention
    block's pricing shared across kinds and expert layouts (`_attention_of`), the MLP's across
    attention layouts (`_mlp_of`)."""
    sh = Shapes(ctx, cfg)
    zero = dict.fromkeys(TIME_KEYS, 0.0)
    if kind == "mamba":  # a hybrid model's blocks (spec.HYBRID_KINDS) have a mixer or an MLP
        afwd, abwd, core, awgrad, aflops = _mamba_cost(ctx, cfg, pl, sh)
    elif kind in MLP_KIND:
        afwd, abwd, core, awgrad, aflops = zero, zero, 0.0, 0.0, 0.0
    else:
        afwd, abwd, core, awgrad, aflops = _attention_of(ctx, cfg, pl, sh, cache)
    if kind in ("mamba", "attention"):
        mfwd, mbwd, mwgrad, mflops = zero, zero, 0.0, 0.0
    else:
        mfwd, mbwd, mwgrad, mflops = _mlp_of(ctx, cfg, pl, sh, MLP_KIND.get(kind, kind), cache)
    params, experts = layer_params(ctx.model, kind)
    dense_local = (params - experts) / cfg.tp
    expert_local = experts / (cfg.expert_tp * cfg.ep)
    local_experts = ctx.model.num_experts / cfg.ep
    if experts and ctx.training.moe_redundant_experts:  # EPLB keeps the redundant copies' weights too
        expert_local *= 1 + ctx.training.moe_redundant_experts / ctx.model.num_experts
        local_experts *= 1 + ctx.training.moe_redundant_experts / ctx.model.num_experts
    acts = _activation_bytes(ctx, cfg, sh, kind, eager_step(ctx, cfg, pl))
    flops = aflops + mflops
    exposed_ep_s = mfwd["ep_comm"] + mbwd["ep_comm"]  # without the overlap (`ep_overlap_pays`)
    ep_overlap = ep_overlap_on(ctx, cfg)
    if ep_overlap:
        mfwd, mbwd = _ep_overlapped(ctx, cfg, afwd, abwd, mfwd, mbwd, mwgrad)
    zero3 = cfg.zero == 3 and cfg.data_parallel
    ag = ag_bwd = rs = 0.0
    if zero3:
        ag, ag_bwd, rs = _zero3_layer_traffic_s(ctx, cfg, pl, dense_local, expert_local)
    launches = layer_kernels(ctx, cfg, sh, kind)
    if cfg.graph_scope:  # per-layer graphs: the captured launches replay as one graph each
        cap_f, cap_b, graphs = captured_launches(ctx, cfg, sh, kind)
        launches = (launches[0] - cap_f + graphs, launches[1] - cap_b + graphs, launches[2])
    # (what every mode shares, priced once: the summed passes, the dequantization, the gradient
    # accumulation, the working set and held buffers, the MoE host time)
    fwd0 = {key: afwd[key] + mfwd[key] for key in TIME_KEYS}
    bwd0 = {key: abwd[key] + mbwd[key] for key in TIME_KEYS}
    dq = _mem_s(ctx, (QLORA_BYTES_PER_PARAM + BF16) * (dense_local + expert_local)) \
        if ctx.training.finetune == "qlora" else None  # NF4 weights dequantized to bf16 for every GEMM pass
    accum = _grad_accum_s(ctx, dense_local + expert_local)
    work = acts["none"] + cublas_workspace_bytes(ctx, tp_overlap_on(ctx, cfg, pl))
    held = dummy_wgrad_bytes(ctx, dense_local, expert_local / local_experts if experts else 0.0)
    moe_host = moe_host_s(ctx, cfg) if kind in ("moe", "moe_mlp") else 0.0
    out = {}
    for recompute in ctx.modes:
        c = Cost(fwd=dict(fwd0), bwd=dict(bwd0))
        c.wgrad_s = awgrad + mwgrad
        if dq is not None:
            c.fwd["compute"] += dq
            c.bwd["compute"] += dq
        c.params = dense_local + expert_local
        c.expert_params = expert_local
        c.bwd["compute"] += accum
        c.act_bytes = acts.get(recompute, acts["none"])
        c.work_bytes = work
        c.held_bytes = held
        c.hfu_flops = c.base_flops = 3 * flops
        _recompute_mode(ctx, cfg, pl, sh, kind, recompute, c, flops, core, acts, afwd, mfwd)
        host = moe_host
        if host and ep_overlap and not cfg.cuda_graphs:
            extra = ep_overlap_host_s(ctx, cfg, c, host)
            host += extra
            c.ep_overlap_gain_s = exposed_ep_s - mfwd["ep_comm"] - mbwd["ep_comm"] - extra
        if ctx.training.launch_blocking and not cfg.cuda_graphs:
            host += BLOCKING_LAYER_HOST_S
        if host:
            c.fwd["host"], c.bwd["host"] = host / 3, 2 * host / 3
        # a dropless layer's token-count sync stops the host until the GPU drains: its forward launches
        # cannot run ahead under the MoE host work that follows (`_eager_host` `synced_fwd_s`)
        synced = c.fwd["host"] if host and ctx.training.moe_capacity_factor is None else 0.0
        _eager_host(ctx, cfg, c, recompute, launches, kind, synced)
        if zero3:
            _zero3_exposed(cfg, c, ag, ag_bwd, rs)
        out[recompute] = c
    return out


def _ep_overlapped(ctx: Context, cfg: Config, afwd: dict[str, float], abwd: dict[str, float],
                   mfwd: dict[str, float], mbwd: dict[str, float], mwgrad: float,
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """The MLP's forward and backward times with the expert all-to-all overlapped (`ep_overlap_on`):
    what stays exposed of each pass's dispatch and combine (new dicts; the arguments are unchanged)."""
    if cfg.schedule == "dualpipe":
        # DualPipe (DeepSeek-V3 report sec. 3.2.1, Fig. 4) runs a forward chunk beside a backward chunk
        # of another micro-batch, each split into attention, dispatch, MLP and combine, with the
        # all-to-all of one chunk on the communication SMs while the other chunk computes: the
        # forward's dispatch + combine hide under the paired backward's computation and the
        # backward's under the paired forward's; only what exceeds it is exposed.
        # Where the framework names the SMs its communication kernels hold (DeepSeek: 20 of the H800's
        # 132, report sec. 3.2.2 and 3.5.1: "which will limit the computational throughput"), both
        # chunks compute on the rest for the whole pair: the computation is slower by sms / (all - sms),
        # charged to the all-to-all that costs it.
        mfwd, mbwd = dict(mfwd), dict(mbwd)
        f_comp, b_comp = afwd["compute"] + mfwd["compute"], abwd["compute"] + mbwd["compute"]
        sms = ctx.framework.ep_comm_sms
        if sms and ctx.gpu.sm_count and mfwd["ep_comm"] > 0:
            slow = sms / (ctx.gpu.sm_count - sms)
            mfwd["ep_comm"] = max(0.0, mfwd["ep_comm"] - b_comp * (1 + slow)) + slow * f_comp
            mbwd["ep_comm"] = max(0.0, mbwd["ep_comm"] - f_comp * (1 + slow)) + slow * b_comp
        else:
            mfwd["ep_comm"] = overlapped(mfwd["ep_comm"], b_comp)
            mbwd["ep_comm"] = overlapped(mbwd["ep_comm"], f_comp)
        return mfwd, mbwd
    # Megatron's EP overlap runs one micro-batch's forward beside another's backward, layer by
    # layer, each all-to-all beside one piece of the other pass (model_chunk_schedule_plan.py
    # TransformerLayerSchedulePlan.run: comm combine_bwd | dispatch_fwd -> dispatch_bwd |
    # combine_fwd against comp attention fwd | mlp dgrad -> mlp wgrad -> mlp fwd | attention bwd).
    half_f, half_b = mfwd["ep_comm"] / 2, mbwd["ep_comm"] / 2  # dispatch and combine
    m_dgrad = mbwd["compute"] - mwgrad
    mfwd, mbwd = dict(mfwd), dict(mbwd)
    mfwd["ep_comm"] = overlapped(half_f, m_dgrad) + overlapped(half_f, abwd["compute"])
    mbwd["ep_comm"] = overlapped(half_b, mwgrad + mfwd["compute"]) + overlapped(half_b, afwd["compute"])
    return mfwd, mbwd


def _zero3_layer_traffic_s(ctx: Context, cfg: Config, pl: Placement, dense_local: float,
                           expert_local: float) -> tuple[float, float, float]:
    """ZeRO-3's per-layer (forward gather, backward gather, gradient reduce-scatter) seconds: this layer's
    weights gathered before forward and backward, its gradients reduce-scattered; what the framework
    does once per step instead is left to the tail (`cost.tail_model`)."""
    ag, ag_bwd, rs = _zero3_layer_comm_s(ctx, cfg, pl, dense_local, expert_local)
    if zero3_step_sync(ctx.framework, cfg):  # reduced once per step, in the tail (`cost.tail_model`)
        rs = 0.0
        if reshard_policy(ctx.framework, cfg) == "never":
            ag = 0.0  # gathered once per step by the first forward, kept: the tail's gather
    return ag, ag_bwd, rs


def _recompute_mode(ctx: Context, cfg: Config, pl: Placement, sh: Shapes, kind: str, recompute: str, c: Cost,
                    flops: float, core: float, acts: dict[str, float], afwd: dict[str, float],
                    mfwd: dict[str, float]) -> None:
    """The recompute mode's price on `c`: the backward's recompute time, the activations it keeps and
    the hardware FLOPs it adds (full, selective, offload to host, or Megatron's recompute modules)."""
    if recompute == "full":
        c.bwd["recompute"] = sum(c.fwd[k] for k in ("compute", "tp_comm", "cp_comm", "ep_comm"))
        c.hfu_flops += flops
    elif recompute == "selective" and op_sac_applies(ctx, kind):
        t_s, fl = _op_sac_recompute(ctx, cfg, sh, afwd, mfwd)
        c.bwd["recompute"] = t_s
        c.hfu_flops += fl
    elif recompute == "selective":
        c.bwd["recompute"] = core
        c.hfu_flops += core_attention_flops(sh) if core else 0.0
    elif recompute == "offload":
        # Activation offloading (TE / Megatron --cpu-offloading): the layer's saved activations
        # stream to host memory during the forward and back before its backward, over the host
        # link, hidden under the layer's computation where it is long enough.
        moved = acts["none"] - acts["full"]
        c.act_bytes = acts["full"]
        link = ctx.gpu.host_link_bytes_per_s
        c.fwd["offload"] = overlapped(moved / link, c.fwd["compute"])
        c.bwd["offload"] = overlapped(moved / link, c.bwd["compute"])
    elif recompute != "none":  # Megatron recompute modules
        for module in recompute.split("+"):
            t_s, saved, fl = _module_recompute(ctx, cfg, pl, sh, kind, module, afwd, mfwd, core, acts)
            graphed = cfg.cuda_graphs or module_in_graph(cfg.graph_scope, module)
            if (t_s or saved) and not graphed:  # the module's checkpoint wrapper's host time
                t_s += ctx.framework.recompute_module_host_s
            c.bwd["recompute"] += t_s
            c.act_bytes -= saved
            c.hfu_flops += fl
        c.act_bytes = max(c.act_bytes, acts["full"])


def op_sac_applies(ctx: Context, kind: str) -> bool:
    """Whether this layer's "selective" recompute is the framework's per-op policy that re-runs every
    second matmul (`FrameworkProfile.selective_recompute`, torchtitan's per-op SAC): priced so on the
    dense transformer block (attention + MLP, MLA or not), whose matmuls run in a known order. Other
    kinds (MoE, hybrid blocks) keep the attention-core pricing: which of their expert GEMMs the
    policy saves depends on the torch release's op list (not priced)."""
    return ctx.framework.selective_recompute == "every_second_matmul" and kind == "dense"


def _op_sac_gemms(ctx: Context, cfg: Config, sh: Shapes) -> list[tuple[float, float, float, float | None]]:
    """A dense block's matmuls in the order its forward calls them, each (m, k, n, rate): torchtitan's
    Attention calls wq, wk, wv (or MLA's wq / wq_a, wq_b, then wkv_a, wkv_b), then wo; its FeedForward
    w1, w3, w2 (w1, w2 ungated) (torchtitan/models/llama3/model.py, deepseek_v3/model/model.py)."""
    m, T, h = sh.m, sh.tokens, sh.h
    a, kv = sh.a_local, sh.kv_local
    ra, rm = ctx.module_flops_per_s("attention"), ctx.module_flops_per_s("dense_mlp")
    if m.is_mla:
        kv_rank, nope, rope = mla_dim(m.kv_lora_rank), mla_dim(m.qk_nope_head_dim), mla_dim(m.qk_rope_head_dim)
        q = [(T, h, m.q_lora_rank), (T, m.q_lora_rank, a * sh.d_qk)] if m.q_lora_rank else [(T, h, a * sh.d_qk)]
        attn = q + [(T, h, kv_rank + rope), (T, kv_rank, a * (nope + sh.d_v)), (T, a * sh.d_v, h)]
    else:
        attn = [(T, h, a * sh.d), (T, h, kv * sh.d), (T, h, kv * sh.d), (T, a * sh.d, h)]
    ffn = m.intermediate_size / cfg.tp
    mlp = [(T, h, ffn), (T, h, ffn), (T, ffn, h)] if m.gated else [(T, h, ffn), (T, ffn, h)]
    return [(*g, ra) for g in attn] + [(*g, rm) for g in mlp]


def _op_sac_recompute(ctx: Context, cfg: Config, sh: Shapes, afwd: dict[str, float],
                      mfwd: dict[str, float]) -> tuple[float, float]:
    """(backward recompute seconds, FLOPs re-run) of a dense block under per-op selective checkpointing
    (`op_sac_applies`): every second matmul of the block in call order (`_op_sac_gemms`: wk, wo, w3 of a
    Llama block), all of its elementwise work (norms, RoPE, activation, residual adds) and its TP
    collectives other than the reduce-scatters (the policy saves reduce_scatter_tensor): with sequence
    parallelism the forward's all-gathers (half of its TP time), without it the all-reduces (all of
    it). The attention core is saved, not re-run."""
    gemms = _op_sac_gemms(ctx, cfg, sh)[1::2]
    t_s = sum(_gemm_s(ctx, x, y, z, r) for x, y, z, r in gemms)
    ffn_elem = sh.tokens * sh.m.intermediate_size / cfg.tp * (3 if sh.m.gated else 2)
    t_s += _attention_elem_s(ctx, sh) + _mlp_elem_s(ctx, sh, ffn_elem)
    tp = afwd["tp_comm"] + mfwd["tp_comm"]
    t_s += tp / 2 if cfg.sp else tp
    return t_s, sum(2 * x * y * z for x, y, z, _ in gemms)


def _op_sac_saved_bytes(ctx: Context, cfg: Config, sh: Shapes) -> float:
    """Activation bytes a dense block keeps per micro-batch under per-op selective checkpointing
    (`op_sac_applies`): the block's input (what the checkpoint wrapper keeps), the outputs of the
    matmuls it saves (the odd ones of `_op_sac_gemms`, bf16), the attention output and its fp32
    log-sum-exp, and with sequence parallelism the two reduce-scatters' outputs."""
    T, h = sh.tokens, sh.h
    div = cfg.tp if cfg.sp else 1
    saved = sum(BF16 * x * z for x, _, z, _ in _op_sac_gemms(ctx, cfg, sh)[0::2])
    saved += BF16 * T * h / div + BF16 * T * sh.a_local * sh.d_v + 4.0 * T * sh.a_local
    if cfg.sp and cfg.tp > 1:
        saved += 2 * BF16 * T * h / cfg.tp
    return saved


def _zero3_exposed(cfg: Config, c: Cost, ag: float, ag_bwd: float, rs: float) -> None:
    """ZeRO-3's layer traffic on `c`: prefetched under the computation (FSDP2, DeepSpeed ZeRO-3,
    Megatron-FSDP with --overlap-param-gather / --overlap-grad-reduce); a plan turning an overlap off
    where the launcher has the switch (frameworks.yaml dp_overlap_flags) pays that part exposed."""
    hidden = (ag_bwd if cfg.param_overlap else 0.0) + (rs if cfg.grad_overlap else 0.0)
    exposed = ag_bwd + rs - hidden
    c.fwd["zero3_comm"] = overlapped(ag, c.fwd["compute"]) if cfg.param_overlap else ag
    c.bwd["zero3_comm"] = exposed + overlapped(hidden, c.bwd["compute"] + c.bwd["recompute"])


def cublas_workspace_bytes(ctx: Context, tp_overlap: bool = False) -> float:
    """cuBLAS workspaces the framework's process holds through PyTorch's caching allocator for the whole
    run (CUBLAS_WORKSPACE_BYTES by library and GPU generation, `FrameworkProfile.cublas_workspaces`):
    counted once in the working memory (`Cost.work_bytes` of every layer and of the head, of which a
    stage's peak takes the largest). PyTorch's are per thread (CUBLAS_WORKSPACES_PER_PROCESS: the forward's
    and autograd's); with `tp_overlap` (TP communication overlapped as priced, `tp_overlap_on`) the
    framework's userbuffers workspaces too (`FrameworkProfile.tp_overlap_cublas_workspaces`)."""
    sm90 = ctx.gpu.arch in SM90_ARCHS
    libs = ctx.framework.cublas_workspaces + (ctx.framework.tp_overlap_cublas_workspaces if tp_overlap else ())
    return float(sum(CUBLAS_WORKSPACE_BYTES[lib][sm90] * CUBLAS_WORKSPACES_PER_PROCESS[lib] for lib in libs))


def dummy_wgrad_bytes(ctx: Context, *weights: float) -> float:
    """The dummy weight gradients a piece's linear layers keep for the whole run where the framework
    fuses the weight-gradient accumulation (`FrameworkProfile.dummy_wgrads` with
    training.gradient_accumulation_fusion: Transformer Engine's get_dummy_wgrad caches one tensor per
    distinct (shape, dtype), in the weights' 16-bit dtype): `weights` are the piece's local weights of
    distinct shapes (a layer's own, one local expert's: the experts share theirs). Frozen weights (LoRA,
    QLoRA) have no weight gradient: none."""
    t = ctx.training
    if not (ctx.framework.dummy_wgrads and t.gradient_accumulation_fusion and t.finetune == "full"):
        return 0.0
    return BF16 * sum(weights)


def _eager_host(ctx: Context, cfg: Config, c: Cost, recompute: str, launches: tuple[int, int, int],
                kind: str = "dense", synced_fwd_s: float = 0.0) -> None:
    """Add to `c` the host launch time its GPU work does not hide: eager frameworks launch every
    kernel from Python (`layer_kernels` launches at EAGER_LAUNCH_HOST_S each), ahead of the GPU and
    asynchronously, so each pass takes the longer of its GPU time and its host time (not their sum).
    `synced_fwd_s`: forward host time already in `c` that stalls the launches instead of hiding them,
    the MoE host work after a dropless dispatcher's device-to-host sync (token_dispatcher.py
    `_maybe_dtoh_and_synchronize`: `d2h_event.synchronize()` at `cuda_sync_point` every layer, the
    GPU's queue empty after it), so the forward takes it plus the longer of the rest of its GPU time
    and its launches; the backward has no sync (the splits stay on the host) and takes the longer of
    its launches and all of its time.
    The backward also launches what it recomputes: the whole forward (full), the core attention
    (selective, `core_attn`) or about three launches per other recompute module. Full-iteration CUDA
    graphs replay the step without the host, a compiled step (XLA) launches from C++, and under
    CUDA_LAUNCH_BLOCKING the host time is already serial (BLOCKING_LAYER_HOST_S): none here. ZeRO-3's
    per-layer traffic is priced after, against the kernels alone (a host-bound layer does not hide it:
    conservative, and the form the solver's bounds assume)."""
    if cfg.cuda_graphs or ctx.training.launch_blocking or not ctx.framework.eager_launches:
        return
    fwd_k, bwd_k, core_k = launches
    if recompute == "full" or (recompute == "selective" and op_sac_applies(ctx, kind)):
        bwd_k += fwd_k  # (per-op SAC re-runs every op but the few it saves: about the forward's launches)
    elif recompute == "selective":
        bwd_k += core_k
    elif recompute not in ("none", "offload"):
        bwd_k += sum(core_k if mod == "core_attn" else 3 for mod in recompute.split("+"))
    # FSDP2's per-block hooks (`FrameworkProfile.fsdp_block_host_s`) run on the same host thread, a
    # third before the forward (all-gather) and two thirds around the backward (re-gather, reduce-scatter)
    hooks = ctx.framework.fsdp_block_host_s if cfg.zero == 3 else 0.0
    c.fwd["host"] += max(0.0, fwd_k * EAGER_LAUNCH_HOST_S + hooks / 3 - (c.fwd_s - synced_fwd_s))
    c.bwd["host"] += max(0.0, bwd_k * EAGER_LAUNCH_HOST_S + 2 * hooks / 3 - c.bwd_s)


def _fsdp_outer_host(ctx: Context, cfg: Config, c: Cost) -> None:
    """Add to `c` (the embedding or the head) the host time eager FSDP2 spends per micro-batch on the
    units outside the blocks, `FrameworkProfile.fsdp_outer_host_s_per_param` per parameter they hold
    (measured: frameworks.yaml), where the GPU work of that piece does not hide it (a third in the
    forward, two thirds in the backward, as `_eager_host`). None without FSDP (ZeRO-3), under CUDA
    graphs or a compiled step."""
    rate = ctx.framework.fsdp_outer_host_s_per_param
    if not rate or cfg.zero != 3 or cfg.cuda_graphs or not ctx.framework.eager_launches:
        return
    host = rate * c.params
    c.fwd["host"] += max(0.0, host / 3 - c.fwd_s)
    c.bwd["host"] += max(0.0, 2 * host / 3 - c.bwd_s)


def _zero3_layer_comm_s(ctx: Context, cfg: Config, pl: Placement, dense: float, expert: float
                        ) -> tuple[float, float, float]:
    """(forward all-gather, backward all-gather, gradient reduction) of one ZeRO-3 / FSDP layer holding
    `dense` and `expert` local parameters. The weights gather over the group they shard over (dp x cp,
    or under hierarchical sharding its shard group of dp x cp / dp_replicate consecutive ranks) before
    the forward; before the backward again ("always"), not at all ("never": kept since the forward), or
    over the secondary shard group of N ranks inside it (FSDP2 reshard_after_forward=N, ZeRO++ hpZ).
    Gradients reduce-scatter over the shard group and, with replicas, the shard is all-reduced across
    them (FSDP2 HSDP, DeepSpeed MiCS), each at the level its group crosses."""
    w_b, g_b = zero3_bytes_per_param(ctx)
    lv = ctx.levels
    d_in, d_out = shard_profiles(pl.dp_cp, cfg.shard_dense, cfg.dp_replicate)
    e_in, e_out = shard_profiles(pl.edp, cfg.shard_expert, cfg.dp_replicate)
    ag = all_gather_s(lv, d_in, w_b * dense) + all_gather_s(lv, e_in, w_b * expert)
    rs = reduce_scatter_s(lv, d_in, g_b * dense) + reduce_scatter_s(lv, e_in, g_b * expert)
    if d_out is not None:
        rs += all_reduce_s(lv, d_out, g_b * dense / d_in.size)
    if e_out is not None:
        rs += all_reduce_s(lv, e_out, g_b * expert / e_in.size)
    policy = reshard_policy(ctx.framework, cfg)
    if policy == "always":
        ag_bwd = ag
    elif policy == "never":
        ag_bwd = 0.0
    else:
        d_sec = split_profile(d_in, min(int(policy), d_in.size))[0]
        e_sec = split_profile(e_in, min(int(policy), e_in.size))[0]
        ag_bwd = all_gather_s(lv, d_sec, w_b * dense) + all_gather_s(lv, e_sec, w_b * expert)
    return ag, ag_bwd, rs


def _module_recompute(ctx: Context, cfg: Config, pl: Placement, sh: Shapes, kind: str, module: str,
                      afwd: dict, mfwd: dict, core_s: float,
                      acts: dict[str, float]) -> tuple[float, float, float]:
    """(time re-run in the backward, activation bytes no longer kept, FLOPs re-run) of one Megatron
    recompute module on one layer of `kind` (a module that does not apply to the kind costs nothing):
    core_attn re-runs core attention; layernorm both norms (drops their outputs); mlp the dense MLP
    block and moe the whole MoE block (its all-to-all too), each keeping only its input; moe_act the
    experts' activation function (drops its output); shared_experts the shared-expert MLP; mlp_up the
    dense MLP's fc1 and activation without fc2 (JAX remat: spec.RECOMPUTE_MODULES), keeping the MLP's input;
    mla_up_proj MLA's query/key/value up-projections (drops q, k, v, keeps the latents): Megatron's
    `qkv_up_proj_and_rope_apply` re-runs the query projection (`linear_q_up_proj` on the q latent, or
    `linear_q_proj` on the hidden state where the model has no q_lora_rank, as Moonlight), the key/value
    up-projection, RoPE and the q/k concatenation; with sequence parallelism both column-parallel
    projections all-gather their sequence-sharded inputs again (multi_latent_attention.py)."""
    m, T, h, t = sh.m, sh.tokens, sh.h, cfg.tp
    div = t if cfg.sp else 1
    kind = MLP_KIND.get(kind, kind)  # a hybrid model's MLP-only block prices as its MLP kind
    q_attn = ctx.module_saved_input_bytes("attention")  # linear-layer inputs as kept (_activation_bytes)
    q = ctx.module_saved_input_bytes("dense_mlp" if kind == "dense" else "routed_experts")
    mats = _mlp_saved_bytes_per_ffn(m, q)
    etp = cfg.expert_tp
    routed = routed_tokens(ctx, cfg, sh)
    if module == "core_attn":
        return core_s, acts["none"] - acts["core_attn"], core_attention_flops(sh) if core_s else 0.0
    if module == "layernorm":
        return _mem_s(ctx, 2 * 2 * BF16 * T * h / div), (q_attn + q) * T * h / div, 0.0
    if module == "mlp" and kind == "dense":
        return (mfwd["compute"] + mfwd["tp_comm"], mats * T * m.intermediate_size / t,
                2 * T * h * m.intermediate_size / t * (3 if m.gated else 2))
    if module == "mlp_up" and kind == "dense":
        # fc1 (gate and up) and the activation re-run; fc2 not (no backward needs its output): its
        # GEMM, and the activation reading the fc1 output(s) and writing fc2's input, all bf16
        ffn, up_mats = m.intermediate_size / t, (3 if m.gated else 2) - 1
        up = _gemm_s(ctx, T, h, up_mats * ffn, ctx.module_flops_per_s("dense_mlp"))
        return up + _mem_s(ctx, (up_mats + 1) * BF16 * T * ffn), mats * T * ffn, 2 * T * h * ffn * up_mats
    if module == "moe" and kind == "moe":
        saved = _expert_saved_bytes_per_ffn(ctx, m, q) * routed * m.expert_ffn / etp + q * routed * h \
            + mats * T * m.shared_ffn / t
        return (mfwd["compute"] + mfwd["tp_comm"] + mfwd["ep_comm"], saved,
                2 * routed * h * m.expert_ffn / etp * (3 if m.gated else 2))
    if module == "moe_act" and kind == "moe":
        act_out = BF16 * routed * m.expert_ffn / etp
        return _mem_s(ctx, (3 if m.gated else 2) * act_out), q / BF16 * act_out, 0.0
    if module == "shared_experts" and kind == "moe" and m.shared_ffn:
        ffn = m.shared_ffn / t
        rate = ctx.module_flops_per_s("shared_experts")
        up = _gemm_s(ctx, T, h, ((3 if m.gated else 2) - 1) * ffn, rate)
        down = _gemm_s(ctx, T, ffn, h, rate)
        shared = _mlp_saved_bytes_per_ffn(m, ctx.module_saved_input_bytes("shared_experts"))
        return up + down, shared * T * ffn, 2 * T * h * ffn * (3 if m.gated else 2)
    if module == "mla_up_proj" and m.is_mla:
        a = sh.a_local
        q_in = m.q_lora_rank or h
        kv_rank = mla_dim(m.kv_lora_rank)
        gemms = [(T, kv_rank, a * (mla_dim(m.qk_nope_head_dim) + sh.d_v)), (T, q_in, a * sh.d_qk)]
        qkv = BF16 * T * a * (2 * sh.d_qk + sh.d_v)
        t_s = sum(_gemm_s(ctx, *g) for g in gemms) + _mem_s(ctx, 2 * qkv)  # GEMMs, RoPE + concatenation
        if cfg.sp and t > 1:
            t_s += all_gather_s(ctx.levels, pl.tp, BF16 * T * (q_in + kv_rank))
        return t_s, qkv, sum(2 * x * y * z for x, y, z in gemms)
    return 0.0, 0.0, 0.0


def layer_cost(ctx: Context, cfg: Config, pl: Placement, kind: str, recompute: Recompute) -> Cost:
    """One layer of `kind` with one recompute mode (see `layer_costs`)."""
    return layer_costs(ctx, cfg, pl, kind)[recompute]


def _grad_accum_s(ctx: Context, params: float) -> float:
    """Time each micro-batch's backward spends folding the gradients of `params` local parameters into
    the accumulator where the framework does it in a separate pass
    (`FrameworkProfile.grad_accum_bytes_per_param`: DeepSpeed's BF16_Optimizer); frozen weights
    (LoRA) have no gradients to fold."""
    per = ctx.framework.grad_accum_bytes_per_param
    return _mem_s(ctx, per * params) if per and ctx.training.finetune == "full" else 0.0


def _embedding_cost(ctx: Context, cfg: Config, pl: Placement) -> Cost:
    """Input embedding (first virtual stage): lookup, and its all-reduce / scatter over TP. Its
    parameters: the vocabulary-parallel token embedding and a learned position table, whole on every TP
    rank (`ModelSpec.learned_position_embeddings`)."""
    m = ctx.model
    sh = Shapes(ctx, cfg)
    c = Cost()
    c.params = m.vocab_size * m.hidden_size / cfg.tp + m.learned_position_embeddings * m.hidden_size
    c.fwd["compute"] = _mem_s(ctx, 2 * BF16 * sh.tokens * sh.h)
    c.bwd["compute"] = _mem_s(ctx, 3 * BF16 * sh.tokens * sh.h) + _grad_accum_s(ctx, c.params)
    if cfg.tp > 1:
        act = BF16 * sh.tokens * sh.h
        op = reduce_scatter_s if cfg.sp else all_reduce_s
        c.fwd["tp_comm"] = op(ctx.levels, pl.tp, act)
    c.act_bytes = 0.0
    # the batch's attention masks a data-loading rank holds (`step.working_bytes` adds them on the first
    # and last stages): [micro-batch, 1, seq, seq] bool, BATCH_MASKS of them
    if ctx.training.attention_mask_in_batch:
        c.work_bytes = BATCH_MASKS * cfg.mbs * sh.seq * sh.seq
    _fsdp_outer_host(ctx, cfg, c)
    return c


def _with_mtp(ctx: Context, cfg: Config, head: Cost, block: Cost) -> Cost:
    """The head with the model's `num_nextn_predict_layers` multi-token-prediction modules beside it
    (DeepSeek-V3 report sec. 2.2), on the rank that holds the head (sec. 3.2.3). Each module: the
    RMSNorms of the hidden state and of the next token's embedding, their concatenation projected
    2h -> h (a GEMM at the recipe's rate, its input kept at the recipe's size), a transformer `block`
    of the last layer's kind, and the output head and cross-entropy once more. The embedding and the
    head are the main model's own (no parameters of their own). The block is priced without recompute
    (the report names none for it), the same for every plan, so `evaluate` and the solver agree."""
    d = ctx.model.num_nextn_predict_layers
    sh = Shapes(ctx, cfg)
    T, h = sh.tokens, sh.h
    proj = _gemm_s(ctx, T, 2 * h, h / cfg.tp)
    c = Cost()
    for k in c.fwd:
        c.fwd[k] = head.fwd[k] + d * (head.fwd[k] + block.fwd[k])
        c.bwd[k] = head.bwd[k] + d * (head.bwd[k] + block.bwd[k])
    c.fwd["compute"] += d * (proj + _mem_s(ctx, 3 * 2 * BF16 * T * h))
    c.bwd["compute"] += d * 2 * proj
    c.wgrad_s = head.wgrad_s + d * (head.wgrad_s + block.wgrad_s + proj)
    c.deferred_s = (1 + d) * head.deferred_s  # each pass through the shared output layer defers its GEMM alike
    c.params = head.params + d * (block.params + 2 * h * h / cfg.tp + 3 * h)  # enorm, hnorm, final norm
    c.expert_params = head.expert_params + d * block.expert_params
    mtp_flops = 3 * 2 * T * 2 * h * h / cfg.tp
    c.base_flops = head.base_flops + d * (head.base_flops + block.base_flops + mtp_flops)
    c.hfu_flops = head.hfu_flops + d * (head.hfu_flops + block.hfu_flops + mtp_flops)
    c.act_bytes = head.act_bytes + d * (head.act_bytes + block.act_bytes + ctx.saved_input_bytes * T * 2 * h)
    c.work_bytes = max(head.work_bytes, block.work_bytes)
    c.held_bytes = head.held_bytes + dummy_wgrad_bytes(ctx, 2 * h * h / cfg.tp)  # (the projection's shape)
    return c


def _head_cost(ctx: Context, cfg: Config, pl: Placement) -> Cost:
    """Final norm + LM head + vocab-parallel cross-entropy (last virtual stage)."""
    m = ctx.model
    sh = Shapes(ctx, cfg)
    T, h, V = sh.tokens, sh.h, m.vocab_size / cfg.tp
    c = Cost()
    c.params = 0.0 if (m.tie_word_embeddings and cfg.pp == 1) else m.vocab_size * h / cfg.tp
    head = _gemm_s(ctx, T, h, V, ctx.hp_flops_per_s)  # the output layer stays 16-bit in every recipe
    ce = _mem_s(ctx, (BF16 + 4 + 4) * T * V)  # logits -> fp32 softmax -> grad
    c.fwd["compute"] = head + ce + _mem_s(ctx, 2 * BF16 * sh.res_tokens * h)
    head_b, c.wgrad_s = (2 * head, head) if ctx.training.finetune == "full" else (head, 0.0)  # LoRA: frozen head
    deferred = deferred_head_wgrad(ctx, cfg) if c.wgrad_s else 0.0
    head_b -= head * deferred
    c.wgrad_s -= head * deferred
    c.deferred_s = head * deferred * num_microbatches(ctx.problem, cfg)
    c.bwd["compute"] = head_b + ce + _grad_accum_s(ctx, c.params)
    if cfg.tp > 1:
        act = BF16 * T * h
        op = all_gather_s if cfg.sp else all_reduce_s
        c.fwd["tp_comm"] = op(ctx.levels, pl.tp, act)
        c.bwd["tp_comm"] = c.fwd["tp_comm"]
    c.hfu_flops = c.base_flops = 3 * 2 * T * h * V
    c.act_bytes = BF16 * T * h / (cfg.tp if cfg.sp else 1)
    # what the loss holds per logit of one micro-batch at its backward's peak (`loss_work_bytes`: the
    # framework's bytes per logit on an eager step, `FrameworkProfile.loss_logit_bytes`), and the cuBLAS
    # workspaces
    logit_b = ctx.framework.loss_logit_bytes if eager_step(ctx, cfg, pl) else LOGIT_WORK_BYTES  # compiled: not measured
    c.work_bytes = loss_work_bytes(ctx, cfg, T, V, logit_b) + cublas_workspace_bytes(ctx, tp_overlap_on(ctx, cfg, pl))
    # the output layer's [vocab / TP, hidden] weight, its own or the tied embedding's, has a dummy of its own
    c.held_bytes = dummy_wgrad_bytes(ctx, V * h)
    _fsdp_outer_host(ctx, cfg, c)
    return c


def deferred_head_wgrad(ctx: Context, cfg: Config) -> float:
    """Share of the micro-batches whose output-layer weight gradient Megatron defers to the step's end
    (training.defer_embedding_wgrad, --defer-embedding-wgrad-compute): tensor_parallel/layers.py
    LinearWithGradAccumulationAndAsyncCommunication.backward keeps the first --wgrad-deferral-limit
    micro-batches' logit gradients and inputs (0: all of them) instead of running their weight-gradient
    GEMM, and pipeline_parallel/schedules.py finish_embedding_wgrad_compute runs those GEMMs on the last
    stage after its last backward, before finalize_model_grads (Megatron-LM d98e8a64dd). The head's
    backward per micro-batch loses that share of its weight-gradient GEMM; `step.deferred_exposed_s`
    prices the GEMMs at the end. 0 without the knob."""
    t = ctx.training
    if not t.defer_embedding_wgrad:
        return 0.0
    m = num_microbatches(ctx.problem, cfg)
    return min(t.wgrad_deferral_limit or m, m) / m


def loss_work_bytes(ctx: Context, cfg: Config, tokens: float, vocab_local: float,
                    logit_bytes: float = LOGIT_WORK_BYTES) -> float:
    """Transient memory at the loss of one micro-batch on the last stage: `logit_bytes` per logit (the
    bf16 logits and their fp32 copy, LOGIT_WORK_BYTES; torchtitan's eager fp32 loss holds more:
    `FrameworkProfile.loss_logit_bytes`; FUSED_CE_EXTRA_BYTES more with training.cross_entropy_fusion), and
    with training.defer_embedding_wgrad the output layer's bf16 logit gradients and bf16 inputs of the
    deferred micro-batches already through their backward (tensor_parallel/layers.py: the first
    wgrad_deferral_limit of them, 0 = all; kept until schedules.finish_embedding_wgrad_compute): at the
    backward of a later micro-batch min(limit, M - 1) of them beside its own loss."""
    t = ctx.training
    work = (logit_bytes + (FUSED_CE_EXTRA_BYTES if t.cross_entropy_fusion else 0)) * tokens * vocab_local
    if t.defer_embedding_wgrad:
        m = num_microbatches(ctx.problem, cfg)
        kept = min(t.wgrad_deferral_limit or m, m - 1)
        h_local = ctx.model.hidden_size / (cfg.tp if cfg.sp else 1)  # input_parallel: sequence-sharded under SP
        work += kept * BF16 * tokens * (vocab_local + h_local)
    return work


# The entry of a `shared_costs` cache that holds one kind's layer costs (`_kind_costs`).
KIND_COSTS = ("layer costs by kind",)
END_COSTS = ("embedding and head",)  # first element of `_end_cost`'s keys in the same cache
KIND_DICTS = "kind costs"  # the `Table.memo` entry of each kind's {mode: cost} (`shared_costs`)
CHECK_KIND_CACHE = False  # tests set it: every hit of a shared pricing (`_priced_once`) is compared with a fresh one


def _kind_key(ctx: Context, cfg: Config, pl: Placement, kind: str) -> tuple:
    """Everything `layer_costs` reads of (cfg, pl) for one layer kind: configurations and placements
    that differ elsewhere (pp, dp, vpp, schedule, ZeRO below 3, the data-parallel and pipeline
    groups) share the kind's costs. The pipeline degree and schedule reach a layer only through
    whether the EP overlap runs (`ep_overlap_on`, in the key; DualPipe's pairing named apart), dp only
    through ZeRO-3's shard groups (in the key where ZeRO-3 applies). A kind without routed experts
    (dense, attention, Mamba) reads nothing of the expert layout: its expert parameters are 0, so
    every expert term (the expert ZeRO-3 gathers and reductions of 0 bytes, all 0 s) vanishes, its
    MLP has no dispatcher, no all-to-all and no MoE host time, and the EP overlap re-times only the
    all-to-all (overlapped(0, x) = 0); so ep, etp, their groups, the dispatcher and the overlap are
    left out of its key. tests/test_solver_speed.py checks every cached kind against a fresh pricing."""
    zero3 = cfg.zero == 3 and cfg.data_parallel
    experts = MLP_KIND.get(kind, kind) == "moe"
    z3: tuple | None = None
    if zero3:
        z3 = (cfg.dp, cfg.dp_replicate, pl.dp_cp, cfg.shard_dense, reshard_policy(ctx.framework, cfg),
              zero3_step_sync(ctx.framework, cfg), cfg.grad_overlap, cfg.param_overlap)
        if experts:
            z3 += (pl.edp, cfg.shard_expert)
    # cfg.zero == 3 apart from zero3: eager FSDP2's per-block host time (`_eager_host`) applies to a fully
    # sharded plan without data parallelism too (one rank, measured so)
    common = (kind, cfg.tp, cfg.cp, cfg.sp, cfg.mbs, pl.tp, pl.cp, cfg.tp_overlap, cfg.cuda_graphs, cfg.cp_comm, zero3, z3,
              cfg.zero == 3, cfg.graph_scope)
    if not experts:
        return common
    overlap = ep_overlap_on(ctx, cfg)
    return (*common, cfg.ep, pl.ep, cfg.etp, cfg.expert_tp, pl.etp, overlap, overlap and cfg.schedule == "dualpipe",
            dispatcher_of(ctx, cfg))


def _kind_costs(ctx: Context, cfg: Config, pl: Placement, kind: str, cache: dict | None) -> dict[str, Cost]:
    """`layer_costs`, from `cache` where a configuration with the same `_kind_key` was priced."""
    if cache is None:
        return layer_costs(ctx, cfg, pl, kind)
    return _priced_once(cache, _kind_key(ctx, cfg, pl, kind), lambda: layer_costs(ctx, cfg, pl, kind, cache),
                        fresh=lambda: layer_costs(ctx, cfg, pl, kind))


def _end_cost(ctx: Context, cfg: Config, pl: Placement, cache: dict | None, end: str) -> Cost:
    """`_embedding_cost` or `_head_cost` ("embedding" / "head"), from `cache` where a configuration
    with the same key was priced. They read nothing of (cfg, pl) but their tokens (mbs, cp), tp, sp,
    the TP group, whether the step is eager (`eager_step`: tp_overlap and the TP group), ZeRO-3 and
    CUDA graphs (`_fsdp_outer_host`) and, the head, whether it is tied (pp = 1) and the micro-batch
    count where the output layer's weight gradients are deferred (`deferred_head_wgrad`): not the
    expert layout, so the MoE shapes of one attention layout share one pricing. The cached `Cost`s
    must not be modified. tests/test_solver_speed.py checks every hit against a fresh pricing."""
    price = _head_cost if end == "head" else _embedding_cost
    if cache is None:
        return price(ctx, cfg, pl)
    key: tuple = (END_COSTS, end, cfg.tp, cfg.sp, cfg.mbs, cfg.cp, pl.tp, cfg.tp_overlap, cfg.zero == 3,
                  cfg.cuda_graphs)
    if end == "head":
        key += (cfg.pp == 1, num_microbatches(ctx.problem, cfg) if ctx.training.defer_embedding_wgrad else 0)
    return _priced_once(cache, key, lambda: price(ctx, cfg, pl))


def shared_costs(ctx: Context, cfg: Config, pl: Placement, cache: dict | None, key: Any) -> tuple:
    """(layer costs by (kind, mode), embedding, head, memo) of cfg under placement pl, from
    `cache[key]` when the caller's key says they were priced already (the key must cover
    every input they depend on); memo holds figures derived from them (`Table.memo`)."""
    if cache is not None and key in cache:
        return cache[key]
    kinds = sorted(set(ctx.model.layer_kinds()))
    by_kind = None if cache is None else cache.setdefault(KIND_COSTS, {})
    per_kind = {k: _kind_costs(ctx, cfg, pl, k, by_kind) for k in kinds}
    layers = {(k, r): c for k in kinds for r, c in per_kind[k].items()}
    overlap = ep_overlap_on(ctx, cfg)
    if overlap and "moe" in kinds and not ep_overlap_pays(ctx, cfg, layers):
        per_kind["moe"] = _kind_costs(ctx, no_ep_overlap(cfg), pl, "moe", by_kind)
        layers.update({("moe", r): c for r, c in per_kind["moe"].items()})
        overlap = False
    head = _end_cost(ctx, cfg, pl, by_kind, "head")
    if ctx.model.num_nextn_predict_layers:
        head = _with_mtp(ctx, cfg, head, layers[(ctx.model.layer_kinds()[-1], "none")])
    # memo["ep_overlap"]: whether these costs run the EP overlap (what `ep_overlap_pays` resolved);
    # memo[KIND_DICTS]: each kind's {mode: cost}, the very dicts `_kind_costs` shares between shapes
    got = (layers, _end_cost(ctx, cfg, pl, by_kind, "embedding"), head, {"ep_overlap": overlap, KIND_DICTS: per_kind})
    if cache is not None:
        cache[key] = got
    return got


def layer_table(ctx: Context, cfg: Config, cache: dict | None = None) -> Table:
    """Every cost of `cfg` that does not depend on per-layer choices. `cache` (one per solve)
    shares the layer, embedding and head costs between placements and configurations that give
    them the same inputs (shapes and the TP / CP / EP groups; the ZeRO-3 groups too). The
    shared `Cost` objects must not be modified."""
    pl = place_axes(ctx.graph, cfg.placement, cfg.tp, cfg.cp, cfg.ep, cfg.dp, cfg.pp, cfg.etp)
    zero3 = cfg.zero == 3 and cfg.data_parallel
    key = (cfg.tp, cfg.cp, cfg.ep, cfg.sp, cfg.mbs, cfg.pp == 1, pl.tp, pl.cp, pl.ep, cfg.etp, pl.etp, cfg.zero == 3,
           cfg.tp_overlap, cfg.ep_overlap, ep_overlap_on(ctx, cfg), cfg.cuda_graphs, dispatcher_of(ctx, cfg),
           cfg.cp_comm, cfg.graph_scope,
           (cfg.dp, pl.dp_cp, pl.edp, cfg.dp_replicate, reshard_policy(ctx.framework, cfg),
            zero3_step_sync(ctx.framework, cfg), cfg.grad_overlap, cfg.param_overlap) if zero3 else None)
    layers, embed, head, memo = shared_costs(ctx, cfg, pl, cache, key)
    microbatches = num_microbatches(ctx.problem, cfg)
    head = loss_phase_head(ctx, cfg, layers, embed, head, microbatches)
    # Megatron scatters the stage output over the TP ranks and re-gathers it over NVLink on the
    # next stage (scatter-gather optimization, Narayanan et al. 2021 §4.1), with or without SP.
    # (Shapes' tokens and hidden size, without building a Shapes: this runs per placement)
    p2p = 0.0
    if cfg.pp > 1:
        tokens = cfg.mbs * ctx.training.seq_len / cfg.cp  # (`Shapes.tokens`)
        p2p = p2p_s(ctx.levels, pl.pp_level, BF16 * tokens * ctx.model.hidden_size / cfg.tp)
    return Table(cfg, pl, layers, embed, head, p2p, microbatches, memo)


def loss_phase_head(ctx: Context, cfg: Config, layers: dict, embed: Cost, head: Cost, microbatches: int) -> Cost:
    """The head as a table holds it: where the framework frees its gradients between steps and a step of
    a one-stage plan runs one micro-batch, its working set less the step's gradient bytes
    (`_step_grad_bytes`); else the head itself. Every table (`layer_table`, the solver's optimistic one)
    takes its head from here, so evaluate and the solver's bounds price one peak."""
    if ctx.framework.grads_freed_between_steps and microbatches == 1 and cfg.pp == 1:
        grads = _step_grad_bytes(ctx, cfg, layers, embed, head)
        return dataclasses.replace(head, work_bytes=max(0.0, head.work_bytes - grads))
    return head


def _step_grad_bytes(ctx: Context, cfg: Config, layers: dict, embed: Cost, head: Cost) -> float:
    """Gradient bytes one GPU of a one-stage plan holds at the end of its backward (`cost.static_bytes`'s
    "gradients": the framework's gradient bytes per parameter, sharded from ZeRO-2 on). Where the
    framework frees its gradients between steps (`FrameworkProfile.grads_freed_between_steps`: torchtitan
    calls zero_grad(), set_to_none) and a step runs one micro-batch, none of them exist yet at the loss
    backward, the head's peak: `layer_table` takes them off the head's working set, so the peak is the
    larger of the loss's (activations + loss) and the layers' (gradients + activations + a layer's
    working set) without changing the form the solver's memory rows take."""
    kinds = ctx.model.layer_kinds()
    pieces = [layers[(k, "none")] for k in kinds] + [embed, head]
    params = sum(c.params for c in pieces)
    expert = sum(c.expert_params for c in pieces)
    g_b = param_bytes(ctx)[1]
    if cfg.zero < 2:
        return g_b * params
    return g_b * ((params - expert) / cfg.shard_dense + expert / cfg.shard_expert)

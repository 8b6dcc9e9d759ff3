"""Tensor- and context-parallel communication of one layer, overlapped as the frameworks run it."""

from __future__ import annotations

import math

from ..topology import Placement, all_gather_s, all_reduce_s, reduce_scatter_s
from .constants import BF16, TP_OVERLAP_RS_SPLITS, overlapped
from .context import Config, Context
from .kernels import Shapes, attention_backward_s, cp_ring_kv_heads


def _qkvo_bytes(sh: Shapes) -> float:
    """Bytes of one GPU's q, k, v and attention output per micro-batch: what Ulysses' all-to-alls move."""
    T, a, kv = sh.tokens, sh.a_local, sh.kv_local
    if sh.m.is_mla:
        return BF16 * T * a * (2 * sh.d_qk + 2 * sh.d_v)
    return BF16 * T * (2 * a * sh.d_qk + kv * sh.d_qk + kv * sh.d_v)


def cp_hierarchy(ctx: Context, cfg: Config, pl: Placement) -> tuple[int, int]:
    """(inner, outer) sizes of hierarchical a2a+p2p context parallelism: the all-to-all runs among the
    CP ranks that share an NVLink domain, as many as also divide each TP rank's query and key/value
    heads (Ulysses scatters heads); the p2p ring spans the rest (Megatron's
    --hierarchical-context-parallel-sizes inner outer)."""
    m = ctx.model
    heads = int(m.num_attention_heads // cfg.tp)
    kv = heads if m.is_mla else max(1, int(m.kv_heads // cfg.tp))
    inner = math.gcd(math.gcd(pl.cp.members[0], cfg.cp), math.gcd(heads, kv))
    return inner, cfg.cp // inner


def tp_overlap_on(ctx: Context, cfg: Config, pl: Placement) -> bool:
    """Whether TP communication runs overlapped with the GEMMs: the plan asks for it (or leaves it
    to the framework, whose profile runs it by default), SP is on, and the TP group sits inside
    one NVLink domain (userbuffers / symmetric memory need peer access)."""
    if cfg.tp == 1 or not cfg.sp or cfg.tp_overlap is False:
        return False
    return ctx.framework.tp_comm_overlap and pl.tp.members[0] >= cfg.tp


def tp_comm_s(ctx: Context, cfg: Config, pl: Placement, act_bytes: float, gemm_s: float,
              gather_bytes: float | None = None) -> float:
    """Exposed TP communication of one block in one pass: all-gather + reduce-scatter of the
    `act_bytes` activation with SP (all-reduce without); `gather_bytes` where the block gathers
    something else than its output (MLA gathers its latents). Overlapped (`tp_overlap_on`), only the
    first all-gather chunk (1/tp, ring exchange) and the last reduce-scatter chunk (1 of
    TP_OVERLAP_RS_SPLITS) are exposed; the rest hides under the block's `gemm_s` of GEMMs."""
    if cfg.tp == 1:
        return 0.0
    if not cfg.sp:
        return all_reduce_s(ctx.levels, pl.tp, act_bytes)
    gathered = act_bytes if gather_bytes is None else gather_bytes
    ag = all_gather_s(ctx.levels, pl.tp, gathered)
    rs = reduce_scatter_s(ctx.levels, pl.tp, act_bytes)
    if not tp_overlap_on(ctx, cfg, pl):
        return ag + rs + sequence_dim_copies_s(ctx, cfg, gathered, act_bytes)
    exposed = ag / cfg.tp + rs / TP_OVERLAP_RS_SPLITS
    return exposed + overlapped(ag + rs - exposed, gemm_s)


def sequence_dim_copies_s(ctx: Context, cfg: Config, gathered_bytes: float, scattered_bytes: float) -> float:
    """The copies a framework whose sequence-parallel collectives run on the sequence dimension of
    [micro-batch, sequence, hidden] activations pays around them (`FrameworkProfile.sequence_dim_collectives`):
    NCCL gathers and scatters along the leading dimension, so PyTorch's functional collectives
    (torch/distributed/_functional_collectives.py) rearrange the gathered tensor with
    torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim) after the all-gather, and the tensor
    to reduce-scatter with torch.cat(torch.chunk(x, group_size, dim=scatter_dim)) before it: each a
    read and a write of the whole tensor at the HBM rate. Newer releases gather a micro-batch of one
    sequence with a view instead (the dimensions before the sequence have size 1), so the all-gather's
    copy is priced from two sequences a micro-batch. torchtitan measured these two copies at 0.18 ms of
    a 3 ms FFN at 8k tokens on H100 (pytorch/torchtitan PR #437, its proposal to fold batch and
    sequence, not merged)."""
    if not ctx.framework.sequence_dim_collectives:
        return 0.0
    return (2 * gathered_bytes * (cfg.mbs > 1) + 2 * scattered_bytes) / ctx.hbm_bytes_per_s


def cp_comm_s(ctx: Context, cp: int, prof, sh: Shapes, core_s: float) -> tuple[float, float]:
    """Exposed (forward, backward) time of the context-parallel ring exchange of K and V,
    overlapped with the core attention of `core_s` (Megatron's p2p ring, TE
    `attn_forward_func_with_cp`): cp - 1 steps, each passing one GPU's K/V chunk to the next
    while attention runs on the chunk in hand, so each GPU sends cp - 1 chunks, the volume of an
    all-gather of the whole K/V. The backward passes K/V and their gradients (twice the volume with
    16-bit gradients; `FrameworkProfile.cp_grad_exchange_bytes` where they accumulate in fp32). A
    framework that gathers K/V at the first step (`FrameworkProfile.cp_kv_rotate` allgather) hides the
    gather under that step only."""
    # MLA: Megatron's MLA CP exchanges the up-projected K and V heads; a framework that repeats K/V to
    # the query heads before attention passes them so (cp_ring_kv_heads)
    kv_elements = sh.tokens * cp_ring_kv_heads(ctx, sh) * (sh.d_qk + sh.d_v)
    ring = all_gather_s(ctx.levels, prof, cp * BF16 * kv_elements)
    grads = ring * ctx.framework.cp_grad_exchange_bytes / BF16  # dK, dV at the framework's accumulation bytes
    bwd_s = attention_backward_s(ctx, core_s)
    if ctx.framework.cp_kv_rotate == "allgather" and cp > 1:
        # PyTorch's _AllGatherRotater: the whole K/V gathered under the first step's attention only (each
        # step runs 1/cp of the layer's attention under the round-robin load balance), in the forward
        # and again in the backward; the dK/dV go round by all-to-all once a step (cp sends of a chunk),
        # each under the next step's backward, the last awaited after the loop (exposed)
        chunk = grads / (cp - 1)
        return (overlapped(ring, core_s / cp),
                overlapped(ring, bwd_s / cp) + overlapped(grads, bwd_s * (cp - 1) / cp) + chunk)
    return overlapped(ring, core_s), overlapped(ring + grads, bwd_s)

"""Kernel time on one GPU: per-GPU shapes of a micro-batch, GEMMs (roofline times a shape efficiency)
and core attention."""

from __future__ import annotations

import math

from ..catalog import GPU, attention_exp_reference_per_sm_clock
from ..spec import HYBRID_KINDS
from .constants import (
    ATTN_BWD_FACTOR,
    ATTN_CALL_S,
    ATTN_CAUSAL_TAIL,
    ATTN_HEAD_DIM_HALF,
    ATTN_TILE,
    BF16,
    GEMM_K_OVERHEAD,
    MAMBA_BWD_KERNELS,
    MAMBA_FWD_KERNELS,
    SCORE_BYTES,
    SCORE_DROPOUT_BYTES,
    STREAM_K_RECOVERY,
    UNFUSED_SOFTMAX_BWD_BYTES,
    UNFUSED_SOFTMAX_FWD_BYTES,
)
from .context import Config, Context
from .params import lora_fraction, mla_dim

HYBRID_BLOCKS = frozenset(HYBRID_KINDS.values())  # a hybrid model's one-part blocks


class Shapes:
    """Per-GPU tensor shapes of one micro-batch under a config."""

    def __init__(self, ctx: Context, cfg: Config):
        m = ctx.model
        self.m = m
        self.mbs = cfg.mbs
        self.tokens = cfg.mbs * ctx.training.seq_len / cfg.cp  # tokens per GPU (before TP)
        self.cp, self.cp_comm = cfg.cp, cfg.cp_comm
        self.seq = ctx.training.seq_len
        self.doc = ctx.training.mean_document_tokens  # packed documents (None: one sequence)
        self.h = m.hidden_size
        self.tp = cfg.tp
        self.a_local = m.num_attention_heads / cfg.tp
        self.kv_local = max(1.0, m.kv_heads / cfg.tp)
        self.d = m.head_size
        if m.is_mla:
            self.d_qk = mla_dim(m.qk_nope_head_dim) + mla_dim(m.qk_rope_head_dim)
            self.d_v = mla_dim(m.v_head_dim)
        else:
            self.d_qk = self.d_v = m.head_size
        # Elementwise tokens: the residual stream is sharded over TP only with sequence parallelism.
        self.res_tokens = self.tokens / cfg.tp if cfg.sp else self.tokens


def gemm_shape_efficiency(gpu: GPU, m: float, k: float, n: float, groups: float = 1.0) -> float:
    """Fraction of the large-GEMM rate an (m x k) @ (k x n) GEMM reaches (`groups` of them in one
    grouped launch, as expert GEMMs run), from three documented effects:
    - tile padding: the output is computed in whole `gpu.gemm_tile` tiles (an m of 100 tokens
      pays for a 128- or 256-row tile);
    - wave quantization: tiles are spread over `sm_count / gemm_tile_sms` slots; a last partial
      wave idles the rest. Fewer tiles than slots leave SMs idle outright; beyond one wave,
      stream-K / persistent schedulers (cuBLAS, CUTLASS) recover about half of the tail
      (STREAM_K_RECOVERY, a documented fitted factor);
    - the K loop's prologue and epilogue: k / (k + GEMM_K_OVERHEAD).
    A 8192-cubed GEMM on H100 gets 0.99; the catalog's matmul efficiency is for such GEMMs."""
    tm, tn = gpu.gemm_tile
    m, n = max(m, 1.0), max(n, 1.0)
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    pad = (m * n) / (tiles_m * tm * tiles_n * tn)
    slots = max(1, gpu.sm_count // gpu.gemm_tile_sms)
    x = groups * tiles_m * tiles_n / slots
    wave = x if x <= 1 else 1.0 - STREAM_K_RECOVERY * (1.0 - x / math.ceil(x))
    return pad * wave * k / (k + GEMM_K_OVERHEAD)


def _gemm_s(ctx: Context, m: float, k: float, n: float, flops_per_s: float | None = None,
            groups: float = 1.0) -> float:
    """Roofline time of `groups` (m x k) @ (k x n) GEMMs in bf16-sized operands, the compute side
    at the GPU's matmul rate times `gemm_shape_efficiency`. A linear layer in the recipe's precision
    (no `flops_per_s` given) also pays the quantization of its inputs (`Context.quant_bytes`): over its
    forward and backward, the input X (m x k) once, the output gradient dY (m x n) once (dgrad and
    wgrad share it) and, where the recipe keeps no low-precision weight copy, the weight (k x n) once,
    each in every layout its GEMMs need (the recipe's bytes per element count them). The backward is
    priced at twice this forward (`_frozen_adjust`), so a third of that total is charged here: the
    forward and backward together pay it exactly (measured on H100: benchmarks/bench_kernels.py)."""
    flops = 2.0 * m * k * n * groups
    nbytes = BF16 * (m * k + k * n + m * n) * groups
    rate = (flops_per_s or ctx.mm_flops_per_s) * gemm_shape_efficiency(ctx.gpu, m, k, n, groups)
    t = max(flops / rate, nbytes / ctx.hbm_bytes_per_s)
    if flops_per_s is None:
        q_act, q_weight = ctx.quant_bytes
        if q_act:
            t += (q_act * m * (k + n) + q_weight * k * n) * groups / (3.0 * ctx.hbm_bytes_per_s)
    return t


def _mem_s(ctx: Context, nbytes: float) -> float:
    return nbytes / ctx.hbm_bytes_per_s


def core_attention_flops(sh: Shapes) -> float:
    """FLOPs of one layer's core attention forward (QK^T and PV) on this GPU's queries: causal, or
    over the sliding window (`ModelSpec.attention_key_share`)."""
    return 2 * sh.tokens * sh.seq * sh.a_local * (sh.d_qk + sh.d_v) * 0.5 * sh.m.attention_key_share(sh.seq, sh.doc)


def core_attention_s(ctx: Context, sh: Shapes, ring_steps: int | None = None) -> tuple[float, float, float]:
    """(time, materialized-score traffic time, FLOPs) of the core attention of one layer's
    forward: each GPU's queries attend causally over the full sequence (CP splits queries), or over
    their sliding window (`ModelSpec.attention_key_share`, FlashAttention / cuDNN skip the masked
    tiles; averaged over the layers). Fused kernels also pay their calls and causal tail
    (`attention_call_s`, `ring_steps` as there)."""
    flops = core_attention_flops(sh)
    if not ctx.training.flash_attention:  # materialized s x s scores per head
        per = SCORE_BYTES + (SCORE_DROPOUT_BYTES if sh.m.dropout else 0.0)
        return flops / ctx.attn_flops_per_s, _mem_s(ctx, per * sh.tokens * sh.seq * sh.a_local), flops
    rate = ctx.attn_flops_per_s * attention_head_dim_factor(sh.d_qk, ctx.gpu)
    return flops / rate + attention_call_s(ctx, sh, rate, ring_steps=ring_steps), 0.0, flops


def softmax_batches_per_block(n: int) -> int:
    """Rows one 128-thread block of Megatron's fused softmax kernel handles for rows of `n` elements
    (scaled_masked_softmax.h get_batch_per_block): a warp of min(32, next power of two >= n) threads
    per row, two rows per warp up to 128 elements."""
    p2 = 1 << max(0, math.ceil(math.log2(max(n, 1))))
    return (128 // min(p2, 32)) * (2 if p2 <= 128 else 1)


def unfused_softmax_reason(ctx: Context, sh: Shapes) -> str | None:
    """Why materialized attention's softmax falls back to PyTorch for these shapes, or None where
    Megatron's fused kernel runs (and always with FlashAttention, which has no separate softmax).
    FusedScaleMaskSoftmax.is_kernel_available with the causal mask of language-model training
    (`TrainingSpec.softmax_fusion` picks the version): Megatron-LM's (megatron/core/fusions/
    fused_softmax.py) needs 16 < keys <= 4096, queries and keys multiples of 4, and heads per GPU x
    micro-batch a multiple of 4 and of get_batch_per_block(keys) (4 for more than 128 keys).
    bigscience-workshop/Megatron-DeepSpeed from 9f5f5d4c (2021-10-21) to 1cb76a64 (2022-03-06) declared
    get_batch_per_block(b, np, sq, sk) but called it with (sq, sk, b, np), so the kernel's row count
    came from the heads per GPU: 8 or 12 heads per GPU need micro-batches in multiples of 4, 14 heads
    in multiples of 8 (NVIDIA fixed the same slip on 2021-08-13, 0d350c8d41). BLOOM's logbook met it
    as slow runs at TP 8 and micro-batch 2 and at 112 heads; its final launcher passes
    --abort-on-unmet-fused-kernel-constraints."""
    t = ctx.training
    if t.flash_attention:
        return None
    if t.softmax_fusion == "off":
        return "softmax_fusion off (--no-masked-softmax-fusion)"
    # One call's shape: all-to-all CP (Ulysses) hands each GPU 1/cp of its heads over the whole
    # sequence, all-gather CP its queries against every key, the p2p ring a chunk against a chunk
    # (a2a+p2p priced as the ring)
    heads, queries, keys = sh.a_local, sh.seq / sh.cp, sh.seq / sh.cp
    if sh.cp_comm == "a2a":
        heads, queries, keys = heads / sh.cp, sh.seq, sh.seq
    elif sh.cp_comm == "allgather":
        keys = sh.seq
    heads, queries, keys = max(1, round(heads)), round(queries), round(keys)
    batches = sh.mbs * heads
    limit = 2048 if t.softmax_fusion == "bigscience-2022" else 4096
    if not 16 < keys <= limit or keys % 4 or queries % 4:
        return f"{queries} queries x {keys} keys per call, outside the fused kernel's 17-{limit} keys in multiples of 4"
    per_block = softmax_batches_per_block(heads if t.softmax_fusion == "bigscience-2022" else keys)
    need = math.lcm(4, per_block)
    if batches % need:
        why = (f" (this version sizes its blocks by the {heads} heads per GPU)"
               if t.softmax_fusion == "bigscience-2022" else "")
        return (f"heads per GPU x micro-batch = {heads} x {sh.mbs} = {batches}, not a multiple of {need}{why}")
    return None


def unfused_softmax_s(ctx: Context, sh: Shapes) -> tuple[float, float]:
    """(forward, backward) time one layer's attention softmax costs beyond the fused kernel's where it
    runs in PyTorch (`unfused_softmax_reason`): UNFUSED_SOFTMAX_FWD_BYTES / _BWD_BYTES per score."""
    if unfused_softmax_reason(ctx, sh) is None:
        return 0.0, 0.0
    scores = sh.tokens * sh.seq * sh.a_local
    return _mem_s(ctx, UNFUSED_SOFTMAX_FWD_BYTES * scores), _mem_s(ctx, UNFUSED_SOFTMAX_BWD_BYTES * scores)


def attention_call_s(ctx: Context, sh: Shapes, rate: float, causal: bool = True,
                     ring_steps: int | None = None) -> float:
    """What a fused attention forward costs beyond its FLOPs at the asymptotic `rate`, per layer and
    micro-batch: a fixed time per kernel call (one per context-parallel ring step: `ring_steps`, by
    default cp for the p2p ring and 1 where all-to-all or all-gather hands each GPU whole sequences)
    and the causal mask's tail, `ATTN_CAUSAL_TAIL` of the longest query tile's key loop (the
    sequence a step attends over, or the sliding window), at one SM's share of the rate (`causal`
    False: an unmasked call, which has none; language-model training is causal). Small calls
    (few heads per GPU, short sequences) therefore run below the large-call rate, as measured."""
    m = sh.m
    steps = ring_steps if ring_steps is not None else (1 if sh.cp_comm in ("a2a", "allgather") else sh.cp)
    local = sh.seq / steps
    longest = local
    if sh.doc and sh.doc < longest:  # packed documents: no key loop runs past its document
        longest = sh.doc
    if m.sliding_window and m.sliding_window < longest:
        f = m.sliding_window_layers
        longest = f * m.sliding_window + (1.0 - f) * longest
    if m.attention_chunk_size and m.attention_chunk_size < local:
        f = m.chunked_attention_layers
        longest = f * min(m.attention_chunk_size, longest) + (1.0 - f) * longest
    tile_s = 2.0 * ATTN_TILE * ATTN_TILE * (sh.d_qk + sh.d_v) / (rate / ctx.gpu.sm_count)
    return steps * ATTN_CALL_S + (ATTN_CAUSAL_TAIL * (longest / ATTN_TILE) * tile_s if causal else 0.0)


def cp_ring_kv_heads(ctx: Context, sh: Shapes) -> float:
    """K/V heads per GPU the context-parallel ring passes and merges: the model's (per TP rank), or the
    up-projected heads of MLA (Megatron's MLA CP exchanges them)."""
    return sh.a_local if sh.m.is_mla else sh.kv_local


def cp_ring_merge_s(ctx: Context, sh: Shapes, steps: int) -> tuple[float, float]:
    """(forward, backward) HBM time of the p2p ring's own elementwise work over `steps` ring steps, per
    layer and micro-batch: merging each step's partial output by its log-sum-exp, accumulating the
    per-step gradients of Q, K and V and packing K/V (and their gradients) for the next rank, at the
    framework's bytes per element (`FrameworkProfile.cp_ring_hbm_bytes`, read in its source) of the
    attention output (tokens x query heads x head dim) and of one of K / V. Each attention call of a
    step runs on its own; these are kernels of their own between the calls, on the same stream."""
    if steps <= 1:
        return 0.0, 0.0
    b = dict(ctx.framework.cp_ring_hbm_bytes)
    if not b:
        return 0.0, 0.0
    q = sh.tokens * sh.a_local * sh.d_v
    kv = sh.tokens * cp_ring_kv_heads(ctx, sh) * sh.d_qk
    n = steps - 1

    def side(d: str) -> float:
        return (q * (n * b.get(f"{d}_q_step", 0.0) + b.get(f"{d}_q_call", 0.0))
                + kv * (n * b.get(f"{d}_kv_step", 0.0) + b.get(f"{d}_kv_call", 0.0)))

    return _mem_s(ctx, side("fwd")), _mem_s(ctx, side("bwd"))


def attention_backward_s(ctx: Context, core_s: float) -> float:
    """Time of the core attention's backward, given its forward's `core_s`: FlashAttention's 2.5x the
    forward FLOPs, at the framework's backward rate relative to the forward
    (`FrameworkProfile.attention_backward_rate`: cuDNN 0.84, FlashAttention-2 0.90, measured). Without
    FlashAttention the scores are materialized and the backward's batched GEMMs run at the forward's."""
    rate = ctx.framework.attention_backward_rate if ctx.training.flash_attention else 1.0
    return ATTN_BWD_FACTOR * core_s / rate * _exp_reference_backward(ctx.gpu)


def _exp_reference_backward(gpu: GPU | None) -> float:
    """The backward's share of the speed a GPU's exponential rate above its generation's reference gives
    the forward (`attention_head_dim_factor`): the backward recomputes one exponential per score as the
    forward does but runs ATTN_BWD_FACTOR times its tensor FLOPs, so a score costs 2.5 x 4d / T + 1 / X
    there and the same exponential speed-up moves it less: (1 + R_ref) / (1 + R) over (2.5 + R_ref) /
    (2.5 + R), independent of the head dim. 1 where the generation has no reference (R_ref = R). GB300
    (R = 0.485, R_ref = 0.971): forward 1.33x, backward 1.16x Blackwell's attention rate at head dim 128."""
    if gpu is None or gpu.exp_tera_per_s is None or not gpu.exp_per_sm_clock:
        return 1.0
    ref = attention_exp_reference_per_sm_clock(gpu.arch)
    if not ref:
        return 1.0
    r = gpu.peak_flops("bf16") / (512.0 * gpu.exp_tera_per_s * 1e12)
    r_ref = r * gpu.exp_per_sm_clock / ref
    return ((1.0 + r_ref) / (1.0 + r)) / ((ATTN_BWD_FACTOR + r_ref) / (ATTN_BWD_FACTOR + r))


def attention_head_dim_factor(head_dim: float, gpu: GPU | None = None) -> float:
    """FlashAttention's rate by head dimension relative to head dim 128 (where the catalog's
    efficiencies were fitted). Each attention score costs 4 x head_dim FLOPs on the tensor cores (QK^T
    and PV) and one exponential on the special-function units (MUFU.EX2): with the two in sequence a
    score takes 4d / T + 1 / X, so the rate is 1 / (1/T + 1/(4 d X)), normalized at 128:
    (1 + R) / (1 + R 128 / d) with R = T / (512 X), T the bf16 tensor peak and X the GPU's exponentials
    per second (`GPU.exp_tera_per_s`). H100 (R = 0.50): 0.75 at head dim 64, 1.20 at 256, against
    FlashAttention-3's ~500 / 650 / 750 TFLOP/s at 64 / 128 / 256 (Shah et al. 2024, Fig. 5); GB200
    (R = 1.05, four times Hopper's tensor rate per exponential): 0.66 at 64 (cudnn-frontend's GB200
    benchmark: 574 / 1,408 TFLOP/s forward at 64 / 128); Blackwell Ultra's doubled exponential rate
    (R = 0.48) brings it back to 0.76. Without the figure: FlashAttention-3's d / (d + 32).

    The normalization is at the exponent ratio the GPU's generation's fitted factors are referenced to:
    its own R, or, where matmul.yaml `attention_exp_reference_per_sm_clock` names a per-SM rate for the
    generation and the GPU states its own (`GPU.exp_per_sm_clock`), R scaled to that rate. Blackwell
    Ultra (32 MUFU.EX2 per clock per SM against Blackwell's 16: NVIDIA, 'Inside Blackwell Ultra' and
    'Making Softmax More Efficient with Blackwell Ultra', 10.7 vs 5 TeraExponentials/s) is referenced to
    Blackwell's 16, so its doubled exponential rate is priced here, not inside its end-to-end factor:
    (1 + 2R) / (1 + R) = 1.33x at head dim 128 on GB300 (R = 0.49)."""
    if gpu is None or gpu.exp_tera_per_s is None:
        return (head_dim / (head_dim + ATTN_HEAD_DIM_HALF)) / (128.0 / (128.0 + ATTN_HEAD_DIM_HALF))
    r = gpu.peak_flops("bf16") / (512.0 * gpu.exp_tera_per_s * 1e12)
    ref = attention_exp_reference_per_sm_clock(gpu.arch)
    r_ref = r * gpu.exp_per_sm_clock / ref if ref and gpu.exp_per_sm_clock else r
    return (1.0 + r_ref) / (1.0 + r * 128.0 / head_dim)


def _frozen_adjust(ctx: Context, gemm_fwd_s: float) -> tuple[float, float]:
    """(backward GEMM time, weight-gradient time) of a block whose forward GEMMs take gemm_fwd_s:
    input and weight gradients (2x, Narayanan et al. 2021), or with frozen base weights (LoRA) the
    input gradients alone plus the adapters' three small GEMMs per pass (their share of the FLOPs is
    `lora_fraction`)."""
    if ctx.training.finetune == "full":
        return 2 * gemm_fwd_s, gemm_fwd_s
    adapters = lora_fraction(ctx.model, ctx.training.lora_rank) * gemm_fwd_s
    return gemm_fwd_s + 2 * adapters, adapters


def dispatch_stage_launches(ctx: Context, cfg: Config) -> tuple[int, int]:
    """(forward, backward) launches the expert dispatcher adds to `layer_kernels`' MoE count (router,
    top-k, permute, dispatch, expert GEMMs, activation, combine, unpermute), where the framework runs
    Megatron's dispatcher stages as separate launches (`FrameworkProfile.moe_dispatch_stages`).
    Megatron-LM's MoEAlltoAllTokenDispatcher (token_dispatcher.py, d98e8a64dd) also sends the routing
    probabilities in an all-to-all of their own (token_dispatch; its gradient's in the backward); with
    more than one local expert it sorts the received chunks by local expert and back
    (sort_chunks_by_idxs in dispatch_postprocess and combine_preprocess, each with its backward); a
    dropless layer gathers the token counts over the EP group and copies them to the host (preprocess:
    gather_from_sequence_parallel_region, _maybe_dtoh_and_synchronize); and where the experts' GEMMs
    run in a quantized recipe, the TE grouped MLP pads each expert's rows to the quantization block
    and strips them after (experts.py TEGroupedMLP.forward: Fp8Padding of the tokens and of the
    probabilities, Fp8Unpadding of the output, each with its backward): HybridEP and DeepEP pad inside
    their own permutation (`skip_routed_expert_padding`) and the allgather dispatcher sends no
    probabilities apart. A capacity-padded layer (drop_and_pad) has no counts to gather and fixed
    segments to pad."""
    if not ctx.framework.moe_dispatch_stages or (cfg.dispatcher or ctx.framework.moe_dispatchers[0]) != "alltoall":
        return 0, 0
    f = b = 1  # the probabilities' all-to-all
    if ctx.model.num_experts > cfg.ep:  # sort by local expert and back
        f, b = f + 2, b + 2
    if ctx.training.moe_capacity_factor is None:
        f += 2  # the token counts' all-gather and device-to-host copies
        if ctx.module_saved_input_bytes("routed_experts") < BF16:  # quantized expert GEMMs: pad, pad, unpad
            f, b = f + 3, b + 3
    return f, b


def layer_kernels(ctx: Context, cfg: Config, sh: Shapes, kind: str) -> tuple[int, int, int]:
    """(forward, backward, selective-recompute) kernel launches of one layer and micro-batch, counted
    from the layer's structure as Megatron-style eager code runs it (Megatron-core with Transformer
    Engine modules; Megatron-DeepSpeed; torchtitan's eager modules launch the same operations):
    forward: two norms, the attention's GEMMs (QKV and output; MLA's down- and up-projections), the
    fused attention call (one per context-parallel ring step; materialized: the score GEMM, softmax,
    dropout where the model has it and the PV GEMM), the MLP's two GEMMs (gate and up fused in one) or
    the MoE's router, top-k, permute, grouped GEMMs and unpermute, the activation, two residual
    (bias-dropout-add) kernels, and one per TP collective (two all-reduces, or two all-gathers and two
    reduce-scatters with SP) and CP exchange. Backward: every GEMM twice (input and weight gradient),
    each norm twice (input gradient, weight-gradient reduction), the attention's backward (its
    preprocessing and main kernel; materialized: its four), the activation's and residuals', the same
    collectives, and one gradient-accumulation add per norm weight and bias (weight gradients
    accumulate in their GEMM: Megatron's gradient-accumulation fusion). Selective recompute re-runs
    the core attention. A hybrid model's block (Mamba2, attention, MLP or MoE alone: spec.HYBRID_KINDS)
    has one norm, one residual and its TP collectives; a Mamba2 mixer launches in_proj and out_proj,
    the causal conv1d, its SSD scan's kernels and the gated norm (MAMBA_FWD_KERNELS / MAMBA_BWD_KERNELS).
    The count leaves out what eager code launches besides these (bias adds, layout
    copies, casts, RNG): BLOOM's measured layer (Megatron-DeepSpeed, materialized attention, tp 8, full
    recompute) launches 95-103 kernels (autoshard/data/kernel_measurements.json `launch_blocking`)
    where this count gives it BLOOM_LAYER_LAUNCHES = 51; `EAGER_LAUNCH_HOST_S` is priced per counted
    launch, so the uncounted ones ride along."""
    m = sh.m
    hybrid = kind in HYBRID_BLOCKS  # one norm, one mixer or MLP, one residual (spec.HYBRID_KINDS)
    mixer = "mamba" if kind == "mamba" else (None if kind in ("mlp", "moe_mlp") else "attention")
    mlp = None if kind in ("mamba", "attention") else ("moe" if kind in ("moe", "moe_mlp") else "dense")
    sublayers = 1 if hybrid else 2
    steps = sh.cp if (sh.cp > 1 and sh.cp_comm not in ("a2a", "allgather")) else 1
    flash = ctx.training.flash_attention
    gemms = mlp_other = core_f = mixer_f = mixer_b = comm = stage_f = stage_b = 0
    if mixer == "attention":
        gemms = (5 if m.q_lora_rank else 4) if m.is_mla else 2
        core_f = steps if flash else (3 + (1 if m.dropout else 0))
        mixer_f, mixer_b = core_f, (2 * steps if flash else 4)
        if sh.cp > 1:
            comm += 4 if sh.cp_comm == "a2a" else (2 if sh.cp_comm == "allgather" else 2 * (steps - 1))
    elif mixer == "mamba":  # in_proj, out_proj; conv1d, the SSD scan's kernels, the gated norm
        gemms, mixer_f, mixer_b = 2, MAMBA_FWD_KERNELS, MAMBA_BWD_KERNELS
        comm += 4 if sh.cp > 1 else 0  # MambaContextParallel: sequence -> head shards and back
    if mlp == "dense":
        gemms, mlp_other = gemms + 2, 1  # fc1 (gate + up), fc2; the activation
    elif mlp == "moe":  # router GEMM, top-k/softmax, permute, expert fc1 + fc2 (grouped), activation, unpermute
        gemms, mlp_other = gemms + 3, 4
        if m.shared_ffn:
            gemms, mlp_other = gemms + 2, mlp_other + 1
        if cfg.ep > 1:
            comm += 2
            stage_f, stage_b = dispatch_stage_launches(ctx, cfg)
    if cfg.tp > 1:
        comm += sublayers * (2 if cfg.sp else 1)
    norms = residuals = sublayers
    fwd = norms + gemms + mixer_f + mlp_other + residuals + comm + stage_f
    # norm weights; GPT-style biases (dropout marks GPT-2/3 layers)
    small_params = norms + ((2 * sublayers) if m.dropout else 0)
    bwd = 2 * gemms + 2 * norms + mixer_b + mlp_other + residuals + comm + small_params + stage_b
    return fwd, bwd, core_f


def captured_launches(ctx: Context, cfg: Config, sh: Shapes, kind: str) -> tuple[int, int, int]:
    """(forward, backward launches, graphs) of one layer and micro-batch that per-layer CUDA graphs
    (`Plan.cuda_graph_scope`) capture, counted as `layer_kernels` counts the layer's parts. Megatron
    (transformer_layer.py, CudaGraphModule at d98e8a64dd): `attn` captures _forward_attention (the input
    norm, the attention and its residual: a hybrid `attention` block), `mlp` a dense _forward_mlp (an
    `mlp` block), `moe` a drop-and-pad MoE's (a `moe_mlp` block), `mamba` a Mamba layer, `layer` the
    whole layer; `moe_router` the MLP up to MoELayer.router(): the pre-MLP norm, the router GEMM, its
    top-k and the shared expert (two GEMMs and its activation); `moe_preprocess` the dispatcher's
    token counting, which `layer_kernels` leaves among its uncounted launches, in the router's graph.
    The dispatch, the experts and the combine of a dropless MoE stay eager. Each graph is replayed
    once per pass (forward and backward graphs: TE make_graphed_callables), and its replay is priced
    as one counted launch."""
    scope = cfg.graph_scope
    if not scope:
        return 0, 0, 0
    total = layer_kernels(ctx, cfg, sh, kind)
    if "layer" in scope:
        return total[0], total[1], 1
    attention = kind in ("dense", "moe", "attention")
    parts = [p for p, on in (("attention", "attn" in scope and attention),
                             ("mlp", "mlp" in scope and kind in ("dense", "mlp")),
                             ("moe_mlp", "moe" in scope and kind in ("moe", "moe_mlp")),
                             ("mamba", "mamba" in scope and kind == "mamba")) if on]
    fwd = bwd = 0
    for part in parts:
        f, b, _ = layer_kernels(ctx, cfg, sh, part)
        fwd, bwd = fwd + f, bwd + b
    graphs = len(parts)
    if "moe_router" in scope and kind in ("moe", "moe_mlp"):
        shared = 1 if sh.m.shared_ffn else 0
        gemms, other = 1 + 2 * shared, 1 + shared  # router (+ shared fc1, fc2); top-k (+ activation)
        fwd += 1 + gemms + other  # the pre-MLP norm
        bwd += 2 * gemms + 2 + other + 1  # each GEMM twice, the norm twice, its weight's gradient add
        graphs += 1
    return min(fwd, total[0]), min(bwd, total[1]), graphs


# The per-layer graph region each Megatron recompute module runs inside (transformer_layer.py,
# d98e8a64dd: core attention and MLA's up-projections in _forward_attention; the dense MLP and its
# up-projection in a dense _forward_mlp; the MoE block and its activation after the router; the shared
# experts before MoELayer.router() returns, unless overlapped with the EP communication). `layernorm`
# recomputes both norms, one in each half: inside a graph only when the whole layer is.
RECOMPUTE_MODULE_SCOPE = {"core_attn": "attn", "mla_up_proj": "attn", "mlp": "mlp", "mlp_up": "mlp",
                          "moe": "moe", "moe_act": "moe", "shared_experts": "moe_router"}


def module_in_graph(scope: tuple[str, ...], module: str) -> bool:
    """Whether recompute module `module` runs inside one of the per-layer graphs of `scope`: its
    checkpoint wrapper's Python then runs at capture only, not at each replay."""
    return "layer" in scope or RECOMPUTE_MODULE_SCOPE.get(module) in scope

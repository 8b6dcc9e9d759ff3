"""The cost model: `evaluate(problem, plan) -> Estimate`, the single source of truth.

A step is priced in three layers, each a plain function the solver reuses:

1. `layer_table(ctx, cfg)`: for every layer kind (dense, moe) and recompute mode
   (none, selective, full), the forward and backward time of one micro-batch on one
   GPU, split by category (compute, TP/CP/EP communication, ZeRO-3 gathers, ...), the
   activation bytes it keeps, and its parameters per GPU. Embedding and LM head are
   priced the same way. `cfg` holds every global knob (degrees, ZeRO, micro-batch,
   schedule, placement); per-layer choices come later.
2. `rank_totals(...)`: sums the table over the layers each pipeline rank holds.
3. `assemble(...)`: the pipeline schedule (warm-up and cool-down included), the
   data-parallel tail (gradient reduction not hidden under the last backward,
   optimizer step, parameter all-gather) and peak memory per rank.

Compute is a roofline per GEMM: max(FLOPs / (peak x matmul efficiency),
bytes / (HBM bandwidth x HBM efficiency)). Attention runs FlashAttention-style
(causal: half the score FLOPs; backward 2.5x forward) in bf16 even in fp8 runs.
Activation memory follows Korthikanti et al. 2022 generalized to GQA, gated MLPs
and MoE: per layer and micro-batch sbh(34 + 5as/h) for GPT-3-style layers without
parallelism; 10 + 24/t (+5as/ht) with TP; 34/t with TP+SP; the attention-score term
vanishes under selective recompute or FlashAttention; full recompute keeps 2sbh
(/t with SP).

Model FLOPs for MFU follow PaLM (Chowdhery et al. 2022, App. B): 6 N_active per token
plus attention, counted **causal**: 3 a s (d_qk + d_v) per layer per token (PaLM's and
NVIDIA's published MFU count it non-causal, 6 a s (d_qk + d_v), which exceeds 100% at
long context); N_active counts every matmul weight a token passes through, LM head
included, input embedding excluded. Validation compares step times, never MFU.

The parts, one module each: `constants`, `context` (the problem resolved, a plan's global knobs
and its validity), `params`, `kernels` (GEMM and attention time on one GPU), `communication` (TP and
CP), `moe`, `layers` (the layer table) and `step` (pipeline, data-parallel tail, memory, `evaluate`).
"""

from __future__ import annotations

from .communication import (  # noqa: F401
    cp_comm_s,
    cp_hierarchy,
    tp_comm_s,
    tp_overlap_on,
)
from .constants import (  # noqa: F401
    ADAM_STATE_BYTES,
    ATTN_BWD_FACTOR,
    ATTN_HEAD_DIM_HALF,
    BF16,
    BLOCKING_LAYER_HOST_S,
    COMM_INTERFERENCE,
    ELEMENTWISE_BWD_FACTOR,
    GEMM_K_OVERHEAD,
    GIB,
    INTERFERENCE_DENOM,
    OPT_TRAFFIC_BYTES,
    RESERVE_GIB,
    SCORE_BYTES,
    SCORE_DROPOUT_BYTES,
    SGD_STATE_BYTES,
    STREAM_K_RECOVERY,
    TIME_KEYS,
    TP_OVERLAP_RS_SPLITS,
    UNFUSED_SOFTMAX_BWD_BYTES,
    UNFUSED_SOFTMAX_FWD_BYTES,
    overlapped,
)
from .context import (  # noqa: F401
    Config,
    Context,
    Reason,
    config_reasons,
    context,
    ep_overlap_refusals,
    even_split,
    launch_reasons,
    layout_split,
    dp_knob_reasons,
    live_axes,
    num_microbatches,
    pipeline_zero_refused,
    reshard_policy,
    zero3_step_sync,
    with_modes,
)
from .kernels import (  # noqa: F401
    Shapes,
    attention_backward_s,
    attention_head_dim_factor,
    core_attention_flops,
    core_attention_s,
    gemm_shape_efficiency,
    softmax_batches_per_block,
    unfused_softmax_reason,
    unfused_softmax_s,
)
from .layers import (  # noqa: F401
    Cost,
    Table,
    layer_cost,
    layer_costs,
    layer_table,
    loss_phase_head,
    shared_costs,
)
from .moe import (  # noqa: F401
    ep_overlap_allowed,
    dispatcher_of,
    ep_overlap_blocked,
    no_ep_overlap,
    ep_overlap_host_s,
    ep_overlap_on,
    ep_overlap_pays,
    moe_host_s,
    moe_imbalance,
    priced_config,
    routed_tokens,
)
from .params import (  # noqa: F401
    FLOP_CONVENTION,
    QLORA_BYTES_PER_PARAM,
    ZERO3_GATHERED_LAYERS,
    active_matmul_params,
    active_params,
    flops_per_token_parts,
    gathered_weight_bytes,
    layer_params,
    lora_fraction,
    model_flops_per_step,
    model_flops_per_token_parts,
    param_bytes,
    total_params,
    zero3_bytes_per_param,
    zero3_gathered_bytes,
    zero3_gathered_for,
)
from .step import (  # noqa: F401
    Estimate,
    FlopBudget,
    RankTotals,
    StageEstimate,
    TailModel,
    affine,
    assemble,
    assign_layers,
    chunk_rank,
    chunk_times,
    dp_overlaps,
    dp_overlaps_refused,
    dp_tail,
    distinct_objects,
    dp_tail_s,
    ep_overlap_priced,
    ep_overlap_state,
    evaluate,
    flop_budget,
    gathered_kept_bytes,
    inflight_microbatches,
    interleaved_windows,
    invalid_estimate,
    pipeline_time,
    placement_warnings,
    rank_totals,
    static_bytes,
    tail_model,
    working_bytes,
)

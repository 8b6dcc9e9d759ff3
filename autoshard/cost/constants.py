"""Constants of the cost model that are not data (each with its source), and the overlap rule."""

from __future__ import annotations

GIB = 2**30
BF16 = 2  # bytes per activation / weight element
RESERVE_GIB = 2.0  # CUDA context, NCCL buffers, allocator slack (per GPU)
ADAM_STATE_BYTES = 12  # fp32 master weights + two fp32 moments (16 B/param with bf16 weights + grads)
SGD_STATE_BYTES = 8  # fp32 master + momentum
OPT_TRAFFIC_BYTES = 30  # HBM bytes touched per parameter by a fused Adam step
ATTN_BWD_FACTOR = 2.5  # FlashAttention backward FLOPs / forward FLOPs
ELEMENTWISE_BWD_FACTOR = 2.0

# While a collective overlaps computation, its NCCL kernels occupy SMs (16-32 channels of 132 on
# H100) and HBM bandwidth: overlapped work slows by this fraction of the overlapped time.
# Calculon's system files use the same notion (`processor_usage: 0.15`).
COMM_INTERFERENCE = 0.15
INTERFERENCE_DENOM = 20  # COMM_INTERFERENCE = 3 / 20, kept rational for the integer solver model

# Materialized (non-Flash) attention moves per score element: write QK^T, read it for softmax,
# write softmax, read it for AV (8 B); dropout adds read, mask and output (5 B).
SCORE_BYTES = 8.0
SCORE_DROPOUT_BYTES = 5.0
# Where Megatron's fused scale + mask + softmax kernel is unavailable for a shape
# (`cost.unfused_softmax_reason`), FusedScaleMaskSoftmax.forward_torch_softmax runs five PyTorch ops
# in fp32 (attention_softmax_in_fp32, which apply_query_key_layer_scaling, Megatron's default, turns
# on): half -> float (reads 2 B, writes 4), x scale (4, 4), masked_fill_ (4, 4), softmax (PyTorch
# 1.x's cunn_SoftMaxForward reads a 2,048-key row three times: 12, 4) and float -> half (4, 2): 44 B
# per score element where the fused kernel moves 4 (reads 2, writes 2). Their autograd backward
# moves 48 B (to fp32 6, softmax backward reading gradient and output twice 20, masked_fill 8, scale
# 8, to fp16 6) where the fused backward moves 6. Extra bytes per score element, forward and backward:
UNFUSED_SOFTMAX_FWD_BYTES = 40.0
UNFUSED_SOFTMAX_BWD_BYTES = 42.0

# Overlapped TP communication (Transformer Engine userbuffers, `--tp-comm-overlap`): the all-gather
# before a column-parallel GEMM runs as a ring exchange in tp steps (the first chunk is exposed);
# the reduce-scatter after a row-parallel GEMM is pipelined in `num_splits` = 4 chunks (the last is
# exposed). TE transformer_engine/pytorch/module/base.py, default userbuffers config
# (ring_exchange for qkv/fc1 fprop, pipeline with num_splits 4 for proj/fc2 fprop). torchtitan's
# AsyncTP micro-pipelines the same way (arXiv 2410.06511 §3.3).
TP_OVERLAP_RS_SPLITS = 4

# GEMM shape efficiency (`gemm_shape_efficiency`): K-loop prologue/epilogue worth this many K
# elements, and the share of a tail wave that stream-K scheduling recovers. Documented fitted
# factors (fitted with the catalog's matmul efficiencies on the dev and modern validation runs).
GEMM_K_OVERHEAD = 64.0
ATTN_HEAD_DIM_HALF = 32.0  # head dim at which FlashAttention reaches half its asymptotic rate (FA3 Fig. 5)
# Fused attention's rate by call size (`cost.core_attention_s`), from cuDNN SDPA kernel times (torch.
# profiler, no host time) over 36 calls on H100 SXM: 4-64 heads, 1k-32k tokens, causal and full
# (autoshard/data/kernel_measurements.json `attention_grid`, benchmarks/bench_kernels.py): a fixed
# time per forward call (its launch and ramp; the backward's scales with it) and, with a causal mask,
# a tail worth this share of the longest query tile's key loop (the diagonal's last tiles finish
# after the rest of the grid). Fitted on those measurements, forward and backward alike (0.326,
# 0.325): median |log| error 0.05 forward, 0.07 backward, against 0.10 and 0.15 for one flat rate.
ATTN_CALL_S = 8.3e-6
ATTN_CAUSAL_TAIL = 0.33
ATTN_TILE = 128  # query rows and keys per FlashAttention / cuDNN tile on Hopper and Blackwell
STREAM_K_RECOVERY = 0.5


def overlapped(comm_s: float, compute_s: float) -> float:
    """Exposed time of communication overlapped with computation: what does not fit under the
    computation, plus the slowdown it inflicts while it runs."""
    return max(0.0, comm_s - compute_s) + COMM_INTERFERENCE * min(comm_s, compute_s)


# Host time of one transformer layer per micro-batch (forward, recompute and backward launches) when
# every launch blocks (training.launch_blocking, CUDA_LAUNCH_BLOCKING=1). Fitted: BigScience's BLOOM
# logbook (chronicles-prequel.md, 02-20 micro-batch sweeps, run with CUDA_LAUNCH_BLOCKING=1 against
# NCCL hangs) is 4.5-6.8 ms slower per layer and extra micro-batch at micro-batch 1 than at 2 on A100
# (tp8, pp6-12), and its own async/sync check measured 6.8% at 80 GPUs. Measured since: that layer in
# plain PyTorch at BLOOM's per-GPU shapes on one H100 costs 5.9-7.6 ms more per layer and micro-batch
# under CUDA_LAUNCH_BLOCKING=1 (tp 4 and 8, micro-batch 1-4, ~100 kernels; a newer host than Jean
# Zay's; autoshard/data/kernel_measurements.json `launch_blocking`, benchmarks/measure_launch_blocking.py).
BLOCKING_LAYER_HOST_S = 6.0e-3
TIME_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "zero3_comm", "host", "offload")

# Host time of eager (Python) launch work per launch `cost.layer_kernels` counts: the layer's host
# work runs ahead of the GPU asynchronously, so a layer takes the longer of its GPU time and this host
# time (CUDA graphs and compiled steps have none). From the same measurement as BLOCKING_LAYER_HOST_S:
# under CUDA_LAUNCH_BLOCKING=1 the host work of BLOOM's layer (fwd + recompute + bwd) is no longer
# hidden and costs 5.9-7.6 ms more on one H100 (autoshard/data/kernel_measurements.json
# `launch_blocking`), 6.0 ms over the 51 launches `layer_kernels` counts for that layer (its 95-103
# real kernels: bias adds, copies and casts besides the counted ones): 118 us per counted launch. An
# upper bound by the launch latency the blocking run also pays (a few us per real kernel). Not fitted:
# Megatron-LM's functional tests (gpt3_mcore_te small GPT, 12 x 512 hidden, one H100 node) measure
# 4.2-5 ms per layer and micro-batch in every TP x PP layout where this prices 3.9 ms
# (tests/test_fixed_costs.py). Against TE issue #2053 (NVIDIA/TransformerEngine, 2025-08: one
# torch.nn.Linear forward costs 13.5 us of CPU on a DGX H100, Transformer Engine's Linear 2.7x
# torch's on Grace), one counted launch stands for about two real kernels and their Python.
BLOOM_LAYER_LAUNCHES = 51
EAGER_LAUNCH_HOST_S = BLOCKING_LAYER_HOST_S / BLOOM_LAYER_LAUNCHES
# Kernel launches of a Mamba2 mixer besides its in_proj / out_proj GEMMs (cost.kernels.layer_kernels),
# counted in mamba_ssm ops/triton/ssd_combined.py: forward the causal conv1d, the SSD scan's five
# kernels (_chunk_cumsum_fwd, _chunk_state_fwd, _state_passing_fwd, _bmm_chunk_fwd, _chunk_scan_fwd)
# and the gated RMSNorm: 7; backward (_mamba_chunk_scan_combined_bwd) the four state kernels recomputed
# and eleven gradient kernels (_chunk_scan_bwd_dz, _dstates, _state_passing_bwd, _chunk_scan_chunk_state_
# bwd_dx, _chunk_state_bwd_db, _chunk_scan_bwd_dC, _dcb, two _bmm_chunk_bwd, _ddAcs_stable,
# _chunk_cumsum_bwd), the conv1d's and the gated norm's: 17.
MAMBA_FWD_KERNELS = 7
MAMBA_BWD_KERNELS = 17

# cuBLAS workspaces PyTorch's caching allocator hands out once per process and keeps (they count in
# torch.cuda.max_memory_allocated), by GPU generation (compute capability 9.0 and later: Hopper,
# Blackwell): PyTorch's per handle and stream (at::cuda::getChosenWorkspaceSize, CUBLAS_WORKSPACE_CONFIG
# default ":4096:8" = 32 MiB from sm90 on, ":4096:2:16:8" = 8 MiB + 128 KiB before; Megatron-LM's
# functional tests set ":4096:8"), and Transformer Engine's one GEMM workspace
# (transformer_engine/pytorch/cpp_extensions/gemm.py get_cublas_workspace_size_bytes, d0067d0d:
# 32 MiB + 1 KiB from sm90 on, 4 MiB before), where the framework runs TE
# (frameworks.yaml cublas_workspaces).
CUBLAS_WORKSPACE_BYTES = {
    "pytorch": {True: 32 * 2**20, False: 8 * 2**20 + 128 * 2**10},
    "transformer_engine": {True: 32 * 2**20 + 1024, False: 4 * 2**20},
    # the GEMM workspace Transformer Engine adds for userbuffers' overlapped GEMMs (TE
    # cpp_extensions/gemm.py get_cublas_workspace(ub=True): _NUM_MAX_UB_STREAMS = 3 workspaces in one
    # tensor, beside the plain one), where the plan overlaps TP communication that way
    # (frameworks.yaml tp_overlap_cublas_workspaces)
    "transformer_engine_ub": {True: 3 * (32 * 2**20 + 1024), False: 3 * 4 * 2**20},
}
# Workspaces of each library per process: PyTorch keys its cuBLAS workspaces by (handle, stream)
# (aten/src/ATen/cuda/CublasHandlePool.cpp cublas_handle_stream_to_workspace) and hands each thread its
# own handle (DeviceThreadHandles.h); the forward runs on the Python thread, the backward on autograd's
# worker thread of the device (torch/csrc/autograd/engine.cpp), so an eager step holds two. Transformer
# Engine keeps one module-level workspace (module/base.py get_workspace) whichever thread calls it.
CUBLAS_WORKSPACES_PER_PROCESS = {"pytorch": 2, "transformer_engine": 1, "transformer_engine_ub": 1}
# Megatron-LM's output-layer / loss working memory per logit (cost.layers._head_cost): the bf16 logits and
# their fp32 copy (tensor_parallel/cross_entropy.py calculate_logits_max `.float()`, then in place); with
# --cross-entropy-loss-fusion one more fp32 copy (fusions/fused_cross_entropy.py: the in-place ops of
# the torch.compile'd calculate_predicted_logits on its input are functionalized into a new buffer).
LOGIT_WORK_BYTES = 2 + 4
# Attention masks of the batch held at a data-loading rank's peak (training.attention_mask_in_batch): the
# micro-batch in use and the next one loaded. Megatron-LM's functional tests measured the pair
# gpt3_mcore_te_tp2_pp2_resume_torch_dist with / without --no-create-attention-mask-in-dataloader
# 7,864,320 B apart, 1.9 masks of [4, 1, 1024, 1024] bool.
BATCH_MASKS = 2
FUSED_CE_EXTRA_BYTES = 4
SM90_ARCHS = ("hopper", "blackwell", "blackwell-ultra")  # catalog `arch` values of compute capability >= 9.0

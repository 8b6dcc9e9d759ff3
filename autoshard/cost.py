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
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from .catalog import GPU, get_gpu
from .frameworks import FrameworkProfile, get_framework
from .spec import RECOMPUTES, Plan, Problem, ProblemParts, Recompute
from .topology import (
    ClusterGraph,
    Level,
    Placement,
    Profile,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    cluster_graph,
    p2p_s,
    place_axes,
    reduce_scatter_s,
    resolve_levels,
)

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
STREAM_K_RECOVERY = 0.5


def overlapped(comm_s: float, compute_s: float) -> float:
    """Exposed time of communication overlapped with computation: what does not fit under the
    computation, plus the slowdown it inflicts while it runs."""
    return max(0.0, comm_s - compute_s) + COMM_INTERFERENCE * min(comm_s, compute_s)
# Host time of one transformer layer per micro-batch (forward, recompute and backward launches) when
# every launch blocks (training.launch_blocking, CUDA_LAUNCH_BLOCKING=1). Fitted: BigScience's BLOOM
# logbook (chronicles-prequel.md, 02-20 micro-batch sweeps, run with CUDA_LAUNCH_BLOCKING=1 against
# NCCL hangs) is 4.5-6.8 ms slower per layer and extra micro-batch at micro-batch 1 than at 2 on A100
# (tp8, pp6-12), and its own async/sync check measured 6.8% at 80 GPUs.
BLOCKING_LAYER_HOST_S = 6.0e-3
TIME_KEYS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "zero3_comm", "host", "offload")


# ---------------------------------------------------------------------------------------
# Context: what does not depend on the plan
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context(ProblemParts):
    problem: Problem
    gpu: GPU
    levels: tuple[Level, ...]
    graph: ClusterGraph
    modes: tuple[str, ...] = RECOMPUTES  # recompute modes the layer tables price (+ modules asked for)

    @property
    def num_gpus(self) -> int:
        return self.problem.cluster.num_gpus

    @functools.cached_property
    def framework(self) -> FrameworkProfile:
        return get_framework(self.problem.framework, self.problem.training.main_grads)

    @functools.cached_property
    def saved_input_bytes(self) -> float:
        """Bytes per element of a linear layer's input kept for the backward: the recipe's quantized
        size where the framework keeps it quantized (Transformer Engine), else bf16."""
        if not self.framework.quantized_saved_inputs:
            return float(BF16)
        from .catalog import saved_input_bytes_per_element  # noqa: PLC0415

        return saved_input_bytes_per_element(self.training.precision, self.gpu)

    @functools.cached_property
    def peak(self) -> float:
        from .catalog import gemm_peak_flops_per_s  # noqa: PLC0415

        return gemm_peak_flops_per_s(self.gpu, self.training.precision)

    @functools.cached_property
    def mm_flops_per_s(self) -> float:
        from .catalog import gemm_flops_per_s  # noqa: PLC0415  (the recipe's GEMM rate, catalog.py)

        return gemm_flops_per_s(self.gpu, self.training.precision)

    @functools.cached_property
    def hp_flops_per_s(self) -> float:
        """GEMM rate of the layers every recipe keeps in 16 bits (the router, the LM head)."""
        from .catalog import attention_flops_per_s  # noqa: PLC0415

        return attention_flops_per_s(self.gpu)

    @functools.cached_property
    def quant_bytes(self) -> tuple[float, float]:
        """HBM bytes moved per element to quantize a linear layer's (activation, weight) inputs for its
        low-precision GEMMs, weighted by the recipe's low-precision share: activations every pass;
        weights only where the recipe keeps no low-precision copy for the step (torchao recasts them
        every micro-batch; Transformer Engine caches them). (0, 0) for 16-bit recipes."""
        from .catalog import (  # noqa: PLC0415
            low_precision_fraction,
            quant_overhead_bytes_per_element,
            weight_copy_bytes_per_param,
        )

        prec = self.training.precision
        q = quant_overhead_bytes_per_element(prec, self.gpu) * low_precision_fraction(prec)
        return q, (q if q and not weight_copy_bytes_per_param(prec, self.gpu) else 0.0)

    @functools.cached_property
    def attn_flops_per_s(self) -> float:
        """Core attention runs in bf16 at the GPU's matmul efficiency times the framework's
        attention-kernel factor (FlashAttention-3 / cuDNN = 1; FlashAttention-2 through SDPA less)."""
        return self.hp_flops_per_s * self.framework.attention_kernel_factor

    @functools.cached_property
    def hbm_bytes_per_s(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.gpu.efficiency.hbm

    @functools.cached_property
    def capacity_bytes(self) -> float:
        """HBM a plan may use per GPU: usable HBM less the reserve and the requested headroom."""
        return self.gpu.hbm_bytes - (RESERVE_GIB + self.problem.search.headroom_gib) * GIB


def context(problem: Problem) -> Context:
    gpu = get_gpu(problem.cluster.gpu, problem.cluster.catalog)
    levels = resolve_levels(problem.cluster, gpu)
    extra = tuple(m for m in problem.search.allowed("recompute", []) if m not in RECOMPUTES)
    return Context(problem, gpu, levels, cluster_graph(levels, problem.cluster.num_gpus),
                   RECOMPUTES + tuple(dict.fromkeys(extra)))


def with_modes(ctx: Context, modes: Any) -> Context:
    """`ctx` pricing also the recompute modes in `modes` (a plan's per-layer list or one mode)."""
    extra = tuple(m for m in dict.fromkeys([modes] if isinstance(modes, str) else modes) if m not in ctx.modes)
    return dataclasses.replace(ctx, modes=ctx.modes + extra) if extra else ctx


# ---------------------------------------------------------------------------------------
# Global configuration and its validity
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """The global knobs of a plan (everything except per-layer recompute and stage split)."""

    tp: int
    cp: int
    ep: int
    pp: int
    dp: int
    vpp: int
    sp: bool
    zero: int
    mbs: int
    schedule: str
    placement: str
    etp: int | None = None  # expert tensor parallel (MoE parallel folding); None = tp
    tp_overlap: bool | None = None  # None = the framework's default where the plan allows it
    ep_overlap: bool | None = None
    grad_overlap: bool = True  # overlap_grad_reduce
    param_overlap: bool = True  # overlap_param_gather
    opt_offload: bool = False  # optimizer_offload
    cp_comm: str = "p2p"  # cp_comm_type
    cuda_graphs: bool = False  # full-iteration CUDA graphs: no host overheads
    dispatcher: str | None = None  # moe_dispatcher; None = the framework's default

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def expert_dp(self) -> int:
        """Expert data parallelism: the ranks of a stage holding the same experts (edp)."""
        return max(1, self.tp * self.cp * self.dp // (self.expert_tp * self.ep))

    @property
    def data_parallel(self) -> bool:
        """Whether any weights are replicated over ranks (dense over dp x cp, experts over edp): what
        ZeRO shards and gradient reduction spans. Folding can give experts edp > 1 at dp = 1."""
        return self.dp * self.cp > 1 or self.expert_dp > 1

    @property
    def folded(self) -> bool:
        """Experts laid out as etp x ep x edp over the stage's ranks (Megatron's MoE parallel
        folding) rather than ep carved out of the data-parallel axis of the placement."""
        return self.expert_tp != self.tp or (self.ep > 1 and self.dp % self.ep != 0)

    @staticmethod
    def of(plan: Plan, dp: int) -> "Config":
        return Config(plan.tp, plan.cp, plan.ep, plan.pp, dp, plan.vpp, plan.sp, plan.zero_stage,
                      plan.micro_batch_size, plan.schedule, plan.placement,
                      None if plan.etp is None or plan.etp == plan.tp else plan.etp,
                      plan.tp_comm_overlap, plan.ep_overlap, plan.overlap_grad_reduce, plan.overlap_param_gather,
                      plan.optimizer_offload, plan.cp_comm_type, plan.cuda_graphs, plan.moe_dispatcher)

    def plan(self, recompute: Any = "none", stage_layers: list[int] | None = None) -> Plan:
        return Plan(tp=self.tp, cp=self.cp, ep=self.ep, pp=self.pp, dp=self.dp, vpp=self.vpp,
                    sequence_parallel=self.sp, zero_stage=self.zero, micro_batch_size=self.mbs,
                    schedule=self.schedule, placement=self.placement, recompute=recompute,
                    stage_layers=stage_layers, etp=self.etp, tp_comm_overlap=self.tp_overlap,
                    ep_overlap=self.ep_overlap, overlap_grad_reduce=self.grad_overlap,
                    overlap_param_gather=self.param_overlap, optimizer_offload=self.opt_offload,
                    cp_comm_type=self.cp_comm, cuda_graphs=self.cuda_graphs, moe_dispatcher=self.dispatcher)


def num_microbatches(problem: Problem, cfg: Config) -> int:
    return problem.training.global_batch_size // (cfg.dp * cfg.mbs)


class Reason(str):
    """Why a plan is invalid (`config_reasons`): the message itself, a str (printed, joined, compared
    and searched as any other), and `field`, what it is about: the plan field ("tp", "etp",
    "stage_layers", ...) or "training.X" for the problem's training settings; None where no one
    field is to blame. The CLI names `field` in its error line (`file: plan.tp: invalid plan: ...`).
    Pickles with its field (a worker process's reasons reach its parent whole); an `Estimate`'s
    `reasons` are plain strs (pydantic's list[str])."""

    field: str | None

    def __new__(cls, text: str, field: str | None = None) -> Reason:
        self = super().__new__(cls, text)
        self.field = field
        return self

    def __reduce__(self) -> tuple[type[Reason], tuple[str, str | None]]:
        return type(self), (str(self), self.field)


def _first_not_dividing(plan: Plan, num_gpus: int) -> str:
    """The first of tp, cp, pp whose running product tp, tp*cp, tp*cp*pp stops dividing the GPUs:
    the field a `tp*cp*pp = N does not divide` reason is about."""
    prod = 1
    for knob in ("tp", "cp", "pp"):
        prod *= getattr(plan, knob)
        if num_gpus % prod:
            return knob
    return "pp"


def config_reasons(problem: Problem, plan: Plan) -> tuple[int, list[Reason]]:
    """(dp, reasons the global degrees are invalid); reasons empty means valid. Each reason is a
    `Reason`, a str that names the field it is about (`Reason.field`, never None here)."""
    m, t, n = problem.model, problem.training, problem.cluster.num_gpus
    reasons: list[Reason] = []

    def bad(field: str, text: str) -> None:
        reasons.append(Reason(text, field=field))

    mp = plan.tp * plan.cp * plan.pp
    dp = plan.dp if plan.dp is not None else (n // mp if n % mp == 0 else 0)
    if plan.dp is None and n % mp:
        bad(_first_not_dividing(plan, n), f"tp*cp*pp = {mp} does not divide the {n} GPUs")
    elif mp * dp != n:
        bad("dp", f"tp*cp*pp*dp = {mp * dp} but the cluster has {n} GPUs")
    if m.num_attention_heads % plan.tp:
        bad("tp", f"tp={plan.tp} does not divide num_attention_heads={m.num_attention_heads}")
    kv = m.kv_heads
    if not m.is_mla and kv % plan.tp and plan.tp % kv:
        bad("tp", f"tp={plan.tp} and num_key_value_heads={kv}: neither divides the other")
    if m.intermediate_size % plan.tp:
        bad("tp", f"tp={plan.tp} does not divide intermediate_size={m.intermediate_size}")
    if m.is_moe and m.expert_ffn % plan.tp:
        bad("tp", f"tp={plan.tp} does not divide moe_intermediate_size={m.expert_ffn}")
    if plan.cp > 1 and t.seq_len % (2 * plan.cp):
        bad("cp", f"cp={plan.cp}: seq_len={t.seq_len} must be divisible by 2*cp (load-balanced causal chunks)")
    fw = get_framework(problem.framework)
    if plan.cp > 1 and fw.cp_excludes_sp and plan.sp and plan.tp > 1:
        bad("sequence_parallel", f"{problem.framework}'s context parallelism (cp={plan.cp}) cannot run beside TP "
            "sequence parallelism: set sequence_parallel false")
    if plan.cp > 1 and fw.cp_comm_types and plan.cp_comm_type not in fw.cp_comm_types:
        bad("cp_comm_type", f"{problem.framework} splits the context with cp_comm_type "
            f"{' or '.join(fw.cp_comm_types)} only, not {plan.cp_comm_type}")
    if plan.cp > 1 and m.sliding_window and fw.window_cp_comm_types \
            and plan.cp_comm_type not in fw.window_cp_comm_types:
        bad("cp_comm_type", f"cp={plan.cp} with sliding-window attention: {problem.framework}'s Transformer Engine "
            f"attention runs it only with cp_comm_type {' or '.join(fw.window_cp_comm_types)}, "
            f"not {plan.cp_comm_type}")
    etp = plan.expert_tp
    if plan.ep > 1 or etp != plan.tp:
        if not m.is_moe:
            bad("ep", f"ep={plan.ep}, etp={etp} need a mixture-of-experts model")
        elif m.num_experts % plan.ep:
            bad("ep", f"ep={plan.ep} does not divide num_experts={m.num_experts}")
        if m.is_moe and m.expert_ffn % etp:
            bad("etp", f"etp={etp} does not divide moe_intermediate_size={m.expert_ffn}")
        stage = plan.tp * plan.cp * dp
        folded = etp != plan.tp or (dp and dp % plan.ep)
        if dp and stage % (plan.ep * etp):
            bad("ep", f"ep*etp = {plan.ep * etp} must divide tp*cp*dp = {stage} (the expert mesh "
                f"etp x ep x edp covers the same GPUs of a pipeline stage as attention)")
        elif folded and not fw.moe_folding:
            bad("ep", f"{problem.framework} cannot fold expert parallelism over TP/CP ranks "
                f"(etp != tp or ep not dividing dp={dp})")
    if plan.sp and t.seq_len % plan.tp:
        bad("sequence_parallel", f"sequence parallelism splits the {t.seq_len} tokens over tp={plan.tp}: "
            "not divisible")
    if plan.zero_stage not in fw.zero_stages:
        bad("zero_stage", f"{problem.framework} runs ZeRO stages {list(fw.zero_stages)}, not {plan.zero_stage}")
    if plan.schedule not in fw.schedules:
        bad("schedule", f"{problem.framework} has no {plan.schedule!r} pipeline schedule "
            f"(it runs {', '.join(fw.schedules)})")
    if plan.tp_comm_overlap and not fw.tp_comm_overlap:
        bad("tp_comm_overlap", f"{problem.framework} cannot overlap TP communication (tp_comm_overlap)")
    if plan.tp_comm_overlap and plan.tp > 1 and not plan.sp:
        bad("tp_comm_overlap", "tp_comm_overlap needs sequence parallelism (TE userbuffers / AsyncTP overlap AG/RS)")
    if plan.ep_overlap:
        if not fw.ep_overlap:
            bad("ep_overlap", f"{problem.framework} cannot overlap expert all-to-all with compute (ep_overlap)")
        elif plan.pp > 1 and plan.vpp < 2:
            bad("ep_overlap", "ep_overlap needs pp=1 or an interleaved schedule (vpp >= 2), as Megatron requires")
        elif blocked := ep_overlap_refusals(fw, plan.recompute_per_layer(problem.model.num_hidden_layers)):
            bad("ep_overlap", f"{problem.framework} refuses ep_overlap beside recompute {' / '.join(blocked)} "
                "(Megatron TransformerConfig); use selective recompute or recompute modules without moe")
    if plan.moe_dispatcher and plan.moe_dispatcher not in fw.moe_dispatchers:
        bad("moe_dispatcher", f"{problem.framework} has no {plan.moe_dispatcher} expert dispatcher "
            f"(it runs {', '.join(fw.moe_dispatchers)})")
    if plan.cuda_graphs and not fw.cuda_graphs:
        bad("cuda_graphs", f"{problem.framework} cannot capture the training step in CUDA graphs (cuda_graphs)")
    if why := fw.main_grads_reason(t.main_grads):
        bad("training.main_grads", why)
    if t.fp8_params:
        from .catalog import get_recipe  # noqa: PLC0415

        if not fw.fp8_params:
            bad("training.fp8_params", f"{problem.framework} cannot keep its weights in FP8 (training.fp8_params)")
        elif get_recipe(t.precision).gemm_dtype not in ("fp8", "fp4") or t.finetune != "full":
            bad("training.fp8_params", f"training.fp8_params needs an FP8 or FP4 recipe and full training "
                f"(precision {t.precision}, finetune {t.finetune}): 16-bit weights have no low-precision param gather")
    if t.moe_capacity_factor is not None and m.is_moe:
        if not fw.moe_token_drop:
            bad("training.moe_capacity_factor", f"{problem.framework} routes dropless: it has no expert capacity "
                "to drop tokens at (training.moe_capacity_factor)")
        elif (plan.moe_dispatcher or fw.moe_dispatchers[0]) == "deepep":
            bad("moe_dispatcher", "the DeepEP dispatcher cannot pad expert inputs to a capacity (Megatron raises "
                "with --moe-pad-expert-input-to-capacity): token dropping needs alltoall or hybridep")
    if dp:
        per = dp * plan.micro_batch_size
        if t.global_batch_size % per:
            bad("dp", f"global_batch_size={t.global_batch_size} is not a multiple of dp*micro_batch_size = {per}")
    chunks = plan.pp * plan.vpp
    if chunks > m.num_hidden_layers + 2:
        bad("vpp", f"pp*vpp = {chunks} virtual stages exceed the {m.num_hidden_layers} layers "
            f"plus an embedding and a loss slot")
    elif chunks > m.num_hidden_layers and not fw.uneven_stages:
        bad("vpp", f"pp*vpp = {chunks} virtual stages exceed the {m.num_hidden_layers} layers, and "
            f"{problem.framework} cannot give the embedding or the loss a pipeline slot")
    if plan.vpp > 1 and plan.schedule not in ("interleaved", "dualpipev"):
        bad("vpp", f"vpp={plan.vpp} needs schedule 'interleaved' (got {plan.schedule!r})")
    if plan.schedule == "dualpipev":
        # DeepSeek's DualPipe cut in half (torch.distributed.pipelining ScheduleDualPipeV): each rank
        # holds two virtual stages in a V (rank r: stages r and 2P-1-r) and runs one micro-batch's
        # forward beside another's backward, in pairs of micro-batches.
        if plan.pp < 2 or plan.vpp != 2:
            bad("schedule", "schedule 'dualpipev' needs pp >= 2 and vpp = 2 (two virtual stages per rank, in a V)")
        elif dp and t.global_batch_size % (dp * plan.micro_batch_size) == 0:
            mb = t.global_batch_size // (dp * plan.micro_batch_size)
            if mb < 2 * plan.pp or mb % 2:
                bad("micro_batch_size", f"dualpipev: {mb} micro-batches; it needs an even number >= 2*pp = "
                    f"{2 * plan.pp}")
    if plan.schedule == "interleaved":
        if plan.vpp < 2 or plan.pp < 2:
            bad("schedule", "schedule 'interleaved' needs pp >= 2 and vpp >= 2")
        elif dp and t.global_batch_size % (dp * plan.micro_batch_size) == 0:
            mb = t.global_batch_size // (dp * plan.micro_batch_size)
            if mb % plan.pp:
                bad("micro_batch_size", f"interleaved schedule: {mb} micro-batches is not a multiple of pp={plan.pp}")
    if plan.schedule == "zero_bubble" and plan.pp < 2:
        bad("schedule", "schedule 'zero_bubble' needs pp >= 2")
    if plan.stage_layers is not None:
        if len(plan.stage_layers) != chunks:
            bad("stage_layers", f"stage_layers has {len(plan.stage_layers)} entries, expected pp*vpp = {chunks}")
        elif sum(plan.stage_layers) != m.num_hidden_layers:
            bad("stage_layers", f"stage_layers sum to {sum(plan.stage_layers)}, the model has "
                f"{m.num_hidden_layers} layers")
    if isinstance(plan.recompute, list) and len(plan.recompute) != m.num_hidden_layers:
        bad("recompute", f"recompute lists {len(plan.recompute)} layers, the model has {m.num_hidden_layers}")
    if plan.cp > 1 and plan.cp_comm_type == "a2a":
        heads = m.kv_heads if not m.is_mla else m.num_attention_heads
        if (m.num_attention_heads // plan.tp) % plan.cp or max(1, heads // plan.tp) % plan.cp:
            bad("cp_comm_type", f"cp_comm_type a2a scatters heads over cp={plan.cp}: the {m.num_attention_heads} "
                f"query and {heads} key/value heads per tp={plan.tp} group must divide by it")
    return dp, reasons


def layout_split(num_layers: int, chunks: int) -> list[int]:
    """The default layers per virtual stage: `even_split`, or, with one or two virtual stages more
    than layers, the embedding alone in the first and the loss alone in the last (Megatron's
    `--pipeline-model-parallel-layout` "E|t|...|t|L", or --account-for-embedding/loss-in-pipeline-split)."""
    extra = chunks - num_layers
    if extra <= 0:
        return even_split(num_layers, chunks)
    return [0] + [1] * num_layers + [0] * (extra - 1)


def even_split(num_layers: int, chunks: int) -> list[int]:
    """Layers per virtual stage as even as possible, the remainder on the middle stages."""
    base, rem = divmod(num_layers, chunks)
    out = [base] * chunks
    order = sorted(range(chunks), key=lambda c: (abs(c - (chunks - 1) / 2), c))
    for c in order[:rem]:
        out[c] += 1
    return out


# ---------------------------------------------------------------------------------------
# 1. Per-layer table
# ---------------------------------------------------------------------------------------


@dataclass
class Cost:
    """Time of one micro-batch through one piece (layer, embedding or head), split by category."""

    fwd: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_KEYS, 0.0))
    bwd: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_KEYS, 0.0))
    wgrad_s: float = 0.0  # part of the backward that computes weight gradients (zero-bubble fills)
    act_bytes: float = 0.0  # activations kept per in-flight micro-batch
    work_bytes: float = 0.0  # transient working memory while this piece runs backward
    params: float = 0.0  # parameters held on this GPU (before ZeRO sharding)
    expert_params: float = 0.0  # of which expert weights (sharded over expert-DP instead of DP)
    hfu_flops: float = 0.0  # FLOPs executed (incl. recompute), per micro-batch on this GPU
    base_flops: float = 0.0  # FLOPs a step needs without recompute (forward + backward)
    # time the EP overlap saves this piece (all-to-all hidden less host time exposed: `ep_overlap_pays`)
    ep_overlap_gain_s: float = 0.0

    @property
    def fwd_s(self) -> float:
        return sum(self.fwd.values())

    @property
    def bwd_s(self) -> float:
        return sum(self.bwd.values())

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s


class Shapes:
    """Per-GPU tensor shapes of one micro-batch under a config."""

    def __init__(self, ctx: Context, cfg: Config):
        m = ctx.model
        self.m = m
        self.tokens = cfg.mbs * ctx.training.seq_len / cfg.cp  # tokens per GPU (before TP)
        self.seq = ctx.training.seq_len
        self.h = m.hidden_size
        self.tp = cfg.tp
        self.a_local = m.num_attention_heads / cfg.tp
        self.kv_local = max(1.0, m.kv_heads / cfg.tp)
        self.d = m.head_size
        if m.is_mla:
            self.d_qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            self.d_v = m.v_head_dim
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
    (no `flops_per_s` given) also pays the quantization of its inputs (`Context.quant_bytes`)."""
    flops = 2.0 * m * k * n * groups
    nbytes = BF16 * (m * k + k * n + m * n) * groups
    rate = (flops_per_s or ctx.mm_flops_per_s) * gemm_shape_efficiency(ctx.gpu, m, k, n, groups)
    t = max(flops / rate, nbytes / ctx.hbm_bytes_per_s)
    if flops_per_s is None:
        q_act, q_weight = ctx.quant_bytes
        if q_act:
            t += (q_act * m * k + q_weight * k * n) * groups / ctx.hbm_bytes_per_s
    return t


def _mem_s(ctx: Context, nbytes: float) -> float:
    return nbytes / ctx.hbm_bytes_per_s


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


def layer_params(m, kind: str) -> tuple[float, float]:
    """(all params, expert params) of one transformer layer (full model, not sharded)."""
    norms = 2 * m.hidden_size
    attn = _attention_params(m)
    if kind == "dense":
        return attn + _mlp_params(m, m.intermediate_size) + norms, 0.0
    experts = m.num_experts * _mlp_params(m, m.expert_ffn)
    shared = m.num_shared_experts * _mlp_params(m, m.expert_ffn)
    router = m.hidden_size * m.num_experts
    return attn + experts + shared + router + norms, experts


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
    from .catalog import saved_input_bytes_per_element  # noqa: PLC0415  (one quantized copy, as saved)

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
            from .catalog import get_recipe  # noqa: PLC0415

            return BF16 * get_recipe(tr.precision).bf16_layer_fraction, fw.grad_bytes, opt_b
        return fw.weight_bytes, fw.grad_bytes, opt_b
    frac = lora_fraction(ctx.model, tr.lora_rank)
    base = QLORA_BYTES_PER_PARAM if tr.finetune == "qlora" else BF16
    return base + frac * BF16, frac * fw.grad_bytes, frac * opt_b


def total_params(m) -> float:
    emb = m.vocab_size * m.hidden_size
    head = 0 if m.tie_word_embeddings else emb
    layers = sum(layer_params(m, k)[0] for k in m.layer_kinds())
    return emb + head + layers + m.hidden_size


def active_matmul_params(m) -> float:
    """Matmul weights a token passes through (LM head included, input embedding excluded)."""
    total = m.vocab_size * m.hidden_size
    for kind in m.layer_kinds():
        if kind == "dense":
            total += _attention_params(m) + _mlp_params(m, m.intermediate_size)
        else:
            total += _attention_params(m) + (m.num_experts_per_tok + m.num_shared_experts) * _mlp_params(m, m.expert_ffn)
            total += m.hidden_size * m.num_experts
    return total


def model_flops_per_step(problem: Problem) -> float:
    """Model FLOPs per step: PaLM's 6 N + attention, with attention counted **causal** (half the
    score matrix; what a causal kernel must compute), no recompute. PaLM and NVIDIA count it
    non-causal, which overstates long-context MFU (past 100% at 128k tokens)."""
    m, t = problem.model, problem.training
    s = t.seq_len
    if m.is_mla:
        d_qk, d_v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    else:
        d_qk = d_v = m.head_size
    # Frozen weights (LoRA) need no weight gradients: forward + input gradients, 4 N per token.
    per_n = 6 if t.finetune == "full" else 4
    attn = 3 * m.num_hidden_layers * m.num_attention_heads * s * (d_qk + d_v) * m.attention_key_share(s)
    per_token = per_n * active_matmul_params(m) + attn  # (a sliding window: the keys it attends)
    return per_token * t.tokens_per_step


def core_attention_flops(sh: Shapes) -> float:
    """FLOPs of one layer's core attention forward (QK^T and PV) on this GPU's queries: causal, or
    over the sliding window (`ModelSpec.attention_key_share`)."""
    return 2 * sh.tokens * sh.seq * sh.a_local * (sh.d_qk + sh.d_v) * 0.5 * sh.m.attention_key_share(sh.seq)


def core_attention_s(ctx: Context, sh: Shapes) -> tuple[float, float, float]:
    """(time, materialized-score traffic time, FLOPs) of the core attention of one layer's
    forward: each GPU's queries attend causally over the full sequence (CP splits queries), or over
    their sliding window (`ModelSpec.attention_key_share`, FlashAttention / cuDNN skip the masked
    tiles; averaged over the layers)."""
    flops = core_attention_flops(sh)
    scores = 0.0
    if not ctx.training.flash_attention:  # materialized s x s scores per head
        per = SCORE_BYTES + (SCORE_DROPOUT_BYTES if sh.m.dropout else 0.0)
        scores = _mem_s(ctx, per * sh.tokens * sh.seq * sh.a_local)
    rate = ctx.attn_flops_per_s * attention_head_dim_factor(sh.d_qk, ctx.gpu) if ctx.training.flash_attention \
        else ctx.attn_flops_per_s
    return flops / rate, scores, flops


def attention_backward_s(ctx: Context, core_s: float) -> float:
    """Time of the core attention's backward, given its forward's `core_s`: FlashAttention's 2.5x the
    forward FLOPs, at the framework's backward rate relative to the forward
    (`FrameworkProfile.attention_backward_rate`: cuDNN 0.84, FlashAttention-2 0.90, measured). Without
    FlashAttention the scores are materialized and the backward's batched GEMMs run at the forward's."""
    rate = ctx.framework.attention_backward_rate if ctx.training.flash_attention else 1.0
    return ATTN_BWD_FACTOR * core_s / rate


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
    (R = 0.48) brings it back to 0.76. Without the figure: FlashAttention-3's d / (d + 32)."""
    if gpu is None or gpu.exp_tera_per_s is None:
        return (head_dim / (head_dim + ATTN_HEAD_DIM_HALF)) / (128.0 / (128.0 + ATTN_HEAD_DIM_HALF))
    r = gpu.peak_flops("bf16") / (512.0 * gpu.exp_tera_per_s * 1e12)
    return (1.0 + r) / (1.0 + r * 128.0 / head_dim)


def moe_imbalance(ctx: Context, cfg: Config) -> float:
    """Routed tokens on the busiest expert-parallel rank over the mean: the problem's imbalance,
    evened out by EPLB's redundant experts (assumed linear up to one redundant expert per EP rank,
    the layout DeepSeek-V3 deploys: 32 redundant experts on EP32, report sec. 3.4)."""
    if ctx.training.moe_capacity_factor is not None:  # dropped above, padded up to the capacity
        return ctx.training.moe_capacity_factor
    imb = ctx.training.moe_load_imbalance
    if imb <= 1.0 or cfg.ep <= 1:
        return 1.0
    return 1.0 + (imb - 1.0) * max(0.0, 1.0 - ctx.training.moe_redundant_experts / cfg.ep)


def _frozen_adjust(ctx: Context, gemm_fwd_s: float) -> tuple[float, float]:
    """(backward GEMM time, weight-gradient time) of a block whose forward GEMMs take gemm_fwd_s:
    input and weight gradients (2x, Narayanan et al. 2021), or with frozen base weights (LoRA) the
    input gradients alone plus the adapters' three small GEMMs per pass (their share of the FLOPs is
    `lora_fraction`)."""
    if ctx.training.finetune == "full":
        return 2 * gemm_fwd_s, gemm_fwd_s
    adapters = lora_fraction(ctx.model, ctx.training.lora_rank) * gemm_fwd_s
    return gemm_fwd_s + 2 * adapters, adapters


def _attention_cost(ctx: Context, cfg: Config, pl: Placement, sh: Shapes) -> tuple[dict, dict, float, float, float]:
    """Forward/backward of the attention block (projections, core, TP and CP comm).

    Returns (fwd, bwd, core_fwd_s, wgrad_s, flops_fwd).
    """
    m, T, h = sh.m, sh.tokens, sh.h
    fwd = dict.fromkeys(TIME_KEYS, 0.0)
    bwd = dict.fromkeys(TIME_KEYS, 0.0)
    a, kv = sh.a_local, sh.kv_local
    if m.is_mla:
        gemms = []
        if m.q_lora_rank:
            gemms += [(T, h, m.q_lora_rank), (T, m.q_lora_rank, a * sh.d_qk)]
        else:
            gemms += [(T, h, a * sh.d_qk)]
        gemms += [(T, h, m.kv_lora_rank + m.qk_rope_head_dim), (T, m.kv_lora_rank, a * (m.qk_nope_head_dim + sh.d_v))]
        gemms += [(T, a * sh.d_v, h)]
    else:
        gemms = [(T, h, (a + 2 * kv) * sh.d), (T, a * sh.d, h)]
    proj = sum(_gemm_s(ctx, *g) for g in gemms)
    flops = sum(2 * x * y * z for x, y, z in gemms)
    core, scores, core_flops = core_attention_s(ctx, sh)
    flops += core_flops
    elem = _mem_s(ctx, BF16 * (sh.res_tokens * h * (2 + 3) + T * (a + kv) * sh.d * 2))  # norm, residual, rope
    fwd["compute"] = proj + core + scores + elem
    proj_b, wgrad = _frozen_adjust(ctx, proj)
    bwd["compute"] = proj_b + attention_backward_s(ctx, core) + ELEMENTWISE_BWD_FACTOR * (elem + scores)
    core += scores  # what selective recompute re-runs
    # Tensor parallel: AG + RS (SP) or one AllReduce per block and pass. With SP, MLA's down-projections
    # run on the sequence shard (duplicated weights) and the column-parallel up-projections gather the
    # latents (q_lora or the hidden state, kv_lora) and the RoPE key instead of the hidden state
    # (Megatron multi_latent_attention.py, _qkv_down_projection).
    gather = BF16 * T * ((m.q_lora_rank or h) + m.kv_lora_rank + m.qk_rope_head_dim) if m.is_mla else None
    fwd["tp_comm"] += tp_comm_s(ctx, cfg, pl, BF16 * T * h, proj, gather)
    bwd["tp_comm"] += tp_comm_s(ctx, cfg, pl, BF16 * T * h, 2 * proj, gather)
    # Context parallel: ring exchange of K and V, overlapped with the core attention.
    if cfg.cp > 1 and cfg.cp_comm == "a2a":
        # Ulysses: all-to-all q, k, v before attention (sequence-sharded -> head-sharded) and the
        # output after, each GPU sending (cp - 1)/cp of its share; the backward moves the gradients.
        fwd["cp_comm"] = bwd["cp_comm"] = all_to_all_s(ctx.levels, pl.cp, _qkvo_bytes(sh))
    elif cfg.cp > 1 and cfg.cp_comm == "a2a+p2p":
        # Hierarchical (Megatron a2a+p2p): Ulysses all-to-all among the `inner` CP ranks of one NVLink
        # domain (heads scattered, their sequence gathered), then the p2p ring over the `outer` groups,
        # each passing K/V of its inner group's tokens for its share of the heads (the same bytes as
        # one rank's K/V), overlapped with attention.
        inner, outer = cp_hierarchy(ctx, cfg, pl)
        n = len(pl.cp.members)
        a2a = all_to_all_s(ctx.levels, Profile(inner, (inner,) * n), _qkvo_bytes(sh)) if inner > 1 else 0.0
        f, b = (cp_comm_s(ctx, outer, Profile(outer, tuple(max(1, x // inner) for x in pl.cp.members)), sh, core)
                if outer > 1 else (0.0, 0.0))
        fwd["cp_comm"], bwd["cp_comm"] = a2a + f, a2a + b
    elif cfg.cp > 1 and cfg.cp_comm == "allgather":
        # K/V all-gathered before attention (exposed); the backward reduce-scatters their gradients.
        f, _ = cp_comm_s(ctx, cfg.cp, pl.cp, sh, 0.0)
        fwd["cp_comm"], bwd["cp_comm"] = f, 2 * f
    elif cfg.cp > 1:
        fwd["cp_comm"], bwd["cp_comm"] = cp_comm_s(ctx, cfg.cp, pl.cp, sh, core)
    return fwd, bwd, core, wgrad, flops


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
    ag = all_gather_s(ctx.levels, pl.tp, act_bytes if gather_bytes is None else gather_bytes)
    rs = reduce_scatter_s(ctx.levels, pl.tp, act_bytes)
    if not tp_overlap_on(ctx, cfg, pl):
        return ag + rs
    exposed = ag / cfg.tp + rs / TP_OVERLAP_RS_SPLITS
    return exposed + overlapped(ag + rs - exposed, gemm_s)


def cp_comm_s(ctx: Context, cp: int, prof, sh: Shapes, core_s: float) -> tuple[float, float]:
    """Exposed (forward, backward) time of the context-parallel ring exchange of K and V,
    overlapped with the core attention of `core_s` (Megatron's p2p ring, TE
    `attn_forward_func_with_cp`): cp - 1 steps, each passing one GPU's K/V chunk to the next
    while attention runs on the chunk in hand, so each GPU sends cp - 1 chunks, the volume of an
    all-gather of the whole K/V. The backward passes K/V and their gradients (twice the volume)."""
    m = sh.m
    if m.is_mla:  # Megatron's MLA CP exchanges the up-projected K and V heads
        kv_bytes = BF16 * sh.tokens * sh.a_local * (sh.d_qk + sh.d_v)
    else:
        kv_bytes = BF16 * sh.tokens * sh.kv_local * (sh.d_qk + sh.d_v)
    ring = all_gather_s(ctx.levels, prof, cp * kv_bytes)
    return overlapped(ring, core_s), overlapped(2 * ring, attention_backward_s(ctx, core_s))


def _mlp_cost(ctx: Context, cfg: Config, pl: Placement, sh: Shapes, kind: str) -> tuple[dict, dict, float, float]:
    """Forward/backward of the MLP or MoE block; returns (fwd, bwd, wgrad_s, flops_fwd)."""
    m, T, h = sh.m, sh.tokens, sh.h
    fwd = dict.fromkeys(TIME_KEYS, 0.0)
    bwd = dict.fromkeys(TIME_KEYS, 0.0)
    mats = 3 if m.gated else 2
    act = BF16 * T * h

    def mlp(tokens: float, ffn_local: float, weight_sets: float = 1.0) -> tuple[float, float]:
        """(time, flops) of `weight_sets` MLPs that together see `tokens` tokens."""
        per = tokens / weight_sets
        up = _gemm_s(ctx, per, h, (mats - 1) * ffn_local, groups=weight_sets)
        down = _gemm_s(ctx, per, ffn_local, h, groups=weight_sets)
        return up + down, 2 * tokens * h * ffn_local * mats

    if kind == "dense":
        t_mlp, flops = mlp(T, m.intermediate_size / cfg.tp)
        ffn_elem = T * m.intermediate_size / cfg.tp * (3 if m.gated else 2)
        tp_f, tp_b = tp_comm_s(ctx, cfg, pl, act, t_mlp), tp_comm_s(ctx, cfg, pl, act, 2 * t_mlp)
        a2a = 0.0
    else:
        k, E, etp = m.num_experts_per_tok, m.num_experts, cfg.expert_tp
        routed = routed_tokens(ctx, cfg, sh)
        t_exp, flops = mlp(routed, m.expert_ffn / etp, E / cfg.ep)
        t_mlp = t_exp
        tp_f = tp_b = 0.0
        if m.num_shared_experts:
            ts, fs = mlp(T, m.num_shared_experts * m.expert_ffn / cfg.tp)
            t_mlp, flops = t_mlp + ts, flops + fs
            tp_f, tp_b = tp_comm_s(ctx, cfg, pl, act, ts), tp_comm_s(ctx, cfg, pl, act, 2 * ts)
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
        if cfg.ep > 1:
            send = BF16 * (T / cfg.tp if cfg.sp else T) * k * h * moe_imbalance(ctx, cfg)
            dedup = k if dispatcher_of(ctx, cfg) in ("deepep", "hybridep") else 0
            a2a = 2 * all_to_all_s(ctx.levels, pl.ep, send, dedup)  # dispatch + combine
    elem = _mem_s(ctx, BF16 * (ffn_elem + sh.res_tokens * h * (2 + 3)))
    fwd["compute"] += t_mlp + elem
    t_b, t_w = _frozen_adjust(ctx, t_mlp)
    bwd["compute"] += t_b + ELEMENTWISE_BWD_FACTOR * elem
    fwd["ep_comm"], bwd["ep_comm"] = a2a, a2a
    fwd["tp_comm"] += tp_f
    bwd["tp_comm"] += tp_b
    return fwd, bwd, t_w, flops


def _mlp_saved_bytes_per_ffn(m, q: float) -> float:
    """Bytes an MLP keeps per token and ffn element: the fc1 output(s) in bf16 (two for a gated
    MLP, for its activation's backward) and the fc2 input at `q` (as the framework keeps it)."""
    return (2 if m.gated else 1) * BF16 + q


def _activation_bytes(ctx: Context, cfg: Config, sh: Shapes, kind: str) -> dict[str, float]:
    """Activation bytes kept per micro-batch by one layer, per recompute mode (Korthikanti 2022). The
    inputs of the linear layers (QKV, MLA up-projections, attention output projection, fc1, fc2 and
    the experts' fc1) are kept at `Context.saved_input_bytes` per element: bf16, or the recipe's
    FP8/FP4 size where the framework keeps them quantized (Transformer Engine)."""
    m, T, h, t = sh.m, sh.tokens, sh.h, cfg.tp
    div = t if cfg.sp else 1
    q = ctx.saved_input_bytes
    # Residual-stream tensors: LN1 in, QKV in, LN2 in, MLP in (+ 2 one-byte dropout masks).
    stream = (2 * BF16 + 2 * q + (2 if m.dropout else 0)) * T * h / div
    if m.is_mla:  # the up-projections' latent inputs, the RoPE key; q, k, v and the proj input
        attn = q * T * (m.kv_lora_rank + (m.q_lora_rank or 0)) + BF16 * T * m.qk_rope_head_dim
        attn += BF16 * T * sh.a_local * (2 * sh.d_qk + sh.d_v) + q * T * sh.a_local * sh.d_v
    else:  # q, k, v, proj input
        attn = BF16 * T * sh.d * (sh.a_local + 2 * sh.kv_local) + q * T * sh.d * sh.a_local
    mats = _mlp_saved_bytes_per_ffn(m, q)
    if kind == "dense":
        mlp = mats * T * m.intermediate_size / t
    else:
        etp = cfg.expert_tp
        routed = routed_tokens(ctx, cfg, sh)
        mlp = mats * routed * m.expert_ffn / etp + q * routed * h + 4 * T * m.num_experts
        mlp += mats * T * m.num_shared_experts * m.expert_ffn / t
    if ctx.training.flash_attention:
        scores = 4.0 * T * sh.a_local  # log-sum-exp per query and head (fp32)
    else:
        per = (5 if m.dropout else 2) * cfg.mbs * sh.a_local * (sh.seq / cfg.cp) * sh.seq
        scores = per
    none = stream + attn + mlp + scores
    # Selective recompute drops the attention scores (FlashAttention never stores them).
    selective = none if ctx.training.flash_attention else none - scores
    return {"none": none, "selective": selective, "full": BF16 * T * h / div}


def layer_costs(ctx: Context, cfg: Config, pl: Placement, kind: str) -> dict[str, Cost]:
    """One layer of `kind` under every recompute mode (the forward pass, communication and
    activations are priced once and shared by the modes)."""
    sh = Shapes(ctx, cfg)
    afwd, abwd, core, awgrad, aflops = _attention_cost(ctx, cfg, pl, sh)
    mfwd, mbwd, mwgrad, mflops = _mlp_cost(ctx, cfg, pl, sh, kind)
    params, experts = layer_params(ctx.model, kind)
    dense_local = (params - experts) / cfg.tp
    expert_local = experts / (cfg.expert_tp * cfg.ep)
    if experts and ctx.training.moe_redundant_experts:  # EPLB keeps the redundant copies' weights too
        expert_local *= 1 + ctx.training.moe_redundant_experts / ctx.model.num_experts
    acts = _activation_bytes(ctx, cfg, sh, kind)
    flops = aflops + mflops
    exposed_ep_s = mfwd["ep_comm"] + mbwd["ep_comm"]  # without the overlap (`ep_overlap_pays`)
    if ep_overlap_on(ctx, cfg):
        # Megatron's EP overlap runs one micro-batch's forward beside another's backward, layer by
        # layer, each all-to-all beside one piece of the other pass (model_chunk_schedule_plan.py
        # TransformerLayerSchedulePlan.run: comm combine_bwd | dispatch_fwd -> dispatch_bwd |
        # combine_fwd against comp attention fwd | mlp dgrad -> mlp wgrad -> mlp fwd | attention bwd).
        half_f, half_b = mfwd["ep_comm"] / 2, mbwd["ep_comm"] / 2  # dispatch and combine
        m_dgrad = mbwd["compute"] - mwgrad
        mfwd, mbwd = dict(mfwd), dict(mbwd)
        mfwd["ep_comm"] = overlapped(half_f, m_dgrad) + overlapped(half_f, abwd["compute"])
        mbwd["ep_comm"] = overlapped(half_b, mwgrad + mfwd["compute"]) + overlapped(half_b, afwd["compute"])
    zero3 = cfg.zero == 3 and cfg.data_parallel
    if zero3:  # gather this layer's weights before forward and backward, reduce-scatter its gradients
        w_b, g_b = zero3_bytes_per_param(ctx)
        w_dense, w_exp = w_b * dense_local, w_b * expert_local
        ag = all_gather_s(ctx.levels, pl.dp_cp, w_dense) + all_gather_s(ctx.levels, pl.edp, w_exp)
        rs = reduce_scatter_s(ctx.levels, pl.dp_cp, g_b * dense_local) \
            + reduce_scatter_s(ctx.levels, pl.edp, g_b * expert_local)
    out = {}
    for recompute in ctx.modes:
        c = Cost()
        for key in TIME_KEYS:
            c.fwd[key] = afwd[key] + mfwd[key]
            c.bwd[key] = abwd[key] + mbwd[key]
        c.wgrad_s = awgrad + mwgrad
        if ctx.training.finetune == "qlora":  # NF4 weights dequantized to bf16 for every GEMM pass
            dq = _mem_s(ctx, (QLORA_BYTES_PER_PARAM + BF16) * (dense_local + expert_local))
            c.fwd["compute"] += dq
            c.bwd["compute"] += dq
        c.params = dense_local + expert_local
        c.expert_params = expert_local
        c.act_bytes = acts.get(recompute, acts["none"])
        c.work_bytes = acts["none"]
        c.hfu_flops = c.base_flops = 3 * flops
        if recompute == "full":
            c.bwd["recompute"] = sum(c.fwd[k] for k in ("compute", "tp_comm", "cp_comm", "ep_comm"))
            c.hfu_flops += flops
        elif recompute == "selective":
            c.bwd["recompute"] = core
            c.hfu_flops += core_attention_flops(sh)
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
                if (t_s or saved) and not cfg.cuda_graphs:  # the module's checkpoint wrapper's host time
                    t_s += ctx.framework.recompute_module_host_s
                c.bwd["recompute"] += t_s
                c.act_bytes -= saved
                c.hfu_flops += fl
            c.act_bytes = max(c.act_bytes, acts["full"])
        host = moe_host_s(ctx, cfg) if kind == "moe" else 0.0
        if host and ep_overlap_on(ctx, cfg):
            extra = ep_overlap_host_s(ctx, cfg, c, host)
            host += extra
            c.ep_overlap_gain_s = exposed_ep_s - mfwd["ep_comm"] - mbwd["ep_comm"] - extra
        if ctx.training.launch_blocking and not cfg.cuda_graphs:
            host += BLOCKING_LAYER_HOST_S
        if host:
            c.fwd["host"], c.bwd["host"] = host / 3, 2 * host / 3
        if zero3:
            c.fwd["zero3_comm"] = overlapped(ag, c.fwd["compute"])
            c.bwd["zero3_comm"] = overlapped(ag + rs, c.bwd["compute"] + c.bwd["recompute"])
        out[recompute] = c
    return out


def dispatcher_of(ctx: Context, cfg: Config) -> str:
    """The expert dispatcher a plan runs: its own choice, else the framework's default."""
    return cfg.dispatcher or ctx.framework.moe_dispatchers[0]


def moe_host_s(ctx: Context, cfg: Config) -> float:
    """Exposed host time of one dropless MoE layer and micro-batch, forward + backward (a third in the
    forward, two thirds in the backward). Megatron's dispatcher brings the per-expert token counts to
    the CPU (a device-to-host sync that empties the GPU's queue: `moe_layer_host_s`), and Transformer
    Engine's GroupedLinear then works expert by expert from the host (host-side m_splits, a split, a
    quantization and a cuBLAS GEMM per local expert, forward and backward: `moe_expert_host_s` each),
    so the layer's host time grows with the experts each GPU holds, E / ep (with EPLB's redundant
    copies). Larger EP therefore cuts host time as well as memory. Dropping and padding to a capacity
    (`training.moe_capacity_factor`) fixes every count in advance: no sync (token_dispatcher.py
    `drop_and_pad`: cuda_sync_point "no_sync"), the per-expert work stays. Full-iteration CUDA graphs
    (`cuda_graphs`) replay the step without the host: none."""
    fw = ctx.framework
    if cfg.cuda_graphs or not (fw.moe_layer_host_s or fw.moe_expert_host_s):
        return 0.0
    m = ctx.model
    local = m.num_experts / cfg.ep * (1 + ctx.training.moe_redundant_experts / m.num_experts)
    sync = fw.moe_layer_host_s if ctx.training.moe_capacity_factor is None else 0.0
    return sync + fw.moe_expert_host_s * local


def ep_overlap_host_s(ctx: Context, cfg: Config, c: Cost, host_s: float) -> float:
    """Host time the EP overlap exposes beyond `moe_host_s`, per MoE layer and micro-batch. Without
    the overlap the CPU stalls at the forward's token-count sync (`moe_host_s`) but runs ahead through
    the backward, which has no sync, and its launches hide under queued GPU work. Megatron's overlap
    schedule runs one micro-batch's forward beside another's backward layer by layer
    (model_chunk_schedule_plan.py), so every layer's backward launches now come after a forward sync
    (token_dispatcher.py `d2h_event.synchronize()`): the layer takes the longer of its GPU work (with
    the exposed host time) and its whole host launch work, `ep_overlap_host_factor` x `moe_host_s`
    (frameworks.yaml). Comm-bound layers (EP across nodes, H100) hide it; fast GPUs with many local
    experts at micro-batch 1 do not, which is why Megatron-Bridge turned the overlap off on B200 and
    B300 (PR #1760 "Disable moe_a2a_overlap due to CPU overhead", issue #3399). Dropping to a capacity
    has no sync: nothing more."""
    factor = ctx.framework.ep_overlap_host_factor
    if not factor or ctx.training.moe_capacity_factor is not None:
        return 0.0
    gpu_s = sum(c.fwd.values()) + sum(c.bwd.values()) - c.fwd["host"] - c.bwd["host"]
    return max(0.0, factor * host_s - gpu_s - host_s)


def routed_tokens(ctx: Context, cfg: Config, sh: Shapes) -> float:
    """Routed token copies one GPU's experts see per micro-batch: with SP each GPU routes T / tp
    tokens and an ETP group gathers the copies of its etp members (without SP the TP ranks share
    tokens); the busiest EP rank gets `moe_imbalance` times the mean."""
    k, etp, t = sh.m.num_experts_per_tok, cfg.expert_tp, cfg.tp
    return sh.tokens * k * (etp / t if cfg.sp or etp < t else 1.0) * moe_imbalance(ctx, cfg)


def _module_recompute(ctx: Context, cfg: Config, pl: Placement, sh: Shapes, kind: str, module: str,
                      afwd: dict, mfwd: dict, core_s: float,
                      acts: dict[str, float]) -> tuple[float, float, float]:
    """(time re-run in the backward, activation bytes no longer kept, FLOPs re-run) of one Megatron
    recompute module on one layer of `kind` (a module that does not apply to the kind costs nothing):
    core_attn re-runs core attention; layernorm both norms (drops their outputs); mlp the dense MLP
    block and moe the whole MoE block (its all-to-all too), each keeping only its input; moe_act the
    experts' activation function (drops its output); shared_experts the shared-expert MLP;
    mla_up_proj MLA's query/key/value up-projections (drops q, k, v, keeps the latents): Megatron's
    `qkv_up_proj_and_rope_apply` re-runs the query projection (`linear_q_up_proj` on the q latent, or
    `linear_q_proj` on the hidden state where the model has no q_lora_rank, as Moonlight), the key/value
    up-projection, RoPE and the q/k concatenation; with sequence parallelism both column-parallel
    projections all-gather their sequence-sharded inputs again (multi_latent_attention.py)."""
    m, T, h, t = sh.m, sh.tokens, sh.h, cfg.tp
    div = t if cfg.sp else 1
    q = ctx.saved_input_bytes  # linear-layer inputs as kept (see _activation_bytes)
    mats = _mlp_saved_bytes_per_ffn(m, q)
    etp = cfg.expert_tp
    routed = routed_tokens(ctx, cfg, sh)
    if module == "core_attn":
        return core_s, acts["none"] - acts["selective"], core_attention_flops(sh)
    if module == "layernorm":
        return _mem_s(ctx, 2 * 2 * BF16 * T * h / div), 2 * q * T * h / div, 0.0
    if module == "mlp" and kind == "dense":
        return (mfwd["compute"] + mfwd["tp_comm"], mats * T * m.intermediate_size / t,
                2 * T * h * m.intermediate_size / t * (3 if m.gated else 2))
    if module == "moe" and kind == "moe":
        saved = mats * routed * m.expert_ffn / etp + q * routed * h + mats * T * m.num_shared_experts * m.expert_ffn / t
        return (mfwd["compute"] + mfwd["tp_comm"] + mfwd["ep_comm"], saved,
                2 * routed * h * m.expert_ffn / etp * (3 if m.gated else 2))
    if module == "moe_act" and kind == "moe":
        act_out = BF16 * routed * m.expert_ffn / etp
        return _mem_s(ctx, (3 if m.gated else 2) * act_out), q / BF16 * act_out, 0.0
    if module == "shared_experts" and kind == "moe" and m.num_shared_experts:
        ffn = m.num_shared_experts * m.expert_ffn / t
        up = _gemm_s(ctx, T, h, ((3 if m.gated else 2) - 1) * ffn)
        down = _gemm_s(ctx, T, ffn, h)
        return up + down, mats * T * ffn, 2 * T * h * ffn * (3 if m.gated else 2)
    if module == "mla_up_proj" and m.is_mla:
        a = sh.a_local
        q_in = m.q_lora_rank or h
        gemms = [(T, m.kv_lora_rank, a * (m.qk_nope_head_dim + sh.d_v)), (T, q_in, a * sh.d_qk)]
        qkv = BF16 * T * a * (2 * sh.d_qk + sh.d_v)
        t_s = sum(_gemm_s(ctx, *g) for g in gemms) + _mem_s(ctx, 2 * qkv)  # GEMMs, RoPE + concatenation
        if cfg.sp and t > 1:
            t_s += all_gather_s(ctx.levels, pl.tp, BF16 * T * (q_in + m.kv_lora_rank))
        return t_s, qkv, sum(2 * x * y * z for x, y, z in gemms)
    return 0.0, 0.0, 0.0


def ep_overlap_on(ctx: Context, cfg: Config) -> bool:
    """Whether expert all-to-all overlaps computation (Megatron `--overlap-moe-expert-parallel-comm`
    with `--delay-wgrad-compute`): asked for or left to a framework that runs it, EP > 1, PP = 1 or
    interleaved (Megatron's requirement), and at least two micro-batches to pair."""
    if cfg.ep == 1 or cfg.ep_overlap is False:
        return False
    if cfg.schedule == "dualpipev":  # the schedule pairs forward and backward chunks: a2a hides
        return True
    if not ctx.framework.ep_overlap:
        return False
    if cfg.pp > 1 and cfg.vpp < 2:
        return False
    return num_microbatches(ctx.problem, cfg) >= 2


def _no_ep_overlap(cfg: Config) -> Config:
    return dataclasses.replace(cfg, ep_overlap=False)


def ep_overlap_refusals(fw: FrameworkProfile, modes: Iterable[str]) -> list[str]:
    """The recompute modes / modules among `modes` beside which the framework refuses the EP overlap
    (Megatron: full recompute and the `moe` recompute module: `ep_overlap_excludes_recompute`)."""
    used = {part for m in modes for part in (m, *m.split("+"))}
    return [x for x in fw.ep_overlap_excludes_recompute if x in used]


def ep_overlap_blocked(ctx: Context, modes: Iterable[str]) -> bool:
    """Whether the framework refuses the EP overlap beside any of these recompute modes."""
    return bool(ep_overlap_refusals(ctx.framework, modes))


def priced_config(ctx: Context, cfg: Config, modes: Iterable[str]) -> Config:
    """cfg as `evaluate` prices a plan whose layers use `modes`: an EP overlap left open (None) is
    off where the framework refuses it beside one of them (the launcher runs without it)."""
    if cfg.ep_overlap is None and ctx.model.is_moe and ep_overlap_blocked(ctx, modes):
        return _no_ep_overlap(cfg)
    return cfg


def ep_overlap_pays(ctx: Context, cfg: Config, layers: dict) -> bool:
    """Whether a plan that leaves the EP overlap open (`ep_overlap` None) runs it: where Megatron
    allows it (`ep_overlap_on`) and it does not make the MoE layer slower than running without it
    (it can, where the host launch work it exposes outweighs the all-to-all it hides:
    `ep_overlap_host_s`), as Megatron-Bridge's recipes turn it on for communication-bound systems
    and off for CPU-bound ones. A plan that names it (True / False) gets what it names. `layers`:
    the plan's layer costs with the overlap on (`shared_costs`, which records the answer in
    `Table.memo["ep_overlap"]`)."""
    if not ep_overlap_on(ctx, cfg):
        return False
    if cfg.ep_overlap is not None or cfg.schedule == "dualpipev" or "moe" not in ctx.model.layer_kinds():
        return True
    return layers[("moe", "none")].ep_overlap_gain_s >= 0.0  # = the layer is no slower with it than without


def layer_cost(ctx: Context, cfg: Config, pl: Placement, kind: str, recompute: Recompute) -> Cost:
    """One layer of `kind` with one recompute mode (see `layer_costs`)."""
    return layer_costs(ctx, cfg, pl, kind)[recompute]


def _embedding_cost(ctx: Context, cfg: Config, pl: Placement) -> Cost:
    """Input embedding (first virtual stage): lookup, and its all-reduce / scatter over TP."""
    m = ctx.model
    sh = Shapes(ctx, cfg)
    c = Cost()
    c.params = m.vocab_size * m.hidden_size / cfg.tp
    c.fwd["compute"] = _mem_s(ctx, 2 * BF16 * sh.tokens * sh.h)
    c.bwd["compute"] = _mem_s(ctx, 3 * BF16 * sh.tokens * sh.h)
    if cfg.tp > 1:
        act = BF16 * sh.tokens * sh.h
        op = reduce_scatter_s if cfg.sp else all_reduce_s
        c.fwd["tp_comm"] = op(ctx.levels, pl.tp, act)
    c.act_bytes = 0.0
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
    c.bwd["compute"] = head_b + ce
    if cfg.tp > 1:
        act = BF16 * T * h
        op = all_gather_s if cfg.sp else all_reduce_s
        c.fwd["tp_comm"] = op(ctx.levels, pl.tp, act)
        c.bwd["tp_comm"] = c.fwd["tp_comm"]
    c.hfu_flops = c.base_flops = 3 * 2 * T * h * V
    c.act_bytes = BF16 * T * h / (cfg.tp if cfg.sp else 1)
    c.work_bytes = (BF16 + 4) * T * V  # bf16 logits + fp32 softmax of one micro-batch
    return c


@dataclass
class Table:
    """Everything about a config that does not depend on per-layer choices."""

    cfg: Config
    placement: Placement
    layers: dict[tuple[str, str], Cost]  # (kind, recompute) -> cost
    embed: Cost
    head: Cost
    pp_p2p_s: float  # one send of a micro-batch's activation to the next stage
    microbatches: int
    memo: dict = field(default_factory=dict)  # figures derived from layers / embed / head alone (shared with them)


def shared_costs(ctx: Context, cfg: Config, pl: Placement, cache: dict | None, key: Any) -> tuple:
    """(layer costs by (kind, mode), embedding, head, memo) of cfg under placement pl, from
    `cache[key]` when the caller's key says they were priced already (the key must cover
    every input they depend on); memo holds figures derived from them (`Table.memo`)."""
    if cache is not None and key in cache:
        return cache[key]
    kinds = sorted(set(ctx.model.layer_kinds()))
    layers = {(k, r): c for k in kinds for r, c in layer_costs(ctx, cfg, pl, k).items()}
    overlap = ep_overlap_on(ctx, cfg)
    if overlap and "moe" in kinds and not ep_overlap_pays(ctx, cfg, layers):
        layers.update({("moe", r): c for r, c in layer_costs(ctx, _no_ep_overlap(cfg), pl, "moe").items()})
        overlap = False
    # memo["ep_overlap"]: whether these costs run the EP overlap (what `ep_overlap_pays` resolved)
    got = (layers, _embedding_cost(ctx, cfg, pl), _head_cost(ctx, cfg, pl), {"ep_overlap": overlap})
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
    key = (cfg.tp, cfg.cp, cfg.ep, cfg.sp, cfg.mbs, cfg.pp == 1, pl.tp, pl.cp, pl.ep, cfg.etp, pl.etp,
           cfg.tp_overlap, cfg.ep_overlap, ep_overlap_on(ctx, cfg), cfg.cuda_graphs, dispatcher_of(ctx, cfg),
           cfg.cp_comm,
           (cfg.dp, pl.dp_cp, pl.edp) if zero3 else None)
    layers, embed, head, memo = shared_costs(ctx, cfg, pl, cache, key)
    sh = Shapes(ctx, cfg)
    # Megatron scatters the stage output over the TP ranks and re-gathers it over NVLink on the
    # next stage (scatter-gather optimization, Narayanan et al. 2021 §4.1), with or without SP.
    p2p_bytes = BF16 * sh.tokens * sh.h / cfg.tp
    p2p = p2p_s(ctx.levels, pl.pp_level, p2p_bytes) if cfg.pp > 1 else 0.0
    return Table(cfg, pl, layers, embed, head, p2p, num_microbatches(ctx.problem, cfg), memo)


# ---------------------------------------------------------------------------------------
# 2. Per-rank totals and 3. assembly
# ---------------------------------------------------------------------------------------


@dataclass
class RankTotals:
    fwd: dict[str, float]
    bwd: dict[str, float]
    wgrad_s: float
    act_bytes: float
    params: float
    expert_params: float
    hfu_flops: float
    base_flops: float
    layers: int
    kinds: dict[str, int]
    recompute: dict[str, int]

    @property
    def time_s(self) -> float:
        return sum(self.fwd.values()) + sum(self.bwd.values())


def rank_totals(table: Table, chunks_of_rank: list[list[tuple[str, str]]], first: bool, last: bool) -> RankTotals:
    """Sum the table over the (kind, recompute) of every layer in each chunk of one rank."""
    fwd = dict.fromkeys(TIME_KEYS, 0.0)
    bwd = dict.fromkeys(TIME_KEYS, 0.0)
    tot = RankTotals(fwd, bwd, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, {}, {})
    pieces: list[Cost] = []
    for chunk in chunks_of_rank:
        for kind, rc in chunk:
            pieces.append(table.layers[(kind, rc)])
            tot.kinds[kind] = tot.kinds.get(kind, 0) + 1
            tot.recompute[rc] = tot.recompute.get(rc, 0) + 1
        tot.layers += len(chunk)
    if first:
        pieces.append(table.embed)
    if last:
        pieces.append(table.head)
    for c in pieces:
        for k in TIME_KEYS:
            fwd[k] += c.fwd[k]
            bwd[k] += c.bwd[k]
        tot.wgrad_s += c.wgrad_s
        tot.act_bytes += c.act_bytes
        tot.params += c.params
        tot.expert_params += c.expert_params
        tot.hfu_flops += c.hfu_flops
        tot.base_flops += c.base_flops
    # Pipeline sends: each chunk sends forward activations and receives gradients once per micro-batch.
    n_chunks = len(chunks_of_rank)
    sends = n_chunks - (1 if last else 0)
    recvs = n_chunks - (1 if first else 0)
    fwd["pp_comm"] += table.pp_p2p_s * sends
    bwd["pp_comm"] += table.pp_p2p_s * recvs
    return tot


def inflight_microbatches(cfg: Config, rank: int, microbatches: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak (in units of the
    rank's full set of layers)."""
    p, m = cfg.pp, microbatches
    if cfg.schedule == "gpipe":
        return float(m)
    if cfg.schedule == "interleaved":
        pairs = min(m * cfg.vpp, (p - rank - 1) * 2 + (cfg.vpp - 1) * p + 1)
        return pairs / cfg.vpp
    if cfg.schedule == "dualpipev":  # PP + 1 half-rank chunks on every rank (DualPipe README table)
        return min(float(m), p + 0.5)
    return float(min(m, p - rank))


def static_bytes(ctx: Context, cfg: Config, params: float, expert_params: float) -> dict[str, float]:
    """Weights, gradients and optimizer states of one GPU under the ZeRO stage."""
    dense = params - expert_params
    dp_dense = cfg.dp * cfg.cp
    dp_exp = max(1, cfg.tp * cfg.cp * cfg.dp // (cfg.expert_tp * cfg.ep))
    w_b, g_b, opt_b = param_bytes(ctx)

    def shard(nbytes_per_param: float, sharded: bool) -> float:
        if not sharded:
            return nbytes_per_param * params
        return nbytes_per_param * (dense / dp_dense + expert_params / dp_exp)

    weights = shard(w_b, cfg.zero >= 3)
    from .catalog import weight_copy_bytes_per_param  # noqa: PLC0415

    weights += shard(weight_copy_bytes_per_param(ctx.training.precision, ctx.gpu), cfg.zero >= 3)  # fp8/fp4 copies
    return {
        "weights": weights,
        "gradients": shard(g_b, cfg.zero >= 2),
        "optimizer_states": 0.0 if cfg.opt_offload else shard(opt_b, cfg.zero >= 1),
    }


@functools.lru_cache(maxsize=4096)
def affine(fn, levels: tuple[Level, ...], prof) -> tuple[float, float]:
    """(seconds per byte, seconds) of a collective: time = slope * bytes + intercept.

    Every collective cost is affine in the message size for a fixed group (bandwidth
    terms scale, latency does not); evaluate and the solver both price the data-parallel
    tail through this form so they agree exactly.
    """
    if prof.size <= 1:
        return 0.0, 0.0
    t1, t2 = fn(levels, prof, 1e9), fn(levels, prof, 2e9)
    slope = (t2 - t1) / 1e9
    return slope, t1 - slope * 1e9


@dataclass(frozen=True)
class TailModel:
    """Affine forms of the data-parallel tail of one rank (see `dp_tail`)."""

    reduce: tuple[float, float, float]  # (s per dense param, s per expert param, s) gradient reduction
    gather: tuple[float, float, float]  # parameter all-gather after the optimizer (ZeRO-1/2)
    optimizer_s_per_param: float  # optimizer step, per parameter held (before sharding)
    reduce_repeats: int  # 1, or the micro-batch count under ZeRO-2
    overlap_reduce: bool = True  # gradient reduction under the last backward (overlap_grad_reduce)
    overlap_gather: bool = True  # parameter all-gather under the next forward (overlap_param_gather)


def tail_model(ctx: Context, table: "Table") -> TailModel:
    cfg, pl = table.cfg, table.placement
    opt_b = OPT_TRAFFIC_BYTES if ctx.training.optimizer in ("adam", "adamw") else OPT_TRAFFIC_BYTES * 2 / 3
    tm = _tail_model(ctx.levels, pl.dp_cp, pl.edp, cfg.zero, cfg.dp * cfg.cp, ctx.model.is_moe,
                     table.microbatches if cfg.zero == 2 else 1, opt_b, ctx.hbm_bytes_per_s,
                     ctx.framework.grad_reduce_bytes, gathered_weight_bytes(ctx))
    if ctx.training.finetune != "full":  # only the adapters are reduced, gathered and stepped
        f = lora_fraction(ctx.model, ctx.training.lora_rank)
        tm = dataclasses.replace(tm, reduce=(tm.reduce[0] * f, tm.reduce[1] * f, tm.reduce[2]),
                                 gather=(tm.gather[0] * f, tm.gather[1] * f, tm.gather[2]),
                                 optimizer_s_per_param=tm.optimizer_s_per_param * f)
    if cfg.opt_offload:
        # Gradients go down to the host and updated bf16 weights come back over the host link; the
        # CPU's Adam reads and writes ~28 B per parameter (fp32 weight, gradient, two moments) at the
        # host memory bandwidth of the GPU's share. Both on the step's critical path.
        shard = 1.0 / (cfg.dp * cfg.cp) if cfg.zero >= 1 else 1.0
        fw, gpu = ctx.framework, ctx.gpu
        per = shard * ((fw.grad_bytes + BF16) / gpu.host_link_bytes_per_s + 28.0 / gpu.host_memory_bytes_per_s)
        tm = dataclasses.replace(tm, optimizer_s_per_param=per)
    if cfg.grad_overlap and cfg.param_overlap:
        return tm
    return dataclasses.replace(tm, overlap_reduce=cfg.grad_overlap, overlap_gather=cfg.param_overlap)


@functools.lru_cache(maxsize=4096)
def _tail_model(lv: tuple[Level, ...], dp_cp, edp, zero: int, dpc: int, has_experts: bool, repeats: int,
                opt_b: float, hbm_bytes_per_s: float, grad_b: float = BF16, gather_b: float = BF16) -> TailModel:
    none = (0.0, 0.0, 0.0)
    reduce = gather = none
    if (dpc > 1 or edp.size > 1) and zero < 3:
        op = all_reduce_s if zero == 0 else reduce_scatter_s
        (sd, cd), (se, ce) = affine(op, lv, dp_cp), affine(op, lv, edp)
        reduce = (grad_b * sd, grad_b * se, cd + (ce if has_experts else 0.0))
        if zero in (1, 2):
            (sd, cd), (se, ce) = affine(all_gather_s, lv, dp_cp), affine(all_gather_s, lv, edp)
            gather = (gather_b * sd, gather_b * se, cd + (ce if has_experts else 0.0))
    shard = 1.0 / dpc if zero >= 1 else 1.0
    return TailModel(reduce, gather, opt_b * shard / hbm_bytes_per_s, repeats)


def dp_tail_s(tm: TailModel, params: float, expert_params: float, fwd_s: float, bwd_s: float) -> tuple[float, float]:
    """(exposed data-parallel communication, optimizer step) of a rank holding `params`
    (of which `expert_params`) with forward / backward windows `fwd_s` / `bwd_s` (see `dp_tail`)."""
    dense = params - expert_params
    red = tm.reduce[0] * dense + tm.reduce[1] * expert_params + tm.reduce[2] if any(tm.reduce) else 0.0
    gat = tm.gather[0] * dense + tm.gather[1] * expert_params + tm.gather[2] if any(tm.gather) else 0.0
    exposed = tm.reduce_repeats * (overlapped(red, bwd_s) if tm.overlap_reduce else red) \
        + (overlapped(gat, fwd_s) if tm.overlap_gather else gat)
    return exposed, tm.optimizer_s_per_param * params


def dp_tail(tm: TailModel, tot: "RankTotals") -> dict[str, float]:
    """Exposed data-parallel communication and the optimizer step of one rank.

    Gradient buckets reduce under the backward of the last micro-batch (overlap-grad-reduce):
    only what exceeds that backward is exposed; under ZeRO-2 this happens after every
    micro-batch. ZeRO-1/2 all-gather updated parameters under the next forward
    (overlap-param-gather). ZeRO-3 traffic is priced per layer instead.
    """
    exposed, optimizer = dp_tail_s(tm, tot.params, tot.expert_params, sum(tot.fwd.values()), sum(tot.bwd.values()))
    return {"dp_comm": exposed, "optimizer": optimizer}


def working_bytes(table: "Table", last: bool) -> float:
    """Transient memory of a rank: the largest layer's full activations (its backward
    working set), or the last stage's logits if larger."""
    layer = max(c.work_bytes for c in table.layers.values())
    return max(layer, table.head.work_bytes) if last else layer


def pipeline_time(cfg: Config, microbatches: int, t: list[float], w: list[float], chunk_t: list[float],
                  b: list[float] | None = None) -> float:
    """Time from the first forward to the last backward across the pipeline.

    t_p: one micro-batch through all layers of rank p, forward and backward; M micro-batches.
    - 1F1B / GPipe: (M - 1) max t + sum t (warm-up and cool-down through every stage once);
      for P equal stages (M + P - 1) t.
    - interleaved (vpp chunks per rank): M max t + (P - 1) max chunk time: the bubble shrinks
      by vpp for equal chunks, and a lopsided chunk split pays for its largest chunk.
    - zero-bubble (ZB-H1): weight-gradient work w fills the bubbles: M max t + (P - 1) max u,
      u = t - w; for equal stages the bubble is (P - 1)(t - w) as in Qi et al. 2023, and an
      uneven split pays for its slowest stage.
    - DualPipeV (two half-rank chunks per rank in a V, `b` the backward per rank): M max t +
      (P - 1) max (F&B + B - 3W) of a chunk, F&B (a forward and a backward chunk overlapped) = t / 2,
      B = b / 2, W = w / 2: the DualPipe README's bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2P stages.
    """
    tmax = max(t)
    if cfg.schedule == "dualpipev":
        bb = b or [x / 1.5 for x in t]
        bubble = max(max(0.0, (x + y - 3 * z) / 2) for x, y, z in zip(t, bb, w))
        return microbatches * tmax + (cfg.pp - 1) * bubble
    if cfg.schedule == "zero_bubble":
        u = [a - b for a, b in zip(t, w)]
        return microbatches * tmax + (cfg.pp - 1) * max(u)
    if cfg.schedule == "interleaved":
        return microbatches * tmax + (cfg.pp - 1) * max(chunk_t)
    return (microbatches - 1) * tmax + sum(t)


def chunk_times(table: "Table", chunks: list[list[tuple[str, str]]]) -> list[float]:
    """Forward + backward time of one micro-batch through each virtual stage, in order."""
    out = []
    for c, chunk in enumerate(chunks):
        t = sum(table.layers[key].total_s for key in chunk)
        t += table.embed.total_s if c == 0 else 0.0
        t += table.head.total_s if c == len(chunks) - 1 else 0.0
        t += table.pp_p2p_s * ((c < len(chunks) - 1) + (c > 0))
        out.append(t)
    return out


class StageEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)
    rank: int
    layers: int
    dense_layers: int
    moe_layers: int
    recompute: dict[str, int]
    has_embedding: bool
    has_lm_head: bool
    forward_s: float
    backward_s: float
    inflight_microbatches: float
    memory_gib: dict[str, float]
    peak_memory_gib: float


class Estimate(BaseModel):
    """What a plan costs. `fits` is False with every reason when the plan is invalid or
    does not fit in HBM; times are per training step."""

    model_config = ConfigDict(frozen=True)
    fits: bool
    reasons: list[str]
    warnings: list[str] = []
    plan: Plan
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    model_tflops_per_gpu: float
    num_microbatches: int
    peak_memory_gib: float
    memory_capacity_gib: float
    time_breakdown_s: dict[str, float]
    memory_breakdown_gib: dict[str, float]
    stages: list[StageEstimate]
    bottleneck: str
    # predicted step time x the 10th/90th percentile of measured/predicted of the validation runs of its
    # regime (autoshard/intervals.py, autoshard/data/intervals.yaml); None: no step time
    step_time_interval_s: tuple[float, float] | None = None


def invalid_estimate(plan: Plan, reasons: list[str], ctx: Context | None) -> Estimate:
    cap = ctx.capacity_bytes / GIB if ctx else 0.0
    zero_mem = {"weights": 0.0, "gradients": 0.0, "optimizer_states": 0.0, "activations": 0.0}
    return Estimate(fits=False, reasons=reasons, plan=plan, step_time_s=0.0, tokens_per_s=0.0, mfu=0.0,
                    hfu=0.0, model_tflops_per_gpu=0.0, num_microbatches=0, peak_memory_gib=0.0,
                    memory_capacity_gib=cap, time_breakdown_s={}, memory_breakdown_gib=zero_mem,
                    stages=[], bottleneck="invalid plan")


def chunk_rank(c: int, pp: int, v_shape: bool = False) -> int:
    """The rank holding virtual stage c: round robin (interleaved), or a V (DualPipeV: rank r holds
    stages r and 2P-1-r, so rank 0 holds the embedding and the loss)."""
    if v_shape and c >= pp:
        return 2 * pp - 1 - c
    return c % pp


def assign_layers(kinds: list[str], recompute: list[str], stage_layers: list[int], pp: int,
                  v_shape: bool = False) -> list[list[list[tuple[str, str]]]]:
    """Per rank, its chunks, each a list of (kind, recompute) in layer order."""
    ranks: list[list[list[tuple[str, str]]]] = [[] for _ in range(pp)]
    start = 0
    for c, n in enumerate(stage_layers):
        ranks[chunk_rank(c, pp, v_shape)].append(list(zip(kinds[start:start + n], recompute[start:start + n])))
        start += n
    return ranks


def assemble(ctx: Context, table: Table, stage_layers: list[int], recompute: list[str], plan: Plan,
             warnings: list[str]) -> Estimate:
    cfg, M = table.cfg, table.microbatches
    kinds = ctx.model.layer_kinds()
    v = cfg.schedule == "dualpipev"
    head_rank = 0 if v else cfg.pp - 1
    per_rank = assign_layers(kinds, recompute, stage_layers, cfg.pp, v)
    tots = [rank_totals(table, chunks, r == 0, r == head_rank) for r, chunks in enumerate(per_rank)]
    t = [x.time_s for x in tots]
    w = [x.wgrad_s for x in tots]
    b = [sum(x.bwd.values()) for x in tots]
    ordered = [per_rank[chunk_rank(c, cfg.pp, v)][c // cfg.pp] for c in range(cfg.pp * cfg.vpp)]
    t_pipe = pipeline_time(cfg, M, t, w, chunk_times(table, ordered), b)
    tm = tail_model(ctx, table)
    tails = [dp_tail(tm, x) for x in tots]
    tail_tot = [sum(x.values()) for x in tails]
    step = t_pipe + max(tail_tot)

    # Memory per rank.
    stages: list[StageEstimate] = []
    reasons: list[str] = []
    cap = ctx.capacity_bytes
    for r, x in enumerate(tots):
        mem = static_bytes(ctx, cfg, x.params, x.expert_params)
        infl = inflight_microbatches(cfg, r, M)
        mem["activations"] = x.act_bytes * infl
        mem["working"] = working_bytes(table, r == head_rank)
        if cfg.zero == 3 and cfg.data_parallel:
            mem["zero3_gathered"] = zero3_gathered_for(ctx, cfg, table.layers.values())
        peak = sum(mem.values())
        gib = {k: v / GIB for k, v in mem.items()}
        stages.append(StageEstimate(
            rank=r, layers=x.layers, dense_layers=x.kinds.get("dense", 0), moe_layers=x.kinds.get("moe", 0),
            recompute=x.recompute, has_embedding=r == 0, has_lm_head=r == head_rank,
            forward_s=sum(x.fwd.values()), backward_s=sum(x.bwd.values()), inflight_microbatches=infl,
            memory_gib=gib, peak_memory_gib=peak / GIB))
        if peak > cap:
            reasons.append(f"stage {r} needs {peak / GIB:.1f} GiB of {cap / GIB:.1f} GiB usable "
                           f"({ctx.gpu.hbm_gib:g} GiB HBM less {RESERVE_GIB:g} GiB reserve)")
    peak_stage = max(stages, key=lambda s: s.peak_memory_gib)

    # Breakdown along the critical path: the slowest rank's steady state, the bubble, the tail.
    slow = max(range(cfg.pp), key=lambda r: t[r])
    bd = {k: M * (tots[slow].fwd[k] + tots[slow].bwd[k]) for k in TIME_KEYS}
    bd["pipeline_bubble"] = max(0.0, t_pipe - M * t[slow])  # (round-off can make 1-stage pipelines -1e-20)
    tail_rank = max(range(cfg.pp), key=lambda r: tail_tot[r])
    bd.update(tails[tail_rank])
    tokens = ctx.training.tokens_per_step
    mflops = model_flops_per_step(ctx.problem)
    # HFU: MFU scaled by executed / needed FLOPs (recompute), so HFU >= MFU always.
    recompute_ratio = sum(x.hfu_flops for x in tots) / max(1e-30, sum(x.base_flops for x in tots))
    peak_all = ctx.peak * ctx.num_gpus
    memory_bd = dict(peak_stage.memory_gib)
    bottleneck = max(bd, key=lambda k: bd[k])
    full_plan = plan.model_copy(update={"dp": cfg.dp, "stage_layers": list(stage_layers)})
    return Estimate(
        fits=not reasons, reasons=reasons, warnings=warnings, plan=full_plan,
        step_time_s=step, tokens_per_s=tokens / step, mfu=mflops / (step * peak_all),
        hfu=recompute_ratio * mflops / (step * peak_all), model_tflops_per_gpu=mflops / step / ctx.num_gpus / 1e12,
        num_microbatches=M, peak_memory_gib=peak_stage.peak_memory_gib,
        memory_capacity_gib=cap / GIB, time_breakdown_s=bd, memory_breakdown_gib=memory_bd,
        stages=stages, bottleneck=bottleneck)


def placement_warnings(table: Table) -> list[str]:
    pl = table.placement
    out = []
    for axis in ("tp", "cp", "ep"):
        prof = getattr(pl, axis)
        if prof.straddles:
            out.append(f"{axis} group of {prof.size} GPUs spans several {prof.straddles[0]} domains although it "
                       f"fits inside one (placement {table.cfg.placement}); it is priced at the slower level")
    return out


def ep_overlap_priced(problem: Problem, plan: Plan) -> bool:
    """Whether `evaluate` prices a valid `plan` with the expert all-to-all overlapped (the plan's
    choice, or where it leaves it open, `ep_overlap_pays`): what exports set."""
    dp, reasons = config_reasons(problem, plan)
    if reasons:
        return False
    ctx = context(problem)
    cfg = priced_config(ctx, Config.of(plan, dp), set(plan.recompute_per_layer(problem.model.num_hidden_layers)))
    return layer_table(ctx, cfg).memo["ep_overlap"]


def evaluate(problem: Problem | Any, plan: Plan | Any) -> Estimate:
    """Step time, throughput, MFU and per-stage memory of `plan` on `problem`.

    Never raises for an invalid plan: `fits=False` and `reasons` lists every problem.
    """
    from .loader import load_plan, load_problem  # noqa: PLC0415

    problem = load_problem(problem)
    plan = load_plan(plan)
    ctx = with_modes(context(problem), plan.recompute)
    dp, reasons = config_reasons(problem, plan)
    if reasons:
        return invalid_estimate(plan, reasons, ctx)
    n = problem.model.num_hidden_layers
    cfg = priced_config(ctx, Config.of(plan, dp), set(plan.recompute_per_layer(n)))
    warnings = []
    if plan.sequence_parallel and plan.tp == 1:
        warnings.append("sequence_parallel is ignored with tp=1")
    table = layer_table(ctx, cfg)
    warnings += placement_warnings(table)
    stage_layers = plan.stage_layers or layout_split(n, cfg.pp * cfg.vpp)
    from .intervals import with_interval  # noqa: PLC0415

    est = assemble(ctx, table, stage_layers, plan.recompute_per_layer(n), plan, warnings)
    return with_interval(est, problem.model.is_moe)  # step_time_interval_s from the validation residuals


"""What a plan is priced against: the problem resolved once (`Context`), the global knobs of a plan
(`Config`), whether a plan is valid for the problem (`config_reasons`) and whether its framework's
launcher runs it (`launch_reasons`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..catalog import GPU, get_gpu, get_recipe
from ..frameworks import FrameworkProfile, get_framework
from ..layouts import layout_reason
from ..spec import RECOMPUTES, Plan, Problem, ProblemParts, parse_placement
from ..topology import ClusterGraph, Level, cluster_graph, resolve_levels
from .constants import BF16, GIB, RESERVE_GIB
from .params import module_params
from ..catalog import (
    attention_flops_per_s,
    gemm_flops_per_s,
    gemm_peak_flops_per_s,
    low_precision_fraction,
    quant_overhead_bytes_per_element,
    saved_input_bytes_per_element,
    weight_copy_bytes_per_param,
)


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

        q = saved_input_bytes_per_element(self.training.precision, self.gpu)
        f = self.bf16_layer_share  # whole layers in bf16 keep bf16 inputs (a mean over the layers)
        return f * BF16 + (1.0 - f) * q

    @functools.cached_property
    def low_precision(self) -> bool:
        """Whether the recipe runs linear GEMMs below 16 bits (FP8, MXFP8, NVFP4)."""
        return low_precision_fraction(self.training.precision) > 0

    @functools.cached_property
    def bf16_layer_share(self) -> float:
        """Share of the transformer layers a low-precision recipe keeps wholly in BF16
        (`training.bf16_layers_at_start` + `bf16_layers_at_end`, Megatron --first-last-layers-bf16); 0
        for 16-bit recipes. Priced as a mean over the layers (every stage at the model's share)."""
        t = self.training
        if not self.low_precision:
            return 0.0
        return (t.bf16_layers_at_start + t.bf16_layers_at_end) / self.model.num_hidden_layers

    def module_flops_per_s(self, module: str) -> float | None:
        """GEMM rate of one module class's linear layers (`spec.MODULE_CLASSES`): the 16-bit rate where a
        low-precision recipe keeps the module in BF16 (`training.bf16_modules`: no quantization either,
        `kernels._gemm_s`), else None (the recipe's rate, `mm_flops_per_s`)."""
        if self.low_precision and module in self.training.bf16_modules:
            return self.hp_flops_per_s
        return None

    def module_saved_input_bytes(self, module: str) -> float:
        """`saved_input_bytes` of one module class: bf16 where the recipe keeps the module in BF16."""
        return float(BF16) if self.module_flops_per_s(module) is not None else self.saved_input_bytes

    @functools.cached_property
    def low_precision_param_share(self) -> float:
        """Share of the transformer layers' linear weights a low-precision recipe runs below 16 bits:
        the layers not kept in BF16 (`bf16_layer_share`) times the weights of the module classes not in
        `training.bf16_modules` (1 by default). Scales the low-precision weight copies."""
        if not self.training.bf16_modules:
            return 1.0 - self.bf16_layer_share
        total = module_params(self.model)
        low = sum(v for k, v in total.items() if k not in self.training.bf16_modules)
        return (1.0 - self.bf16_layer_share) * (low / sum(total.values()) if sum(total.values()) else 0.0)

    @functools.cached_property
    def peak(self) -> float:
        return gemm_peak_flops_per_s(self.gpu, self.training.precision)

    @functools.cached_property
    def mm_flops_per_s(self) -> float:
        low = gemm_flops_per_s(self.gpu, self.training.precision)
        f = self.bf16_layer_share  # layers kept in bf16: the FLOP-weighted harmonic mean of the two rates
        return low if not f else 1.0 / (f / self.hp_flops_per_s + (1.0 - f) / low)

    @functools.cached_property
    def hp_flops_per_s(self) -> float:
        """GEMM rate of the layers every recipe keeps in 16 bits (the router, the LM head)."""
        return attention_flops_per_s(self.gpu)

    @functools.cached_property
    def quant_bytes(self) -> tuple[float, float]:
        """HBM bytes moved per element to quantize a linear layer's (activation, weight) inputs for its
        low-precision GEMMs, weighted by the recipe's low-precision share: activations (the input in
        the forward, the output gradient in the backward) every micro-batch; weights only where the
        recipe keeps no low-precision copy for the step (torchao recasts them every micro-batch;
        Transformer Engine caches them), at the framework's measured bytes where its kernels move
        more than the recipe's count. (0, 0) for 16-bit recipes. `kernels._gemm_s` charges them."""
        prec = self.training.precision
        per = dict(self.framework.quant_hbm_bytes_per_element).get(get_recipe(prec).id) \
            or quant_overhead_bytes_per_element(prec, self.gpu)
        q = per * low_precision_fraction(prec) * (1.0 - self.bf16_layer_share)
        return q, (q if q and not self.weight_copy_bytes_per_param else 0.0)

    @functools.cached_property
    def weight_copy_bytes_per_param(self) -> float:
        """Bytes per parameter of the low-precision weight copies kept for the step: the recipe's
        (`catalog.weight_copy_bytes_per_param`) where the framework caches them, else 0."""
        if not self.framework.fp8_weight_cache:
            return 0.0
        return weight_copy_bytes_per_param(self.training.precision, self.gpu) * self.low_precision_param_share

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
        """HBM a plan may use per GPU: usable HBM less the reserve and the requested headroom, over
        the framework's allocator overhead (`FrameworkProfile.allocator_overhead`)."""
        free = self.gpu.hbm_bytes - (RESERVE_GIB + self.problem.search.headroom_gib) * GIB
        return free / self.framework.allocator_overhead


def context(problem: Problem) -> Context:
    gpu = get_gpu(problem.cluster.gpu, problem.cluster.catalog, problem.cluster.power_cap_w)
    levels = resolve_levels(problem.cluster, gpu)
    extra = tuple(m for m in problem.search.allowed("recompute", []) if m not in RECOMPUTES)
    return Context(problem, gpu, levels, cluster_graph(levels, problem.cluster.num_gpus),
                   RECOMPUTES + tuple(dict.fromkeys(extra)))


def with_modes(ctx: Context, modes: Any) -> Context:
    """`ctx` pricing also the recompute modes in `modes` (a plan's per-layer list or one mode)."""
    extra = tuple(m for m in dict.fromkeys([modes] if isinstance(modes, str) else modes) if m not in ctx.modes)
    return dataclasses.replace(ctx, modes=ctx.modes + extra) if extra else ctx


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
    reshard: str | int | None = None  # reshard_after_forward; None = the framework's policy (`reshard_policy`)
    dp_replicate: int = 1  # replicas of the ZeRO-sharded state (hierarchical sharding)
    rounds: int = 1  # pipeline_rounds: schedules the step's micro-batches run in, one after another
    graph_scope: tuple[str, ...] = ()  # cuda_graph_scope: per-layer CUDA graph regions

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
    def shard_dense(self) -> int:
        """Ranks the dense ZeRO states shard over: dp x cp, over dp_replicate replicas."""
        return max(1, self.dp * self.cp // self.dp_replicate)

    @property
    def shard_expert(self) -> int:
        """Ranks the expert ZeRO states shard over: edp, over dp_replicate replicas."""
        return max(1, self.expert_dp // self.dp_replicate)

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
                      plan.optimizer_offload, plan.cp_comm_type, plan.cuda_graphs, plan.moe_dispatcher,
                      plan.reshard_after_forward, plan.dp_replicate, plan.pipeline_rounds,
                      tuple(plan.cuda_graph_scope))

    def plan(self, recompute: Any = "none", stage_layers: list[int] | None = None) -> Plan:
        return Plan(tp=self.tp, cp=self.cp, ep=self.ep, pp=self.pp, dp=self.dp, vpp=self.vpp,
                    sequence_parallel=self.sp, zero_stage=self.zero, micro_batch_size=self.mbs,
                    schedule=self.schedule, placement=self.placement, recompute=recompute,
                    stage_layers=stage_layers, etp=self.etp, tp_comm_overlap=self.tp_overlap,
                    ep_overlap=self.ep_overlap, overlap_grad_reduce=self.grad_overlap,
                    overlap_param_gather=self.param_overlap, optimizer_offload=self.opt_offload,
                    cp_comm_type=self.cp_comm, cuda_graphs=self.cuda_graphs, moe_dispatcher=self.dispatcher,
                    reshard_after_forward=self.reshard, dp_replicate=self.dp_replicate,
                    pipeline_rounds=self.rounds, cuda_graph_scope=list(self.graph_scope))


def reshard_policy(fw: FrameworkProfile, cfg: Config) -> str | int:
    """What a ZeRO-3 / FSDP layer's gathered weights do between its forward and its backward: the
    plan's `reshard_after_forward`, else the framework's policy ("always", "never" or a group size N)."""
    if cfg.reshard is not None:
        return cfg.reshard
    if cfg.pp > 1 and fw.pipeline_reshard_after_forward:
        return fw.pipeline_reshard_after_forward
    return fw.reshard_after_forward[0]


def zero3_step_sync(fw: FrameworkProfile, cfg: Config) -> bool:
    """Whether a ZeRO-3 plan's gradients accumulate unsharded over the micro-batches and reduce-scatter
    once per step after the last backward (`FrameworkProfile.pipeline_zero3_step_sync`, pp > 1)."""
    return cfg.zero == 3 and cfg.pp > 1 and fw.pipeline_zero3_step_sync and cfg.data_parallel


def dp_knob_reasons(fw: FrameworkProfile, name: str, plan: Plan, dp: int, expert_dp: int) -> list[Reason]:
    """Why the framework cannot run the plan's data-parallel knobs: an overlap turned off that its
    launcher always runs (`dp_overlap_flags`), a reshard_after_forward form it lacks, hierarchical
    sharding (dp_replicate) at a ZeRO stage it does not shard that way or not dividing the groups."""
    out: list[Reason] = []
    # what its engine overlaps unless switched off (an overlap it never runs may be asked off: DeepSpeed's
    # ZeRO-1/2 gather after the step, its pipeline engine's reduction)
    overlaps = {"grad_reduce": fw.pipeline_grad_reduce_overlap if plan.pp > 1 else fw.grad_reduce_overlap,
                "param_gather": plan.zero_stage == 3 or fw.param_gather_overlap}
    for knob, flag in (("overlap_grad_reduce", "grad_reduce"), ("overlap_param_gather", "param_gather")):
        if not getattr(plan, knob) and overlaps[flag] and flag not in fw.dp_overlap_flags:
            out.append(Reason(f"{name} always runs its {flag.replace('_', ' ')} overlapped (no switch turns it off):"
                              f" {knob} false is not a run it makes", field=knob))
    ra = plan.reshard_after_forward
    if ra is not None:
        form = "group" if isinstance(ra, int) else ra
        if plan.zero_stage != 3:
            out.append(Reason(f"reshard_after_forward applies to ZeRO-3 / FSDP, not zero_stage {plan.zero_stage}",
                              field="reshard_after_forward"))
        elif form not in fw.reshard_after_forward:
            runs = ", ".join("N (a group size)" if f == "group" else f for f in fw.reshard_after_forward)
            out.append(Reason(f"{name} runs reshard_after_forward {runs}, not {ra}", field="reshard_after_forward"))
        elif isinstance(ra, int) and dp:
            shard = dp * plan.cp // plan.dp_replicate
            if shard % ra or ra >= shard:
                out.append(Reason(f"reshard_after_forward {ra}: the secondary shard group must divide the "
                                  f"{shard} ranks the weights shard over, and be smaller", field="reshard_after_forward"))
    r = plan.dp_replicate
    if r > 1:
        if plan.zero_stage not in fw.replicate_zero_stages:
            out.append(Reason(f"{name} shards hierarchically (dp_replicate) at ZeRO stage "
                              f"{' or '.join(map(str, fw.replicate_zero_stages))}, not {plan.zero_stage}"
                              if fw.replicate_zero_stages else f"{name} has no hierarchical sharding (dp_replicate)",
                              field="dp_replicate"))
        elif dp and (dp % r or expert_dp % r):
            out.append(Reason(f"dp_replicate={r} must divide dp={dp} (and the experts' data parallelism "
                              f"{expert_dp})", field="dp_replicate"))
        elif dp and dp == r and plan.cp == 1:
            out.append(Reason(f"dp_replicate={r} equals dp: nothing left to shard (use zero_stage 0)",
                              field="dp_replicate"))
    return out


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


ReasonSink = Callable[[str, str], None]  # bad(field, text): records a reason a plan is invalid


def config_reasons(problem: Problem, plan: Plan) -> tuple[int, list[Reason]]:
    """(dp, reasons the global degrees are invalid); reasons empty means valid. Each reason is a
    `Reason`, a str that names the field it is about (`Reason.field`, never None here). One
    function per family of rules (`CONFIG_RULES`), in the order their reasons are reported."""
    n = problem.cluster.num_gpus
    reasons: list[Reason] = []

    def bad(field: str, text: str) -> None:
        reasons.append(Reason(text, field=field))

    mp = plan.tp * plan.cp * plan.pp
    dp = plan.dp if plan.dp is not None else (n // mp if n % mp == 0 else 0)
    fw = get_framework(problem.framework)
    for rule in CONFIG_RULES:
        rule(problem, plan, fw, dp, bad)
    return dp, reasons


def _mesh_reasons(problem: Problem, plan: Plan, fw: FrameworkProfile, dp: int, bad: ReasonSink) -> None:
    """The mesh covers the GPUs; TP divides the heads and FFNs; CP splits the sequence in 2*cp chunks."""
    m, t, n = problem.model, problem.training, problem.cluster.num_gpus
    mp = plan.tp * plan.cp * plan.pp
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


def _context_reasons(problem: Problem, plan: Plan, fw: FrameworkProfile, dp: int, bad: ReasonSink) -> None:
    """Context parallelism as the framework runs it: beside sequence parallelism, its comm types."""
    m = problem.model
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


def _expert_reasons(problem: Problem, plan: Plan, fw: FrameworkProfile, dp: int, bad: ReasonSink) -> None:
    """Expert parallelism: a MoE model, EP and ETP dividing the experts, the expert mesh, folding."""
    m = problem.model
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


def _feature_reasons(problem: Problem, plan: Plan, fw: FrameworkProfile, dp: int, bad: ReasonSink) -> None:
    """Sequence parallelism's split, then each feature the plan asks of the framework."""
    m, t = problem.model, problem.training
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
    if plan.optimizer_offload and plan.zero_stage not in fw.optimizer_offload_zero_stages:
        bad("optimizer_offload", f"{problem.framework} offloads the optimizer to the CPU only with ZeRO stage "
            f"{' or '.join(map(str, fw.optimizer_offload_zero_stages))}, not {plan.zero_stage}"
            if fw.optimizer_offload_zero_stages else f"{problem.framework} has no CPU optimizer offload")
    if plan.pipeline_rounds > 1 and dp:
        microbatches = t.global_batch_size // (dp * plan.micro_batch_size)
        if microbatches % plan.pipeline_rounds:
            bad("pipeline_rounds", f"pipeline_rounds={plan.pipeline_rounds} does not divide the {microbatches} "
                "micro-batches of a step")
    if dp:
        for r in dp_knob_reasons(fw, problem.framework, plan, dp,
                                 max(1, plan.tp * plan.cp * dp // (plan.expert_tp * plan.ep))):
            bad(r.field or "", str(r))
    if plan.cuda_graphs and not fw.cuda_graphs:
        bad("cuda_graphs", f"{problem.framework} cannot capture the training step in CUDA graphs (cuda_graphs)")
    for scope_why in graph_scope_reasons(problem, plan):
        bad("cuda_graph_scope", scope_why)
    if grads_why := fw.main_grads_reason(t.main_grads):
        bad("training.main_grads", grads_why)
    if t.fp8_params:
        if not fw.fp8_params:
            bad("training.fp8_params", f"{problem.framework} cannot keep its weights in FP8 (training.fp8_params)")
        elif get_recipe(t.precision).gemm_dtype not in ("fp8", "fp4") or t.finetune != "full":
            bad("training.fp8_params", f"training.fp8_params needs an FP8 or FP4 recipe and full training "
                f"(precision {t.precision}, finetune {t.finetune}): 16-bit weights have no low-precision param gather")
    for knob in ("cross_entropy_fusion", "defer_embedding_wgrad", "attention_mask_in_batch"):
        if getattr(t, knob) and not fw.output_layer_knobs:
            bad(f"training.{knob}", f"{problem.framework} has no {knob} (a Megatron-LM knob: training.{knob})")
    if t.defer_embedding_wgrad and plan.pp == 1:  # model_parallel_config.py __post_init__ raises so
        bad("training.defer_embedding_wgrad", "defer_embedding_wgrad needs pipeline parallelism (pp > 1): "
            "Megatron cannot defer the embedding wgrad without it")
    if t.moe_capacity_factor is not None and m.is_moe:
        if not fw.moe_token_drop:
            bad("training.moe_capacity_factor", f"{problem.framework} routes dropless: it has no expert capacity "
                "to drop tokens at (training.moe_capacity_factor)")
        elif (plan.moe_dispatcher or fw.moe_dispatchers[0]) == "deepep":
            bad("moe_dispatcher", "the DeepEP dispatcher cannot pad expert inputs to a capacity (Megatron raises "
                "with --moe-pad-expert-input-to-capacity): token dropping needs alltoall or hybridep")


def _dual_microbatches(plan: Plan, global_batch: int, dp: int, bad: ReasonSink, why: str) -> None:
    """DualPipe and DualPipeV run micro-batches in forward/backward pairs and fill each of the 2 x pp
    virtual stages: an even number of them, at least 2 x pp (checked where the batch divides)."""
    if dp and global_batch % (dp * plan.micro_batch_size) == 0:
        mb = global_batch // (dp * plan.micro_batch_size)
        if mb < 2 * plan.pp or mb % 2:
            bad("micro_batch_size", f"{plan.schedule}: {mb} micro-batches; it needs an even number >= 2*pp = "
                f"{2 * plan.pp}{why}")


def _schedule_reasons(problem: Problem, plan: Plan, fw: FrameworkProfile, dp: int, bad: ReasonSink) -> None:
    """The global batch over dp*micro_batch_size, virtual stages, and each schedule's needs."""
    m, t = problem.model, problem.training
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
        else:
            _dual_microbatches(plan, t.global_batch_size, dp, bad, "")
    if plan.schedule == "dualpipe":
        # DeepSeek's bidirectional DualPipe (deepseek-ai/DualPipe dualpipe.py): rank r holds stage r of
        # one pipeline and stage P-1-r of the other, half the micro-batches entering from each end; the
        # ranks pair up (r, P-1-r), so P is even, and each direction needs P micro-batches to fill.
        if plan.pp < 2 or plan.pp % 2 or plan.vpp != 1:
            bad("schedule", "schedule 'dualpipe' needs an even pp >= 2 and vpp = 1 (one stage of each direction per rank)")
        else:
            _dual_microbatches(plan, t.global_batch_size, dp, bad, " (half enter from each end)")
    if plan.schedule == "interleaved":
        if plan.vpp < 2 or plan.pp < 2:
            bad("schedule", "schedule 'interleaved' needs pp >= 2 and vpp >= 2")
        elif dp and t.global_batch_size % (dp * plan.micro_batch_size) == 0:
            mb = t.global_batch_size // (dp * plan.micro_batch_size)
            if mb % plan.pp:
                bad("micro_batch_size", f"interleaved schedule: {mb} micro-batches is not a multiple of pp={plan.pp}")
    if plan.schedule == "zero_bubble" and plan.pp < 2:
        bad("schedule", "schedule 'zero_bubble' needs pp >= 2")


def _layout_reasons(problem: Problem, plan: Plan, fw: FrameworkProfile, dp: int, bad: ReasonSink) -> None:
    """stage_layers, and a recompute list the framework's launcher can express."""
    m = problem.model
    chunks = plan.pp * plan.vpp
    stage_bad = plan.stage_layers is not None and (len(plan.stage_layers) != chunks
                                                   or sum(plan.stage_layers) != m.num_hidden_layers)
    if plan.stage_layers is not None:
        if len(plan.stage_layers) != chunks:
            bad("stage_layers", f"stage_layers has {len(plan.stage_layers)} entries, expected pp*vpp = {chunks}")
        elif sum(plan.stage_layers) != m.num_hidden_layers:
            bad("stage_layers", f"stage_layers sum to {sum(plan.stage_layers)}, the model has "
                f"{m.num_hidden_layers} layers")
    if isinstance(plan.recompute, list) and len(plan.recompute) != m.num_hidden_layers:
        bad("recompute", f"recompute lists {len(plan.recompute)} layers, the model has {m.num_hidden_layers}")
    elif not stage_bad:
        layout = "per_layer" if problem.search.recompute_layout == "per_layer" else fw.recompute_layout
        split = list(plan.stage_layers) if plan.stage_layers is not None else layout_split(m.num_hidden_layers, chunks)
        if why := layout_reason(layout, split, list(plan.recompute_per_layer(m.num_hidden_layers)), plan.pp):
            bad("recompute", f"{problem.framework} cannot run this recompute list: {why} (plan a list it runs, "
                "or `search: {recompute_layout: per_layer}` for a stack that takes any list)")


def _a2a_reasons(problem: Problem, plan: Plan, fw: FrameworkProfile, dp: int, bad: ReasonSink) -> None:
    """All-to-all context parallelism scatters heads over cp."""
    m = problem.model
    if plan.cp > 1 and plan.cp_comm_type == "a2a":
        heads = m.kv_heads if not m.is_mla else m.num_attention_heads
        if (m.num_attention_heads // plan.tp) % plan.cp or max(1, heads // plan.tp) % plan.cp:
            bad("cp_comm_type", f"cp_comm_type a2a scatters heads over cp={plan.cp}: the {m.num_attention_heads} "
                f"query and {heads} key/value heads per tp={plan.tp} group must divide by it")


CONFIG_RULES = (_mesh_reasons, _context_reasons, _expert_reasons, _feature_reasons, _schedule_reasons,
                _layout_reasons, _a2a_reasons)


def live_axes(plan: Plan | Config, dp: int) -> list[str]:
    """The mesh axes of size > 1, in the placement's order (innermost first): two placements with
    the same live order lay the ranks out alike, wherever their size-1 axes sit. Without folding the
    placement's ep axis is carved out of the data-parallel one (dp / ep); with folding the experts
    follow the attention ranks and ep has no axis of its own."""
    cfg = plan if isinstance(plan, Config) else Config.of(plan, dp)
    sizes = {"tp": cfg.tp, "cp": cfg.cp, "ep": cfg.ep, "dp": max(1, cfg.dp // cfg.ep), "pp": cfg.pp}
    if cfg.folded:
        sizes.update(ep=1, dp=cfg.dp)
    axes = parse_placement(cfg.placement) if cfg.placement else ("tp", "cp", "ep", "dp", "pp")
    return [a for a in axes if sizes.get(a, 1) > 1]


def pipeline_zero_refused(fw: FrameworkProfile, pp: int, zero: int) -> bool:
    """Whether the framework's launcher refuses ZeRO stage `zero` beside `pp` pipeline stages
    (`FrameworkProfile.pipeline_zero_stages`; `launch_reasons`, and the solver's candidates)."""
    return pp > 1 and bool(fw.pipeline_zero_stages) and zero not in fw.pipeline_zero_stages


def graph_scope_reasons(problem: Problem, plan: Plan) -> list[str]:
    """Why a plan's per-layer CUDA graphs (`cuda_graph_scope`) cannot run, by Megatron's checks
    (transformer_config.py __post_init__ at d98e8a64dd): the framework must capture graphs, not beside a
    full-iteration graph ("cuda_graph_modules must be empty when cuda_graph_impl=full_iteration"), moe
    (and the whole layer of a MoE model) only for drop-and-pad MoE ("moe cuda graph is only supported
    with drop-padding MoE"), moe / moe_router only for MoE models, mlp only where a dense MLP layer
    exists, full recompute only with full-iteration graphs, no `moe` recompute module around a moe_router
    graph (a recompute module must lie inside or outside a graph, never cover one)."""
    scope = plan.cuda_graph_scope
    if not scope:
        return []
    fw, m, t = get_framework(problem.framework), problem.model, problem.training
    out = []
    if not fw.cuda_graphs:
        out.append(f"{problem.framework} cannot capture layers in CUDA graphs (cuda_graph_scope)")
    if plan.cuda_graphs:
        out.append("per-layer graphs (cuda_graph_scope) cannot be combined with the full-iteration graph (cuda_graphs)")
    if any(s in scope for s in ("moe", "moe_router")) and not m.is_moe:
        out.append("moe / moe_router graphs need a MoE model")
    if m.is_moe and any(s in scope for s in ("moe", "layer")) and t.moe_capacity_factor is None:
        out.append("a MoE block is captured only with drop-and-pad (training.moe_capacity_factor): dropless "
                   "MoE has dynamic shapes; capture moe_router (+ moe_preprocess) instead")
    if "mlp" in scope and not m.num_dense_layers:
        out.append("mlp graphs capture dense MLP layers, and every layer of this model is MoE")
    modes = set(plan.recompute_per_layer(m.num_hidden_layers))
    if "full" in modes:
        out.append("full recompute runs with full-iteration CUDA graphs only, not per-layer ones")
    if "moe_router" in scope and any("moe" in mode.split("+") for mode in modes):
        out.append("the moe recompute module cannot wrap a moe_router graph (Megatron: \"moe recompute is not "
                   "supported with moe_router CUDA graph\")")
    return out


def launch_reasons(problem: Problem, plan: Plan) -> list[Reason]:
    """Why the framework's launcher would refuse a plan `config_reasons` accepts (empty: it launches):
    the rules the cost model can still price, so `evaluate` prices the plan and says so (`--strict`
    makes it an error), while the solver, `compare` and `export` never propose it.

    - Rank order: the placement's live axes (`live_axes`) must be those of an order the launcher sets
      (`FrameworkProfile.rank_orders`: Megatron initialize_model_parallel's tp-cp-ep-dp-pp, or
      tp-cp-ep-pp-dp under --use-tp-pp-dp-mapping only where attention and experts have the same
      data-parallel size; the fixed meshes of torchtitan, AutoModel, DeepSpeed), unless the problem
      maps ranks by hand (`search.placement_layout: any`).
    - ZeRO x pipeline: the ZeRO stages the framework runs beside pp > 1 (`FrameworkProfile.
      pipeline_zero_stages`: DeepSpeed's PipelineEngine asserts stage < 2)."""
    fw = get_framework(problem.framework)
    n = problem.cluster.num_gpus
    mp = plan.tp * plan.cp * plan.pp
    dp = plan.dp if plan.dp is not None else max(1, n // mp)
    reasons: list[Reason] = []
    cfg = Config.of(plan, dp)
    orders = fw.rank_orders(cfg)
    if orders and problem.search.placement_layout != "any":
        mine = live_axes(cfg, dp)
        if all(live_axes(dataclasses.replace(cfg, placement=o), dp) != mine for o in orders):
            inner = [o for o in fw.placements if o not in orders
                     and live_axes(dataclasses.replace(cfg, placement=o), dp) == mine]
            why = (f" ({inner[0]} only where attention and experts have the same data-parallel size: "
                   f"dp={dp}, expert dp={cfg.expert_dp})" if inner else "")
            reasons.append(Reason(f"{problem.framework}'s launcher sets the rank order {' or '.join(orders)}, not "
                                  f"{plan.placement}{why}; set search.placement_layout: any if the ranks are "
                                  "mapped by hand", field="placement"))
    if pipeline_zero_refused(fw, plan.pp, plan.zero_stage):
        reasons.append(Reason(f"{problem.framework} runs ZeRO stages {list(fw.pipeline_zero_stages)} with a pipeline, "
                              f"not zero_stage={plan.zero_stage} with pp={plan.pp} ({fw.pipeline_zero_source})",
                              field="zero_stage"))
    return reasons


def layout_split(num_layers: int, chunks: int) -> list[int]:
    """The default layers per virtual stage: `even_split`, or, with one or two virtual stages more
    than layers, the embedding alone in the first and the loss alone in the last (Megatron's
    `--pipeline-model-parallel-layout` "E|t|...|t|L", or --account-for-embedding/loss-in-pipeline-split)."""
    extra = chunks - num_layers
    if extra <= 0:
        return even_split(num_layers, chunks)
    return [0] + [1] * num_layers + [0] * (extra - 1)


def even_split(num_layers: int, chunks: int) -> list[int]:
    """Layers per virtual stage as even as possible, the remainder on the middle stages (a new list)."""
    return list(_even_split(num_layers, chunks))


@functools.lru_cache(maxsize=4096)
def _even_split(num_layers: int, chunks: int) -> tuple[int, ...]:
    """`even_split`, memoized (the candidates' rule checks ask it of every set of degrees)."""
    base, rem = divmod(num_layers, chunks)
    out = [base] * chunks
    order = sorted(range(chunks), key=lambda c: (abs(c - (chunks - 1) / 2), c))
    for c in order[:rem]:
        out[c] += 1
    return tuple(out)


def ep_overlap_refusals(fw: FrameworkProfile, modes: Iterable[str]) -> list[str]:
    """The recompute modes / modules among `modes` beside which the framework refuses the EP overlap
    (Megatron: full recompute and the `moe` recompute module: `ep_overlap_excludes_recompute`)."""
    used = {part for m in modes for part in (m, *m.split("+"))}
    return [x for x in fw.ep_overlap_excludes_recompute if x in used]

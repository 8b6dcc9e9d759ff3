"""Framework profiles (autoshard/data/frameworks.yaml): what a launcher runs and keeps in memory."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml
from typing import get_args
from .spec import Dispatcher

# FlashAttention-style kernels count the backward as 2.5x the forward's FLOPs (cost.ATTN_BWD_FACTOR) but
# run it slower: the backward recomputes the scores, writes dQ with atomics and keeps more operands
# in flight. Measured with cuDNN's fused attention (what Transformer Engine runs) on H100 and H200,
# causal, head dim 64 and 128, 2-8k tokens: backward TFLOP/s over forward TFLOP/s, median 0.84 of
# 18 shapes (range 0.76-0.91; autoshard/data/kernel_measurements.json, benchmarks/measure_kernels.py).
# FlashAttention-2 and -3 publish their backward below their forward as well (Dao 2023; Shah et al.
# 2024: their benchmark sections).
CUDNN_ATTENTION_BACKWARD_RATE = 0.84

# `FrameworkProfile.cp_ring_hbm_bytes` keys: direction, tensor (attention output q / one of K, V), per ring
# step after the first or once per call
CP_RING_BYTE_KEYS = ("fwd_q_step", "fwd_kv_step", "fwd_q_call", "fwd_kv_call",
                     "bwd_q_step", "bwd_kv_step", "bwd_q_call", "bwd_kv_call")

# What a framework's "selective" recompute re-runs (FrameworkProfile.selective_recompute)
SELECTIVE_RECOMPUTES = ("core_attention", "every_second_matmul")


@dataclass(frozen=True)
class FrameworkProfile:
    name: str
    weight_bytes: float
    grad_bytes: float
    master_bytes: float
    adam_state_bytes: float
    grad_reduce_bytes: float
    zero_stages: tuple[int, ...]
    schedules: tuple[str, ...]
    tp_comm_overlap: bool
    ep_overlap: bool
    moe_folding: bool
    uneven_stages: bool
    source: str
    moe_layer_host_s: float = 0.0  # exposed host time per MoE layer and micro-batch (fwd + bwd)
    moe_expert_host_s: float = 0.0  # ... and per local expert of that layer (grouped-MLP path)
    # under the EP overlap: the layer's whole host launch work as a multiple of moe_host_s (cost.ep_overlap_host_s)
    ep_overlap_host_factor: float = 0.0
    # recompute modes (or recompute-module names) beside which it refuses the EP overlap
    ep_overlap_excludes_recompute: tuple[str, ...] = ()
    # HBM bytes per fc2-output element (forward, backward) of an unfused expert bias (ModelSpec.expert_bias)
    expert_bias_bytes: tuple[float, float] = (0.0, 0.0)
    attention_kernel_factor: float = 1.0  # attention kernel rate relative to FlashAttention-3 / cuDNN
    # core attention's backward rate relative to its forward (cost.attention_backward_s)
    attention_backward_rate: float = CUDNN_ATTENTION_BACKWARD_RATE
    recompute_module_host_s: float = 0.0  # host time of one recompute module per layer and micro-batch
    # Eager FSDP2 (fully_shard per block, hooks in Python): host time its hooks add per FSDP-wrapped
    # block and micro-batch (forward + backward), and per parameter of the units outside the blocks
    # (embedding, final norm, output layer) per micro-batch; run ahead of the GPU like the launches
    # (cost.layers._eager_host, cost.layers._fsdp_outer_host). Measured (frameworks.yaml).
    fsdp_block_host_s: float = 0.0
    fsdp_outer_host_s_per_param: float = 0.0
    # Bytes per logit element its loss holds at the loss backward's peak (cost.layers._head_cost): bf16
    # logits + fp32 softmax (6, Megatron's fused vocab-parallel cross entropy) unless stated
    loss_logit_bytes: float = 6.0
    # Its gated MLPs (SwiGLU) run the activation and the product as separate eager ops, so autograd keeps
    # the activation's output beside the fc1 outputs and the fc2 input (cost.layers._mlp_saved_bytes_per_ffn)
    unfused_gated_activation: bool = False
    # frees its gradients between steps (zero_grad(set_to_none=True)): with one micro-batch a step, the
    # loss backward's peak holds none (cost.layers._step_grad_bytes)
    grads_freed_between_steps: bool = False
    # compiles the step where it runs the TP overlap it prices (AsyncTP needs torch.compile): the eager facts
    # above (unfused_gated_activation, loss_logit_bytes) do not hold there (cost.layers.eager_step)
    compiled_with_tp_overlap: bool = False
    cuda_graphs: bool = False  # can capture the whole training step in CUDA graphs
    # launches its kernels from eager Python (cost.EAGER_LAUNCH_HOST_S per counted launch); False: a
    # compiled step (XLA) whose runtime launches from C++
    eager_launches: bool = True
    # cuBLAS workspaces its process allocates through PyTorch's caching allocator (cost.CUBLAS_WORKSPACE_BYTES)
    cublas_workspaces: tuple[str, ...] = ("pytorch",)
    # workspaces added where TP communication overlaps the GEMMs (Megatron's TE userbuffers)
    tp_overlap_cublas_workspaces: tuple[str, ...] = ()
    # with training.gradient_accumulation_fusion its linear layers write weight gradients into the fp32
    # main_grad buffers and hand autograd a cached dummy gradient instead, one 16-bit tensor per distinct
    # weight shape kept for the whole run (Transformer Engine's get_dummy_wgrad; cost.layers.dummy_wgrad_bytes)
    dummy_wgrads: bool = False
    # Data-parallel tail overlaps its engine runs (Plan.overlap_grad_reduce / overlap_param_gather ask for
    # them; cost.dp_overlaps grants what the engine does): gradient reduction under the backward with
    # pp = 1 and with pipeline parallelism, and the ZeRO-1/2 parameter all-gather under the next forward
    grad_reduce_overlap: bool = True
    pipeline_grad_reduce_overlap: bool = True
    param_gather_overlap: bool = True
    # Overlaps its launcher can switch (Plan.overlap_grad_reduce / overlap_param_gather turn them off
    # there: "grad_reduce", "param_gather"); an overlap it always runs cannot be turned off
    dp_overlap_flags: tuple[str, ...] = ()
    # ZeRO-3 / FSDP reshard_after_forward forms it runs ("always", "never", "group": a secondary shard
    # over N ranks); the first is its policy without pipeline parallelism
    reshard_after_forward: tuple[str, ...] = ("always",)
    pipeline_reshard_after_forward: str = ""  # its policy with pp > 1 ("": the first form)
    # with pp > 1, FSDP's gradient reduce-scatter and reshard run once per step after the last micro-batch,
    # the gradients accumulated unsharded until then (torch.distributed.pipelining over FSDP2)
    pipeline_zero3_step_sync: bool = False
    # ZeRO stages it can shard over a group of data-parallel ranks and replicate across groups (Plan.dp_replicate)
    replicate_zero_stages: tuple[int, ...] = ()
    moe_dispatchers: tuple[str, ...] = ("alltoall",)  # expert dispatchers it runs; the first is its default
    moe_token_drop: bool = False  # can drop and pad expert inputs to a capacity (training.moe_capacity_factor)
    quantized_saved_inputs: bool = False  # keeps linear-layer inputs for the backward in the recipe's low precision
    # (recipe id or "all", "forward" | "both"): under these low-precision recipes, quantizes a sequence-
    # parallel linear layer's input on its sequence shard and all-gathers it at the recipe's size, and with
    # "both" the output gradient of the backward's all-gather too (cost.layers.tp_gather_bytes)
    quantized_tp_gather: tuple[tuple[str, str], ...] = ()
    # keeps the routed experts' activation-function inputs (fc1 outputs) in the recipe's low precision too
    quantized_expert_act_inputs: bool = False
    # under a low-precision recipe, dispatches expert inputs (and the gradients entering the experts)
    # at the recipe's size; the combines stay 16-bit
    low_precision_dispatch: bool = False
    # runs Megatron's dispatcher stages as separate launches (cost.kernels.dispatch_stage_launches)
    moe_dispatch_stages: bool = False
    # SMs its expert all-to-all kernels hold while a paired forward/backward chunk computes beside them
    # (DualPipe's overlap): the computation runs on the others (0: priced as COMM_INTERFERENCE instead)
    ep_comm_sms: int = 0
    fp8_params: bool = False  # can keep the weights themselves in FP8 (training.fp8_params)
    # runs Megatron-LM's output-layer / loss knobs (training.cross_entropy_fusion, defer_embedding_wgrad)
    output_layer_knobs: bool = False
    # keeps its low-precision weight copies for the whole step (Transformer Engine caches them across
    # micro-batches); False = recasts the weights in every forward (torchao Float8Linear)
    fp8_weight_cache: bool = True
    # (recipe, HBM bytes per quantized element) where its quantization kernels move more than the
    # recipe's own count (precisions.yaml quant_hbm_bytes_per_element), measured
    quant_hbm_bytes_per_element: tuple[tuple[str, float], ...] = ()
    # cp_comm_type it runs at cp > 1 (None = any), and those a model with sliding-window attention may use
    cp_comm_types: tuple[str, ...] | None = None
    cp_excludes_sp: bool = False  # its context parallelism cannot run beside TP's sequence parallelism
    window_cp_comm_types: tuple[str, ...] | None = None
    # Its context-parallel p2p ring (cost.kernels.cp_ring_merge_s): HBM bytes its merge and gradient-
    # accumulation ops move per element of the GPU's attention output ("q") and of its K (the same of V,
    # "kv"), per ring step after the first ("step") and once per call ("call"), in the forward ("fwd")
    # and the backward ("bwd"); keys CP_RING_BYTE_KEYS, absent = 0
    cp_ring_hbm_bytes: tuple[tuple[str, float], ...] = ()
    # bytes per element of the K/V gradients its backward ring passes on (fp32 accumulation: 4)
    cp_grad_exchange_bytes: float = 2.0
    # how its p2p ring moves K/V: "p2p", one chunk a step passed on under that step's attention (TE);
    # "allgather", every rank's K/V gathered by one all-gather issued with the first step and awaited at
    # the second (PyTorch's _AllGatherRotater), the K/V gradients passed by all-to-all each step and
    # the last of them awaited after the last step (cost.communication.cp_comm_s)
    cp_kv_rotate: str = "p2p"
    # recompute lists its launcher runs (layouts.py): per_layer | uniform | block | every_nth
    recompute_layout: str = "per_layer"
    # what its "selective" recompute re-runs (cost.layers._recompute_mode): core_attention (Megatron's
    # --recompute-granularity selective: the attention core) or every_second_matmul (torchtitan's
    # per-op SAC: the attention core and every odd matmul of a block kept, every second matmul and
    # every other op re-run in the backward)
    selective_recompute: str = "core_attention"
    # its TP sequence parallelism gathers and scatters [micro-batch, sequence, hidden] activations along
    # the sequence dimension, through collectives that copy the tensor around NCCL's leading-dimension
    # layout (cost.communication.sequence_dim_copies_s)
    sequence_dim_collectives: bool = False
    # runs the projections that share an input as one GEMM (Megatron's linear_qkv and gated linear_fc1);
    # False: separate linear layers (cost.layers._unfused_s)
    fused_projections: bool = True
    # Megatron recompute-module sets the solver plans by default (beside none / selective / full)
    planned_recompute_modules: tuple[str, ...] = ()
    # schedules it prices (evaluate, a search that names them) but the solver does not plan by default:
    # its launcher has no flag for them
    unplanned_schedules: tuple[str, ...] = ()
    # rank orders (placements, innermost axis first) its launcher can set; empty = any
    placements: tuple[str, ...] = ()
    # ZeRO stages its launcher runs beside a pipeline (pp > 1); empty = every stage it runs
    # (`cost.launch_reasons`), and where that rule is stated
    pipeline_zero_stages: tuple[int, ...] = ()
    pipeline_zero_source: str = ""
    # HBM its runs hold per byte the cost model counts at the peak (the PyTorch caching allocator's
    # split and cached blocks, communication buckets): the usable capacity is divided by it
    allocator_overhead: float = 1.0

    def allocator_note(self) -> str:
        """`deepspeed's 1.2x allocator overhead` where `allocator_overhead` shrinks the usable HBM, else ""."""
        return f"{self.name}'s {self.allocator_overhead:g}x allocator overhead" if self.allocator_overhead != 1.0 else ""

    def rank_orders(self, cfg) -> tuple[str, ...]:
        """The placements the solver may plan for `cfg` (empty: any). A pipeline axis inside the
        data-parallel one (Megatron --use-tp-pp-dp-mapping) needs the attention and expert data-parallel
        sizes equal (megatron/core/parallel_state.py initialize_model_parallel, core_v0.16.1)."""
        return tuple(o for o in self.placements
                     if o.index("pp") > o.index("dp") or cfg.pp == 1 or cfg.expert_dp == cfg.dp)
    # training.main_grads it runs -> (grad_bytes, grad_reduce_bytes, grad_accum_bytes_per_param); the
    # first is its default
    main_grads: tuple[tuple[str, float, float, float], ...] = ()
    # HBM bytes per local parameter that each micro-batch's backward moves to fold its gradients into
    # the accumulator, beyond the backward itself (DeepSpeed BF16_Optimizer's update_hp_grads)
    grad_accum_bytes_per_param: float = 0.0
    # ZeRO stages with which it can keep the optimizer states in host memory, stepped by the CPU
    # (Plan.optimizer_offload; Megatron --optimizer-cpu-offload, DeepSpeed ZeRO-Offload); () = none
    optimizer_offload_zero_stages: tuple[int, ...] = ()
    optimizer_offload_name: str = ""  # what its users call it (the flag or feature)

    def with_main_grads(self, kind: str | None) -> "FrameworkProfile":
        """This profile with its gradient buffer and reduction in `kind` (fp32 / bf16; None: the
        default). A kind it does not run leaves the profile as it is (`main_grads_reason` says so)."""
        for name, grad_b, reduce_b, accum_b in self.main_grads:
            if name == kind:
                return dataclasses.replace(self, grad_bytes=grad_b, grad_reduce_bytes=reduce_b,
                                           grad_accum_bytes_per_param=accum_b)
        return self

    def main_grads_reason(self, kind: str | None) -> str | None:
        """Why a run of this framework cannot keep its gradients in `kind`, or None."""
        kinds = [name for name, _, _, _ in self.main_grads]
        if kind is None or kind in kinds:
            return None
        return f"{self.name} keeps its gradients in {' or '.join(kinds) or 'its own dtype'}, not {kind} (training.main_grads)"

    def optimizer_state_bytes(self, optimizer: str) -> float:
        """Bytes per parameter the optimizer keeps (master weights + moments); SGD keeps one moment."""
        moments = self.adam_state_bytes if optimizer in ("adam", "adamw") else self.adam_state_bytes / 2
        return self.master_bytes + moments


def _dispatchers(name: str, values: list[str]) -> tuple[str, ...]:
    """A profile's expert dispatchers, checked against the names plans take (spec.Dispatcher)."""
    bad = [v for v in values if v not in get_args(Dispatcher)]
    if bad or not values:
        raise ValueError(f"frameworks.yaml: {name}.moe_dispatchers: {bad or 'empty'} (valid: {get_args(Dispatcher)})")
    return tuple(values)


def _choices(name: str, field: str, values: Any, valid: tuple[str, ...]) -> tuple[str, ...]:
    """A profile's list of named forms, checked against `valid`."""
    bad = [v for v in values if v not in valid]
    if bad:
        raise ValueError(f"frameworks.yaml: {name}.{field}: {bad} (valid: {', '.join(valid)})")
    return tuple(values)


def _layout(name: str, value: str) -> str:
    if value not in ("per_layer", "uniform", "block", "every_nth"):
        raise ValueError(f"frameworks.yaml: {name}.recompute_layout: {value!r} "
                         "(valid: per_layer, uniform, block, every_nth)")
    return value


def _selective(name: str, value: str) -> str:
    if value not in SELECTIVE_RECOMPUTES:
        raise ValueError(f"frameworks.yaml: {name}.selective_recompute: {value!r} "
                         f"(valid: {', '.join(SELECTIVE_RECOMPUTES)})")
    return value


def _ring_bytes(name: str, values: Any) -> tuple[tuple[str, float], ...]:
    """A profile's `cp_ring_hbm_bytes`, its keys checked against CP_RING_BYTE_KEYS."""
    bad = [k for k in values if k not in CP_RING_BYTE_KEYS]
    if bad:
        raise ValueError(f"frameworks.yaml: {name}.cp_ring_hbm_bytes: {bad} (valid: {', '.join(CP_RING_BYTE_KEYS)})")
    return tuple((str(k), float(v)) for k, v in values.items())


def _pair(values: Any) -> tuple[float, float]:
    """The two numbers of a profile row (`expert_bias_bytes`: forward, backward)."""
    first, second = values
    return float(first), float(second)


def _overhead(name: str, value: float) -> float:
    if not 1.0 <= float(value) <= 2.0:
        raise ValueError(f"frameworks.yaml: {name}.allocator_overhead: {value!r} (valid: 1 to 2)")
    return float(value)


@functools.cache
def profiles() -> dict[str, FrameworkProfile]:
    data = yaml.safe_load(resources.files("autoshard.data").joinpath("frameworks.yaml").read_text())
    out = {}
    for name, row in data["frameworks"].items():
        out[name] = FrameworkProfile(
            name=name, weight_bytes=float(row["weight_bytes"]), grad_bytes=float(row["grad_bytes"]),
            master_bytes=float(row["master_bytes"]), adam_state_bytes=float(row["adam_state_bytes"]),
            grad_reduce_bytes=float(row["grad_reduce_bytes"]), zero_stages=tuple(row["zero_stages"]),
            schedules=tuple(row["schedules"]), tp_comm_overlap=bool(row["tp_comm_overlap"]),
            ep_overlap=bool(row["ep_overlap"]), moe_folding=bool(row["moe_folding"]),
            uneven_stages=bool(row["uneven_stages"]), source=" ".join(str(row["source"]).split()),
            moe_layer_host_s=float(row.get("moe_layer_host_ms", 0.0)) / 1e3,
            moe_expert_host_s=float(row.get("moe_expert_host_ms", 0.0)) / 1e3,
            ep_overlap_host_factor=float(row.get("ep_overlap_host_factor", 0.0)),
            ep_overlap_excludes_recompute=tuple(row.get("ep_overlap_excludes_recompute", ())),
            expert_bias_bytes=_pair(row.get("expert_bias_bytes", (0.0, 0.0))),
            attention_kernel_factor=float(row.get("attention_kernel_factor", 1.0)),
            attention_backward_rate=float(row.get("attention_backward_rate", CUDNN_ATTENTION_BACKWARD_RATE)),
            recompute_module_host_s=float(row.get("recompute_module_host_ms", 0.0)) / 1e3,
            fsdp_block_host_s=float(row.get("fsdp_block_host_ms", 0.0)) / 1e3,
            fsdp_outer_host_s_per_param=float(row.get("fsdp_outer_host_ms_per_billion_params", 0.0)) / 1e12,
            loss_logit_bytes=float(row.get("loss_logit_bytes", 6.0)),
            unfused_gated_activation=bool(row.get("unfused_gated_activation", False)),
            grads_freed_between_steps=bool(row.get("grads_freed_between_steps", False)),
            compiled_with_tp_overlap=bool(row.get("compiled_with_tp_overlap", False)),
            cuda_graphs=bool(row.get("cuda_graphs", False)),
            eager_launches=bool(row.get("eager_launches", True)),
            cublas_workspaces=tuple(row.get("cublas_workspaces", ["pytorch"])),
            tp_overlap_cublas_workspaces=tuple(row.get("tp_overlap_cublas_workspaces") or ()),
            dummy_wgrads=bool(row.get("dummy_wgrads", False)),
            grad_reduce_overlap=bool(row.get("grad_reduce_overlap", True)),
            pipeline_grad_reduce_overlap=bool(row.get("pipeline_grad_reduce_overlap", True)),
            param_gather_overlap=bool(row.get("param_gather_overlap", True)),
            dp_overlap_flags=_choices(name, "dp_overlap_flags", row.get("dp_overlap_flags") or (),
                                      ("grad_reduce", "param_gather")),
            reshard_after_forward=_choices(name, "reshard_after_forward", row.get("reshard_after_forward") or ["always"],
                                           ("always", "never", "group")),
            pipeline_reshard_after_forward=str(row.get("pipeline_reshard_after_forward", "")),
            pipeline_zero3_step_sync=bool(row.get("pipeline_zero3_step_sync", False)),
            replicate_zero_stages=tuple(int(z) for z in row.get("replicate_zero_stages") or ()),
            moe_dispatchers=_dispatchers(name, row.get("moe_dispatchers", ["alltoall"])),
            moe_token_drop=bool(row.get("moe_token_drop", False)),
            quantized_saved_inputs=bool(row.get("quantized_saved_inputs", False)),
            quantized_tp_gather=tuple((str(k), _choices(name, "quantized_tp_gather", [str(v)], ("forward", "both"))[0])
                                      for k, v in (row.get("quantized_tp_gather") or {}).items()),
            quantized_expert_act_inputs=bool(row.get("quantized_expert_act_inputs", False)),
            low_precision_dispatch=bool(row.get("low_precision_dispatch", False)),
            moe_dispatch_stages=bool(row.get("moe_dispatch_stages", False)),
            ep_comm_sms=int(row.get("ep_comm_sms", 0)),
            fp8_params=bool(row.get("fp8_params", False)),
            output_layer_knobs=bool(row.get("output_layer_knobs", False)),
            fp8_weight_cache=bool(row.get("fp8_weight_cache", True)),
            quant_hbm_bytes_per_element=tuple((str(k), float(v)) for k, v in
                                              (row.get("quant_hbm_bytes_per_element") or {}).items()),
            cp_comm_types=(tuple(row["cp_comm_types"]) if row.get("cp_comm_types") else None),
            cp_excludes_sp=bool(row.get("cp_excludes_sp", False)),
            window_cp_comm_types=(tuple(row["window_cp_comm_types"]) if row.get("window_cp_comm_types") else None),
            cp_ring_hbm_bytes=_ring_bytes(name, row.get("cp_ring_hbm_bytes") or {}),
            cp_grad_exchange_bytes=float(row.get("cp_grad_exchange_bytes", 2.0)),
            cp_kv_rotate=_choices(name, "cp_kv_rotate", [row.get("cp_kv_rotate", "p2p")], ("p2p", "allgather"))[0],
            recompute_layout=_layout(name, row.get("recompute_layout", "per_layer")),
            selective_recompute=_selective(name, row.get("selective_recompute", "core_attention")),
            sequence_dim_collectives=bool(row.get("sequence_dim_collectives", False)),
            fused_projections=bool(row.get("fused_projections", True)),
            planned_recompute_modules=tuple(row.get("planned_recompute_modules") or ()),
            unplanned_schedules=tuple(row.get("unplanned_schedules") or ()),
            placements=tuple(row.get("placements") or ()),
            pipeline_zero_stages=tuple(row.get("pipeline_zero_stages") or ()),
            pipeline_zero_source=str(row.get("pipeline_zero_source") or ""),
            allocator_overhead=_overhead(name, row.get("allocator_overhead", 1.0)),
            optimizer_offload_zero_stages=tuple(int(z) for z in row.get("optimizer_offload_zero_stages") or ()),
            optimizer_offload_name=str(row.get("optimizer_offload_name", "")),
            main_grads=tuple((str(k), float(v[0]), float(v[1]), float(v[2]) if len(v) > 2 else 0.0)
                             for k, v in (row.get("main_grads") or {}).items()))
    return out


@functools.cache
def get_framework(name: str, main_grads: str | None = None) -> FrameworkProfile:
    """The profile of `name`, with its gradients kept and reduced in `main_grads` where asked."""
    return profiles()[name].with_main_grads(main_grads)

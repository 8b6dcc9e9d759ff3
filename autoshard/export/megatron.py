"""Megatron-LM core_r0.16 `pretrain_gpt.py` flags and environment."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from typing import Any

from ..errors import InputError
from ..spec import Plan
from .common import _recompute_counts
from .context import _Ctx
from .model_facts import _recipe_settings, gpu_arch, hierarchical_cp_sizes, model_family
from ..catalog import get_recipe, low_precision_fraction
from ..layouts import megatron_reason, megatron_recompute
from ..spec import RECOMPUTE_MODULES


def megatron_layout(stages: list[int], mtp_layers: int = 0) -> str:
    """`--pipeline-model-parallel-layout` string: virtual stages (in layer order, which is
    Megatron's `vpp_rank * pp + pp_rank` order) separated by `|`, `E` = embedding on the
    first, `L` = loss on the last, `t*n` = n transformer layers, `m` = an MTP layer (last stage)."""
    parts = []
    for i, n in enumerate(stages):
        body = "t" if n == 1 else (f"t*{n}" if n > 1 else "")
        last = i == len(stages) - 1
        parts.append(("E" if i == 0 else "") + body + ("m" * mtp_layers if last else "") + ("L" if last else ""))
    return "|".join(parts)


def megatron_order(plan: Plan) -> str | None:
    """The Megatron rank order (`initialize_model_parallel(order=...)`) that realizes the plan's
    placement, or None when Megatron has none: it offers tp-cp-ep-dp-pp (default) and, with
    --use-tp-pp-dp-mapping, tp-cp-ep-pp-dp (size-1 axes do not matter)."""
    sizes = {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "dp": plan.dp or 1, "pp": plan.pp}
    live = [a for a in plan.axes if sizes[a] > 1 or (a == "ep" and plan.ep > 1)]
    for order in ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"):
        want = [a for a in order.split("-") if a in live]
        if want == live:
            return order
    return None


def _pp_stride(plan: Plan, dp: int) -> int:
    """Rank distance of pipeline neighbours in the plan's placement (the axes inside pp)."""
    sizes = {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "dp": max(1, dp // plan.ep), "pp": plan.pp}
    return math.prod(sizes[a] for a in plan.axes[:plan.axes.index("pp")])


def megatron_env(ctx: _Ctx) -> dict[str, str]:
    """Environment variables the Megatron launch needs (arguments.py validate_args, d98e8a64dd):
    TP or CP on pre-Blackwell GPUs asserts CUDA_DEVICE_MAX_CONNECTIONS=1 unless Megatron-FSDP or
    --overlap-moe-expert-parallel-comm is on; Megatron-FSDP asserts it is not 1."""
    p = ctx.plan
    if p.zero_stage >= 2:
        return {}
    if (p.tp > 1 or p.cp > 1) and not ctx.ep_overlap and not gpu_arch(ctx.problem).startswith("blackwell"):
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


Add = Callable[..., None]  # add(flag, value=None): one flag of the command line, in order


def _megatron(ctx: _Ctx) -> str:
    """`pretrain_gpt.py` flags, one part per technique (as torchtitan's parallelize_llama applies one
    `apply_*` per technique), after a header of comments: the plan, the derived sizes, what the launch
    needs and every warning the parts raised."""
    fam = model_family(ctx.model) or {}
    flags: list[tuple[str, Any]] = []

    def add(flag: str, value: Any = None) -> None:
        flags.append((flag, value))

    etp, edp = _parallelism_flags(ctx, add)
    _overlap_flags(ctx, add)
    _schedule_flags(ctx, add)
    _batch_flags(ctx, add)
    _data_parallel_flags(ctx, add)
    _cuda_graph_flags(ctx, add)
    _low_precision_weight_flags(ctx, add)
    _memory_knob_flags(ctx, add, fam)
    _megatron_recompute(ctx, add)
    _precision_flags(ctx, add)
    _model_shape_flags(ctx, add, fam)
    _moe_flags(ctx, add, fam)
    _mla_mtp_flags(ctx, add)
    return "\n".join(_megatron_header(ctx, fam, etp, edp) + _flag_lines(flags)) + "\n"


def _parallelism_flags(ctx: _Ctx, add: Add) -> tuple[int, int]:
    """TP / PP / CP (and hierarchical CP) / EP / ETP degrees, sequence parallelism and the rank order;
    returns (etp, the expert data-parallel size) for the header."""
    p, m = ctx.plan, ctx.model
    add("--tensor-model-parallel-size", p.tp)
    add("--pipeline-model-parallel-size", p.pp)
    add("--context-parallel-size", p.cp)
    if p.cp > 1 and p.cp_comm_type != "p2p":
        add("--cp-comm-type", p.cp_comm_type)
        if p.cp_comm_type == "a2a+p2p":  # nargs='+': the a2a group inside an NVLink domain, then the ring
            add("--hierarchical-context-parallel-sizes", list(hierarchical_cp_sizes(ctx.problem, p, ctx.dp)))
    etp = p.expert_tp
    if m.is_moe:
        add("--expert-model-parallel-size", p.ep)
        add("--expert-tensor-parallel-size", etp)
    elif p.ep > 1:
        ctx.warn(f"ep={p.ep} ignored: {m.name} is a dense model")
    if p.sp and p.tp > 1:
        add("--sequence-parallel")
    order = megatron_order(p)
    # Megatron always builds the expert grid etp x ep x edp x pp (dense models: tp x 1 x tp*cp*dp/tp).
    m_etp, m_ep = (etp, p.ep) if m.is_moe else (p.tp, 1)
    edp = ctx.world // (m_etp * m_ep * p.pp)
    if order == "tp-cp-ep-pp-dp" and p.pp > 1:
        if edp != ctx.dp:
            # initialize_model_parallel: "When not using pp-last rank ordering, the data parallel size of
            # the attention and moe layers must be the same" (parallel_state.py, core_v0.16.1).
            ctx.warn(f"placement {p.placement} needs --use-tp-pp-dp-mapping, which Megatron rejects when the "
                     f"attention and expert data-parallel sizes differ ({ctx.dp} vs {edp}, with cp or ep > 1): "
                     "exported with the default order tp-cp-ep-dp-pp, so pipeline neighbours are "
                     f"{p.tp * p.cp * ctx.dp} ranks apart instead of {_pp_stride(p, ctx.dp)} and data-parallel "
                     "groups are contiguous (PP and DP traffic swap network levels)")
        else:
            add("--use-tp-pp-dp-mapping")
    elif order is None:
        ctx.warn(f"placement {p.placement} is not expressible: Megatron orders ranks tp-cp-ep-dp-pp "
                 "(or tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping); the default order is used, so groups "
                 "land on other network levels than planned")
    if m.is_moe and p.ep > 1 and p.cp > 1 and etp == p.tp and ctx.dp % p.ep == 0:
        ctx.warn(f"expert groups differ from the plan: Megatron lays experts out as etp x ep x edp over the "
                 f"stage's ranks, so each ep={p.ep} group spans ranks {etp} apart (across the CP ranks), "
                 f"while the plan carved EP out of DP ({p.tp * p.cp} apart); the all-to-all crosses the "
                 "network levels of TP x CP neighbours instead")
    return etp, edp


def _overlap_flags(ctx: _Ctx, add: Add) -> None:
    """Communication overlaps the plan was priced with: TP comm overlap, the EP all-to-all overlap."""
    if ctx.tp_overlap:
        add("--tp-comm-overlap")
    if ctx.ep_overlap:
        add("--overlap-moe-expert-parallel-comm")
        add("--delay-wgrad-compute")


def _schedule_flags(ctx: _Ctx, add: Add) -> None:
    """The pipeline split (even, first/last lighter, or an explicit layout; virtual stages) and the
    schedule."""
    p, m = ctx.plan, ctx.model
    if p.pp > 1:
        stages = ctx.stages
        if m.hybrid_override_pattern is not None:  # the stage boundaries are `|` in --hybrid-layer-pattern
            if p.vpp > 1:
                add("--num-virtual-stages-per-pipeline-rank", p.vpp)
        elif p.vpp > 1:
            if ctx.even:
                add("--num-layers-per-virtual-pipeline-stage", stages[0])
            else:
                add("--pipeline-model-parallel-layout", megatron_layout(stages, ctx.mtp_layers))
        elif not ctx.even:
            middle = stages[1:-1]
            if (stages[0] > 0 and stages[-1] > 0 and len(set(middle)) <= 1
                    and (not middle or middle[0] > 0)):
                add("--decoder-first-pipeline-num-layers", stages[0])
                add("--decoder-last-pipeline-num-layers", stages[-1])
            else:
                add("--pipeline-model-parallel-layout", megatron_layout(stages, ctx.mtp_layers))
        if p.schedule == "gpipe":
            ctx.warn("schedule gpipe is not offered by Megatron-LM: it runs 1F1B (less activation memory, "
                     "same bubble)")
        elif p.schedule == "zero_bubble":
            ctx.warn("schedule zero_bubble is not in Megatron-LM's mainline flags: exported as "
                     + ("interleaved 1F1B" if p.vpp > 1 else "1F1B") + " (larger bubble than planned)")


def _batch_flags(ctx: _Ctx, add: Add) -> None:
    """Micro-batch, global batch and sequence length."""
    p, t = ctx.plan, ctx.training
    add("--micro-batch-size", p.micro_batch_size)
    add("--global-batch-size", t.global_batch_size)
    add("--seq-length", t.seq_len)
    # the learned position table as priced (ModelSpec.learned_position_embeddings); Megatron requires
    # --max-position-embeddings >= --seq-length whatever the position embedding
    add("--max-position-embeddings", max(t.seq_len, ctx.model.learned_position_embeddings))


def _data_parallel_flags(ctx: _Ctx, add: Add) -> None:
    """Data parallelism: ZeRO (distributed optimizer, Megatron-FSDP), replicas, gradient / parameter
    overlaps, optimizer offload."""
    p = ctx.plan
    if p.zero_stage == 1:
        add("--use-distributed-optimizer")
    if p.zero_stage >= 2:
        add("--use-megatron-fsdp")
        add("--data-parallel-sharding-strategy", "optim_grads" if p.zero_stage == 2 else "optim_grads_params")
        add("--ckpt-format", "fsdp_dtensor")  # validate_args: Megatron-FSDP requires it
        # (with TP/CP Megatron itself warns that FSDP wants CUDA_DEVICE_MAX_CONNECTIONS unset)
    if p.dp_replicate > 1:  # the states sharded over dp x cp / N ranks, N copies (Megatron-FSDP: HSDP)
        add("--num-distributed-optimizer-instances", p.dp_replicate)
    if p.overlap_grad_reduce:
        add("--overlap-grad-reduce")
    if p.zero_stage >= 1 and p.overlap_param_gather:
        add("--overlap-param-gather")
    if p.optimizer_offload:  # Megatron-Core HybridDeviceOptimizer: the whole optimizer on the CPU
        add("--optimizer-cpu-offload")
        add("--optimizer-offload-fraction", 1.0)
        add("--use-precision-aware-optimizer")  # validate_args requires it with --optimizer-cpu-offload
        add("--overlap-cpu-optimizer-d2h-h2d")


def _cuda_graph_flags(ctx: _Ctx, add: Add) -> None:
    """Full-iteration or per-layer CUDA graphs."""
    p, m, t = ctx.plan, ctx.model, ctx.training
    if p.cuda_graph_scope:  # per-layer graphs (Transformer Engine make_graphed_callables)
        add("--cuda-graph-impl", "transformer_engine")
        if p.cuda_graph_scope != ["layer"]:  # no scope = the whole layer
            # megatron-core <= 0.16 spells it --cuda-graph-scope (nargs='+'); Megatron-LM d98e8a64dd keeps
            # that spelling as a hidden alias of --cuda-graph-modules (arguments.py)
            add("--cuda-graph-scope", list(p.cuda_graph_scope))
        # validate_args (d98e8a64dd) turns on --te-rng-tracker itself and asserts against
        # expandable_segments without NCCL_GRAPH_REGISTER=0
        ctx.warn("per-layer CUDA graphs: with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True also set "
                 "NCCL_GRAPH_REGISTER=0 (Megatron's validate_args asserts it); the graphs' static buffers are "
                 "not in the planned memory")
    if p.cuda_graphs:  # the whole step captured once and replayed
        # megatron-core <= 0.16 spells it impl local + scope full_iteration; Megatron-LM d98e8a64dd
        # migrates that spelling to --cuda-graph-impl full_iteration (validate_args, cuda_graph_config.py)
        add("--cuda-graph-impl", "local")
        add("--cuda-graph-scope", "full_iteration")
        add("--no-check-for-nan-in-loss-and-grad")  # validate_args asks for it with full_iteration graphs
        if m.is_moe and t.moe_capacity_factor is None:  # drop-and-pad is sync-free already
            need = "paged stashing" if p.moe_dispatcher == "hybridep" else \
                "--moe-token-dispatcher-type flex with the HybridEP backend and paged stashing"
            ctx.warn(f"full-iteration CUDA graphs with dropless MoE need a sync-free dispatcher: set {need} "
                     "(Megatron-Bridge _enable_hybridep_full_iteration_mxfp8); not written by this exporter")


def _low_precision_weight_flags(ctx: _Ctx, add: Add) -> None:
    """bf16 gradient reduction and FP8 / FP4 primary weights (all-gathered in that precision)."""
    t = ctx.training
    if t.main_grads == "bf16":  # main_grad buffers and the gradient reduction in bf16
        add("--grad-reduce-in-bf16")
    if t.fp8_params:  # FP8 / FP4 primary weights, all-gathered in that precision

        if get_recipe(t.precision).gemm_dtype == "fp4":
            add("--fp4-param-gather")
            ctx.warn("--fp4-param-gather needs Megatron-LM with DistributedDataParallelConfig.fp4_param_gather "
                     "(d98e8a64dd; megatron-core 0.16.1 has only fp8_param_gather)")
        else:
            add("--fp8-param-gather")


def _memory_knob_flags(ctx: _Ctx, add: Add, fam: dict[str, Any]) -> None:
    """The memory knobs the plan was priced with: q/k norms, the data loader's attention masks, the fused
    cross entropy and the deferred output-layer wgrad."""
    m, t = ctx.model, ctx.training
    if m.qk_layernorm and ("--qk-layernorm", None) not in fam.get("megatron", []):  # its saved q / k norms are priced
        add("--qk-layernorm")
    if not t.attention_mask_in_batch:  # priced without the data loader's [b, 1, s, s] masks
        add("--no-create-attention-mask-in-dataloader")
    if t.cross_entropy_fusion:  # the torch.compile'd vocab-parallel cross entropy (priced: +4 B per logit)
        add("--cross-entropy-loss-fusion")
    if not t.gradient_accumulation_fusion:  # priced without Transformer Engine's dummy weight gradients
        add("--no-gradient-accumulation-fusion")
    if t.defer_embedding_wgrad:  # the output layer's wgrad at the step's end (its gradients kept until then)
        add("--defer-embedding-wgrad-compute")
        if t.wgrad_deferral_limit:
            add("--wgrad-deferral-limit", str(t.wgrad_deferral_limit))

def _precision_flags(ctx: _Ctx, add: Add) -> None:
    """The training precision: --bf16 / --fp16 and the low-precision recipe, and the layers kept in BF16."""
    t = ctx.training
    add("--fp16" if t.precision == "fp16" else "--bf16")
    recipe = _recipe_settings(t.precision)
    if recipe:
        for flag, value in recipe["megatron"]:
            add(flag, value)
        if recipe.get("megatron_note"):
            ctx.warn(f"precision {t.precision}: {recipe['megatron_note']}")
    else:
        ctx.warn(f"precision {t.precision} has no Megatron recipe in this exporter: trains in bf16")
    _megatron_bf16_parts(ctx, add)


def _model_shape_flags(ctx: _Ctx, add: Add, fam: dict[str, Any]) -> None:
    """The model's shape and architecture: layers, widths, attention (GQA, windows), activation, norm,
    RoPE, dropout."""
    m = ctx.model
    add("--num-layers", m.num_hidden_layers)
    add("--hidden-size", m.hidden_size)
    add("--ffn-hidden-size", m.intermediate_size)
    add("--num-attention-heads", m.num_attention_heads)
    if not m.is_mla:
        if m.kv_heads != m.num_attention_heads:
            add("--group-query-attention")
            add("--num-query-groups", m.kv_heads)
        if m.head_dim:
            add("--kv-channels", m.head_dim)
    if m.sliding_window:  # TE window (left, right): the last W keys including the query's own
        add("--window-size", f"{m.sliding_window - 1},0")
        if m.sliding_window_layers < 1:  # one full-attention layer after every N - 1 windowed ones
            freq = round(1 / (1 - m.sliding_window_layers))
            if abs(1 / freq - (1 - m.sliding_window_layers)) > 1e-6:
                ctx.warn(f"{m.sliding_window_layers:.3f} of the layers windowed is no 1-in-N pattern: "
                         f"--window-attn-skip-freq {freq} is the nearest")
            add("--window-attn-skip-freq", freq)
    add("--vocab-size", m.vocab_size)
    if not m.tie_word_embeddings:
        add("--untie-embeddings-and-output-weights")
    # RoPE unless the model has the learned position table it was priced with (Megatron's default
    # --position-embedding-type learned_absolute, ModelSpec.learned_position_embeddings)
    rope = not m.learned_position_embeddings
    if m.gated:  # Llama-family: SwiGLU, RMSNorm, RoPE, no linear biases
        add("--swiglu")
        add("--normalization", "RMSNorm")
        if rope:
            add("--position-embedding-type", "rope")
        add("--disable-bias-linear")
    else:
        if rope:
            add("--position-embedding-type", "rope")
        if m.hidden_act == "relu2":  # squared ReLU, non-gated (Nemotron-4, Nemotron-H)
            add("--squared-relu")
        elif m.hidden_act == "relu":
            ctx.warn(f"hidden_act {m.hidden_act} has no flag in the exported set: Megatron defaults to GeLU")
    _megatron_hybrid(ctx, add)
    _megatron_attention_span(ctx, add)
    if fam.get("norm_epsilon") is not None:
        add("--norm-epsilon", fam["norm_epsilon"])
    if m.gated:
        rotary = m.rope_theta or fam.get("rotary_base")  # the config's rope_theta first
        if rotary:
            add("--rotary-base", int(rotary) if float(rotary).is_integer() else rotary)
        else:
            ctx.warn(f"rotary base of {m.name} unknown: Megatron's default --rotary-base 10000 is used; "
                     "set it to the model's rope_theta")
    if not m.dropout:  # the plan prices no dropout masks; Megatron defaults to 0.1
        add("--attention-dropout", 0.0)
        add("--hidden-dropout", 0.0)


def _moe_flags(ctx: _Ctx, add: Add, fam: dict[str, Any]) -> None:
    """Mixture of experts: experts, router top-k, widths, dense layers, the dispatcher, capacity; the
    family's own flags."""
    p, m, t = ctx.plan, ctx.model, ctx.training
    fam_flags = dict(fam.get("megatron", []))
    if m.is_moe:
        add("--num-experts", m.num_experts)
        add("--moe-router-topk", m.num_experts_per_tok)
        add("--moe-ffn-hidden-size", m.expert_ffn)
        if m.shared_ffn:  # the shared experts' total width (TransformerConfig moe_shared_expert_intermediate_size)
            add("--moe-shared-expert-intermediate-size", m.shared_ffn)
        if m.num_dense_layers:
            add("--moe-layer-freq", f"[0]*{m.num_dense_layers}+[1]*{m.num_moe_layers}")
        dispatcher = p.moe_dispatcher or "alltoall"
        if dispatcher in ("alltoall", "allgather"):
            add("--moe-token-dispatcher-type", dispatcher)
        else:  # the flex dispatcher with the DeepEP / HybridEP kernels (transformer_config.py, d98e8a64dd)
            add("--moe-token-dispatcher-type", "flex")
            add("--moe-flex-dispatcher-backend", dispatcher)
        add("--moe-grouped-gemm")
        if t.moe_capacity_factor is not None:  # drop above the capacity, pad up to it (no D2H sync)
            add("--moe-expert-capacity-factor", t.moe_capacity_factor)
            add("--moe-pad-expert-input-to-capacity")
        if not any(f.startswith("--moe-router-load-balancing-type") for f in fam_flags):
            ctx.warn(f"router settings of {m.name} unknown: Megatron's defaults are used (softmax top-k, "
                     "aux_loss coefficient 0); set --moe-aux-loss-coeff to the model's router_aux_loss_coef")
    for flag, value in fam.get("megatron", []):
        if flag.startswith(("--moe-", "--mtp-")) and not m.is_moe:
            continue
        if flag in ("--rotary-scaling-factor", "--mscale", "--mscale-all-dim") and not m.is_mla:
            continue
        if flag.startswith("--mtp-") and not ctx.mtp_layers:
            continue
        add(flag, value)


def _mla_mtp_flags(ctx: _Ctx, add: Add) -> None:
    """Multi-head latent attention and multi-token prediction."""
    m = ctx.model
    if m.is_mla:
        add("--multi-latent-attention")
        if m.q_lora_rank is not None:
            add("--q-lora-rank", m.q_lora_rank)
        add("--kv-lora-rank", m.kv_lora_rank)
        add("--qk-head-dim", m.qk_nope_head_dim)
        add("--qk-pos-emb-head-dim", m.qk_rope_head_dim)
        add("--v-head-dim", m.v_head_dim)
    if ctx.mtp_layers:  # multi-token prediction (TransformerConfig.mtp_num_layers), priced on the last stage
        add("--mtp-num-layers", ctx.mtp_layers)
        if ctx.ep_overlap and ctx.mtp_layers > 1:  # TransformerConfig.__post_init__ asserts it
            ctx.warn("Megatron's EP overlap supports at most one MTP layer (TransformerConfig: 'MTP supports at "
                     "most one layer when enabling overlap_moe_expert_parallel_comm'): drop one or the other")


def _megatron_header(ctx: _Ctx, fam: dict[str, Any], etp: int, edp: int) -> list[str]:
    """The comment lines above the flags: the plan, derived sizes, required versions and kernels, the
    environment, the warnings."""
    p, m, t = ctx.plan, ctx.model, ctx.training
    head = [f"# {line}" for line in ctx.header()]
    head.append(f"# data-parallel size is derived by Megatron: {ctx.world} // (TP*PP*CP = "
                f"{p.tp * p.pp * p.cp}) = {ctx.dp}; {ctx.microbatches} micro-batches per step")
    if m.is_moe:
        head.append(f"# expert grid (MoE parallel folding): etp {etp} x ep {p.ep} x edp {edp} x pp {p.pp}")
    if fam:
        head.append(f"# architecture facts ({fam['family']}): {fam['source']}")
    te = []  # Transformer Engine versions Megatron-LM's validate_args asks for (arguments.py, d98e8a64dd)
    if ctx.ep_overlap:
        te.append("2.8 (--delay-wgrad-compute with --overlap-grad-reduce)")
    if str(t.precision) == "nvfp4":
        te.append("2.7 (--fp4-format, NVFP4BlockScaling)")
    if te:
        head.append("# requires Transformer Engine >= " + "; >= ".join(te))
    if m.is_moe and p.moe_dispatcher in ("deepep", "hybridep"):
        head.append(f"# requires the {'DeepEP' if p.moe_dispatcher == 'deepep' else 'HybridEP'} kernels "
                    "(github.com/deepseek-ai/DeepEP; HybridEP is its hybrid-ep branch) for the flex dispatcher; "
                    "without them plan with `search: {moe_dispatcher: alltoall}`")
    env = megatron_env(ctx)
    for k, v in env.items():
        head.append(f"# launch with: export {k}={v}   (Megatron asserts it for TP/CP on pre-Blackwell GPUs)")
    for w in ctx.warnings:
        head.append(f"# warning: {w}")
    return head


def _flag_lines(flags: list[tuple[str, Any]]) -> list[str]:
    """One flag per line, continued with ` \\`; an nargs='+' value as several words."""
    body = []
    for i, (flag, value) in enumerate(flags):
        if value is None:
            line = flag
        elif isinstance(value, list):  # an nargs='+' flag
            line = " ".join([flag, *(shlex.quote(str(v)) for v in value)])
        else:
            line = f"{flag} {shlex.quote(str(value))}"
        body.append(line + (" \\" if i < len(flags) - 1 else ""))
    return body


def hybrid_layer_pattern(pattern: str, stages: list[int] | None) -> str:
    """Megatron's --hybrid-layer-pattern: the model's blocks (M Mamba2, * attention, - MLP, E MoE), with
    `|` at the (virtual) pipeline stage boundaries where the plan has several (arguments.py: 'Use | to
    define pipeline stage boundaries')."""
    if not stages or len(stages) == 1:
        return pattern
    out, i = [], 0
    for n in stages:
        out.append(pattern[i:i + n])
        i += n
    return "|".join(out)


def _megatron_hybrid(ctx: _Ctx, add: Add) -> None:
    """A hybrid Mamba2 / attention model (ModelSpec.hybrid_override_pattern): Megatron-LM's hybrid
    stack (pretrain_mamba.py), its block pattern and Mamba2 dimensions (TransformerConfig
    mamba_state_dim, mamba_head_dim, mamba_num_groups, mamba_num_heads)."""
    m, p = ctx.problem.model, ctx.plan
    if m.hybrid_override_pattern is None:
        return
    add("--hybrid-layer-pattern", hybrid_layer_pattern(m.hybrid_override_pattern, ctx.stages if p.pp > 1 else None))
    if m.num_mamba_layers:
        add("--mamba-num-heads", m.mamba_heads)
        add("--mamba-head-dim", m.mamba_head_dim)
        add("--mamba-state-dim", m.ssm_state_size)
        add("--mamba-num-groups", m.mamba_n_groups)
    ctx.warn("hybrid Mamba2 / attention model: launch Megatron-LM's pretrain_mamba.py (its hybrid stack), not "
             "pretrain_gpt.py; the pattern's `|` marks the planned stage boundaries")


def _megatron_attention_span(ctx: _Ctx, add: Add) -> None:
    """Packed documents (`training.mean_document_tokens`): --dataloader-inter-document-masking (the
    dataloader returns cu_seqlens, attention restricted to each document: THD). Llama 4's NoPE layers:
    --no-rope-freq N (TransformerConfig.no_rope_freq, one NoPE layer in N); its chunked attention has no
    Megatron flag."""
    m, t = ctx.problem.model, ctx.problem.training
    if t.mean_document_tokens and t.mean_document_tokens < t.seq_len:
        add("--dataloader-inter-document-masking")
    if m.attention_chunk_size:
        nope = 1.0 - m.chunked_attention_layers
        every = round(1 / nope) if nope > 0 else 0
        if every > 1 and abs(1 / every - nope) < 1e-6 and m.num_hidden_layers % every == 0:
            add("--no-rope-freq", every)
        ctx.warn(f"chunked attention ({m.attention_chunk_size} tokens on {m.chunked_attention_layers:.3g} of the "
                 "layers) has no Megatron-LM flag: those layers attend globally there (slower than planned)")


def _megatron_bf16_parts(ctx: _Ctx, add: Add) -> None:
    """Per-module precision: whole blocks kept in BF16 (TransformerConfig first_last_layers_bf16 with
    num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16, each 1 by default when the flag is on, so
    both are written; fp8_utils.is_first_last_bf16_layer); module classes in BF16 have no flag."""
    t = ctx.problem.training
    if not low_precision_fraction(t.precision):
        return
    if t.bf16_layers_at_start or t.bf16_layers_at_end:
        if get_recipe(t.precision).id == "fp8-delayed":  # TransformerConfig.__post_init__ refuses it
            ctx.warn("Megatron refuses --first-last-layers-bf16 with delayed scaling: use fp8-current")
        add("--first-last-layers-bf16")
        add("--num-layers-at-start-in-bf16", t.bf16_layers_at_start)
        add("--num-layers-at-end-in-bf16", t.bf16_layers_at_end)
    if t.bf16_modules:
        ctx.warn(f"{', '.join(t.bf16_modules)} planned in BF16: Megatron-LM has no flag for a module class's "
                 "precision (a --fp8-recipe custom quantizer factory can keep them in BF16); exported as the "
                 "recipe everywhere, which runs them in low precision")


def _megatron_recompute(ctx: _Ctx, add: Add) -> None:
    """The recompute / offload flags that run exactly the planned per-layer list
    (`layouts.megatron_recompute`, the predicate evaluate and the solver use), or InputError
    (exit 2) naming why Megatron cannot run it: a plan is never exported as something else."""
    split, pp = list(ctx.stages), ctx.plan.pp
    rc = megatron_recompute(split, ctx.recompute, pp)
    if rc is None:
        mix = ", ".join(f"{k}:{v}" for k, v in _recompute_counts(ctx).items())
        raise InputError(f"plan cannot be exported to Megatron-LM: recompute per layer ({mix}) "
                         f"{megatron_reason(split, ctx.recompute, pp)}; Megatron would run another plan than the "
                         "one priced. Solve with `framework: megatron` (it plans only lists Megatron runs) or "
                         "give one mode for every layer or full recompute on the first K layers of every "
                         "virtual stage", field="plan.recompute")
    if rc.offload_layers:  # TE offloads the activations of the first N layers (TransformerConfig)
        # (--cpu-offloading is no flag: arguments.py validate_args turns it on for N > 0, core_v0.16.1 and
        # d98e8a64dd; the field is in its list of config fields without a CLI argument)
        add("--cpu-offloading-num-layers", rc.offload_layers)
    if rc.granularity is None:
        return
    add("--recompute-granularity", rc.granularity)
    if rc.granularity == "selective":
        if "mlp_up" in rc.modules:
            raise InputError("plan cannot be exported to Megatron-LM: recompute module mlp_up (the MLP's fc1 "
                             "without fc2, as JAX remat runs it) is no --recompute-modules choice; use mlp",
                             field="plan.recompute")
        if rc.modules != ("core_attn",):  # Megatron's default module list is [core_attn]
            add("--recompute-modules", sorted(rc.modules, key=RECOMPUTE_MODULES.index))  # nargs='*', one line
        return
    add("--recompute-method", rc.method)
    add("--recompute-num-layers", rc.num_layers)

"""A DeepSpeed 0.19 JSON config plus the Megatron-DeepSpeed flags for TP/PP."""

from __future__ import annotations

from typing import Any

from .common import _most_conservative, _recompute_counts, dumps_json, recompute_runs
from .context import TARGETS, _Ctx, autoshard_version


def megatron_deepspeed_args(ctx: _Ctx) -> list[str]:
    """microsoft/Megatron-DeepSpeed flags for what DeepSpeed's JSON cannot carry (TP, PP, EP,
    recompute) next to `--deepspeed --deepspeed_config <this file>`."""
    p, m, t = ctx.plan, ctx.model, ctx.training
    args = ["--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp)]
    if p.pp == 1:
        args.append("--no-pipeline-parallel")
    if m.is_moe:
        args += ["--num-experts", str(m.num_experts), "--moe-expert-parallel-size", str(p.ep)]
    if p.sp and p.tp > 1:
        args.append("--sequence-parallel")
    if p.cp > 1:  # DeepSpeed-Ulysses: heads scattered over the sequence-parallel group by all-to-all
        args += ["--ds-sequence-parallel-size", str(p.cp)]
    args += ["--micro-batch-size", str(p.micro_batch_size), "--global-batch-size", str(t.global_batch_size),
             "--seq-length", str(t.seq_len), "--max-position-embeddings", str(t.seq_len),
             "--num-layers", str(m.num_hidden_layers), "--hidden-size", str(m.hidden_size),
             "--ffn-hidden-size", str(m.intermediate_size), "--num-attention-heads", str(m.num_attention_heads)]
    if m.kv_heads != m.num_attention_heads and not m.is_mla:
        args += ["--num-key-value-heads", str(m.kv_heads)]
    args += ["--zero-stage", str(p.zero_stage), "--bf16", "--deepspeed"]
    if "full" in ctx.recompute:
        args += ["--checkpoint-activations", "--checkpoint-num-layers", "1"]
    return args


def _autotp(ctx: _Ctx) -> bool:
    """DeepSpeed's AutoTP runs the plan's TP: tensor parallelism only (no PP, CP or MoE beside it)."""
    p = ctx.plan
    return p.tp > 1 and p.pp == 1 and p.cp == 1 and not ctx.model.is_moe


def _batch_note(ctx: _Ctx) -> str:
    """How deepspeed.initialize must be called so DeepSpeed counts the planned data-parallel ranks.
    DeepSpeed 0.19 (runtime/config.py DeepSpeedConfig.__init__) takes the data-parallel world size from
    mpu.get_data_parallel_world_size(), or without an mpu from dist.get_world_size(): every rank."""
    p, t = ctx.plan, ctx.training
    model_parallel = p.tp * p.pp * p.cp
    batch = (f"train_batch_size {t.global_batch_size} = micro {p.micro_batch_size} x GAS {ctx.microbatches} "
             f"x dp {ctx.dp}")
    if model_parallel == 1:
        return f"deepspeed.initialize(model=..., config=<this file>) as is: every rank is data-parallel; {batch}"
    if _autotp(ctx):
        return (f"AutoTP: deepspeed.utils.groups._init_tp_mesh_device(tensor_model_parallel_size={p.tp}) then "
                "deepspeed.initialize(model=..., config=<this file>, mpu=deepspeed.utils.groups), so DeepSpeed "
                f"counts dp = world // tp = {ctx.dp}; {batch}. Without the mpu DeepSpeed counts all "
                f"{ctx.world} ranks as data-parallel and its batch assertion stops the launch")
    return (f"TP/PP/CP ranks ({model_parallel} per replica) are not data-parallel: pass "
            "deepspeed.initialize(..., mpu=<your model-parallel unit>) (Megatron-DeepSpeed passes megatron.mpu; "
            "a PipelineModule brings its own) so DeepSpeed counts dp = mpu.get_data_parallel_world_size() = "
            f"{ctx.dp}; {batch}. Without one DeepSpeed counts all {ctx.world} ranks as data-parallel and its "
            "batch assertion stops the launch")


def _deepspeed(ctx: _Ctx) -> str:
    p, m, t = ctx.plan, ctx.model, ctx.training
    gas = ctx.microbatches
    cfg: dict[str, Any] = {}
    if p.cp > 1 and p.cp_comm_type != "a2a":
        ctx.warn(f"cp={p.cp} with cp_comm_type {p.cp_comm_type}: DeepSpeed splits the context with Ulysses "
                 "all-to-all only (--ds-sequence-parallel-size); the ring was not priced for it")
    if p.pp > 1 and p.vpp > 1:
        ctx.warn(f"interleaved pipeline (vpp={p.vpp}) is not expressible: DeepSpeed's PipelineModule holds "
                 f"one stage per rank (bubble {p.vpp}x the planned one)")
    if p.pp > 1 and p.schedule != "1f1b" and not (p.schedule == "interleaved" and p.vpp > 1):
        ctx.warn(f"schedule {p.schedule} is not expressible: DeepSpeed's pipeline engine runs its 1F1B-style "
                 "TrainSchedule")
    if p.pp > 1 and p.zero_stage >= 2:
        ctx.warn(f"DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only; zero_stage {p.zero_stage} "
                 "with pp > 1 will be rejected")
    if p.pp > 1 and not ctx.even:
        ctx.warn("uneven stage layers are not a config option: pass PipelineModule a partition "
                 "(autoshard.pipeline_module.stage_layers) in code")
    if m.is_moe and p.ep > 1:
        ctx.warn(f"expert parallelism is set in code: deepspeed.moe.layer.MoE(ep_size={p.ep}, "
                 f"num_experts={m.num_experts}, k={m.num_experts_per_tok}) or Megatron-DeepSpeed "
                 f"--moe-expert-parallel-size {p.ep}")
    if p.expert_tp != p.tp and m.is_moe:
        ctx.warn(f"etp={p.expert_tp}: DeepSpeed-MoE has no expert tensor parallelism distinct from TP")
    if p.tp > 1 and p.sp:
        ctx.warn("Megatron-style sequence parallelism is not a DeepSpeed config option (Megatron-DeepSpeed "
                 "--sequence-parallel)")
    if t.precision not in ("bf16", "fp16"):
        ctx.warn(f"{t.precision} is not a DeepSpeed config option (use Transformer Engine in the model); "
                 "exported as bf16")
    if ctx.tp_overlap:
        ctx.warn("TP communication overlap has no DeepSpeed option: TP all-gathers / reduce-scatters run exposed")

    # Recompute.
    kinds = set(ctx.recompute)
    ckpt: dict[str, Any] | None = None
    interval = 0
    if kinds != {"none"}:
        mode = _most_conservative(list(kinds))
        if ctx.mixed:
            mix = ", ".join(f"{k}:{v}" for k, v in _recompute_counts(ctx).items())
            ctx.warn(f"per-layer recompute mix ({mix}) is not expressible in DeepSpeed: "
                     + ("every layer is checkpointed (more recompute than planned)" if mode == "full" else
                        "no layer is checkpointed (selective recompute has no DeepSpeed equivalent)"))
        elif mode == "selective":
            ctx.warn("selective (attention-core) recompute has no DeepSpeed config option: not exported "
                     "(with FlashAttention nothing is lost)")
        if mode == "full":
            interval = 1
            ckpt = {"partition_activations": False, "cpu_checkpointing": False,
                    "contiguous_memory_optimization": False, "number_checkpoints": None,
                    "synchronize_checkpoint_boundary": False, "profile": False}

    cfg["autoshard"] = {
        "version": autoshard_version(),
        "target": TARGETS["deepspeed"],
        "plan": p.short(),
        "model": m.name,
        "world_size": ctx.world,
        "tp": p.tp, "pp": p.pp, "cp": p.cp, "dp": ctx.dp, "ep": p.ep, "etp": p.expert_tp, "vpp": p.vpp,
        "sequence_parallel": p.sp,
        "placement": p.placement,
        "global_batch_size": t.global_batch_size,
        "recompute": p.recompute if isinstance(p.recompute, str) else recompute_runs(ctx.recompute),
        "note": _batch_note(ctx),
        "megatron_deepspeed_args": megatron_deepspeed_args(ctx),
        "warnings": [],  # filled in last, once every warning is known
    }
    if p.pp > 1:
        cfg["autoshard"]["pipeline_module"] = {
            "num_stages": p.pp, "partition_method": "uniform" if ctx.even else "custom",
            "stage_layers": ctx.stages, "activation_checkpoint_interval": interval}
    # Always pinned: DeepSpeedConfig asserts train_batch_size == micro x GAS x its data-parallel world
    # (runtime/config.py _batch_assertion), so a launch that counts the TP/PP/CP ranks as data-parallel
    # (no mpu) stops there instead of reporting and scheduling a batch the plan never priced.
    cfg["train_batch_size"] = t.global_batch_size
    cfg["train_micro_batch_size_per_gpu"] = p.micro_batch_size
    cfg["gradient_accumulation_steps"] = gas
    if t.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0}  # 0 = dynamic loss scaling
    else:
        cfg["bf16"] = {"enabled": True}
        if t.main_grads == "fp32":  # gradients accumulated and reduced in fp32 (BF16_Optimizer)
            cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    zero: dict[str, Any] = {"stage": p.zero_stage}
    zero.update(_ds_dp_knobs(ctx))
    if p.zero_stage >= 1:
        zero["contiguous_gradients"] = True
    if p.zero_stage == 2:
        zero["reduce_scatter"] = True
    if p.optimizer_offload:  # ZeRO-Offload: fp32 states on the host, stepped by DeepSpeedCPUAdam
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg["zero_optimization"] = zero
    if _autotp(ctx):
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
    if ckpt is not None:
        cfg["activation_checkpointing"] = ckpt
    cfg["autoshard"]["warnings"] = list(ctx.warnings)
    return dumps_json(cfg) + "\n"


def _ds_dp_knobs(ctx: _Ctx) -> dict[str, Any]:
    """zero_optimization entries of the plan's data-parallel knobs: overlap_comm (the gradient
    reduction under the backward: Plan.overlap_grad_reduce), ZeRO++ hpZ zero_hpz_partition_size (a
    secondary weight shard over N ranks: Plan.reshard_after_forward = N) and MiCS mics_shard_size
    (ZeRO-3 states sharded over dp x cp / dp_replicate ranks: Plan.dp_replicate)."""
    p = ctx.plan
    out: dict[str, Any] = {"overlap_comm": bool(p.overlap_grad_reduce)}
    if p.zero_stage == 3 and isinstance(p.reshard_after_forward, int):
        out["zero_hpz_partition_size"] = p.reshard_after_forward
    if p.zero_stage == 3 and p.dp_replicate > 1:
        out["mics_shard_size"] = ctx.dp * p.cp // p.dp_replicate
    return out

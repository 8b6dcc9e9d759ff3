"""A training log (and its config) -> a measured run: the Problem, the Plan and the steady step time
(`autoshard.validate.Case`, what `calibrate` fits).

What is read from where
=======================

=====================  =========================================================================
setting                Megatron-LM / Megatron-DeepSpeed arguments dump (`_print_args`)
=====================  =========================================================================
model                  num_layers, hidden_size, ffn_hidden_size, num_attention_heads,
                       num_query_groups (when group_query_attention), kv_channels (head_dim when it is
                       not hidden / heads), padded_vocab_size (else vocab_size); swiglu -> silu (gated),
                       squared_relu -> relu2, else gelu; untie_embeddings_and_output_weights -> untied;
                       hidden_dropout / attention_dropout > 0 -> dropout; num_experts, moe_router_topk,
                       moe_ffn_hidden_size, moe_shared_expert_intermediate_size (/ moe_ffn_hidden_size)
training               seq_length, global_batch_size; fp8 set -> fp8_recipe (delayed -> fp8-delayed,
                       tensorwise -> fp8-current, blockwise -> fp8-blockwise, mxfp8 -> mxfp8), else bf16 /
                       fp16; attention_backend 'unfused' / 'local' (or use_flash_attn False on an old
                       Megatron without attention_backend) -> flash_attention false
plan                   tensor/pipeline/context/expert_model_parallel_size, data-parallel = world_size /
                       (tp pp cp); virtual_pipeline_model_parallel_size (or num_layers /
                       pp / num_layers_per_virtual_pipeline_stage) -> interleaved; sequence_parallel;
                       use_distributed_optimizer -> ZeRO-1 (Megatron-DeepSpeed: the DeepSpeed config's
                       zero_optimization_stage); micro_batch_size; recompute_granularity full / selective
                       / None; tp_comm_overlap, overlap_grad_reduce, overlap_param_gather;
                       num_distributed_optimizer_instances N > 1 -> dp_replicate N
=====================  =========================================================================

=====================  =========================================================================
setting                torchtitan log lines and TOML job config
=====================  =========================================================================
model                  `--model` (a preset or an HF config.json) or the problem file's model: the
                       log and the TOML name the model class and flavour only
batch, sequence        'Trainer is initialized with local batch size L, global batch size G, ...,
                       sequence length S' (else the TOML's training.local_batch_size x dp, seq_len)
plan                   'Building device mesh with parallelism: pp, dp_replicate, dp_shard, cp, tp, ep'
                       (else the TOML's parallelism degrees); dp_shard > 1 -> FSDP (ZeRO-3), with
                       dp_replicate > 1 -> HSDP (dp_replicate); the TOML's fsdp_reshard_after_forward
                       always / never -> reshard_after_forward (default: torchtitan's policy);
                       micro-batch: parallelism.pipeline_parallel_microbatch_size when pp > 1, else the
                       local batch; activation_checkpoint.mode selective / full / none (default
                       selective, torchtitan's)
precision              model.converters float8 -> fp8 (quantize.linear.float8.recipe_name rowwise ->
                       fp8-rowwise, else tensorwise = fp8-current); mx -> mxfp8; else bf16
GPU                    'CUDA capacity: NAME with X GiB memory' (the device name, mapped as the
                       validation rows map theirs), else `--gpu` / the problem file
=====================  =========================================================================

The cluster (GPU, topology) comes from `--gpu` / `--topology`, else the problem file (`--problem`),
else the GPU the log names with its default topology. A setting the artifacts do not give is taken
from the problem file; one that neither gives is an error naming the setting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from .logs import LogRun, finish_torchtitan, read_toml
from pydantic import ValidationError
from ..loader import load_problem
from ..spec import Plan
from ..validate import Case
from ..validate.modern import gpu_id

FP8_RECIPES = {"delayed": "fp8-delayed", "tensorwise": "fp8-current", "blockwise": "fp8-blockwise",
               "mxfp8": "mxfp8"}


@dataclass
class RunContext:
    """What the command line adds to the logs."""

    problem: Any = None  # a Problem (autoshard.spec) whose cluster / model / training fill the gaps
    model: Any = None  # a ModelSpec (--model)
    gpu: str | None = None
    topology: str | None = None
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # log path -> TOML job config


@dataclass
class MeasuredRun:
    id: str
    log: LogRun
    problem: Any
    plan: Any
    notes: list[str]

    def case(self) -> Any:
        p = self.problem
        return Case(self.id, "your runs", p.cluster.gpu, p.training.precision, p.cluster.num_gpus, p, self.plan,
                    self.log.step_s, tuple(self.notes), True, framework=p.framework)


def _need(args: dict[str, Any], key: str, path: str, *alts: str) -> Any:
    for k in (key, *alts):
        v = args.get(k)
        if v is not None and v != "None":
            return v
    raise InputError(f"the arguments dump has no {key}", source=path)


def _int(v: Any, key: str, path: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"{key} = {v!r} in the arguments dump is not an integer", source=path)
    return v


def _opt_int(args: dict[str, Any], key: str) -> int | None:
    v = args.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _flag(args: dict[str, Any], key: str) -> bool:
    return args.get(key) is True


def _gpu_from_name(name: str | None) -> str | None:
    return gpu_id(name) if name else None


def _cluster(ctx: RunContext, run: LogRun, num_gpus: int) -> dict[str, Any]:
    cluster: dict[str, Any] = {}
    base = ctx.problem.cluster if ctx.problem is not None else None
    gpu = ctx.gpu or (base.gpu if base is not None else None) or _gpu_from_name(run.gpu_name)
    if gpu is None:
        raise InputError("which GPU ran it? the log does not say: give --gpu ID (autoshard catalog lists them) or "
                         "--problem FILE", source=run.path)
    cluster["gpu"] = gpu
    topo = ctx.topology or (base.topology if base is not None and base.gpu == gpu else None)
    if topo is not None:
        cluster["topology"] = topo
    if base is not None and base.catalog:
        cluster["catalog"] = base.catalog
    cluster["num_gpus"] = num_gpus
    return cluster


def _megatron_problem(run: LogRun, ctx: RunContext) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    a, path = run.args, run.path
    notes: list[str] = []
    if not a:
        if ctx.problem is None:
            raise InputError("no Megatron arguments dump ('---- arguments ----') in the log: give --problem FILE "
                             "with the model, batch and plan", source=path)
        return {}, {}, ["no arguments dump: model, batch and plan from the problem file"]
    if _flag(a, "multi_latent_attention"):
        raise InputError("multi_latent_attention runs are not read from the arguments yet: give --problem FILE",
                         source=path)
    layers = _int(_need(a, "num_layers", path), "num_layers", path)
    hidden = _int(_need(a, "hidden_size", path), "hidden_size", path)
    heads = _int(_need(a, "num_attention_heads", path), "num_attention_heads", path)
    ffn = _int(_need(a, "ffn_hidden_size", path), "ffn_hidden_size", path)
    vocab = _int(_need(a, "padded_vocab_size", path, "vocab_size"), "padded_vocab_size", path)
    kv = (_opt_int(a, "num_query_groups") or heads) if _flag(a, "group_query_attention") else heads
    act = "silu" if _flag(a, "swiglu") else "relu2" if _flag(a, "squared_relu") else "gelu"
    rates = [a.get(k) for k in ("hidden_dropout", "attention_dropout")]
    dropout = any(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0 for r in rates)
    model: dict[str, Any] = dict(name=f"{layers}x{hidden} (from {Path(path).name})", num_hidden_layers=layers,
                                 hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
                                 num_key_value_heads=kv, vocab_size=vocab, hidden_act=act,
                                 tie_word_embeddings=not _flag(a, "untie_embeddings_and_output_weights"),
                                 dropout=dropout, source=f"Megatron arguments dump in {Path(path).name}")
    kvc = _opt_int(a, "kv_channels")
    if kvc and kvc * heads != hidden:
        model["head_dim"] = kvc
    experts = _opt_int(a, "num_experts")
    if experts:
        moe_ffn = _opt_int(a, "moe_ffn_hidden_size") or ffn
        shared = _opt_int(a, "moe_shared_expert_intermediate_size")
        model.update(num_experts=experts, num_experts_per_tok=_int(_need(a, "moe_router_topk", path),
                                                                   "moe_router_topk", path),
                     moe_intermediate_size=moe_ffn, num_shared_experts=(shared // moe_ffn) if shared else 0)
    fp8 = a.get("fp8")
    if fp8 not in (None, "None", False):
        recipe = str(a.get("fp8_recipe") or "delayed").split(".")[-1].lower()
        precision = FP8_RECIPES.get(recipe)
        if precision is None:
            raise InputError(f"fp8_recipe {recipe!r} has no mapping (delayed, tensorwise, blockwise, mxfp8)", source=path)
    elif _flag(a, "bf16"):
        precision = "bf16"
    elif _flag(a, "fp16"):
        precision = "fp16"
    else:
        raise InputError("neither bf16, fp16 nor fp8 is set: fp32 training is not priced", source=path)
    backend = str(a.get("attention_backend") or "").lower()
    if backend:
        flash = not ("unfused" in backend or "local" in backend)
    else:
        flash = _flag(a, "use_flash_attn")
    training = {"seq_len": _int(_need(a, "seq_length", path), "seq_length", path),
                "global_batch_size": _int(_need(a, "global_batch_size", path), "global_batch_size", path),
                "precision": precision, "optimizer": "adam", "flash_attention": flash}
    world = _int(_need(a, "world_size", path), "world_size", path)
    tp = _opt_int(a, "tensor_model_parallel_size") or 1
    pp = _opt_int(a, "pipeline_model_parallel_size") or 1
    cp = _opt_int(a, "context_parallel_size") or 1
    ep = _opt_int(a, "expert_model_parallel_size") or 1
    if world % (tp * pp * cp):
        raise InputError(f"world_size {world} is not a multiple of tp x pp x cp = {tp * pp * cp}", source=path)
    vpp = _opt_int(a, "virtual_pipeline_model_parallel_size")
    per_v = _opt_int(a, "num_layers_per_virtual_pipeline_stage")
    if vpp is None and per_v:
        vpp = max(1, layers // pp // per_v)
    vpp = vpp or 1
    gran = str(a.get("recompute_granularity") or "None")
    recompute: Any = {"full": "full", "selective": "selective", "None": "none"}.get(gran)
    if recompute is None:
        raise InputError(f"recompute_granularity {gran!r} has no mapping (full, selective, None)", source=path)
    if recompute == "full" and a.get("recompute_method") == "block" and _opt_int(a, "recompute_num_layers"):
        n = _opt_int(a, "recompute_num_layers") or 0
        per_stage = layers // pp
        if n < per_stage:
            recompute = (["full"] * n + ["none"] * (per_stage - n)) * pp
            notes.append(f"recompute_method block: the first {n} of each stage's {per_stage} layers recomputed")
    ds_stage = a.get("deepspeed.zero_optimization_stage")
    zero = ds_stage if isinstance(ds_stage, int) and not isinstance(ds_stage, bool) else \
        (1 if _flag(a, "use_distributed_optimizer") else 0)
    plan: dict[str, Any] = dict(tp=tp, pp=pp, dp=world // (tp * pp * cp), cp=cp, ep=ep, vpp=vpp,
                                schedule="interleaved" if vpp > 1 else "1f1b",
                                sequence_parallel=_flag(a, "sequence_parallel") if tp > 1 else False,
                                zero_stage=zero, micro_batch_size=_int(_need(a, "micro_batch_size", path),
                                                                       "micro_batch_size", path),
                                recompute=recompute, overlap_grad_reduce=_flag(a, "overlap_grad_reduce"),
                                overlap_param_gather=_flag(a, "overlap_param_gather"))
    instances = _opt_int(a, "num_distributed_optimizer_instances") or 1
    if zero == 1 and instances > 1:  # the distributed optimizer sharded within each of N instances
        plan["dp_replicate"] = instances
    if tp > 1:
        plan["tp_comm_overlap"] = _flag(a, "tp_comm_overlap")
    return ({"model": model, "training": training, "num_gpus": world,
             # Megatron-DeepSpeed: a DeepSpeed engine configuration in the log -> the DeepSpeed profile
             "framework": "deepspeed" if run.format == "deepspeed" or any(k.startswith("deepspeed.") for k in a)
             else "megatron"}, plan, notes)


def _torchtitan_problem(run: LogRun, ctx: RunContext) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    s, path = run.settings, run.path
    cfg = ctx.configs.get(path, {})
    notes: list[str] = []
    par = cfg.get("parallelism", {}) if isinstance(cfg.get("parallelism"), dict) else {}
    tr = cfg.get("training", {}) if isinstance(cfg.get("training"), dict) else {}
    mesh = s.get("mesh")
    if mesh is None:
        if not par:
            raise InputError("no 'Building device mesh with parallelism:' line and no --config TOML: the degrees "
                             "are unknown", source=path)
        mesh = {"pp": par.get("pipeline_parallel_degree", 1), "dp_replicate": par.get("data_parallel_replicate_degree", 1),
                "dp_shard": par.get("data_parallel_shard_degree", -1), "cp": par.get("context_parallel_degree", 1),
                "tp": par.get("tensor_parallel_degree", 1), "ep": par.get("expert_parallel_degree", 1)}
        if any(not isinstance(v, int) or v < 1 for v in mesh.values()):
            raise InputError("the TOML leaves a degree to be inferred (-1) and the log has no 'Building device mesh' "
                             "line: give the log of the run", source=path)
    tp, pp, cp, ep = mesh["tp"], mesh["pp"], mesh["cp"], mesh.get("ep", 1)
    dp = mesh["dp_replicate"] * mesh["dp_shard"]
    world = dp * tp * pp * cp
    seq = s.get("seq_len") or tr.get("seq_len")
    local = s.get("local_batch_size") or tr.get("local_batch_size")
    gbs = s.get("global_batch_size") or (local * dp if local else None)
    if not seq or not gbs or not local:
        raise InputError("no 'Trainer is initialized with local batch size ...' line and no --config TOML: the batch "
                         "is unknown", source=path)
    finish_torchtitan(run, gbs, seq, world)
    ac = cfg.get("activation_checkpoint", {}) if isinstance(cfg.get("activation_checkpoint"), dict) else {}
    mode = str(ac.get("mode", "selective"))
    recompute: Any = {"selective": "selective", "full": "full", "none": "none"}.get(mode)
    if recompute is None:
        raise InputError(f"activation_checkpoint.mode {mode!r} has no mapping (selective, full, none)", source=path)
    option = str(ac.get("selective_ac_option", "2"))
    if recompute == "selective" and option.isdigit() and int(option) > 0 and run.settings.get("layers") is None:
        # torchtitan layer SAC (_apply_ac_to_transformer_block): a running count of blocks, from 1; a block
        # is wrapped in full checkpointing when count % N == 0
        n = int(option)
        layers = ctx.model.num_hidden_layers if ctx.model is not None else (
            ctx.problem.model.num_hidden_layers if ctx.problem is not None else None)
        if layers:
            recompute = ["full" if (i + 1) % n == 0 else "none" for i in range(layers)]
            notes.append(f"selective_ac_option {n}: every {n}th block fully recomputed (torchtitan layer SAC)")
    elif recompute == "selective":
        notes.append("selective_ac_option op (per-op SAC): priced as selective recompute")
    if not cfg:
        notes.append("no TOML job config: activation checkpointing taken as torchtitan's default (selective), "
                     "precision bf16")
    model_cfg = cfg.get("model", {}) if isinstance(cfg.get("model"), dict) else {}
    converters = [str(c).lower() for c in model_cfg.get("converters", [])]
    precision = "bf16"
    if any("float8" in c for c in converters):
        f8 = (((cfg.get("quantize") or {}).get("linear") or {}).get("float8") or {}) if isinstance(cfg.get("quantize"), dict) \
            else (cfg.get("float8") or {})
        precision = "fp8-rowwise" if str(f8.get("recipe_name", "")).lower() == "rowwise" else "fp8-current"
    elif any(c in ("mx", "mxfp8") or c.startswith("mx") for c in converters):
        precision = "mxfp8"
    mbs = local
    if pp > 1:
        mbs = int(par.get("pipeline_parallel_microbatch_size", 1))
    plan = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, zero_stage=3 if mesh["dp_shard"] > 1 else 0,
                micro_batch_size=mbs, recompute=recompute, sequence_parallel=tp > 1)
    if mesh["dp_shard"] > 1 and mesh["dp_replicate"] > 1:  # HSDP: FSDP within dp_shard, replicated
        plan["dp_replicate"] = mesh["dp_replicate"]
    reshard = par.get("fsdp_reshard_after_forward")
    if mesh["dp_shard"] > 1 and reshard in ("always", "never"):  # ("default": torchtitan's policy, as priced)
        plan["reshard_after_forward"] = reshard
    training = {"seq_len": int(seq), "global_batch_size": int(gbs), "precision": precision, "optimizer": "adam",
                "flash_attention": True}
    return {"training": training, "num_gpus": world, "framework": "torchtitan"}, plan, notes


def measured_run(run: LogRun, ctx: RunContext, index: int) -> MeasuredRun:
    """The log's run as a Problem, a Plan and its steady step time."""
    if run.format == "torchtitan":
        parts, plan_doc, notes = _torchtitan_problem(run, ctx)
    else:
        parts, plan_doc, notes = _megatron_problem(run, ctx)
    base = ctx.problem
    model = parts.get("model")
    if model is None:
        m = ctx.model if ctx.model is not None else (base.model if base is not None else None)
        if m is None:
            raise InputError("which model? the log does not give its dimensions: give --model (a preset or an HF "
                             "config.json) or --problem FILE", source=run.path)
        model = m.model_dump(exclude_none=True)
    training = parts.get("training") or (base.training.model_dump(exclude_none=True) if base is not None else None)
    num_gpus = parts.get("num_gpus") or (base.cluster.num_gpus if base is not None else None)
    if not num_gpus or training is None:
        raise InputError("the log gives neither the number of GPUs nor the batch: give --problem FILE", source=run.path)
    doc = {"name": Path(run.path).stem, "model": model, "training": training,
           "framework": parts.get("framework") or (base.framework if base is not None else "megatron"),
           "cluster": _cluster(ctx, run, num_gpus)}
    try:
        problem = load_problem(doc)
    except InputError as exc:
        raise InputError(f"the run read from the log is not a valid problem: {exc.message}", source=run.path,
                         field=exc.field) from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"the run read from the log is not a valid problem: {err.get('msg')}", source=run.path,
                         field=".".join(str(x) for x in err.get("loc", ()))) from None
    if plan_doc:
        try:
            plan = Plan(**plan_doc)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise InputError(f"the plan read from the log is not valid: {err.get('msg')}", source=run.path,
                             field="plan." + ".".join(str(x) for x in err.get("loc", ()))) from None
    else:
        raise InputError("the log gives no parallel plan: give a log with the arguments dump", source=run.path)
    rid = f"{index:02d}-{Path(run.path).stem}"
    return MeasuredRun(rid, run, problem, plan, [*run.notes, *notes])


def relative_to(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> str:
    try:
        return os.path.relpath(path, folder)
    except ValueError:
        return str(path)


__all__ = ["RunContext", "MeasuredRun", "measured_run", "read_toml"]

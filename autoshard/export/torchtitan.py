"""A torchtitan v0.2.x TOML job file, with torchtitan 0.3 overrides in trailing comments."""

from __future__ import annotations

import json
import re
import shlex
import zlib
from typing import Any

import tomli_w

from .common import _recompute_counts
from .context import _Ctx
from .megatron import megatron_order
from .model_facts import _recipe_settings, titan_flavor, titan_llama3_args
from ..layouts import every_nth_layers


def _toml_text(sections: list[tuple[str, dict[str, Any]]]) -> str:
    """The job's tables as TOML (`tomli_w`), in the given order; a dotted name (`quantize.linear.float8`)
    is a nested table, written under its dotted header."""
    doc: dict[str, Any] = {}
    for name, table in sections:
        node = doc
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = table
    return tomli_w.dumps(doc)


def _titan_parts(stages: list[int], n_layers: int) -> list[list[str]]:
    """`module_fqns_per_model_part`: torchtitan's module names, one list per model chunk."""
    parts, start = [], 0
    for i, k in enumerate(stages):
        part = ["tok_embeddings"] if i == 0 else []
        part += [f"layers.{j}" for j in range(start, start + k)]
        start += k
        if i == len(stages) - 1:
            part += ["norm", "output"]
        parts.append(part)
    assert start == n_layers
    return parts


def _titan_ac(ctx: _Ctx) -> dict[str, Any]:
    """[activation_checkpoint] for the per-layer recompute list: exact where torchtitan can say it
    (none, per-op selective, full, or full on every Nth block of each rank), else the closest
    setting that keeps memory within the plan (more recompute), with a warning naming the cost."""
    modes = ctx.recompute
    kinds = set(modes)
    if kinds == {"none"}:
        return {"mode": "none"}
    if kinds == {"selective"}:
        return {"mode": "selective", "selective_ac_option": "op"}
    if kinds == {"full"}:
        return {"mode": "full"}
    mix = ", ".join(f"{k}:{v}" for k, v in _recompute_counts(ctx).items())
    if "full" not in kinds:
        ctx.warn(f"per-layer recompute mix ({mix}) is not expressible in torchtitan: per-op selective "
                 f"checkpointing is applied to all {len(modes)} layers (the {modes.count('none')} planned "
                 "without recompute also recompute their cheap ops: a few % of their forward time)")
        return {"mode": "selective", "selective_ac_option": "op"}
    # torchtitan's layer SAC (distributed/activation_checkpoint.py _apply_layer_sac): a counter over
    # the blocks each rank wraps, in order (its chunks in order); every Nth block is fully checkpointed.

    n = every_nth_layers(ctx.stages, list(modes), ctx.plan.pp)
    if n is not None:
        return {"mode": "selective", "selective_ac_option": str(n)}
    fulls = modes.count("full")
    extra = len(modes) - fulls
    ctx.warn(f"per-layer recompute mix ({mix}) is not exactly expressible in torchtitan (it fully "
             f"checkpoints every Nth block of a rank, or all): exported as full checkpointing of all "
             f"{len(modes)} layers, so {extra} layers planned without full recompute rerun their forward "
             f"pass (about +{100 * extra / (3 * len(modes)):.0f}% of the step's compute)")
    return {"mode": "full"}


def _titan_shard(ctx: _Ctx) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree)."""
    p, dp = ctx.plan, ctx.dp
    if p.zero_stage == 3:  # HSDP: FSDP2 over dp_shard (x cp), replicated over dp_replicate
        return p.dp_replicate, dp // p.dp_replicate
    multi = p.tp > 1 or p.pp > 1 or p.cp > 1 or (ctx.model.is_moe and p.ep > 1)
    if multi and dp > 1:
        # parallelize_llama (torchtitan 0.2.2): "DDP has not supported > 1D parallelism"; EP also
        # borrows its ranks from the FSDP dimension.
        ctx.warn(f"torchtitan runs no DDP next to TP/PP/CP/EP: ZeRO-{p.zero_stage} exported as FSDP over "
                 f"dp={dp} with fsdp_reshard_after_forward 'never' (parameters, gradients and optimizer state "
                 f"sharded {dp} ways: less memory than planned; the same all-gather + reduce-scatter volume "
                 f"per step, but FSDP2 reduce-scatters gradients every micro-batch: up to "
                 f"{ctx.microbatches}x the planned gradient traffic)")
        return 1, dp
    if p.zero_stage in (1, 2) and dp > 1:
        ctx.warn(f"torchtitan has no ZeRO-{p.zero_stage} distinct from FSDP: exported as DDP (optimizer state "
                 f"replicated: {dp}x the planned optimizer memory per GPU)")
    return dp, 1


def _titan_reshard(ctx: _Ctx) -> str:
    """parallelism.fsdp_reshard_after_forward: the plan's reshard_after_forward ("always" / "never"),
    else "default" (torchtitan's policy: never with pipeline parallelism, always without, as priced);
    "never" where a ZeRO-1/2 plan is exported as FSDP (nothing regathered in the backward)."""
    p = ctx.plan
    if p.zero_stage != 3:
        return "never"
    return "default" if p.reshard_after_forward is None else str(p.reshard_after_forward)


def _titan_schedule(ctx: _Ctx) -> tuple[str, list[int]]:
    """(pipeline_parallel_schedule, layers per torchtitan model chunk in layer order)."""
    p, stages = ctx.plan, ctx.stages
    if p.schedule == "zero_bubble":
        if p.vpp > 1:
            return "InterleavedZeroBubble", stages
        # torchtitan's zero-bubble schedules need two chunks per rank: ZB-V keeps each rank's layer
        # count by splitting it into a V pair (chunk r and chunk 2pp-1-r).
        if all(n >= 2 for n in stages):
            first = [n // 2 for n in stages]
            second = [n - f for n, f in zip(stages, first)]
            m = ctx.model
            head_m = m.vocab_size * m.hidden_size / 1e6
            ctx.warn("zero_bubble with one stage per rank: exported as torchtitan ZBVZeroBubble, which places "
                     "two chunks per rank in a V (same layer count per rank, different layers); the last chunk "
                     f"(final norm + output head, {head_m:.0f}M parameters and the logits' compute and memory) "
                     "lands on rank 0 next to the embedding instead of on the last rank")
            return "ZBVZeroBubble", first + second[::-1]
        ctx.warn("zero_bubble needs two chunks per rank in torchtitan and a stage has < 2 layers: exported as 1F1B")
        return "1F1B", stages
    if p.schedule == "gpipe":
        return ("LoopedBFS" if p.vpp > 1 else "GPipe"), stages
    if p.schedule == "dualpipev":  # torchtitan places V-style schedules' stages r and 2pp-1-r on rank r
        return "DualPipeV", stages
    if p.vpp > 1:
        return "Interleaved1F1B", stages
    return "1F1B", stages


def _torchtitan(ctx: _Ctx) -> str:
    """The TOML job, one part per technique (the model and its flavor, the precision recipe, the batch,
    the parallelism degrees, activation checkpointing), after a header of comments with every warning
    the parts raised; then the same plan as torchtitan 0.3 overrides, and a flavor module to save
    where torchtitan ships none of the model's shape."""
    replicate, shard = _titan_shard(ctx)  # first: its warning heads the list
    model, experimental, register = _titan_model(ctx)
    quantize = _titan_precision(ctx, model)
    training = _titan_training(ctx)
    parallelism, compile_, parts_listing = _titan_parallelism(ctx, replicate, shard)
    ac = _titan_ac(ctx)

    sections = [("model", model), ("training", training), ("parallelism", parallelism)]
    if experimental:
        sections.append(("experimental", experimental))
    if quantize is not None:
        sections.append(quantize)
    if compile_:
        sections.append(("compile", compile_))
    sections.append(("activation_checkpoint", ac))
    lines = [f"# {line}" for line in ctx.header()]
    for w in ctx.warnings:
        lines.append(f"# warning: {w}")
    lines += ["", _toml_text([("job", {"description": "autoshard: " + ctx.plan.short()}), *sections]).rstrip("\n")]
    lines += _titan_03_overrides(ctx, model, training, parallelism, ac, quantize, parts_listing)
    if register:
        lines += [""] + register
    return "\n".join(lines) + "\n"


def _titan_model(ctx: _Ctx) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """([model] name and flavor, [experimental], the comment lines of a flavor module to save): the
    torchtitan flavor of the priced shape, else a llama3 flavor registered under a digest of it."""
    m = ctx.model
    model: dict[str, Any] = {}
    experimental: dict[str, Any] = {}
    register: list[str] = []
    flavor = titan_flavor(m)
    if flavor is not None:
        model["name"], model["flavor"] = flavor
    else:
        args, why = titan_llama3_args(m)
        # the flavor name carries a digest of the shape: two shapes never share a registered flavor
        shape = json.dumps(m.model_dump(mode="json", exclude={"name", "source"}), sort_keys=True)
        slug = f"{m.name}-{m.num_hidden_layers}L-{m.hidden_size}d-{zlib.crc32(shape.encode()):08x}"
        model["name"], model["flavor"] = "llama3", f"autoshard-{slug}"
        if args is not None:
            # torchtitan 0.2.2 (train.py) imports [experimental] custom_import before it looks the flavor up
            # in the train spec's model_args (the llama3_args dict): the module below registers the shape
            module = "autoshard_flavor_" + re.sub(r"[^0-9a-zA-Z]+", "_", slug).strip("_").lower()
            experimental["custom_import"] = module
            kw = ", ".join(f"{k}={v!r}" for k, v in args.items())
            register = [f"# --- save as {module}.py on PYTHONPATH: registers the priced shape as flavor "
                        f"{model['flavor']!r} ---",
                        "# from torchtitan.models.llama3 import llama3_args",
                        "# from torchtitan.models.llama3.model.args import TransformerModelArgs",
                        f"# llama3_args[{model['flavor']!r}] = TransformerModelArgs({kw})",
                        "# --- end ---"]
            ctx.warn(f"torchtitan ships no flavor with {m.name}'s shape ({m.num_hidden_layers} layers, dim "
                     f"{m.hidden_size}): the job imports {module} ([experimental] custom_import), which registers "
                     f"it as llama3 flavor {model['flavor']!r}; save the module from the comment at the end")
        else:
            ctx.warn(f"torchtitan ships no flavor with {m.name}'s shape and its llama3 model cannot build it "
                     f"({why}): [model] flavor = {model['flavor']!r} is registered nowhere, so torchtitan stops at "
                     f"the flavor lookup until you register a model with dim={m.hidden_size}, "
                     f"n_layers={m.num_hidden_layers}, n_heads={m.num_attention_heads}, n_kv_heads={m.kv_heads}, "
                     f"vocab_size={m.vocab_size}")
    return model, experimental, register


def _titan_precision(ctx: _Ctx, model: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The low-precision recipe: a model converter in [model] and its (section, settings), or None."""
    t = ctx.training
    recipe = _recipe_settings(t.precision) or {
        "titan": None, "titan_note": "no torchtitan recipe: the exported job trains in bf16"}
    quantize: tuple[str, dict[str, Any]] | None = None
    if recipe["titan"] is not None:
        converter, recipe_name = recipe["titan"]
        model["converters"] = [converter]
        quantize = (converter, {"recipe_name": recipe_name})
    if recipe.get("titan_note"):
        ctx.warn(f"precision {t.precision}: {recipe['titan_note']}")
    return quantize


def _titan_training(ctx: _Ctx) -> dict[str, Any]:
    """[training]: the per-rank batch, the global batch, the sequence and the mixed precision."""
    p, t = ctx.plan, ctx.training
    training: dict[str, Any] = {}
    if p.pp > 1:
        # The whole per-rank batch goes through the pipeline in micro-batches of micro_batch_size.
        training["local_batch_size"] = p.micro_batch_size * ctx.microbatches
    else:
        training["local_batch_size"] = p.micro_batch_size  # gradient accumulation makes up the rest
    training["global_batch_size"] = t.global_batch_size
    training["seq_len"] = t.seq_len
    training["mixed_precision_param"] = "bfloat16"  # torchtitan: Literal["bfloat16", "float32"], no float16
    if t.precision == "fp16":
        ctx.warn("torchtitan has no fp16 mixed precision (mixed_precision_param is bfloat16 or float32): "
                 "exported as bf16, which needs a GPU with bf16 tensor cores (same speed where it has them)")
    training["mixed_precision_reduce"] = "bfloat16" if t.main_grads == "bf16" else "float32"

    return training


def _titan_parallelism(ctx: _Ctx, replicate: int, shard: int,
                       ) -> tuple[dict[str, Any], dict[str, Any], list[list[str]] | None]:
    """([parallelism], [compile] for async TP, the module names per model part of an uneven pipeline),
    for the data-parallel degrees (replicate, shard) of `_titan_shard`."""
    p, m = ctx.plan, ctx.model
    parallelism: dict[str, Any] = {}
    compile_: dict[str, Any] = {}
    parallelism["data_parallel_replicate_degree"] = replicate
    parallelism["data_parallel_shard_degree"] = shard
    if shard > 1 or p.cp > 1:
        parallelism["fsdp_reshard_after_forward"] = _titan_reshard(ctx)
    parallelism["tensor_parallel_degree"] = p.tp
    if p.tp > 1 and not p.sp:
        ctx.warn("torchtitan always uses sequence parallelism with tensor parallelism (the plan has none: "
                 "less activation memory, the same TP traffic)")
    if ctx.tp_overlap:
        parallelism["enable_async_tensor_parallel"] = True
        compile_ = {"enable": True, "components": ["model", "loss"]}
    parallelism["pipeline_parallel_degree"] = p.pp
    parts_listing = None
    if p.pp > 1:
        schedule, chunks = _titan_schedule(ctx)
        parallelism["pipeline_parallel_schedule"] = schedule
        parallelism["pipeline_parallel_microbatch_size"] = p.micro_batch_size
        if len(set(chunks)) == 1:
            parallelism["pipeline_parallel_layers_per_stage"] = chunks[0]
            parallelism["pipeline_parallel_first_stage_less_layers"] = 0
            parallelism["pipeline_parallel_last_stage_less_layers"] = 0
        else:
            parts_listing = _titan_parts(chunks, m.num_hidden_layers)
            parallelism["module_fqns_per_model_part"] = parts_listing
    parallelism["context_parallel_degree"] = p.cp
    if p.cp > 1:
        ctx.warn(f"torchtitan folds CP into FSDP (its fsdp mesh is dp_shard x cp = {shard * p.cp}): parameters, "
                 f"gradients and optimizer state are sharded over the cp={p.cp} ranks too, which adds a "
                 "parameter all-gather per pass over them")
    if m.is_moe:
        etp = p.expert_tp
        t_etp = etp if etp in (1, p.tp) else 1
        if t_etp != etp:
            ctx.warn(f"etp={etp}: torchtitan supports expert_tensor_parallel_degree 1 or tp only; exported as 1 "
                     "(expert weights unsplit: more expert memory per GPU, no expert TP traffic)")
        parallelism["expert_parallel_degree"] = p.ep
        parallelism["expert_tensor_parallel_degree"] = t_etp
    elif p.ep > 1:
        ctx.warn(f"ep={p.ep} ignored: {m.name} is a dense model")
    if ctx.ep_overlap:
        ctx.warn("expert all-to-all overlap has no torchtitan option: the all-to-all runs exposed")
    if megatron_order(p) != "tp-cp-ep-dp-pp" and not (p.pp == 1 and megatron_order(p)):
        ctx.warn(f"placement {p.placement} is not expressible: torchtitan orders its mesh pp, dp_replicate, "
                 "fsdp (dp_shard x cp), tp (tp innermost); groups land on other network levels than planned")
    return parallelism, compile_, parts_listing


def _titan_03_overrides(ctx: _Ctx, model: dict[str, Any], training: dict[str, Any], parallelism: dict[str, Any],
                        ac: dict[str, Any], quantize: tuple[str, dict[str, Any]] | None,
                        parts_listing: list[list[str]] | None) -> list[str]:
    """The trailing comments: the same plan as torchtitan 0.3 command-line overrides."""
    p, m = ctx.plan, ctx.model
    lines: list[str] = []
    # torchtitan 0.3 (configs.py): the same degrees as tyro overrides; expert TP is not a 0.3 option
    # (EP borrows from FSDP x TP), async TP lives under compile, and pipelines or EP need CUDA graphs off.
    override = []
    for name, table in (("training", training), ("parallelism", parallelism)):
        for k, v in table.items():
            if isinstance(v, list) or k in ("expert_tensor_parallel_degree", "enable_async_tensor_parallel"):
                continue
            override.append(f"--{name}.{k} {shlex.quote(str(v).lower() if isinstance(v, bool) else str(v))}")
    if p.pp > 1 or (m.is_moe and p.ep > 1):
        override.append("--training.disable_cuda_graphs")
    if ctx.tp_overlap:
        override += ["--compile.enable", "--compile.enable_async_tensor_parallel"]
    ac_cfg = {"none": "no activation checkpointing (activation_checkpoint=None)",
              "full": "activation_checkpoint=FullAC.Config()",
              "selective": "activation_checkpoint=SelectiveAC.Config() ([activation_checkpoint] above: "
                           f"selective_ac_option {ac.get('selective_ac_option')!r})"}[ac["mode"]]
    lines += ["", "# torchtitan >= 0.3 (--module <pkg.module> --config <function>), the same plan as overrides:",
              "#   " + " ".join(override)]
    if m.is_moe and p.expert_tp != 1:
        lines.append(f"#   expert TP: torchtitan 0.3 has no expert_tensor_parallel_degree (ETP is 1 there; "
                     f"the plan has etp={p.expert_tp})")
    if parts_listing is not None:
        lines.append("#   module_fqns_per_model_part: set ParallelismConfig.module_fqns_per_model_part in the "
                     "recipe function to the list above")
    lines.append(f"#   in the recipe function: {ac_cfg}; model {model['name']} flavor {model['flavor']}")
    if quantize is not None:
        lines.append(f"#   precision: model converter {quantize[0]} with recipe_name {quantize[1]['recipe_name']!r}")
    return lines

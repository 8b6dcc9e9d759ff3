"""Rows of `validation/modern_runs_dev.json` (2024-2026 stacks) -> Cases.

A modern row has the fields of `dev_runs.json` plus `head_dim`, `moe_ffn`, `first_k_dense`,
`moe_shared_experts`, `etp` and `nvlink_domain_gpus`; `is_modern_row` tells them apart (the old
conversion of `dev_runs.json` rows is left untouched). What the conversion reads:

Every fact is read from a field (validation/README.md, "Fields that state facts"), never from a
source's or a model's name.

=========================  ===========================================================================
row field / situation      autoshard
=========================  ===========================================================================
gpu                        through the catalog's aliases (`catalog.resolve_gpu_id`: DGX-H100,
                           H100-SXM5-80GB, 'H100 (96GB HBM2e, 500W power limit)', DGX-B200, MI355,
                           ...); unknown: bad input, one line with the closest names
topology                   the row's `topology` (a preset), else the GPU's default topology; a first
                           level whose size differs from `nvlink_domain_gpus` is noted
precision                  `precision_recipe` where stated, else read from the `precision` text:
                           BF16 -> bf16; FP8-CS / 'per-tensor, current scaling' / torchao tensorwise
                           -> fp8-current; 'delayed' -> fp8-delayed; MXFP8 / FP8-MX /
                           '(parenthesised variant)' on Blackwell -> mxfp8, on Hopper ->
                           fp8-blockwise (128x128 weights, 1x128 activations); torchao rowwise ->
                           fp8-rowwise; NVFP4 -> nvfp4; plain FP8 -> `fp8` (the framework's
                           default recipe). `training.precision` is the recipe when autoshard.spec
                           accepts it, else its family; the recipe is kept in `Case.recipe`
model                      layers, hidden, ffn, heads, kv_heads, head_dim, vocab as given; MoE:
                           moe_experts, moe_top_k, moe_ffn (null -> ffn), moe_shared_experts,
                           moe_shared_ffn (the shared experts' total width, where not count x moe_ffn),
                           first_k_dense; hidden_act (default silu), tie_word_embeddings (false),
                           dropout; MLA from q_lora_rank / kv_lora_rank / qk_nope_head_dim /
                           qk_rope_head_dim / v_head_dim (a kv_lora_rank makes it MLA);
                           sliding_window + sliding_window_layers; attention_chunk_size +
                           chunked_attention_layers; expert_bias; a hybrid model's
                           hybrid_override_pattern (+ mamba_num_heads, mamba_head_dim,
                           ssm_state_size, mamba_n_groups); mamba_layers > 0 without the pattern:
                           skipped (the blocks' order not stated); mtp_layers: priced on
                           the last stage (num_nextn_predict_layers)
framework                  `framework` (default megatron); `source_family` names the source group
plan                       tp, pp, cp, ep as given (null -> 1), etp as given (null -> None = tp),
                           dp as given else gpu_count / (tp pp cp); fsdp true -> zero_stage 3 with the
                           given tp/pp (Megatron-FSDP, FSDP2 + TP); else zero_stage as given, else 1
                           for megatron (distributed optimizer), 0 for others; sp as given, else on
                           when tp > 1; vpp = vpp_chunks (interleaved when > 1)
micro_batch                as given; torchtitan rows (no accumulation): the local batch (other_metrics'
                           local_batch_size, else gbs/dp), split in pp micro-batches when pp > 1
                           (torchtitan's default: one per stage)
recompute                  'none ...' -> none; 'full ...' -> full; 'selective' / per-op SAC ->
                           selective; recompute_modules=[] -> none, other module lists -> those
                           modules (Megatron names); recompute_num_layers=N with pp = 1 -> full for
                           the first N layers; activation_checkpointing: true -> full; cpu_offloading
                           -> none (noted: not modelled); null -> the row's framework_recipe's
                           (below), else the least recompute that fits (solver, as dev_runs)
routing, rounds            `moe_routing` (spread / contiguous) -> training.moe_routing;
                           `pipeline_rounds` -> plan.pipeline_rounds (default 1)
overlaps, graphs,          `tp_comm_overlap`, `ep_overlap`, `cuda_graphs`, `moe_dispatcher`,
  dispatcher, token drop   `moe_capacity_factor` where the row states them, else its
                           framework_recipe's (Megatron rows)
framework_recipe           `recipe_facts`: what the launcher's recipe ran (the row's field, a mapping:
                           validation/README.md): EP overlap, dispatcher, token drop, full-iteration
                           CUDA graphs, recompute, TP overlap, offloaded layers, pipeline layout, each
                           where the row states none (etp: the expert tensor-parallel size, applied
                           to a row whose etp is null); a low-confidence entry gives no recompute,
                           offloading or layout. The shipped Megatron-Bridge rows carry the entries
                           of data/mbridge_recipes.yaml (benchmarks/bench_mbridge_tables.py
                           `recipe_entry` looks them up for the table lines outside validation/);
                           nothing is looked up here by a row's id or name
memory, precision knobs    main_grads, fp8_params, flash_attention (default true), launch_blocking,
                           softmax_fusion, measured_peak_memory_gib / _gb
=========================  ===========================================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, get_args


from ..errors import InputError
from .cases import as_int, global_batch_seqs, row_dp
from pydantic import ValidationError
from .cases import Case, Skip, measured_peak_memory_gib, measured_step
from ..catalog import get_gpu, get_topology, resolve_gpu_id, unknown_gpu_message
from ..loader import load_problem
from ..spec import GRAPH_SCOPES, Plan, Precision, canonical_recompute

# One line to switch: True = give `training.precision` the recipe wherever autoshard.spec accepts it.
USE_RECIPES = True

RECIPES = ("bf16", "fp16", "fp8", "fp8-delayed", "fp8-current", "fp8-blockwise", "mxfp8", "nvfp4")
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
MAMBA_KEYS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "mamba_n_groups")

MODERN_KEYS = ("nvlink_domain_gpus", "moe_ffn", "first_k_dense", "etp")


def is_modern_row(row: Mapping[str, Any]) -> bool:
    """A modern_runs_dev row (has the extra fields), as opposed to a dev_runs row."""
    return any(k in row for k in MODERN_KEYS)


# ---------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------


def gpu_id(name: str) -> str | None:
    """A row's GPU / system name -> its catalog id through the catalog's alias table
    (`catalog.resolve_gpu_id`: 'DGX-B200', 'H100-SXM5-80GB', 'NVIDIA H100 SXM5', 'MI355' ...); None
    where the table has no such spelling."""
    return resolve_gpu_id(name) if name.strip() else None


# The catalog's `arch` of a GPU (gpus.yaml) -> the architecture family the regime tables use.
ARCH_FAMILIES = {"volta": "Volta", "ampere": "Ampere", "hopper": "Hopper", "blackwell": "Blackwell",
                 "blackwell-ultra": "Blackwell", "cdna3": "CDNA3", "cdna4": "CDNA4"}


def gpu_arch(gid: str) -> str:
    """'Hopper', 'Blackwell', 'Ampere', 'CDNA3', 'CDNA4', ... of a catalog id: its catalog `arch`
    (`ARCH_FAMILIES`; Blackwell Ultra counts as Blackwell), 'other' for the rest."""
    try:
        return ARCH_FAMILIES.get(get_gpu(gid).arch, "other")
    except InputError:
        return "other"


def precision_family(precision: str) -> str:
    """'BF16', 'FP8' or 'FP4' of a training.precision or recipe."""
    p = precision.lower()
    if "fp4" in p:
        return "FP4"
    if "fp8" in p:
        return "FP8"
    return "BF16"


def precision_recipe(row: Mapping[str, Any], arch: str) -> tuple[str | None, str]:
    """(recipe, how it was read) from the row's precision text (and recipe names in its notes)."""
    text = str(row.get("precision") or "").strip()
    low = text.lower()
    stated = row.get("precision_recipe")
    if stated:
        if str(stated) not in RECIPES + ("fp8-rowwise",):
            raise InputError(f"precision_recipe {stated!r}: expected one of {', '.join(RECIPES + ('fp8-rowwise',))}",
                             field=f"{row.get('id')}.precision_recipe")
        return str(stated), f"{text}: recipe {stated} (the row's precision_recipe)"
    if not low:
        return None, "precision not published"
    blackwell = arch == "Blackwell"
    if "nvfp4" in low or "fp4" in low:
        return "nvfp4", text
    if "float8" in low:  # torchao float8 training of nn.Linear
        if "rowwise" in low:
            return "fp8-rowwise", f"{text}: torchao row-wise scaling (Float8Linear recipe 'rowwise')"
        return "fp8-current", f"{text}: torchao tensorwise dynamic scaling = current scaling"
    if "mxfp8" in low or "fp8-mx" in low or "parenthesised" in low:
        if blackwell:
            return "mxfp8", text
        return "fp8-blockwise", f"{text}: on {arch} the finer granularity is blockwise (128x128 weights, 1x128 activations)"
    if "blockwise" in low:
        return "fp8-blockwise", text
    if "fp8-cs" in low or "current" in low or "tensorwise" in low:
        return "fp8-current", text
    if "delayed" in low:
        return "fp8-delayed", text
    if low.startswith("fp8"):
        return "fp8", f"{text}: recipe not stated (the framework's default fp8 recipe)"
    if low.startswith("bf16") or low.startswith("fp16"):
        return "bf16", text
    return None, f"precision {text!r} has no mapping"


def spec_precision(recipe: str) -> str:
    """The `training.precision` value for a recipe: itself where autoshard.spec accepts it
    (and USE_RECIPES), else its family ('fp8' for every fp8 recipe; nvfp4 too: the nearest rate)."""
    accepted = set(get_args(Precision))
    if USE_RECIPES and recipe in accepted:
        return recipe
    if recipe in ("bf16", "fp16"):
        return "bf16" if "bf16" in accepted else recipe
    return "fp8"


def source_family(row: Mapping[str, Any]) -> str:
    """The row's `source_family` (the publication series it comes from: validation/README.md), else its
    `source` up to the first comma; the unit left out as a whole by the leave-one-source-out check."""
    fam = str(row.get("source_family") or "").strip()
    return fam or str(row.get("source") or "").split(",")[0].strip()[:32] or "unknown"


def framework_of(row: Mapping[str, Any]) -> tuple[str, str]:
    """(Problem.framework, source family) of a modern row: its `framework` field (default megatron) and
    `source_family`."""
    return str(row.get("framework") or "megatron"), source_family(row)


def row_flag(row: Mapping[str, Any], key: str, default: bool | None) -> bool | None:
    """A true/false field of a row (absent or null: `default`); anything else is bad input."""
    v = row.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise InputError(f"expected true or false, got {v!r}", field=f"{row.get('id')}.{key}")
    return v


# ---------------------------------------------------------------------------------------
# Knobs read from text
# ---------------------------------------------------------------------------------------


def recompute_of(text: Any, layers: int, pp: int, vpp: int) -> tuple[Any, str | None, bool]:
    """(Plan.recompute, note, published) from a row's activation_recompute text; recompute None
    = no mapping."""
    if text is None:
        return "none", None, False
    raw = str(text).strip()
    low = raw.lower()
    if low in ("", "null"):
        return "none", None, False
    if low.startswith("none") or low in ("no", "off", "false"):
        return "none", None, True
    if low.startswith("cpu_offloading"):
        return "none", f"activation_recompute {raw.split(' (')[0]!r}: CPU offloading not modelled (priced as none)", True
    if low.startswith("activation_checkpointing: true"):
        return "full", "activation_checkpointing: true -> full (every layer checkpointed)", True
    if low.startswith("full"):
        return "full", None, True
    if low.startswith("selective (layer)") or low.startswith("selective layer"):
        # torchtitan's layer-level selective AC: full checkpointing of every 2nd layer (selective_ac_option "2")
        return (["none", "full"] * layers)[:layers], f"{raw!r}: full recompute on every 2nd layer (torchtitan selective_ac_option 2)", True
    mods = re.fullmatch(r"selective\s*:\s*([a-z_,\s+]+)", low)
    if mods:  # "selective: mla_up_proj, mlp": Megatron recompute modules

        try:
            return canonical_recompute(mods.group(1)), None, True
        except ValueError:
            pass
    if low.startswith("selective"):
        note = f"{raw!r} priced as selective" if low != "selective" else None
        return "selective", note, True
    if "sac" in low:
        return "selective", f"{raw!r}: per-op selective activation checkpointing priced as selective", True
    m = re.search(r'recompute_granularity\s*=\s*"?(\w+)"?', low)
    if m:
        gran = m.group(1)
        if gran in ("none", "null"):
            return "none", None, True
        mods = re.search(r"recompute_modules\s*=\s*\[([^\]]*)\]", raw)
        if gran == "selective":
            names = [x.strip().strip("'\"") for x in mods.group(1).split(",") if x.strip()] if mods else None
            if names == []:
                return "none", "recompute_modules=[]: nothing recomputed", True
            if names:
                try:
                    return canonical_recompute("+".join(names)), None, True
                except ValueError:
                    return "selective", f"recompute_modules={names} priced as selective", True
            return "selective", None, True
        if gran == "full":
            n = re.search(r"recompute_num_layers\s*=\s*(\d+)", low)
            if n and pp * vpp == 1 and int(n.group(1)) < layers:
                k = int(n.group(1))
                return ["full"] * k + ["none"] * (layers - k), f"recompute_num_layers={k}: full on the first {k} layers", True
            return "full", None, True
    return None, f"activation_recompute {raw!r} has no mapping", True


def overlaps_of(row: Mapping[str, Any]) -> tuple[bool | None, bool | None, list[str]]:
    """(tp_comm_overlap, ep_overlap, notes) from the row's fields of those names; None where absent."""
    tp_ov, ep_ov = row_flag(row, "tp_comm_overlap", None), row_flag(row, "ep_overlap", None)
    found = []
    if tp_ov is not None:
        found.append(f"tp_comm_overlap={tp_ov} (stated)")
    if ep_ov is not None:
        found.append(f"ep_overlap={ep_ov} (stated)")
    return tp_ov, ep_ov, found


def dp_knobs_of(row: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(Plan fields, notes) of the row's data-parallel facts: `overlap_grad_reduce`, `overlap_param_gather`
    (default true: the overlap as the framework's engine runs it), `reshard_after_forward` (always,
    never, a group size N, or torchtitan's "default"; default: the framework's policy) and `dp_replicate`
    (replicas of the sharded state: HSDP / distributed-optimizer instances / MiCS; default 1). A value
    of another kind raises ValueError (the row does not convert, with that line)."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    for knob in ("overlap_grad_reduce", "overlap_param_gather"):
        v = row_flag(row, knob, None)
        if v is not None:
            out[knob] = bool(v)
            notes.append(f"{knob}={bool(v)} (stated)")
    ra = row.get("reshard_after_forward")
    if ra is not None and ra != "default":
        if isinstance(ra, bool) or not (ra in ("always", "never") or isinstance(ra, int) and ra >= 2):
            raise ValueError(f"reshard_after_forward {ra!r}: always, never, default or a group size >= 2")
        out["reshard_after_forward"] = ra
        notes.append(f"reshard_after_forward={ra} (stated)")
    rep = row.get("dp_replicate")
    if rep is not None:
        if isinstance(rep, bool) or not isinstance(rep, int) or rep < 1:
            raise ValueError(f"dp_replicate {rep!r}: a count >= 1")
        out["dp_replicate"] = rep
        if rep > 1:
            notes.append(f"dp_replicate={rep} (stated)")
    return out, notes


def cuda_graphs_of(row: Mapping[str, Any]) -> bool:
    """Whether the row states the step ran as a full-iteration CUDA graph (`cuda_graphs: true`: MLPerf's
    config_common_cg.sh, Megatron-Bridge recipes calling _enable_hybridep_full_iteration_mxfp8 or
    _apply_gpt_oss_120b_full_iter_fp8mx_configs, cuda_graph_impl full_iteration)."""
    return bool(row_flag(row, "cuda_graphs", False))


def graph_scope_of(row: Mapping[str, Any], recipe: Mapping[str, Any]) -> list[str]:
    """The per-layer CUDA graph regions a Megatron row ran (`Plan.cuda_graph_scope`): the row's own
    `cuda_graph_scope` (a list, or names joined by +), else its recipe's: `cuda_graphs` local or
    transformer_engine with the recipe's `cuda_graph_scope` (names joined by +), or without one the
    whole layer (`layer`: Megatron's empty module list, the old "full" scope); [] otherwise."""
    own = row.get("cuda_graph_scope")
    if own is None:
        if recipe.get("cuda_graphs") not in ("local", "transformer_engine"):
            return []
        own = recipe.get("cuda_graph_scope") or "layer"
    names = own.split("+") if isinstance(own, str) else list(own)
    unknown = [n for n in names if n not in GRAPH_SCOPES]
    if unknown:
        raise ValueError(f"cuda_graph_scope {unknown[0]!r}: one of {', '.join(GRAPH_SCOPES)}")
    return names


RECIPE_KNOBS = ("ep_overlap", "dispatcher", "capacity_factor", "cuda_graphs", "recompute", "tp_comm_overlap", "etp",
                "offload_layers", "layout", "mtp_layers")
LAYOUT_KNOBS = ("recompute", "offload_layers", "layout")  # not taken from low-confidence entries


def applied_recipe(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a recipe entry the conversion applies: all of it, except that a low-confidence entry
    (the table's configuration matches no committed recipe) gives no recompute, offloading or pipeline
    layout."""
    if entry.get("confidence") == "low":
        return {k: v for k, v in entry.items() if k not in LAYOUT_KNOBS}
    return dict(entry)


RECIPE_FIELDS = (*RECIPE_KNOBS, "cuda_graph_scope", "confidence", "source")


def recipe_facts(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the launcher's recipe ran for a row, from its `framework_recipe` field (validation/README.md:
    ep_overlap, dispatcher, capacity_factor, cuda_graphs, recompute, tp_comm_overlap, offload_layers,
    layout, mtp_layers, confidence, source), as the conversion applies it (`applied_recipe`). A row
    without the field: {} (the row's own fields and the framework's defaults)."""
    facts = row.get("framework_recipe")
    if facts is None:
        return {}
    where = f"{row.get('id') or '?'}.framework_recipe"
    if not isinstance(facts, Mapping):
        raise InputError(f"expected a mapping of recipe facts, got {type(facts).__name__}", field=where)
    unknown = sorted(set(facts) - set(RECIPE_FIELDS))
    if unknown:
        raise InputError(f"unknown recipe fact {unknown[0]!r} (expected one of {', '.join(RECIPE_FIELDS)})",
                         field=where)
    if facts.get("confidence") not in (None, "low", "medium", "high"):
        raise InputError(f"confidence must be low, medium or high, got {facts['confidence']!r}",
                         field=f"{where}.confidence")
    return applied_recipe(facts)


def megatron_layout_stages(layout: str) -> list[str]:
    """A Megatron `pipeline_model_parallel_layout` string as one string per virtual stage, unrolled as
    Megatron-LM unrolls it (pipeline_parallel_layer_layout.py `parse_str_to_list`: commas are cosmetic,
    `(...)*n` then `x*n` repeat, `|` separates stages; E embedding, t transformer layer, m MTP, L loss).
    'Et*4|(t*4|)*14tmL' -> ['Etttt', 'tttt' x 14, 'tmL']."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    return text.split("|")


def recipe_stage_layers(layers: int, chunks: int, layout: str | None) -> list[int] | None:
    """Transformer layers per virtual stage of a recipe's pipeline layout: `embedding+loss`
    (account_for_embedding/loss_in_pipeline_split: the embedding and the loss count as one layer
    each, the (layers + 2) slots split evenly, so the first and the last virtual stage hold one
    transformer layer fewer), or a Megatron layout string (`megatron_layout_stages`; its MTP layers
    are not priced). None where it does not apply (no layout, one stage, or a layout of another
    stage count or layer total)."""
    if not layout or chunks <= 1:
        return None
    if layout != "embedding+loss":
        stages = megatron_layout_stages(layout)
        counts = [st.count("t") for st in stages]
        return counts if len(counts) == chunks and sum(counts) == layers else None
    if (layers + 2) % chunks:
        return None
    per = (layers + 2) // chunks
    return [per - 1] + [per] * (chunks - 2) + [per - 1]


def token_drop_of(row: Mapping[str, Any]) -> float | None:
    """The expert capacity factor of a token-drop run (`moe_capacity_factor`; None: dropless).
    Megatron-Bridge's '(tokendrop)' benchmarks run through apply_moe_token_drop: capacity factor 1.0,
    inputs padded to the capacity (src/megatron/bridge/training/utils/moe_token_drop.py)."""
    v = row.get("moe_capacity_factor")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise InputError(f"expected a positive number, got {v!r}", field=f"{row.get('id')}.moe_capacity_factor")
    return float(v)


def dispatcher_of_row(row: Mapping[str, Any]) -> str | None:
    """The expert dispatcher a row states (`moe_dispatcher`: alltoall, allgather, deepep, hybridep), None
    where it states none."""
    v = row.get("moe_dispatcher")
    return str(v) if v else None


def topology_of(gid: str) -> str:
    """The GPU's default topology (a row's `topology` field names another)."""
    return get_gpu(gid).default_topology


# ---------------------------------------------------------------------------------------
# Row -> Case
# ---------------------------------------------------------------------------------------


class _SkipRow(Exception):
    """A row the model cannot price: `modern_row_to_case` returns a Skip with this reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def modern_row_to_case(row: Mapping[str, Any]) -> Any:
    """One modern row -> a Case or a Skip with the reason (see the module docstring). The parts, in
    the order their notes and skip reasons appear: the measured step, the hardware, the model, the
    parallel plan, the recompute and the release's recipe, then the problem and the plan."""
    rid = str(row.get("id") or "?")
    framework, group = framework_of(row)
    notes: list[str] = []
    try:
        meas = _row_step(row, notes)
        hw = _row_hardware(row, rid, notes)
        model = _row_model(row, rid, notes)
        par = _row_parallel(row, framework, hw["n"], notes)
        rec = _row_recipe(row, framework, model, par, notes)
        problem, plan = _row_problem_plan(row, rid, framework, hw, model, par, rec, notes)
    except _SkipRow as s:
        return Skip(rid, group, s.reason)
    return Case(rid, group, hw["gid"], hw["precision"], hw["n"], problem, plan, float(meas), tuple(notes),
                rec["published_rc"], recipe=hw["recipe"], framework=framework, arch=hw["arch"],
                measured_peak_memory_gib=measured_peak_memory_gib(row))


def _row_step(row: Mapping[str, Any], notes: list[str]) -> float:
    """The measured step time (s)."""
    meas, how = measured_step(row)
    if meas is None or not meas > 0:
        if row.get("global_batch_tokens") is None and row.get("global_batch_seqs") is None:
            raise _SkipRow("no measured step time (global batch and sequence length not published)")
        raise _SkipRow(how)
    notes.append(f"measured step {how}")
    return meas


def _row_hardware(row: Mapping[str, Any], rid: str, notes: list[str]) -> dict[str, Any]:
    """GPU id and architecture, precision recipe and the precision it is priced as, GPU count, topology."""
    gpu_name = str(row.get("gpu") or "").strip()
    gid = gpu_id(gpu_name)
    if gid is None:
        raise InputError(unknown_gpu_message(gpu_name), field=f"{rid}.gpu")
    arch = gpu_arch(gid)
    recipe, prec_how = precision_recipe(row, arch)
    if recipe is None:
        raise _SkipRow(prec_how)
    precision = spec_precision(recipe)
    if precision != recipe:
        notes.append(f"precision {prec_how} -> recipe {recipe}, priced as {precision} (spec does not take {recipe} yet)")
    elif prec_how != str(row.get("precision")):
        notes.append(f"precision {prec_how}")
    n = as_int(row.get("gpu_count"))
    if not n:
        raise _SkipRow("gpu_count not published")
    topo = str(row.get("topology") or topology_of(gid))  # a named cluster (ablations.config_row)
    dom = as_int(row.get("nvlink_domain_gpus"))
    try:
        first = get_topology(topo).levels[0].size
    except InputError:
        raise _SkipRow(f"topology {topo!r} of {gid} not in the catalog") from None
    if dom and first != dom:
        notes.append(f"nvlink_domain_gpus={dom} but topology {topo} has {first} GPUs in its first level")
    return {"gid": gid, "arch": arch, "recipe": recipe, "precision": precision, "n": n, "topo": topo}


def _row_model(row: Mapping[str, Any], rid: str, notes: list[str]) -> dict[str, Any]:
    """The model's fields, from the row's config fields (validation/README.md): never from its name."""
    model_name = str(row.get("model") or rid)
    pattern = row.get("hybrid_override_pattern")
    if as_int(row.get("mamba_layers"), 0) and not pattern:
        raise _SkipRow(f"{model_name}: {row['mamba_layers']} Mamba2 layers (mamba_layers) without their order "
                    "(hybrid_override_pattern): the hybrid model's blocks are not stated")
    missing = [k for k in ("layers", "hidden", "ffn", "heads", "vocab", "seq_len") if row.get(k) in (None, "")]
    if missing:
        raise _SkipRow(f"model dimensions not published ({', '.join(missing)} null)")
    model: dict[str, Any] = dict(
        name=model_name, num_hidden_layers=int(row["layers"]), hidden_size=int(row["hidden"]),
        intermediate_size=int(row["ffn"]), num_attention_heads=int(row["heads"]),
        num_key_value_heads=as_int(row.get("kv_heads"), int(row["heads"])), vocab_size=int(row["vocab"]),
        source=f"modern_runs {rid}")
    model.update(hidden_act=str(row.get("hidden_act") or "silu"),
                 tie_word_embeddings=row_flag(row, "tie_word_embeddings", False))
    if row.get("dropout") is not None:
        model["dropout"] = row_flag(row, "dropout", False)
    if row.get("kv_lora_rank"):  # multi-head latent attention: its dims replace head_dim
        model.update({k: as_int(row.get(k)) for k in MLA_KEYS})
        notes.append("MLA dims from the row (q_lora " + str(row.get("q_lora_rank")) + f", kv_lora {row['kv_lora_rank']}, "
                     f"nope {row.get('qk_nope_head_dim')}, rope {row.get('qk_rope_head_dim')}, v {row.get('v_head_dim')})")
    elif row.get("head_dim"):
        model["head_dim"] = int(row["head_dim"])
    if pattern:  # a hybrid Mamba2 / attention model: its blocks and Mamba2 dimensions (NemotronH names)
        model["hybrid_override_pattern"] = str(pattern)
        model.update({k: int(row[k]) for k in MAMBA_KEYS if row.get(k) is not None})
        notes.append(f"hybrid model: {str(pattern).count('M')} Mamba2, {str(pattern).count('*')} attention blocks")
    if as_int(row.get("mtp_layers"), 0):  # priced on the last stage (ModelSpec.num_nextn_predict_layers)
        model["num_nextn_predict_layers"] = int(row["mtp_layers"])
        notes.append(f"{row['mtp_layers']} multi-token-prediction layer(s) on the last stage")
    if row.get("sliding_window"):
        model.update(sliding_window=int(row["sliding_window"]),
                     sliding_window_layers=float(row.get("sliding_window_layers") or 1.0))
        notes.append(f"sliding window of {row['sliding_window']} tokens on a share "
                     f"{model['sliding_window_layers']:g} of the layers")
    if row_flag(row, "expert_bias", False):
        model["expert_bias"] = True
    if row_flag(row, "qk_layernorm", False):
        model["qk_layernorm"] = True
    if as_int(row.get("learned_position_embeddings"), 0):  # a learned absolute position table (GPT-2/3 style)
        model["learned_position_embeddings"] = int(row["learned_position_embeddings"])
    if row.get("attention_chunk_size"):  # Llama 4 chunked attention on a share of the layers
        model.update(attention_chunk_size=int(row["attention_chunk_size"]),
                     chunked_attention_layers=float(row.get("chunked_attention_layers") or 1.0))
    if row.get("moe_experts"):
        if not row.get("moe_top_k"):
            raise _SkipRow("MoE top-k not published")
        model.update(num_experts=int(row["moe_experts"]), num_experts_per_tok=int(row["moe_top_k"]),
                     moe_intermediate_size=as_int(row.get("moe_ffn"), int(row["ffn"])),
                     num_shared_experts=as_int(row.get("moe_shared_experts"), 0) or 0,
                     first_k_dense_replace=as_int(row.get("first_k_dense"), 0) or 0)
        if row.get("moe_shared_ffn"):  # the shared experts' total width, where not count x moe_ffn
            model["shared_expert_intermediate_size"] = int(row["moe_shared_ffn"])
            model["num_shared_experts"] = model["num_shared_experts"] or 1
        if row.get("moe_ffn") is None:
            notes.append(f"moe_ffn null: experts of ffn = {row['ffn']} (Mixtral-style)")
    return model


def _row_parallel(row: Mapping[str, Any], framework: str, n: int, notes: list[str]) -> dict[str, Any]:
    """The parallel degrees, ZeRO stage, global and micro batch, virtual stages and schedule."""
    layers = int(row["layers"])
    tp, pp = as_int(row.get("tp"), 1), as_int(row.get("pp"), 1)
    cp, ep = as_int(row.get("cp"), 1), as_int(row.get("ep"), 1)
    etp = as_int(row.get("etp"))
    fsdp = bool(row.get("fsdp"))
    dp, why = row_dp(row, n, tp, pp, cp, notes)
    if dp is None:
        raise _SkipRow(why or "")
    recipe_etp = as_int(recipe_facts(row).get("etp")) if framework == "megatron" else None
    if etp is None and recipe_etp is not None and ep > 1:
        etp = recipe_etp
        notes.append(f"etp={etp}: the framework_recipe's expert_tensor_parallel_size")
    if etp is None and ep > 1 and dp % ep and (tp * cp * dp) % ep == 0:
        etp = 1
        notes.append(f"etp not published: ep={ep} does not divide dp={dp}, so the run folds experts over "
                     f"TP/CP ranks (MoE parallel folding); etp=1 as Megatron-Bridge's MoE recipes set")
    zs = as_int(row.get("zero_stage"))
    zero = 3 if fsdp else zs if zs is not None else (1 if framework == "megatron" else 0)
    gbs = global_batch_seqs(row)
    if gbs is None:
        raise _SkipRow("global batch not published")
    mbs = as_int(row.get("micro_batch"))
    if mbs is None:
        other: Mapping[str, Any] = row["other_metrics"] if isinstance(row.get("other_metrics"), Mapping) else {}
        local = as_int(other.get("local_batch_size")) or max(1, gbs // dp)
        if framework == "torchtitan" and as_int(row.get("grad_accum")) in (None, 1):
            mbs = max(1, local // pp)
            notes.append(f"micro_batch: local batch {local}" + (f" in {pp} micro-batches (one per stage)" if pp > 1 else ""))
        else:
            mbs = 1
            notes.append("micro_batch not published: 1")
    vpp = as_int(row.get("vpp_chunks"))
    if vpp is None and row.get("layers_per_virtual_stage"):
        vpp = max(1, layers // pp // int(row["layers_per_virtual_stage"]))
    vpp = vpp or 1
    schedule = "interleaved" if vpp > 1 else "1f1b"
    sp = bool(row["sp"]) if row.get("sp") is not None else tp > 1
    return {"layers": layers, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": etp, "dp": dp, "zero": zero, "gbs": gbs,
            "mbs": mbs, "vpp": vpp, "schedule": schedule, "sp": sp}


def _row_recipe(row: Mapping[str, Any], framework: str, model: Mapping[str, Any], par: Mapping[str, Any],
                notes: list[str]) -> dict[str, Any]:
    """Recompute, overlaps, pipeline layout and token drop: from the row, else from the release's
    Megatron-Bridge recipe."""
    layers, pp, vpp = par["layers"], par["pp"], par["vpp"]
    rc, rc_note, published_rc = recompute_of(row.get("activation_recompute"), layers, pp, vpp)
    if rc is None:
        raise _SkipRow(rc_note or "activation_recompute has no mapping")
    if rc_note:
        notes.append(rc_note)
    mb_recipe = recipe_facts(row) if framework == "megatron" else {}
    # A recompute the row copied from today's recipe ('... HEAD recipe ...') yields to the release's own.
    from_head = "head recipe" in str(row.get("activation_recompute") or "").lower()
    if mb_recipe.get("recompute") and (not published_rc or (from_head and mb_recipe.get("confidence") == "high")):
        rc, published_rc = mb_recipe["recompute"], True
        offloaded = min(int(mb_recipe.get("offload_layers") or 0), layers)
        if offloaded:  # TE activation offloading of the first N layers (--cpu-offloading-num-layers)
            rc = ["offload"] * offloaded + [rc] * (layers - offloaded)
        notes.append(f"recompute {mb_recipe['recompute']}" + (f", activations of {offloaded} layers offloaded"
                     if offloaded else "") + f": the Megatron-Bridge recipe of the release ({mb_recipe['source'][:60]})")
    if not published_rc:
        notes.append("activation_recompute not published: the least recompute that fits, chosen per layer "
                     "by the solver with every published degree fixed")
    tp_ov, ep_ov, ov_notes = overlaps_of(row)
    notes += ov_notes
    if tp_ov is None and "tp_comm_overlap" in mb_recipe:
        tp_ov = bool(mb_recipe["tp_comm_overlap"])
    stage_layers = recipe_stage_layers(layers, pp * vpp, mb_recipe.get("layout"))
    if stage_layers and mb_recipe.get("layout") == "embedding+loss":
        notes.append("embedding and loss counted as pipeline layers (the recipe's account_for_*_in_pipeline_split)")
    elif stage_layers:
        notes.append(f"pipeline layout {mb_recipe['layout']} (the recipe's pipeline_model_parallel_layout; "
                     "its MTP layers priced only from the row's own mtp_layers)")
    if ep_ov is None and "ep_overlap" in mb_recipe:
        ep_ov = bool(mb_recipe["ep_overlap"])
        notes.append(f"ep_overlap={ep_ov}: the Megatron-Bridge recipe of the release")
    capacity = token_drop_of(row) if model.get("num_experts") else None
    if capacity is None and model.get("num_experts") and mb_recipe.get("capacity_factor"):
        capacity = float(mb_recipe["capacity_factor"])
    if capacity is not None:
        notes.append(f"token-drop run: moe_capacity_factor {capacity}, padded to capacity")
    ga = as_int(row.get("grad_accum"))
    if ga is not None and par["dp"] * par["mbs"] * ga != par["gbs"]:
        notes.append(f"grad_accum {ga} x dp {par['dp']} x mbs {par['mbs']} != global batch {par['gbs']}")
    return {"rc": rc, "published_rc": published_rc, "mb_recipe": mb_recipe, "tp_ov": tp_ov, "ep_ov": ep_ov,
            "stage_layers": stage_layers, "capacity": capacity}


def _row_problem_plan(row: Mapping[str, Any], rid: str, framework: str, hw: Mapping[str, Any],
                      model: dict[str, Any], par: Mapping[str, Any], rec: Mapping[str, Any],
                      notes: list[str]) -> tuple[Any, Plan]:
    """The Problem and the Plan of the run (a row that does not convert is skipped with the reason)."""
    mb_recipe = rec["mb_recipe"]
    try:
        problem = load_problem({
            "name": rid, "model": model, "framework": framework,
            "training": {"seq_len": int(row["seq_len"]), "global_batch_size": par["gbs"], "precision": hw["precision"],
                         "optimizer": "adam", "flash_attention": row_flag(row, "flash_attention", True),
                         "launch_blocking": row_flag(row, "launch_blocking", False),
                         "softmax_fusion": row.get("softmax_fusion") or "megatron",
                         "moe_capacity_factor": rec["capacity"],
                         # the router's expert choice as run (validation/README.md): AutoModel's
                         # fake_balanced_gate routes each token to k consecutive experts
                         "moe_routing": row.get("moe_routing") or "spread",
                         # stated per row (validation/README.md): e.g. every Megatron-Bridge performance
                         # recipe runs grad_reduce_in_fp32 false and keeps FP8 primary weights in its FP8
                         # mixed-precision configs (mixed_precision.py fp8_param_gather / fp4_param_gather)
                         "main_grads": row.get("main_grads"),
                         "fp8_params": row_flag(row, "fp8_params", False),
                         # Megatron's output-layer / loss knobs as run (validation/README.md)
                         "attention_mask_in_batch": row_flag(row, "attention_mask_in_batch", False),
                         "cross_entropy_fusion": row_flag(row, "cross_entropy_fusion", False),
                         "defer_embedding_wgrad": row_flag(row, "defer_embedding_wgrad", False),
                         "wgrad_deferral_limit": as_int(row.get("wgrad_deferral_limit"), 0) or 0,
                         "gradient_accumulation_fusion": row_flag(row, "gradient_accumulation_fusion", True),
                         # per-module precision as run (validation/README.md): module classes and
                         # leading / trailing blocks kept in BF16 under a low-precision recipe
                         "bf16_modules": list(row.get("bf16_modules") or []),
                         "bf16_layers_at_start": as_int(row.get("bf16_layers_at_start"), 0) or 0,
                         "bf16_layers_at_end": as_int(row.get("bf16_layers_at_end"), 0) or 0,
                         "mean_document_tokens": as_int(row.get("mean_document_tokens"))},
            "cluster": {"gpu": hw["gid"], "num_gpus": hw["n"], "topology": hw["topo"], "power_cap_w": row.get("power_cap_w")},
        })
        graphs = framework == "megatron" and (cuda_graphs_of(row) or mb_recipe.get("cuda_graphs") == "full_iteration")
        if graphs:
            notes.append("full-iteration CUDA graphs (stated in the row or its recipe): cuda_graphs=True")
        scope = graph_scope_of(row, mb_recipe) if framework == "megatron" and not graphs else []
        if scope:
            notes.append(f"per-layer CUDA graphs of {'+'.join(scope)} (stated in the row or its recipe)")
        dispatcher = ((dispatcher_of_row(row) or mb_recipe.get("dispatcher"))
                      if framework == "megatron" and par["ep"] > 1 else None)
        if dispatcher:
            notes.append(f"expert dispatcher {dispatcher} (stated in the row or its recipe)")
        dp_knobs, dp_notes = dp_knobs_of(row)
        notes += dp_notes
        plan = Plan(tp=par["tp"], pp=par["pp"], dp=par["dp"], cp=par["cp"], ep=par["ep"], etp=par["etp"],
                    vpp=par["vpp"], schedule=par["schedule"], stage_layers=rec["stage_layers"],
                    sequence_parallel=par["sp"], zero_stage=par["zero"], micro_batch_size=par["mbs"],
                    recompute=rec["rc"], tp_comm_overlap=rec["tp_ov"], ep_overlap=rec["ep_ov"], cuda_graphs=graphs,
                    cuda_graph_scope=scope,
                    moe_dispatcher=dispatcher, pipeline_rounds=as_int(row.get("pipeline_rounds"), 1), **dp_knobs)
    except (InputError, ValidationError, ValueError) as exc:
        raise _SkipRow(f"does not convert: {str(exc).splitlines()[0]}") from None
    return problem, plan

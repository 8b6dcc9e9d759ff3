"""A JSON of the JAX mesh and per-tensor PartitionSpecs; the mesh helpers MaxText shares."""

from __future__ import annotations

import math
from typing import Any

from .common import dumps_json
from .context import JAX_AXIS, _Ctx, autoshard_version


def _ici_dcn(axes: list[tuple[str, int]], gpus_per_node: int, ctx: _Ctx) -> dict[str, tuple[int, int]]:
    """Split every axis (innermost first) into (ici, dcn): inner axes fill the node first."""
    room = gpus_per_node
    out: dict[str, tuple[int, int]] = {}
    for name, size in axes:
        if room % size == 0:
            ici = size
        elif size % room == 0:
            ici = room
        else:
            ici = math.gcd(size, room)
            ctx.warn(f"axis {name} (size {size}) straddles node boundaries unevenly with {gpus_per_node} "
                     f"GPUs per node: ici/dcn split {ici}x{size // ici} is approximate")
        out[name] = (ici, size // ici)
        room //= ici
    return out


def _jax_mesh(ctx: _Ctx) -> tuple[dict[str, str], dict[str, int], list[tuple[str, int]]]:
    """(autoshard axis -> JAX axis name, JAX axis name -> size, [(name, size)] innermost first)."""
    p = ctx.plan
    ep = p.ep if ctx.model.is_moe else 1
    if ep > 1 and (ctx.dp % ep or p.expert_tp != p.tp):
        ctx.warn(f"MoE parallel folding (ep={ep}, etp={p.expert_tp}, dp={ctx.dp}) has no single JAX mesh: "
                 "experts are sharded over the data axis only (ep=1 in the mesh): expert all-to-all becomes "
                 "data-axis collectives")
        ep = 1
    dpax = "fsdp" if p.zero_stage == 3 else "data"
    names = {**JAX_AXIS, "dp": dpax}
    sizes = {"tp": p.tp, "cp": p.cp, "ep": ep, "dp": ctx.dp // ep, "pp": p.pp}
    inner_first = [(names[a], sizes[a]) for a in p.axes]
    return names, {n: s for n, s in inner_first}, inner_first


def _shard_dims(name: str, shape: list[int], want: list[Any], axis_size: dict[str, int], ctx: _Ctx) -> list[Any]:
    """`want` (one entry per dimension: None, an axis or a list of axes) made legal for `shape`:
    an axis that does not divide its dimension moves to another dimension it divides (largest
    first; data-like axes only, TP keeps its dimension), else the tensor is replicated over it
    with a warning, so NamedSharding never raises IndivisibleError."""
    dims: list[list[str]] = []
    seen: set[str] = set()
    for spec in want:  # a mesh axis may shard one dimension only (JAX DuplicateSpecError)
        axes = [] if spec is None else ([spec] if isinstance(spec, str) else list(spec))
        dims.append([a for a in axes if axis_size.get(a, 1) > 1 and a not in seen])
        seen.update(dims[-1])
    dropped: list[str] = []
    for d, dim in enumerate(shape):
        while dims[d] and dim % math.prod(axis_size[a] for a in dims[d]):
            dropped.append(dims[d].pop())
    for a in dropped:
        placed = False
        if a != "tensor":
            for d in sorted(range(len(shape)), key=lambda i: -shape[i]):
                if shape[d] % (math.prod(axis_size[x] for x in dims[d]) * axis_size[a]) == 0:
                    dims[d].append(a)
                    placed = True
                    break
        if not placed:
            ctx.warn(f"{name}: no dimension of {shape} is divisible over {a!r} ({axis_size[a]}): replicated "
                     "over it (more memory per device than planned for this tensor)")
    return [None if not axes else (axes[0] if len(axes) == 1 else axes) for axes in dims]


def _tensor_shapes(m) -> dict[str, tuple[list[int], str]]:
    """Per-layer and global tensor shapes: name -> (shape, kind) with kind global | layer | dense | moe."""
    h, hd = m.hidden_size, m.head_size
    out: dict[str, tuple[list[int], str]] = {"embed": ([m.vocab_size, h], "global")}
    if not m.tie_word_embeddings:
        out["lm_head"] = ([h, m.vocab_size], "global")
    out["final_norm"] = ([h], "global")
    if m.is_mla:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank is not None:
            out["wq_a"] = ([h, m.q_lora_rank], "layer")
            out["wq_b"] = ([m.q_lora_rank, m.num_attention_heads * qk], "layer")
        else:
            out["wq"] = ([h, m.num_attention_heads * qk], "layer")
        out["wkv_a"] = ([h, m.kv_lora_rank + m.qk_rope_head_dim], "layer")
        out["wkv_b"] = ([m.kv_lora_rank, m.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim)], "layer")
        out["wo"] = ([m.num_attention_heads * m.v_head_dim, h], "layer")
    else:
        out["wq"] = ([h, m.num_attention_heads * hd], "layer")
        out["wk"] = ([h, m.kv_heads * hd], "layer")
        out["wv"] = ([h, m.kv_heads * hd], "layer")
        out["wo"] = ([m.num_attention_heads * hd, h], "layer")
    out["attention_norm"] = ([h], "layer")
    out["mlp_norm"] = ([h], "layer")
    if m.num_dense_layers:
        out["mlp_gate"] = ([h, m.intermediate_size], "dense")
        out["mlp_up"] = ([h, m.intermediate_size], "dense")
        out["mlp_down"] = ([m.intermediate_size, h], "dense")
    if m.is_moe:
        e, f = m.num_experts, m.expert_ffn
        out["router"] = ([h, e], "moe")
        out["expert_gate"] = ([e, h, f], "moe")
        out["expert_up"] = ([e, h, f], "moe")
        out["expert_down"] = ([e, f, h], "moe")
        if m.num_shared_experts:
            s = m.num_shared_experts * f
            out["shared_gate"] = ([h, s], "moe")
            out["shared_up"] = ([h, s], "moe")
            out["shared_down"] = ([s, h], "moe")
    return out


def _jax(ctx: _Ctx) -> str:
    """A JSON of the device mesh and per-tensor PartitionSpecs (with the real shapes) for plain JAX."""
    p, m, t = ctx.plan, ctx.model, ctx.training
    names, axis_size, inner_first = _jax_mesh(ctx)
    outer_first = inner_first[::-1]
    dpax = names["dp"]
    ep_on = axis_size.get("expert", 1) > 1
    tp = "tensor" if p.tp > 1 else None
    fs = [a for a in ("fsdp" if p.zero_stage == 3 else "", "expert" if p.zero_stage == 3 and ep_on else "") if a]
    fs = fs or None
    exp = "expert" if ep_on else None
    kv_tp = tp if (m.is_mla or m.kv_heads % max(p.tp, 1) == 0) else None

    def want(name: str, shard: Any, expert_shard: Any) -> list[Any]:
        return {
            "embed": [tp, shard], "lm_head": [shard, tp], "final_norm": [None],
            "wq": [shard, tp], "wk": [shard, kv_tp], "wv": [shard, kv_tp], "wo": [tp, shard],
            "wq_a": [shard, None], "wq_b": [None, tp], "wkv_a": [shard, None], "wkv_b": [None, tp],
            "attention_norm": [None], "mlp_norm": [None],
            "mlp_gate": [shard, tp], "mlp_up": [shard, tp], "mlp_down": [tp, shard],
            "router": [shard, None],
            "expert_gate": [exp, expert_shard, tp], "expert_up": [exp, expert_shard, tp],
            "expert_down": [exp, tp, expert_shard],
            "shared_gate": [shard, tp], "shared_up": [shard, tp], "shared_down": [tp, shard],
        }[name]

    shapes = _tensor_shapes(m)
    params = {}
    for name, (shape, kind) in shapes.items():
        spec = _shard_dims(f"params.{name}", shape, want(name, fs, "fsdp" if p.zero_stage == 3 else None),
                           axis_size, ctx)
        params[name] = {"shape": shape, "kind": kind, "spec": spec}
    optimizer = None
    if p.zero_stage in (1, 2):
        opt_axes = [a for a in (dpax, "expert" if ep_on else "") if a]
        optimizer = {}
        for name, (shape, kind) in shapes.items():
            # ZeRO-1/2: optimizer state additionally sharded over the data axes (largest dimension first).
            base = want(name, None, None)
            big = max(range(len(shape)), key=lambda i: shape[i])
            entry = base[big]
            have = [] if entry is None else ([entry] if isinstance(entry, str) else list(entry))
            used = {a for e in base if e is not None for a in ([e] if isinstance(e, str) else e)}
            base[big] = have + [a for a in opt_axes if a not in used]
            spec = _shard_dims(f"optimizer.{name}", shape, base, axis_size, ctx)
            optimizer[name] = {"shape": shape, "kind": kind, "spec": spec}

    batch_axes = [a for a in (dpax, "expert" if ep_on else "") if axis_size.get(a, 1) > 1] or None
    micro_global = p.micro_batch_size * ctx.dp  # sequences per micro-batch over all replicas
    ctxax = "context" if p.cp > 1 else None
    seq_sp = [a for a in ("context" if p.cp > 1 else "", "tensor" if p.sp else "") if a] or None
    hd = m.head_size
    acts_want = {
        "tokens": ([micro_global, t.seq_len], [batch_axes, ctxax]),
        "hidden": ([micro_global, t.seq_len, m.hidden_size], [batch_axes, ctxax, None]),
        "hidden_norm": ([micro_global, t.seq_len, m.hidden_size], [batch_axes, seq_sp, None]),
        "attention_heads": ([micro_global, t.seq_len, m.num_attention_heads, hd], [batch_axes, ctxax, tp, None]),
        "logits": ([micro_global, t.seq_len, m.vocab_size], [batch_axes, ctxax, tp]),
    }
    if m.num_dense_layers:
        acts_want["mlp_hidden"] = ([micro_global, t.seq_len, m.intermediate_size], [batch_axes, ctxax, tp])
    activations = {k: {"shape": s, "spec": _shard_dims(f"activations.{k}", s, w, axis_size, ctx)}
                   for k, (s, w) in acts_want.items()}

    stage_of_layer: list[int] = [0] * m.num_hidden_layers
    for r, layers in enumerate(ctx.rank_layers()):
        for i in layers:
            stage_of_layer[i] = r
    doc: dict[str, Any] = {
        "autoshard": {
            "version": autoshard_version(), "target": "JAX (jax.sharding.Mesh / NamedSharding)",
            "plan": p.short(), "model": m.name, "world_size": ctx.world,
            "axis_map": {a: names[a] for a in ("tp", "cp", "ep", "dp", "pp")},
            "note": "mesh = jax.make_mesh(mesh_shape, axis_names) over devices in rank order (the last axis holds "
                    "consecutive ranks); NamedSharding(mesh, P(*spec)) per tensor. Per-layer tensors are one "
                    "layer's weights: stack the layers of each pipeline stage (layer_stage) on that stage's "
                    "sub-mesh. Activation shapes are per micro-batch over all replicas.",
            "warnings": [],
        },
        "mesh_shape": [size for _, size in outer_first],
        "axis_names": [name for name, _ in outer_first],
        "layer_stage": stage_of_layer,
        "layer_kind": m.layer_kinds(),
        "stage_layers": ctx.stages,
        "params": params,
    }
    if optimizer is not None:
        doc["optimizer_state"] = optimizer
    doc["activations"] = activations
    doc["autoshard"]["warnings"] = list(ctx.warnings)
    return dumps_json(doc) + "\n"

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
        if ctx.fmt != "jax":  # (the JAX export lays experts out on a finer mesh: `_folded_mesh`)
            ctx.warn(f"MoE parallel folding (ep={ep}, etp={p.expert_tp}, dp={ctx.dp}) has no {ctx.fmt} mesh: the "
                     "mesh gets no expert axis (ep=1), so expert weights are not split over experts: up to "
                     f"{ep * p.expert_tp // math.gcd(ep * p.expert_tp, p.tp)}x the planned expert weights per GPU, "
                     "and the expert all-to-all becomes data-axis collectives")
        ep = 1
    dpax = "fsdp" if p.zero_stage == 3 else "data"
    names = {**JAX_AXIS, "dp": dpax}
    sizes = {"tp": p.tp, "cp": p.cp, "ep": ep, "dp": ctx.dp // ep, "pp": p.pp}
    inner_first = [(names[a], sizes[a]) for a in p.axes]
    return names, {n: s for n, s in inner_first}, inner_first


EXPERT_AXES = (("etp", "expert_tensor"), ("ep", "expert"), ("edp", "expert_data"))


def _folded_mesh(ctx: _Ctx, names: dict[str, str]) -> tuple[list[tuple[str, int]], dict[str, list[str]]] | None:
    """The mesh of a MoE parallel folding plan (ep > 1 with etp != tp or ep not dividing dp): the
    coarsest refinement of both factorizations of each pipeline stage's ranks, the attention one in
    placement order (tp, cp, dp: innermost first) and Megatron's expert one (etp x ep x edp, etp
    innermost; topology._expert_groups), with the stage axis where the placement puts pp. Returns
    ([(mesh axis, size)] innermost first, logical axis -> its mesh axes outermost first) with logical
    axes tp / cp / dp / pp and etp / ep / edp; None where the two factorizations do not nest (the
    boundaries of one fall inside an axis of the other at a non-dividing point)."""
    p = ctx.plan
    sizes = {"tp": p.tp, "cp": p.cp, "ep": 1, "dp": ctx.dp, "pp": p.pp}
    order = [a for a in p.axes if a != "pp"]
    before_pp = math.prod(sizes[a] for a in p.axes[:p.axes.index("pp")])
    stage = math.prod(sizes[a] for a in order)
    etp, ep = p.expert_tp, p.ep
    if stage % (etp * ep):
        return None
    attn = [(a, sizes[a]) for a in order if sizes[a] > 1]
    expert = [(a, n) for (a, _), n in zip(EXPERT_AXES, (etp, ep, stage // (etp * ep))) if n > 1]

    def bounds(axes: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
        out, lo = [], 1
        for a, n in axes:
            out.append((a, lo, lo * n))
            lo *= n
        return out

    a_b, e_b = bounds(attn), bounds(expert)
    cuts = sorted({1, stage, *(hi for _, _, hi in a_b), *(hi for _, _, hi in e_b)}
                  | ({before_pp} if before_pp < stage else set()))
    if any(hi % lo for lo, hi in zip(cuts, cuts[1:])):
        return None

    def owner(b: list[tuple[str, int, int]], lo: int, hi: int) -> str:
        return next(a for a, x, y in b if x <= lo and hi <= y)

    pieces = []  # (attention axis, expert axis, size), innermost first
    for lo, hi in zip(cuts, cuts[1:]):
        pieces.append((owner(a_b, lo, hi), owner(e_b, lo, hi), hi // lo, lo))
    whole = {a: sum(1 for x in pieces if x[0] == a) == 1 for a, _ in attn}
    inner_first: list[tuple[str, int]] = []
    logical: dict[str, list[str]] = {k: [] for k in ("tp", "cp", "dp", "pp", "etp", "ep", "edp")}
    for a, e, n, lo in pieces:
        if lo == before_pp and p.pp > 1:
            inner_first.append((names["pp"], p.pp))
        name = names[a] if whole[a] else f"{names[a]}_{e}"
        inner_first.append((name, n))
        logical[a].insert(0, name)  # outermost first
        logical[e].insert(0, name)
    if p.pp > 1 and before_pp >= stage:
        inner_first.append((names["pp"], p.pp))
    if p.pp > 1:
        logical["pp"] = [names["pp"]]
    return inner_first, logical


def _shard_dims(name: str, shape: list[int], want: list[Any], axis_size: dict[str, int], ctx: _Ctx,
                pinned: frozenset[str] = frozenset({"tensor"})) -> list[Any]:
    """`want` (one entry per dimension: None, an axis or a list of axes) made legal for `shape`:
    an axis that does not divide its dimension moves to another dimension it divides (largest
    first; data-like axes only: the `pinned` (tensor-parallel) axes keep their dimension), else the
    tensor is replicated over it with a warning, so NamedSharding never raises IndivisibleError."""
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
        if a not in pinned:
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


def _optimizer_specs(shapes: dict[str, tuple[list[int], str]], want: Any, edp: list[str], dense_shard: list[str],
                     axis_size: dict[str, int], ctx: _Ctx, pinned: frozenset[str]) -> dict[str, Any]:
    """ZeRO-1/2: each tensor's optimizer state is its weight's spec (`want(name)`) additionally sharded
    over the data axes on its largest dimension; expert weights over their expert-data-parallel ranks
    (`edp`, Megatron's distributed optimizer), dense ones over `dense_shard`."""
    optimizer = {}
    for name, (shape, kind) in shapes.items():
        opt_axes = [a for a in (edp if name.startswith("expert_") else dense_shard) if axis_size.get(a, 1) > 1]
        base = want(name)
        big = max(range(len(shape)), key=lambda i: shape[i])
        entry = base[big]
        have = [] if entry is None else ([entry] if isinstance(entry, str) else list(entry))
        used = {a for e in base if e is not None for a in ([e] if isinstance(e, str) else e)}
        base[big] = have + [a for a in opt_axes if a not in used]
        spec = _shard_dims(f"optimizer.{name}", shape, base, axis_size, ctx, pinned)
        optimizer[name] = {"shape": shape, "kind": kind, "spec": spec}
    return optimizer


def _jax(ctx: _Ctx) -> str:
    """A JSON of the device mesh and per-tensor PartitionSpecs (with the real shapes) for plain JAX."""
    p, m, t = ctx.plan, ctx.model, ctx.training
    names, axis_size, inner_first = _jax_mesh(ctx)
    if p.zero_stage == 3 and p.dp_replicate > 1:
        ctx.warn(f"dp_replicate {p.dp_replicate}: the specs shard the ZeRO-3 states over the whole fsdp axis "
                 f"({ctx.dp} ranks), not over groups of {ctx.dp // p.dp_replicate}")
    ep_on = axis_size.get("expert", 1) > 1
    live = [a for a, n in inner_first if n > 1]
    # logical axis -> its mesh axes, outermost first (a PartitionSpec entry shards over them in that order)
    logical: dict[str, list[str]] = {k: [names[k]] if names[k] in live else [] for k in ("tp", "cp", "dp", "pp", "ep")}
    # experts: etp = tp, ep its own axis, edp = the rest of the stage's ranks (data and context)
    logical.update(etp=logical["tp"], edp=logical["dp"] + logical["cp"])
    folded = m.is_moe and p.ep > 1 and not ep_on
    if folded and (fm := _folded_mesh(ctx, names)) is not None:
        # MoE parallel folding: experts over etp x ep x edp of each stage's ranks, as Megatron lays them out
        inner_first, logical = fm
        axis_size = dict(inner_first)
    elif folded:
        ctx.warn(f"MoE parallel folding (ep={p.ep}, etp={p.expert_tp}, tp={p.tp}, dp={ctx.dp}): the expert grid "
                 "etp x ep x edp does not nest with the attention axes in one mesh: expert weights are sharded "
                 f"over the tensor axis only ({p.ep * p.expert_tp // math.gcd(p.ep * p.expert_tp, p.tp)}x the planned "
                 "expert weights per GPU)")
    outer_first = inner_first[::-1]

    def ax(axes: list[str]) -> Any:
        axes = [a for a in axes if axis_size.get(a, 1) > 1]
        return None if not axes else (axes[0] if len(axes) == 1 else list(axes))

    tp, etp = ax(logical["tp"]), ax(logical["etp"])
    # ZeRO / FSDP shards dense weights over the data-parallel and context-parallel ranks (Megatron's
    # dp x cp group; cost.layers prices the all-gathers over it), expert weights over edp
    data, edp = logical["dp"], logical["edp"]
    dense_shard = data + (logical["ep"] if ep_on else []) + logical["cp"]
    fs = ax(dense_shard) if p.zero_stage == 3 else None
    exp = ax(logical["ep"]) if (ep_on or folded) else None
    exp_fs = ax(edp) if p.zero_stage == 3 else None
    kv_tp = tp if (m.is_mla or m.kv_heads % max(p.tp, 1) == 0) else None
    pinned = frozenset(logical["tp"]) | frozenset(logical["etp"])

    def want(name: str, shard: Any, expert_shard: Any) -> list[Any]:
        return {
            "embed": [tp, shard], "lm_head": [shard, tp], "final_norm": [None],
            "wq": [shard, tp], "wk": [shard, kv_tp], "wv": [shard, kv_tp], "wo": [tp, shard],
            "wq_a": [shard, None], "wq_b": [None, tp], "wkv_a": [shard, None], "wkv_b": [None, tp],
            "attention_norm": [None], "mlp_norm": [None],
            "mlp_gate": [shard, tp], "mlp_up": [shard, tp], "mlp_down": [tp, shard],
            "router": [shard, None],
            "expert_gate": [exp, expert_shard, etp], "expert_up": [exp, expert_shard, etp],
            "expert_down": [exp, etp, expert_shard],
            "shared_gate": [shard, tp], "shared_up": [shard, tp], "shared_down": [tp, shard],
        }[name]

    shapes = _tensor_shapes(m)
    params = {}
    for name, (shape, kind) in shapes.items():
        spec = _shard_dims(f"params.{name}", shape, want(name, fs, exp_fs), axis_size, ctx, pinned)
        params[name] = {"shape": shape, "kind": kind, "spec": spec}
    optimizer = (_optimizer_specs(shapes, lambda n: want(n, None, None), edp, dense_shard, axis_size, ctx, pinned)
                 if p.zero_stage in (1, 2) else None)

    batch_axes = ax(data + (logical["ep"] if ep_on else []))
    micro_global = p.micro_batch_size * ctx.dp  # sequences per micro-batch over all replicas
    ctxax = ax(logical["cp"])
    seq_sp = ax(logical["cp"] + (logical["tp"] if p.sp else []))
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
            "axis_map": {a: [x for x in logical[a] if axis_size.get(x, 1) > 1]
                         for a in ("tp", "cp", "ep", "dp", "pp", "etp", "edp")},
            "note": "mesh = jax.make_mesh(mesh_shape, axis_names) over devices in rank order (the last axis holds "
                    "consecutive ranks); NamedSharding(mesh, P(*spec)) per tensor. axis_map: each parallel "
                    "degree's mesh axes, outermost first (expert weights: etp x ep x edp; under MoE parallel "
                    "folding they split the attention axes). Per-layer tensors are one layer's weights: stack "
                    "the layers of each pipeline stage (layer_stage) on that stage's sub-mesh. Activation "
                    "shapes are per micro-batch over all replicas.",
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

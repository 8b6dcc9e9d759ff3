"""Recompute layouts: which per-layer recompute lists a framework can actually run.

The cost model prices any recompute mode per layer, but launchers say less:

- `per_layer`: any list (a custom stack; `search: {recompute_layout: per_layer}`).
- `uniform`: one mode for every layer (torchtitan's full / per-op selective, DeepSpeed's
  --checkpoint-activations, MaxText's remat_policy, AutoModel's activation_checkpointing).
- `block`: Megatron-LM. One mode for every layer (none, selective, recompute modules, full), or
  `--recompute-granularity full --recompute-method block --recompute-num-layers K`: full recompute
  of the first K layers of every virtual stage, none on the rest (granularity is global: no
  selective beside it). A stage of fewer than K layers recomputes all of them.

The solver plans only what the layout allows (`StageModel`'s pattern constraints, and
`project` for the greedy warm start), so the exported flags are the plan that was priced.
Activation offloading (`offload`, TE --cpu-offloading-num-layers) stays per layer.
"""

from __future__ import annotations

from ..cost import Context

LAYOUTS = ("per_layer", "uniform", "block")


def recompute_layout(ctx: Context) -> str:
    """The layout the solver plans in: the framework's, unless `search.recompute_layout` says
    per_layer."""
    if ctx.problem.search.recompute_layout == "per_layer":
        return "per_layer"
    return ctx.framework.recompute_layout


def _chunks(split: list[int], recompute: list[str]) -> list[list[str]]:
    out, a = [], 0
    for n in split:
        out.append(list(recompute[a:a + n]))
        a += n
    return out


def block_layers(split: list[int], recompute: list[str]) -> int | None:
    """K where `recompute` is Megatron's block pattern over the virtual stages `split` (the first
    min(K, size) layers of each stage full, the rest none; K >= 1), else None."""
    chunks = _chunks(split, recompute)
    if not all(set(c) <= {"full", "none"} for c in chunks) or "full" not in recompute:
        return None
    k = max(c.count("full") for c in chunks)
    for c in chunks:
        if c != ["full"] * min(k, len(c)) + ["none"] * (len(c) - min(k, len(c))):
            return None
    return k


def expressible(layout: str, split: list[int], recompute: list[str]) -> bool:
    """Whether a launcher with `layout` runs this per-layer recompute over the stages `split`."""
    modes = {m for m in recompute if m != "offload"}
    if layout == "per_layer" or len(modes) <= 1:
        return True
    if layout == "block":
        core = ["none" if m == "offload" else m for m in recompute]
        return block_layers(split, core) is not None
    return False


def project(layout: str, split: list[int], recompute: list[str], act_bytes) -> list[list[str]]:
    """Expressible recompute lists that keep at least the memory `recompute` frees: candidates for
    the caller to price (the cheapest that fits wins). `act_bytes(i, mode)` is the activation
    memory layer i keeps under `mode`. The list itself where it is expressible."""
    if expressible(layout, split, recompute):
        return [list(recompute)]
    n = len(recompute)
    used = sorted({m for m in recompute if m != "offload"}, key=lambda m: sum(act_bytes(i, m) for i in range(n)))
    keep = ["offload" if m == "offload" else None for m in recompute]
    out = []
    # One mode everywhere: the leanest mode the list uses (every layer keeps no more than before).
    lean = used[0]
    out.append([k or lean for k in keep])
    if layout == "block":
        # Full recompute on the first K layers of every stage, K = the most layers any stage recomputes.
        chunks = _chunks(split, recompute)
        k = max(sum(m not in ("none", "offload") for m in c) for c in chunks)
        if k:
            block = []
            for c in chunks:
                block += ["full"] * min(k, len(c)) + ["none"] * (len(c) - min(k, len(c)))
            out.append([kk or b for kk, b in zip(keep, block)])
    return out

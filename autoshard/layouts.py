"""Recompute layouts: which per-layer recompute lists a framework can actually run.

The cost model prices any recompute mode per layer, but launchers say less:

- `per_layer`: any list (a custom stack; `search: {recompute_layout: per_layer}`).
- `uniform`: one mode for every layer (torchtitan's full / per-op selective, DeepSpeed's
  --checkpoint-activations, MaxText's remat_policy, AutoModel's activation_checkpointing).
- `every_nth`: torchtitan. One mode for every layer, or `mode = "selective"` with
  `selective_ac_option = N`: full recompute of every Nth block a rank wraps (a counter over its
  blocks in order, its virtual stages in order), none on the rest.
- `block`: Megatron-LM (megatron-core 0.16.1). One mode for every layer (none; selective, i.e.
  `--recompute-granularity selective` with `--recompute-modules`, which apply to every layer; full,
  i.e. `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`), or
  `--recompute-granularity full --recompute-method block --recompute-num-layers K`: full recompute
  of the first K layers of every virtual stage (`TransformerBlock._checkpointed_forward` counts the
  layers of each model chunk from 0), none on the rest (granularity is global: no selective beside
  it). A stage of fewer than K layers recomputes all of them. Activation offloading
  (`--cpu-offloading --cpu-offloading-num-layers N`: Transformer Engine offloads the first N layers)
  only alone: TransformerConfig refuses it beside any recompute granularity and with PP > 1, and
  asks N < num_layers (`megatron_recompute` / `megatron_reason`).

The solver plans only what the layout allows (`StageModel`'s pattern constraints, and
`project` for the greedy warm start), `evaluate` flags a plan whose list its framework cannot run
(`cost.config_reasons` via `layout_reason`), and the Megatron export writes `megatron_recompute`'s
flags or refuses: the exported flags are the plan that was priced. Outside Megatron, activation
offloading stays per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from .spec import RECOMPUTES

if TYPE_CHECKING:  # (cost imports this module's predicates: no import cycle at run time)
    from .cost import Context

LAYOUTS = ("per_layer", "uniform", "block", "every_nth")


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


def rank_modes(split: list[int], recompute: list[str], pp: int) -> list[list[str]]:
    """Per pipeline rank, the modes of its layers in the order it wraps them (its virtual stages in
    order: virtual stage c runs on rank c mod pp)."""
    out: list[list[str]] = [[] for _ in range(pp)]
    for c, chunk in enumerate(_chunks(split, recompute)):
        out[c % pp] += chunk
    return out


def every_nth_layers(split: list[int], recompute: list[str], pp: int) -> int | None:
    """N where `recompute` is torchtitan's every-Nth pattern (on each rank, block j of the blocks it
    wraps is full iff (j + 1) % N == 0, the rest none; N >= 2), else None."""
    ranks = rank_modes(split, recompute, pp)
    if not set(recompute) <= {"full", "none"} or "full" not in recompute:
        return None
    n = min(r.index("full") + 1 for r in ranks if "full" in r)
    ok = n >= 2 and all((m == "full") == ((j + 1) % n == 0) for r in ranks for j, m in enumerate(r))
    return n if ok else None


@dataclass(frozen=True)
class MegatronRecompute:
    """Megatron-LM's recompute settings (TransformerConfig fields, flags `--recompute-*`,
    `--cpu-offloading*`): granularity None | "selective" | "full"; method "uniform" | "block" (full);
    num_layers (full); modules (selective, in every layer); offload_layers N (the first N layers)."""

    granularity: str | None = None
    method: str | None = None
    num_layers: int | None = None
    modules: tuple[str, ...] = ()
    offload_layers: int = 0


def _modules(mode: str) -> tuple[str, ...]:
    return ("core_attn",) if mode == "selective" else tuple(mode.split("+"))


def megatron_recompute(split: list[int], recompute: list[str], pp: int = 1) -> MegatronRecompute | None:
    """The Megatron settings that run exactly `recompute` over the virtual stages `split` of a `pp`-rank
    pipeline, or None where Megatron has none (`megatron_reason` says why)."""
    kinds = set(recompute)
    n = len(recompute)
    if "offload" in kinds:
        k = recompute.count("offload")
        if kinds == {"offload", "none"} and len(split) == 1 and pp == 1 and recompute[:k] == ["offload"] * k:
            return MegatronRecompute(offload_layers=k)
        return None
    if kinds == {"none"} or not n:
        return MegatronRecompute()
    if kinds == {"full"}:
        return MegatronRecompute("full", "uniform", 1)
    if len(kinds) == 1:
        (mode,) = kinds
        return MegatronRecompute("selective", modules=_modules(mode))
    if kinds == {"full", "none"} and (blocks := block_layers(split, recompute)) is not None:
        return MegatronRecompute("full", "block", blocks)
    return None


def megatron_reason(split: list[int], recompute: list[str], pp: int = 1) -> str | None:
    """Why Megatron-LM cannot run this per-layer recompute list (None where `megatron_recompute` can)."""
    if megatron_recompute(split, recompute, pp) is not None:
        return None
    kinds = set(recompute)
    if "offload" in kinds:
        k = recompute.count("offload")
        if len(split) > 1 or pp > 1:
            return (f"activation offloading of {k} layers with pp={pp}: Megatron's TransformerConfig has no CPU "
                    "offloading with pipeline parallelism")
        if kinds != {"offload", "none"}:
            return ("activation offloading beside recompute: Megatron's TransformerConfig refuses CPU offloading "
                    "with any recompute granularity")
        return (f"activation offloading of {k} of {len(recompute)} layers: Megatron (--cpu-offloading-num-layers) "
                f"offloads the first N layers, fewer than all")
    if "full" in kinds and kinds != {"full", "none"}:
        return (f"full recompute beside {' / '.join(sorted(kinds - {'full', 'none'}))}: Megatron's recompute "
                "granularity (full or selective) is one for the whole model")
    if "full" not in kinds:
        return (f"recompute {' / '.join(sorted(kinds))} on different layers: Megatron's selective recompute "
                "modules apply to every layer")
    per_stage = [c.count("full") for c in _chunks(split, recompute)]
    return ("full recompute on layers that are not the first K of every virtual stage (full layers per stage: "
            f"{','.join(map(str, per_stage))}): Megatron's --recompute-method block recomputes the first "
            "--recompute-num-layers layers of each, uniform all of them")


def expressible(layout: str, split: list[int], recompute: list[str], pp: int = 1) -> bool:
    """Whether a launcher with `layout` runs this per-layer recompute over the stages `split` (of a
    pipeline of `pp` ranks)."""
    if layout == "block":
        return megatron_recompute(split, recompute, pp) is not None
    modes = {m for m in recompute if m != "offload"}
    if layout == "per_layer" or len(modes) <= 1:
        return True
    core = ["none" if m == "offload" else m for m in recompute]
    if layout == "every_nth":
        return every_nth_layers(split, core, pp) is not None
    return False


LAUNCHER_OF = {"block": "Megatron-LM", "every_nth": "torchtitan", "uniform": "the framework's launcher"}


def layout_reason(layout: str, split: list[int], recompute: list[str], pp: int = 1) -> str | None:
    """Why a launcher with `layout` cannot run this per-layer recompute list, or None where it can: the
    one predicate `evaluate` (cost.config_reasons), the solver (`expressible`) and the exports share."""
    if expressible(layout, split, recompute, pp):
        return None
    if layout == "block":
        return megatron_reason(split, recompute, pp)
    if layout == "every_nth":
        return ("per-layer recompute is not torchtitan's pattern: one mode for every layer, or full recompute of "
                "every Nth block each rank wraps (selective_ac_option N)")
    return "per-layer recompute differs between layers: the launcher runs one mode for every layer"


def every_nth_list(split: list[int], pp: int, n: int) -> list[str]:
    """The per-layer list of torchtitan's every-Nth-block checkpointing over `split`."""
    counters, out = [0] * pp, []
    for c, size in enumerate(split):
        for _ in range(size):
            counters[c % pp] += 1
            out.append("full" if counters[c % pp] % n == 0 else "none")
    return out


def project(layout: str, split: list[int], recompute: list[str], act_bytes, pp: int = 1) -> list[list[str]]:
    """Expressible recompute lists that keep at least the memory `recompute` frees: candidates for
    the caller to price (the cheapest that fits wins). `act_bytes(i, mode)` is the activation
    memory layer i keeps under `mode`. The list itself where it is expressible."""
    if expressible(layout, split, recompute, pp):
        return [list(recompute)]
    n = len(recompute)
    used = sorted({m for m in recompute if m != "offload"}, key=lambda m: sum(act_bytes(i, m) for i in range(n)))
    keep = ["offload" if m == "offload" else None for m in recompute]
    out = []
    # One mode everywhere: the leanest mode the list uses (every layer keeps no more than before).
    lean = used[0] if used else "none"
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
    if layout == "block" and "offload" in recompute:
        # Megatron offloads only alone: the same number of layers offloaded first, none recomputed
        k = recompute.count("offload")
        out.append(["offload"] * k + ["none"] * (n - k))
        out.append(["full" if m == "offload" else m for m in out[0]])  # (full keeps less than offload)
    if layout == "every_nth" and "offload" not in recompute:
        # Every Nth block of each rank, N the largest that recomputes as many blocks as the rank did.
        ranks = rank_modes(split, recompute, pp)
        need = [(len(r), sum(m != "none" for m in r)) for r in ranks]
        n = min((size // k for size, k in need if k), default=0)
        if n >= 2:
            out.append(every_nth_list(split, pp, n))
    return [c for c in out if expressible(layout, split, c, pp)]


def planned_modes(ctx: Context) -> list[str]:
    """The recompute modes the solver plans where `search: recompute` is not given: none, selective,
    full, and the framework's recompute-module sets (Megatron) whose modules the model has: moe_act and
    moe need experts, mla_up_proj MLA, mlp a dense layer, shared_experts shared experts."""
    m = ctx.model
    has = {"core_attn": True, "layernorm": True, "mlp": m.num_dense_layers > 0, "mlp_up": m.num_dense_layers > 0,
           "moe": m.is_moe,
           "moe_act": m.is_moe, "mla_up_proj": m.is_mla, "shared_experts": m.is_moe and m.num_shared_experts > 0}
    sets = [s for s in ctx.framework.planned_recompute_modules if all(has.get(x, False) for x in s.split("+"))]
    return list(RECOMPUTES) + sets


def search_modes(problem, ctx: Context) -> list[str]:
    """The recompute modes a solve plans: `planned_modes`, or those `search: recompute` names, the
    built-in modes first."""
    modes = list(dict.fromkeys(problem.search.allowed("recompute", planned_modes(ctx))))
    return [r for r in RECOMPUTES if r in modes] + [r for r in modes if r not in RECOMPUTES]

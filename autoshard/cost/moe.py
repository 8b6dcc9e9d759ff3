"""Mixture-of-experts terms: load imbalance, routed tokens, host time, and the expert-parallel overlap
(when it runs, what it refuses, when it pays)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

from .context import Config, Context, ep_overlap_refusals, num_microbatches
from .kernels import Shapes
from .table import Cost


def moe_imbalance(ctx: Context, cfg: Config) -> float:
    """Routed tokens on the busiest expert-parallel rank over the mean: the problem's imbalance,
    evened out by EPLB's redundant experts (assumed linear up to one redundant expert per EP rank,
    the layout DeepSeek-V3 deploys: 32 redundant experts on EP32, report sec. 3.4)."""
    if ctx.training.moe_capacity_factor is not None:  # dropped above, padded up to the capacity
        return ctx.training.moe_capacity_factor
    imb = ctx.training.moe_load_imbalance
    if imb <= 1.0 or cfg.ep <= 1:
        return 1.0
    return 1.0 + (imb - 1.0) * max(0.0, 1.0 - ctx.training.moe_redundant_experts / cfg.ep)


def dispatcher_of(ctx: Context, cfg: Config) -> str:
    """The expert dispatcher a plan runs: its own choice, else the framework's default."""
    return cfg.dispatcher or ctx.framework.moe_dispatchers[0]


def moe_host_s(ctx: Context, cfg: Config) -> float:
    """Exposed host time of one dropless MoE layer and micro-batch, forward + backward (a third in the
    forward, two thirds in the backward). Megatron's dispatcher brings the per-expert token counts to
    the CPU (a device-to-host sync that empties the GPU's queue: `moe_layer_host_s`), and Transformer
    Engine's GroupedLinear then works expert by expert from the host (host-side m_splits, a split, a
    quantization and a cuBLAS GEMM per local expert, forward and backward: `moe_expert_host_s` each),
    so the layer's host time grows with the experts each GPU holds, E / ep (with EPLB's redundant
    copies). Larger EP therefore cuts host time as well as memory. Dropping and padding to a capacity
    (`training.moe_capacity_factor`) fixes every count in advance: no sync (token_dispatcher.py
    `drop_and_pad`: cuda_sync_point "no_sync"), the per-expert work stays. Full-iteration CUDA graphs
    (`cuda_graphs`) replay the step without the host: none. Per-layer graphs (`cuda_graph_scope`) keep
    the per-expert term: graphs of the router and preprocessing alone (moe_router, moe_preprocess)
    leave the experts eager and the host still waits for the token counts the graph produced
    (transformer_layer.py _forward_mlp_partial_cudagraphs at d98e8a64dd: the sync stays too); a graph of
    the whole drop-and-pad MoE block (moe, layer) replays the per-expert split, quantization and GEMM
    kernels as they are, and the rows do not separate that term's host share from its per-kernel GPU
    share: priced without it, the two Megatron-Bridge 25.09 Qwen3-30B token-drop rows that ran
    whole-layer graphs go from -9% / +26% to -29% / -39% (LOSO 7.1% -> 7.2% median, 21.7% -> 22.9% p90),
    so the term stays, a conservative price (the per-layer graph then removes the counted launches
    only, `captured_launches`)."""
    fw = ctx.framework
    if cfg.cuda_graphs or not (fw.moe_layer_host_s or fw.moe_expert_host_s):
        return 0.0
    m = ctx.model
    local = m.num_experts / cfg.ep * (1 + ctx.training.moe_redundant_experts / m.num_experts)
    sync = fw.moe_layer_host_s if ctx.training.moe_capacity_factor is None else 0.0
    return sync + fw.moe_expert_host_s * local


def ep_overlap_host_s(ctx: Context, cfg: Config, c: Cost, host_s: float) -> float:
    """Host time the EP overlap exposes beyond `moe_host_s`, per MoE layer and micro-batch. Without
    the overlap the CPU stalls at the forward's token-count sync (`moe_host_s`) but runs ahead through
    the backward, which has no sync, and its launches hide under queued GPU work. Megatron's overlap
    schedule runs one micro-batch's forward beside another's backward layer by layer
    (model_chunk_schedule_plan.py), so every layer's backward launches now come after a forward sync
    (token_dispatcher.py `d2h_event.synchronize()`): the layer takes the longer of its GPU work (with
    the exposed host time) and its whole host launch work, `ep_overlap_host_factor` x `moe_host_s`
    (frameworks.yaml). Comm-bound layers (EP across nodes, H100) hide it; fast GPUs with many local
    experts at micro-batch 1 do not, which is why Megatron-Bridge turned the overlap off on B200 and
    B300 (PR #1760 "Disable moe_a2a_overlap due to CPU overhead", issue #3399). Dropping to a capacity
    has no sync: nothing more."""
    factor = ctx.framework.ep_overlap_host_factor
    if not factor or ctx.training.moe_capacity_factor is not None:
        return 0.0
    gpu_s = sum(c.fwd.values()) + sum(c.bwd.values()) - c.fwd["host"] - c.bwd["host"]
    return max(0.0, factor * host_s - gpu_s - host_s)


def routed_tokens(ctx: Context, cfg: Config, sh: Shapes) -> float:
    """Routed token copies one GPU's experts see per micro-batch: with SP each GPU routes T / tp
    tokens and an ETP group gathers the copies of its etp members (without SP the TP ranks share
    tokens); the busiest EP rank gets `moe_imbalance` times the mean."""
    k, etp, t = sh.m.num_experts_per_tok, cfg.expert_tp, cfg.tp
    return sh.tokens * k * (etp / t if cfg.sp or etp < t else 1.0) * moe_imbalance(ctx, cfg)


@functools.lru_cache(maxsize=256)
def contiguous_reach(experts: int, k: int, ep: int, units: tuple[int, ...]) -> tuple[float, tuple[float, ...]]:
    """(EP ranks, units of each size in `units`) that one token's k experts reach on average under
    `contiguous` routing: token i gets experts (i k + j) mod E, j < k, and EP rank r holds the
    E / ep consecutive experts from r E / ep (AutoModel's ExpertParallel shards the expert dimension:
    local_expert_indices_offset = ep_rank x num_local_experts). The start offsets i k mod E repeat
    every E / gcd(E, k) tokens, each as often. A unit of u ranks holds u consecutive EP ranks (the
    members of one NVLink domain). DeepSeek-V3 on EP64 (E 256, k 8, 4 experts a rank): 2 ranks, 1
    8-rank node; Qwen3-30B-A3B on EP8 (E 128, k 8, 16 a rank): 1 rank."""
    period = experts // math.gcd(experts, k)
    ranks_sum, unit_sums = 0, [0] * len(units)
    for i in range(period):
        ranks = {((i * k + j) % experts) * ep // experts for j in range(k)}
        ranks_sum += len(ranks)
        for n, u in enumerate(units):
            unit_sums[n] += len({r // u for r in ranks})
    return ranks_sum / period, tuple(x / period for x in unit_sums)


def contiguous_shares(ctx: Context, cfg: Config, members: tuple[int, ...], dedup: bool) -> tuple[float, ...] | None:
    """The share of a token's k dispatched copies each level carries (`topology.all_to_all_s`
    `shares`) under `training.moe_routing` `contiguous`; None under `spread`. The destinations are
    balanced, so a sender's own rank or unit is one of them as often as any other: of the ranks a
    token reaches, (m0 - 1) / g lie in the sender's first-level domain besides itself, and of the
    units of u ranks, 1 - u / g are remote. A deduplicating dispatcher (DeepEP, HybridEP: one copy per
    destination rank over NVLink and one per destination node over the scale-out network) sends that
    many; the all-to-all dispatcher sends every copy (k), so its shares are the spread ones."""
    if ctx.training.moe_routing != "contiguous" or not dedup:
        return None
    m, g = ctx.model, cfg.ep
    k = m.num_experts_per_tok
    units = tuple(members[:-1])
    ranks, unit_counts = contiguous_reach(m.num_experts, k, g, units)
    shares = [ranks * (members[0] - 1) / g / k]
    shares += [n * (1 - u / g) / k for n, u in zip(unit_counts, units)]
    return tuple(shares)


def ep_overlap_allowed(ep: int, pp: int, vpp: int, microbatches: int) -> bool:
    """Megatron's conditions on the EP overlap's degrees: EP > 1, PP = 1 or interleaved, and at least
    two micro-batches to pair (the framework must run it too: `ep_overlap_on`)."""
    return ep > 1 and (pp == 1 or vpp >= 2) and microbatches >= 2


def ep_overlap_on(ctx: Context, cfg: Config) -> bool:
    """Whether expert all-to-all overlaps computation (Megatron `--overlap-moe-expert-parallel-comm`
    with `--delay-wgrad-compute`): asked for or left to a framework that runs it, within
    `ep_overlap_allowed`; DualPipeV pairs forward and backward chunks by itself."""
    if cfg.ep == 1 or cfg.ep_overlap is False:
        return False
    if cfg.schedule in ("dualpipe", "dualpipev"):  # the schedule pairs forward and backward chunks: a2a hides
        return True
    return ctx.framework.ep_overlap and ep_overlap_allowed(cfg.ep, cfg.pp, cfg.vpp, num_microbatches(ctx.problem, cfg))


def no_ep_overlap(cfg: Config) -> Config:
    """cfg's twin with the EP overlap off (how `evaluate` prices a plan beside a recompute mode the
    framework refuses the overlap with)."""
    return dataclasses.replace(cfg, ep_overlap=False)


def ep_overlap_blocked(ctx: Context, modes: Iterable[str]) -> bool:
    """Whether the framework refuses the EP overlap beside any of these recompute modes."""
    return bool(ep_overlap_refusals(ctx.framework, modes))


def priced_config(ctx: Context, cfg: Config, modes: Iterable[str]) -> Config:
    """cfg as `evaluate` prices a plan whose layers use `modes`: an EP overlap left open (None) is
    off where the framework refuses it beside one of them (the launcher runs without it)."""
    if cfg.ep_overlap is None and ctx.model.is_moe and ep_overlap_blocked(ctx, modes):
        return no_ep_overlap(cfg)
    return cfg


def ep_overlap_pays(ctx: Context, cfg: Config, layers: dict) -> bool:
    """Whether a plan that leaves the EP overlap open (`ep_overlap` None) runs it: where Megatron
    allows it (`ep_overlap_on`) and it does not make the MoE layer slower than running without it
    (it can, where the host launch work it exposes outweighs the all-to-all it hides:
    `ep_overlap_host_s`), as Megatron-Bridge's recipes turn it on for communication-bound systems
    and off for CPU-bound ones. A plan that names it (True / False) gets what it names. `layers`:
    the plan's layer costs with the overlap on (`shared_costs`, which records the answer in
    `Table.memo["ep_overlap"]`)."""
    if not ep_overlap_on(ctx, cfg):
        return False
    if cfg.ep_overlap is not None or cfg.schedule in ("dualpipe", "dualpipev") or "moe" not in ctx.model.layer_kinds():
        return True
    return layers[("moe", "none")].ep_overlap_gain_s >= 0.0  # = the layer is no slower with it than without

"""A step from the layer table: per-rank totals, the pipeline schedule, the data-parallel tail, peak
memory, and `evaluate`."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..spec import Plan, Problem
from ..topology import Level, Profile, all_gather_s, all_reduce_s, reduce_scatter_s, shard_profiles
from .constants import BF16, GIB, OPT_TRAFFIC_BYTES, RESERVE_GIB, TIME_KEYS, overlapped
from .context import (
    Config,
    Context,
    config_reasons,
    context,
    layout_split,
    reshard_policy,
    with_modes,
    zero3_step_sync,
)
from .dualpipe import Replay, dualpipe_time
from .kernels import Shapes, unfused_softmax_reason
from .layers import Cost, Table, layer_table
from .moe import ep_overlap_on, no_ep_overlap, priced_config
from .params import (
    FLOP_CONVENTION,
    gathered_weight_bytes,
    lora_fraction,
    model_flops_per_step,
    model_flops_per_token_parts,
    param_bytes,
    zero3_bytes_per_param,
    zero3_gathered_for,
)
from ..loader import load_plan, load_problem
from .intervals import with_interval


@dataclass
class RankTotals:
    fwd: dict[str, float]
    bwd: dict[str, float]
    wgrad_s: float
    act_bytes: float
    params: float
    expert_params: float
    hfu_flops: float
    base_flops: float
    layers: int
    kinds: dict[str, int]
    recompute: dict[str, int]

    @property
    def time_s(self) -> float:
        return sum(self.fwd.values()) + sum(self.bwd.values())


def distinct_objects(objs: Sequence[Any], first_index: int = 0) -> tuple[list[Any], list[int]]:
    """(the distinct objects of `objs` by identity, in order of first appearance; per entry its index
    among them, counted from `first_index`): figures built once per distinct object, gathered per entry
    (`rank_totals`, the bounds)."""
    index: dict[int, int] = {}
    distinct: list[Any] = []
    at: list[int] = []
    for x in objs:
        j = index.get(id(x))
        if j is None:
            j = index[id(x)] = len(distinct) + first_index
            distinct.append(x)
        at.append(j)
    return distinct, at


def rank_totals(table: Table, chunks_of_rank: list[list[tuple[str, str]]], first: bool, last: bool) -> RankTotals:
    """Sum the table over the (kind, recompute) of every layer in each chunk of one rank."""
    tot = RankTotals({}, {}, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, {}, {})
    pieces: list[Cost] = []
    for chunk in chunks_of_rank:
        for kind, rc in chunk:
            pieces.append(table.layers[(kind, rc)])
            tot.kinds[kind] = tot.kinds.get(kind, 0) + 1
            tot.recompute[rc] = tot.recompute.get(rc, 0) + 1
        tot.layers += len(chunk)
    if first:
        pieces.append(table.embed)
    if last:
        pieces.append(table.head)
    # Every field summed over the pieces in order from 0.0, left to right: a running sum down each column
    # (np.cumsum: sequential, the same additions as adding piece by piece) of one row per distinct piece,
    # after a row of zeros.
    distinct, at = distinct_objects(pieces, first_index=1)
    rows = [[0.0] * (2 * len(TIME_KEYS) + 6)] + [
        [*map(c.fwd.__getitem__, TIME_KEYS), *map(c.bwd.__getitem__, TIME_KEYS), c.wgrad_s, c.act_bytes, c.params,
         c.expert_params, c.hfu_flops, c.base_flops] for c in distinct]
    sums = np.cumsum(np.array(rows)[[0, *at]], axis=0)[-1].tolist()
    n = len(TIME_KEYS)
    tot.fwd, tot.bwd = dict(zip(TIME_KEYS, sums[:n])), dict(zip(TIME_KEYS, sums[n:2 * n]))
    tot.wgrad_s, tot.act_bytes, tot.params, tot.expert_params, tot.hfu_flops, tot.base_flops = sums[2 * n:]
    fwd, bwd = tot.fwd, tot.bwd
    # Pipeline sends: each chunk sends forward activations and receives gradients once per micro-batch.
    n_chunks = len(chunks_of_rank)
    sends = n_chunks - (1 if last else 0)
    recvs = n_chunks - (1 if first else 0)
    fwd["pp_comm"] += table.pp_p2p_s * sends
    bwd["pp_comm"] += table.pp_p2p_s * recvs
    return tot


def round_count(cfg: Config, microbatches: int) -> int:
    """Pipeline schedules a step runs (Plan.pipeline_rounds; `config_reasons` checks that they divide the
    micro-batches): 1 without pipeline parallelism or under DualPipe, whose replay runs one schedule."""
    if cfg.pp == 1 or cfg.schedule in ("dualpipe", "dualpipev"):
        return 1
    return max(1, min(cfg.rounds, microbatches))


def inflight_microbatches(cfg: Config, rank: int, microbatches: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak (in units of the
    rank's full set of layers)."""
    p, m = cfg.pp, microbatches
    if cfg.schedule == "gpipe":
        return float(m)
    if cfg.schedule == "interleaved":
        pairs = min(m * cfg.vpp, (p - rank - 1) * 2 + (cfg.vpp - 1) * p + 1)
        return pairs / cfg.vpp
    if cfg.schedule == "dualpipev":  # PP + 1 half-rank chunks on every rank (DualPipe README table)
        return min(float(m), p + 0.5)
    if cfg.schedule == "dualpipe":  # PP + 1 stages' worth on every rank, which holds two stages (README)
        return min(float(m), p + 1.0) / 2
    return float(min(m, p - rank))


@functools.lru_cache(maxsize=4096)
def interleaved_windows(pp: int, vpp: int, rank: int, microbatches: int) -> tuple[tuple[int, ...], ...]:
    """The forwards of each local chunk a rank holds in flight, at every step of Megatron's interleaved
    1F1B (pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving, microbatch group
    size = pp): forward k runs local chunk (k mod pp*vpp) // pp, backward k chunk vpp - 1 - that; the rank
    runs (pp - rank - 1) * 2 + (vpp - 1) * pp warm-up forwards, then one forward and one backward per
    step. Distinct count vectors (one entry per local chunk), measured after each step's forward: with
    uneven chunks (an embedding- or loss-only virtual stage) the peak is not an even share of the chunks."""
    total = microbatches * vpp
    warm = min(total, (pp - rank - 1) * 2 + (vpp - 1) * pp)

    def chunk(k: int, forward: bool) -> int:
        c = (k % (pp * vpp)) // pp
        return c if forward else vpp - 1 - c
    counts = [0] * vpp
    for k in range(warm):
        counts[chunk(k, True)] += 1
    seen = {tuple(counts)}
    # (steady state: over pp * vpp steps every local chunk gets pp forwards and pp backwards, so the
    # counts after step j + pp * vpp are those after step j; one period holds every distinct vector)
    for j in range(min(total - warm, pp * vpp)):
        counts[chunk(warm + j, True)] += 1
        seen.add(tuple(counts))
        counts[chunk(j, False)] -= 1
    return tuple(sorted(seen))


def interleaved_activation_bytes(windows: tuple[tuple[int, ...], ...], chunk_act: list[float]) -> float:
    """The largest in-flight activation total over the schedule's windows (`interleaved_windows`): per
    window sum_j w_j a_j, added left to right (every window at once, a column at a time)."""
    counts = _window_counts(windows)
    total = counts[:, 0] * chunk_act[0]
    for j in range(1, counts.shape[1]):
        total += counts[:, j] * chunk_act[j]
    return float(total.max())


@functools.lru_cache(maxsize=4096)
def _window_counts(windows: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """The windows as a read-only float array, one row each (`interleaved_activation_bytes`)."""
    out = np.array(windows, dtype=np.float64)
    out.flags.writeable = False
    return out


def static_bytes(ctx: Context, cfg: Config, params: float, expert_params: float) -> dict[str, float]:
    """Weights, gradients and optimizer states of one GPU under the ZeRO stage."""
    dense = params - expert_params
    dp_dense, dp_exp = cfg.shard_dense, cfg.shard_expert  # dp x cp and edp, over dp_replicate replicas
    w_b, g_b, opt_b = param_bytes(ctx)

    def shard(nbytes_per_param: float, sharded: bool) -> float:
        if not sharded:
            return nbytes_per_param * params
        return nbytes_per_param * (dense / dp_dense + expert_params / dp_exp)

    weights = shard(w_b, cfg.zero >= 3)
    weights += shard(ctx.weight_copy_bytes_per_param, cfg.zero >= 3)  # fp8/fp4 copies the framework keeps
    out = {
        "weights": weights,
        "gradients": shard(g_b, cfg.zero >= 2),
        "optimizer_states": 0.0 if cfg.opt_offload else shard(opt_b, cfg.zero >= 1),
    }
    if cfg.zero >= 3 and cfg.data_parallel and (kept := gathered_kept_bytes(ctx, cfg, params, expert_params)):
        out["gathered_kept"] = kept
    if zero3_step_sync(ctx.framework, cfg):
        # the unsharded gradients accumulated over the micro-batches, in the reduction dtype
        # (FSDPParam.to_accumulated_grad_if_needed upcasts bf16 gradients to reduce_dtype)
        out["unsharded_gradients"] = ctx.framework.grad_reduce_bytes * params
    return out


def gathered_kept_bytes(ctx: Context, cfg: Config, params: float, expert_params: float) -> float:
    """Gathered weights a ZeRO-3 / FSDP rank keeps from its layers' forward to their backward
    (`reshard_policy`): none ("always": freed after each layer's forward); all of them at the gathered
    dtype ("never": FSDP2 reshard_after_forward=False holds every layer's unsharded parameters until
    its backward); 1/N of them (a secondary shard over N ranks: FSDP2 reshard_after_forward=N, ZeRO++
    hpZ). Linear in the parameters (the solver's memory rows). The two layers gathered at a time
    (`zero3_gathered_for`) stay beside it: in the backward they are the layer's and the next one's
    unsharded gradients before their reduce-scatter."""
    policy = reshard_policy(ctx.framework, cfg)
    if policy == "always":
        return 0.0
    gw = zero3_bytes_per_param(ctx)[0]
    dense = params - expert_params
    if policy == "never":
        return gw * params
    return gw * (dense / min(int(policy), cfg.shard_dense) + expert_params / min(int(policy), cfg.shard_expert))


@functools.lru_cache(maxsize=4096)
def affine(fn, levels: tuple[Level, ...], prof) -> tuple[float, float]:
    """(seconds per byte, seconds) of a collective: time = slope * bytes + intercept.

    Every collective cost is affine in the message size for a fixed group (bandwidth
    terms scale, latency does not); evaluate and the solver both price the data-parallel
    tail through this form so they agree exactly.
    """
    if prof.size <= 1:
        return 0.0, 0.0
    t1, t2 = fn(levels, prof, 1e9), fn(levels, prof, 2e9)
    slope = (t2 - t1) / 1e9
    return slope, t1 - slope * 1e9


@dataclass(frozen=True)
class TailModel:
    """Affine forms of the data-parallel tail of one rank (see `dp_tail`)."""

    reduce: tuple[float, float, float]  # (s per dense param, s per expert param, s) gradient reduction
    gather: tuple[float, float, float]  # parameter all-gather after the optimizer (ZeRO-1/2)
    optimizer_s_per_param: float  # optimizer step, per parameter held (before sharding)
    reduce_repeats: int  # 1, or the micro-batch count under ZeRO-2
    overlap_reduce: bool = True  # gradient reduction under the last backward (overlap_grad_reduce)
    overlap_gather: bool = True  # parameter all-gather under the next forward (overlap_param_gather)


def tail_model(ctx: Context, table: "Table") -> TailModel:
    cfg, pl = table.cfg, table.placement
    opt_b = OPT_TRAFFIC_BYTES if ctx.training.optimizer in ("adam", "adamw") else OPT_TRAFFIC_BYTES * 2 / 3
    d_in, d_out = shard_profiles(pl.dp_cp, cfg.shard_dense, cfg.dp_replicate)
    e_in, e_out = shard_profiles(pl.edp, cfg.shard_expert, cfg.dp_replicate)
    step_sync = zero3_step_sync(ctx.framework, cfg)
    # (a ZeRO-3 step reduced once after the last backward: priced as ZeRO-1's tail, `zero3_step_sync`)
    tm = _tail_model(ctx.levels, d_in, e_in, 1 if step_sync else cfg.zero, cfg.shard_dense, ctx.model.is_moe,
                     table.microbatches if cfg.zero == 2 else 1, opt_b, ctx.hbm_bytes_per_s,
                     ctx.framework.grad_reduce_bytes, gathered_weight_bytes(ctx), d_out, e_out)
    if ctx.training.finetune != "full":  # only the adapters are reduced, gathered and stepped
        f = lora_fraction(ctx.model, ctx.training.lora_rank)
        tm = dataclasses.replace(tm, reduce=(tm.reduce[0] * f, tm.reduce[1] * f, tm.reduce[2]),
                                 gather=(tm.gather[0] * f, tm.gather[1] * f, tm.gather[2]),
                                 optimizer_s_per_param=tm.optimizer_s_per_param * f)
    if cfg.opt_offload:
        # Gradients go down to the host and updated bf16 weights come back over the host link; the
        # CPU's Adam reads and writes ~28 B per parameter (fp32 weight, gradient, two moments) at the
        # host memory bandwidth of the GPU's share. Both on the step's critical path.
        shard = 1.0 / cfg.shard_dense if cfg.zero >= 1 else 1.0
        fw, gpu = ctx.framework, ctx.gpu
        per = shard * ((fw.grad_bytes + BF16) / gpu.host_link_bytes_per_s + 28.0 / gpu.host_memory_bytes_per_s)
        tm = dataclasses.replace(tm, optimizer_s_per_param=per)
    if step_sync:
        # the reduce-scatter after the last backward, exposed; the weights gathered under the first
        # forward where they stay gathered for the step ("never"), else per layer (`layer_costs`)
        keep = reshard_policy(ctx.framework, cfg) == "never"
        return dataclasses.replace(tm, gather=tm.gather if keep else (0.0, 0.0, 0.0), overlap_reduce=False)
    grad, param = dp_overlaps(ctx, cfg)
    if grad and param:
        return tm
    return dataclasses.replace(tm, overlap_reduce=grad, overlap_gather=param)


def dp_overlaps(ctx: Context, cfg: Config) -> tuple[bool, bool]:
    """(gradient reduction under the backward, ZeRO-1/2 parameter all-gather under the next forward)
    as the plan asks for them (overlap_grad_reduce, overlap_param_gather) and the framework's engine
    runs them: DeepSpeed's pipeline engine reduces after the last micro-batch and its ZeRO-1/2 gathers
    at the end of the optimizer step (frameworks.yaml)."""
    fw = ctx.framework
    grad = cfg.grad_overlap and (fw.pipeline_grad_reduce_overlap if cfg.pp > 1 else fw.grad_reduce_overlap)
    return grad, cfg.param_overlap and fw.param_gather_overlap


def dp_overlaps_refused(ctx: Context, cfg: Config) -> tuple[bool, bool]:
    """(gradient reduction, ZeRO-1/2 parameter gather) that the plan asks to overlap and the framework's
    engine runs exposed instead (`dp_overlaps`), where the step has such a tail at all: weights
    replicated over data-parallel ranks (`Config.data_parallel`, experts' edp included) below ZeRO-3."""
    if cfg.zero >= 3 or not cfg.data_parallel:
        return False, False
    grad, param = dp_overlaps(ctx, cfg)
    return cfg.grad_overlap and not grad, cfg.param_overlap and not param and cfg.zero in (1, 2)


@functools.lru_cache(maxsize=4096)
def _tail_model(lv: tuple[Level, ...], dp_cp, edp, zero: int, dpc: int, has_experts: bool, repeats: int,
                opt_b: float, hbm_bytes_per_s: float, grad_b: float = BF16, gather_b: float = BF16,
                dp_rep: Profile | None = None, edp_rep: Profile | None = None) -> TailModel:
    """`dp_cp` / `edp` are the groups the states shard over; under hierarchical sharding (`dp_rep`,
    `edp_rep`: one rank per shard group) each rank's gradient shard is then all-reduced across them."""
    none = (0.0, 0.0, 0.0)
    reduce = gather = none
    if (dpc > 1 or edp.size > 1 or dp_rep is not None) and zero < 3:
        op = all_reduce_s if zero == 0 else reduce_scatter_s
        (sd, cd), (se, ce) = affine(op, lv, dp_cp), affine(op, lv, edp)
        if dp_rep is not None:  # the shard's all-reduce across the replicas
            (rd, rc) = affine(all_reduce_s, lv, dp_rep)
            sd, cd = sd + rd / dp_cp.size, cd + rc
        if edp_rep is not None:
            (re_, rce) = affine(all_reduce_s, lv, edp_rep)
            se, ce = se + re_ / edp.size, ce + rce
        reduce = (grad_b * sd, grad_b * se, cd + (ce if has_experts else 0.0))
        if zero in (1, 2):
            (sd, cd), (se, ce) = affine(all_gather_s, lv, dp_cp), affine(all_gather_s, lv, edp)
            gather = (gather_b * sd, gather_b * se, cd + (ce if has_experts else 0.0))
    shard = 1.0 / dpc if zero >= 1 else 1.0
    return TailModel(reduce, gather, opt_b * shard / hbm_bytes_per_s, repeats)


def dp_tail_s(tm: TailModel, params: float, expert_params: float, fwd_s: float, bwd_s: float) -> tuple[float, float]:
    """(exposed data-parallel communication, optimizer step) of a rank holding `params`
    (of which `expert_params`) with forward / backward windows `fwd_s` / `bwd_s` (see `dp_tail`)."""
    dense = params - expert_params
    red = tm.reduce[0] * dense + tm.reduce[1] * expert_params + tm.reduce[2] if any(tm.reduce) else 0.0
    gat = tm.gather[0] * dense + tm.gather[1] * expert_params + tm.gather[2] if any(tm.gather) else 0.0
    exposed = tm.reduce_repeats * (overlapped(red, bwd_s) if tm.overlap_reduce else red) \
        + (overlapped(gat, fwd_s) if tm.overlap_gather else gat)
    return exposed, tm.optimizer_s_per_param * params


def dp_tail(tm: TailModel, tot: "RankTotals") -> dict[str, float]:
    """Exposed data-parallel communication and the optimizer step of one rank.

    Gradient buckets reduce under the backward of the last micro-batch (overlap-grad-reduce):
    only what exceeds that backward is exposed; under ZeRO-2 this happens after every
    micro-batch. ZeRO-1/2 all-gather updated parameters under the next forward
    (overlap-param-gather). ZeRO-3 traffic is priced per layer instead.
    """
    exposed, optimizer = dp_tail_s(tm, tot.params, tot.expert_params, sum(tot.fwd.values()), sum(tot.bwd.values()))
    return {"dp_comm": exposed, "optimizer": optimizer}


WORKING_BYTES_KEY = ("working bytes of the layers",)  # `Table.memo` entry: (largest work_bytes, largest held_bytes)


def working_bytes(table: "Table", last: bool, first: bool = False) -> float:
    """Transient memory of a rank: the largest layer's full activations (its backward
    working set), or the last stage's logits if larger; on a rank that loads data (the first and
    the last stage) the batch's attention masks beside it (the embedding's `work_bytes`); and the
    buffers held for the whole run per distinct piece (`Cost.held_bytes`: the largest layer's, the
    head's on the last stage)."""
    got = table.memo.get(WORKING_BYTES_KEY)  # (of the layers alone: memoized with them, `Table.memo`)
    if got is None:
        got = table.memo[WORKING_BYTES_KEY] = (max(c.work_bytes for c in table.layers.values()),
                                               max(c.held_bytes for c in table.layers.values()))
    layer, held_layer = got
    work = max(layer, table.head.work_bytes) if last else layer
    held = held_layer + (table.head.held_bytes if last else 0.0)
    return work + held + (table.embed.work_bytes if first or last else 0.0)


def pipeline_time(cfg: Config, microbatches: int, t: list[float], w: list[float], chunk_t: list[float],
                  b: list[float] | None = None) -> float:
    """Time from the first forward to the last backward across the pipeline.

    t_p: one micro-batch through all layers of rank p, forward and backward; M micro-batches.
    - 1F1B / GPipe: (M - 1) max t + sum t (warm-up and cool-down through every stage once);
      for P equal stages (M + P - 1) t.
    - interleaved (vpp chunks per rank): M max t + (P - 1) max chunk time: the bubble shrinks
      by vpp for equal chunks, and a lopsided chunk split pays for its largest chunk.
    - zero-bubble (ZB-H1): weight-gradient work w fills the bubbles: M max t + (P - 1) max u,
      u = t - w; for equal stages the bubble is (P - 1)(t - w) as in Qi et al. 2023, and an
      uneven split pays for its slowest stage.
    - DualPipeV (two half-rank chunks per rank in a V, `b` the backward per rank): M max t +
      (P - 1) max (F&B + B - 3W) of a chunk, F&B (a forward and a backward chunk overlapped) = t / 2,
      B = b / 2, W = w / 2: the DualPipe README's bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2P stages.
    - DualPipe (bidirectional: rank r holds stage r of one direction and stage P-1-r of the other,
      and each micro-batch passes one of them; t, b, w sum both stages): M max t / 2 +
      (P/2 - 1) max (F&B + B - 3W) with F&B = t / 2, B = b / 2, W = w / 2 per stage: the README's
      bubble with PP = P ranks (DeepSeek-V3 report Table 2). `evaluate` replays DualPipe's code
      instead (`dualpipe_replay`); this closed form is its value for equal chunks with B = 2F, W = F.
    """
    tmax = max(t)
    if cfg.schedule == "dualpipe":
        bb = b or [x / 1.5 for x in t]
        bubble = max(max(0.0, (x + y - 3 * z) / 2) for x, y, z in zip(t, bb, w))
        return microbatches * tmax / 2 + (cfg.pp / 2 - 1) * bubble
    if cfg.schedule == "dualpipev":
        bb = b or [x / 1.5 for x in t]
        bubble = max(max(0.0, (x + y - 3 * z) / 2) for x, y, z in zip(t, bb, w))
        return microbatches * tmax + (cfg.pp - 1) * bubble
    if cfg.schedule == "zero_bubble":
        u = [a - b for a, b in zip(t, w)]
        return microbatches * tmax + (cfg.pp - 1) * max(u)
    if cfg.schedule == "interleaved":
        return microbatches * tmax + (cfg.pp - 1) * max(chunk_t)
    return (microbatches - 1) * tmax + sum(t)


def deferred_exposed_s(cfg: Config, deferred_s: float, b: list[float], head_rank: int) -> float:
    """What the head rank's deferred work (`Cost.deferred_s`: Megatron's deferred output-layer weight
    gradients, run after its last backward and before its gradient sync) adds to the pipeline: the
    other ranks still run their cool-down then, one backward of a virtual stage each in turn (1F1B: a
    rank's whole backward `b`; interleaved: b / vpp), so only what exceeds that cool-down shows."""
    if deferred_s <= 0.0:
        return 0.0
    cooldown = sum(x for r, x in enumerate(b) if r != head_rank) / cfg.vpp
    return max(0.0, deferred_s - cooldown)


def chunk_times(table: "Table", chunks: list[list[tuple[str, str]]]) -> list[float]:
    """Forward + backward time of one micro-batch through each virtual stage, in order."""
    out = []
    each = {key: table.layers[key].total_s for key in {key for chunk in chunks for key in chunk}}
    for c, chunk in enumerate(chunks):
        t = sum(each[key] for key in chunk)
        t += table.embed.total_s if c == 0 else 0.0
        t += table.head.total_s if c == len(chunks) - 1 else 0.0
        t += table.pp_p2p_s * ((c < len(chunks) - 1) + (c > 0))
        out.append(t)
    return out


class StageEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)
    rank: int
    layers: int
    dense_layers: int
    moe_layers: int
    recompute: dict[str, int]
    has_embedding: bool
    has_lm_head: bool
    forward_s: float
    backward_s: float
    inflight_microbatches: float
    memory_gib: dict[str, float]
    peak_memory_gib: float


class FlopBudget(BaseModel):
    """The training FLOP budget of a plan: FLOPs per token (model, under `convention`, and the
    hardware's with recompute), per step, and over `tokens` (None: `training.tokens` not given)."""

    model_config = ConfigDict(frozen=True)
    convention: str
    matmul_params: float  # N: the matmul weights a token passes through
    flops_per_param_per_token: int  # 6 (full training) or 4 (frozen LoRA weights)
    weight_flops_per_token: float  # 6 N (the "6 N T" rule's term)
    attention_flops_per_token: float
    model_flops_per_token: float  # weight + attention terms: what MFU counts
    recompute_factor: float  # executed / model FLOPs (>= 1): what HFU counts over MFU
    hardware_flops_per_token: float
    model_flops_per_step: float
    tokens: float | None = None
    steps: int | None = None  # ceil(tokens / tokens per step)
    weight_flops: float | None = None  # 6 N T
    model_flops: float | None = None  # model FLOPs per token x T
    hardware_flops: float | None = None
    compute_days: float | None = None  # steps x step time, no failures or restarts
    gpu_hours: float | None = None


def flop_budget(problem: Problem, recompute_factor: float, step_time_s: float, num_gpus: int) -> FlopBudget:
    """The FLOP budget (FlopBudget) of a run with `training.tokens` (totals) or without (per token)."""
    per_n, n, attn = model_flops_per_token_parts(problem)
    per_token = per_n * n + attn
    t = problem.training
    out: dict[str, Any] = dict(
        convention=FLOP_CONVENTION, matmul_params=float(n), flops_per_param_per_token=per_n,
        weight_flops_per_token=float(per_n * n), attention_flops_per_token=float(attn),
        model_flops_per_token=float(per_token), recompute_factor=recompute_factor,
        hardware_flops_per_token=recompute_factor * per_token, model_flops_per_step=model_flops_per_step(problem))
    if t.tokens is not None:
        steps = math.ceil(t.tokens / t.tokens_per_step)
        out.update(tokens=t.tokens, steps=steps, weight_flops=per_n * n * t.tokens, model_flops=per_token * t.tokens,
                   hardware_flops=recompute_factor * per_token * t.tokens,
                   compute_days=steps * step_time_s / 86400, gpu_hours=steps * step_time_s * num_gpus / 3600)
    return FlopBudget(**out)


class Estimate(BaseModel):
    """What a plan costs. `fits` is False with every reason when the plan is invalid or
    does not fit in HBM; times are per training step."""

    model_config = ConfigDict(frozen=True)
    fits: bool
    reasons: list[str]
    warnings: list[str] = []
    plan: Plan
    step_time_s: float
    tokens_per_s: float
    mfu: float
    hfu: float
    model_tflops_per_gpu: float
    num_microbatches: int
    peak_memory_gib: float
    memory_capacity_gib: float
    time_breakdown_s: dict[str, float]
    memory_breakdown_gib: dict[str, float]
    stages: list[StageEstimate]
    bottleneck: str
    # predicted step time x the 10th/90th percentile of measured/predicted of the validation runs of its
    # regime (autoshard/cost/intervals.py, autoshard/data/intervals.yaml); None: no step time
    step_time_interval_s: tuple[float, float] | None = None
    # The training FLOP budget (None for an invalid plan); its totals need `training.tokens`.
    flop_budget: FlopBudget | None = None


def invalid_estimate(plan: Plan, reasons: Sequence[str], ctx: Context | None) -> Estimate:
    cap = ctx.capacity_bytes / GIB if ctx else 0.0
    zero_mem = {"weights": 0.0, "gradients": 0.0, "optimizer_states": 0.0, "activations": 0.0}
    return Estimate(fits=False, reasons=list(reasons), plan=plan, step_time_s=0.0, tokens_per_s=0.0, mfu=0.0,
                    hfu=0.0, model_tflops_per_gpu=0.0, num_microbatches=0, peak_memory_gib=0.0,
                    memory_capacity_gib=cap, time_breakdown_s={}, memory_breakdown_gib=zero_mem,
                    stages=[], bottleneck="invalid plan")


def chunk_rank(c: int, pp: int, v_shape: bool = False) -> int:
    """The rank holding virtual stage c: round robin (interleaved), or a V (DualPipeV: rank r holds
    stages r and 2P-1-r, so rank 0 holds the embedding and the loss)."""
    if v_shape and c >= pp:
        return 2 * pp - 1 - c
    return c % pp


def assign_layers(kinds: list[str], recompute: list[str], stage_layers: list[int], pp: int,
                  v_shape: bool = False, mirrored: bool = False) -> list[list[list[tuple[str, str]]]]:
    """Per rank, its chunks, each a list of (kind, recompute) in layer order. `mirrored` (DualPipe):
    stage c also lives on rank P-1-c, the first stage of the other direction's pipeline."""
    ranks: list[list[list[tuple[str, str]]]] = [[] for _ in range(pp)]
    start = 0
    for c, n in enumerate(stage_layers):
        chunk = list(zip(kinds[start:start + n], recompute[start:start + n]))
        ranks[chunk_rank(c, pp, v_shape)].append(chunk)
        if mirrored:
            ranks[pp - 1 - c].append(chunk)
        start += n
    return ranks


def dualpipe_replay(ctx: Context, table: Table, stage_layers: list[int], recompute: list[str]) -> Replay:
    """DualPipe's step replayed as `DualPipe.step` runs it (`cost.dualpipe`): pairs priced by `table`
    (the all-to-all under the other chunk), chunks run alone by the same configuration without the EP
    overlap (nothing to hide the all-to-all under)."""
    kinds, cfg = ctx.model.layer_kinds(), table.cfg
    stages, start = [], 0
    for n in stage_layers:
        stages.append(list(zip(kinds[start:start + n], recompute[start:start + n])))
        start += n
    alone = layer_table(ctx, no_ep_overlap(cfg)) if ep_overlap_on(ctx, cfg) else table
    return dualpipe_time(table, alone, stages)


def assemble(ctx: Context, table: Table, stage_layers: list[int], recompute: list[str], plan: Plan,
             warnings: list[str]) -> Estimate:
    cfg, M = table.cfg, table.microbatches
    kinds = ctx.model.layer_kinds()
    v = cfg.schedule == "dualpipev"
    bidir = cfg.schedule == "dualpipe"  # ranks 0 and P-1 both hold the embedding and the head
    head_rank = 0 if v else cfg.pp - 1
    per_rank = assign_layers(kinds, recompute, stage_layers, cfg.pp, v, bidir)
    ends = (0, cfg.pp - 1) if bidir else (0,)
    tots = [rank_totals(table, chunks, r in ends, r == head_rank or (bidir and r == 0))
            for r, chunks in enumerate(per_rank)]
    t = [x.time_s for x in tots]
    w = [x.wgrad_s for x in tots]
    b = [sum(x.bwd.values()) for x in tots]
    ordered = [] if bidir else [per_rank[chunk_rank(c, cfg.pp, v)][c // cfg.pp] for c in range(cfg.pp * cfg.vpp)]
    replay = dualpipe_replay(ctx, table, stage_layers, recompute) if bidir else None
    # pipeline_rounds: the micro-batches run as that many schedules, each filling and draining the pipeline
    rounds = round_count(cfg, M)
    t_pipe = replay.makespan_s if replay else rounds * pipeline_time(cfg, M // rounds, t, w, chunk_times(table, ordered), b)
    t_pipe += deferred_exposed_s(cfg, table.head.deferred_s, b, head_rank)
    tm = tail_model(ctx, table)
    tails = [dp_tail(tm, x) for x in tots]
    tail_tot = [sum(x.values()) for x in tails]
    step = t_pipe + max(tail_tot)

    # Memory per rank.
    stages: list[StageEstimate] = []
    reasons: list[str] = []
    cap = ctx.capacity_bytes
    for r, x in enumerate(tots):
        mem = static_bytes(ctx, cfg, x.params, x.expert_params)
        infl = inflight_microbatches(cfg, r, M // rounds)
        mem["activations"] = x.act_bytes * infl
        if cfg.schedule == "interleaved":  # never below the even share the solver's bounds price
            acts = [sum(table.layers[piece].act_bytes for piece in chunk) for chunk in per_rank[r]]
            acts[0] += table.embed.act_bytes if r == 0 else 0.0
            acts[-1] += table.head.act_bytes if r == head_rank else 0.0
            mem["activations"] = max(mem["activations"],
                                     interleaved_activation_bytes(interleaved_windows(cfg.pp, cfg.vpp, r, M // rounds), acts))
        mem["working"] = working_bytes(table, r == head_rank or (bidir and r == 0), r in ends)
        if cfg.zero == 3 and cfg.data_parallel:
            mem["zero3_gathered"] = zero3_gathered_for(ctx, cfg, table.layers.values())
        peak = sum(mem.values())
        gib = {k: v / GIB for k, v in mem.items()}
        stages.append(StageEstimate(
            rank=r, layers=x.layers, dense_layers=x.kinds.get("dense", 0), moe_layers=x.kinds.get("moe", 0),
            recompute=x.recompute, has_embedding=r in ends, has_lm_head=r == head_rank or (bidir and r == 0),
            forward_s=sum(x.fwd.values()), backward_s=sum(x.bwd.values()), inflight_microbatches=infl,
            memory_gib=gib, peak_memory_gib=peak / GIB))
        if peak > cap:
            alloc = f", over {note}" if (note := ctx.framework.allocator_note()) else ""
            reasons.append(f"stage {r} needs {peak / GIB:.1f} GiB of {cap / GIB:.1f} GiB usable "
                           f"({ctx.gpu.hbm_gib:g} GiB HBM less {RESERVE_GIB:g} GiB reserve{alloc})")
    peak_stage = max(stages, key=lambda s: s.peak_memory_gib)

    # Breakdown along the critical path: the slowest rank's steady state, the bubble, the tail.
    slow = max(range(cfg.pp), key=lambda r: t[r])
    per_mb = 0.5 if bidir else 1.0  # DualPipe: each micro-batch passes one of a rank's two stages
    bd = {k: per_mb * M * (tots[slow].fwd[k] + tots[slow].bwd[k]) for k in TIME_KEYS}
    if replay:  # DualPipe as its code runs: transfers waited per chunk, unpaired chunks' all-to-all exposed
        bd["pp_comm"] = replay.pp_comm_s
        bd["ep_comm"] += replay.unpaired_ep_s
        bd["pipeline_bubble"] = t_pipe - sum(bd.values())
    else:
        bd["pipeline_bubble"] = max(0.0, t_pipe - per_mb * M * t[slow])  # (round-off: 1-stage pipelines -1e-20)
    tail_rank = max(range(cfg.pp), key=lambda r: tail_tot[r])
    bd.update(tails[tail_rank])
    tokens = ctx.training.tokens_per_step
    mflops = model_flops_per_step(ctx.problem)
    # HFU: MFU scaled by executed / needed FLOPs (recompute), so HFU >= MFU always.
    recompute_ratio = sum(x.hfu_flops for x in tots) / max(1e-30, sum(x.base_flops for x in tots))
    peak_all = ctx.peak * ctx.num_gpus
    memory_bd = dict(peak_stage.memory_gib)
    bottleneck = max(bd, key=lambda k: bd[k])
    full_plan = plan.model_copy(update={"dp": cfg.dp, "stage_layers": list(stage_layers)})
    return Estimate(
        fits=not reasons, reasons=reasons, warnings=warnings, plan=full_plan,
        step_time_s=step, tokens_per_s=tokens / step, mfu=mflops / (step * peak_all),
        hfu=recompute_ratio * mflops / (step * peak_all), model_tflops_per_gpu=mflops / step / ctx.num_gpus / 1e12,
        num_microbatches=M, peak_memory_gib=peak_stage.peak_memory_gib,
        memory_capacity_gib=cap / GIB, time_breakdown_s=bd, memory_breakdown_gib=memory_bd,
        stages=stages, bottleneck=bottleneck,
        flop_budget=flop_budget(ctx.problem, recompute_ratio, step, ctx.num_gpus))


def placement_warnings(table: Table) -> list[str]:
    pl = table.placement
    out = []
    for axis in ("tp", "cp", "ep"):
        prof = getattr(pl, axis)
        if prof.straddles:
            out.append(f"{axis} group of {prof.size} GPUs spans several {prof.straddles[0]} domains although it "
                       f"fits inside one (placement {table.cfg.placement}); it is priced at the slower level")
    return out


def ep_overlap_state(problem: Problem, plan: Plan) -> str | None:
    """How `evaluate` prices the expert all-to-all overlap of a valid `plan` that could run it: "on",
    or why it is off: "choice" (the plan turns it off), "refused" (left open beside a recompute the
    framework refuses it with: `priced_config`), "unpaid" (left open where it does not pay:
    `ep_overlap_pays`). None where the plan is invalid or its degrees or framework cannot run it."""
    dp, reasons = config_reasons(problem, plan)
    if reasons:
        return None
    ctx = context(problem)
    cfg = Config.of(plan, dp)
    if not ep_overlap_on(ctx, dataclasses.replace(cfg, ep_overlap=None)):
        return None
    if plan.ep_overlap is False:
        return "choice"
    modes = set(plan.recompute_per_layer(problem.model.num_hidden_layers))
    priced = priced_config(ctx, cfg, modes)
    if priced.ep_overlap is False:
        return "refused"
    return "on" if layer_table(ctx, priced).memo["ep_overlap"] else "unpaid"


def ep_overlap_priced(problem: Problem, plan: Plan) -> bool:
    """Whether `evaluate` prices a valid `plan` with the expert all-to-all overlapped (the plan's
    choice, or where it leaves it open, `ep_overlap_pays`): what exports set."""
    return ep_overlap_state(problem, plan) == "on"


def evaluate(problem: Problem | Any, plan: Plan | Any) -> Estimate:
    """Step time, throughput, MFU and per-stage memory of `plan` on `problem`.

    Never raises for an invalid plan: `fits=False` and `reasons` lists every problem.
    """
    problem = load_problem(problem)
    plan = load_plan(plan)
    ctx = with_modes(context(problem), plan.recompute)
    dp, reasons = config_reasons(problem, plan)
    if reasons:
        return invalid_estimate(plan, reasons, ctx)
    n = problem.model.num_hidden_layers
    cfg = priced_config(ctx, Config.of(plan, dp), set(plan.recompute_per_layer(n)))
    warnings = []
    if plan.sequence_parallel and plan.tp == 1:
        warnings.append("sequence_parallel is ignored with tp=1")
    table = layer_table(ctx, cfg)
    warnings += placement_warnings(table)
    if why := unfused_softmax_reason(ctx, Shapes(ctx, cfg)):
        warnings.append(f"attention softmax runs unfused in PyTorch (fp32, 8-11x the fused kernel's HBM traffic): {why}")
    stage_layers = plan.stage_layers or layout_split(n, cfg.pp * cfg.vpp)

    est = assemble(ctx, table, stage_layers, plan.recompute_per_layer(n), plan, warnings)
    return with_interval(est, problem.model.is_moe)  # step_time_interval_s from the validation residuals

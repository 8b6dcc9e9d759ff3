"""Find the plan with the minimum step time that fits: numpy bounds + CP-SAT.

The decision space splits in two:

- **Global knobs** (tp, cp, ep, pp, dp, vpp, sequence parallel, ZeRO stage, micro-batch,
  schedule, placement of the mesh axes). `candidates()` enumerates the combinations the
  divisibility rules and `search:` allow; `bounds()` computes, vectorized with numpy over
  all of them, a sound lower bound on step time (compute at the achievable matmul rate,
  perfectly balanced stages, the schedule's warm-up and cool-down) and on peak memory
  (everything recomputed, ZeRO sharding applied). Candidates whose memory bound exceeds
  HBM are pruned; the rest are ordered by their time bound.
- **The combinatorial core** (`StageModel`, a CP-SAT model): for one global configuration,
  how many layers of each kind (dense, MoE) every virtual pipeline stage holds (contiguous,
  uneven allowed, dense layers first) and which recompute mode each layer uses, subject to
  HBM on every rank, minimizing the evaluator's step time: pipeline time with warm-up and
  cool-down, plus the slowest rank's data-parallel tail. All coefficients come from
  `cost.layer_table`, the same numbers `evaluate` sums; seconds are scaled to integer
  units of 0.1 us, bytes to KiB (rounded up, so a plan the model accepts always fits).

Branch and bound ties them together (`_Search`):

1. A warm start (`_warm_start`, no CP-SAT) builds real plans on the most promising
   configurations: greedy per-rank recompute mixes, then memory-aware stage splits.
2. Candidates are visited in order of their numpy bound; the search stops when the next
   bound cannot beat the incumbent. Each surviving configuration meets, in order of cost,
   the bound of its optimistic table (every group on consecutive GPUs: valid for every
   placement), the same with the recompute HBM forces (`_memory_tmax`), and per placement
   its exact table bound; only then CP-SAT, with the incumbent as a cutoff.
3. A proof stopped by its per-solve cap keeps its proven bound and is resumed at the end
   with the time left.

`OPTIMAL` therefore means every candidate was either pruned by a sound bound or solved to
optimality by CP-SAT (tests check every bound against `evaluate`, and the optimum against
brute-force enumeration). Every returned plan is re-evaluated with `evaluate`, and the
CP-SAT objective must match it to within the rounding.

Determinism: candidates are enumerated in a fixed order, CP-SAT runs single-threaded with
a fixed seed, ties are broken by a second CP-SAT pass (fewest recomputed layers, then
layers as early as possible) and by candidate order.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from .catalog import gpu_ids, get_gpu
from .cost import (
    BF16,
    COMM_INTERFERENCE,
    INTERFERENCE_DENOM,
    GIB,
    Config,
    Context,
    Estimate,
    Table,
    context,
    config_reasons,
    inflight_microbatches,
    layer_params,
    layer_table,
    static_bytes,
    tail_model,
    working_bytes,
)
from .cost import evaluate as _evaluate
from .errors import InfeasibleError
from .loader import load_problem
from .spec import DEFAULT_GAP_LIMIT, MESH_AXES, RECOMPUTES, Plan, Problem, divisors
from .topology import place_axes

TIME_UNIT_S = 1e-7
MEM_UNIT_BYTES = 1024
DEFAULT_MBS = (1, 2, 4, 8, 16)
DEFAULT_MAX_VPP = 8


class SolverStats(BaseModel):
    model_config = ConfigDict(frozen=True)
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE
    solve_time_s: float
    objective_s: float | None  # the CP-SAT objective of the chosen plan, in seconds
    objective_bound_s: float | None  # proven lower bound on the optimum
    gap: float | None  # proven (objective - bound) / objective
    gap_limit: float = 0.0  # OPTIMAL means gap <= gap_limit
    candidates: int  # global configurations in the declared space (after divisibility)
    pruned_by_memory: int  # proven not to fit by the numpy memory bound
    pruned_by_bound: int  # proven no faster than the incumbent by the numpy time bound
    cp_sat_solves: int
    rounding_tolerance_s: float  # |objective - evaluated step time| allowed by integer rounding


class Alternative(BaseModel):
    model_config = ConfigDict(frozen=True)
    plan: Plan
    estimate: Estimate
    differs: str  # what distinguishes it from the chosen plan
    slower_pct: float


class Solution(BaseModel):
    model_config = ConfigDict(frozen=True)
    plan: Plan
    estimate: Estimate
    solver: SolverStats
    alternatives: list[Alternative] = []


# ---------------------------------------------------------------------------------------
# Global candidates
# ---------------------------------------------------------------------------------------


def _space(problem: Problem, ctx: Context) -> dict[str, list[Any]]:
    m, t, s = problem.model, problem.training, problem.search
    n = problem.cluster.num_gpus
    node = ctx.levels[0].size
    tp_default = [d for d in divisors(n) if d <= node and m.num_attention_heads % d == 0]
    cp_default = [c for c in (1, 2, 4, 8, 16, 32) if c <= n and t.seq_len % (2 * c) == 0 or c == 1]
    ep_default = [e for e in divisors(m.num_experts) if e <= n] if m.is_moe else [1]
    pp_default = [p for p in divisors(n) if p <= m.num_hidden_layers]
    return {
        "tp": s.allowed("tp", tp_default), "cp": s.allowed("cp", cp_default),
        "ep": s.allowed("ep", ep_default), "pp": s.allowed("pp", pp_default),
        "dp": s.allowed("dp", divisors(n)),
        "micro_batch_size": s.allowed("micro_batch_size", DEFAULT_MBS),
        "vpp": s.allowed("vpp", list(range(1, DEFAULT_MAX_VPP + 1))),
        "schedule": s.allowed("schedule", ["1f1b", "interleaved", "zero_bubble"]),
        "zero_stage": s.allowed("zero_stage", [0, 1, 2, 3]),
        "sequence_parallel": s.allowed("sequence_parallel", [True, False]),
        "recompute": s.allowed("recompute", list(RECOMPUTES)),
        "placement": s.allowed("placement", []),
    }


def candidates(problem: Problem, ctx: Context) -> list[Config]:
    """Every global configuration allowed by `search:` and the divisibility rules, in a
    fixed order (placement left as the canonical order; placements are expanded later)."""
    sp_ = _space(problem, ctx)
    n = problem.cluster.num_gpus
    gbs = problem.training.global_batch_size
    out: list[Config] = []
    for tp, cp, pp in product(sp_["tp"], sp_["cp"], sp_["pp"]):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        if dp not in sp_["dp"]:
            continue
        for ep, mbs in product(sp_["ep"], sp_["micro_batch_size"]):
            if gbs % (dp * mbs):
                continue
            mb = gbs // (dp * mbs)
            for sched, vpp in product(sp_["schedule"], sp_["vpp"]):
                if (vpp > 1) != (sched == "interleaved"):
                    continue
                if pp == 1 and sched != "1f1b":
                    continue
                # The validity rules do not depend on the ZeRO stage or SP: check once.
                probe = Plan(tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, vpp=vpp, micro_batch_size=mbs, schedule=sched)
                if config_reasons(problem, probe)[1] or (sched == "interleaved" and mb % pp):
                    continue
                for zero, sp in product(sp_["zero_stage"], sp_["sequence_parallel"]):
                    if tp == 1 and not sp and True in sp_["sequence_parallel"]:
                        continue  # sp is meaningless at tp=1: keep one of the two
                    if dp * cp == 1 and zero > 0 and 0 in sp_["zero_stage"]:
                        continue  # nothing to shard: ZeRO stages are all the same plan
                    out.append(Config(tp, cp, ep, pp, dp, vpp, sp and tp > 1, zero, mbs, sched,
                                      probe.placement))
    return out


# ---------------------------------------------------------------------------------------
# numpy bounds over all candidates
# ---------------------------------------------------------------------------------------


def bounds(ctx: Context, cands: list[Config], opt_cache: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(time lower bound in s, memory lower bound in bytes) for every candidate, vectorized.

    Time: one micro-batch through each layer kind at its fastest recompute mode, priced by
    `cost.layer_costs` itself with every process group on consecutive GPUs (the cheapest
    profile any placement can give it; `_optimistic_table`), once per distinct layer shape
    (tp, cp, ep, sp, micro-batch: a few thousand at most), then numpy over all candidates:
    ZeRO-3 weight traffic overlapped with that compute, the pipeline's (M - c) T / P + c T
    over perfectly balanced stages (c = 1, 1/vpp for interleaving, 0 for zero-bubble), whole
    layers per stage, for zero-bubble (P - 1) sum(u) / P and sum(u), and the mean rank's
    optimizer step plus the interference of its data-parallel traffic.
    Memory: the first rank holds at least its share of the sharded weights, gradients and
    optimizer states and, with every layer recomputed, each in-flight micro-batch's layer inputs.
    """
    m, tr = ctx.model, ctx.training
    a = np.array([[c.tp, c.cp, c.ep, c.pp, c.dp, c.vpp, c.mbs, c.zero, int(c.sp),
                   {"1f1b": 0, "interleaved": 1, "zero_bubble": 2, "gpipe": 3}[c.schedule]] for c in cands],
                 dtype=np.float64).reshape(-1, 10)
    tp, cp, ep, pp, dp, vpp, mbs, zero, sp, sched = a.T
    L, h = m.num_hidden_layers, m.hidden_size
    tokens = mbs * tr.seq_len / cp
    kinds = m.layer_kinds()
    kind_list = sorted(set(kinds))
    opt_cache = {} if opt_cache is None else opt_cache
    # Per distinct layer shape: (fastest time per kind, fastest time less weight gradients per
    # kind, embedding + LM head time, LM head weight-gradient time).
    shape: dict[tuple, tuple[list[float], list[float], float, float]] = {}
    tau = np.zeros((len(cands), len(kind_list)))
    u_tau = np.zeros((len(cands), len(kind_list)))
    ends = np.zeros(len(cands))
    head_w = np.zeros(len(cands))
    for j, c in enumerate(cands):
        key = (c.tp, c.cp, c.ep, c.sp, c.mbs, c.pp == 1)
        if key not in shape:
            tb = _optimistic_table(ctx, Config(c.tp, c.cp, c.ep, c.pp, c.dp, 1, c.sp, 0, c.mbs, "1f1b", c.placement),
                                   opt_cache)
            lay = tb.layers
            shape[key] = ([min(x.total_s for (k2, _), x in lay.items() if k2 == k) for k in kind_list],
                          [min(x.total_s - x.wgrad_s for (k2, _), x in lay.items() if k2 == k) for k in kind_list],
                          tb.embed.total_s + tb.head.total_s, tb.head.wgrad_s)
        tau[j], u_tau[j], ends[j], head_w[j] = shape[key]
    counts = np.array([kinds.count(k) for k in kind_list], dtype=np.float64)
    busy = tau @ counts + ends
    # ZeRO-3 gathers every layer's weights before its forward and backward and reduce-scatters
    # its gradients, overlapped with compute: per layer c + overlapped(x, c) = (1 - k) max(c, x)
    # + k (c + x), and the sum over layers is at least that form of the sums (max is subadditive).
    zero3 = np.zeros(len(cands))
    z3_memo: dict[tuple, float] = {}
    for j, c in enumerate(cands):
        if c.zero == 3 and c.dp * c.cp > 1:
            key = (c.tp, c.cp, c.ep, c.dp)
            if key not in z3_memo:
                z3_memo[key] = _zero3_lower_bound(ctx, c)
            zero3[j] = z3_memo[key]
    t_micro = (1 - COMM_INTERFERENCE) * np.maximum(busy, zero3) + COMM_INTERFERENCE * (busy + zero3)
    M = tr.global_batch_size / (dp * mbs)
    c = np.where(sched == 1, 1.0 / vpp, 1.0)
    c = np.where(sched == 2, 0.0, c)
    t_lb = (M - c) * t_micro / pp + c * t_micro
    # Whole layers: for every kind, some stage holds ceil(L_k / P) of its layers (a chunk
    # ceil(L_k / V)), other layers taken as free.
    tmax = t_micro / pp
    chunk = t_micro / (pp * vpp)
    for i, n_k in enumerate(counts):
        tmax = np.maximum(tmax, np.ceil(n_k / pp) * tau[:, i])
        chunk = np.maximum(chunk, np.ceil(n_k / (pp * vpp)) * tau[:, i])
    lb_1f1b = (M - 1) * tmax + t_micro
    lb_inter = M * tmax + (pp - 1) * chunk
    # Zero-bubble: M max t + (P - 1) max u, u = t minus the weight-gradient GEMMs; max u >=
    # sum u / P, and one micro-batch's forward and input-gradient backward cross every stage
    # in turn, so the pipeline also takes at least sum u.
    serial = u_tau @ counts + ends - head_w
    lb_zb = np.maximum(M * tmax + (pp - 1) * serial / pp, serial)
    t_lb = np.maximum(t_lb, np.where(sched == 1, lb_inter, np.where(sched == 2, lb_zb, lb_1f1b)))
    # Memory: params per rank >= total / (tp * pp) (experts also / ep), sharded by ZeRO.
    total = sum(layer_params(m, k)[0] for k in kinds)
    expert = sum(layer_params(m, k)[1] for k in kinds)
    dense = total - expert + m.vocab_size * h * (1 if m.tie_word_embeddings else 2)
    dense_gpu = dense / (tp * pp)
    exp_gpu = expert / (tp * pp * ep)
    opt_b = 12.0 if tr.optimizer in ("adam", "adamw") else 8.0
    w_b = BF16 + (1.0 if tr.precision == "fp8" else 0.0)
    dpc = dp * cp
    edp = np.maximum(1, dpc / ep)

    def per(nb: float, sharded: np.ndarray) -> np.ndarray:
        return np.where(sharded, nb * (dense_gpu / dpc + exp_gpu / edp), nb * (dense_gpu + exp_gpu))

    static = per(w_b, zero >= 3) + per(BF16, zero >= 2) + per(opt_b, zero >= 1)
    # The data-parallel tail includes the optimizer step of the rank holding the most
    # parameters, at least the mean rank's (see `cost.tail_model`).
    from .cost import OPT_TRAFFIC_BYTES  # noqa: PLC0415

    opt_traffic = OPT_TRAFFIC_BYTES * (1.0 if tr.optimizer in ("adam", "adamw") else 2 / 3)
    shard = np.where(zero >= 1, 1.0 / dpc, 1.0)
    t_lb = t_lb + opt_traffic * shard * (dense_gpu + exp_gpu) / ctx.hbm_bytes_per_s
    infl = np.where(sched == 1, ((pp - 1) * 2 + (vpp - 1) * pp + 1) / vpp, pp)
    infl = np.where(sched == 3, M, np.minimum(infl, M))
    acts = infl * (L / pp) * BF16 * tokens * h / np.where(sp > 0, tp, 1)
    return t_lb, static + acts


# ---------------------------------------------------------------------------------------
# The CP-SAT model for one global configuration
# ---------------------------------------------------------------------------------------


def _zero3_lower_bound(ctx: Context, cfg: Config) -> float:
    """ZeRO-3 traffic of one micro-batch through every layer (all-gather for the forward, again
    for the backward, reduce-scatter of the gradients), each group on consecutive GPUs."""
    from .topology import all_gather_s, contiguous_profile, reduce_scatter_s  # noqa: PLC0415

    m, lv, g = ctx.model, ctx.levels, ctx.graph
    dp_cp = contiguous_profile(g, cfg.dp * cfg.cp)
    edp = contiguous_profile(g, max(1, cfg.dp * cfg.cp // cfg.ep))
    total = 0.0
    for k in m.layer_kinds():
        params, experts = layer_params(m, k)
        w_dense, w_exp = BF16 * (params - experts) / cfg.tp, BF16 * experts / (cfg.tp * cfg.ep)
        ag = all_gather_s(lv, dp_cp, w_dense) + all_gather_s(lv, edp, w_exp)
        rs = reduce_scatter_s(lv, dp_cp, w_dense) + reduce_scatter_s(lv, edp, w_exp)
        total += 2 * ag + rs
    return total


def _t(x: float) -> int:
    return int(round(x / TIME_UNIT_S))


def _b(x: float) -> int:
    return int(math.ceil(x / MEM_UNIT_BYTES))


class StageModel:
    """CP-SAT: layers per virtual stage and recompute mode per layer, for one configuration.

    Variables `n[c][kind][mode]`: how many layers of `kind` in virtual stage `c` use
    recompute `mode`. Within a stage the order of modes does not change time or memory,
    so the per-layer assignment is read off the counts.
    """

    def __init__(self, ctx: Context, table: Table, modes: list[str], uniform: bool, cutoff_units: int | None):
        from ortools.sat.python import cp_model  # noqa: PLC0415  (lazy: 0.25 s import)

        self.cp_model = cp_model
        self.ctx, self.table, self.cfg = ctx, table, table.cfg
        self.model = cp_model.CpModel()
        kinds = ctx.model.layer_kinds()
        self.kinds = sorted(set(kinds), key=kinds.index)  # dense before moe
        self.count = {k: kinds.count(k) for k in self.kinds}
        self.modes = self._useful_modes(modes)
        self.V = self.cfg.pp * self.cfg.vpp
        self.uniform = uniform
        self.cutoff = cutoff_units
        self._variables()
        self._layer_constraints()
        self._rank_expressions()
        self._memory_constraints()
        self._objective()

    def _useful_modes(self, modes: list[str]) -> list[str]:
        """Drop a recompute mode that is no better in memory and no faster than another for
        every layer kind (e.g. selective under FlashAttention)."""
        keep = []
        for r in modes:
            dominated = any(
                all(self.table.layers[(k, o)].act_bytes <= self.table.layers[(k, r)].act_bytes
                    and self.table.layers[(k, o)].total_s <= self.table.layers[(k, r)].total_s for k in self.kinds)
                and (o < r) for o in modes if o != r)
            if not dominated:
                keep.append(r)
        return keep

    def _variables(self) -> None:
        md = self.model
        self.n = [{k: {r: md.new_int_var(0, self.count[k], f"n_c{c}_{k}_{r}") for r in self.modes}
                   for k in self.kinds} for c in range(self.V)]
        self.size = [sum(self.n[c][k][r] for k in self.kinds for r in self.modes) for c in range(self.V)]

    def _layer_constraints(self) -> None:
        md = self.model
        for k in self.kinds:
            md.add(sum(self.n[c][k][r] for c in range(self.V) for r in self.modes) == self.count[k])
        if self.uniform:
            from .cost import even_split  # noqa: PLC0415

            for c, want in enumerate(even_split(self.ctx.model.num_hidden_layers, self.V)):
                md.add(self.size[c] == want)
        else:
            for c in range(self.V):
                md.add(self.size[c] >= 1)
            if self.cfg.schedule == "interleaved":
                # Declared space: interleaved virtual stages are near-even (Megatron needs equal
                # stages unless given an explicit layout); one layer either way absorbs the
                # embedding and the LM head.
                L = self.ctx.model.num_hidden_layers
                for c in range(self.V):
                    md.add(self.size[c] >= max(1, L // self.V - 1))
                    md.add(self.size[c] <= -(-L // self.V) + 1)
        # Contiguity: dense layers precede MoE layers. One stage holds the last dense layer: stages
        # before it hold only dense layers, stages after it only MoE layers. (This position form
        # proves small MoE models in milliseconds where a cumulative-count form took minutes.)
        if len(self.kinds) == 2:
            dense, moe = self.kinds
            last = [md.new_bool_var(f"last_dense_in_c{c}") for c in range(self.V)]
            md.add_exactly_one(last)
            for c in range(self.V):
                n_dense = sum(self.n[c][dense][r] for r in self.modes)
                md.add(sum(self.n[c][moe][r] for r in self.modes) <= self.count[moe] * sum(last[:c + 1]))
                md.add(n_dense <= self.count[dense] * sum(last[c:]))
                md.add(n_dense >= 1).only_enforce_if(last[c])

    def _rank_chunks(self, p: int) -> list[int]:
        return [c for c in range(self.V) if c % self.cfg.pp == p]

    def _piece_sum(self, p: int, attr) -> Any:
        """Sum over the layers of rank p of attr(cost) as a linear expression."""
        lay = self.table.layers
        return sum(attr(lay[(k, r)]) * self.n[c][k][r] for c in self._rank_chunks(p)
                   for k in self.kinds for r in self.modes)

    def _rank_const(self, p: int, attr) -> float:
        cfg, tb = self.cfg, self.table
        val = 0.0
        if p == 0:
            val += attr(tb.embed)
        if p == cfg.pp - 1:
            val += attr(tb.head)
        return val

    def _rank_expressions(self) -> None:
        cfg, tb = self.cfg, self.table
        self.fwd, self.bwd, self.time, self.wgrad, self.params, self.eparams = [], [], [], [], [], []
        for p in range(cfg.pp):
            chunks = len(self._rank_chunks(p))
            sends = chunks - (1 if p == cfg.pp - 1 else 0)
            recvs = chunks - (1 if p == 0 else 0)
            fwd = self._piece_sum(p, lambda c: _t(c.fwd_s)) + _t(self._rank_const(p, lambda c: c.fwd_s) + tb.pp_p2p_s * sends)
            bwd = self._piece_sum(p, lambda c: _t(c.bwd_s)) + _t(self._rank_const(p, lambda c: c.bwd_s) + tb.pp_p2p_s * recvs)
            self.fwd.append(fwd)
            self.bwd.append(bwd)
            self.time.append(fwd + bwd)
            self.wgrad.append(self._piece_sum(p, lambda c: _t(c.wgrad_s)) + _t(self._rank_const(p, lambda c: c.wgrad_s)))
        # Per virtual stage (chunk) time, for the interleaved bubble.
        lay = self.table.layers
        self.chunk_time = []
        for c in range(self.V):
            p = c % cfg.pp
            const = 0.0
            if c == 0:
                const += tb.embed.total_s
            if c == self.V - 1:
                const += tb.head.total_s
            const += tb.pp_p2p_s * ((c < self.V - 1) + (c > 0))
            self.chunk_time.append(sum(_t(lay[(k, r)].total_s) * self.n[c][k][r] for k in self.kinds
                                       for r in self.modes) + _t(const))

    def _memory_constraints(self) -> None:
        """Static (weights, grads, optimizer under ZeRO) + in-flight activations + working set <= HBM."""
        ctx, cfg, tb, md = self.ctx, self.cfg, self.table, self.model
        dense_coef = static_bytes(ctx, cfg, 1.0, 0.0)
        exp_coef = static_bytes(ctx, cfg, 1.0, 1.0)
        per_dense = sum(dense_coef.values())
        per_exp = sum(exp_coef.values()) - per_dense  # extra bytes per expert param beyond dense sharding

        def static(c) -> float:
            return per_dense * c.params + per_exp * c.expert_params

        z3 = 2 * BF16 * max(c.params for c in tb.layers.values()) if (cfg.zero == 3 and cfg.dp * cfg.cp > 1) else 0.0
        cap = ctx.capacity_bytes
        scale = cfg.vpp if cfg.schedule == "interleaved" else 1  # in-flight counts are k / vpp
        for p in range(cfg.pp):
            infl = inflight_microbatches(cfg, p, tb.microbatches) * scale
            infl_i = int(round(infl))
            lhs = (self._piece_sum(p, lambda c: scale * _b(static(c)) + infl_i * _b(c.act_bytes))
                   + scale * _b(self._rank_const(p, static)) + infl_i * _b(self._rank_const(p, lambda c: c.act_bytes))
                   + scale * _b(working_bytes(tb, p == cfg.pp - 1) + z3))
            md.add(lhs <= scale * int(cap // MEM_UNIT_BYTES))

    def _objective(self) -> None:
        """step = pipeline time + max over ranks of the data-parallel tail (see cost.assemble)."""
        ctx, cfg, tb, md = self.ctx, self.cfg, self.table, self.model
        M = tb.microbatches
        horizon = _t(1e6)
        tmax = md.new_int_var(0, horizon, "t_max")
        for t in self.time:
            md.add(tmax >= t)
        md.add(cfg.pp * tmax >= sum(self.time))  # redundant: strengthens the LP relaxation
        # Redundant cuts from the whole-layer balance bound (see `balanced_max`), rounded down.
        lay = tb.layers
        L = ctx.model.num_hidden_layers
        tau = min(lay[(k, r)].total_s for k in self.kinds for r in self.modes)
        t_ex, u_ex = _stage_extras(tb, self.V, per_rank=True)
        if cfg.vpp == 1:
            md.add(tmax >= int(balanced_max(tau, t_ex, L) / TIME_UNIT_S) - (L + 2))
        else:  # a rank holds vpp chunks of >= 1 layer each (as in `_table_bound`)
            lb = balanced_max(tau, t_ex, L - (cfg.vpp - 1) * cfg.pp) + (cfg.vpp - 1) * tau
            md.add(tmax >= int(lb / TIME_UNIT_S) - (L + 2))
        forced = _memory_tmax(ctx, tb, self.modes)  # the recompute HBM forces on the fullest rank
        if math.isfinite(forced) and forced > 0:
            md.add(tmax >= int(forced / TIME_UNIT_S) - (L + 2))
        if cfg.schedule == "zero_bubble":
            umax = md.new_int_var(0, horizon, "u_max")
            for t, w in zip(self.time, self.wgrad):
                md.add(umax >= t - w)
            md.add(cfg.pp * umax >= sum(self.time) - sum(self.wgrad))  # redundant LP cuts
            u_tau = min(lay[(k, r)].total_s - lay[(k, r)].wgrad_s for k in self.kinds for r in self.modes)
            md.add(umax >= int(balanced_max(u_tau, u_ex, L) / TIME_UNIT_S) - (L + 2))
            pipe = M * tmax + (cfg.pp - 1) * umax
        elif cfg.schedule == "interleaved":
            if len(self.kinds) == 1:
                # Symmetry: with identical layers, a rank's chunks (other than the first and last
                # virtual stage) can be permuted without changing rank totals, the largest chunk,
                # memory or sends; keep them sorted by time.
                for p in range(cfg.pp):
                    free = [c for c in self._rank_chunks(p) if 0 < c < self.V - 1]
                    for a, b in zip(free, free[1:]):
                        md.add(self.chunk_time[a] >= self.chunk_time[b])
            cmax = md.new_int_var(0, horizon, "chunk_max")
            for ct in self.chunk_time:
                md.add(cmax >= ct)
            md.add(self.V * cmax >= sum(self.chunk_time))
            c_ex, _ = _stage_extras(tb, self.V, per_rank=False)
            md.add(cmax >= int(balanced_max(tau, c_ex, L) / TIME_UNIT_S) - (L + 2))
            pipe = M * tmax + (cfg.pp - 1) * cmax
        else:
            pipe = M * tmax + sum(self.time) - tmax
        scale = 1
        tm = tail_model(ctx, tb)
        tail_max = md.new_int_var(0, horizon, "tail_max")
        for p in range(cfg.pp):
            red = (self._piece_sum(p, lambda c: _t(tm.reduce[0] * (c.params - c.expert_params) + tm.reduce[1] * c.expert_params))
                   + _t(tm.reduce[0] * self._rank_const(p, lambda c: c.params - c.expert_params)
                        + tm.reduce[1] * self._rank_const(p, lambda c: c.expert_params) + tm.reduce[2])) if any(tm.reduce) else 0
            gat = (self._piece_sum(p, lambda c: _t(tm.gather[0] * (c.params - c.expert_params) + tm.gather[1] * c.expert_params))
                   + _t(tm.gather[0] * self._rank_const(p, lambda c: c.params - c.expert_params)
                        + tm.gather[1] * self._rank_const(p, lambda c: c.expert_params) + tm.gather[2])) if any(tm.gather) else 0
            ex_red = md.new_int_var(0, horizon, f"exposed_reduce_{p}")
            ex_gat = md.new_int_var(0, horizon, f"exposed_gather_{p}")
            md.add(ex_red >= red - self.bwd[p])
            md.add(ex_gat >= gat - self.fwd[p])
            opt = self._piece_sum(p, lambda c: _t(tm.optimizer_s_per_param * c.params)) \
                + _t(tm.optimizer_s_per_param * self._rank_const(p, lambda c: c.params))
            # overlapped(x, w) = max(0, x - w) + k min(x, w) = (1 - k) max(0, x - w) + k x, k = a / d.
            a_, d_ = round(COMM_INTERFERENCE * INTERFERENCE_DENOM), INTERFERENCE_DENOM
            md.add(d_ * tail_max >= tm.reduce_repeats * ((d_ - a_) * ex_red + a_ * red)
                   + (d_ - a_) * ex_gat + a_ * gat + d_ * opt)
        self.scale = scale
        self.step = pipe + scale * tail_max
        if self.cutoff is not None:
            md.add(self.step <= self.cutoff * scale)
        md.minimize(self.step)
        if not self.uniform:
            from .cost import even_split  # noqa: PLC0415

            layer_kinds = self.ctx.model.layer_kinds()
            start = 0
            for c, size in enumerate(even_split(len(layer_kinds), self.V)):
                chunk = layer_kinds[start:start + size]
                start += size
                for k in self.kinds:
                    for r in self.modes:
                        md.add_hint(self.n[c][k][r], chunk.count(k) if r == self.modes[0] else 0)

    def tiebreak(self, best_scaled: int) -> None:
        """Second pass: keep the optimum, prefer fewer recomputed layers, then earlier layers.

        The first pass's solution is the hint, so the pass starts from a feasible point."""
        md = self.model
        md.clear_hints()  # CP-SAT rejects a model whose hint names a variable twice
        for var in self._all_vars():
            md.add_hint(var, self.solver.value(var))
        md.clear_objective()
        md.add(self.step <= best_scaled)
        weight = {r: i for i, r in enumerate(RECOMPUTES)}
        L = self.ctx.model.num_hidden_layers
        md.minimize(sum((L + 1) * weight[r] * self.n[c][k][r] + c * self.n[c][k][r]
                        for c in range(self.V) for k in self.kinds for r in self.modes))

    def _all_vars(self) -> list[Any]:
        return [self.n[c][k][r] for c in range(self.V) for k in self.kinds for r in self.modes]

    def solve(self, work_s: float, wall_s: float | None = None) -> tuple[str, int | None, int | None]:
        """Solve within `work_s` of CP-SAT's deterministic time (about a second of work each:
        the same answer on any machine) and, as a safety net, `wall_s` of wall-clock time
        (default 4 x work_s + 1). Returns (status, objective, bound) in model units."""
        cp_model = self.cp_model
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = 1
        prm.random_seed = 7
        prm.catch_sigint_signal = False  # Ctrl-C interrupts autoshard, not just one CP-SAT search
        prm.max_deterministic_time = max(0.05, work_s)
        prm.max_time_in_seconds = max(0.05, 4 * work_s + 1 if wall_s is None else wall_s)
        status = solver.solve(self.model)
        self.solver = solver
        if status == cp_model.OPTIMAL:
            return "OPTIMAL", int(round(solver.objective_value)), int(round(solver.best_objective_bound))
        if status == cp_model.FEASIBLE:
            return "FEASIBLE", int(round(solver.objective_value)), int(round(solver.best_objective_bound))
        if status == cp_model.INFEASIBLE:
            return "INFEASIBLE", None, None
        if status == cp_model.MODEL_INVALID:  # a bug in the model, never a property of the problem
            raise RuntimeError(f"CP-SAT rejected the stage model: {self.model.validate()}")
        bound = solver.best_objective_bound  # a proven bound even when no solution was found
        return "UNKNOWN", None, (int(bound) if math.isfinite(bound) else None)

    def read_counts(self) -> dict[tuple[int, str, str], int]:
        return {(c, k, r): self.solver.value(self.n[c][k][r])
                for c in range(self.V) for k in self.kinds for r in self.modes}

    def read_plan(self, counts: dict[tuple[int, str, str], int]) -> tuple[list[int], list[str]]:
        """stage_layers and per-layer recompute from solved counts (full, selective, none
        within each stage, dense layers first)."""
        stage_layers, recompute = [], []
        for c in range(self.V):
            size = 0
            for k in self.kinds:
                for r in ("full", "selective", "none"):
                    cnt = counts.get((c, k, r), 0)
                    recompute += [r] * cnt
                    size += cnt
            stage_layers.append(size)
        return stage_layers, recompute

def _with_placement(cfg: Config, placement: str) -> Config:
    return Config(cfg.tp, cfg.cp, cfg.ep, cfg.pp, cfg.dp, cfg.vpp, cfg.sp, cfg.zero, cfg.mbs, cfg.schedule, placement)


def _placements(problem: Problem, ctx: Context, cfg: Config, cache: dict | None = None) -> list[Config]:
    """Placements of cfg's mesh axes, one per distinct set of group profiles, in a fixed
    order that starts from the canonical tp-cp-ep-dp-pp. `cache` (one per solve) keeps the
    orders per set of degrees, which is all they depend on."""
    degrees = (cfg.tp, cfg.cp, cfg.ep, cfg.dp, cfg.pp)
    if cache is not None and degrees in cache:
        return [_with_placement(cfg, order) for order in cache[degrees]]
    from itertools import permutations  # noqa: PLC0415

    allowed = problem.search.allowed("placement", [])
    if allowed:
        orders = ["-".join(Plan(placement=p).axes) for p in allowed]
    else:
        sizes = {"tp": cfg.tp, "cp": cfg.cp, "ep": cfg.ep, "dp": max(1, cfg.dp // cfg.ep), "pp": cfg.pp}
        live = [a for a in MESH_AXES if sizes[a] > 1]
        slots = [i for i, a in enumerate(MESH_AXES) if a in live]
        orders = []
        for perm in permutations(live):  # size-1 axes stay where the canonical order has them
            order = list(MESH_AXES)
            for i, a in zip(slots, perm):
                order[i] = a
            orders.append("-".join(order))
    seen: dict[Any, Config] = {}
    for order in orders:
        c = _with_placement(cfg, order)
        key = place_axes(ctx.graph, order, c.tp, c.cp, c.ep, c.dp, c.pp)
        key = (key.tp, key.cp, key.ep, key.dp, key.dp_cp, key.edp, key.pp_level)
        seen.setdefault(key, c)
    if cache is not None:
        cache[degrees] = [c.placement for c in seen.values()]
    return list(seen.values())


def _config_key(p: Plan) -> tuple:
    return (p.tp, p.cp, p.ep, p.pp, p.dp, p.vpp, p.sp, p.zero_stage, p.micro_batch_size, p.schedule, p.placement)


@dataclass(order=True)
class _Found:
    step_s: float
    order: int
    plan: Plan = None  # type: ignore[assignment]
    objective_s: float = 0.0
    tolerance_s: float = 0.0


def balanced_max(per_layer: float, extras: list[float], layers: int, min_per: int = 1) -> float:
    """The smallest possible time of the fullest stage when `layers` layers of `per_layer`
    seconds each are split over stages with fixed `extras` (>= `min_per` layers per stage):
    the least T with sum_p floor((T - extra_p) / per_layer) >= layers. A relaxation of the
    stage split (every layer at its cheapest), so a lower bound of max_p t_p."""
    groups: dict[float, int] = {}
    for e in extras:
        groups[e] = groups.get(e, 0) + 1
    if layers <= 0 or per_layer <= 0:
        return max(extras) + per_layer * min_per

    def enough(t: float) -> bool:
        total = 0
        for e, cnt in groups.items():
            k = math.floor((t - e) / per_layer + 1e-9)
            if k < min_per:
                return False
            total += k * cnt
        return total >= layers

    # The answer is e + n * per_layer for some stage extra e; it lies in [lo, lo + per_layer] with lo
    # the continuous optimum (or the least feasible value), since floor(x + 1) >= x.
    stages = len(extras)
    lo = max((layers * per_layer + sum(extras)) / stages, max(extras) + min_per * per_layer)
    cands = sorted(e + (math.ceil((lo - e) / per_layer - 1e-9) + j) * per_layer for e in groups for j in (0, 1))
    for t in cands:
        if t >= lo - 1e-12 and enough(t):
            return t
    return max(cands)


def _stage_extras(table: Table, chunks: int, per_rank: bool) -> tuple[list[float], list[float]]:
    """Fixed (time, time - weight-gradient time) of each stage besides its layers: embedding on
    the first, LM head on the last, pipeline sends and receives (each chunk sends to the
    next and receives from the previous, except at the two ends)."""
    cfg = table.cfg
    n = cfg.pp if per_rank else chunks
    per = 2 * (chunks // n) * table.pp_p2p_s  # chunks // n: chunks per stage
    t = [per] * n
    last = (chunks - 1) % cfg.pp if per_rank else chunks - 1
    if chunks > 1:
        t[0] -= table.pp_p2p_s
        t[last] -= table.pp_p2p_s
    else:
        t[0] = 0.0
    u = list(t)
    ends = table.memo.get("ends")
    if ends is None:  # (embedding time, head time, head weight-gradient time), shared like the costs
        ends = table.memo["ends"] = (table.embed.total_s, table.head.total_s, table.head.wgrad_s)
    t[0] += ends[0]
    u[0] += ends[0]
    t[last] += ends[1]
    u[last] += ends[1] - ends[2]
    return t, u


@dataclass(frozen=True)
class _Summary:
    """What the bounds need from a table's layer, embedding and head costs (see `_summary`)."""

    count: dict[str, int]  # layers per kind
    fastest: dict[str, float]  # per kind: the fastest mode's time per micro-batch
    unfilled: dict[str, float]  # per kind: the least time less weight gradients (zero-bubble)
    fast: float  # every layer at its fastest mode, plus embedding and LM head
    ends: float  # embedding + LM head
    # Sums over every layer, embedding and head (the mean rank x P): forward; backward with the
    # fastest and with the slowest mode per kind; parameters.
    fwd_s: float
    bwd_fast_s: float
    bwd_slow_s: float
    params: float
    expert_params: float


def _summary(ctx: Context, table: Table, modes: list[str]) -> _Summary:
    """`_Summary` of a table, computed once per set of shared layer costs (`Table.memo`)."""
    key = ("summary", tuple(modes))
    if key in table.memo:
        return table.memo[key]
    kinds = ctx.model.layer_kinds()
    lay = table.layers
    count = {k: kinds.count(k) for k in sorted(set(kinds))}
    fastest = {k: min(lay[(k, r)].total_s for r in modes) for k in count}
    unfilled = {k: min(lay[(k, r)].total_s - lay[(k, r)].wgrad_s for r in modes) for k in count}
    ends = table.embed.total_s + table.head.total_s
    ends_c = (table.embed, table.head)
    slow = {k: lay[(k, max(modes, key=lambda r: lay[(k, r)].bwd_s))] for k in count}
    quick = {k: lay[(k, min(modes, key=lambda r: lay[(k, r)].bwd_s))] for k in count}
    fwd = sum(n * slow[k].fwd_s for k, n in count.items()) + sum(c.fwd_s for c in ends_c)
    bwd_slow = sum(n * slow[k].bwd_s for k, n in count.items()) + sum(c.bwd_s for c in ends_c)
    bwd_fast = sum(n * quick[k].bwd_s for k, n in count.items()) + sum(c.bwd_s for c in ends_c)
    params = sum(n * slow[k].params for k, n in count.items()) + sum(c.params for c in ends_c)
    eparams = sum(n * slow[k].expert_params for k, n in count.items()) + sum(c.expert_params for c in ends_c)
    s = _Summary(count, fastest, unfilled, sum(count[k] * fastest[k] for k in count) + ends, ends,
                 fwd, bwd_fast, bwd_slow, params, eparams)
    table.memo[key] = s
    return s


def _memory_tmax(ctx: Context, table: Table, modes: list[str]) -> float:
    """Lower bound of the slowest rank's time per micro-batch when HBM forces recompute;
    inf if no split fits.

    Rank p holding n layers of a kind needs fixed_p + n (static + infl_p act_fast) bytes
    with every layer at its fastest mode; each byte over the capacity costs at least the
    best seconds per activation byte any leaner mode trades, / infl_p (an LP relaxation),
    and past n infl_p (act_fast - act_leanest) no mix fits. t_p(n) is increasing in n, so
    the bound is the least T at which the ranks together can hold every layer of the kind
    (each >= vpp layers with one kind; with several, each kind alone, the others taken as free)."""
    kinds = ctx.model.layer_kinds()
    cfg, lay = table.cfg, table.layers
    P = cfg.pp
    per_dense = sum(static_bytes(ctx, cfg, 1.0, 0.0).values())
    per_exp = sum(static_bytes(ctx, cfg, 1.0, 1.0).values()) - per_dense

    def static(c) -> float:
        return per_dense * (c.params - c.expert_params) + (per_dense + per_exp) * c.expert_params

    z3 = 2 * BF16 * max(c.params for c in lay.values()) if (cfg.zero == 3 and cfg.dp * cfg.cp > 1) else 0.0
    t_ex, _ = _stage_extras(table, P * cfg.vpp, per_rank=True) if P > 1 else ([table.embed.total_s + table.head.total_s], [])
    infl = np.array([inflight_microbatches(cfg, p, table.microbatches) for p in range(P)])[:, None]
    ends = [([table.embed] if p == 0 else []) + ([table.head] if p == P - 1 else []) for p in range(P)]
    fixed = np.array([sum(static(c) for c in e) + working_bytes(table, p == P - 1) + z3 for p, e in enumerate(ends)])[:, None]
    fixed = fixed + infl * np.array([sum(c.act_bytes for c in e) for e in ends])[:, None]
    min_per = cfg.vpp if len(set(kinds)) == 1 else 0
    best = 0.0
    for k in sorted(set(kinds)):
        fast = min(modes, key=lambda r: (lay[(k, r)].total_s, lay[(k, r)].act_bytes))
        c0 = lay[(k, fast)]
        trades = [((c0.act_bytes - lay[(k, r)].act_bytes), lay[(k, r)].total_s - c0.total_s) for r in modes]
        trades = [(b, max(0.0, t)) for b, t in trades if b > 0]
        save_max = max((b for b, _ in trades), default=0.0)
        s_per_byte = min((t / b for b, t in trades), default=math.inf)
        L = kinds.count(k)
        n = np.arange(L + 1, dtype=np.float64)[None, :]
        need = fixed + n * (static(c0) + infl * c0.act_bytes) - ctx.capacity_bytes
        with np.errstate(invalid="ignore"):
            extra = np.where(need > 0, need / infl * s_per_byte, 0.0)  # a layer frees infl x its bytes
        t = n * c0.total_s + np.array(t_ex)[:, None] + extra
        t = np.where(need > n * infl * save_max, np.inf, t)
        floor = t[:, min_per].max()  # every rank holds at least min_per layers
        if not math.isfinite(floor):
            return math.inf
        t[:, :min_per] = -np.inf  # (so each row stays sorted)
        levels = np.unique(t[np.isfinite(t) & (t >= floor)])
        # held(T) = sum over ranks of the most layers with t_p(n) <= T (t_p increasing in n).
        held = lambda T: int((t <= T).sum()) - P  # noqa: E731
        lo, hi = 0, len(levels) - 1
        if held(levels[hi]) < L:
            return math.inf
        while lo < hi:
            mid = (lo + hi) // 2
            if held(levels[mid]) >= L:
                hi = mid
            else:
                lo = mid + 1
        best = max(best, float(levels[lo]))
    return best


def _tail_bound(ctx: Context, table: Table, modes: list[str], tmax: float, exact_windows: bool) -> float:
    """Lower bound of the data-parallel tail of the slowest rank, given `tmax`, a lower bound of
    the slowest rank's time per micro-batch.

    The max over ranks is at least the tail at the mean rank (the tail is convex in a rank's
    parameters and windows). Recompute lengthens the backward window, which hides more
    gradient reduction, but every second of it also lengthens the rank's time, which the
    pipeline pays M times, more than the (1 - k) R it can save in the tail (R = 1, or M under
    ZeRO-2); so the window counts only the recompute that fits under `tmax` for free:
    the mean rank's time at its fastest modes up to tmax, capped at the slowest modes."""
    from .cost import dp_tail_s, tail_model  # noqa: PLC0415

    tm = tail_model(ctx, table)
    s = _summary(ctx, table, modes)
    p = table.cfg.pp
    hops = (table.cfg.pp * table.cfg.vpp - 1) * table.pp_p2p_s / p  # mean sends / receives per rank
    params, eparams = s.params / p, s.expert_params / p
    if not exact_windows:  # overlapped(x, w) >= COMM_INTERFERENCE * x for every window w
        return sum(dp_tail_s(tm, params, eparams, math.inf, math.inf))
    fwd = s.fwd_s / p + hops
    bwd_fast = s.bwd_fast_s / p + hops
    free = max(0.0, tmax - (fwd + bwd_fast))  # recompute that fits under tmax
    bwd = bwd_fast + min(free, (s.bwd_slow_s - s.bwd_fast_s) / p)
    return sum(dp_tail_s(tm, params, eparams, fwd, bwd))


def _table_bound(ctx: Context, table: Table, modes: list[str], exact_windows: bool = True,
                 memory: bool = False) -> float:
    """Lower bound of one configuration from its exact table: every layer at its fastest
    recompute mode, stages as balanced as whole layers allow (`balanced_max`), memory ignored;
    plus the data-parallel tail (`_tail_bound`).

    `exact_windows=False` for a table that stands for several placements (`_optimistic_table`):
    its shorter forward / backward windows would overstate how much data-parallel traffic
    is exposed, so only the part no window hides (interference and the optimizer) counts.
    `memory=True` adds the recompute HBM forces (`_memory_tmax`; costlier to compute)."""
    cfg = table.cfg
    s = _summary(ctx, table, modes)
    L = sum(s.count.values())
    fast = s.fast
    M = table.microbatches
    p = cfg.pp
    forced = _memory_tmax(ctx, table, modes) if memory else 0.0
    if math.isinf(forced):  # no split fits in HBM
        return math.inf
    if p == 1:
        tmax = max(fast, forced)
    else:
        tau = min(s.fastest.values())
        V = cfg.pp * cfg.vpp
        t_ex, u_ex = _stage_extras(table, V, per_rank=True)
        if cfg.vpp == 1:
            tmax = balanced_max(tau, t_ex, L)
        else:  # a rank holds vpp chunks of >= 1 layer each
            tmax = balanced_max(tau, t_ex, L - (cfg.vpp - 1) * cfg.pp) + (cfg.vpp - 1) * tau
        # Each kind's layers alone must fit somewhere (other layers taken as free), and on average.
        for k in (s.count if len(s.count) > 1 else ()):
            tmax = max(tmax, balanced_max(s.fastest[k], t_ex, s.count[k], min_per=0))
        tmax = max(tmax, fast / cfg.pp, forced)
    tail = _tail_bound(ctx, table, modes, tmax, exact_windows)
    if p == 1:
        return M * tmax + tail
    if cfg.schedule == "zero_bubble":
        # One micro-batch's forward and input-gradient backward cross every stage in turn:
        # the pipeline takes at least sum(t - w) however well weight gradients fill bubbles.
        u = s.unfilled
        serial = sum(s.count[k] * u[k] for k in u) + sum(u_ex) - (V - 1) * table.pp_p2p_s
        umax = max(balanced_max(min(u.values()), u_ex, L), serial / cfg.pp,
                   *(balanced_max(u[k], u_ex, s.count[k], min_per=0) for k in u if len(u) > 1))
        # M max t + (P - 1) max u, and >= P max u >= sum u (max t >= max u).
        return max(M * tmax + (cfg.pp - 1) * umax, serial) + tail
    if cfg.schedule == "interleaved":
        c_ex, _ = _stage_extras(table, V, per_rank=False)
        chunk = balanced_max(tau, c_ex, L)
        return M * tmax + (cfg.pp - 1) * chunk + tail
    return (M - 1) * tmax + fast + tail


def _optimistic_table(ctx: Context, cfg: Config, cache: dict | None = None) -> Table:
    """The table with every process group on consecutive GPUs: the cheapest profile each group
    can have, so its bound holds for every placement of cfg. `cache` (one per solve) shares
    the per-layer costs between configurations that differ only in what they do not depend
    on (pipeline degree and schedule, and the ZeRO stage below 3)."""
    from .cost import num_microbatches, shared_costs  # noqa: PLC0415
    from .topology import Placement, contiguous_profile  # noqa: PLC0415

    g = ctx.graph
    edp = max(1, cfg.dp * cfg.cp // cfg.ep)
    pl = Placement(tp=contiguous_profile(g, cfg.tp), cp=contiguous_profile(g, cfg.cp),
                   ep=contiguous_profile(g, cfg.ep), dp=contiguous_profile(g, cfg.dp),
                   dp_cp=contiguous_profile(g, cfg.dp * cfg.cp), edp=contiguous_profile(g, edp),
                   pp=contiguous_profile(g, cfg.pp), pp_level=0 if cfg.pp > 1 else -1)
    zero3 = cfg.zero == 3
    key = (cfg.tp, cfg.cp, cfg.ep, cfg.sp, cfg.mbs, zero3, cfg.dp if zero3 else 0, cfg.pp == 1)
    layers, embed, head, memo = shared_costs(ctx, cfg, pl, cache, key)
    return Table(cfg, pl, layers, embed, head, 0.0, num_microbatches(ctx.problem, cfg), memo)


RUNNER_UP_SLOWER = 0.25  # runners-up more than 25% slower than the chosen plan are not reported
RUNNER_UP_CONFIGS = 3000  # configurations ranked for runners-up (in numpy-bound order)


class _Search:
    """Branch-and-bound state: the incumbents, the proven bounds, the configurations whose
    proof a time cap stopped (retried with the time left at the end).

    After the proof, `alternatives` runs the same search again with a looser target (the
    `keep`-th best plan found) to fill the runners-up; it no longer touches the proven bound."""

    def __init__(self, problem: Problem, ctx: Context, modes: list[str], keep: int, gap_limit: float,
                 time_limit_s: float, t0: float):
        self.problem, self.ctx, self.modes, self.keep, self.gap_limit = problem, ctx, modes, keep, gap_limit
        self.time_limit_s, self.t0 = time_limit_s, t0
        self.deadline = t0 + time_limit_s
        self.found: list[_Found] = []  # best per configuration, kept sorted, at most `keep`
        self.lower = math.inf  # proven lower bound of every closed configuration not solved to optimality
        self.open: list[tuple[float, int, Table]] = []  # stopped by a time cap: (proven bound, order, table)
        self.solved: set[Config] = set()  # configurations (with placement) whose optimum is known
        self.solves = self.seq = 0
        self.timed_out = False
        self.proving = True  # False while looking for runners-up
        self.cap_s = max(1.0, time_limit_s / 60)  # CP-SAT work per proof before moving on
        self.tables: dict = {}  # layer costs shared between placements (`cost.layer_table`)
        self.orders: dict = {}  # distinct placements per set of degrees (`_placements`)

    def target(self) -> float:
        """What a configuration must beat to matter: the incumbent less the gap limit (while
        proving), else the worst of the `keep` plans kept (once there are that many)."""
        if not self.proving:  # runners-up: within RUNNER_UP_SLOWER of the best, and better than the worst kept
            bar = self.found[-1].step_s if len(self.found) >= self.keep else math.inf
            return min(bar, self.found[0].step_s * (1 + RUNNER_UP_SLOWER))
        return self.found[0].step_s * (1 - self.gap_limit) if self.found else math.inf

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def close(self, bound: float) -> None:
        if self.proving:
            self.lower = min(self.lower, bound)

    def bound(self) -> float:
        return min([self.lower] + [b for b, _, _ in self.open])

    def add(self, plan: Plan, step_s: float, objective_s: float, tolerance_s: float) -> None:
        """Keep the plan if it is among the `keep` best, one per configuration (degrees,
        schedule, ZeRO, micro-batch, placement): runners-up that differ only in the layer
        split or recompute mix of the same configuration would tell a user nothing."""
        same = [f for f in self.found if _config_key(f.plan) == _config_key(plan)]
        if same and same[0].step_s <= step_s:
            return
        for f in same:
            self.found.remove(f)
        self.seq += 1
        self.found.append(_Found(step_s, self.seq, plan, objective_s, tolerance_s))
        self.found.sort()
        del self.found[self.keep:]

    def attempt(self, table: Table, tbound: float, cap_s: float) -> None:
        """CP-SAT on one configuration and placement, with the incumbent as cutoff."""
        goal = self.target()
        cutoff = _t(goal) if goal < math.inf else None
        sm = StageModel(self.ctx, table, self.modes, self.problem.search.uniform_stages, cutoff)
        status, obj, bnd = sm.solve(min(self.left(), cap_s), wall_s=self.left())
        self.solves += 1
        if status == "OPTIMAL":
            self.solved.add(table.cfg)
        if obj is None and not self.proving:  # nothing under the bar: no runner-up here
            return
        if obj is None:
            if status == "UNKNOWN":
                self.timed_out = True
                cp_bound = bnd * TIME_UNIT_S / sm.scale if bnd is not None else -math.inf
                self.seq += 1
                self.open.append((max(tbound, cp_bound), self.seq, table))
            elif cutoff is not None:  # proven: nothing in this configuration reaches the goal
                self.close(goal)  # (up to the integer rounding, reported separately)
            return
        if status == "FEASIBLE" and self.proving:
            self.timed_out = True
            self.seq += 1
            self.open.append((max(tbound, bnd * TIME_UNIT_S / sm.scale), self.seq, table))
        counts = sm.read_counts()
        if self.proving:  # (a runner-up needs no tie-break: it is one per configuration anyway)
            sm.tiebreak(obj)
            if sm.solve(min(self.left(), cap_s), wall_s=self.left())[1] is not None:
                counts = sm.read_counts()
        stage_layers, recompute = sm.read_plan(counts)
        rc: Any = recompute[0] if len(set(recompute)) == 1 else recompute
        est = _evaluate(self.problem, table.cfg.plan(rc, stage_layers))
        self.add(est.plan, est.step_time_s, obj * TIME_UNIT_S / sm.scale, _rounding_tolerance(self.ctx, table))

    def visit(self, cfg: Config, opt_cache: dict) -> bool:
        """Bound, then solve, every placement of one configuration. False if it was pruned."""
        ctx, modes = self.ctx, self.modes
        optimistic = _optimistic_table(ctx, cfg, opt_cache)
        opt_bound = _table_bound(ctx, optimistic, modes, exact_windows=False)
        if opt_bound < self.target():  # the costlier bound only where the cheap one does not prune
            opt_bound = _table_bound(ctx, optimistic, modes, exact_windows=False, memory=True)
        if opt_bound >= self.target():
            self.close(opt_bound)
            return False
        tables = [layer_table(ctx, c, self.tables) for c in _placements(self.problem, ctx, cfg, self.orders)]
        ranked = sorted(((max(opt_bound, _table_bound(ctx, tb, modes)), j, tb) for j, tb in enumerate(tables)),
                        key=lambda x: x[:2])
        for tbound, _, table in ranked:
            if tbound >= self.target():
                self.close(tbound)
                break
            if table.cfg in self.solved:  # (looking for alternatives: its best plan is known)
                continue
            with_memory = _table_bound(ctx, table, modes, memory=True)
            if with_memory >= self.target():  # HBM forces enough recompute to lose: no CP-SAT needed
                self.close(with_memory)
                continue
            # One hard configuration must not hold up the rest: cap each proof, keep its bound,
            # resume it at the end with the time left (`retry`).
            self.attempt(table, with_memory, self.cap_s)
        return True

    def alternatives(self, order: list[int], cands: list[Config], t_lb: np.ndarray, opt_cache: dict) -> None:
        """Fill the `keep - 1` runners-up: the search again, with the worst plan kept as the
        bar, in at most as many CP-SAT solves again as the proof took (a count, not a clock,
        so that the runners-up are reproducible) and within the time limit."""
        self.proving = False
        budget = self.solves + max(8, self.solves)
        # Visit in order of the placement-free bound (tighter than numpy's, so the closest
        # runners-up come first), over the configurations numpy does not rule out.
        ranked = []
        for i in order[:RUNNER_UP_CONFIGS]:
            if t_lb[i] >= self.target():
                break
            optimistic = _optimistic_table(self.ctx, cands[i], opt_cache)
            ranked.append((_table_bound(self.ctx, optimistic, self.modes, exact_windows=False, memory=True), i))
        for bound, i in sorted(ranked):
            if bound >= self.target() or self.left() <= 0 or self.solves >= budget:
                break
            self.visit(cands[i], opt_cache)

    def retry(self) -> None:
        """With the time left, resume the proofs a cap stopped, the weakest bound first."""
        pending, self.open = sorted(self.open, key=lambda x: x[:2]), []
        for k, (bnd, _, table) in enumerate(pending):
            if bnd >= self.target():
                self.close(bnd)
            elif self.left() < 0.1:
                self.open += pending[k:]
                return
            else:
                self.attempt(table, bnd, self.left())


def solve(problem: Problem | Any, *, time_limit_s: float = 30.0, top_k: int = 3,
          gap_limit: float = DEFAULT_GAP_LIMIT) -> Solution:
    """The fastest plan that fits, with proof.

    `solver.status == 'OPTIMAL'` means no plan in the declared space is faster than the one
    returned by more than `gap_limit` (relative; default 0.1%, far below the cost model's
    own accuracy; `gap_limit=0` proves exact optimality). `solver.gap` is the proven gap.
    'FEASIBLE' means the time limit stopped the proof; the gap is still proven.

    Raises `InfeasibleError` with the binding constraint and the smallest fixes when no
    plan in the declared space fits.
    """
    t0 = time.perf_counter()
    problem = load_problem(problem)
    ctx = context(problem)
    cands = candidates(problem, ctx)
    if not cands:
        raise InfeasibleError(*explain_no_candidates(problem, ctx))
    opt_cache: dict = {}  # per-layer costs on consecutive GPUs, shared by the bounds below
    t_lb, m_lb = bounds(ctx, cands, opt_cache)
    fits = m_lb <= ctx.capacity_bytes
    pruned_mem = int((~fits).sum())
    order = sorted(np.flatnonzero(fits).tolist(), key=lambda i: (t_lb[i], i))
    modes = [r for r in RECOMPUTES if r in problem.search.allowed("recompute", list(RECOMPUTES))]
    search = _Search(problem, ctx, modes, max(1, top_k + 1), gap_limit, time_limit_s, t0)
    pruned_bound = 0

    # Warm start: greedy recompute mixes and stage splits on the most promising configurations
    # (no CP-SAT); a strong incumbent early makes every cutoff and bound bite.
    warm = _warm_start(problem, ctx, [cands[i] for i in order[:WARM_START_CONFIGS]], modes,
                       deadline=t0 + time_limit_s / 2, opt_cache=opt_cache, table_cache=search.tables)
    if warm is not None:
        search.add(warm.plan, warm.step_time_s, warm.step_time_s, 0.0)

    for pos, i in enumerate(order):
        if t_lb[i] >= search.target():  # candidates come in order of their numpy bound
            pruned_bound += len(order) - pos
            search.close(float(t_lb[i]))
            break
        if search.left() <= 0:
            search.timed_out = True
            search.close(float(t_lb[i]))
            break
        pruned_bound += not search.visit(cands[i], opt_cache)
    search.retry()
    bound_s = search.bound()
    if top_k > 0 and search.found:
        search.alternatives(order, cands, t_lb, opt_cache)
    found = search.found
    elapsed = time.perf_counter() - t0
    if not found:
        if search.timed_out:
            raise InfeasibleError(f"no plan found within the {time_limit_s:g} s time limit",
                                  ["raise --time-limit", "restrict the search space with `search:`"])
        raise InfeasibleError(*explain_infeasible(problem, ctx, cands, m_lb))
    best = found[0]
    est = _evaluate(problem, best.plan)
    bound = min(best.step_s, bound_s)
    gap = max(0.0, (best.step_s - bound) / best.step_s)
    # Every configuration not solved to optimality contributed a proven bound (numpy, table,
    # memory, CP-SAT bound or cutoff), so the gap is proven even when limits fired.
    optimal = gap <= gap_limit + 1e-12
    stats = SolverStats(
        status="OPTIMAL" if optimal else "FEASIBLE", solve_time_s=elapsed, objective_s=best.objective_s,
        objective_bound_s=bound, gap=gap, gap_limit=gap_limit, candidates=len(cands),
        pruned_by_memory=pruned_mem, pruned_by_bound=pruned_bound, cp_sat_solves=search.solves,
        rounding_tolerance_s=best.tolerance_s)
    alts = [Alternative(plan=f.plan, estimate=_evaluate(problem, f.plan), differs=describe_difference(best.plan, f.plan),
                        slower_pct=100 * (f.step_s / best.step_s - 1)) for f in found[1:top_k + 1]]
    return Solution(plan=est.plan, estimate=est, solver=stats, alternatives=alts)


WARM_START_CONFIGS = 3000


WARM_SPLIT_CONFIGS = 24


def _warm_start(problem: Problem, ctx: Context, cfgs: list[Config], modes: list[str], deadline: float,
                opt_cache: dict, table_cache: dict) -> Estimate | None:
    """A real, evaluated plan to start branch and bound (no CP-SAT). Its effort is a count of
    configurations (so the same problem gets the same start on any machine); `deadline` is
    only a safety net.

    Pass 1, over `cfgs`, canonical placement: even stage splits, each rank's recompute mix
    chosen greedily to fit its HBM. Pass 2, on the `WARM_SPLIT_CONFIGS` configurations with
    the lowest placement-free bound (memory-aware): the two placements with the lowest table
    bounds, and the stage split too (`_Greedy.split`: the least max stage time, memory-aware)."""
    from .cost import assemble, even_split  # noqa: PLC0415

    best: Estimate | None = None
    L = ctx.model.num_hidden_layers
    promising: list[tuple[float, int, Config]] = []

    def beaten(bound: float) -> bool:
        return best is not None and bound >= best.step_time_s

    def consider(table: Table, split: list[int] | None, recompute: list[str] | None) -> None:
        nonlocal best
        if split is None or recompute is None:
            return
        rc: Any = recompute[0] if len(set(recompute)) == 1 else recompute
        est = assemble(ctx, table, split, recompute, table.cfg.plan(rc, split), [])
        if est.fits and (best is None or est.step_time_s < best.step_time_s):
            best = est

    for j, cfg in enumerate(cfgs):
        if time.perf_counter() > deadline:
            break
        optimistic = _optimistic_table(ctx, cfg, opt_cache)
        if beaten(_table_bound(ctx, optimistic, modes, exact_windows=False)):
            continue
        bound = _table_bound(ctx, optimistic, modes, exact_windows=False, memory=True)
        if beaten(bound):
            continue
        table = layer_table(ctx, cfg, table_cache)
        split = even_split(L, cfg.pp * cfg.vpp)
        consider(table, split, _Greedy(ctx, table, modes).recompute(split))
        promising.append((bound, j, cfg))
    for bound, _, cfg in sorted(promising, key=lambda x: x[:2])[:WARM_SPLIT_CONFIGS]:
        if time.perf_counter() > deadline or beaten(bound):
            break
        tables = [layer_table(ctx, c, table_cache) for c in _placements(problem, ctx, cfg)]
        ranked = sorted(((_table_bound(ctx, tb, modes, memory=True), k, tb) for k, tb in enumerate(tables)),
                        key=lambda x: x[:2])
        for tbound, _, table in ranked[:2]:
            if beaten(tbound):
                break
            if cfg.vpp == 1 and cfg.pp > 1:
                consider(table, *_Greedy(ctx, table, modes).split())
            else:
                split = even_split(L, cfg.pp * cfg.vpp)
                consider(table, split, _Greedy(ctx, table, modes).recompute(split))
    return best


class _Greedy:
    """Heuristic per-layer recompute and stage split for one configuration (warm start).

    Within a rank, every layer starts at its fastest recompute mode; while the rank exceeds
    its HBM, the switch that frees the most activation bytes per second of recompute moves
    one layer to its next leaner mode (layers of one kind are interchangeable)."""

    def __init__(self, ctx: Context, table: Table, modes: list[str]):
        self.ctx, self.table, self.cfg = ctx, table, table.cfg
        self.kinds = ctx.model.layer_kinds()
        lay = table.layers
        self.ladder: dict[str, list[str]] = {}  # per kind: the time / memory Pareto front, fastest first
        for k in set(self.kinds):
            front: list[str] = []
            for r in sorted(modes, key=lambda r: (lay[(k, r)].total_s, lay[(k, r)].act_bytes)):
                if not front or lay[(k, r)].act_bytes < lay[(k, front[-1])].act_bytes:
                    front.append(r)
            self.ladder[k] = front
        cfg = self.cfg
        self.z3 = 2 * BF16 * max(c.params for c in lay.values()) if (cfg.zero == 3 and cfg.dp * cfg.cp > 1) else 0.0
        self.memo: dict[tuple[int, int, int], tuple[list[str], float] | None] = {}

    def rank(self, p: int, layers: list[int]) -> tuple[list[str], float] | None:
        """(recompute mode of each of `layers`, the rank's time per micro-batch) or None."""
        ctx, tb, cfg, kinds, lad = self.ctx, self.table, self.cfg, self.kinds, self.ladder
        lay = tb.layers
        ends = ([tb.embed] if p == 0 else []) + ([tb.head] if p == cfg.pp - 1 else [])
        pieces = [lay[(kinds[i], lad[kinds[i]][0])] for i in layers] + ends
        params = sum(c.params for c in pieces)
        eparams = sum(c.expert_params for c in pieces)
        fixed = sum(static_bytes(ctx, cfg, params, eparams).values()) + working_bytes(tb, p == cfg.pp - 1) + self.z3
        infl = inflight_microbatches(cfg, p, tb.microbatches)
        over = fixed + infl * sum(c.act_bytes for c in pieces) - ctx.capacity_bytes
        step = {k: [0] * len(lad[k]) for k in lad}  # per kind: layers at each rung
        for i in layers:
            step[kinds[i]][0] += 1
        while over > 0:
            move, ratio = None, -1.0
            for k, rungs in step.items():
                for s in range(len(rungs) - 1):
                    if rungs[s]:
                        a, b = lay[(k, lad[k][s])], lay[(k, lad[k][s + 1])]
                        r_ = (a.act_bytes - b.act_bytes) / max(1e-15, b.total_s - a.total_s)
                        if r_ > ratio:
                            move, ratio = (k, s), r_
            if move is None:
                return None
            k, s = move
            over -= infl * (lay[(k, lad[k][s])].act_bytes - lay[(k, lad[k][s + 1])].act_bytes)
            step[k][s] -= 1
            step[k][s + 1] += 1
        modes, t = [], sum(c.total_s for c in ends)
        left = {k: list(rungs) for k, rungs in step.items()}
        for i in layers:  # leaner modes on the earliest layers of each kind
            k = kinds[i]
            s = max(j for j, n in enumerate(left[k]) if n)
            left[k][s] -= 1
            modes.append(lad[k][s])
            t += lay[(k, lad[k][s])].total_s
        return modes, t

    def recompute(self, split: list[int]) -> list[str] | None:
        """Per-layer recompute for a fixed split (any number of chunks per rank)."""
        cfg = self.cfg
        rank_of = [c % cfg.pp for c, n in enumerate(split) for _ in range(n)]
        out = [""] * len(rank_of)
        for p in range(cfg.pp):
            mine = [i for i, r in enumerate(rank_of) if r == p]
            got = self.rank(p, mine)
            if got is None:
                return None
            for i, m in zip(mine, got[0]):
                out[i] = m
        return out

    def _fill(self, limit_s: float) -> tuple[list[int], list[str]] | None:
        """Stages filled front to back, each with as many layers as fit under limit_s."""
        P, L = self.cfg.pp, len(self.kinds)
        split, rc, a = [], [], 0
        for p in range(P):
            take, got = 0, None
            hi = L - a if p == P - 1 else L - a - (P - 1 - p)
            lo = hi if p == P - 1 else 1
            for n in range(lo, hi + 1):
                key = (p, a, n)
                if key not in self.memo:
                    self.memo[key] = self.rank(p, list(range(a, a + n)))
                r = self.memo[key]
                if r is None or r[1] > limit_s:
                    break
                take, got = n, r
            if got is None:
                return None
            split.append(take)
            rc += got[0]
            a += take
        return split, rc

    def split(self) -> tuple[list[int] | None, list[str] | None]:
        """The stage split (one chunk per rank) with the least max stage time the greedy
        recompute allows: a bisection on the time limit of `_fill`."""
        from .cost import even_split  # noqa: PLC0415

        even = even_split(len(self.kinds), self.cfg.pp)
        start = [self.rank(p, list(range(sum(even[:p]), sum(even[:p + 1])))) for p in range(self.cfg.pp)]
        hi = max(r[1] for r in start) if all(start) else 1e6
        best = self._fill(hi)
        if best is None:
            return None, None
        lo = 0.0
        for _ in range(24):
            mid = (lo + hi) / 2
            got = self._fill(mid)
            if got is None:
                lo = mid
            else:
                hi, best = mid, got
            if hi - lo < 1e-4 * hi:
                break
        return best


def _rounding_tolerance(ctx: Context, table: Table) -> float:
    """Largest |objective - evaluated time| integer rounding can cause: half a unit per
    rounded coefficient, times how often it is counted."""
    cfg = table.cfg
    uses = (table.microbatches + cfg.pp + 2) * (ctx.model.num_hidden_layers + 3) * 3
    return uses * 0.5 * TIME_UNIT_S


def run_length(xs: list[int]) -> str:
    """[1, 2, 2, 2, 1] -> `1,2x3,1`."""
    out, i = [], 0
    while i < len(xs):
        j = i
        while j < len(xs) and xs[j] == xs[i]:
            j += 1
        out.append(f"{xs[i]}x{j - i}" if j - i > 1 else str(xs[i]))
        i = j
    return ",".join(out)


def describe_difference(a: Plan, b: Plan) -> str:
    """What distinguishes plan b from plan a, in knob=value terms."""
    diffs = []
    for knob in ("tp", "cp", "ep", "pp", "vpp", "dp", "sp", "zero_stage", "micro_batch_size", "schedule"):
        va, vb = getattr(a, knob), getattr(b, knob)
        if va != vb:
            diffs.append(f"{'sequence_parallel' if knob == 'sp' else knob} {va} -> {vb}")

    def live(p: Plan) -> list[str]:  # the order of the axes larger than 1 is all a placement decides
        sizes = {"tp": p.tp, "cp": p.cp, "ep": p.ep, "dp": (p.dp or 1) // p.ep, "pp": p.pp}
        return [x for x in p.axes if sizes[x] > 1]

    both = set(live(a)) & set(live(b))  # an axis of size 1 in either plan has no place to compare
    if a.placement != b.placement and [x for x in live(a) if x in both] != [x for x in live(b) if x in both]:
        diffs.append(f"placement {a.placement} -> {b.placement}")
    if a.stage_layers != b.stage_layers:
        diffs.append(f"stage_layers {run_length(b.stage_layers or [])}")
    def rc(p: Plan) -> str:  # "none", or the per-layer mix as counts
        if isinstance(p.recompute, str):
            return p.recompute
        return ",".join(f"{m}:{p.recompute.count(m)}" for m in RECOMPUTES if p.recompute.count(m))

    if rc(a) != rc(b):
        diffs.append(f"recompute {rc(a)} -> {rc(b)}")
    return ", ".join(diffs) or "same degrees, different layer split"


# ---------------------------------------------------------------------------------------
# Explaining infeasibility
# ---------------------------------------------------------------------------------------


def explain_no_candidates(problem: Problem, ctx: Context) -> tuple[str, list[str]]:
    n, gbs = problem.cluster.num_gpus, problem.training.global_batch_size
    reason = (f"no combination of degrees in the search space divides the {n} GPUs, the heads "
              f"({problem.model.num_attention_heads}) and the global batch ({gbs} sequences)")
    fixes = [f"use a global_batch_size that is a multiple of {n}", "relax the `search:` restrictions"]
    return reason, fixes


def explain_infeasible(problem: Problem, ctx: Context, cands: list[Config], m_lb: np.ndarray) -> tuple[str, list[str]]:
    """The binding constraint (the least memory-hungry plan and what it still needs) and
    the smallest changes that fix it."""
    i = int(np.argmin(m_lb))
    cfg = cands[i]
    plan = cfg.plan("full")
    est = _evaluate(problem, plan)
    need_gib = est.peak_memory_gib if est.stages else m_lb[i] / GIB
    cap_gib = ctx.capacity_bytes / GIB
    stage = max(est.stages, key=lambda s: s.peak_memory_gib).rank if est.stages else 0
    reason = (f"even with tp={cfg.tp}, pp={cfg.pp}, cp={cfg.cp}, ep={cfg.ep}, ZeRO-{cfg.zero}, micro-batch "
              f"{cfg.mbs} and full recompute, stage {stage} needs {need_gib:.1f} GiB of {cap_gib:.1f} GiB usable "
              f"on {ctx.gpu.id}")
    fixes = []
    n = problem.cluster.num_gpus
    node = ctx.levels[0].size
    more = int(math.ceil(n * need_gib / cap_gib / node) * node)
    fixes.append(f"more GPUs (about {max(more, n + node)} instead of {n})")
    bigger = sorted((g for g in (get_gpu(x) for x in gpu_ids()) if g.hbm_gib - 2 > need_gib), key=lambda g: g.hbm_gib)
    if bigger:
        fixes.append(f"a larger-HBM GPU ({', '.join(g.id for g in bigger[:3])})")
    mem = est.memory_breakdown_gib if est.stages else {}
    if mem.get("activations", 0) > 0.3 * need_gib:
        fixes.append(f"a shorter sequence (seq_len {problem.training.seq_len // 2})")
    if problem.search.model_dump(exclude_defaults=True):
        fixes.append("relax the `search:` restrictions")
    return reason, fixes

"""Sound lower bounds on step time and peak memory: numpy over every candidate (`bounds`),
per configuration from its optimistic or exact layer table (`_table_bound`), and the
recompute HBM forces (`_memory_tmax`). Tests check each against `evaluate`."""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..cost import (
    BF16,
    COMM_INTERFERENCE,
    Config,
    Context,
    Cost,
    Table,
    TailModel,
    distinct_objects,
    ep_overlap_blocked,
    ep_overlap_on,
    inflight_microbatches,
    layer_params,
    static_bytes,
    working_bytes,
    zero3_gathered_bytes,
    zero3_gathered_for,
)
from itertools import permutations
from operator import attrgetter
from ..cost import (
    OPT_TRAFFIC_BYTES,
    dp_overlaps,
    dp_tail_s,
    lora_fraction,
    loss_phase_head,
    num_microbatches,
    param_bytes,
    reshard_policy,
    shared_costs,
    tail_model,
    zero3_bytes_per_param,
    zero3_step_sync,
)
from ..cost.layers import KIND_DICTS
from ..spec import MESH_AXES
from ..topology import (
    Placement,
    _is_folded,
    _runs_profile,
    all_gather_s,
    contiguous_profile,
    group_runs,
    place_axes,
    reduce_scatter_s,
)
from .candidates import Candidates, Ranked, _with_fields, distinct_rows


def _solve_memo(ctx: Context) -> dict:
    """A dict that lives as long as `ctx` (one solve's context, `with_modes`): figures that are pure
    functions of the context and the key they are stored under (`_kinds`, `_free_tail_model`)."""
    got = ctx.__dict__.get("_solver_memo")
    if got is None:  # (a frozen dataclass: its __dict__ written directly, as functools.cached_property does)
        got = ctx.__dict__["_solver_memo"] = {}
    return got


def _kinds(ctx: Context) -> tuple[str, ...]:
    """`ctx.model.layer_kinds()` as a tuple, once per context (the model does not change in a solve)."""
    memo = _solve_memo(ctx)
    got = memo.get("layer_kinds")
    if got is None:
        got = memo["layer_kinds"] = tuple(ctx.model.layer_kinds())
    return got


def _kind_counts(ctx: Context) -> dict[str, int]:
    """Each layer kind's count, the kinds in order of first appearance (dense before MoE), once per
    context (`_rank_space`, `_memory_tmax`, the stage model); read only."""
    memo = _solve_memo(ctx)
    got = memo.get("kind counts")
    if got is None:
        kinds = _kinds(ctx)
        got = memo["kind counts"] = {k: kinds.count(k) for k in sorted(set(kinds), key=kinds.index)}
    return got


_SCHEDULES = {"1f1b": 0, "interleaved": 1, "zero_bubble": 2, "gpipe": 3}
_FIELDS = ("tp", "cp", "ep", "pp", "dp", "vpp", "mbs", "zero", "sp", "etp")


def bounds(ctx: Context, cands: list[Config], opt_cache: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(time lower bound in s, memory lower bound in bytes) for every candidate (`_bounds`)."""
    t_lb, m_lb, _ = _bounds(ctx, cands, opt_cache)
    return t_lb, m_lb


def _bounds(ctx: Context, cands: Sequence[Config], opt_cache: dict | None = None,
            memory: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time lower bound in s, memory lower bound in bytes, whether any split could fit in HBM)
    for every candidate (`_lazy_bounds`, refined for every candidate at once; `memory=False`: not
    refined, a bound of every plan, fitting or not)."""
    t_lb, m_lb, ok, refine = _lazy_bounds(ctx, cands, opt_cache)
    if memory:
        t_lb, fit = refine(np.arange(len(cands)))
        ok = ok & fit
    return t_lb, m_lb, ok


def _lazy_bounds(ctx: Context, cands: Sequence[Config], opt_cache: dict | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, "Refine"]:
    """(time lower bound in s, memory lower bound in bytes, whether any split could fit in HBM,
    `refine`) for every candidate, vectorized; `refine(idx)` gives the time bound of the
    candidates idx with the recompute HBM forces, and whether they can fit at all (the search
    refines them in order, `RefinedOrder`: most never need it).

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
    Fit: `_MemoryBound.could_fit`, every rank with every layer at its leanest mode. Refined: where
    the fastest modes do not fit, the recompute HBM forces on the slowest rank (`_forced_tmax`, a
    relaxation of the search's `_memory_tmax`), so the refined bound holds for plans that fit.
    Per-candidate Python work is done once per distinct group of the fields it depends on.
    """
    m, tr = ctx.model, ctx.training
    n_c = len(cands)
    a = _fields(cands)
    tp, cp, ep, pp, dp, vpp, mbs, zero, sp, etp, sched = a.T
    M = tr.global_batch_size // (dp * mbs)
    kinds = m.layer_kinds()
    kind_list = sorted(set(kinds))
    opt_cache = {} if opt_cache is None else opt_cache
    # Per distinct layer shape: the optimistic table. Its layer costs depend on the schedule only
    # through whether expert all-to-all overlaps (`ep_overlap_on`: pp, vpp, schedule, M >= 2).
    # A twin planned with the overlap off (`ep_overlap` False, `candidates`) has its own group: its
    # all-to-all is exposed, and its twin's overlapped table would bound it far below its cost.
    r = _field_ranks(cands, a)  # (each field column ranked once for the groupings below)
    first, inv = distinct_rows([r.tp, r.cp, r.ep, r.sp, r.mbs, pp == 1, r.etp, r.sched, vpp > 1, M >= 2,
                                _overlap_off(cands)])
    tables = [_optimistic_table(ctx, _with_fields(cands[j], zero=0), opt_cache) for j in first]
    facts, fx = distinct_objects([_layer_facts(ctx, tb, kind_list, False) for tb in tables])
    of_cand = np.asarray(fx)[inv]  # (each candidate's facts)
    tau = np.array([f.tau for f in facts])[of_cand]
    u_tau = np.array([f.u_tau for f in facts])[of_cand]
    ends = np.array([tb.embed.total_s + tb.head.total_s for tb in tables])[inv]
    head_w = np.array([tb.head.wgrad_s for tb in tables])[inv]
    counts = np.array([kinds.count(k) for k in kind_list], dtype=np.float64)
    busy = tau @ counts + ends
    # ZeRO-3 gathers every layer's weights before its forward and backward and reduce-scatters
    # its gradients, overlapped with compute: per layer c + overlapped(x, c) = (1 - k) max(c, x)
    # + k (c + x), and the sum over layers is at least that form of the sums (max is subadditive).
    zero3 = np.zeros(n_c)
    z3 = np.flatnonzero((zero == 3) & (dp * cp > 1))
    if len(z3):
        # (pp: the framework's reshard policy)
        f3, i3 = distinct_rows([Ranked(x.inv[z3], x.radix) for x in (r.tp, r.cp, r.ep, r.dp, r.pp)])
        zero3[z3] = np.array([_zero3_lower_bound(ctx, cands[z3[j]]) for j in f3])[i3]
    t_micro = (1 - COMM_INTERFERENCE) * np.maximum(busy, zero3) + COMM_INTERFERENCE * (busy + zero3)
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
    # Zero-bubble: M max t + (P - 1) max u, u = t minus the weight-gradient GEMMs; max u >=
    # sum u / P, and one micro-batch's forward and input-gradient backward cross every stage
    # in turn, so the pipeline also takes at least sum u.
    serial = u_tau @ counts + ends - head_w

    def pipeline(tm: np.ndarray, sel: Any = slice(None)) -> np.ndarray:
        """The schedule's bound with the slowest rank at tm per micro-batch (1F1B and GPipe:
        (M - 1) tm + every layer once; interleaved: M tm + (P - 1) chunk; zero-bubble as above)."""
        M_, P_, s_ = M[sel], pp[sel], sched[sel]
        return np.where(s_ == 1, M_ * tm + (P_ - 1) * chunk[sel],
                        np.where(s_ == 2, np.maximum(M_ * tm + (P_ - 1) * serial[sel] / P_, serial[sel]),
                                 (M_ - 1) * tm + t_micro[sel]))

    m_lb, opt_step = _static_bounds(ctx, cands, a, M)
    t_lb = np.maximum(t_lb, pipeline(tmax)) + opt_step
    mem = _MemoryBound(ctx, cands, tables, first, inv, a, M, r)

    def refined(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        forced = mem.forced(idx, tmax[idx])
        fit = np.isfinite(forced)
        tm = np.maximum(tmax[idx], np.where(fit, forced, 0.0))
        return np.where(fit, np.maximum(t_lb[idx], pipeline(tm, idx) + opt_step[idx]), np.inf), fit

    def refine(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the time bound of candidates idx with the recompute HBM forces, whether they can fit);
        a candidate with the overlap's modes only (`_MemoryBound.restricted`): at most its twin's."""
        twin = np.where(mem.restricted[idx], mem.twin[idx], -1)
        every = np.union1d(idx, twin[twin >= 0])
        t_all, fit_all = refined(every)
        at = np.searchsorted(every, idx)
        t, fit = t_all[at], fit_all[at]
        r = np.flatnonzero(twin >= 0)
        if len(r):
            tw = np.searchsorted(every, twin[r])
            # (never below its own unrefined bound, which holds for every plan: `RefinedOrder` needs it)
            t[r] = np.maximum(t_lb[idx[r]], np.minimum(t[r], t_all[tw]))
            fit[r] |= fit_all[tw]
        return t, fit

    return t_lb, m_lb, mem.ok, refine


def _static_bounds(ctx: Context, cands: Sequence[Config], a: np.ndarray, M: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(memory lower bound in bytes, the optimizer step's time lower bound in s) per candidate
    (`_lazy_bounds`): the first rank holds at least its share of the sharded weights, gradients and
    optimizer states (params per rank >= total / (tp x pp), experts also / ep, sharded by ZeRO) and,
    with every layer recomputed, each in-flight micro-batch's layer inputs; the data-parallel tail
    includes the optimizer step of the rank holding the most parameters, at least the mean rank's
    (see `cost.tail_model`)."""
    m, tr = ctx.model, ctx.training
    tp, cp, ep, pp, dp, vpp, mbs, zero, sp, etp, sched = a.T
    kinds = m.layer_kinds()
    total = sum(layer_params(m, k)[0] for k in kinds)
    expert = sum(layer_params(m, k)[1] for k in kinds)
    dense = total - expert + m.vocab_size * m.hidden_size * (1 if m.tie_word_embeddings else 2)
    dense_gpu = dense / (tp * pp)
    exp_gpu = expert / (tp * pp * ep)
    w_b, g_b, opt_b = param_bytes(ctx)  # (the precision recipe's weight copies only add to w_b)
    dpc = dp * cp
    edp = np.maximum(1, dpc / ep)

    def per(nb: float, sharded: np.ndarray) -> np.ndarray:
        return np.where(sharded, nb * (dense_gpu / dpc + exp_gpu / edp), nb * (dense_gpu + exp_gpu))

    # (optimizer states in host memory: Candidates share one setting, a list says per configuration)
    offload = cands.opt_offload if isinstance(cands, Candidates) else np.array([c.opt_offload for c in cands], bool)
    static = per(w_b, zero >= 3) + per(g_b, zero >= 2) + np.where(offload, 0.0, per(opt_b, zero >= 1))
    opt_traffic = OPT_TRAFFIC_BYTES * (1.0 if tr.optimizer in ("adam", "adamw") else 2 / 3)
    shard = np.where(zero >= 1, 1.0 / dpc, 1.0)
    frac = 1.0 if tr.finetune == "full" else lora_fraction(m, tr.lora_rank)  # LoRA steps only adapters
    opt_step = frac * opt_traffic * shard * (dense_gpu + exp_gpu) / ctx.hbm_bytes_per_s
    infl = np.where(sched == 1, ((pp - 1) * 2 + (vpp - 1) * pp + 1) / vpp, pp)
    infl = np.where(sched == 3, M, np.minimum(infl, M))
    tokens = mbs * tr.seq_len / cp
    acts = infl * (m.num_hidden_layers / pp) * BF16 * tokens * m.hidden_size / np.where(sp > 0, tp, 1)
    return static + acts, opt_step


Refine = Any  # (idx) -> (refined time bounds, whether each can fit): `_lazy_bounds`
REFINE_BLOCK = 2048  # candidates refined at a time (`RefinedOrder`): a count, so the order is deterministic


class RefinedOrder(Sequence[int]):
    """Candidate indices in order of their refined time bound (ties by index), refined as far as
    read: `t_lb` (the unrefined bound, updated in place as candidates are refined) orders the rest,
    and a candidate comes out once no unrefined one can come before it (its unrefined bound, a
    lower bound of its refined one, is above; equal: refined too, as ties go by index). So reading
    the first k costs the refinement of the candidates whose unrefined bound is at most the k-th's
    refined bound, in blocks of REFINE_BLOCK in unrefined order: the same order as sorting every
    candidate by its refined bound."""

    def __init__(self, idx: np.ndarray, t_lb: np.ndarray, refine: Refine):
        self.t_lb, self.refine = t_lb, refine
        lb = t_lb[idx]
        self.pending = idx[np.argsort(lb, kind="stable")] if not np.isnan(lb).any() else \
            np.array(sorted(idx.tolist(), key=lambda i: (t_lb[i], i)), dtype=np.int64)
        self.at = 0  # pending[at:] are unrefined
        self.heap: list[tuple[float, int]] = []
        self.done: list[int] = []
        self.n = len(idx)

    def _grow(self, k: int) -> None:
        pend, t_lb, heap = self.pending, self.t_lb, self.heap
        while len(self.done) < min(k, self.n):
            while self.at < len(pend) and (not heap or not t_lb[pend[self.at]] > heap[0][0]):
                block = pend[self.at:self.at + REFINE_BLOCK]
                self.at += len(block)
                t, _ = self.refine(block)
                t_lb[block] = t
                for i, v in zip(block.tolist(), t.tolist()):
                    heapq.heappush(heap, (v, i))
            self.done.append(heapq.heappop(heap)[1])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(self.n)
            self._grow(stop)
            return self.done[start:stop:step]
        k = range(self.n)[i]
        self._grow(k + 1)
        return self.done[k]

    def __iter__(self) -> Any:
        k = 0
        while k < self.n:
            self._grow(k + 1)
            yield self.done[k]
            k += 1


def _twins(cands: Sequence[Config]) -> np.ndarray:
    """Per candidate: the index of its twin planned with the EP overlap off (`candidates` puts it
    right after; the same fields but `ep_overlap` False), or -1."""
    n = len(cands)
    out = np.full(n, -1, dtype=np.int64)
    if isinstance(cands, Candidates):
        a, off = _arrays(cands)
        if n > 1:  # (rows built together: the same fields, the overlap left open then off)
            same = (a[1:] == a[:-1]).all(axis=1) & off[1:] & ~off[:-1]
            at = np.flatnonzero(same)
            out[at] = at + 1
        return out
    for i in range(n - 1):
        c, d = cands[i], cands[i + 1]
        if c.ep_overlap is None and d.ep_overlap is False and _with_fields(d, ep_overlap=None) == c:
            out[i] = i + 1
    return out


def _overlap_off(cands: Sequence[Config]) -> np.ndarray:
    """Per candidate: whether it is planned with the EP overlap off (`Config.ep_overlap` False)."""
    if isinstance(cands, Candidates):
        return _arrays(cands)[1]
    return np.array([c.ep_overlap is False for c in cands], dtype=bool)


def _arrays(cands: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """(`_fields` of the candidates, whether each has the EP overlap off), read off their columns once
    (kept in `Candidates.derived`)."""
    got = cands.derived.get("bound fields")
    if got is None:
        c = cands.cols
        sched = np.array([_SCHEDULES[x] for x in cands.schedules] + [0], dtype=np.float64)[c["schedule"]]
        # (column-major: every use reads a column, contiguous so; row-major made each column op stride)
        fields = np.empty((len(cands), len(_FIELDS) + 1), dtype=np.float64, order="F")
        for i, f in enumerate(_FIELDS):  # (etp -1 where None: = tp)
            fields[:, i] = c[f]
        fields[:, -1] = sched
        got = cands.derived["bound fields"] = (fields, cands.overlap_off)
    return got


class _Ranks(NamedTuple):
    """`_fields`' columns ranked (`candidates.Ranked`), for the bounds' groupings."""

    tp: Ranked
    cp: Ranked
    ep: Ranked
    pp: Ranked
    dp: Ranked
    vpp: Ranked
    mbs: Ranked
    zero: Ranked
    sp: Ranked
    etp: Ranked
    sched: Ranked


def _field_ranks(cands: Sequence[Config], a: np.ndarray) -> _Ranks:
    """Each column of `a` (`_fields(cands)`) ranked once (`Ranked.of`; kept in
    `Candidates.derived`): the groupings of one solve's bounds rank the same columns."""
    got = cands.derived.get("field ranks") if isinstance(cands, Candidates) else None
    if got is None:
        got = _Ranks(*map(Ranked.of, a.T))
        if isinstance(cands, Candidates):
            cands.derived["field ranks"] = got
    return got


def _fields(cands: Sequence[Config]) -> np.ndarray:
    """(n, 11): each candidate's `_FIELDS` and schedule (`_SCHEDULES`), etp None as -1; read off
    `Candidates` rows where the candidates are (no Config built)."""
    if isinstance(cands, Candidates):
        return _arrays(cands)[0]
    raw = list(map(attrgetter(*_FIELDS, "schedule"), cands))
    return np.array([r[:9] + (-1 if r[9] is None else r[9], _SCHEDULES[r[10]]) for r in raw],
                    dtype=np.float64).reshape(-1, 11)


def _hull_lines(front: list[tuple[float, float]]) -> tuple[list[tuple[float, float]], float, float]:
    """The lower convex hull of one layer's recompute modes, given as their time / memory Pareto
    front of (activation bytes a, time s) points (`_useful_modes`), as lines: (lines (alpha, beta)
    with f(a) = max_j alpha_j + beta_j a for a >= a_min, a_min, the time at a_min). f is convex and
    nonincreasing, at or under every mode's time at its bytes (so n layers whose activations sum to
    at most B take at least n f(B / n): Jensen), and flat past the fastest mode."""
    hull: list[tuple[float, float]] = []
    for pt in sorted(front):  # (monotone chain, bytes ascending: keep the turns that make it convex)
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (pt[1] - hull[-2][1])
                                  - (hull[-1][1] - hull[-2][1]) * (pt[0] - hull[-2][0])) <= 0:
            hull.pop()
        hull.append(pt)
    lines = [(hull[-1][1], 0.0)]  # flat past the fastest mode
    for (a1, t1), (a2, t2) in zip(hull, hull[1:]):
        beta = (t2 - t1) / (a2 - a1)
        lines.append((t1 - beta * a1, beta))
    return lines, hull[0][0], hull[0][1]


FORCED_BISECTIONS = 20  # steps of the bisection of `_forced_tmax` (the lower end is kept: a bound)
FORCED_BATCH_ROWS = 4096  # the most candidates `_MemoryBound.forced` bisects at once (its arrays: rows x ranks x lines)


def _forced_tmax(room: np.ndarray, infl: np.ndarray, st: np.ndarray, lines: np.ndarray, a_min: np.ndarray,
                 s_min: np.ndarray, ext: np.ndarray, n_k: int, at_least: np.ndarray) -> np.ndarray:
    """Per candidate (rows): max(at_least, a lower bound of the slowest rank's time per micro-batch
    when `n_k` layers of one kind must be split over the ranks (columns) with HBM forcing
    recompute); inf where they cannot fit. Rank p holding n layers keeps (room_p - n st) / infl_p
    bytes for their activations, so takes at least ext_p + n f(that / n) (`_hull_lines`): ext_p +
    max_j (n (alpha_j - beta_j st / infl_p) + beta_j room_p / infl_p), and holds at most
    floor(room_p / (st + infl_p a_min)) layers. The least T at which the ranks' most layers under T
    sum to n_k, by bisection from at_least (most is nondecreasing in T; the lower end is kept). A
    relaxation of `_memory_tmax` (continuous modes, the other kinds free): never above it."""
    # (lines first: the least over the lines is then an element-wise minimum of contiguous slices)
    alpha, beta = lines[:, :, 0].T[:, :, None], lines[:, :, 1].T[:, :, None]  # (J, n, 1)
    coef = alpha - beta * st[None, :, None] / infl  # (J, n, P), > 0
    off = ext + beta * room / infl
    cap = np.minimum(np.floor(np.maximum(room, 0) / (st[:, None] + infl * a_min[:, None]) + 1e-9), n_k)
    feasible = cap.sum(axis=1) >= n_k

    def short(T: np.ndarray, off_: np.ndarray, coef_: np.ndarray, cap_: np.ndarray) -> np.ndarray:
        """Fewer than n_k layers fit under T (the rows' arrays)."""
        n = np.floor(np.minimum.reduce((T[None, :, None] - off_) / coef_, axis=0) + 1e-9)
        return np.clip(n, 0, cap_).sum(axis=1) < n_k

    out = np.where(feasible, at_least, np.inf)
    rows = np.flatnonzero(feasible)
    rows = rows[short(at_least[rows], off[:, rows], coef[:, rows], cap[rows])]  # (the others: HBM forces nothing above)
    if len(rows):
        lo = at_least[rows]
        hi = np.maximum(lo, ext[rows].max(axis=1) + n_k * s_min[rows])  # (every rank at its cap: enough)
        off_r, coef_r, cap_r = off[:, rows], coef[:, rows], cap[rows]  # (gathered once for the bisection)
        for _ in range(FORCED_BISECTIONS):
            mid = 0.5 * (lo + hi)
            below = short(mid, off_r, coef_r, cap_r)
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out[rows] = lo
    return out


@dataclass(frozen=True)
class _LayerFacts:
    """What the numpy bounds read of one table's layer costs (`_layer_facts`)."""

    tau: list[float]  # per kind: the least time of a layer (fastest mode)
    u_tau: list[float]  # per kind: the least time less weight gradients
    kp: list[tuple[float, float, float]]  # per kind: (params, expert params, least activation bytes)
    work: float  # the largest working set of any layer
    big: float  # the most params of any layer
    hulls: list[tuple[list[tuple[float, float]], float, float]]  # per kind: `_hull_lines` of its modes


def beside_ep_overlap(ctx: Context, modes: list[str]) -> list[str]:
    """The recompute modes among `modes` the framework runs beside the EP overlap (Megatron refuses
    it beside full recompute and the moe module: `cost.ep_overlap_blocked`)."""
    return [m for m in modes if not ep_overlap_blocked(ctx, [m])]


def _layer_facts(ctx: Context, table: Table, ks: list[str], overlap_modes: bool) -> _LayerFacts:
    """`_LayerFacts` of a table's layers, over every mode (`overlap_modes`: only those the framework
    runs beside the EP overlap, for `kp` and the hulls; tau over every mode), memoized with the layer
    costs (`Table.memo`, shared by the tables that share them) and kind by kind (`_kind_facts`: tables
    of other shapes share a kind's costs, `cost.layers._kind_costs`)."""
    key = ("layer facts", tuple(ks), overlap_modes)
    got = table.memo.get(key)
    if got is not None:
        return got
    per_kind = table.memo.get(KIND_DICTS)
    shared = per_kind is not None  # (else a table built without `shared_costs`: grouped here, not memoized)
    if per_kind is None:
        per_kind = {k: {} for k in ks}
        for (k, r), x in table.layers.items():
            per_kind[k][r] = x
    # (the facts read nothing but the kinds' {mode: cost} dicts: tables of other shapes whose kinds share
    # those very dicts, `cost.layers._kind_costs`, share one `_LayerFacts`; the memo keeps the dicts alive)
    memo, dicts = _solve_memo(ctx), tuple(per_kind[k] for k in ks)
    by_dicts = ("layer facts of", tuple(ks), overlap_modes, *map(id, dicts))
    hit = memo.get(by_dicts) if shared else None
    if hit is not None:
        got = table.memo[key] = hit[1]
        return got
    usable = _usable_modes(ctx, tuple(sorted(set().union(*per_kind.values()))), overlap_modes)
    per = [_kind_facts(ctx, per_kind[k], usable, shared) for k in ks]
    got = _LayerFacts([f[0] for f in per], [f[1] for f in per], [f[2] for f in per],
                      max(f[3] for f in per), max(f[4] for f in per), [f[5] for f in per])
    table.memo[key] = got
    if shared:
        memo[by_dicts] = (dicts, got)
    return got


def _usable_modes(ctx: Context, every: tuple[str, ...], overlap_modes: bool) -> tuple[str, ...]:
    """`every` mode, or (`overlap_modes`) those the framework runs beside the EP overlap; every mode
    where it blocks them all, as `_Search.modes_for` would have none (memoized for the solve)."""
    memo = _solve_memo(ctx)
    key = ("usable modes", every, overlap_modes)
    got = memo.get(key)
    if got is None:
        got = memo[key] = tuple((beside_ep_overlap(ctx, list(every)) if overlap_modes else every) or every)
    return got


def _kind_facts(ctx: Context, costs: dict[str, Cost], usable: tuple[str, ...], shared: bool) -> tuple:
    """One kind's part of `_LayerFacts` from its {mode: cost}: (tau, u_tau, kp, work, big, hull), the
    front over the `usable` modes (`pareto_modes`, as `_useful_modes`); memoized for the solve on the identity
    of the dict where it is one `cost.layers._kind_costs` shares (`shared`; the memo keeps it alive)."""
    memo = _solve_memo(ctx)
    key = ("kind facts", id(costs), usable)
    got = memo.get(key) if shared else None
    if got is not None:
        return got[1]
    total = {r: x.total_s for r, x in costs.items()}
    tau = min(total.values())
    u_tau = min(total[r] - x.wgrad_s for r, x in costs.items())
    front = [(costs[r].act_bytes, total[r]) for r in pareto_modes(costs, usable, total)]
    first = next(iter(costs.values()))
    facts = (tau, u_tau, (first.params, first.expert_params, min(a for a, _ in front)),
             max(x.work_bytes for x in costs.values()), max(x.params for x in costs.values()), _hull_lines(front))
    if shared:
        memo[key] = (costs, facts)
    return facts


class _MemoryBound:
    """What HBM allows each candidate: `ok`, whether some split could fit, every layer at its
    leanest mode (False only where none can), and `forced`, a lower bound of the slowest rank's
    time per micro-batch where HBM forces recompute.

    Rank p, with its fixed bytes (working set, ZeRO-3 gathers, embedding or LM head), holds at most
    floor(room_p / (static + infl_p x activations)) layers of a kind; every rank needs vpp layers,
    each kind must fit (the others taken as free), and all layers at the smaller size. Time:
    `_forced_tmax` per kind (the others taken as free), the largest. Static bytes per parameter
    (`cost.static_bytes`) and in-flight micro-batches (`cost.inflight_microbatches`) are taken
    once per distinct group."""

    def __init__(self, ctx: Context, cands: Sequence[Config], tables: list[Table], first: np.ndarray,
                 inv: np.ndarray, a: np.ndarray, M: np.ndarray, ranks: "_Ranks"):
        kinds = ctx.model.layer_kinds()
        self.kinds, self.ks = kinds, sorted(set(kinds))
        ks = self.ks
        tp, cp, ep, pp, dp, vpp, mbs, zero, sp, etp, sched = a.T
        # Per table: per kind (dense params, expert params per GPU, leanest activations), the working
        # set, the largest layer's params, and the embedding's and LM head's (static params, acts).
        # The modes each table's plans may use: where it runs the EP overlap left open (`ep_overlap`
        # None) and the candidates have a twin with the overlap off (`candidates`: the same for the
        # whole group, whose key holds ep, pp = 1, vpp > 1 and M >= 2), not those the framework refuses
        # beside the overlap (`_Search.modes_for`). A placement where the overlap does not pay prices
        # them as the twin does, so such a candidate's bounds are also capped by its twin's (`refine`).
        self.twin = _twins(cands)
        overlap = [tb.cfg.ep_overlap is None and bool(tb.memo.get("ep_overlap")) and self.twin[j] >= 0
                   for tb, j in zip(tables, first)]
        self.restricted = np.array(overlap, dtype=bool)[inv]
        # (the tables share far fewer facts, `_layer_facts`: their arrays are built once per distinct
        # facts and gathered per table, fx)
        facts, fx = distinct_objects([_layer_facts(ctx, tb, ks, on) for tb, on in zip(tables, overlap)])
        of_cand = np.asarray(fx)[inv]  # (each candidate's facts)
        # Per table: per kind (dense params, expert params per GPU, leanest activations), the working
        # set, the largest layer's params, and the embedding's and LM head's (static params, acts).
        # (kp and ends candidate-last, [kind or end, field, candidate]: each field's gather reads one
        # contiguous row, not a stride of the whole array)
        self.kp = np.take(np.ascontiguousarray(np.array([f.kp for f in facts]).transpose(1, 2, 0)), of_cand, axis=2)
        self.work = np.array([f.work for f in facts])[of_cand]
        self.head_work = np.maximum(self.work, np.array([tb.head.work_bytes for tb in tables])[inv])
        big = np.array([f.big for f in facts])[of_cand]
        self.ends = np.array([[(tb.embed.params, tb.embed.expert_params, tb.embed.act_bytes),
                               (tb.head.params, tb.head.expert_params, tb.head.act_bytes)]
                              for tb in tables]).transpose(1, 2, 0)
        self.ends = np.take(np.ascontiguousarray(self.ends), inv, axis=2)
        # What only `forced` reads (the candidates refined), per table, read through `self.table`:
        # the embedding's and LM head's times and, per kind, the lower hull of its modes' (activation
        # bytes, time), as J lines (padded with the flat one), its least bytes and the time there.
        self.table = inv
        self.end_s = np.array([(tb.embed.total_s, tb.head.total_s) for tb in tables])
        J = max(len(h[0]) for f in facts for h in f.hulls)
        self.lines = np.array([[h[0] + [h[0][0]] * (J - len(h[0])) for h in f.hulls] for f in facts])[fx]
        self.a_min = np.array([[h[1] for h in f.hulls] for f in facts])[fx]
        self.s_amin = np.array([[h[2] for h in f.hulls] for f in facts])[fx]
        # Static bytes per dense and per expert parameter: linear in both (`cost.static_bytes`).
        # (pp: the framework's reshard policy, kept weights)
        fs, gi = distinct_rows([ranks.tp, ranks.cp, ranks.dp, ranks.etp, ranks.ep, ranks.zero, ranks.pp])
        reps = [cands[j] for j in fs]
        coef = np.array([(sum(static_bytes(ctx, c, 1.0, 0.0).values()), sum(static_bytes(ctx, c, 1.0, 1.0).values()))
                         for c in reps])[gi]
        self.per_d, self.per_e = coef[:, 0], coef[:, 1] - coef[:, 0]
        data_parallel = np.array([c.data_parallel for c in reps])[gi]
        self.z3 = np.where((zero == 3) & data_parallel, zero3_gathered_bytes(ctx, big), 0.0)
        self.cap = ctx.capacity_bytes * (1 + 1e-9)
        # Groups of (pp, vpp, schedule, micro-batches): one rank layout and in-flight count each.
        fi, self.group = distinct_rows([ranks.pp, ranks.vpp, ranks.sched, M])
        self.infl = [np.array([inflight_microbatches(cands[j], p, int(M[j])) for p in range(cands[j].pp)])[None, :]
                     for j in fi]
        self.need = [cands[j].vpp if cands[j].pp > 1 else len(kinds) for j in fi]
        # (for `forced`: per group its pipeline ranks, and the in-flight rows of the groups of each
        # pipeline degree stacked, with each group's row)
        self.stages = np.array([x.shape[1] for x in self.infl], dtype=np.int64)
        self.row_of = np.zeros(len(self.infl), dtype=np.int64)
        self.infl_rows: dict[int, np.ndarray] = {}
        for P in np.unique(self.stages).tolist():
            members = np.flatnonzero(self.stages == P)
            self.row_of[members] = np.arange(len(members))
            self.infl_rows[P] = np.concatenate([self.infl[g] for g in members])
        self.ok = np.ones(len(cands), dtype=bool)
        for g, sel in self._by_group(np.arange(len(cands))):
            self.ok[sel] = self._fits(g, sel)
        r = np.flatnonzero(self.restricted)
        self.ok[r] |= self.ok[self.twin[r]]  # (where the overlap does not pay, it fits as its twin does)

    def _by_group(self, idx: np.ndarray) -> Any:
        """(group, the indices of idx in it), group by group in order."""
        gid = self.group[idx]
        by = np.argsort(gid, kind="stable")
        cuts = np.flatnonzero(np.diff(gid[by])) + 1
        for part in np.split(by, cuts) if len(by) else []:
            yield int(gid[part[0]]), idx[part]

    def static(self, sel: np.ndarray, params: np.ndarray, eparams: np.ndarray) -> np.ndarray:
        return self.per_d[sel] * params + self.per_e[sel] * eparams

    def _room(self, g: int, sel: np.ndarray) -> np.ndarray:
        """(n, P): the bytes each rank has for its layers (candidates sel, all of group g)."""
        return self._room_rows(sel, np.broadcast_to(self.infl[g], (len(sel), self.infl[g].shape[1])))

    def _room_rows(self, sel: np.ndarray, infl: np.ndarray) -> np.ndarray:
        """`_room` of candidates sel of one pipeline degree, each with its in-flight counts (rows of infl)."""
        P = infl.shape[1]
        room = np.broadcast_to((self.cap - self.work[sel] - self.z3[sel])[:, None], (len(sel), P)).copy()
        room[:, -1] -= self.head_work[sel] - self.work[sel]
        for e, p in ((0, 0), (1, P - 1)):
            end = self.ends[e]
            room[:, p] -= self.static(sel, end[0][sel], end[1][sel]) + infl[:, p] * end[2][sel]
        return room

    def _fits(self, g: int, sel: np.ndarray) -> np.ndarray:
        kinds, ks, kp, infl = self.kinds, self.ks, self.kp, self.infl[g]
        P = infl.shape[1]
        room = self._room(g, sel)
        sizes = np.stack([self.static(sel, kp[i, 0][sel], kp[i, 1][sel])[:, None] + infl * kp[i, 2][sel][:, None]
                          for i in range(len(ks))])  # (kinds, n, P)
        most = np.floor(np.maximum(room, 0)[None] / sizes + 1e-9)  # layers of each kind a rank can hold
        lean = np.floor(np.maximum(room, 0) / sizes.min(axis=0) + 1e-9)
        need = self.need[g]
        good = (room >= 0).all(axis=1) & (lean >= need).all(axis=1) & (lean.sum(axis=1) >= len(kinds))
        for i, k in enumerate(ks):
            good &= most[i].sum(axis=1) >= kinds.count(k)
        if P == 1:  # one rank holds every layer
            good &= sum(kinds.count(k) * sizes[i, :, 0] for i, k in enumerate(ks)) <= room[:, 0]
        return good

    def forced(self, idx: np.ndarray, at_least: np.ndarray) -> np.ndarray:
        """Per candidate of idx: max(at_least, the slowest rank's least time per micro-batch HBM
        allows, `_forced_tmax` per kind); inf where none can fit. The candidates of one pipeline
        degree at once, each with its group's in-flight counts, up to FORCED_BATCH_ROWS at a time
        (every candidate's bound is its own: batches change no value)."""
        out = np.where(self.ok[idx], at_least, np.inf)
        ids = idx[self.ok[idx]]
        if not len(ids):
            return out
        pos = np.empty(int(idx.max()) + 1, dtype=np.int64)
        pos[idx] = np.arange(len(idx))
        gid = self.group[ids]
        by = np.argsort(self.stages[gid], kind="stable")
        ids, gid = ids[by], gid[by]
        cuts = np.flatnonzero(np.diff(self.stages[gid])) + 1
        for part, groups in zip(np.split(ids, cuts), np.split(gid, cuts)):
            infl = self.infl_rows[int(self.stages[groups[0]])][self.row_of[groups]]
            for at in range(0, len(part), FORCED_BATCH_ROWS):
                rows = slice(at, at + FORCED_BATCH_ROWS)
                self._forced_rows(part[rows], infl[rows], out, pos)
        return out

    def _forced_rows(self, sel: np.ndarray, infl: np.ndarray, out: np.ndarray, pos: np.ndarray) -> None:
        """`forced` of candidates sel of one pipeline degree (their in-flight counts: infl), into out at pos."""
        room = self._room_rows(sel, infl)
        tab = self.table[sel]
        ext = np.zeros(room.shape)
        ext[:, 0] += self.end_s[tab, 0]
        ext[:, -1] += self.end_s[tab, 1]
        t = out[pos[sel]]
        for i, k in enumerate(self.ks):
            t = _forced_tmax(room, infl, self.static(sel, self.kp[i, 0][sel], self.kp[i, 1][sel]), self.lines[tab, i],
                             self.a_min[tab, i], self.s_amin[tab, i], ext, self.kinds.count(k), t)
        out[pos[sel]] = t


def _zero3_lower_bound(ctx: Context, cfg: Config) -> float:
    """ZeRO-3 traffic of one micro-batch through every layer (all-gather for the forward, again
    for the backward as the reshard policy has it, reduce-scatter of the gradients), each group on
    consecutive GPUs: under hierarchical sharding the shard group only (the replicas' all-reduce left
    out), the backward's gather none ("never") or over the secondary group (N)."""
    m, lv, g = ctx.model, ctx.levels, ctx.graph
    r = cfg.dp_replicate
    dp_cp = contiguous_profile(g, max(1, cfg.dp * cfg.cp // r))
    edp = contiguous_profile(g, max(1, cfg.dp * cfg.cp // cfg.ep // r))
    policy = reshard_policy(ctx.framework, cfg)
    group = policy if isinstance(policy, int) else 1  # the secondary shard group (N), else unused
    sec_d, sec_e = contiguous_profile(g, min(group, dp_cp.size)), contiguous_profile(g, min(group, edp.size))
    w_b, g_b = zero3_bytes_per_param(ctx)
    w_b, g_b = min(w_b, BF16), min(g_b, BF16)  # (bf16 stands in for more: still a lower bound)
    kinds = m.layer_kinds()
    total = 0.0
    for k in sorted(set(kinds)):  # (layers of one kind cost the same)
        params, experts = layer_params(m, k)
        d_loc, e_loc = (params - experts) / cfg.tp, experts / (cfg.tp * cfg.ep)
        ag = all_gather_s(lv, dp_cp, w_b * d_loc) + all_gather_s(lv, edp, w_b * e_loc)
        rs = reduce_scatter_s(lv, dp_cp, g_b * d_loc) + reduce_scatter_s(lv, edp, g_b * e_loc)
        ag_bwd = ag if policy == "always" else 0.0 if policy == "never" else \
            all_gather_s(lv, sec_d, w_b * d_loc) + all_gather_s(lv, sec_e, w_b * e_loc)
        if zero3_step_sync(ctx.framework, cfg):  # reduced (and, kept, gathered) once per step: in the tail
            rs, ag = 0.0, 0.0 if policy == "never" else ag
        total += kinds.count(k) * (ag + ag_bwd + rs)
    return total


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
    kinds = _kinds(ctx)
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


FRONT_CAP = 256  # points kept per (kind, layer count) front; beyond, bytes are rounded down (still a bound)
_EDGE_RAMP = np.arange(FRONT_CAP + 1, dtype=np.float64)  # (`_pareto`'s bucket edges: 0, 1, ..., FRONT_CAP)


def _pareto(b: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (bytes ascending, time strictly descending) Pareto front of the points (b, t); past
    FRONT_CAP points, an optimistic front: each of FRONT_CAP byte buckets becomes one point
    with the bucket's least bytes and least time (so sums stay lower bounds).

    Sorted by bytes alone (stable: the input is a few sorted runs, `_FrontSet.extend`), then of
    points with equal bytes the last kept: the running minimum makes it the least time among them,
    the point a sort by (bytes, time) would keep first, so the front's values are the same."""
    o = np.argsort(b, kind="stable")
    b, t = b[o], t[o]
    keep = np.empty(len(t), dtype=bool)
    keep[0] = True
    np.less(t[1:], np.minimum.accumulate(t)[:-1], out=keep[1:])
    b, t = b[keep], t[keep]
    if len(b) > 1:
        last = np.empty(len(b), dtype=bool)
        last[-1] = True
        np.not_equal(b[1:], b[:-1], out=last[:-1])
        if not last.all():
            b, t = b[last], t[last]
    if len(b) > FRONT_CAP:
        # (np.linspace(b[0], b[-1], FRONT_CAP + 1) as numpy computes it, without its Python overhead:
        # a ramp times the step, plus the start, the last edge the stop; b is strictly increasing here)
        step = (b[-1] - b[0]) / FRONT_CAP
        if step > 0:
            edges = _EDGE_RAMP * step
            edges += b[0]
            edges[-1] = b[-1]
        else:  # (a span of a few subnormals: numpy's own path for it)
            edges = np.linspace(b[0], b[-1], FRONT_CAP + 1)
        bucket = np.minimum(np.searchsorted(edges, b, side="right") - 1, FRONT_CAP - 1)
        change = np.empty(len(b), dtype=bool)
        change[0] = True
        np.not_equal(bucket[1:], bucket[:-1], out=change[1:])
        first = np.flatnonzero(change)
        last_ = np.empty_like(first)
        last_[:-1] = first[1:] - 1
        last_[-1] = len(b) - 1
        b, t = b[first], t[last_]  # least bytes and least time of each bucket
    return b, t


class _FrontSet:
    """Per count n = 0, 1, ...: the (activation bytes, least time) front of n layers over every mix
    of the modes whose one-layer (bytes, time) are (a, s), computed as far as asked (`upto`): the
    front of n layers is the capped Pareto front of the front of n - 1 plus each mode, so a prefix
    never changes when the set grows. With the lookup arrays of `_least_time` (`padded`). Shared by
    the threads of a round's descents (the stage model's rank cuts read `_rank_times`): it grows
    under a lock."""

    def __init__(self, a: np.ndarray, s: np.ndarray):
        self.a, self.s = a, s
        self.fronts: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(1), np.zeros(1))]
        self.lean = [0.0]  # per count: the front's least bytes (every layer in the leanest mode)
        self._padded: tuple | None = None
        self._lock = threading.RLock()

    def upto(self, n_max: int) -> list[tuple[np.ndarray, np.ndarray]]:
        a, s = self.a, self.s
        with self._lock:
            while len(self.fronts) <= n_max:
                b, t = self.fronts[-1]
                # (mode-major: one sorted run of bytes per mode)
                self.fronts.append(_pareto((a[:, None] + b[None, :]).ravel(), (s[:, None] + t[None, :]).ravel()))
                self._padded = None
            return self.fronts[:n_max + 1]

    def least_bytes(self, n_max: int) -> np.ndarray:
        """Per count n <= n_max: the least bytes of its front (without building the fronts): the
        leanest mode's bytes added n times, the same sums the fronts' first points hold (each front's
        least-bytes point is the previous one's plus the least a, and a sort keeps it first)."""
        lean, a_min = self.lean, float(self.a.min())
        with self._lock:
            while len(lean) <= n_max:
                lean.append(lean[-1] + a_min)
            return np.array(lean[:n_max + 1])

    def padded(self, n_max: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The fronts up to n_max as [count, point] arrays padded with +inf bytes (B, T); the distinct
        byte values of every front (U, sorted, +inf last) and each point's rank among them (1-based),
        offset by count (R, flat and sorted). Built for every front computed so far; rows past
        n_max are not read. Where the fronts must grow, they grow by half again (up to `limit`, the
        most ever asked): the arrays are rebuilt a few times, not once per count."""
        with self._lock:
            if n_max >= len(self.fronts) and limit is not None:
                n_max = max(n_max, min(limit, (3 * len(self.fronts)) // 2))
            self.upto(n_max)
            if self._padded is None:
                fronts = self.fronts
                width = max(len(b) for b, _ in fronts)
                B = np.full((len(fronts), width), np.inf)
                T = np.full((len(fronts), width), np.inf)
                for j, (b, t) in enumerate(fronts):
                    B[j, :len(b)], T[j, :len(t)] = b, t
                # (+inf closes U: a room of +inf, or NaN, counts the padding too, as a binary search of B would)
                U = np.append(np.unique(B[np.isfinite(B)]), np.inf)
                ranks = np.searchsorted(U, B, side="left") + 1
                R = (ranks + np.arange(len(fronts))[:, None] * (len(U) + 1)).ravel()
                self._padded = (B, T, U, R)
            return self._padded


# Fronts by value: a count's front depends only on the modes' (activation bytes, time), so
# configurations whose layer costs price the same (other ep, dp or ZeRO stage, other placements)
# share one `_FrontSet`. Bounded (cleared when full): a pure function of its key, so the cache
# changes no answer, only how often a front is computed.
_FRONTS_BY_VALUE: dict[tuple, _FrontSet] = {}
_FRONTS_CACHE_MAX = 4096


def _mode_arrays(table: Table, kind: str, modes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(activation bytes, time) of one layer of `kind` under each of `modes`, as arrays in that order."""
    costs = [table.layers[(kind, r)] for r in modes]
    return np.array([c.act_bytes for c in costs]), np.array([c.total_s for c in costs])


def _front_set(table: Table, kind: str, modes: list[str]) -> _FrontSet:
    """The `_FrontSet` of `kind`'s layers over `modes` (memoized per set of shared layer costs and by value)."""
    key = ("frontset", kind, tuple(modes))
    got = table.memo.get(key)
    if got is None:
        a, s = _mode_arrays(table, kind, modes)
        vkey = (a.tobytes(), s.tobytes())
        got = _FRONTS_BY_VALUE.get(vkey)
        if got is None:
            if len(_FRONTS_BY_VALUE) >= _FRONTS_CACHE_MAX:
                _FRONTS_BY_VALUE.clear()
            got = _FRONTS_BY_VALUE[vkey] = _FrontSet(a, s)
        table.memo[key] = got
    return got


def _mix_fronts(table: Table, kind: str, modes: list[str], n_max: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per count n = 0..n_max: the (activation bytes, least time) front of n layers of `kind`
    over every mix of recompute modes (`_FrontSet`)."""
    return _front_set(table, kind, modes).upto(n_max)


class _RankSpace(NamedTuple):
    """What `_rank_times` and `_one_rank_tmax` read before pricing any layer mix: the two kinds
    (dense first; one kind: first None) and their counts, each kind's static bytes per layer
    (s1, s2), per rank the in-flight micro-batches, the activation room left beside the fixed
    bytes (`room`, in one micro-batch's bytes) and the embedding / head time (`t_ex`)."""
    first: str | None
    second: str
    n1: int
    n2: int
    s1: float
    s2: float
    infl: np.ndarray
    room: np.ndarray
    t_ex: list[float]


def _rank_space(ctx: Context, table: Table, modes: list[str]) -> _RankSpace:
    """`_RankSpace` of a table: rank p needs fixed_p + its layers' static bytes + infl_p x their
    activations."""
    cfg, lay = table.cfg, table.layers
    P = cfg.pp
    counts = _kind_counts(ctx)
    ks = list(counts)  # dense before moe
    first, second = (ks[0], ks[1]) if len(ks) == 2 else (None, ks[0])
    n1, n2 = (counts[first] if first else 0), counts[second]
    per_dense = sum(static_bytes(ctx, cfg, 1.0, 0.0).values())
    per_exp = sum(static_bytes(ctx, cfg, 1.0, 1.0).values()) - per_dense

    def static(c) -> float:
        return per_dense * c.params + per_exp * c.expert_params

    z3 = zero3_gathered_for(ctx, cfg, lay.values())
    t_ex = (_stage_extras(table, P * cfg.vpp, per_rank=True)[0] if P > 1
            else [table.embed.total_s + table.head.total_s])
    infl = np.array([inflight_microbatches(cfg, p, table.microbatches) for p in range(P)])
    ends = [([table.embed] if p == 0 else []) + ([table.head] if p == P - 1 else []) for p in range(P)]
    fixed = np.array([sum(static(c) + infl[p] * c.act_bytes for c in e) + working_bytes(table, p == P - 1, p == 0) + z3
                      for p, e in enumerate(ends)])
    room = (ctx.capacity_bytes * (1 + 1e-9) - fixed) / infl  # activation bytes each rank can hold, before layers
    s1 = static(lay[(first, modes[0])]) if first else 0.0
    s2 = static(lay[(second, modes[0])])
    return _RankSpace(first, second, n1, n2, s1, s2, infl, room, t_ex)


def _rank_times(ctx: Context, table: Table, modes: list[str], count_max: int | None = None) -> np.ndarray:
    """t[p, d, n]: the least time per micro-batch of pipeline rank p holding d layers of the
    first kind and n of the second (one kind: d = 0) with its recompute mix chosen to fit HBM
    exactly, whole layers (inf where no mix fits). Rank p needs fixed_p + its layers' static
    bytes + infl_p x their activations (`_rank_space`); the fronts of the two kinds are combined
    point by point. Made nondecreasing in n (a rank with more layers is never faster).

    `count_max`: only the counts n <= count_max (shape (P, D, count_max + 1)): every entry the same
    as the full array's (each count is priced on its own, and a running maximum's prefix is the
    prefix's running maximum)."""
    P = table.cfg.pp
    first, second, n1, n2, s1, s2, infl, room, t_ex = _rank_space(ctx, table, modes)
    # (over the first kind's useful modes: a mode left out is no faster than a kept one that keeps no
    # more bytes, so a mix using it is weakly dominated by the same mix with the kept mode, and the
    # fronts' values are the same, bucketing included; fewer points to combine below)
    f1 = _mix_fronts(table, first, _useful_modes(table, first, modes), n1) if first else [(np.zeros(1), np.zeros(1))]
    n_cols = n2 + 1 if count_max is None else min(n2, count_max) + 1
    n = np.arange(n_cols)
    # Every point of every first-kind front at once: q = (d first-kind layers, their bytes bb, time tt).
    d_q = np.concatenate([np.full(len(b1), d) for d, (b1, _) in enumerate(f1)])
    bb_q = np.concatenate([b1 for b1, _ in f1])
    tt_q = np.concatenate([t1 for _, t1 in f1])
    n_top = n_cols - 1
    if len(_useful_modes(table, second, modes)) > 2:
        # Counts past the last whose leanest mix fits some rank's room beside no first-kind layer (q = 0,
        # the zero point: the most room of any point, since every other point's bytes and static bytes
        # are >= 0) cost inf in `_least_time` for every point; left is built only up to it.
        left0 = room[:, None] - (d_q[0] * s1 + n[None, :] * s2) / infl[:, None] - bb_q[0]
        lean = _front_set(table, second, _useful_modes(table, second, modes)).least_bytes(n_cols - 1)
        can = ~(left0 < lean).all(axis=0)
        n_top = int(np.flatnonzero(can)[-1]) if can.any() else 0
    n = n[:n_top + 1]
    # second-kind activation bytes each rank p can hold beside them: left[q, p, n]
    left = (room[None, :, None] - (d_q[:, None, None] * s1 + n[None, None, :] * s2) / infl[None, :, None]
            - bb_q[:, None, None])
    t_q = _least_time(table, second, modes, left) + tt_q[:, None, None]
    out = np.full((P, n1 + 1, n_cols), np.inf)
    at = 0  # (d_q is d's points in one run per d, in order: a slice each)
    for d, (b1, _) in enumerate(f1):
        out[:, d, :n_top + 1] = t_q[at:at + len(b1)].min(axis=0)
        at += len(b1)
    out += np.array(t_ex)[:, None, None]
    return np.maximum.accumulate(out, axis=2)


def _useful_modes(table: Table, kind: str, modes: list[str]) -> list[str]:
    """The kind's time / memory Pareto modes among `modes`, fastest first (memoized)."""
    key = ("useful", kind, tuple(modes))
    got = table.memo.get(key)
    if got is None:
        got = table.memo[key] = pareto_modes({r: table.layers[(kind, r)] for r in modes}, modes)
    return got


def pareto_modes(costs: dict[str, Cost], modes: Sequence[str], total: dict[str, float] | None = None) -> list[str]:
    """The time / memory Pareto modes among `modes` of one layer's {mode: cost}, fastest first (ties in
    time: the leaner first; a mode is kept only if it keeps fewer activation bytes than the last kept).
    `total`: each mode's `Cost.total_s` where the caller has them."""
    if total is None:
        total = {r: costs[r].total_s for r in modes}
    got: list[str] = []
    for r in sorted(modes, key=lambda r: (total[r], costs[r].act_bytes)):
        if not got or costs[r].act_bytes < costs[got[-1]].act_bytes:
            got.append(r)
    return got


ENUMERATED_CELLS = 1 << 16  # `_least_time` enumerates mixes while (room cells x mixes per count) stay within this
# (beyond, the fronts, built once per set of mode costs, cost less: 4 modes at 1 << 20 took 12x the
# fronts' time on DeepSeek-V3 2,048 H100; 3 modes at 1 << 16 take 0.4x on Mixtral 8x22B 122 layers)
EXACT_MIX_MODES = 4  # ... and the useful modes are at most this many (mixes: n^(k-2) / (k-2)!)


def _fewest_moved(rest: np.ndarray, save: float) -> np.ndarray:
    """The fewest layers (>= 0) that save at least `rest` bytes at `save` bytes each: the quotient's
    ceiling, corrected by one either way where the division rounded across a whole number (the
    product decides, as a sum of bytes would). NaN stays NaN (it fits nothing)."""
    moved = np.ceil(rest / save)
    moved -= (moved - 1) * save >= rest
    moved += moved * save < rest
    return np.maximum(0.0, moved)


@functools.lru_cache(maxsize=256)
def _mix_grid(k: int, n: int) -> np.ndarray:
    """Every count of modes 2..k-1 (k - 2 of them; k >= 2) summing to at most n: [rows, k - 2]
    integers, the zero row first (read only)."""
    if k == 2:
        grid = np.zeros((1, 0), dtype=np.int64)
    else:
        axes = np.meshgrid(*[np.arange(n + 1)] * (k - 2), indexing="ij")
        grid = np.stack([x.ravel() for x in axes], axis=1)
        grid = grid[grid.sum(axis=1) <= n]
    grid.flags.writeable = False
    return grid


def _least_extra(over: np.ndarray, n: np.ndarray, a: np.ndarray, s: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """[...]: the least time above n x the fastest mode's of n layers (n broadcast with `over`) whose
    mix saves at least `over` bytes against every layer at the fastest mode (inf if none does): for
    every row of `grid` (counts of modes 2.., `_mix_grid`), the fewest layers moved from the fastest
    mode to the second (`_fewest_moved`). a: activation bytes, descending; s: time, ascending."""
    save, extra = a[0] - a[1:], s[1:] - s[0]  # per layer moved to mode m: bytes saved, time added
    used = grid.sum(axis=1)
    moved = _fewest_moved(over[..., None] - grid @ save[1:], save[0])
    ok = moved <= n[..., None] - used  # (rows past n: negative room for the moved ones, never ok)
    return np.where(ok, moved * extra[0] + grid @ extra[1:], np.inf).min(axis=-1)


def _enumerated_least_time(a: np.ndarray, s: np.ndarray, room: np.ndarray) -> np.ndarray:
    """`_least_time` for three or four useful modes (a: activation bytes, descending; s: time,
    ascending), exact in whole layers (`_least_extra` over every count of the modes past the two
    fastest). The fronts' values without their bucketing (FRONT_CAP), so at least theirs; a room
    of +inf fits every layer at the fastest mode, a NaN room nothing."""
    N = room.shape[-1]
    n = np.arange(N, dtype=np.float64)
    return n * s[0] + _least_extra(n * a[0] - room, n, a, s, _mix_grid(len(a), N - 1))


def _enumerated_size(k: int, n: int) -> int:
    """Rows of `_mix_grid(k, n)` (without building it)."""
    return math.comb(n + k - 2, k - 2)


def _least_time(table: Table, kind: str, modes: list[str], room: np.ndarray) -> np.ndarray:
    """[..., n]: the least time of n layers of `kind` whose activations fit in room[..., n] bytes
    (inf if none; any leading axes, e.g. [point, rank, n]). Two useful modes (the usual case): the
    fewest layers in the leaner mode, in closed form; three or four: every count of the modes past
    the two fastest, the rest in closed form (`_enumerated_least_time`, while the rooms times the
    mixes stay within ENUMERATED_CELLS); else: a search of each count's front (`_mix_fronts`)."""
    lay = table.layers
    useful = _useful_modes(table, kind, modes)
    n = np.arange(room.shape[-1])
    if len(useful) <= 2:
        fast, lean = lay[(kind, useful[0])], lay[(kind, useful[-1])]
        over = n * fast.act_bytes - room
        save = fast.act_bytes - lean.act_bytes
        k = np.maximum(0.0, np.ceil(over / save - 1e-9)) if save > 0 else np.where(over > 0, np.inf, 0.0)
        return np.where(k <= n, n * fast.total_s + np.minimum(k, n) * (lean.total_s - fast.total_s), np.inf)
    cells = room.size * _enumerated_size(len(useful), room.shape[-1] - 1)
    if len(useful) <= EXACT_MIX_MODES and cells <= ENUMERATED_CELLS:
        return _enumerated_least_time(*_mode_arrays(table, kind, useful), room)
    # Counts past the last one whose leanest mix (every layer in the leanest mode: the front's least
    # bytes) fits some room cost inf: a binary search finds no point of their front at or under the
    # room. Their fronts are never built: a rank holds far fewer layers than the model has.
    fs = _front_set(table, kind, useful)
    N = room.shape[-1]
    least = fs.least_bytes(N - 1)
    can = ~(room < least).reshape(-1, N).all(axis=0)  # (NaN rooms count as fitting, as a binary search has it)
    n_need = int(np.flatnonzero(can)[-1]) if can.any() else 0
    B, T, U, R = fs.padded(n_need, N - 1)
    width = B.shape[1]
    rows = np.arange(n_need + 1)
    # per rank and count: how many front points (bytes ascending) fit, i.e. the leanest that fits; a
    # binary search per cell (O(log width), not a comparison with every point of the front), every
    # count at once: a room's rank among the fronts' distinct byte values (U), then that rank among
    # the count's own ranks (R, offset by count so one sorted array holds them all). The number of
    # the count's points <= room is the number of its ranks <= the room's rank: the same index as a
    # binary search of B[j] itself.
    g = np.searchsorted(U, room[..., :n_need + 1], side="right")  # distinct front values <= room
    i = np.searchsorted(R, g + rows * (len(U) + 1), side="right") - rows * width - 1
    out = np.full(room.shape, np.inf)
    out[..., :n_need + 1] = np.where(i >= 0, T[rows, np.maximum(i, 0)], np.inf)
    return out


def _spread(mask: int, lo: int, hi: int) -> int:
    """OR of mask << s for s = lo..hi (a set of sums as a bit mask, plus any of lo..hi)."""
    x, span, w = mask << lo, hi - lo + 1, 1
    while 2 * w <= span:
        x |= x << w
        w *= 2
    return x | (x << (span - w)) if span > w else x


def _exact_least_time(table: Table, kind: str, modes: list[str], n: int, room: np.ndarray) -> np.ndarray:
    """[q]: the least time of n layers of `kind` whose activations fit in room[q] bytes (inf if no
    mix does), exact in whole layers: over every count of the modes past the two fastest useful
    ones (n + 1 mixes for three modes, (n + 1)(n + 2) / 2 for four), the fewest layers moved from
    the fastest mode to the second in closed form (`_least_extra`). No front, so no bucketing: at
    least the fronts' value for the same count. More than EXACT_MIX_MODES useful modes:
    `_least_time`'s fronts."""
    useful = _useful_modes(table, kind, modes)
    k = len(useful)
    if k > EXACT_MIX_MODES:
        rooms = np.full((len(room), n + 1), -np.inf)  # (only count n asked: the others fit nothing)
        rooms[:, n] = room
        return _least_time(table, kind, modes, rooms)[:, n]
    a, s = _mode_arrays(table, kind, useful)
    over = n * a[0] - room  # activation bytes the mix must save against every layer at the fastest mode
    if k == 1:
        return np.where(over <= 0, n * s[0], np.inf)
    return n * s[0] + _least_extra(over, np.full(over.shape, float(n)), a, s, _mix_grid(k, n))


def _one_rank_tmax(ctx: Context, table: Table, modes: list[str]) -> float:
    """`_memory_tmax` of a one-stage configuration: its one rank holds all n1 first-kind and n2
    second-kind layers (`_split_fits` with P = 1 admits no other count), so the bound is that rank's
    least time (`_rank_times`'s t[0, n1, n2]) with the second kind's mix exact in whole layers
    (`_exact_least_time`, not the fronts of every count up to n2: t is nondecreasing in n, so the
    running maximum's last entry is the entry itself)."""
    first, second, n1, n2, s1, s2, infl, room, t_ex = _rank_space(ctx, table, modes)
    if first is not None:
        bb, tt = _mix_fronts(table, first, _useful_modes(table, first, modes), n1)[n1]
    else:
        bb, tt = np.zeros(1), np.zeros(1)
    left = room[0] - (n1 * s1 + n2 * s2) / infl[0] - bb
    t = _exact_least_time(table, second, modes, n2, left) + tt
    best = float(t.min()) + t_ex[0]
    return best if math.isfinite(best) else math.inf


def _memory_tmax(ctx: Context, table: Table, modes: list[str]) -> float:
    """Lower bound of the slowest rank's time per micro-batch when HBM forces recompute;
    inf if no split fits.

    Exact in whole layers and recompute modes, relaxing only which layers go where: the least
    T such that the ranks, each holding at least vpp layers (a chunk needs one) and at most
    what `_rank_times` says fits under T, can together hold every layer of both kinds. One
    kind: a sum of per-rank ranges; two: a dynamic program over ranks on the set of reachable
    (first-kind, second-kind) totals, the second as a bit mask. Dense layers come first and every
    virtual stage holds a layer or more, so dense layer i sits in virtual stage i or before: rank p
    holds dense layers only in its virtual stages c < n_dense (at most n_dense - c in each), and
    rank 0 holds the first. One stage (pp = 1): its rank holds every layer, and the bound is that
    rank's least time, the second kind's mix enumerated in whole layers (`_one_rank_tmax`).

    Cost: ranks' times are priced for their first ceil(n / P) + 1 counts, then twice as many, and
    only where the answer on those is not provably the whole array's, for every count
    (`_least_fitting_level` says why the answer is the same); levels are tested all at once
    (`_fits_at_levels`) where the ranges of sums allow."""
    key = ("memory_tmax", tuple(modes), table.cfg, table.pp_p2p_s, table.microbatches)  # (memo is shared)
    if key in table.memo:
        return table.memo[key]
    P = table.cfg.pp
    if P == 1:
        best = table.memo[key] = _one_rank_tmax(ctx, table, modes)
        return best
    kinds = _kinds(ctx)
    n2 = list(_kind_counts(ctx).values())[-1]  # (`_rank_times`'s second kind: the last)
    # A rank's counts up to `lim` first (the fronts of many layers cost the most to build); the answer
    # on them holds for the whole array where every rank's time at lim + 1 layers is already >= it.
    lim = -(-n2 // P) + 1 if P > 1 else n2  # (one rank holds every layer)
    while lim + 1 <= n2:
        part = _rank_times(ctx, table, modes, count_max=lim + 1)
        t = np.full((P, part.shape[1], n2 + 1), np.inf)
        t[:, :, :lim + 1] = part[:, :, :lim + 1]
        best = _least_fitting_level(t, kinds, table)
        if best < math.inf and bool((part[:, :, lim + 1] >= best).all()):
            table.memo[key] = best
            return best
        lim *= 2
    best = _least_fitting_level(_rank_times(ctx, table, modes), kinds, table)
    table.memo[key] = best
    return best


def _least_fitting_level(t: np.ndarray, kinds: Sequence[str], table: Table) -> float:
    """`_memory_tmax`'s search: the least value of t (finite) at which the split fits; inf if none.

    Why counts past lim may be left out (t[p, d, n] = inf for n > lim): most[p, d](T), the most
    second-kind layers a rank can hold at T, can only shrink, and fits is nondecreasing in every
    most[p, d], so a level that fits on the cut array fits on the whole one. Below the cut array's
    answer A, no left-out entry counts where every t[p, d, lim + 1] >= A (t is nondecreasing in n):
    most[p, d] is the same on both arrays at every T < A, so no lower level fits on the whole array
    either. Its levels are the whole array's below A, so A is the whole array's answer."""
    P, D, N = t.shape
    n1, n2 = D - 1, N - 1
    min_per = table.cfg.vpp if P > 1 else len(kinds)
    if P > 1:  # the dense layers each rank can hold (see above)
        d_lo = [min(1, n1) if p == 0 else 0 for p in range(P)]
        d_hi = [min(n1, sum(n1 - c for c in range(p, min(n1, P * table.cfg.vpp), P))) for p in range(P)]
    else:
        d_lo, d_hi = [0], [n1]

    def fits(T: float) -> bool:
        return _split_fits(t, T, min_per, d_lo, d_hi)

    levels = np.unique(t[np.isfinite(t)])
    # (Every level at once where the ranges of sums allow it, `_fits_at_levels`; else a search.)
    # The least level at which the split fits (fits is monotone in T), searched over levels[lo:] plus a
    # sentinel len(levels) that stands for "none fits" (inf): the same level as checking the top level
    # first and searching below it, one `fits` call fewer.
    best = math.inf
    if len(levels):
        # Start from the least T at which the second kind alone fits (the first taken as free), a
        # necessary condition checked for every level at once; the answer is usually at or near it.
        most = _counts_under(t.min(axis=1), levels) - 1  # (P, levels)
        alone = (np.minimum(most, n2).sum(axis=0) >= n2) & (most >= min_per - n1).all(axis=0)
        lo, hi, step = int(np.argmax(alone)), len(levels), 1  # every level below lo fails (none: 0)
        # (fits is monotone: the least level that fits is the first True; the answer is usually near
        # lo, so a window of levels first, then the rest)
        for a, b in ((lo, lo + 32), (lo + 32, len(levels))):
            at = _fits_at_levels(t, levels[a:b], min_per, d_lo, d_hi) if a < b else np.zeros(0, dtype=bool)
            if at is None or at.any() or b >= len(levels):
                if at is not None:
                    lo = hi = a + (int(np.argmax(at)) if at.any() else len(at))
                break
        while lo + step - 1 < hi:  # galloping, then bisection
            if fits(levels[lo + step - 1]):
                hi = lo + step - 1
                break
            lo += step
            step *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(levels[mid]):
                hi = mid
            else:
                lo = mid + 1
        if lo < len(levels):
            best = float(levels[lo])
    return best


def _fits_at_levels(t: np.ndarray, levels: np.ndarray, min_per: int, d_lo: list[int],
                    d_hi: list[int]) -> np.ndarray | None:
    """`_split_fits` at every T in `levels` (ascending) at once, as a boolean array; None where the
    form below does not apply (then the caller tests levels one by one).

    Why it is the same boolean: every rank p holding k first-kind layers adds a second-kind count in
    [lo_p, hi_p] (lo_p = max(0, min_per - k), fixed; hi_p = min(most[p, k], n2), growing with T;
    the choice valid only where hi_p >= lo_p), and adding ranges one after another reaches exactly
    [sum lo_p, sum hi_p]. So the split fits iff some valid choice of first-kind counts (summing to
    n1) has sum lo_p <= n2 <= sum hi_p. Where P x max(0, min_per) <= n2, sum lo_p <= n2 holds for
    every choice, and the test is max over valid choices of sum hi_p >= n2: a max-plus program over
    ranks on the first-kind total (at most n1 + 1 states), each state an array over the levels
    (-1: no valid choice reaches it; valid sums are >= 0). One rank (P = 1) holds all n1 first-kind
    layers: n2 in [lo_0, hi_0]. One kind: `_split_fits`'s own expression, per level. `most` per
    level by `_counts_under` (the count of t[p, d, n] <= T, as `_split_fits` counts it)."""
    P, D, N = t.shape
    n1, n2 = D - 1, N - 1
    nl = len(levels)
    most = _counts_under(t.reshape(P * D, N), levels).reshape(P, D, nl) - 1
    if D == 1:
        return (most[:, 0] >= min_per).all(axis=0) & (most[:, 0].sum(axis=0) >= n2)
    if P == 1:
        if not d_lo[0] <= n1 <= d_hi[0]:
            return np.zeros(nl, dtype=bool)
        lo = max(0, min_per - n1)
        return (lo <= n2) & (np.minimum(most[0, n1], n2) >= max(lo, n2))
    if P * max(0, min_per) > n2:
        return None
    hi = np.minimum(most, n2)
    valid = hi >= np.maximum(0, min_per - np.arange(D))[None, :, None]  # [p, k, level]: rank p may hold k
    # The ranks from `cut` on hold no first-kind layer (d_lo = d_hi = 0): each maps every state d to
    # itself, adding hi[p, 0] where valid (sums of valid counts stay >= 0), so together they add the sum
    # of their hi[p, 0] where every one is valid; only the state n1 is read after them.
    cut = P
    while cut > 0 and d_lo[cut - 1] == 0 and d_hi[cut - 1] == 0:
        cut -= 1
    reach: dict[int, np.ndarray] = {0: np.zeros(nl, dtype=np.int64)}
    for p in range(cut):
        hp, vp = hi[p], valid[p]
        nxt: dict[int, np.ndarray] = {}
        for d, h in reach.items():
            live = h >= 0
            for k in range(d_lo[p], min(d_hi[p], n1 - d) + 1):
                v = np.where(vp[k] & live, h + hp[k], -1)
                cur = nxt.get(d + k)
                nxt[d + k] = v if cur is None else np.maximum(cur, v)
        reach = nxt
        if not reach:
            return np.zeros(nl, dtype=bool)
    got = reach.get(n1)
    if got is None:
        return np.zeros(nl, dtype=bool)
    if cut < P:
        got = np.where(valid[cut:, 0].all(axis=0) & (got >= 0), got + hi[cut:, 0].sum(axis=0), -1)
    return got >= n2


def _split_fits(t: np.ndarray, T: float, min_per: int, d_lo: list[int], d_hi: list[int]) -> bool:
    """Whether ranks p (t[p, d, n]: their time holding d first-kind and n second-kind layers, made
    nondecreasing in n) can together hold every layer of both kinds at time <= T, each holding at
    least min_per layers and d_lo[p]..d_hi[p] of the first kind (`_memory_tmax`).

    The ranks that hold no first-kind layer (d_lo = d_hi = 0: past the dense layers) are taken
    together: each adds any second-kind count in a range [lo_p, hi_p], and adding one range after
    another reaches exactly the range of sums [sum lo_p, sum hi_p], so the suffix of such ranks is
    one range test on the prefix's mask (bits past n2 are dropped either way: shifts only move
    them up). The same boolean as the rank-by-rank program over every rank (tests/test_solver_speed.py)."""
    P, D, N = t.shape
    n1, n2 = D - 1, N - 1
    most = (t <= T).sum(axis=2) - 1  # most second-kind layers per (rank, first-kind count); -1: none
    if D == 1:  # one kind: every rank its minimum, and room for all together
        return bool((most[:, 0] >= min_per).all() and most[:, 0].sum() >= n2)
    cut = P  # the ranks from `cut` on hold no first-kind layer
    while cut > 0 and d_lo[cut - 1] == 0 and d_hi[cut - 1] == 0:
        cut -= 1
    tail_lo = max(0, min_per) * (P - cut)
    tail_hi_p = np.minimum(most[cut:, 0], n2)  # (a rank's range is empty where it is below its least)
    if (tail_hi_p < max(0, min_per)).any():
        return False
    tail_hi = int(tail_hi_p.sum())
    full = (1 << (n2 + 1)) - 1
    reach = {0: 1}
    for p in range(cut):
        nxt: dict[int, int] = {}
        for d, mask in reach.items():
            for k in range(d_lo[p], min(d_hi[p], n1 - d) + 1):
                lo, hi = max(0, min_per - k), min(int(most[p, k]), n2)
                if hi >= lo:
                    nxt[d + k] = nxt.get(d + k, 0) | (_spread(mask, lo, hi) & full)
        reach = nxt
        if not reach:
            return False
    mask = reach.get(n1, 0)
    # n2 reachable: some reached m with n2 - tail_hi <= m <= n2 - tail_lo
    lo_m, hi_m = max(0, n2 - tail_hi), n2 - tail_lo
    return hi_m >= lo_m and bool((mask >> lo_m) & ((1 << (hi_m - lo_m + 1)) - 1))


def _counts_under(t: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """c[p, i] = #{n: t[p, n] <= levels[i]} for ascending `levels`, from each value's level index
    (a cumulative histogram: O(P (N + levels)), not a (P, levels, N) comparison)."""
    P, nl = t.shape[0], len(levels)
    at = np.searchsorted(levels, t, side="left")  # first level >= t[p, n] (nl: above every level)
    flat = (np.arange(P)[:, None] * (nl + 1) + at).ravel()
    return np.bincount(flat, minlength=P * (nl + 1)).reshape(P, nl + 1).cumsum(axis=1)[:, :nl]


def _tail_bound(ctx: Context, table: Table, modes: list[str], tmax: float, exact_windows: bool) -> float:
    """Lower bound of the data-parallel tail of the slowest rank, given `tmax`, a lower bound of
    the slowest rank's time per micro-batch.

    The max over ranks is at least the tail at the mean rank (the tail is convex in a rank's
    parameters and windows). Recompute lengthens the backward window, which hides more
    gradient reduction, but every second of it also lengthens the rank's time, which the
    pipeline pays M times, more than the (1 - k) R it can save in the tail (R = 1, or M under
    ZeRO-2); so the window counts only the recompute that fits under `tmax` for free:
    the mean rank's time at its fastest modes up to tmax, capped at the slowest modes.
    Without exact windows (a table that stands for every placement), the tail's affine form
    is the cheapest of every placement order's, coefficient by coefficient (`_free_tail_model`)."""
    s = _summary(ctx, table, modes)
    p = table.cfg.pp
    hops = (table.cfg.pp * table.cfg.vpp - 1) * table.pp_p2p_s / p  # mean sends / receives per rank
    params, eparams = s.params / p, s.expert_params / p
    if not exact_windows:  # overlapped(x, w) >= COMM_INTERFERENCE * x for every window w
        return sum(dp_tail_s(_free_tail_model(ctx, table), params, eparams, math.inf, math.inf))
    tm = _placed_tail_model(ctx, table)
    fwd = s.fwd_s / p + hops
    bwd_fast = s.bwd_fast_s / p + hops
    free = max(0.0, tmax - (fwd + bwd_fast))  # recompute that fits under tmax
    bwd = bwd_fast + min(free, (s.bwd_slow_s - s.bwd_fast_s) / p)
    return sum(dp_tail_s(tm, params, eparams, fwd, bwd))


def _placed_tail_model(ctx: Context, table: Table) -> TailModel:
    """`cost.tail_model` of the table, memoized in `Table.memo` on everything it reads of the
    configuration and placement (the rest is the solve's context)."""
    cfg, pl = table.cfg, table.placement
    key = ("tail", pl.dp_cp, pl.edp, cfg.zero, cfg.dp, cfg.cp, table.microbatches if cfg.zero == 2 else 0,
           dp_overlaps(ctx, cfg), cfg.opt_offload)
    got = table.memo.get(key)
    if got is None:
        got = table.memo[key] = tail_model(ctx, table)
    return got


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
    M = table.microbatches
    p = cfg.pp
    forced = _memory_tmax(ctx, table, modes) if memory else 0.0
    if math.isinf(forced):  # no split fits in HBM
        return math.inf
    tmax, second, serial = _pipeline_shape(ctx, table, modes, forced)
    tail = _tail_bound(ctx, table, modes, tmax, exact_windows)
    if p == 1:
        return M * tmax + tail
    if cfg.schedule == "zero_bubble":  # (second: max u)
        # M max t + (P - 1) max u, and >= P max u >= sum u (max t >= max u).
        return max(M * tmax + (cfg.pp - 1) * second, serial) + tail
    if cfg.schedule == "interleaved":  # (second: the slowest rank's largest chunk)
        return M * tmax + (cfg.pp - 1) * second + tail
    return (M - 1) * tmax + second + tail  # (second: every layer at its fastest, embedding and head)


def _pipeline_shape(ctx: Context, table: Table, modes: list[str], forced: float) -> tuple[float, float, float]:
    """(tmax, second, serial) of `_table_bound`: the least slowest rank's time per micro-batch (at
    least `forced`) and the schedule's second term (1F1B: every layer's fastest time; interleaved:
    a chunk of the slowest rank; zero-bubble: max u, with `serial`, sum u). They depend only on
    the layer costs (`Table.memo`), the pipeline sends, pp, vpp and the schedule: memoized there,
    so placements and configurations that share them (other dp, ZeRO stage or micro-batch count,
    or group profiles that only the data-parallel tail sees) compute them once."""
    cfg = table.cfg
    key = ("pipeline", tuple(modes), cfg.pp, cfg.vpp, cfg.schedule, table.pp_p2p_s, forced)
    got = table.memo.get(key)
    if got is not None:
        return got
    if cfg.pp == 1:
        got = (max(_summary(ctx, table, modes).fast, forced), 0.0, 0.0)
    else:
        tmax, second, serial, chunk = _pipeline_base(ctx, table, modes)
        tmax = max(tmax, forced)
        if cfg.schedule == "interleaved":
            # A rank's time is the sum of its vpp chunks' times: the slowest rank has a chunk of >= tmax / vpp.
            second = max(chunk, tmax / cfg.vpp)
        got = (tmax, second, serial)
    table.memo[key] = got
    return got


def _pipeline_base(ctx: Context, table: Table, modes: list[str]) -> tuple[float, float, float, float]:
    """What `_pipeline_shape` computes before `forced` enters (pp > 1): (tmax without forced, second
    (zero-bubble's, or 1F1B's fast), serial, the interleaved chunk's balanced bound), memoized on the
    same key less `forced` (the memory bound differs from configuration to configuration)."""
    cfg = table.cfg
    key = ("pipeline base", tuple(modes), cfg.pp, cfg.vpp, cfg.schedule, table.pp_p2p_s)
    got = table.memo.get(key)
    if got is not None:
        return got
    s = _summary(ctx, table, modes)
    L = sum(s.count.values())
    fast = s.fast
    second = serial = chunk = 0.0
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
    tmax = max(tmax, fast / cfg.pp)  # (max(tmax, forced) after: the same value as one max of the three)
    if cfg.schedule == "zero_bubble":
        # One micro-batch's forward and input-gradient backward cross every stage in turn:
        # the pipeline takes at least sum(t - w) however well weight gradients fill bubbles.
        u = s.unfilled
        serial = sum(s.count[k] * u[k] for k in u) + sum(u_ex) - (V - 1) * table.pp_p2p_s
        second = max(balanced_max(min(u.values()), u_ex, L), serial / cfg.pp,
                     *(balanced_max(u[k], u_ex, s.count[k], min_per=0) for k in u if len(u) > 1))
    elif cfg.schedule == "interleaved":
        c_ex, _ = _stage_extras(table, V, per_rank=False)
        chunk = balanced_max(tau, c_ex, L)
    else:
        second = fast
    got = table.memo[key] = (tmax, second, serial, chunk)
    return got


def _optimistic_table(ctx: Context, cfg: Config, cache: dict | None = None) -> Table:
    """The table with every process group on consecutive GPUs: the cheapest profile each group
    can have, so its bound holds for every placement of cfg. `cache` (one per solve) shares
    the per-layer costs between configurations that differ only in what they do not depend
    on (pipeline degree and schedule, and the ZeRO stage below 3)."""
    g = ctx.graph
    edp = max(1, cfg.tp * cfg.cp * cfg.dp // (cfg.expert_tp * cfg.ep))
    pl = Placement(tp=contiguous_profile(g, cfg.tp), cp=contiguous_profile(g, cfg.cp),
                   ep=contiguous_profile(g, cfg.ep), dp=contiguous_profile(g, cfg.dp),
                   dp_cp=contiguous_profile(g, cfg.dp * cfg.cp), edp=contiguous_profile(g, edp),
                   pp=contiguous_profile(g, cfg.pp), pp_level=0 if cfg.pp > 1 else -1,
                   etp=contiguous_profile(g, cfg.expert_tp))
    zero3 = cfg.zero == 3
    key = (cfg.tp, cfg.cp, cfg.ep, cfg.sp, cfg.mbs, zero3, cfg.dp if zero3 else 0, cfg.pp == 1, cfg.etp,
           cfg.tp_overlap, cfg.ep_overlap, ep_overlap_on(ctx, cfg))
    layers, embed, head, memo = shared_costs(ctx, cfg, pl, cache, key)
    microbatches = num_microbatches(ctx.problem, cfg)
    head = loss_phase_head(ctx, cfg, layers, embed, head, microbatches)
    return Table(cfg, pl, layers, embed, head, 0.0, microbatches, memo)


def _free_tail_model(ctx: Context, table: Table) -> TailModel:
    """The data-parallel tail's affine form for every placement of table.cfg at once: each
    coefficient (seconds per dense parameter, per expert parameter, fixed seconds) the least
    over the placement orders of the mesh axes. The exposed tail is nondecreasing in every
    coefficient (parameter counts are >= 0), so it is a lower bound of each placement's tail.
    Without folding, one order puts ep, dp and cp innermost and both groups on consecutive GPUs
    (`_optimistic_table`'s profiles, kept). With MoE parallel folding the expert group is strided
    by etp x ep over the stage's ranks in every order, never consecutive: pricing it so made the
    expert reduction about 8x cheaper than any placement could (the dense coefficient stays the
    consecutive one: some order still puts dp and cp innermost, at TP's expense, which the layer
    costs price on their own)."""
    cfg = table.cfg
    if not cfg.folded:  # some order puts ep, dp and cp innermost: both groups consecutive at once
        return tail_model(ctx, table)
    # Everything `tail_model` reads of the configuration (the memo is shared by one solve's tables).
    # (`tail_model` reads the configuration, the placement's data-parallel groups and the micro-batch
    # count, never the layer costs: the memo is the solve's, not the table's)
    key = ("free_tail", cfg.tp, cfg.cp, cfg.ep, cfg.dp, cfg.pp, cfg.etp, cfg.zero,
           table.microbatches if cfg.zero == 2 else 0, dp_overlaps(ctx, cfg), cfg.opt_offload, cfg.reshard,
           cfg.dp_replicate)
    memo = _solve_memo(ctx)
    got = memo.get(key)
    if got is not None:
        return got
    tms = [tail_model(ctx, dataclasses.replace(table, placement=dataclasses.replace(table.placement, dp_cp=d, edp=e)))
           for d, e in _tail_profiles(ctx.graph, cfg.tp, cfg.cp, cfg.ep, cfg.dp, cfg.pp, cfg.etp)]
    got = tms[0] if len(tms) == 1 else dataclasses.replace(
        tms[0], reduce=tuple(min(x) for x in zip(*(t.reduce for t in tms))),
        gather=tuple(min(x) for x in zip(*(t.gather for t in tms))))
    memo[key] = got
    return got


@functools.lru_cache(maxsize=4096)
def _tail_profiles(graph, tp: int, cp: int, ep: int, dp: int, pp: int, etp: int | None) -> tuple:
    """The distinct (dense reduction, expert reduction) profile pairs over every order of the
    mesh axes (`topology._place`'s dp_cp and edp), from their rank runs (`group_runs`,
    `_runs_profile`): no rank arrays but one per distinct layout."""
    etp_ = tp if etp is None else etp
    folded = _is_folded(tp, ep, dp, etp_)
    sizes = {"tp": tp, "cp": cp, "ep": 1 if folded else ep, "dp": dp if folded else max(1, dp // ep), "pp": pp}
    live = [a for a in MESH_AXES if sizes[a] > 1] or ["tp"]
    out: dict = {}
    for order in permutations(live):
        if not folded:
            pair = (_runs_profile(graph, group_runs(order, sizes, ("ep", "dp", "cp"))),
                    _runs_profile(graph, group_runs(order, sizes, ("dp", "cp"))))
        else:
            runs = _folded_edp_runs(order, sizes, etp_ * ep)
            edp = (_runs_profile(graph, runs) if runs is not None else
                   place_axes(graph, "-".join([*order, *[a for a in MESH_AXES if a not in order]]),
                              tp, cp, ep, dp, pp, etp).edp)
            pair = (_runs_profile(graph, group_runs(order, sizes, ("dp", "cp"))), edp)
        out.setdefault(pair, None)
    return tuple(out)


def _folded_edp_runs(order: tuple[str, ...], sizes: dict[str, int], inner: int) -> tuple | None:
    """Rank runs of the expert data-parallel groups under MoE parallel folding (`topology.
    _expert_groups`): a stage's attention ranks in placement order split as etp x ep (`inner`,
    not in the group) x edp (in it), the pipeline axis inserted where the order has it. None
    where the two splits do not nest (then the caller places the ranks)."""
    stage = math.prod(sizes[a] for a in order if a != "pp")
    before = math.prod(sizes[a] for a in order[:order.index("pp")]) if "pp" in order else stage
    pp = sizes["pp"]
    if before <= inner:
        if inner % before:
            return None
        raw = [(before, False), (pp, False), (inner // before, False), (stage // inner, True)]
    else:
        if before % inner:
            return None
        raw = [(inner, False), (before // inner, True), (pp, False), (stage // before, True)]
    runs: list[tuple[int, bool]] = []
    for n, member in raw:
        if n == 1:
            continue
        if runs and runs[-1][1] == member:
            runs[-1] = (runs[-1][0] * n, member)
        else:
            runs.append((n, member))
    return tuple(runs)

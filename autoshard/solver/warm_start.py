"""A real plan before any CP-SAT: greedy recompute mixes and memory-aware stage splits on the
most promising configurations (`_warm_start`, `_Greedy`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..cost import Config, Context, Estimate, Table, inflight_microbatches, layer_table, static_bytes, working_bytes, zero3_gathered_for
from ..spec import Problem
from .bounds import _optimistic_table, _table_bound, _useful_modes
from .candidates import _placements
from ..layouts import project, recompute_layout
from ..cost import assemble, ep_overlap_blocked, even_split, no_ep_overlap

WARM_START_CONFIGS = 800  # configurations the greedy pass tries, in numpy-bound order (a count: deterministic)


WARM_SPLIT_CONFIGS = 24
WARM_MIN_CONFIGS = 64  # configurations tried even past the wall-clock deadline when no plan fits yet


def _warm_start(problem: Problem, ctx: Context, cfgs: list[Config], modes: list[str], deadline: float,
                opt_cache: dict, table_cache: dict, sink: Callable[[Estimate], None] | None = None) -> Estimate | None:
    """A real, evaluated plan to start branch and bound (no CP-SAT). Its effort is a count of
    configurations (so the same problem gets the same start on any machine); `deadline` is
    only a safety net.

    Pass 1, over `cfgs`, canonical placement: even stage splits, each rank's recompute mix
    chosen greedily to fit its HBM. Pass 2, on the `WARM_SPLIT_CONFIGS` configurations with
    the lowest placement-free bound (memory-aware): the two placements with the lowest table
    bounds, and the stage split too (`_Greedy.split`: the least max stage time, memory-aware).
    `sink` receives every plan that fits (the search keeps the best of each family)."""
    best: Estimate | None = None
    L = ctx.model.num_hidden_layers
    promising: list[tuple[float, int, Config]] = []

    def beaten(bound: float) -> bool:
        return best is not None and bound >= best.step_time_s

    layout = recompute_layout(ctx)
    kinds = ctx.model.layer_kinds()

    def consider(table: Table, split: list[int] | None, recompute: list[str] | None) -> None:
        nonlocal best
        if split is None or recompute is None:
            return
        # The greedy mix, or what the framework runs in its place (`layouts.project`: e.g. Megatron's
        # full recompute of the first N layers). A projection onto a mode the framework refuses beside
        # the EP overlap, where this configuration runs the overlap, is priced on the configuration's
        # twin with the overlap off, as `evaluate` prices it (this table would price it too fast: an
        # incumbent below any real plan would prune the true optimum).
        overlap = table.cfg.ep_overlap is None and bool(table.memo.get("ep_overlap"))
        for rc_list in project(layout, split, recompute, lambda i, m: table.layers[(kinds[i], m)].act_bytes,
                               table.cfg.pp):
            priced = table
            if overlap and ep_overlap_blocked(ctx, set(rc_list)):
                priced = layer_table(ctx, no_ep_overlap(table.cfg), table_cache)
            rc: Any = rc_list[0] if len(set(rc_list)) == 1 else rc_list
            est = assemble(ctx, priced, split, rc_list, priced.cfg.plan(rc, split), [])
            if est.fits and sink is not None:
                sink(est)
            if est.fits and (best is None or est.step_time_s < best.step_time_s):
                best = est

    for j, cfg in enumerate(cfgs):
        if time.perf_counter() > deadline and (best is not None or j >= WARM_MIN_CONFIGS):
            break  # (the safety net does not fire before a first plan, or WARM_MIN_CONFIGS tries)
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
        # per kind: the time / memory Pareto front of the modes, fastest first (shared with the bounds)
        self.ladder: dict[str, list[str]] = {k: _useful_modes(table, k, modes) for k in set(self.kinds)}
        cfg = self.cfg
        self.z3 = zero3_gathered_for(ctx, cfg, lay.values())
        self.memo: dict[tuple[int, int, int], tuple[list[str], float] | None] = {}
        # per kind and rung: the layer's time, and the move to the next rung's (activation bytes
        # freed per second of recompute, bytes freed), computed once for every `rank`
        self.rung_s = {k: [lay[(k, r)].total_s for r in rungs] for k, rungs in self.ladder.items()}
        self.moves: dict[str, list[tuple[float, float]]] = {}
        for k, rungs in self.ladder.items():
            self.moves[k] = []
            for s in range(len(rungs) - 1):
                a, b = lay[(k, rungs[s])], lay[(k, rungs[s + 1])]
                self.moves[k].append(((a.act_bytes - b.act_bytes) / max(1e-15, b.total_s - a.total_s),
                                      a.act_bytes - b.act_bytes))

    def rank(self, p: int, layers: list[int]) -> tuple[list[str], float] | None:
        """(recompute mode of each of `layers`, the rank's time per micro-batch) or None."""
        ctx, tb, cfg, kinds, lad = self.ctx, self.table, self.cfg, self.kinds, self.ladder
        lay = tb.layers
        ends = ([tb.embed] if p == 0 else []) + ([tb.head] if p == cfg.pp - 1 else [])
        pieces = [lay[(kinds[i], lad[kinds[i]][0])] for i in layers] + ends
        params = sum(c.params for c in pieces)
        eparams = sum(c.expert_params for c in pieces)
        fixed = sum(static_bytes(ctx, cfg, params, eparams).values()) + working_bytes(tb, p == cfg.pp - 1, p == 0) + self.z3
        infl = inflight_microbatches(cfg, p, tb.microbatches)
        over = fixed + infl * sum(c.act_bytes for c in pieces) - ctx.capacity_bytes
        step = {k: [0] * len(lad[k]) for k in lad}  # per kind: layers at each rung
        for i in layers:
            step[kinds[i]][0] += 1
        moves = self.moves
        while over > 0:
            move, ratio = None, -1.0
            for k, rungs in step.items():
                mk = moves[k]
                for s in range(len(rungs) - 1):
                    if rungs[s]:
                        r_ = mk[s][0]
                        if r_ > ratio:
                            move, ratio = (k, s), r_
            if move is None:
                return None
            k, s = move
            over -= infl * moves[k][s][1]
            step[k][s] -= 1
            step[k][s + 1] += 1
        modes, t = [], sum(c.total_s for c in ends)
        left = {k: list(rungs) for k, rungs in step.items()}
        rung_s = self.rung_s
        for i in layers:  # leaner modes on the earliest layers of each kind
            k = kinds[i]
            s = max(j for j, n in enumerate(left[k]) if n)
            left[k][s] -= 1
            modes.append(lad[k][s])
            t += rung_s[k][s]
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
        even = even_split(len(self.kinds), self.cfg.pp)
        start = [self.rank(p, list(range(sum(even[:p]), sum(even[:p + 1])))) for p in range(self.cfg.pp)]
        hi = max(r[1] for r in start if r is not None) if all(start) else 1e6
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

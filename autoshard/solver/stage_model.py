"""The CP-SAT model for one global configuration: layers per virtual stage and recompute
mode per layer, under HBM on every rank, minimizing the evaluator's step time."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cost import (
    COMM_INTERFERENCE,
    INTERFERENCE_DENOM,
    Context,
    Table,
    inflight_microbatches,
    interleaved_windows,
    static_bytes,
    tail_model,
    working_bytes,
    zero3_gathered_for,
)
from ..spec import RECOMPUTES
from .bounds import _kind_counts, _memory_tmax, _rank_times, _stage_extras, balanced_max
from ..layouts import recompute_layout
from ..cost import even_split
from ..layouts import every_nth_list

if TYPE_CHECKING:  # (cp_model is imported lazily at run time)
    from ortools.sat.python.cp_model import LinearExpr

TIME_UNIT_S = 1e-7
MEM_UNIT_BYTES = 1024


def _t(x: float) -> int:
    return int(round(x / TIME_UNIT_S))


INT64_MIN = -(2**63)  # (CP-SAT's lower end of a domain with none)


# Stage-model structures by shape (`StageModel._structure`): the proto before any layer cost, with the
# indices of its variables. A pure function of its key, so the cache changes no model, only how often
# one is built; cleared when full.
_STRUCTURES: dict[tuple, tuple] = {}
STRUCTURES_MAX = 256


def _add_at_most(md: Any, var_index: np.ndarray, coefs: np.ndarray, rhs: list[int]) -> None:
    """Row i of `coefs`: the linear constraint sum_j coefs[i, j] x[var_index[j]] <= rhs[i], written
    into the model's proto as `md.add(LinearExpr.weighted_sum(...) <= rhs[i])` writes it (CP-SAT's
    canonical form: terms in variable order, zero coefficients dropped; tests/test_solver_speed.py
    compares the two protos) without a Python expression per row: the interleaved schedule's
    memory windows are thousands of rows of a few dozen terms. The variables are distinct."""
    order = np.argsort(var_index, kind="stable")
    idx, rows = var_index[order], coefs[:, order]
    assert len(np.unique(idx)) == len(idx)  # (a repeated variable would need its terms merged)
    cons = md.proto.constraints
    for row, hi in zip(rows, rhs):
        keep = row != 0
        lin = cons.add().linear
        lin.vars.extend(idx[keep].tolist())
        lin.coeffs.extend(row[keep].tolist())
        lin.domain.extend([INT64_MIN, hi])


def _b(x: float) -> int:
    return int(math.ceil(x / MEM_UNIT_BYTES))


class StageModel:
    """CP-SAT: layers per virtual stage and recompute mode per layer, for one configuration.

    Variables `n[c][kind][mode]`: how many layers of `kind` in virtual stage `c` use
    recompute `mode`. Within a stage the order of modes does not change time or memory,
    so the per-layer assignment is read off the counts. `rank_cuts`: add each rank's least time
    for its layer counts under HBM (`_rank_least_times`; the search asks for them on resumed proofs).
    `count_cuts` (default): each rank's layer counts per kind bound t_max (`_count_cuts`).
    """

    def __init__(self, ctx: Context, table: Table, modes: list[str], uniform: bool, cutoff_units: int | None,
                 rank_cuts: bool = False, count_cuts: bool = True):
        from ortools.sat.python import cp_model  # noqa: PLC0415  (lazy: 0.25 s import)

        self.cp_model = cp_model
        self.ctx, self.table, self.cfg = ctx, table, table.cfg
        self.model = cp_model.CpModel()
        self.count = dict(_kind_counts(ctx))  # per kind, dense before moe
        self.kinds = list(self.count)
        self.modes = self._useful_modes(modes)
        self.V = self.cfg.pp * self.cfg.vpp
        self.uniform = uniform
        self.cutoff = cutoff_units
        self.rank_cuts, self.count_cuts = rank_cuts, count_cuts
        self.layout = recompute_layout(ctx)
        self.pick: dict[str, Any] = {}  # one mode for every layer: its boolean (`_pattern_constraints`)
        self.n: list[dict[str, dict[str, Any]]] = []  # n[c][kind][mode] (`_variables`)
        self._structure()
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

    def _structure(self) -> None:
        """The variables, the layer constraints and the recompute pattern (`_variables`,
        `_layer_constraints`, `_pattern_constraints`): the part of the model that reads no cost of the
        layer table, only its shape (the key below). Where a model of the same shape was built, its
        proto up to there is copied and the variables read back by index (the same proto a build
        writes: tests/test_solver_speed.py compares them); else built, and kept (`_STRUCTURES`)."""
        key = (self.V, self.cfg.pp, self.cfg.schedule == "interleaved", self.uniform, tuple(self.kinds),
               tuple(self.count[k] for k in self.kinds), tuple(self.modes), self.layout,
               self.ctx.model.num_hidden_layers)
        got = _STRUCTURES.get(key)
        md = self.model
        if got is None:
            self._variables()
            self._layer_constraints()
            self._pattern_constraints()
            proto = type(md.proto)()
            proto.copy_from(md.proto)
            index = [{k: {r: v.index for r, v in row.items()} for k, row in chunk.items()} for chunk in self.n]
            nth = getattr(self, "nth", None)
            if len(_STRUCTURES) >= STRUCTURES_MAX:
                _STRUCTURES.clear()
            _STRUCTURES[key] = (proto, index, {r: b.index for r, b in self.pick.items()},
                                None if nth is None else nth.index)
            return
        proto, index, pick, nth_index = got
        md.proto.copy_from(proto)
        var = md.get_int_var_from_proto_index
        self.n = [{k: {r: var(i) for r, i in row.items()} for k, row in chunk.items()} for chunk in index]
        self._sizes()
        self.pick = {r: md.get_bool_var_from_proto_index(i) for r, i in pick.items()}
        if nth_index is not None:
            self.nth = var(nth_index)

    def _variables(self) -> None:
        md = self.model
        self.n = [{k: {r: md.new_int_var(0, self.count[k], f"n_c{c}_{k}_{r}") for r in self.modes}
                   for k in self.kinds} for c in range(self.V)]
        self._sizes()

    def _sizes(self) -> None:
        """Each virtual stage's layer count, as an expression (`size[c]`)."""
        total = self.cp_model.LinearExpr.sum
        self.size = [total([self.n[c][k][r] for k in self.kinds for r in self.modes]) for c in range(self.V)]

    def _layer_constraints(self) -> None:
        md, total = self.model, self.cp_model.LinearExpr.sum
        for k in self.kinds:
            md.add(total([self.n[c][k][r] for c in range(self.V) for r in self.modes]) == self.count[k])
        if self.uniform:
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
                n_dense = total([self.n[c][dense][r] for r in self.modes])
                md.add(total([self.n[c][moe][r] for r in self.modes]) <= self.count[moe] * total(last[:c + 1]))
                md.add(n_dense <= self.count[dense] * total(last[c:]))
                md.add(n_dense >= 1).only_enforce_if(last[c])

    def _pattern_constraints(self) -> None:
        """Only recompute lists the framework runs (`layouts`): one mode for every layer, or, for
        Megatron's block layout, full recompute of the first K layers of every virtual stage
        (min(K, size) of a shorter one; dense layers come first in a stage) and none elsewhere.
        Offloaded layers are left free, except in Megatron's block layout (`_megatron_offload`)."""
        if self.layout == "block" and "offload" in self.modes:
            self._megatron_offload()
        modes = [r for r in self.modes if r != "offload"]
        if self.layout == "per_layer" or len(modes) <= 1:
            return
        md, V = self.model, self.V
        every = [(c, k) for c in range(V) for k in self.kinds]
        pick = {r: md.new_bool_var(f"all_{r}") for r in modes}
        self.pick = pick
        choices = list(pick.values())
        block = None
        if self.layout in ("block", "every_nth") and "full" in modes and "none" in modes:
            block = md.new_bool_var(f"{self.layout}_full")
            choices.append(block)
        md.add_exactly_one(choices)
        for r, b in pick.items():
            for c, k in every:
                for o in modes:
                    if o != r:
                        md.add(self.n[c][k][o] == 0).only_enforce_if(b)
        if block is None:
            return
        if self.layout == "every_nth":
            self._every_nth(block, modes)
            return
        L = self.ctx.model.num_hidden_layers
        K = md.new_int_var(1, L, "block_layers")
        for c, k in every:
            for o in modes:
                if o not in ("full", "none"):
                    md.add(self.n[c][k][o] == 0).only_enforce_if(block)
        for c in range(V):
            first = md.new_int_var(0, L, f"block_full_c{c}")
            md.add_min_equality(first, [K, self.size[c]])
            if len(self.kinds) == 2:
                dense, moe = self.kinds
                d_c = sum(self.n[c][dense][r] for r in self.modes)
                fd = md.new_int_var(0, L, f"block_dense_c{c}")
                md.add_min_equality(fd, [K, d_c])
                md.add(self.n[c][dense]["full"] == fd).only_enforce_if(block)
                md.add(self.n[c][moe]["full"] == first - fd).only_enforce_if(block)
            else:
                md.add(self.n[c][self.kinds[0]]["full"] == first).only_enforce_if(block)

    def _megatron_offload(self) -> None:
        """Megatron's activation offloading (`layouts.megatron_recompute`): none with PP (one virtual
        stage), none beside recompute, fewer layers than the model, and the first N layers (dense layers
        come first, so MoE layers offload only once every dense layer does)."""
        md, L = self.model, self.ctx.model.num_hidden_layers
        off = [self.n[c][k]["offload"] for c in range(self.V) for k in self.kinds]
        if self.V > 1:
            for x in off:
                md.add(x == 0)
            return
        md.add(sum(off) <= L - 1)
        on = md.new_bool_var("megatron_offload")
        md.add(sum(off) >= 1).only_enforce_if(on)
        md.add(sum(off) == 0).only_enforce_if(on.Not())
        for k in self.kinds:
            for r in self.modes:
                if r not in ("offload", "none"):
                    md.add(self.n[0][k][r] == 0).only_enforce_if(on)
        if len(self.kinds) == 2:
            dense, moe = self.kinds
            moe_off = md.new_bool_var("megatron_offload_moe")
            md.add(self.n[0][moe]["offload"] == 0).only_enforce_if(moe_off.Not())
            md.add(self.n[0][dense]["offload"] == self.count[dense]).only_enforce_if(moe_off)

    def _every_nth(self, on: Any, modes: list[str]) -> None:
        """torchtitan's every-Nth checkpointing where `on`: on each rank, counting the blocks it wraps in
        order (its virtual stages in order, dense layers first in each), block j is full iff
        (j + 1) % N == 0 and none otherwise, so a stage starting at the rank's position a and ending at b
        holds floor(b / N) - floor(a / N) full blocks."""
        md, L = self.model, self.ctx.model.num_hidden_layers
        self.nth = md.new_int_var(2, max(2, L), "every_nth")
        for c in range(self.V):
            for k in self.kinds:
                for o in modes:
                    if o not in ("full", "none"):
                        md.add(self.n[c][k][o] == 0).only_enforce_if(on)

        def floor_div(expr: Any, name: str) -> Any:
            x = md.new_int_var(0, L, f"pos_{name}")
            md.add(x == expr)
            q = md.new_int_var(0, L, f"fulls_before_{name}")
            md.add_division_equality(q, x, self.nth)
            return q

        for p in range(self.cfg.pp):
            start: LinearExpr | int = 0  # (the stage sizes are CP-SAT expressions)
            q_start = 0
            for c in self._rank_chunks(p):
                end = start + self.size[c]
                q_end = floor_div(end, f"c{c}_end")
                if len(self.kinds) == 2:
                    dense, moe = self.kinds
                    q_mid = floor_div(start + sum(self.n[c][dense][r] for r in self.modes), f"c{c}_dense")
                    md.add(self.n[c][dense]["full"] == q_mid - q_start).only_enforce_if(on)
                    md.add(self.n[c][moe]["full"] == q_end - q_mid).only_enforce_if(on)
                else:
                    md.add(self.n[c][self.kinds[0]]["full"] == q_end - q_start).only_enforce_if(on)
                start, q_start = end, q_end

    def _rank_chunks(self, p: int) -> list[int]:
        return [c for c in range(self.V) if c % self.cfg.pp == p]

    def _piece_sum(self, p: int, attr) -> Any:
        """Sum over the layers of rank p of attr(cost) as a linear expression (one weighted sum: the
        same terms, in the same order, as adding them one by one, without an expression per term)."""
        lay = self.table.layers
        per = {(k, r): attr(lay[(k, r)]) for k in self.kinds for r in self.modes}
        keys = [(c, k, r) for c in self._rank_chunks(p) for k in self.kinds for r in self.modes]
        return self.cp_model.LinearExpr.weighted_sum([self.n[c][k][r] for c, k, r in keys],
                                                     [per[(k, r)] for _, k, r in keys])

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
        self.fwd, self.bwd, self.time, self.wgrad = [], [], [], []
        self.rank_fixed: list[int] = []  # per rank: its time besides its layers (model units)
        for p in range(cfg.pp):
            chunks = len(self._rank_chunks(p))
            sends = chunks - (1 if p == cfg.pp - 1 else 0)
            recvs = chunks - (1 if p == 0 else 0)
            fixed_f = _t(self._rank_const(p, lambda c: c.fwd_s) + tb.pp_p2p_s * sends)
            fixed_b = _t(self._rank_const(p, lambda c: c.bwd_s) + tb.pp_p2p_s * recvs)
            self.rank_fixed.append(fixed_f + fixed_b)
            fwd = self._piece_sum(p, lambda c: _t(c.fwd_s)) + fixed_f
            bwd = self._piece_sum(p, lambda c: _t(c.bwd_s)) + fixed_b
            self.fwd.append(fwd)
            self.bwd.append(bwd)
            self.time.append(fwd + bwd)
            self.wgrad.append(self._piece_sum(p, lambda c: _t(c.wgrad_s)) + _t(self._rank_const(p, lambda c: c.wgrad_s)))
        # Per virtual stage (chunk) time, for the interleaved bubble.
        lay = self.table.layers
        self.chunk_time = []
        kr = [(k, r) for k in self.kinds for r in self.modes]
        per_layer = [_t(lay[x].total_s) for x in kr]  # (a chunk's coefficients: each layer's time)
        for c in range(self.V):
            p = c % cfg.pp
            const = 0.0
            if c == 0:
                const += tb.embed.total_s
            if c == self.V - 1:
                const += tb.head.total_s
            const += tb.pp_p2p_s * ((c < self.V - 1) + (c > 0))
            self.chunk_time.append(self.cp_model.LinearExpr.weighted_sum([self.n[c][k][r] for k, r in kr], per_layer)
                                   + _t(const))

    def _memory_constraints(self) -> None:
        """Static (weights, grads, optimizer under ZeRO) + in-flight activations + working set <= HBM."""
        ctx, cfg, tb, md = self.ctx, self.cfg, self.table, self.model
        dense_coef = static_bytes(ctx, cfg, 1.0, 0.0)
        exp_coef = static_bytes(ctx, cfg, 1.0, 1.0)
        per_dense = sum(dense_coef.values())
        per_exp = sum(exp_coef.values()) - per_dense  # extra bytes per expert param beyond dense sharding

        def static(c) -> float:
            return per_dense * c.params + per_exp * c.expert_params

        z3 = zero3_gathered_for(ctx, cfg, tb.layers.values())
        cap = ctx.capacity_bytes
        scale = cfg.vpp if cfg.schedule == "interleaved" else 1  # in-flight counts are k / vpp
        for p in range(cfg.pp):
            infl = inflight_microbatches(cfg, p, tb.microbatches) * scale
            infl_i = int(round(infl))
            lhs = (self._piece_sum(p, lambda c: scale * _b(static(c)) + infl_i * _b(c.act_bytes))
                   + scale * _b(self._rank_const(p, static)) + infl_i * _b(self._rank_const(p, lambda c: c.act_bytes))
                   + scale * _b(working_bytes(tb, p == cfg.pp - 1, p == 0) + z3))
            md.add(lhs <= scale * int(cap // MEM_UNIT_BYTES))
            if cfg.schedule == "interleaved":  # each window of the schedule's in-flight chunks (cost.assemble)
                # static bytes + the window's in-flight activations, term by term: each variable once,
                # with the coefficient the two sums would add up to (the same constraint, built at once)
                lay, chunks = tb.layers, self._rank_chunks(p)
                const = (_b(self._rank_const(p, static)) + _b(working_bytes(tb, p == cfg.pp - 1, p == 0) + z3))
                kr = [(k, r) for k in self.kinds for r in self.modes]
                st = np.array([_b(static(lay[x])) for x in kr], dtype=np.int64)
                act_b = np.array([_b(lay[x].act_bytes) for x in kr], dtype=np.int64)
                n_vars = np.array([self.n[c][k][r].index for c in chunks for k, r in kr], dtype=np.int64)
                wins = interleaved_windows(cfg.pp, cfg.vpp, p, tb.microbatches)
                coefs = (st[None, None, :] + np.array(wins, dtype=np.int64)[:, :, None] * act_b[None, None, :])
                limit = int(cap // MEM_UNIT_BYTES)
                ends = [(win[0] * _b(tb.embed.act_bytes) if p == 0 else 0)
                        + (win[-1] * _b(tb.head.act_bytes) if p == cfg.pp - 1 else 0) for win in wins]
                _add_at_most(md, n_vars, coefs.reshape(len(wins), -1), [limit - (const + e) for e in ends])

    def _objective(self) -> None:
        """step = pipeline time + max over ranks of the data-parallel tail (see cost.assemble)."""
        ctx, cfg, tb, md = self.ctx, self.cfg, self.table, self.model
        total = self.cp_model.LinearExpr.sum
        M = tb.microbatches
        horizon = _t(1e6)
        tmax = md.new_int_var(0, horizon, "t_max")
        for t in self.time:
            md.add(tmax >= t)
        md.add(cfg.pp * tmax >= total(self.time))  # redundant: strengthens the LP relaxation
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
        if self.count_cuts:
            self._count_cuts(tmax)
        forced = _memory_tmax(ctx, tb, self.modes)  # the recompute HBM forces on the fullest rank
        if math.isfinite(forced) and self.rank_cuts:
            self._rank_least_times()
        if math.isfinite(forced) and forced > 0:
            md.add(tmax >= int(forced / TIME_UNIT_S) - (L + 2))
        if cfg.schedule == "zero_bubble":
            umax = md.new_int_var(0, horizon, "u_max")
            for t, w in zip(self.time, self.wgrad):
                md.add(umax >= t - w)
            md.add(cfg.pp * umax >= total(self.time) - total(self.wgrad))  # redundant LP cuts
            u_tau = min(lay[(k, r)].total_s - lay[(k, r)].wgrad_s for k in self.kinds for r in self.modes)
            md.add(umax >= int(balanced_max(u_tau, u_ex, L) / TIME_UNIT_S) - (L + 2))
            pipe = M * tmax + (cfg.pp - 1) * umax
        elif cfg.schedule == "interleaved":
            if len(self.kinds) == 1 or not self.uniform:
                # Symmetry: a rank's chunks other than the first and last virtual stage, and past
                # the first count[dense] chunks (the only ones that can hold a dense layer: every
                # chunk holds one layer or more, dense layers first), hold identical layers and can
                # be permuted without changing rank totals, the largest chunk, memory, sends or
                # the near-even sizes; keep them sorted by time.
                start = 1 if len(self.kinds) == 1 else max(1, self.count[self.kinds[0]])
                for p in range(cfg.pp):
                    free = [c for c in self._rank_chunks(p) if start <= c < self.V - 1]
                    for a, b in zip(free, free[1:]):
                        md.add(self.chunk_time[a] >= self.chunk_time[b])
            cmax = md.new_int_var(0, horizon, "chunk_max")
            for ct in self.chunk_time:
                md.add(cmax >= ct)
            md.add(self.V * cmax >= total(self.chunk_time))
            c_ex, _ = _stage_extras(tb, self.V, per_rank=False)
            md.add(cmax >= int(balanced_max(tau, c_ex, L) / TIME_UNIT_S) - (L + 2))
            # A rank's time is the sum of its chunks' (up to rounding): its largest chunk is >= 1 / vpp of it.
            for t in self.time:
                md.add(cfg.vpp * cmax >= t - (L + 2))
            if math.isfinite(forced) and forced > 0:
                md.add(cfg.vpp * cmax >= int(forced / TIME_UNIT_S) - cfg.vpp * (L + 2))
            pipe = M * tmax + (cfg.pp - 1) * cmax
        else:
            pipe = M * tmax + total(self.time) - tmax
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
            layer_kinds = self.ctx.model.layer_kinds()
            start = 0
            hint: list[int] = []
            for size in even_split(len(layer_kinds), self.V):
                chunk = layer_kinds[start:start + size]
                start += size
                hint += [chunk.count(k) if r == self.modes[0] else 0 for k in self.kinds for r in self.modes]
            self._hint(hint)

    def _count_cuts(self, tmax: Any) -> None:
        """Redundant: each rank's layers of each kind as an integer count, and t_max at least the
        rank's fixed time plus each count times its kind's fastest mode (each mode's own time where
        the framework runs one mode for every layer and it is picked). A bound on t_max then bounds
        each count by propagation, and the counts must sum to the model's: the whole-layer
        balance CP-SAT otherwise proves by branching on fractional layers."""
        md, lay, pick, total = self.model, self.table.layers, self.pick, self.cp_model.LinearExpr.sum

        def least(k: str, among: list[str]) -> int:  # (the rank time's coefficient of one layer, in model units)
            return min(_t(lay[(k, r)].fwd_s) + _t(lay[(k, r)].bwd_s) for r in among)

        fastest = {k: least(k, self.modes) for k in self.kinds}
        # per picked mode: its own time, or a faster mode outside the pick (e.g. offload) left free beside it
        free = [o for o in self.modes if o not in pick]
        picked = {r: {k: least(k, [r, *free]) for k in self.kinds} for r in pick}
        per_kind: dict[str, list[Any]] = {k: [] for k in self.kinds}
        for p in range(self.cfg.pp):
            chunks = self._rank_chunks(p)
            cnt = {}
            for k in self.kinds:
                cnt[k] = md.new_int_var(0, self.count[k], f"layers_{k}_rank{p}")
                md.add(cnt[k] == total([self.n[c][k][r] for c in chunks for r in self.modes]))
                per_kind[k].append(cnt[k])
            md.add(tmax >= sum(fastest[k] * cnt[k] for k in self.kinds) + self.rank_fixed[p])
            for r, b in pick.items():
                md.add(tmax >= sum(picked[r][k] * cnt[k] for k in self.kinds) + self.rank_fixed[p]).only_enforce_if(b)
        for k in self.kinds:
            md.add(total(per_kind[k]) == self.count[k])

    def _rank_least_times(self) -> None:
        """Redundant: each rank's time is at least the least time of its dense and MoE layer counts
        with a recompute mix that fits its HBM (`_rank_times`, rounded down; counts no mix fits are
        out). Memory constraints say the same linearly, but their LP relaxation spreads recompute
        thin; with the counts fixed, this bound is exact, and proofs under memory pressure shrink
        (DeepSeek-V3 tp2 ep32 pp8x4 interleaved on 2,048 H800: 4.5 -> 0.7 units)."""
        md, L = self.model, self.ctx.model.num_hidden_layers
        t = _rank_times(self.ctx, self.table, self.modes)
        P, D, N = t.shape
        dense = self.kinds[0] if len(self.kinds) == 2 else None
        moe = self.kinds[-1]
        lay = self.table.layers
        fastest = [min(lay[(k, r)].total_s for r in self.modes) for k in ([dense] if dense else []) + [moe]]
        free = t[:, :1, :1] + (np.arange(D)[None, :, None] * fastest[0] if dense else 0.0) \
            + np.arange(N)[None, None, :] * fastest[-1]  # every layer at its fastest mode
        ok = np.isfinite(t)
        if not (t[ok] > free[ok] + (L + 2) * TIME_UNIT_S).any():
            return  # HBM forces no recompute on any rank: nothing to add
        for p in range(P):
            chunks = self._rank_chunks(p)
            d = sum(self.n[c][dense][r] for c in chunks for r in self.modes) if dense else 0
            m = sum(self.n[c][moe][r] for c in chunks for r in self.modes)
            ok = np.isfinite(t[p].ravel())
            idx = md.new_int_var_from_domain(self.cp_model.Domain.from_values(np.flatnonzero(ok).tolist()),
                                             f"rank_counts_{p}")
            md.add(idx == d * N + m)
            least = [max(0, int(x / TIME_UNIT_S) - (L + 2)) if k else 0 for x, k in zip(t[p].ravel(), ok)]
            low = md.new_int_var(0, max(least), f"rank_least_{p}")
            md.add_element(idx, least, low)
            md.add(self.time[p] >= low)

    def tiebreak(self, best_scaled: int) -> None:
        """Second pass: keep the optimum, prefer fewer recomputed layers, then earlier layers.

        The first pass's solution is the hint, so the pass starts from a feasible point."""
        md = self.model
        md.clear_hints()  # CP-SAT rejects a model whose hint names a variable twice
        self._hint([self.solver.value(var) for var in self._all_vars()])
        md.clear_objective()
        md.add(self.step <= best_scaled)
        weight = {r: i for i, r in enumerate(list(RECOMPUTES) + [m for m in self.modes if m not in RECOMPUTES])}
        L = self.ctx.model.num_hidden_layers
        md.minimize(sum((L + 1) * weight[r] * self.n[c][k][r] + c * self.n[c][k][r]
                        for c in range(self.V) for k in self.kinds for r in self.modes))

    def _all_vars(self) -> list[Any]:
        return [self.n[c][k][r] for c in range(self.V) for k in self.kinds for r in self.modes]

    def _hint(self, values: list[int]) -> None:
        """`md.add_hint(var, value)` for every variable of `_all_vars` in order, in one go (the same
        proto: the hint's variable indices and values appended)."""
        hint = self.model.proto.solution_hint
        hint.vars.extend([var.index for var in self._all_vars()])
        hint.values.extend([int(v) for v in values])

    def tighten(self, cutoff_units: int) -> None:
        """Require a step time of at most `cutoff_units` from now on (cutoffs only descend), with
        the last solution as the hint."""
        md = self.model
        md.add(self.step <= cutoff_units * self.scale)
        self.cutoff = cutoff_units
        if getattr(self, "solver", None) is not None:
            md.clear_hints()
            self._hint([self.solver.value(var) for var in self._all_vars()])

    def solve(self, work_s: float, wall_s: float | None = None,
              first_solution: bool = False) -> tuple[str, int | None, int | None]:
        """Solve within `work_s` of CP-SAT's deterministic time (about a second of work each:
        the same answer on any machine) and, as a safety net, `wall_s` of wall-clock time
        (default 4 x work_s + 1). `first_solution`: stop at the first solution under the
        cutoff (the search then lowers the cutoff and asks again). Returns (status, objective,
        bound) in model units; `self.work_s` is the deterministic time spent and
        `self.wall_fired` whether the wall-clock limit (not the work limit) stopped it."""
        cp_model = self.cp_model
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = 1
        prm.random_seed = 7
        prm.catch_sigint_signal = False  # Ctrl-C interrupts autoshard, not just one CP-SAT search
        prm.max_deterministic_time = max(0.01, work_s)
        prm.max_time_in_seconds = max(0.05, 4 * work_s + 1 if wall_s is None else wall_s)
        prm.stop_after_first_solution = first_solution
        # No presolve: on these models (a few hundred variables) it took 80-95% of each call's CPU
        # (0.5-1.3 s on Llama 3 405B's interleaved stage models, 0.07-0.27 s without) and little of its
        # deterministic time, so it ran far past the budget's count; the search needs none of it
        # (bench_solve --issue: every answer the same, 10-40% less CPU).
        prm.cp_model_presolve = False
        # No symmetry detection: CP-SAT builds a graph of the whole model on every call (7,000 nodes on
        # a 56-chunk interleaved model) and finds nothing it uses without presolve: the 83 stage models
        # of the 122-layer DeepSeek-V3 on 2,048 H100 give the same statuses, solutions and deterministic
        # time with 7% less CPU.
        prm.symmetry_level = 0
        self.live = solver  # (`stop` from another thread ends it early)
        if getattr(self, "stopped", False):
            prm.max_deterministic_time = prm.max_time_in_seconds = 0.0
        status = solver.solve(self.model)
        self.solver = solver
        self.work_s = float(solver.response_proto.deterministic_time)
        self.wall_fired = (status in (cp_model.UNKNOWN, cp_model.FEASIBLE) and not first_solution
                           and self.work_s < 0.95 * prm.max_deterministic_time) or (
            status == cp_model.UNKNOWN and self.work_s < 0.95 * prm.max_deterministic_time)
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

    def stop(self) -> None:
        """End the running solve (and any later one) now: on Ctrl-C while solves run in threads."""
        self.stopped = True
        live = getattr(self, "live", None)
        if live is not None:
            live.stop_search()

    def read_counts(self) -> dict[tuple[int | str, str, str], int]:
        counts: dict[tuple[int | str, str, str], int] = {(c, k, r): self.solver.value(self.n[c][k][r])
                  for c in range(self.V) for k in self.kinds for r in self.modes}
        if getattr(self, "nth", None) is not None:
            counts[("every_nth", "", "")] = self.solver.value(self.nth)
        return counts

    def read_plan(self, counts: dict[tuple[int | str, str, str], int]) -> tuple[list[int], list[str]]:
        """stage_layers and per-layer recompute from solved counts (full, selective, none
        within each stage, dense layers first)."""
        stage_layers, recompute = [], []
        for c in range(self.V):
            size = 0
            for k in self.kinds:
                for r in ["full", *[m for m in self.modes if m not in RECOMPUTES], "selective", "none"]:
                    cnt = counts.get((c, k, r), 0)
                    recompute += [r] * cnt
                    size += cnt
            stage_layers.append(size)
        if set(recompute) == {"full", "none"} and ("every_nth", "", "") in counts:
            n = counts[("every_nth", "", "")]
            laid = every_nth_list(stage_layers, self.cfg.pp, n)
            if sorted(laid) == sorted(recompute):
                recompute = laid
        return stage_layers, recompute


def _rounding_tolerance(ctx: Context, table: Table) -> float:
    """Largest |objective - evaluated time| integer rounding can cause: half a unit per
    rounded coefficient, times how often it is counted."""
    cfg = table.cfg
    uses = (table.microbatches + cfg.pp + 2) * (ctx.model.num_hidden_layers + 3) * 3
    return uses * 0.5 * TIME_UNIT_S

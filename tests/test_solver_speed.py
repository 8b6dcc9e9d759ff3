"""The solver's speed-ups change no number: the memory bound's fronts (`bounds._FrontSet`), their
lookup (`bounds._least_time`) and the layer costs shared per kind (`cost.layers._kind_costs`) give
exactly what the straightforward computations they replace give (written out here as references)."""

import dataclasses
import importlib

import numpy as np

from autoshard import Plan, load_problem
from autoshard.cost import Config, context, evaluate, layer_table, with_modes
from autoshard.solver import _placements, candidates, solve
from autoshard.layouts import search_modes

# (the modules: `autoshard.solver.bounds` the attribute is the function `bounds`)
B = importlib.import_module("autoshard.solver.bounds")
cost_layers = importlib.import_module("autoshard.cost.layers")

# A small MoE model with dense layers first (two kinds) and several recompute modes per kind.
SMALL_MOE = {"name": "moe", "num_hidden_layers": 12, "hidden_size": 4096, "intermediate_size": 16384,
             "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "num_experts": 16,
             "num_experts_per_tok": 2, "moe_intermediate_size": 4096, "first_k_dense_replace": 3}


def solved_doc(problem: dict, top_k: int = 3) -> dict:
    """The solution's JSON without its timing field (what must not change)."""
    doc = solve(load_problem(problem), top_k=top_k).model_dump(mode="json")
    doc["solver"].pop("solve_time_s")
    return doc


CAPPED: list[int] = []  # fronts the reference bucketed (their sizes before)


def reference_pareto(b: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The front as first written: a sort by (bytes, time), the running-minimum mask, FRONT_CAP buckets."""
    o = np.lexsort((t, b))
    b, t = b[o], t[o]
    keep = np.ones(len(t), dtype=bool)
    keep[1:] = t[1:] < np.minimum.accumulate(t)[:-1]
    b, t = b[keep], t[keep]
    if len(b) > B.FRONT_CAP:
        CAPPED.append(len(b))
        edges = np.linspace(b[0], b[-1], B.FRONT_CAP + 1)
        bucket = np.minimum(np.searchsorted(edges, b, side="right") - 1, B.FRONT_CAP - 1)
        first = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
        last = np.r_[first[1:], len(b)] - 1
        b, t = b[first], t[last]
    return b, t


def reference_fronts(a: np.ndarray, s: np.ndarray, n_max: int) -> list[tuple[np.ndarray, np.ndarray]]:
    fronts = [(np.zeros(1), np.zeros(1))]
    for _ in range(n_max):
        b, t = fronts[-1]
        fronts.append(reference_pareto((b[:, None] + a[None, :]).ravel(), (t[:, None] + s[None, :]).ravel()))
    return fronts


def reference_least_time(fronts: list, room: np.ndarray) -> np.ndarray:
    """As first written: the fronts padded with +inf bytes to one width, a binary search of each
    count's row for the leanest point that fits (a room of +inf or NaN reaches the padding: inf)."""
    width = max(len(b) for b, _ in fronts)
    Bp = np.full((len(fronts), width), np.inf)
    Tp = np.full((len(fronts), width), np.inf)
    for j, (b, t) in enumerate(fronts):
        Bp[j, :len(b)], Tp[j, :len(t)] = b, t
    out = np.empty(room.shape)
    for j in range(room.shape[-1]):
        i = np.searchsorted(Bp[j], room[..., j], side="right") - 1
        out[..., j] = np.where(i >= 0, Tp[j, np.maximum(i, 0)], np.inf)
    return out


def test_fronts_equal_the_reference_with_ties_and_buckets():
    """Random modes on a coarse grid (many equal byte sums, and equal times) and enough layers to
    pass FRONT_CAP: every front equals the reference's, value for value; `least_bytes` is each
    front's first point."""
    rng = np.random.default_rng(7)
    CAPPED.clear()
    for trial in range(40):
        m = int(rng.integers(1, 7))
        if trial % 2:  # a coarse grid: many equal byte sums and equal times
            a = rng.integers(0, 12, m).astype(float) * (1e6 if trial % 4 == 1 else 1.37)
            s = rng.integers(1, 7, m) * 0.013
        else:  # a trade-off like the recompute modes': leaner modes are slower
            a = np.sort(rng.uniform(2e8, 8e9, m))[::-1]
            s = np.sort(rng.uniform(0.15, 0.21, m))
        n = int(rng.integers(1, 70))
        got = B._FrontSet(a, s).upto(n)
        ref = reference_fronts(a, s, n)
        assert len(got) == len(ref)
        for (gb, gt), (rb, rt) in zip(got, ref):
            assert np.array_equal(gb, rb) and np.array_equal(gt, rt), trial
        assert np.array_equal(B._FrontSet(a, s).least_bytes(n), np.array([b[0] for b, _ in ref]))
    assert len(CAPPED) >= 20  # (the buckets were exercised)


def moe_table(seq: int = 8192):
    p = load_problem({"model": SMALL_MOE, "training": {"seq_len": seq, "global_batch_size": 64},
                      "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
                      "search": {"pp": [2], "zero_stage": [1], "micro_batch_size": [1]}})
    ctx = context(p)
    modes = search_modes(p, ctx)
    ctx = with_modes(ctx, modes)
    cfg = candidates(p, ctx)[0]
    return p, ctx, modes, layer_table(ctx, _placements(p, ctx, cfg)[0])


@dataclasses.dataclass
class _Piece:  # (what `_exact_least_time` reads of a layer's cost)
    act_bytes: float
    total_s: float


def brute_least_time(a: np.ndarray, s: np.ndarray, n: int, room: float) -> float:
    """The least time of n layers over every count of every mode (useful or not) that fits in room."""
    best = np.inf

    def walk(m: int, left: int, used_b: float, used_t: float) -> None:
        nonlocal best
        if m == len(a) - 1:
            b, t = used_b + left * a[m], used_t + left * s[m]
            if b <= room:
                best = min(best, t)
            return
        for c in range(left + 1):
            walk(m + 1, left - c, used_b + c * a[m], used_t + c * s[m])

    walk(0, n, 0.0, 0.0)
    return best


def _rooms(rng: np.random.Generator, points: np.ndarray, shape: tuple) -> list[np.ndarray]:
    """Rooms anywhere (negative, at front points exactly, shrinking with the count past where none
    fits, +inf and NaN)."""
    top = points.max()
    N = shape[-1]
    rooms = [rng.uniform(-0.1 * top, 1.2 * top, shape),
             rng.uniform(-0.1 * top, 0.3 * top, shape) - np.arange(N) * 0.05 * top,  # past some count: none fits
             points[rng.integers(0, len(points), shape)]]
    r = rng.uniform(0, top, shape)
    r[0, 0, :] = np.inf
    r[-1, -1, :] = np.nan
    rooms.append(r)
    return rooms


def test_least_time_equals_a_binary_search_per_count():
    """`_least_time` over fronts (more than EXACT_MIX_MODES useful modes; counts past the last whose leanest mix
    fits any room skipped, one lookup for every count) equals a binary search of every count's
    reference front, for rooms anywhere (negative, at front points exactly, +inf, NaN) and rooms
    that shrink with the count."""
    rng = np.random.default_rng(3)
    tested = 0
    for trial in range(6):
        m = B.EXACT_MIX_MODES + 1 + trial % 2
        a = np.sort(rng.choice(np.arange(2, 60), m, replace=False).astype(float) * 1e8)[::-1]
        s = np.sort(rng.uniform(0.05, 0.09, m))
        modes = [f"m{i}" for i in range(m)]
        table = type("T", (), {})()
        table.layers = {("moe", r): _Piece(a[i], s[i]) for i, r in enumerate(modes)}
        table.memo = {}
        useful = B._useful_modes(table, "moe", modes)
        assert len(useful) == m  # (sorted bytes down, time up: every mode useful)
        N = 40 if trial < 2 else 12  # (40: past FRONT_CAP, the buckets read)
        ref = reference_fronts(a, s, N - 1)
        points = np.concatenate([b for b, _ in ref])
        for shape in [(40, 3, N), (5, 1, N)]:
            for room in _rooms(rng, points, shape):
                assert np.array_equal(B._least_time(table, "moe", modes, room), reference_least_time(ref, room))
                tested += 1
    assert tested >= 40


def _check_against_every_mix(table, kind: str, modes: list[str], rooms: list[np.ndarray]) -> int:
    every = [table.layers[(kind, r)] for r in modes]
    a, s = np.array([c.act_bytes for c in every]), np.array([c.total_s for c in every])
    tested = 0
    for room in rooms:
        got = B._least_time(table, kind, modes, room)
        for idx in np.ndindex(room.shape):
            r, n = room[idx], idx[-1]
            want = (n * min(s[a == a.max()]) if np.isposinf(r) else np.inf if np.isnan(r)
                    else brute_least_time(a, s, n, r))
            assert (got[idx] == want if np.isinf(want) else abs(got[idx] - want) <= 1e-12 * want), (kind, idx)
            tested += 1
    return tested


def test_enumerated_least_time_equals_every_mix():
    """`_least_time` with three or four useful modes (enumerated, no fronts) equals the least time
    over every count of every planned mode (dominated ones included) that fits: on the small MoE
    model's layer costs (three useful modes of four) and on random four-mode costs, for rooms
    anywhere, at front points exactly and shrinking with the count; +inf fits every layer at the
    fastest mode, NaN nothing. Past ENUMERATED_CELLS the fronts answer (the binary-search test)."""
    _, ctx, modes, table = moe_table()
    kinds = ctx.model.layer_kinds()
    rng = np.random.default_rng(5)
    tested = 0
    for kind in sorted(set(kinds)):
        assert len(B._useful_modes(table, kind, modes)) == 3
        every = [table.layers[(kind, r)] for r in modes]
        a, s = np.array([c.act_bytes for c in every]), np.array([c.total_s for c in every])
        N = kinds.count(kind) + 1
        points = np.concatenate([b for b, _ in reference_fronts(a, s, N - 1)])
        tested += _check_against_every_mix(table, kind, modes, _rooms(rng, points, (6, 2, N)))
    for trial in range(4):
        a = np.sort(rng.choice(np.arange(2, 60), 4, replace=False).astype(float) * 1e8)[::-1]
        s = np.sort(rng.uniform(0.05, 0.09, 4))
        four = [f"m{i}" for i in range(4)]
        fake = type("T", (), {})()
        fake.layers = {("moe", r): _Piece(a[i], s[i]) for i, r in enumerate(four)}
        fake.memo = {}
        assert len(B._useful_modes(fake, "moe", four)) == 4
        points = np.concatenate([b for b, _ in reference_fronts(a, s, 8)])
        tested += _check_against_every_mix(fake, "moe", four, _rooms(rng, points, (3, 2, 9)))
    assert tested >= 800


def test_first_kind_fronts_over_useful_modes_equal_every_mode():
    """`_rank_times` combines the first kind's fronts over its useful modes only: the same fronts as
    over every planned mode (a dominated mode's mixes are dominated)."""
    _, ctx, modes, table = moe_table()
    for kind in sorted(set(ctx.model.layer_kinds())):
        useful = B._useful_modes(table, kind, modes)
        assert len(useful) < len(modes) or kind == "moe"
        costs = [table.layers[(kind, r)] for r in modes]
        every = reference_fronts(np.array([c.act_bytes for c in costs]), np.array([c.total_s for c in costs]), 30)
        got = B._mix_fronts(table, kind, useful, 30)
        assert all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(got, every))


def test_layer_costs_shared_per_kind_equal_a_fresh_pricing(monkeypatch):
    """Every layer-cost hit of the per-kind cache during a whole solve (ZeRO-3, MoE folding, EP
    overlap, several pp / schedules) equals `layer_costs` priced afresh for that configuration and
    placement; dense layers are shared across expert layouts, and the answer is the one the solver
    gives without the per-kind sharing."""
    problem = {"model": SMALL_MOE, "training": {"seq_len": 4096, "global_batch_size": 64},
               "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
               "search": {"micro_batch_size": [1, 2], "zero_stage": [1, 3], "cp": [1]}}
    hits: dict[str, int] = {}
    original = cost_layers.layer_costs

    def counting(ctx, cfg, pl, kind, cache=None):
        hits[kind] = hits.get(kind, 0) + 1
        return original(ctx, cfg, pl, kind, cache)

    monkeypatch.setattr(cost_layers, "layer_costs", counting)

    shared = solved_doc(problem)
    priced = dict(hits)
    monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", True)  # every hit re-priced and compared
    assert solved_doc(problem) == shared
    # Without sharing (each shared_costs entry prices its own kinds) the same answer comes back.
    monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", False)
    monkeypatch.setattr(cost_layers, "_kind_costs", lambda ctx, cfg, pl, kind, cache: counting(ctx, cfg, pl, kind))
    hits.clear()
    assert solved_doc(problem) == shared
    # (the sharing was exercised: fewer pricings, dense kinds most of all)
    assert priced["dense"] < hits["dense"] / 2 and priced["moe"] < hits["moe"]


def test_dense_layer_costs_ignore_the_expert_layout():
    """A dense layer priced under two expert layouts (ep, etp) of the same attention layout costs the same."""
    p, ctx, modes, table = moe_table()
    cfg = table.cfg
    other = dataclasses.replace(cfg, ep=cfg.ep * 2 if cfg.ep < 8 else 1)
    t2 = layer_table(ctx, _placements(p, ctx, other)[0])
    assert t2.placement.tp == table.placement.tp and t2.placement.cp == table.placement.cp
    assert cost_layers.layer_costs(ctx, cfg, table.placement, "dense") == \
        cost_layers.layer_costs(ctx, other, t2.placement, "dense")
    assert cost_layers.layer_costs(ctx, cfg, table.placement, "moe") != \
        cost_layers.layer_costs(ctx, other, t2.placement, "moe")


def test_kind_cache_keeps_fsdp_host_time_on_one_gpu(monkeypatch):
    """On one GPU a fully sharded plan (torchtitan FSDP2, as measured) pays the per-block hook time though it
    has no data parallelism: the per-kind cache must not hand a ZeRO-0 configuration's layer costs to a
    ZeRO-3 one (the key holds zero == 3 apart from the ZeRO-3 traffic groups). Every hit re-priced."""
    monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", True)
    problem = load_problem({"model": {"name": "m", "num_hidden_layers": 4, "hidden_size": 2048,
                                      "intermediate_size": 8192, "num_attention_heads": 32,
                                      "num_key_value_heads": 8, "vocab_size": 128256},
                            "framework": "torchtitan", "training": {"seq_len": 256, "global_batch_size": 1},
                            "cluster": {"gpu": "h100-sxm", "num_gpus": 1}})
    z0 = evaluate(problem, Plan(zero_stage=0))
    z3 = evaluate(problem, Plan(zero_stage=3))
    assert z3.step_time_s > z0.step_time_s  # FSDP2's hooks where the GPU is idle (256 tokens)
    ctx = context(problem)
    cache: dict = {}
    costs = {}
    for zero in (0, 3):
        table = layer_table(ctx, Config.of(Plan(zero_stage=zero), 1))
        costs[zero] = cost_layers._kind_costs(ctx, table.cfg, table.placement, "dense", cache)
    assert costs[3]["none"].fwd["host"] + costs[3]["none"].bwd["host"] > \
        costs[0]["none"].fwd["host"] + costs[0]["none"].bwd["host"]


def reference_split_fits(t: np.ndarray, T: float, min_per: int, d_lo: list[int], d_hi: list[int]) -> bool:
    """`_memory_tmax`'s split test as first written: a program over every rank, rank by rank, on the
    reachable (first-kind total -> second-kind totals as a bit mask)."""
    P, D, N = t.shape
    n1, n2 = D - 1, N - 1
    most = (t <= T).sum(axis=2) - 1
    if D == 1:
        return bool((most[:, 0] >= min_per).all() and most[:, 0].sum() >= n2)
    reach = {0: 1}
    for p in range(P):
        nxt: dict[int, int] = {}
        for d, mask in reach.items():
            for k in range(d_lo[p], min(d_hi[p], n1 - d) + 1):
                lo, hi = max(0, min_per - k), min(int(most[p, k]), n2)
                if hi >= lo:
                    nxt[d + k] = nxt.get(d + k, 0) | (B._spread(mask, lo, hi) & ((1 << (n2 + 1)) - 1))
        reach = nxt
        if not reach:
            return False
    return bool((reach.get(n1, 0) >> n2) & 1)


def random_rank_tables(rng: np.random.Generator, n2_high: int, count: int = 400):
    """`count` random rank-time tables (P ranks x first-kind x second-kind counts, non-decreasing in the
    second kind, 5% infinite) with their split constraints: (t, min_per, d_lo, d_hi)."""
    for _ in range(count):
        P = int(rng.integers(1, 9))
        n1 = int(rng.integers(0, 4))
        n2 = int(rng.integers(0, n2_high))
        vpp = int(rng.integers(1, 4))
        t = rng.integers(1, 30, size=(P, n1 + 1, n2 + 1)).astype(float)
        t[rng.random(t.shape) < 0.05] = np.inf
        t = np.maximum.accumulate(t, axis=2)
        min_per = vpp if P > 1 else n1 + n2
        if P > 1:
            d_lo = [min(1, n1) if p == 0 else 0 for p in range(P)]
            d_hi = [min(n1, sum(n1 - c for c in range(p, min(n1, P * vpp), P))) for p in range(P)]
        else:
            d_lo, d_hi = [0], [n1]
        yield t, min_per, d_lo, d_hi


def test_split_fits_equals_the_rank_by_rank_program():
    """`_split_fits` (the ranks past the dense layers taken together as one range of sums) gives the
    rank-by-rank program's answer at every level of random rank-time tables, including ranks that
    hold nothing, minimums above a rank's room or above the layer count, and one-kind tables."""
    checked = {True: 0, False: 0}
    for t, min_per, d_lo, d_hi in random_rank_tables(np.random.default_rng(11), 14):
        for T in np.unique(np.r_[t[np.isfinite(t)], 0.0]):
            want = reference_split_fits(t, T, min_per, d_lo, d_hi)
            assert B._split_fits(t, T, min_per, d_lo, d_hi) == want, (t, T, min_per, d_lo, d_hi)
            checked[want] += 1
    assert checked[True] > 300 and checked[False] > 1000, checked


def test_fits_at_levels_equals_the_rank_by_rank_program():
    """`_fits_at_levels` (every level at once: a max-plus program over ranks on the first-kind total)
    gives the rank-by-rank program's answer at every level of random rank-time tables (one and two
    kinds, one rank, ranks that hold nothing, minimums above a rank's room), and declines (None) only
    where minimums could exceed the second kind's layers."""
    checked = {True: 0, False: 0, "declined": 0}
    for t, min_per, d_lo, d_hi in random_rank_tables(np.random.default_rng(12), 30):
        levels = np.unique(np.r_[t[np.isfinite(t)], 0.0])
        got = B._fits_at_levels(t, levels, min_per, d_lo, d_hi)
        if got is None:
            P, n1, n2 = t.shape[0], t.shape[1] - 1, t.shape[2] - 1
            assert n1 > 0 and P > 1 and P * min_per > n2
            checked["declined"] += 1
            continue
        assert got.dtype == bool and got.shape == levels.shape
        for T, g in zip(levels, got):
            want = reference_split_fits(t, T, min_per, d_lo, d_hi)
            assert bool(g) == want, (t, T, min_per, d_lo, d_hi)
            checked[want] += 1
    assert checked[True] > 300 and checked[False] > 1000 and 0 < checked["declined"] < 150, checked


def test_memory_tmax_equals_the_least_level_that_fits():
    """`_memory_tmax` (searched with a sentinel instead of a first test of the top level) equals the
    least level of the rank times at which the rank-by-rank program fits, found by a linear scan,
    on every configuration and placement of a small two-kind MoE problem."""
    p = load_problem({"model": SMALL_MOE, "training": {"seq_len": 8192, "global_batch_size": 64},
                      "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
                      "search": {"pp": [1, 2, 4], "zero_stage": [1], "micro_batch_size": [1, 2]}})
    ctx = context(p)
    modes = search_modes(p, ctx)
    ctx = with_modes(ctx, modes)
    kinds = ctx.model.layer_kinds()
    seen = {"inf": 0, "finite": 0, "pp>2": 0, "pp1": 0}
    for cfg in candidates(p, ctx)[::2]:
        for pl_cfg in _placements(p, ctx, cfg)[:2]:
            table = layer_table(ctx, pl_cfg)
            t = B._rank_times(ctx, table, modes)
            P, D, N = t.shape
            n1 = D - 1
            min_per = table.cfg.vpp if P > 1 else len(kinds)
            if P > 1:
                d_lo = [min(1, n1) if q == 0 else 0 for q in range(P)]
                d_hi = [min(n1, sum(n1 - c for c in range(q, min(n1, P * table.cfg.vpp), P))) for q in range(P)]
            else:
                d_lo, d_hi = [0], [n1]
            want = next((float(T) for T in np.unique(t[np.isfinite(t)])
                         if reference_split_fits(t, T, min_per, d_lo, d_hi)), np.inf)
            got = B._memory_tmax(ctx, table, modes)
            if P == 1:  # (`_one_rank_tmax`: the same whole-layer optimum, its times summed in another order)
                assert got == want or abs(got - want) <= 1e-12 * want
                seen["pp1"] += 1
            else:
                assert got == want
            seen["inf" if np.isinf(want) else "finite"] += 1
            seen["pp>2"] += P > 2
    assert seen["finite"] >= 10 and seen["pp>2"] >= 5 and seen["pp1"] >= 3, seen


def test_exact_least_time_equals_every_mix():
    """`_exact_least_time` (the two fastest useful modes in closed form, the counts of the others
    enumerated) equals the least time over every count of every mode, dominated modes included, for
    one to four useful modes, rooms at mixes' bytes exactly, between them, below the leanest mix and
    +inf; with more than EXACT_MIX_MODES useful modes it reads `_least_time`'s (unbucketed) fronts."""
    rng = np.random.default_rng(11)
    kinds_seen = set()
    for trial in range(120):
        m = int(rng.integers(1, 7))
        a = rng.integers(1, 40, m).astype(float) * 1e8  # (whole bytes: sums exact)
        s = rng.integers(10, 30, m) * 0.0071
        modes = [f"m{i}" for i in range(m)]
        table = type("T", (), {})()
        table.layers = {("moe", r): _Piece(a[i], s[i]) for i, r in enumerate(modes)}
        table.memo = {}
        k = len(B._useful_modes(table, "moe", modes))
        kinds_seen.add(min(k, B.EXACT_MIX_MODES + 1))
        n = int(rng.integers(0, 9))
        mixes = [n * x for x in a] + [rng.integers(0, n + 1) * a[0] + rng.integers(0, n + 1) * a[-1]]
        rooms = np.array([*mixes, *(rng.uniform(0, n * a.max() + 1, 6)), n * a.min() - 1, np.inf])
        got = B._exact_least_time(table, "moe", modes, n, rooms)
        want = np.array([brute_least_time(a, s, n, r) for r in rooms])
        assert np.array_equal(np.isinf(got), np.isinf(want)), trial
        fin = np.isfinite(want)
        assert np.allclose(got[fin], want[fin], rtol=1e-12, atol=0), trial
    assert kinds_seen >= {1, 2, 3, 4, 5}, kinds_seen


def test_one_rank_bound_is_exact_where_the_fronts_bucket(monkeypatch):
    """A one-stage configuration: `_one_rank_tmax` (whole layers, no fronts) equals the bound read from
    `_rank_times` with every mix enumerated (the same whole-layer optimum), and compared with
    the same read from the fronts (`ENUMERATED_CELLS` 0): equal on the 12-layer MoE, where no front
    reaches FRONT_CAP points, at least as tight on the 80-layer one, tighter where buckets rounded,
    by no more than their rounding."""
    for layers, bucketed in ((12, False), (80, True)):
        p = load_problem({"model": {**SMALL_MOE, "num_hidden_layers": layers},
                          "training": {"seq_len": 8192, "global_batch_size": 64},
                          "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
                          "search": {"pp": [1], "tp": [4], "zero_stage": [3], "micro_batch_size": [1]}})
        ctx = context(p)
        modes = search_modes(p, ctx)
        ctx = with_modes(ctx, modes)
        kinds = ctx.model.layer_kinds()
        compared = tighter = 0
        for cfg in candidates(p, ctx):
            table = layer_table(ctx, _placements(p, ctx, cfg)[0])
            new = B._one_rank_tmax(ctx, table, modes)
            with monkeypatch.context() as m:
                m.setattr(B, "ENUMERATED_CELLS", 1 << 40)
                enumerated = B._least_fitting_level(B._rank_times(ctx, table, modes), kinds, table)
            with monkeypatch.context() as m:
                m.setattr(B, "ENUMERATED_CELLS", 0)
                fronts = B._least_fitting_level(B._rank_times(ctx, table, modes), kinds, table)
            if not np.isfinite(fronts):
                assert not np.isfinite(new) and not np.isfinite(enumerated)
                continue
            compared += 1
            assert abs(new - enumerated) <= 1e-12 * new
            if bucketed:
                assert fronts * (1 - 1e-12) <= new <= fronts * 1.05
                tighter += new > fronts * (1 + 1e-9)
            else:
                assert abs(new - fronts) <= 1e-12 * fronts
        assert compared >= 1 and (tighter >= 1) == bucketed, (layers, compared, tighter)


def test_memory_tmax_on_the_first_counts_equals_the_whole_array(monkeypatch):
    """`_memory_tmax` answers from a rank's first counts (`_rank_times` count_max) where every rank's
    time one count further is already at or above that answer: on every configuration and placement
    of a 24-layer two-kind MoE problem the answer equals the least fitting level of the whole array
    (the rank-by-rank program, linear scan), the cut arrays are the whole array's prefixes, and both
    the cut answer and the fallback to the whole array occur."""
    model = {**SMALL_MOE, "num_hidden_layers": 24}
    p = load_problem({"model": model, "training": {"seq_len": 8192, "global_batch_size": 64},
                      "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
                      "search": {"pp": [2, 4], "zero_stage": [1], "micro_batch_size": [1, 2]}})
    ctx = context(p)
    modes = search_modes(p, ctx)
    ctx = with_modes(ctx, modes)
    kinds = ctx.model.layer_kinds()
    calls = {"cut": 0, "whole": 0}
    original = B._rank_times

    def counted(ctx_, table_, modes_, count_max=None):
        out = original(ctx_, table_, modes_, count_max)
        if count_max is not None:
            calls["cut"] += 1
            whole = original(ctx_, table_, modes_)
            assert out.shape[2] == count_max + 1 and np.array_equal(out, whole[:, :, :count_max + 1])
        else:
            calls["whole"] += 1
        return out

    monkeypatch.setattr(B, "_rank_times", counted)
    finite = 0
    for cfg in candidates(p, ctx)[::2]:
        for pl_cfg in _placements(p, ctx, cfg)[:2]:
            table = layer_table(ctx, pl_cfg)
            t = original(ctx, table, modes)
            P, D, N = t.shape
            n1 = D - 1
            d_lo = [min(1, n1) if q == 0 else 0 for q in range(P)]
            d_hi = [min(n1, sum(n1 - c for c in range(q, min(n1, P * table.cfg.vpp), P))) for q in range(P)]
            want = next((float(T) for T in np.unique(t[np.isfinite(t)])
                         if reference_split_fits(t, T, table.cfg.vpp, d_lo, d_hi)), np.inf)
            assert B._memory_tmax(ctx, table, modes) == want
            finite += bool(np.isfinite(want))
    assert finite >= 10 and calls["cut"] >= 10 and calls["whole"] >= 1, (finite, calls, len(kinds))


def test_attention_block_shared_across_kinds_and_expert_layouts(monkeypatch):
    """The attention block's pricing shared by the dense and MoE kinds and every expert layout
    (`cost.layers._attention_of`): during a whole solve over tp, cp (ring and all-to-all), SP and
    micro-batch, every hit equals `_attention_cost` priced afresh and every layer-cost hit a fresh
    `layer_costs` (which prices its attention afresh); the answer is the one without the sharing."""
    problem = {"model": SMALL_MOE, "training": {"seq_len": 8192, "global_batch_size": 64},
               "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
               "search": {"micro_batch_size": [1, 2], "zero_stage": [1], "cp": [1, 2]}}
    calls = {"fresh": 0, "hit": 0}
    original = cost_layers._attention_of

    def counting(ctx, cfg, pl, sh, cache):
        key = (cost_layers.ATTENTION_TAG, cfg.tp, cfg.sp, cfg.tp_overlap, cfg.cp, cfg.cp_comm, cfg.mbs, pl.tp, pl.cp)
        if cache is not None:  # (not the check's own fresh pricings)
            calls["hit" if key in cache else "fresh"] += 1
        return original(ctx, cfg, pl, sh, cache)

    monkeypatch.setattr(cost_layers, "_attention_of", counting)
    monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", True)
    shared = solved_doc(problem)
    assert calls["hit"] > calls["fresh"] > 0, calls  # (hits exist: the MoE kind reuses the dense kind's attention)
    monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", False)
    monkeypatch.setattr(cost_layers, "_attention_of", lambda ctx, cfg, pl, sh, cache: cost_layers._attention_cost(ctx, cfg, pl, sh))
    assert solved_doc(problem) == shared


def test_embedding_and_head_shared_across_shapes_equal_a_fresh_pricing(monkeypatch):
    """The embedding and head pricings shared between configurations (`cost.layers._end_cost`):
    during whole solves with the knobs their keys name (multi-token prediction, deferred output-layer
    weight gradients with a deferral limit, ZeRO-3 and ZeRO-1, TP overlap, Megatron and torchtitan),
    every hit equals `_embedding_cost` / `_head_cost` priced afresh, hits happen, and the answer is
    the one without the sharing."""
    calls = {"fresh": 0, "hit": 0}
    original = cost_layers._end_cost

    def counting(ctx, cfg, pl, cache, end):
        if cache is not None:
            n = len(cache)
            got = original(ctx, cfg, pl, cache, end)
            calls["fresh" if len(cache) > n else "hit"] += 1
            return got
        return original(ctx, cfg, pl, cache, end)

    for framework, training in (
            ("megatron", {"defer_embedding_wgrad": True, "wgrad_deferral_limit": 2}),
            ("torchtitan", {})):
        problem = {"model": {**SMALL_MOE, "num_nextn_predict_layers": 1}, "framework": framework,
                   "training": {"seq_len": 4096, "global_batch_size": 64, **training},
                   "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
                   "search": {"micro_batch_size": [1, 2], "zero_stage": [1, 3], "cp": [1]}}
        calls.update(fresh=0, hit=0)
        monkeypatch.setattr(cost_layers, "_end_cost", counting)
        monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", True)
        shared = solved_doc(problem, top_k=2)
        assert calls["hit"] > calls["fresh"] > 0, calls
        monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", False)
        monkeypatch.setattr(cost_layers, "_end_cost", lambda ctx, cfg, pl, cache, end: original(ctx, cfg, pl, None, end))
        assert solved_doc(problem, top_k=2) == shared


def test_solve_holds_off_full_collections_and_restores_the_thresholds():
    """While a solve runs, Python's full (generation-2) collections are held off
    (`search._fewer_full_collections`); the caller's thresholds come back afterwards, also when the
    solve raises, and a process that disabled gc is left alone."""
    import gc

    import pytest

    from autoshard.errors import InfeasibleError

    doc = {"model": dict(SMALL_MOE, num_hidden_layers=4), "training": {"seq_len": 2048, "global_batch_size": 16},
           "cluster": {"gpu": "h100-sxm", "num_gpus": 8}}
    seen: list[tuple[int, int, int]] = []
    before = gc.get_threshold()
    try:
        gc.set_threshold(500, 7, 9)
        solve(load_problem(doc), top_k=1, progress=lambda _: seen.append(gc.get_threshold()))
        assert seen and all(t == (500, 7, 1_000_000) for t in seen)
        assert gc.get_threshold() == (500, 7, 9)
        tiny = dict(doc, model=dict(SMALL_MOE, num_hidden_layers=64, hidden_size=16384, num_experts=256),
                    cluster={"gpu": "rtx-4090", "num_gpus": 1})
        with pytest.raises(InfeasibleError):
            solve(load_problem(tiny), top_k=0)
        assert gc.get_threshold() == (500, 7, 9)
        gc.disable()
        seen.clear()
        solve(load_problem(doc), top_k=0, progress=lambda _: seen.append(gc.get_threshold()))
        assert seen and all(t == (500, 7, 9) for t in seen) and not gc.isenabled()
    finally:
        gc.enable()
        gc.set_threshold(*before)


def reference_distinct_rows(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The first form: np.unique per column, a mixed-radix code, np.unique of the codes."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        _, inv = np.unique(c, return_inverse=True)
        key = key * (int(inv.max()) + 1 if len(inv) else 1) + inv.reshape(-1)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return first, inv.reshape(-1)


def test_distinct_rows_equal_np_unique():
    """`candidates.distinct_rows` (a table of the values present where they are narrow integers)
    numbers the rows and finds each one's first occurrence as np.unique does: degrees as floats,
    booleans, negative codes (etp None is -1), wide integer ranges and fractions (np.unique's own),
    one row, one column and none."""
    from autoshard.solver.candidates import distinct_rows

    rng = np.random.default_rng(5)
    n = 5000
    degrees = rng.choice([1, 2, 4, 8, 16], n).astype(np.float64)
    cases = [
        [degrees, rng.integers(0, 2, n) == 1, rng.choice([-1, 1, 2], n).astype(np.float64)],
        [rng.integers(0, 1 << 40, n), degrees],  # a span past the table: np.unique's own
        [rng.choice([0.5, 1.0, 2.25], n), degrees],  # fractions: np.unique's own
        [rng.choice([3, 7], n)],
        [np.array([4.0]), np.array([True])],
        [np.zeros(0), np.zeros(0, dtype=bool)],  # (a space with no candidates: no rows)
    ]
    for cols in cases:
        got, want = distinct_rows(cols), reference_distinct_rows(cols)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    # Columns ranked once (`Ranked`, as the bounds pass their fields), whole or on a subset of the rows
    # (ranks of values the subset lacks go unused): the same numbering and first rows.
    from autoshard.solver.candidates import Ranked

    cols = cases[0]
    ranked = [Ranked.of(c) for c in cols]
    for sub in (np.arange(n), np.flatnonzero(degrees >= 4), np.flatnonzero(cols[2] < 0)[:7]):
        got = distinct_rows([Ranked(r.inv[sub], r.radix) for r in ranked[:2]] + [cols[2][sub]])
        want = reference_distinct_rows([c[sub] for c in cols])
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def reference_forced(mem, idx: np.ndarray, at_least: np.ndarray) -> np.ndarray:
    """`_MemoryBound.forced` as first written: group by group, each with its own in-flight row."""
    out = np.where(mem.ok[idx], at_least, np.inf)
    pos = np.empty(int(idx.max()) + 1, dtype=np.int64)
    pos[idx] = np.arange(len(idx))
    for g, sel in mem._by_group(idx[mem.ok[idx]]):
        P = mem.infl[g].shape[1]
        room = mem._room(g, sel)
        ext = np.zeros((len(sel), P))
        tab = mem.table[sel]
        ext[:, 0] += mem.end_s[tab, 0]
        ext[:, -1] += mem.end_s[tab, 1]
        t = out[pos[sel]]
        for i, k in enumerate(mem.ks):
            t = B._forced_tmax(room, np.broadcast_to(mem.infl[g], (len(sel), P)),
                               mem.static(sel, mem.kp[i, 0][sel], mem.kp[i, 1][sel]), mem.lines[tab, i],
                               mem.a_min[tab, i], mem.s_amin[tab, i], ext, mem.kinds.count(k), t)
        out[pos[sel]] = t
    return out


def reference_forced_tmax(room, infl, st, lines, a_min, s_min, ext, n_k, at_least):
    """`bounds._forced_tmax` as first written: arrays (candidates, ranks, lines), the least over the
    lines by `min(axis=2)`."""
    alpha, beta = lines[:, None, :, 0], lines[:, None, :, 1]
    inf_ = infl[:, :, None]
    coef = alpha - beta * st[:, None, None] / inf_
    off = ext[:, :, None] + beta * room[:, :, None] / inf_
    cap = np.minimum(np.floor(np.maximum(room, 0) / (st[:, None] + infl * a_min[:, None]) + 1e-9), n_k)
    feasible = cap.sum(axis=1) >= n_k

    def short(T, off_, coef_, cap_):
        n = np.floor(((T[:, None, None] - off_) / coef_).min(axis=2) + 1e-9)
        return np.clip(n, 0, cap_).sum(axis=1) < n_k

    out = np.where(feasible, at_least, np.inf)
    rows = np.flatnonzero(feasible)
    rows = rows[short(at_least[rows], off[rows], coef[rows], cap[rows])]
    if len(rows):
        lo = at_least[rows]
        hi = np.maximum(lo, ext[rows].max(axis=1) + n_k * s_min[rows])
        for _ in range(B.FORCED_BISECTIONS):
            mid = 0.5 * (lo + hi)
            below = short(mid, off[rows], coef[rows], cap[rows])
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        out[rows] = lo
    return out


def test_forced_tmax_lines_first_is_bit_identical():
    """`_forced_tmax` keeps its arrays lines first (the least over the lines an element-wise minimum
    of contiguous slices, 0.63x the CPU on the 345 calls of four 122-layer and 61-layer MoE solves):
    bit for bit the bounds of the first form, on random hulls of 1 to 5 lines, 1 to 16 ranks, rooms
    that fit nothing, some layers or all, and starting points at, below and above the forced time."""
    rng = np.random.default_rng(11)
    for n, P, J in [(40, 1, 1), (64, 4, 3), (50, 8, 5), (30, 16, 2), (1, 2, 4)]:
        beta = -np.sort(rng.uniform(1e-12, 1e-9, (n, J)), axis=1)  # seconds per byte saved, < 0
        alpha = rng.uniform(0.01, 0.05, (n, J))
        lines = np.stack([alpha, beta], axis=2)
        a_min = rng.uniform(1e8, 1e9, n)
        st = rng.uniform(1e8, 5e8, n)
        infl = rng.integers(1, 2 * P + 1, (n, P)).astype(float)
        room = rng.uniform(-1e9, 3e10, (n, P))
        ext = rng.uniform(0, 0.05, (n, P))
        s_min = rng.uniform(0.02, 0.08, n)
        for n_k in (1, 7, 61):
            for at_least in (np.zeros(n), rng.uniform(0, 2.0, n), np.full(n, 50.0)):
                args = (room, infl, st, lines, a_min, s_min, ext, n_k, at_least)
                got, want = B._forced_tmax(*args), reference_forced_tmax(*args)
                assert np.array_equal(got, want), (n, P, J, n_k)


def test_forced_by_pipeline_degree_equals_group_by_group():
    """`_MemoryBound.forced` bisects the candidates of one pipeline degree at once, each with its
    group's in-flight counts: each candidate's bound equals the one it gets refined alone with its
    group and the one the group-by-group form gives (every group of a small two-kind MoE problem's
    candidates, pipeline degrees 1 to 8, schedules and micro-batch counts mixed), and a batch limit
    of a few candidates changes nothing."""
    p = load_problem({"model": SMALL_MOE, "training": {"seq_len": 8192, "global_batch_size": 64},
                      "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 16}})
    ctx = context(p)
    ctx = with_modes(ctx, search_modes(p, ctx))
    cands = candidates(p, ctx)
    made: list = []
    init = B._MemoryBound.__init__

    def keep(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    B._MemoryBound.__init__ = keep
    try:
        t_lb, _, _, _ = B._lazy_bounds(ctx, cands, {})
    finally:
        B._MemoryBound.__init__ = init
    mem = made[0]
    idx = np.arange(len(cands))
    together = mem.forced(idx, t_lb)
    assert np.array_equal(together, reference_forced(mem, idx, t_lb))
    alone = np.empty(len(idx))
    degrees = set()
    for g, sel in mem._by_group(idx):
        alone[sel] = mem.forced(sel, t_lb[sel])
        degrees.add(mem.infl[g].shape[1])
    assert np.array_equal(together, alone)
    assert degrees >= {1, 2, 4, 8} and np.isfinite(together).sum() > 100
    assert (together > t_lb * (1 + 1e-6)).sum() > 10  # (HBM forces recompute somewhere: the bisection ran)
    limit = B.FORCED_BATCH_ROWS
    B.FORCED_BATCH_ROWS = 3
    try:
        assert np.array_equal(mem.forced(idx, t_lb), together)
    finally:
        B.FORCED_BATCH_ROWS = limit


def test_mlp_block_shared_across_attention_layouts(monkeypatch):
    """The MLP block's pricing shared by configurations with the same tokens per GPU and expert
    layout (`cost.layers._mlp_of`: micro-batch 2 with cp 2 prices the MLP of micro-batch 1 with cp 1):
    during a whole solve every hit equals `_mlp_cost` priced afresh and every layer-cost hit a fresh
    `layer_costs`; the answer is the one without the sharing."""
    problem = {"model": SMALL_MOE, "training": {"seq_len": 8192, "global_batch_size": 64},
               "cluster": {"gpu": "h100-sxm", "num_gpus": 16},
               "search": {"micro_batch_size": [1, 2, 4], "zero_stage": [1], "cp": [1, 2, 4]}}
    calls = {"fresh": 0, "hit": 0, "traded": 0}
    original = cost_layers._mlp_of
    seen: dict = {}

    def counting(ctx, cfg, pl, sh, kind, cache):
        key = (cost_layers.MLP_TAG, kind, sh.tokens, cfg.tp, cfg.sp, cfg.tp_overlap, pl.tp)
        if kind != "dense":
            key += (cfg.ep, pl.ep, cfg.expert_tp, pl.etp, cfg.dispatcher)
        if cache is not None:  # (not the check's own fresh pricings)
            hit = key in cache
            calls["hit" if hit else "fresh"] += 1
            calls["traded"] += hit and seen.get(key, (cfg.mbs, cfg.cp)) != (cfg.mbs, cfg.cp)
            seen.setdefault(key, (cfg.mbs, cfg.cp))
        return original(ctx, cfg, pl, sh, kind, cache)

    monkeypatch.setattr(cost_layers, "_mlp_of", counting)
    monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", True)
    shared = solved_doc(problem)
    # (hits exist, some from another micro-batch and cp with the same tokens per GPU)
    assert calls["hit"] > calls["fresh"] > 0 and calls["traded"] > 0, calls
    monkeypatch.setattr(cost_layers, "CHECK_KIND_CACHE", False)
    monkeypatch.setattr(cost_layers, "_mlp_of",
                        lambda ctx, cfg, pl, sh, kind, cache: cost_layers._mlp_cost(ctx, cfg, pl, sh, kind))
    assert solved_doc(problem) == shared


def test_rows_written_into_the_proto_equal_the_cp_model_calls():
    """`stage_model._add_at_most` (the interleaved memory windows) and `StageModel._hint` write the
    proto that `md.add(LinearExpr.weighted_sum(...) <= rhs)` and `md.add_hint` write: terms in
    variable order whatever the given order, zero coefficients dropped, the constant in the domain."""
    from ortools.sat.python import cp_model

    SM = importlib.import_module("autoshard.solver.stage_model")
    rng = np.random.default_rng(3)
    a, b = cp_model.CpModel(), cp_model.CpModel()
    xa = [a.new_int_var(0, 9, f"x{i}") for i in range(12)]
    xb = [b.new_int_var(0, 9, f"x{i}") for i in range(12)]
    pick = rng.permutation(12)[:8]  # (a shuffled subset: out of variable order)
    coefs = rng.integers(0, 4, size=(5, 8)) * rng.integers(1, 10**6, size=(5, 8))  # (zeros among them)
    rhs = [int(x) for x in rng.integers(-10**6, 10**9, size=5)]
    for row, hi in zip(coefs.tolist(), rhs):
        a.add(cp_model.LinearExpr.weighted_sum([xa[j] for j in pick], row) + 7 <= hi + 7)
    SM._add_at_most(b, np.array([xb[j].index for j in pick]), coefs, rhs)
    assert (coefs == 0).any() and str(a.proto) == str(b.proto)
    # the stage model's hints, on a real model
    p = load_problem({"model": SMALL_MOE, "training": {"seq_len": 2048, "global_batch_size": 64},
                      "cluster": {"gpu": "h100-sxm", "num_gpus": 16}})
    ctx = context(p)
    cfg = next(c for c in candidates(p, ctx) if c.pp == 2)
    table = layer_table(ctx, cfg)
    sm = SM.StageModel(ctx, table, ["none", "full"], False, None)
    values = list(range(len(sm._all_vars())))
    sm.model.clear_hints()
    sm._hint(values)
    ref = SM.StageModel(ctx, table, ["none", "full"], False, None)
    ref.model.clear_hints()
    for var, v in zip(ref._all_vars(), values):
        ref.model.add_hint(var, v)
    assert len(sm.model.proto.solution_hint.vars) == len(values)
    assert str(sm.model.proto) == str(ref.model.proto)


def test_stage_model_structure_copied_is_the_built_one():
    """`StageModel._structure`: a stage model whose variables, layer constraints and recompute pattern
    are copied from an earlier model of the same shape (`_STRUCTURES`) has the same proto, the same
    variables and picks as one built from nothing, under every recompute layout the frameworks plan
    (Megatron's block with activation offload, torchtitan's every-Nth, DeepSpeed's one mode, per layer),
    one and two layer kinds, 1F1B and interleaved, near-even and uniform stages; and the structure is
    shared across tables of other costs (other tensor-parallel degrees and micro-batches)."""
    SM = importlib.import_module("autoshard.solver.stage_model")
    seen = 0
    dense = {"preset": "llama3-8b", "num_hidden_layers": 12}
    for framework, model, search, seq in [("megatron", SMALL_MOE, {}, 4096), ("torchtitan", SMALL_MOE, {}, 4096),
                                          ("deepspeed", dense, {}, 4096), ("megatron", dense, {}, 4096),
                                          ("megatron", SMALL_MOE, {"recompute_layout": "per_layer"}, 4096),
                                          # (long sequences: offloading is among the useful modes)
                                          ("megatron", SMALL_MOE, {"recompute": ["none", "full", "offload"]}, 16384)]:
        p = load_problem({"model": model, "framework": framework, "search": search,
                          "training": {"seq_len": seq, "global_batch_size": 64},
                          "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 16}})
        ctx = context(p)
        ctx = with_modes(ctx, search_modes(p, ctx))
        modes = search_modes(p, ctx)
        picked = {}
        for c in candidates(p, ctx):  # one configuration per (pp, vpp, schedule, tp, mbs)
            picked.setdefault((c.pp, c.vpp, c.schedule, c.tp, c.mbs), c)
        for cfg in list(picked.values())[:12]:
            table = layer_table(ctx, cfg)
            for uniform in (False, True):
                SM._STRUCTURES.clear()
                built = SM.StageModel(ctx, table, modes, uniform, 10**9)
                copied = SM.StageModel(ctx, table, modes, uniform, 10**9)
                assert str(copied.model.proto) == str(built.model.proto), (framework, cfg)
                assert [v.index for v in copied._all_vars()] == [v.index for v in built._all_vars()]
                assert {r: b.index for r, b in copied.pick.items()} == {r: b.index for r, b in built.pick.items()}
                assert getattr(copied, "nth", None) is None or copied.nth.index == built.nth.index
                seen += bool(built.pick) + (getattr(built, "nth", None) is not None) + ("offload" in built.modes)
        SM._STRUCTURES.clear()
        first = [SM.StageModel(ctx, layer_table(ctx, c), modes, False, None) for c in list(picked.values())[:12]]
        SM._STRUCTURES.clear()
        fresh = []
        for c in list(picked.values())[:12]:  # each from nothing
            fresh.append(SM.StageModel(ctx, layer_table(ctx, c), modes, False, None))
            SM._STRUCTURES.clear()
        assert [str(a.model.proto) for a in first] == [str(b.model.proto) for b in fresh]
    assert seen > 0  # (some models had recompute picks, every-Nth counts or offloaded layers to copy)

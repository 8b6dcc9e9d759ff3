"""The global configurations of the declared space (degrees, schedule, ZeRO, micro-batch) and
the distinct placements of their mesh axes."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any, NamedTuple

import numpy as np

from ..cost import (
    Config,
    Context,
    config_reasons,
    ep_overlap_allowed,
    ep_overlap_blocked,
    launch_reasons,
    pipeline_zero_refused,
)
from ..errors import InputError
from ..spec import MESH_AXES, RECOMPUTES, UNPLANNABLE_SCHEDULES, Plan, Problem, divisors
from ..topology import place_axes
from ..layouts import search_modes
from itertools import permutations

DEFAULT_MBS = (1, 2, 4, 8, 16)
# one configuration's fields in `Candidates.ROW` order (etp None = tp; ep_overlap None = where it pays)
CandidateRow = tuple[int, int, int, int, int, int, bool, int, int, str, str, int | None, bool | None]
DEFAULT_MAX_VPP = 8


def _space(problem: Problem, ctx: Context) -> dict[str, list[Any]]:
    m, t, s = problem.model, problem.training, problem.search
    n = problem.cluster.num_gpus
    node = ctx.levels[0].size
    tp_default = [d for d in divisors(n) if d <= node and m.num_attention_heads % d == 0]
    cp_default = [c for c in (1, 2, 4, 8, 16, 32) if c <= n and t.seq_len % (2 * c) == 0 or c == 1]
    ep_default = [e for e in divisors(m.num_experts) if e <= n] if m.is_moe else [1]
    pp_default = [p for p in divisors(n) if p <= m.num_hidden_layers]
    fw = ctx.framework
    return {
        "tp": s.allowed("tp", tp_default), "cp": s.allowed("cp", cp_default),
        "ep": s.allowed("ep", ep_default), "pp": s.allowed("pp", pp_default),
        "dp": s.allowed("dp", divisors(n)),
        "micro_batch_size": s.allowed("micro_batch_size", DEFAULT_MBS),
        "vpp": s.allowed("vpp", list(range(1, DEFAULT_MAX_VPP + 1))),
        # (a schedule the launcher lacks is priced when named, not planned by default)
        "schedule": [x for x in s.allowed("schedule", [x for x in ("1f1b", "interleaved", "zero_bubble", "gpipe")
                                                       if x in fw.schedules and x not in fw.unplanned_schedules])
                     if x not in UNPLANNABLE_SCHEDULES],
        # (restricted: the stages the framework runs among them; `candidates` probes the launch rules
        # with the first, so one it refuses would refuse every degree set)
        "zero_stage": _runs(problem, "zero_stage", s.allowed("zero_stage", list(fw.zero_stages)), fw.zero_stages,
                            "ZeRO stages"),
        # MoE parallel folding: experts tensor-parallel like attention (etp = tp) or not at all.
        "etp": s.allowed("etp", [None, 1] if m.is_moe and fw.moe_folding else [None]),
        "sequence_parallel": s.allowed("sequence_parallel", [True, False]),
        "recompute": s.allowed("recompute", list(RECOMPUTES)),
        "placement": s.allowed("placement", []),
        "moe_dispatcher": s.allowed("moe_dispatcher", list(fw.moe_dispatchers)),
    }


def _runs(problem: Problem, knob: str, allowed: list[Any], runs: Sequence[Any], what: str) -> list[Any]:
    """The values of a restricted `search.<knob>` the framework runs, in the order given; an
    `InputError` naming the field where it runs none of them."""
    got = [x for x in allowed if x in runs]
    if allowed and not got:
        raise InputError(f"{problem.framework} runs {what} {', '.join(map(str, runs))}, not "
                         f"{', '.join(map(str, allowed))}", field=f"search.{knob}")
    return got


def planned_dispatcher(problem: Problem, ctx: Context, allowed: list[str]) -> str | None:
    """The expert dispatcher plans use: a hierarchical one (it sends a token once per peer GPU hosting
    any of its experts inside one NVLink domain and once per remote node beyond, so it never moves
    more bytes than the flat all-to-all) where the framework runs it and the search
    allows it; HybridEP on multi-node NVLink domains (DeepEP's kernels cover one node's NVLink),
    DeepEP otherwise. None (the framework's default) for dense models."""
    if not problem.model.is_moe:
        return None
    runs = [d for d in allowed if d in ctx.framework.moe_dispatchers]
    if not runs:
        raise InputError(f"{problem.framework} runs the {', '.join(ctx.framework.moe_dispatchers)} expert "
                         f"dispatcher, not {', '.join(allowed)}", field="search.moe_dispatcher")
    first = "hybridep" if ctx.levels[0].size > 8 else "deepep"
    order: tuple[str, ...] = (first, "deepep", "hybridep")
    if problem.training.moe_capacity_factor is not None:  # DeepEP cannot pad to a capacity
        order = ("hybridep",)
    choice = next((d for d in order if d in runs), "alltoall" if "alltoall" in runs else runs[0])
    return None if choice == "alltoall" == ctx.framework.moe_dispatchers[0] else choice


def planned_cp_comm(problem: Problem, ctx: Context) -> str:
    """The context-parallel exchange the solver plans with: Megatron's ring ("p2p"), unless the
    framework has no ring (DeepSpeed-Ulysses: all-to-all; `FrameworkProfile.cp_comm_types`) or the model
    has sliding-window attention and the framework runs that only otherwise (Transformer Engine:
    all-to-all; `FrameworkProfile.window_cp_comm_types`)."""
    fw = ctx.framework
    if fw.cp_comm_types and "p2p" not in fw.cp_comm_types:
        return fw.cp_comm_types[0]
    allowed = fw.window_cp_comm_types
    if problem.model.sliding_window and allowed and "p2p" not in allowed:
        return allowed[0]
    return "p2p"


class Candidates(Sequence[Config]):
    """The configurations `candidates` enumerates, held as numpy columns of their fields (`ROW`) and
    built as `Config` when read: a large cluster's space holds hundreds of thousands, and building as
    many Python objects took seconds where the numpy bounds read the columns and the search reads a
    few thousand.

    `cols`: one array per `ROW` field but ep_overlap (int64; sp bool; schedule and placement codes into
    `schedules` and `placements`; etp -1 where None, i.e. = tp); `overlap_off`: whether each is planned
    with the EP overlap off (`ep_overlap` False; None, where it pays, otherwise)."""

    ROW = ("tp", "cp", "ep", "pp", "dp", "vpp", "sp", "zero", "mbs", "schedule", "placement", "etp", "ep_overlap")

    def __init__(self, cols: dict[str, np.ndarray] | None, schedules: list[str], placements: list[str],
                 overlap_off: np.ndarray | None, dispatcher: str | None, cp_comm: str = "p2p",
                 opt_offload: bool = False, reshard: str | int | None = None, dp_replicate: int = 1):
        if cols is None:  # (none)
            cols = {f: np.zeros(0, dtype=bool if f == "sp" else np.int64) for f in self.ROW[:12]}
            overlap_off = np.zeros(0, dtype=bool)
        assert overlap_off is not None
        self.cols, self.schedules, self.placements, self.overlap_off = cols, schedules, placements, overlap_off
        self.dispatcher, self.cp_comm = dispatcher, cp_comm
        self.opt_offload = opt_offload  # every configuration with the optimizer in host memory, or none
        # the data-parallel knobs every configuration plans with (`planned_dp_knobs`); reshard at ZeRO-3 only
        self.reshard, self.dp_replicate = reshard, dp_replicate
        self._n = len(overlap_off)
        self._built: dict[int, Config] = {}
        # every Config field with the knobs all configurations share (the rest set per row, `__getitem__`)
        self._shared = dict(Config(1, 1, 1, 1, 1, 1, False, 0, 1, "1f1b", "tp-cp-ep-dp-pp", dispatcher=dispatcher,
                                   opt_offload=opt_offload, dp_replicate=dp_replicate).__dict__)
        self._rows: list[CandidateRow] | None = None
        # figures derived from the columns alone, kept by their readers (`bounds._arrays`): they do not change
        self.derived: dict[str, Any] = {}

    @property
    def rows(self) -> list[CandidateRow]:
        """The configurations as tuples of their fields in `ROW` order (Python ints, bools, str, None),
        built on first read."""
        if self._rows is None:
            c = self.cols
            sched = np.array(self.schedules + [""], dtype=object)[c["schedule"]]
            place = np.array(self.placements + [""], dtype=object)[c["placement"]]
            etp = [None if e < 0 else e for e in c["etp"].tolist()]
            ovl = [False if o else None for o in self.overlap_off.tolist()]
            cols = [c[f].tolist() for f in self.ROW[:9]] + [sched.tolist(), place.tolist(), etp, ovl]
            self._rows = list(zip(*cols)) if self._n else []
        return self._rows

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        k: int = range(self._n)[i]  # (negative indices; IndexError past the end)
        cfg = self._built.get(k)
        if cfg is None:
            c = self.cols
            cp, zero, etp = int(c["cp"][k]), int(c["zero"][k]), int(c["etp"][k])
            # (built as `_with_fields` builds: every field from `_shared`, then this row's; the same
            # Config as its __init__ gives, equal and equally hashed, at a fraction of the cost)
            cfg = self._built[k] = object.__new__(Config)
            d = cfg.__dict__
            d.update(self._shared)
            d.update(tp=int(c["tp"][k]), cp=cp, ep=int(c["ep"][k]), pp=int(c["pp"][k]), dp=int(c["dp"][k]),
                     vpp=int(c["vpp"][k]), sp=bool(c["sp"][k]), zero=zero, mbs=int(c["mbs"][k]),
                     schedule=self.schedules[c["schedule"][k]], placement=self.placements[c["placement"][k]],
                     etp=None if etp < 0 else etp, ep_overlap=False if self.overlap_off[k] else None,
                     cp_comm=self.cp_comm if cp > 1 else "p2p", reshard=self.reshard if zero == 3 else None)
        return cfg


def planned_dp_knobs(problem: Problem, ctx: Context) -> tuple[str | int | None, int]:
    """(reshard_after_forward, dp_replicate) every planned configuration takes: `search.reshard_after_forward`
    (default None: the framework's policy, `cost.reshard_policy`, which for torchtitan already differs
    with and without pipeline parallelism) and `search.dp_replicate` (default 1). A form the framework
    does not run is bad input; configurations the value does not fit are left out (`dp_knob_fits`)."""
    s, fw = problem.search, ctx.framework
    ra = s.reshard_after_forward
    if ra is not None and ("group" if isinstance(ra, int) else ra) not in fw.reshard_after_forward:
        runs = ", ".join("N" if f == "group" else f for f in fw.reshard_after_forward)
        raise InputError(f"{problem.framework} runs reshard_after_forward {runs}, not {ra}",
                         field="search.reshard_after_forward")
    r = s.dp_replicate or 1
    if r > 1 and not fw.replicate_zero_stages:
        raise InputError(f"{problem.framework} has no hierarchical sharding", field="search.dp_replicate")
    return ra, r


def dp_knob_fits(ctx: Context, zero: int, dp: int, cp: int, expert_dp: int, reshard: str | int | None,
                 replicate: int) -> bool:
    """Whether a configuration can take the planned data-parallel knobs (the rules of `dp_knob_reasons`)."""
    if replicate > 1 and (zero not in ctx.framework.replicate_zero_stages or dp % replicate or expert_dp % replicate
                          or dp * cp == replicate):
        return False
    if zero == 3 and isinstance(reshard, int):
        shard = dp * cp // replicate
        return shard % reshard == 0 and reshard < shard
    return True


def offload_passes(problem: Problem, ctx: Context) -> tuple[list[bool], bool]:
    """(the optimizer-offload settings to search, whether offload is the fallback when none fits):
    `search.optimizer_offload` false -> ([False], False); true -> ([True], False); a list -> that list;
    None (default) -> ([False], True) where the framework offloads (frameworks.yaml
    optimizer_offload_zero_stages), else ([False], False)."""
    v = problem.search.optimizer_offload
    runs = bool(ctx.framework.optimizer_offload_zero_stages)
    if v is None:
        return [False], runs
    choice = list(dict.fromkeys(v if isinstance(v, list) else [v]))
    if not choice:
        raise InputError("an empty list allows nothing", field="search.optimizer_offload")
    if True in choice and not runs:
        raise InputError(f"{problem.framework} has no CPU optimizer offload", field="search.optimizer_offload")
    return choice, False


def _grid(**lists: list[Any]) -> dict[str, np.ndarray]:
    """The product of the value lists, in `itertools.product` order, as int64 columns."""
    shape = tuple(len(v) for v in lists.values())
    idx = np.indices(shape).reshape(len(shape), -1)
    return {k: np.array(v, dtype=np.int64).reshape(-1)[i] for (k, v), i in zip(lists.items(), idx)}


def _cross(outer: dict[str, np.ndarray], inner: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The columns of `for a in outer: for b in inner`: every row of `outer` with every row of `inner`."""
    n, m = len(next(iter(outer.values()))), len(next(iter(inner.values())))
    return {**{k: np.repeat(v, m) for k, v in outer.items()}, **{k: np.tile(v, n) for k, v in inner.items()}}


def _keep(cols: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in cols.items()}


_DENSE_SPAN = 1 << 22  # the widest value range `_dense_ranks` counts in a table (4 Mi flags)


def _dense_ranks(v: np.ndarray) -> tuple[np.ndarray, int]:
    """(each value's rank among the distinct values of v, how many there are): np.unique's inverse,
    by a table of the values present where they are integers in a narrow range (degrees, counts,
    codes: linear, not a sort), else np.unique's own."""
    v = np.asarray(v)
    if v.dtype == bool:
        v = v.astype(np.int64)
    if len(v):
        lo, hi = v.min(), v.max()
        if hi - lo < _DENSE_SPAN:
            off = v - lo
            iv = off.astype(np.int64)
            if np.array_equal(iv, off):  # (integers only)
                present = np.zeros(int(hi - lo) + 1, dtype=bool)
                present[iv] = True
                rank = np.cumsum(present) - 1
                return rank[iv], int(rank[-1]) + 1
    _, inv = np.unique(v, return_inverse=True)
    return inv.reshape(-1), int(inv.max()) + 1 if len(inv) else 0  # (no values: no rows)


class Ranked(NamedTuple):
    """A column given by its values' ranks (`_dense_ranks`: each value's rank among the column's distinct
    values, and how many there are), for `distinct_rows`: ranked once, grouped on many times. Its rows
    may be a subset of the rows ranked (some ranks then unused: the numbering of tuples is the same)."""

    inv: np.ndarray
    radix: int

    @staticmethod
    def of(column: np.ndarray) -> "Ranked":
        return Ranked(*_dense_ranks(column))


def distinct_rows(cols: Sequence[np.ndarray | Ranked]) -> tuple[np.ndarray, np.ndarray]:
    """(the row where each distinct tuple of the columns' values first occurs, per row the number of
    its tuple, tuples numbered in the order of their values as np.unique numbers them): a rule that
    depends on these fields only is asked once per tuple. A column is its values or a `Ranked`."""
    n = len(cols[0].inv if isinstance(cols[0], Ranked) else cols[0])
    code = np.zeros(n, dtype=np.int64)
    for c in cols:  # (mixed radix over each column's distinct values: at most a few dozen each)
        inv, radix = c if isinstance(c, Ranked) else _dense_ranks(c)
        code = code * radix + inv
    inv, rows = _dense_ranks(code)
    first = np.full(rows, n, dtype=np.int64)
    np.minimum.at(first, inv, np.arange(n))
    return first, inv


def _per_distinct(rule: Any, cols: dict[str, np.ndarray], names: tuple[str, ...], dtype: Any = bool) -> np.ndarray:
    """rule(*fields) per row, asked once per distinct tuple of the named fields (as Python ints)."""
    first, inv = distinct_rows([cols[f] for f in names])
    got = np.array([rule(*(int(cols[f][j]) for f in names)) for j in first], dtype=dtype).reshape(-1)
    return got[inv]


def _blocks(problem: Problem, sp_: dict[str, list[Any]], scheds: list[tuple[str, int]], names: list[str],
            cp_comm: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """The sets of degrees, micro-batch and schedule (`_grid` columns, schedule as a code into `names`)
    the divisibility rules and `config_reasons` allow, in the order of the nested loops over tp, cp, pp,
    then ep, micro-batch, etp, then (schedule, vpp); with the placement (codes into the list returned)."""
    n, gbs = problem.cluster.num_gpus, problem.training.global_batch_size
    c = _grid(tp=sp_["tp"], cp=sp_["cp"], pp=sp_["pp"])
    c = _keep(c, n % (c["tp"] * c["cp"] * c["pp"]) == 0)
    c["dp"] = n // (c["tp"] * c["cp"] * c["pp"])
    c = _keep(c, np.isin(c["dp"], np.array(sp_["dp"], dtype=np.int64)))
    c = _cross(c, _grid(ep=sp_["ep"], mbs=sp_["micro_batch_size"], etp=[-1 if e is None else e for e in sp_["etp"]]))
    c = _keep(c, gbs % (c["dp"] * c["mbs"]) == 0)
    if None in sp_["etp"]:  # etp = tp named beside None (= tp): one plan, kept once
        c = _keep(c, c["etp"] != c["tp"])
    c["etp"] = np.where(c["etp"] == c["tp"], -1, c["etp"])  # (-1: etp None, = tp)
    c = _keep(c, (c["etp"] < 0) | (c["tp"] != 1))  # etp = 1 = tp: the same plan as etp None
    c["mb"] = gbs // (c["dp"] * c["mbs"])
    c["edp"] = c["tp"] * c["cp"] * c["dp"] // (np.where(c["etp"] < 0, c["tp"], c["etp"]) * c["ep"])
    c = _cross(c, {"schedule": np.array([names.index(s) for s, _ in scheds], dtype=np.int64),
                   "vpp": np.array([v for _, v in scheds], dtype=np.int64)})
    code = {s: names.index(s) if s in names else -1 for s in ("1f1b", "interleaved")}
    keep = c["pp"] * c["vpp"] <= problem.model.num_hidden_layers  # (embedding / loss pipeline slots: evaluated)
    keep &= (c["pp"] > 1) | (c["schedule"] == code["1f1b"])
    keep &= (c["schedule"] != code["interleaved"]) | (c["mb"] % c["pp"] == 0)
    c = _keep(c, keep)
    placements: dict[str, int] = {}
    zero = sp_["zero_stage"][0] if sp_["zero_stage"] else 0
    # (each probe's plan is this validated one with the probed fields set, `model_copy`: the same plan as
    # validating them, its field set included, at a third of the cost; tests/test_candidates.py checks it)
    template = Plan(tp=1, cp=1, ep=1, pp=1, dp=1, vpp=1, micro_batch_size=1, schedule="1f1b", etp=None,
                    zero_stage=zero, cp_comm_type="p2p", sequence_parallel=False)

    def probe(tp: int, cp: int, pp: int, ep: int, etp: int, sched: int, vpp: int, dp: int, mbs: int) -> int:
        """The placement code of the set of degrees (-1: `config_reasons` refuses it), probed with the
        first micro-batch it has: the rules do not depend on it (but for the batch divisibility above),
        nor on the ZeRO stage, nor on SP but below."""
        plan = template.model_copy(update=dict(
            tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, vpp=vpp, micro_batch_size=mbs, schedule=names[sched],
            etp=None if etp < 0 else etp, zero_stage=zero, cp_comm_type=cp_comm if cp > 1 else "p2p",
            sequence_parallel=False))
        if config_reasons(problem, plan)[1]:
            return -1
        return placements.setdefault(plan.placement, len(placements))

    first, inv = distinct_rows([c[f] for f in ("tp", "cp", "pp", "ep", "etp", "schedule", "vpp")])
    got = np.full(len(first), -1, dtype=np.int64)
    # (in the loops' order: placement codes as first met; no ZeRO stage, nothing to probe)
    for g in np.argsort(first, kind="stable") if sp_["zero_stage"] else ():
        j = first[g]
        got[g] = probe(*(int(c[f][j]) for f in ("tp", "cp", "pp", "ep", "etp", "schedule", "vpp", "dp", "mbs")))
    c["placement"] = got[inv]
    return _keep(c, c["placement"] >= 0), list(placements)


def candidates(problem: Problem, ctx: Context, opt_offload: bool = False) -> Candidates:
    """Every global configuration allowed by `search:` and the divisibility rules, in a
    fixed order (placement left as the canonical order; placements are expanded later): the order of
    the nested loops over tp, cp, pp, then ep, micro-batch, etp, then (schedule, vpp), then (ZeRO stage,
    SP), each one followed by its twin with the EP overlap off where it has one; enumerated as numpy
    columns over the grids of degrees (no Python object per configuration).
    `opt_offload`: every one with the optimizer in host memory, at the ZeRO stages the framework
    offloads with."""
    sp_ = _space(problem, ctx)
    if opt_offload:
        sp_["zero_stage"] = [z for z in sp_["zero_stage"] if z in ctx.framework.optimizer_offload_zero_stages]
        if not sp_["zero_stage"]:
            return Candidates(None, [], [], None, None, "p2p", True)
    dispatcher = planned_dispatcher(problem, ctx, sp_["moe_dispatcher"])
    cp_comm = planned_cp_comm(problem, ctx)
    reshard, replicate = planned_dp_knobs(problem, ctx)
    fw = ctx.framework
    scheds = [(sched, vpp) for sched, vpp in product(sp_["schedule"], sp_["vpp"])
              if sched != "dualpipev" and (vpp > 1) == (sched == "interleaved")]
    names = list(dict.fromkeys(s for s, _ in scheds))
    b, placements = _blocks(problem, sp_, scheds, names, cp_comm)
    # Per (block, (ZeRO stage, SP)) in the loops' order: (m, k) masks, raveled row-major.
    zero = np.array([z for z, _ in product(sp_["zero_stage"], sp_["sequence_parallel"])], dtype=np.int64)
    spv = np.array([bool(s) for _, s in product(sp_["zero_stage"], sp_["sequence_parallel"])], dtype=bool)
    col = {f: v[:, None] for f, v in b.items()}
    # ZeRO stages the launcher refuses beside a pipeline (`cost.launch_reasons`'s rule)
    refused = np.array([pipeline_zero_refused(fw, 2, int(z)) for z in zero], dtype=bool)
    keep = ~((col["pp"] > 1) & refused[None, :])
    if True in sp_["sequence_parallel"]:
        keep &= (col["tp"] != 1) | spv[None, :]  # sp is meaningless at tp=1: keep one of the two
    # ZeRO stages are all the same plan where there is nothing to shard.
    single = (col["dp"] * col["cp"] == 1) & (col["edp"] == 1) & (0 in sp_["zero_stage"])
    keep &= ~(single & (zero[None, :] > 0))
    if fw.cp_excludes_sp:  # (DeepSpeed-Ulysses beside Megatron's SP: config_reasons)
        keep &= ~(spv[None, :] & (col["tp"] > 1) & (col["cp"] > 1))
    for k, z in enumerate(zero.tolist()):  # (the data-parallel knobs: once per distinct (dp, cp, expert dp))
        keep[:, k] &= _per_distinct(lambda dp, cp, edp, z=z: dp_knob_fits(ctx, z, dp, cp, max(1, edp), reshard,
                                                                           replicate), b, ("dp", "cp", "edp"))
    at = np.flatnonzero(keep.reshape(-1))
    blk, zs = (at // len(zero), at % len(zero)) if len(zero) else (at, at)
    # Where the framework refuses the EP overlap beside a recompute mode the search plans (Megatron:
    # full, the moe module), a configuration that could run it is also planned with it off
    # (`ep_overlap` False), right after its twin (None: where it pays; the numpy bound groups read the first).
    twin = np.zeros(len(at), dtype=bool)
    if problem.model.is_moe and fw.ep_overlap and ep_overlap_blocked(ctx, search_modes(problem, ctx)):
        twin = _per_distinct(ep_overlap_allowed, b, ("ep", "pp", "vpp", "mb"))[blk]
    count = 1 + twin.astype(np.int64)
    rows = np.repeat(np.arange(len(at)), count)
    off = np.zeros(len(rows), dtype=bool)
    off[(np.cumsum(count) - 1)[twin]] = True
    blk, zs = blk[rows], zs[rows]
    cols = {f: b[f][blk] for f in ("tp", "cp", "ep", "pp", "dp", "vpp")}
    cols.update(sp=spv[zs] & (cols["tp"] > 1), zero=zero[zs], mbs=b["mbs"][blk], schedule=b["schedule"][blk],
                placement=b["placement"][blk], etp=b["etp"][blk])
    return Candidates(cols, names, placements, off, dispatcher, cp_comm, opt_offload, reshard, replicate)


def _with_placement(cfg: Config, placement: str) -> Config:
    """cfg with another placement: `dataclasses.replace` without its __init__ (the solver's hot
    path; Config is a plain frozen dataclass: the same fields, so an equal, equally hashed copy)."""
    c = object.__new__(Config)
    d = c.__dict__
    d.update(cfg.__dict__)
    d["placement"] = placement
    return c


def _with_fields(cfg: Config, **changes: Any) -> Config:
    """`dataclasses.replace(cfg, **changes)` without its __init__ (as `_with_placement`)."""
    c = object.__new__(Config)
    d = c.__dict__
    d.update(cfg.__dict__)
    d.update(changes)
    return c


def _placements(problem: Problem, ctx: Context, cfg: Config, cache: dict | None = None) -> list[Config]:
    """Placements of cfg's mesh axes, one per distinct set of group profiles, in a fixed
    order that starts from the canonical tp-cp-ep-dp-pp. `cache` (one per solve) keeps the
    orders per set of degrees, which is all they depend on."""
    degrees = (cfg.tp, cfg.cp, cfg.ep, cfg.dp, cfg.pp, cfg.etp)  # (all the orders depend on)
    if cache is not None and degrees in cache:
        return [_with_placement(cfg, order) for order in cache[degrees]]

    allowed = problem.search.allowed("placement", [])
    if not allowed and problem.search.placement_layout != "any":
        allowed = list(ctx.framework.rank_orders(cfg))  # what its launcher can set
    if allowed:
        orders = ["-".join(Plan(placement=p).axes) for p in allowed]
        if problem.search.placement_layout != "any":  # (orders its launcher refuses: `launch_reasons`)
            orders = [o for o in orders if not any(r.field == "placement" for r in launch_reasons(
                problem, _with_placement(cfg, o).plan()))] or orders[:0]
    else:
        sizes = {"tp": cfg.tp, "cp": cfg.cp, "ep": cfg.ep, "dp": max(1, cfg.dp // cfg.ep), "pp": cfg.pp}
        if cfg.folded:  # the expert mesh follows the attention ranks: no ep axis of its own
            sizes.update(ep=1, dp=cfg.dp)
        live = [a for a in MESH_AXES if sizes[a] > 1]
        slots = [i for i, a in enumerate(MESH_AXES) if a in live]
        orders = []
        for perm in permutations(live):  # size-1 axes stay where the canonical order has them
            axes = list(MESH_AXES)
            for i, a in zip(slots, perm):
                axes[i] = a
            orders.append("-".join(axes))
    seen: dict[Any, Config] = {}
    for order in orders:
        c = _with_placement(cfg, order)
        placed = place_axes(ctx.graph, order, c.tp, c.cp, c.ep, c.dp, c.pp, c.etp)
        key = (placed.tp, placed.cp, placed.ep, placed.dp, placed.dp_cp, placed.edp, placed.pp_level, placed.etp)
        seen.setdefault(key, c)
    if cache is not None:
        cache[degrees] = [c.placement for c in seen.values()]
    return list(seen.values())


def _config_key(p: Plan) -> tuple:
    return (p.tp, p.cp, p.ep, p.pp, p.dp, p.vpp, p.sp, p.zero_stage, p.micro_batch_size, p.schedule, p.placement,
            p.expert_tp)

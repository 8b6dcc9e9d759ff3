"""The global configurations of the declared space (degrees, schedule, ZeRO, micro-batch) and
the distinct placements of their mesh axes."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product
from typing import Any

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
        "zero_stage": s.allowed("zero_stage", list(fw.zero_stages)),
        # MoE parallel folding: experts tensor-parallel like attention (etp = tp) or not at all.
        "etp": s.allowed("etp", [None, 1] if m.is_moe and fw.moe_folding else [None]),
        "sequence_parallel": s.allowed("sequence_parallel", [True, False]),
        "recompute": s.allowed("recompute", list(RECOMPUTES)),
        "placement": s.allowed("placement", []),
        "moe_dispatcher": s.allowed("moe_dispatcher", list(fw.moe_dispatchers)),
    }


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
    """The configurations `candidates` enumerates, held as rows of their fields (`ROW`) and built
    as `Config` when read: a large cluster's space holds hundreds of thousands, and building as
    many frozen dataclasses took seconds where the numpy bounds read the rows and the search
    reads a few thousand."""

    ROW = ("tp", "cp", "ep", "pp", "dp", "vpp", "sp", "zero", "mbs", "schedule", "placement", "etp", "ep_overlap")

    def __init__(self, rows: list[CandidateRow], dispatcher: str | None, cp_comm: str = "p2p", opt_offload: bool = False,
                 reshard: str | int | None = None, dp_replicate: int = 1):
        self.rows, self.dispatcher, self.cp_comm = rows, dispatcher, cp_comm
        self.opt_offload = opt_offload  # every configuration with the optimizer in host memory, or none
        # the data-parallel knobs every configuration plans with (`planned_dp_knobs`); reshard at ZeRO-3 only
        self.reshard, self.dp_replicate = reshard, dp_replicate
        self._built: dict[int, Config] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self.rows)))]
        k: int = range(len(self.rows))[i]  # (negative indices; IndexError past the end)
        cfg = self._built.get(k)
        if cfg is None:
            row = self.rows[k]
            cfg = self._built[k] = Config(*row[:12], ep_overlap=row[12], dispatcher=self.dispatcher,
                                          cp_comm=self.cp_comm if row[1] > 1 else "p2p", opt_offload=self.opt_offload,
                                          reshard=self.reshard if row[7] == 3 else None,
                                          dp_replicate=self.dp_replicate)
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


def candidates(problem: Problem, ctx: Context, opt_offload: bool = False) -> Candidates:
    """Every global configuration allowed by `search:` and the divisibility rules, in a
    fixed order (placement left as the canonical order; placements are expanded later).
    `opt_offload`: every one with the optimizer in host memory, at the ZeRO stages the framework
    offloads with."""
    sp_ = _space(problem, ctx)
    if opt_offload:
        sp_["zero_stage"] = [z for z in sp_["zero_stage"] if z in ctx.framework.optimizer_offload_zero_stages]
        if not sp_["zero_stage"]:
            return Candidates([], None, "p2p", True)
    n = problem.cluster.num_gpus
    gbs = problem.training.global_batch_size
    rows: list[CandidateRow] = []
    dispatcher = planned_dispatcher(problem, ctx, sp_["moe_dispatcher"])
    cp_comm = planned_cp_comm(problem, ctx)
    reshard, replicate = planned_dp_knobs(problem, ctx)
    # The validity rules depend on the micro-batch only through the batch divisibility checked
    # here (dp x mbs divides the batch; interleaving: pp divides the micro-batches): checked once
    # per set of the other degrees and schedule.
    probed: dict[tuple, str | None] = {}
    # ZeRO stages the launcher refuses beside a pipeline (`cost.launch_reasons`'s rule)
    refused_zero = {z for z in sp_["zero_stage"] if pipeline_zero_refused(ctx.framework, 2, z)}

    def probe_of(key: tuple, zero: int, dp_: int | None = None, mbs_: int = 1) -> Plan:
        tp_, cp_, pp_, ep_, etp_, sched_, vpp_ = key
        return Plan(tp=tp_, cp=cp_, ep=ep_, pp=pp_, dp=dp_ if dp_ is not None else n // (tp_ * cp_ * pp_), vpp=vpp_,
                    micro_batch_size=mbs_, schedule=sched_, etp=etp_, zero_stage=zero,
                    cp_comm_type=cp_comm if cp_ > 1 else "p2p", sequence_parallel=False)
    L = problem.model.num_hidden_layers
    zero_sp = [(zero, sp) for zero, sp in product(sp_["zero_stage"], sp_["sequence_parallel"])]
    # Where the framework refuses the EP overlap beside a recompute mode the search plans (Megatron:
    # full, the moe module), a configuration that could run it is also planned with it off
    # (`ep_overlap` False): with it (None, where it pays) its layers may not use those modes.
    fw = ctx.framework
    overlap_twin = problem.model.is_moe and fw.ep_overlap and ep_overlap_blocked(ctx, search_modes(problem, ctx))
    sp_choice = True in sp_["sequence_parallel"]
    scheds = [(sched, vpp) for sched, vpp in product(sp_["schedule"], sp_["vpp"])
              if sched != "dualpipev" and (vpp > 1) == (sched == "interleaved")]
    for tp, cp, pp in product(sp_["tp"], sp_["cp"], sp_["pp"]):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        if dp not in sp_["dp"]:
            continue
        for ep, mbs, etp in product(sp_["ep"], sp_["micro_batch_size"], sp_["etp"]):
            if gbs % (dp * mbs):
                continue
            etp = None if etp == tp else etp
            if etp is not None and tp == 1:
                continue  # etp = 1 = tp: the same plan as etp None
            mb = gbs // (dp * mbs)
            # ZeRO stages are all the same plan where there is nothing to shard.
            single = dp * cp == 1 and 0 in sp_["zero_stage"] and tp * cp * dp // ((etp or tp) * ep) == 1
            for sched, vpp in scheds:
                if pp * vpp > L:
                    continue  # embedding / loss pipeline slots and DualPipeV: evaluated, not searched
                if pp == 1 and sched != "1f1b" or sched == "interleaved" and mb % pp:
                    continue
                key = (tp, cp, pp, ep, etp, sched, vpp)
                if key not in probed:  # (the rules do not depend on the ZeRO stage, nor on SP but below)
                    probe = probe_of(key, sp_["zero_stage"][0], dp, mbs)
                    probed[key] = None if config_reasons(problem, probe)[1] else probe.placement
                placement = probed[key]
                if placement is None:
                    continue
                for zero, sp in zero_sp:
                    if pp > 1 and zero in refused_zero:  # (its launcher refuses it beside a pipeline)
                        continue
                    if tp == 1 and not sp and sp_choice:
                        continue  # sp is meaningless at tp=1: keep one of the two
                    if single and zero > 0:
                        continue
                    if sp and tp > 1 and cp > 1 and ctx.framework.cp_excludes_sp:
                        continue  # (DeepSpeed-Ulysses beside Megatron's SP: config_reasons)
                    if not dp_knob_fits(ctx, zero, dp, cp, max(1, tp * cp * dp // ((etp or tp) * ep)), reshard,
                                        replicate):
                        continue
                    row = (tp, cp, ep, pp, dp, vpp, sp and tp > 1, zero, mbs, sched, placement, etp)
                    rows.append((*row, None))
                    if overlap_twin and ep_overlap_allowed(ep, pp, vpp, mb):
                        rows.append((*row, False))  # right after its twin: the numpy bound groups read the first
    return Candidates(rows, dispatcher, cp_comm, opt_offload, reshard, replicate)


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

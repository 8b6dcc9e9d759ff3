"""The cluster as a networkx graph, the placement of mesh axes on it, and collective costs.

The graph is a tree: the fabric root, one node per domain of every level (spine
domain, leaf / scalable unit, NVSwitch domain) and one node per GPU; every edge
carries the level's per-GPU bandwidth. From the tree we read, for every GPU and
level, which domain holds it; a process group (the GPUs along one mesh axis)
then has a *profile*: how many of its members share a domain at each level.
Collective costs follow REFERENCE §4, level by level, with the slowest level
dominating (levels run concurrently in hierarchical algorithms):

- AllGather / ReduceScatter of B bytes (the full, gathered size) over G GPUs:
  level i moves B (1 - m_{i-1}/G) through the aggregate bandwidth m_{i-1} W_i of
  the m_{i-1} members inside one level-(i-1) domain (m_{-1} = 1); at the
  innermost level this is the ring formula B (G-1) / (G W).
- AllReduce = ReduceScatter + AllGather, or, on a level with in-network reduction
  (NVLS / SHARP), one send and one receive of the whole buffer: B / (m_{i-1} W_i).
- AllToAll of B bytes sent per GPU: the share of B addressed outside the inner
  domain crosses the level on the GPU's own link.
- Point-to-point: B / W of the lowest level that joins the two GPUs.

Each level adds a latency per algorithm step: AllGather / ReduceScatter are rings (G - 1
steps, each paying the latency of the level it crosses), AllReduce and AllToAll trees or
direct exchanges (2 log2 of the fan-out per level).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
import numpy as np

from .catalog import GPU, get_gpu, get_topology
from .errors import InputError
from .spec import MESH_AXES, ClusterSpec, Plan, Problem, TopologyLevel, parse_placement
import itertools
from .catalog import check_precision


@dataclass(frozen=True)
class Level:
    """A resolved network level: sizes in GPUs, effective bandwidth in bytes/s."""

    name: str
    size: int
    bytes_per_s: float  # per-GPU egress after efficiency and oversubscription
    link_bytes_per_s: float  # per-GPU egress as specified
    latency_s: float
    sharp: bool
    # All-reduce on an NVLS level priced from nccl-tests bus bandwidths (NVLS_ALLREDUCE_GAIN x the
    # ring all-gather's) where the catalog's efficiencies apply; 0 = the seeds' in-network B / W
    # (a level given an explicit `efficiency` is priced as the seeds price it, for every op).
    nvls_ar_gain: float = 0.0


@dataclass(frozen=True)
class Profile:
    """How a process group of `size` GPUs sits on the levels: `members[i]` GPUs of the
    group share one level-i domain (innermost first; the top level holds all)."""

    size: int
    members: tuple[int, ...]
    straddles: tuple[str, ...] = ()  # levels the group crosses although it would fit inside one domain

    def crossed(self, levels: tuple[Level, ...]) -> list[str]:
        inner = [1, *self.members[:-1]]
        return [lv.name for lv, m, m0 in zip(levels, self.members, inner) if m > m0]


def resolve_levels(cluster: ClusterSpec, gpu: GPU) -> tuple[Level, ...]:
    """The levels of a cluster: its preset or explicit list (default: the GPU's standard
    system), efficiencies from the GPU catalog, the top level widened to hold every GPU."""
    topo = cluster.topology if cluster.topology is not None else gpu.default_topology
    specs: list[TopologyLevel] = get_topology(topo).levels if isinstance(topo, str) else list(topo)
    sizes = segmented_sizes([lv.size for lv in specs], [lv.segment_unit_gpus for lv in specs], cluster.num_gpus)
    specs = [lv.model_copy(update={"size": n}) if n != lv.size else lv for lv, n in zip(specs, sizes)]
    out: list[Level] = []
    for i, lv in enumerate(specs):
        eff = lv.efficiency if lv.efficiency is not None else (
            gpu.efficiency.scaleup if i == 0 else gpu.efficiency.scaleout)
        link = lv.bandwidth_gb_per_s * 1e9
        gain = NVLS_ALLREDUCE_GAIN if (i == 0 and lv.sharp and lv.efficiency is None) else 0.0
        out.append(Level(lv.name, lv.size, link * eff / lv.oversubscription, link, lv.latency_us * 1e-6, lv.sharp,
                         gain))
    if out[-1].size < cluster.num_gpus:
        top = out[-1]
        out[-1] = Level(top.name, cluster.num_gpus, top.bytes_per_s, top.link_bytes_per_s, top.latency_s, top.sharp,
                        top.nvls_ar_gain)
    # Levels above the cluster are never crossed: drop them (keep the first that holds all).
    keep = next(i for i, lv in enumerate(out) if lv.size >= cluster.num_gpus)
    return tuple(out[: keep + 1])


def segmented_sizes(sizes: list[int], units: list[int | None], num_gpus: int) -> list[int]:
    """Level sizes as a job of `num_gpus` GPUs occupies them. A level with a `segment_unit_gpus` u (a
    4-GPU GB200 / GB300 compute tray in a 72-GPU NVL72 rack) whose domain the job outgrows is used in
    equal segments, Slurm's topology/block `--segment`: each domain holds the largest multiple of u that
    divides the job and fits in the domain, and every level below the top holds as many of those
    segments as it holds domains. Megatron-Bridge's launcher asks for it on 4-GPU nodes
    (scripts/performance/utils/executors.py, 25.09 47ff48829 to v0.6.0: `segment` = the largest node
    count <= 18 dividing the job's nodes), so 256 GB200 run as 4 racks x 64 GPUs, 2,496 as 39 x 64: a
    group of 32 or 64 consecutive ranks stays inside one NVLink domain instead of straddling two.
    Sizes of levels without a unit, of jobs that fit in one domain or that are no multiple of u are
    kept."""
    out = list(sizes)
    for i, u in enumerate(units):
        size = out[i]
        if not u or num_gpus <= size or num_gpus % u or i == len(out) - 1:
            continue
        per = max(d for d in range(1, size // u + 1) if (num_gpus // u) % d == 0) * u
        if per == size:
            continue
        out[i] = per
        for j in range(i + 1, len(out) - 1):  # the levels above hold the same count of (now smaller) domains
            if out[j] % size == 0:
                out[j] = out[j] // size * per
    return out


def level_size_error(sizes: list[int]) -> tuple[int, str] | None:
    """The rule for level sizes, presets and user topologies alike: sizes grow, and every level below
    the top divides the next (a domain sits inside one domain of the level above). The top level is
    the whole fabric, one domain holding the cluster, so it need only be larger (GB200: 576-GPU
    leaves under a 16,384-GPU spine). Returns (index of the offending level, reason) or None."""
    for i in range(1, len(sizes)):
        if sizes[i] <= sizes[i - 1]:
            return i, f"level sizes must grow ({sizes[i - 1]} -> {sizes[i]})"
        if i < len(sizes) - 1 and sizes[i] % sizes[i - 1]:
            return i, (f"a level below the top must divide the next ({sizes[i - 1]} -> {sizes[i]}); "
                       "only the top level may be any larger size")
    return None


def check_cluster(problem: Problem) -> None:
    """Resolve the GPU and topology names now, so that a bad name is an input error; reject a
    precision the GPU cannot run (fp8 on A100, bf16 on V100)."""
    gpu = get_gpu(problem.cluster.gpu, problem.cluster.catalog)
    topo = problem.cluster.topology
    if isinstance(topo, list):
        if not topo:
            raise InputError("an explicit topology needs at least one level", field="cluster.topology")
        bad = level_size_error([lv.size for lv in topo])
        if bad:
            raise InputError(bad[1], field=f"cluster.topology.{bad[0]}.size")
    check_precision(gpu, problem.training.precision)
    resolve_levels(problem.cluster, gpu)


class ClusterGraph:
    """The cluster tree on networkx, with the domain of every GPU at every level."""

    def __init__(self, levels: tuple[Level, ...], num_gpus: int):
        self.levels = levels
        self.num_gpus = num_gpus
        g: nx.DiGraph[tuple[str, int]] = nx.DiGraph()
        root = ("fabric", 0)
        g.add_node(root, level=len(levels))
        # Build top-down: level i domain j holds GPUs [j*size_i, (j+1)*size_i).
        parents = {0: root}
        for li in range(len(levels) - 1, -1, -1):
            lv = levels[li]
            ndom = math.ceil(num_gpus / lv.size)
            nxt = {}
            for d in range(ndom):
                node = (lv.name, d)
                up_size = levels[li + 1].size if li + 1 < len(levels) else num_gpus
                parent = parents[(d * lv.size) // up_size] if li + 1 < len(levels) else root
                g.add_node(node, level=li, size=lv.size)
                g.add_edge(parent, node, level=li)
                nxt[d] = node
            parents = nxt
        inner = levels[0]
        for r in range(num_gpus):
            g.add_node(("gpu", r), level=-1)
            g.add_edge(parents[r // inner.size], ("gpu", r), level=0,
                       bandwidth_bytes_per_s=inner.bytes_per_s)
        self.graph = g
        # domain[i][r]: index of the level-i domain that holds GPU r, read off the tree.
        self.domain = np.zeros((len(levels), num_gpus), dtype=np.int64)
        for r in range(num_gpus):
            node = ("gpu", r)
            for li in range(len(levels)):
                (node,) = g.predecessors(node)
                self.domain[li, r] = node[1]

    def common_level(self, a: int, b: int) -> int:
        """Index of the lowest level whose domain holds both GPUs (-1: the same GPU)."""
        if a == b:
            return -1
        # The lowest common ancestor in the tree, read from the per-level domains taken off the
        # graph at construction (networkx's LCA re-checks acyclicity on every call).
        same = np.flatnonzero(self.domain[:, a] == self.domain[:, b])
        return int(same[0]) if len(same) else len(self.levels)

    def group_profile(self, ranks: np.ndarray) -> Profile:
        """Profile of process groups given as rows of GPU ranks (all rows alike in shape).

        The worst row (fewest members sharing a domain) is taken for every level.
        """
        ranks = np.atleast_2d(ranks)
        size = ranks.shape[1]
        members: list[int] = []
        straddles: list[str] = []
        for li, lv in enumerate(self.levels):
            dom = np.sort(self.domain[li][ranks], axis=1)
            distinct = 1 + (np.diff(dom, axis=1) != 0).sum(axis=1)
            worst = int(distinct.max())
            members.append(max(1, size // worst))
            if worst > 1 and size <= lv.size and (li == 0 or members[li - 1] < size):
                if worst > math.ceil(size / lv.size):
                    straddles.append(lv.name)
        members[-1] = size
        return Profile(size, tuple(members), tuple(straddles))


@functools.lru_cache(maxsize=64)
def cluster_graph(levels: tuple[Level, ...], num_gpus: int) -> ClusterGraph:
    return ClusterGraph(levels, num_gpus)


# ---- mesh placement ----------------------------------------------------------------


def mesh_sizes(plan: Plan, dp: int) -> dict[str, int]:
    """Sizes of the five mesh axes; the `dp` axis is what is left of DP after EP."""
    return {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "dp": max(1, dp // plan.ep), "pp": plan.pp}


def axis_ranks(order: tuple[str, ...], sizes: dict[str, int], axes: tuple[str, ...]) -> np.ndarray:
    """Rows of GPU ranks of the process groups spanning `axes` jointly (innermost first order)."""
    shape = [sizes[a] for a in order]
    world = int(np.prod(shape))
    grid = np.arange(world).reshape(shape[::-1])  # C order: last index = innermost axis
    rev = list(order[::-1])
    pos = [rev.index(a) for a in axes]
    rest = [i for i in range(len(rev)) if i not in pos]
    moved = np.transpose(grid, rest + sorted(pos, reverse=False))
    group = int(np.prod([sizes[a] for a in axes])) if axes else 1
    return moved.reshape(-1, group)


@dataclass(frozen=True)
class Placement:
    """Profiles of every process group a plan needs."""

    tp: Profile
    cp: Profile
    ep: Profile
    dp: Profile  # dense data parallel: ep x dp axes
    dp_cp: Profile  # gradient reduction of dense weights: dp x ep x cp
    edp: Profile  # expert data parallel: the dp axis (x cp)
    pp: Profile
    pp_level: int  # level crossed by pipeline neighbours (-1 if pp == 1)
    etp: Profile | None = None  # expert tensor parallel group (None: the tp group)


def place(graph: ClusterGraph, plan: Plan, dp: int) -> Placement:
    etp = plan.expert_tp
    return _place(graph, plan.axes, plan.tp, plan.cp, plan.ep, dp, plan.pp,
                  etp if _is_folded(plan.tp, plan.ep, dp, etp) else None)


def place_axes(graph: ClusterGraph, placement: str, tp: int, cp: int, ep: int, dp: int, pp: int,
               etp: int | None = None) -> Placement:
    """`place` from the degrees and the placement text (no Plan: the solver's hot path)."""
    etp = tp if etp is None else etp
    return _place(graph, parse_placement(placement), tp, cp, ep, dp, pp,
                  etp if _is_folded(tp, ep, dp, etp) else None)


def _is_folded(tp: int, ep: int, dp: int, etp: int) -> bool:
    return etp != tp or (ep > 1 and dp % ep != 0)


@functools.lru_cache(maxsize=4096)
def _place(graph: ClusterGraph, order: tuple[str, ...], tp: int, cp: int, ep: int, dp: int, pp: int,
           etp: int | None = None) -> Placement:
    """Profiles of every group. Without folding (`etp` None) expert parallelism is carved out of
    data parallelism: the placement's `ep` axis, dp / ep left on its `dp` axis. With MoE parallel
    folding (Megatron-Core: `etp` given), the attention mesh is tp x cp x dp and the experts are
    laid out over the same ranks of each pipeline stage as etp (innermost) x ep x edp, in the order
    of the attention ranks (Megatron's expert RankGenerator, order tp-ep-dp)."""
    folded = etp is not None
    sizes = {"tp": tp, "cp": cp, "ep": 1 if folded else ep, "dp": dp if folded else max(1, dp // ep), "pp": pp}

    def prof(*axes: str) -> Profile:
        return _runs_profile(graph, group_runs(order, sizes, axes))

    stride = int(np.prod([sizes[a] for a in order[:order.index("pp")]]))  # pipeline neighbours: 0 and stride
    pp_level = graph.common_level(0, stride) if pp > 1 else -1
    if not folded:
        return Placement(tp=prof("tp"), cp=prof("cp"), ep=prof("ep"), dp=prof("ep", "dp"),
                         dp_cp=prof("ep", "dp", "cp"), edp=prof("dp", "cp"), pp=prof("pp"), pp_level=pp_level)
    etp_p, ep_p, edp_p = _expert_profiles(graph, pp, stride, etp, ep)
    return Placement(tp=prof("tp"), cp=prof("cp"), ep=ep_p, dp=prof("dp"), dp_cp=prof("dp", "cp"), edp=edp_p,
                     pp=prof("pp"), pp_level=pp_level, etp=etp_p)


@functools.lru_cache(maxsize=4096)
def _expert_profiles(graph: ClusterGraph, pp: int, stride: int, etp: int, ep: int) -> tuple[Profile, Profile, Profile]:
    """Profiles of the (etp, ep, edp) groups under MoE parallel folding. They depend on the placement
    only through the pipeline axis (degree and stride): a rank's index inside its stage is its rank
    with the pipeline coordinate taken out, whatever the order of tp, cp and dp (`_expert_groups`
    numbers the stage's ranks in that order, which is the same index). Cached on exactly that, so
    the placements of one configuration share the work."""
    world = graph.num_gpus  # a plan's mesh covers every GPU
    ranks = np.arange(world)
    pp_c = (ranks // stride) % pp
    lin = ranks % stride + (ranks // (stride * pp)) * stride
    stage_size = world // pp
    edp = max(1, stage_size // (etp * ep))
    e_tp, e_ep, e_dp = lin % etp, (lin // etp) % ep, lin // (etp * ep)

    def rows(key_a: np.ndarray, key_b: np.ndarray, within: np.ndarray, size: int) -> np.ndarray:
        return ranks[np.lexsort((within, key_b, key_a, pp_c))].reshape(-1, size)

    return (graph.group_profile(rows(e_ep, e_dp, e_tp, etp)), graph.group_profile(rows(e_tp, e_dp, e_ep, ep)),
            graph.group_profile(rows(e_tp, e_ep, e_dp, edp)))


def _expert_groups(order: tuple[str, ...], sizes: dict[str, int], etp: int, ep: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank rows of the (etp, ep, edp) groups under MoE parallel folding: inside every pipeline
    stage, the attention ranks in placement order (innermost axis fastest) numbered 0..S-1, then
    split as etp x ep x edp with etp innermost. The reference the tests hold against Megatron's
    expert RankGenerator and against `_expert_profiles`, which prices them from the pipeline axis."""
    shape = [sizes[a] for a in order]
    world = int(np.prod(shape))
    ranks = np.arange(world)
    coord, rest = {}, ranks.copy()
    for a in order:  # innermost first: rank = sum coord[a] * stride[a]
        coord[a] = rest % sizes[a]
        rest //= sizes[a]
    lin, radix = np.zeros(world, dtype=np.int64), 1
    for a in order:
        if a != "pp":
            lin += coord[a] * radix
            radix *= sizes[a]
    stage_size = radix
    edp = max(1, stage_size // (etp * ep))
    e_tp, e_ep, e_dp = lin % etp, (lin // etp) % ep, lin // (etp * ep)
    pp_c = coord["pp"]

    def rows(key_a: np.ndarray, key_b: np.ndarray, within: np.ndarray, size: int) -> np.ndarray:
        order_ = np.lexsort((within, key_b, key_a, pp_c))
        return ranks[order_].reshape(-1, size)

    return (rows(e_ep, e_dp, e_tp, etp), rows(e_tp, e_dp, e_ep, ep), rows(e_tp, e_ep, e_dp, edp))


def group_runs(order: tuple[str, ...], sizes: dict[str, int], axes: tuple[str, ...]) -> tuple[tuple[int, bool], ...]:
    """The rank layout of the groups spanning `axes`, innermost first, as runs of (size, in the
    group): size-1 axes dropped, neighbouring axes on the same side merged. Placements that give
    the same runs give the same groups, so their profiles are computed once (`_runs_profile`)."""
    runs: list[tuple[int, bool]] = []
    for a in order:
        if sizes[a] == 1:
            continue
        member = a in axes
        if runs and runs[-1][1] == member:
            runs[-1] = (runs[-1][0] * sizes[a], member)
        else:
            runs.append((sizes[a], member))
    return tuple(runs)


@functools.lru_cache(maxsize=16384)
def _runs_profile(graph: ClusterGraph, runs: tuple[tuple[int, bool], ...]) -> Profile:
    if not any(member for _, member in runs):
        return graph.group_profile(np.zeros((1, 1), dtype=int))
    names = tuple(f"r{i}" for i in range(len(runs)))
    sizes = {n: s for n, (s, _) in zip(names, runs)}
    return graph.group_profile(axis_ranks(names, sizes, tuple(n for n, (_, m) in zip(names, runs) if m)))


def placements(plan_axes_sizes: dict[str, int]) -> list[str]:
    """Distinct placements for the given axis sizes: orders of the axes larger than 1
    (size-1 axes do not change any group), in a deterministic order."""
    live = [a for a in MESH_AXES if plan_axes_sizes.get(a, 1) > 1]
    out = []
    for perm in itertools.permutations(live):
        out.append("-".join([*perm, *[a for a in MESH_AXES if a not in perm]]))
    return out or ["-".join(MESH_AXES)]


# ---- collective costs ----------------------------------------------------------------


def _latency(levels: tuple[Level, ...], prof: Profile, passes: int) -> float:
    """Tree latency (AllReduce: NCCL uses trees / NVLS / SHARP at scale): 2 log2 of the
    fan-out at every level crossed, per pass."""
    t = 0.0
    inner = 1
    for lv, m in zip(levels, prof.members):
        if m > inner:
            t += lv.latency_s * 2 * math.ceil(math.log2(m / inner)) * passes
        inner = m
    return t


def _ring_latency(levels: tuple[Level, ...], prof: Profile) -> float:
    """Ring latency (AllGather / ReduceScatter run as rings in NCCL): G - 1 steps, of which
    G/m_{i-1} - G/m_i cross level i and pay its latency."""
    g, t, inner = prof.size, 0.0, 1
    for lv, m in zip(levels, prof.members):
        t += lv.latency_s * (g / inner - g / m)
        inner = m
    return t


# NVLS all-reduce vs ring all-gather / reduce-scatter bus bandwidth inside one NVSwitch domain:
# nccl-tests on DGX H100 (NCCL >= 2.17 with NVLS) reach about 480 GB/s all-reduce bus bandwidth
# against about 360 GB/s for all-gather and reduce-scatter (NVIDIA NCCL 2.17 release blog, "NVLink
# SHARP"), so SP's reduce-scatter + all-gather costs about 1.3x the all-reduce it replaces (the
# seeds' "half of ring" B / W would make it 1.75x). Documented fitted factor.
NVLS_ALLREDUCE_GAIN = 4.0 / 3.0


def all_gather_s(levels: tuple[Level, ...], prof: Profile, total_bytes: float) -> float:
    """AllGather (or ReduceScatter) of `total_bytes` (the full gathered size) over the group."""
    g = prof.size
    if g <= 1 or total_bytes <= 0:
        return 0.0
    t, inner = 0.0, 1
    for lv, m in zip(levels, prof.members):
        if m > inner:
            t = max(t, total_bytes * (1 - inner / g) / (inner * lv.bytes_per_s))
        inner = m
    return t + _ring_latency(levels, prof)


reduce_scatter_s = all_gather_s


def all_reduce_s(levels: tuple[Level, ...], prof: Profile, total_bytes: float) -> float:
    """AllReduce: two passes per level, one on a level with in-network reduction."""
    g = prof.size
    if g <= 1 or total_bytes <= 0:
        return 0.0
    t, inner = 0.0, 1
    for lv, m in zip(levels, prof.members):
        if m > inner:
            # Ring: reduce-scatter + all-gather, 2 B (1 - m/G) per domain. In-network reduction on
            # the scale-out fabric (SHARP): each domain sends its data up once and gets the result
            # back: B. NVLink SHARP (NVLS) inside the NVSwitch domain runs at the bus bandwidth
            # nccl-tests measure, NVLS_ALLREDUCE_GAIN x the ring all-gather / reduce-scatter's.
            share = 2 * (1 - inner / g)
            if lv.sharp:
                share = share / lv.nvls_ar_gain if lv.nvls_ar_gain else 1.0
            t = max(t, share * total_bytes / (inner * lv.bytes_per_s))
        inner = m
    return t + _latency(levels, prof, 2)


def all_to_all_s(levels: tuple[Level, ...], prof: Profile, bytes_per_gpu: float, dedup_copies: int = 0,
                 max_domains: int | None = None, shares: tuple[float, ...] | None = None) -> float:
    """AllToAll where every GPU sends `bytes_per_gpu` spread evenly over the group.

    `dedup_copies` = k: the bytes are k copies of each token bound for k uniformly spread
    destinations, and a hierarchical dispatcher (DeepEP, HybridEP) sends a token once to each
    remote domain beyond the first level that hosts any of its destinations, fanning it out over the
    first level (NVLink) there: of a domain's n peers at that level, a token reaches
    (n - 1)(1 - (1 - 1/n)^k) on average instead of k (n - 1)/n copies. A group inside one first-level
    domain (g GPUs) gets the same count over its GPUs: the dispatch sends a token once to each peer
    holding any of its experts, (g - 1)(1 - (1 - 1/g)^k) peers, and the combine returns one reduced
    copy from each (DeepEP tests/legacy/test_intranode.py: rank_idx = topk_idx // experts per rank,
    unique per token; HybridEP's receive buffer holds tokens per rank x ranks,
    docs/Hybrid-EP_Implementation.md). Megatron's alltoall dispatcher sends every copy. Across
    several domains the first level keeps the flat share (its forwarding is not modelled apart).

    `max_domains` = M (node-limited routing, DeepSeek-V3 report sec. 2.1.2): a token's k destinations
    lie in at most M of the n domains, M of them picked at random, so it reaches M (1 - (1 - 1/M)^k)
    distinct domains, of which a share (n - 1)/n are remote: (n - 1)/n M (1 - (1 - 1/M)^k) copies
    (the line above when M >= n). DeepSeek-V3 on EP64 over 8 nodes, k = 8, M = 4: 3.15 remote nodes
    per token instead of 4.59.

    `shares`: where the destinations follow a known pattern instead (a fixed routing:
    `cost.moe.contiguous_shares`), the share of `bytes_per_gpu` each level carries, one per level
    (innermost first); it replaces the shares above."""
    g = prof.size
    if g <= 1 or bytes_per_gpu <= 0:
        return 0.0
    t, inner = 0.0, 1
    for i, (lv, m) in enumerate(zip(levels, prof.members)):
        if m > inner:
            if shares is not None:
                share = shares[i]
            elif i == 0 and dedup_copies > 1 and m == g:
                # the group inside one domain: a hierarchical dispatcher sends a token once to each
                # peer hosting any of its k destinations, (g - 1)(1 - (1 - 1/g)^k) peers on average
                share = (g - 1) * (1 - (1 - 1 / g) ** dedup_copies) / dedup_copies
            elif i == 0:
                share = (m - 1) / g
            elif dedup_copies > 1:
                n = g / inner
                if max_domains and max_domains < n:
                    reach = (n - 1) / n * max_domains * (1 - (1 - 1 / max_domains) ** dedup_copies)
                else:
                    reach = (n - 1) * (1 - (1 - 1 / n) ** dedup_copies)
                share = reach / dedup_copies
            else:
                share = 1 - inner / g
            t = max(t, bytes_per_gpu * share / lv.bytes_per_s)
        inner = m
    return t + _latency(levels, prof, 1)


def p2p_s(levels: tuple[Level, ...], level: int, nbytes: float) -> float:
    if level < 0 or nbytes <= 0:
        return 0.0
    lv = levels[level]
    return nbytes / lv.bytes_per_s + lv.latency_s


def collective_s(op: str, levels: tuple[Level, ...], prof: Profile, nbytes: float) -> float:
    ops: dict[str, Callable[[tuple[Level, ...], Profile, float], float]] = {
        "all_gather": all_gather_s, "reduce_scatter": reduce_scatter_s, "all_reduce": all_reduce_s,
        "all_to_all": all_to_all_s}
    return ops[op](levels, prof, nbytes)


@functools.lru_cache(maxsize=4096)
def split_profile(prof: Profile, inner: int) -> tuple[Profile, Profile]:
    """(inner, outer) groups of a group split into runs of `inner` consecutive members (hierarchical
    sharding: the shard group of `inner` ranks, and the replica group of one rank per shard group).
    The inner group has min(m_i, inner) members in a level-i domain where the whole group has m_i;
    the outer group one per inner group: max(1, m_i // inner). Exact where each level's m_i is a
    multiple or a divisor of `inner` (the nested layouts a mesh gives)."""
    inner = max(1, min(inner, prof.size))
    inn = Profile(inner, tuple(min(m, inner) for m in prof.members))
    out = Profile(max(1, prof.size // inner), tuple(max(1, m // inner) for m in prof.members))
    return inn, out


def shard_profiles(prof: Profile, shard: int, replicas: int) -> tuple[Profile, Profile | None]:
    """(shard group, replica group or None) of a data-parallel group whose states shard over `shard`
    consecutive members and replicate `replicas` times (hierarchical sharding)."""
    if replicas <= 1 or prof.size <= shard:
        return prof, None
    return split_profile(prof, shard)


@functools.lru_cache(maxsize=1024)
def contiguous_profile(graph: ClusterGraph, size: int) -> Profile:
    """Profile of groups of `size` consecutive GPUs (what `autoshard collective` prices)."""
    ranks = np.arange((graph.num_gpus // size) * size).reshape(-1, size)
    return graph.group_profile(ranks)

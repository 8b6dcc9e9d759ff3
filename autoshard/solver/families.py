"""Plan families (what makes two plans structurally different) and the named alternatives a
user can ask for (`--alternatives no-cp,tp-in-node,1f1b,even-stages`).

A family is the parallelism degrees that shape the step (tp, cp, ep, expert tp, pp), the
schedule kind and, without a pipeline, full sharding (ZeRO-3 / FSDP) or not; the other ZeRO stages, micro-batch, sequence parallelism, vpp, placement, stage split
and recompute mix are refinements inside a family. `--top K` reports the best plan of the K
best families other than the chosen plan's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ..cost import Config, Context
from ..errors import InputError
from ..spec import MESH_AXES
from ..topology import place_axes

Family = tuple


def family_key(x: Any) -> Family:
    """(tp, cp, ep, etp, pp, schedule, sharding) of a Config or a Plan (etp None: experts follow tp).
    Without a pipeline, fully sharded weights (ZeRO-3 / FSDP: a gather per layer) and replicated ones
    (ZeRO 0-2) are families of their own ("fsdp" / None): the choice a team argues about when
    there is no pipeline to shard the model by layers."""
    etp = getattr(x, "etp", None)
    tp = x.tp
    zero = x.zero if hasattr(x, "zero") else x.zero_stage
    shard = "fsdp" if x.pp == 1 and zero >= 3 else None
    return (tp, x.cp, x.ep, None if etp in (None, tp) else etp, x.pp, x.schedule, shard)


def family_name(key: Family) -> str:
    """`tp2 cp4 ep8 pp8 interleaved`, `tp1 cp2 pp1 fsdp`: the degrees above 1, the schedule kind, and
    full sharding without a pipeline."""
    tp, cp, ep, etp, pp, sched, shard = key
    parts = [f"tp{tp}"] + [f"{n}{v}" for n, v in (("cp", cp), ("ep", ep)) if v > 1]
    if etp is not None:
        parts.append(f"etp{etp}")
    parts.append(f"pp{pp}")
    if pp > 1:
        parts.append(sched)
    if shard:
        parts.append(shard)
    return " ".join(parts)


@dataclass(frozen=True)
class Named:
    """A named alternative: the configurations it admits (`allow`, checked per placement too),
    whether stages must be even, and the recompute modes it allows (None: all). `admit`, where the
    restriction depends on the placement: whether some placement of a configuration may qualify
    (the search's filter before placements; default `allow`)."""

    name: str
    description: str
    allow: Callable[[Config], bool]
    uniform: bool = False
    modes: tuple[str, ...] | None = None
    admit: Callable[[Config], bool] | None = None


def _live_axes(cfg: Config) -> list[str]:
    sizes = {"tp": cfg.tp, "cp": cfg.cp, "ep": cfg.ep, "dp": max(1, cfg.dp // cfg.ep), "pp": cfg.pp}
    order = [a for a in cfg.placement.split("-") if a in sizes] if cfg.placement else list(MESH_AXES)
    return [a for a in order if sizes[a] > 1]


NAMED_HELP = ("no-cp, no-pp, no-ep, tp-in-node, ep-in-node, ep-across-nodes, 1f1b, even-stages, no-recompute, or a "
              "fixed degree such as tp8, cp2, ep16, pp4")


def ep_spans_domains(ctx: Context, c: Config) -> bool:
    """Whether c's expert-parallel group (placed as its placement has it) spans more than one
    innermost domain (a node's NVLink domain): its all-to-all then crosses the scale-out network."""
    return place_axes(ctx.graph, c.placement, c.tp, c.cp, c.ep, c.dp, c.pp, c.etp).ep.members[0] < c.ep


def named(name: str, ctx: Context) -> Named:
    """The named alternative `name`, or InputError (field --alternatives) listing the known ones."""
    node = ctx.levels[0].size
    fixed = re.fullmatch(r"(tp|cp|ep|pp|dp)(\d+)", name)
    if fixed:
        knob, value = fixed.group(1), int(fixed.group(2))
        return Named(name, f"{knob}={value}", lambda c: getattr(c, knob) == value)
    table = {
        "no-cp": Named("no-cp", "no context parallelism", lambda c: c.cp == 1),
        "no-pp": Named("no-pp", "no pipeline parallelism", lambda c: c.pp == 1),
        "no-ep": Named("no-ep", "no expert parallelism", lambda c: c.ep == 1),
        # TP inside one NVLink domain: at most a node, and the innermost mesh axis of the placement.
        "tp-in-node": Named("tp-in-node", f"tensor parallelism inside one {node}-GPU NVLink domain",
                            lambda c: c.tp == 1 or (c.tp <= node and _live_axes(c)[:1] == ["tp"])),
        # EP inside one NVLink domain or across domains: the expert all-to-all on NVLink or on the network.
        "ep-in-node": Named("ep-in-node", f"expert parallelism inside one {node}-GPU NVLink domain",
                            lambda c: c.ep > 1 and not ep_spans_domains(ctx, c), admit=lambda c: 1 < c.ep <= node),
        "ep-across-nodes": Named("ep-across-nodes", f"expert parallelism across {node}-GPU NVLink domains",
                                 lambda c: c.ep > 1 and ep_spans_domains(ctx, c), admit=lambda c: c.ep > 1),
        "1f1b": Named("1f1b", "the 1F1B schedule (or no pipeline)", lambda c: c.schedule == "1f1b"),
        "even-stages": Named("even-stages", "even stages (launchers without uneven pipelines)",
                             lambda c: True, uniform=True),
        "no-recompute": Named("no-recompute", "no activation recompute", lambda c: True, modes=("none",)),
    }
    if name not in table:
        raise InputError(f"unknown alternative {name!r}; known: {NAMED_HELP}", field="--alternatives")
    return table[name]

"""Compute/communication rooflines of data, fully sharded, expert and tensor parallelism (seed 001).

For a GPU, a topology and a model: the fewest tokens per GPU per step at which each kind of
parallelism stays compute-bound, as seed 001 (REFERENCE §5) derives them, with the collective
times taken from the same functions the cost model prices collectives with
(`topology.all_reduce_s`, `topology.all_gather_s`) on the same resolved levels:

- DP: the gradient all-reduce must hide under the backward pass. Per parameter and token the
  backward pass does 4 FLOPs; per parameter the all-reduce moves 2 bytes (bf16 gradients):
  `tokens/GPU > 2 C / (4 W_AR) = C / (2 W_AR)`, with `W_AR = B / T_AR(B)` the all-reduce bandwidth
  of a DP group spanning the level (in-network reduction halves T_AR). H100 SuperPOD: 1,098 in a
  node, 1,236 across a leaf or the spine.
- FSDP (ZeRO-3): weights are gathered and gradients reduce-scattered, twice DP's traffic: twice
  DP's tokens (2,472).
- EP (MoE, E experts, k active): expert gradients are E/k times more bytes per FLOP, but EP-way
  sharding multiplies the bandwidth of the expert all-reduce: `tokens/GPU > E C / (2 k W_full)`,
  `W_full = EP x b / T_AR(b)` over the expert-data-parallel group (stride EP). DeepSeek-like
  (E=256, k=8, EP=64) on the H100 SuperPOD: 4,944.
- TP inside a level: the activation all-gather must hide under the GEMMs:
  `TP degree < F / (C T_AG(B) / B)`; on an 8-GPU H100 node `F / 1,923` (seed 001 prints F / 1,746,
  using C = 898e12).

C is the dense peak of the precision's GEMM data type and the links run at their specified rate
with no latency (the seeds' idealization); `achievable=True` uses the catalog's matmul and network
efficiencies instead, as the cost model does.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .catalog import GPU, gemm_flops_per_s, gemm_peak_flops_per_s, check_precision
from .spec import ClusterSpec, ModelSpec, TopologyLevel
from .tables import table_text
from .topology import Level, Profile, all_gather_s, all_reduce_s, resolve_levels
from .catalog import get_topology

PROBE_BYTES = 1e9  # message size the bandwidths are read at (latency is zeroed: only the slope counts)
BACKWARD_FLOPS_PER_PARAM_TOKEN = 4.0  # the all-reduce hides under the backward pass (seed 001)
GRAD_BYTES_PER_PARAM = 2.0  # bf16 gradients


def _levels(gpu: GPU, topology: str | list[TopologyLevel] | None, num_gpus: int, achievable: bool) -> tuple[Level, ...]:
    levels = resolve_levels(ClusterSpec(gpu=gpu.id, num_gpus=num_gpus, topology=topology), gpu)
    out = []
    for lv in levels:
        upd: dict[str, Any] = {"latency_s": 0.0}
        if not achievable:
            upd["bytes_per_s"] = lv.link_bytes_per_s
            if hasattr(lv, "nvls_ar_gain"):
                upd["nvls_ar_gain"] = 0.0  # the seeds' in-network reduction: B / W
        out.append(dataclasses.replace(lv, **upd))
    return tuple(out)


def strided_profile(levels: tuple[Level, ...], size: int, stride: int = 1) -> Profile:
    """Profile of a group of `size` GPUs spaced `stride` apart from rank 0 (stride 1: consecutive):
    at each level, as many members as fit in one domain."""
    members = [max(1, min(size, lv.size // stride)) for lv in levels]
    members[-1] = size
    return Profile(size, tuple(members))


def top_size(gpu: GPU, topology: str | list[TopologyLevel] | None) -> int:
    topo = topology if topology is not None else gpu.default_topology
    levels = get_topology(topo).levels if isinstance(topo, str) else list(topo)
    return levels[-1].size


def rooflines(model: ModelSpec, gpu: GPU, topology: str | list[TopologyLevel] | None = None, *,
              precision: str = "bf16", num_gpus: int | None = None, achievable: bool = False,
              ep_degrees: list[int] | None = None) -> dict[str, Any]:
    """The seeds' critical tokens per GPU (DP, FSDP per level; EP per degree for MoE) and the TP bound
    per level, as a JSON-ready dict (see the module docstring for the formulas)."""
    check_precision(gpu, precision)
    n = num_gpus or top_size(gpu, topology)
    levels = _levels(gpu, topology, n, achievable)
    c = gemm_flops_per_s(gpu, precision) if achievable else gemm_peak_flops_per_s(gpu, precision)
    ffn = model.intermediate_size
    out_levels = []
    for i, lv in enumerate(levels):
        g = lv.size if i < len(levels) - 1 else n
        prof = strided_profile(levels, g)
        if g < 2:
            continue
        w_ar = PROBE_BYTES / all_reduce_s(levels, prof, PROBE_BYTES)
        dp = GRAD_BYTES_PER_PARAM * c / (BACKWARD_FLOPS_PER_PARAM_TOKEN * w_ar)
        tp_div = c * all_gather_s(levels, prof, PROBE_BYTES) / PROBE_BYTES
        out_levels.append({
            "level": lv.name, "gpus": g, "link_gb_per_s": lv.link_bytes_per_s / 1e9, "sharp": lv.sharp,
            "allreduce_bandwidth_gb_per_s": w_ar / 1e9,
            "dp_tokens_per_gpu": dp, "fsdp_tokens_per_gpu": 2 * dp,
            "dp_tokens_per_step": dp * n, "fsdp_tokens_per_step": 2 * dp * n,
            "tp_bound_divisor": tp_div, "tp_max_degree": ffn / tp_div,
        })
    out_ep = []
    if model.is_moe:
        e, k = model.num_experts, model.num_experts_per_tok
        degrees = ep_degrees or [d for d in (2 ** j for j in range(1, 21)) if d <= e and e % d == 0 and n // d >= 2]
        for ep in degrees:
            x = n // ep
            if x < 2:
                continue
            prof = strided_profile(levels, x, ep)
            t = all_reduce_s(levels, prof, PROBE_BYTES)
            w_full = ep * PROBE_BYTES / t
            crossed = prof.crossed(levels)
            tokens = e * GRAD_BYTES_PER_PARAM * c / (k * BACKWARD_FLOPS_PER_PARAM_TOKEN * w_full)
            out_ep.append({"ep": ep, "edp": x, "levels_crossed": crossed,
                           "expert_allreduce_bandwidth_gb_per_s": w_full / 1e9,
                           "tokens_per_gpu": tokens, "tokens_per_step": tokens * n,
                           "tokens_per_step_with_fsdp": 2 * tokens * n})
    return {
        "model": model.name, "gpu": gpu.id, "topology": topology if isinstance(topology, str) or topology is None
        else "custom", "precision": precision, "num_gpus": n, "achievable": achievable,
        "flops_per_s": c, "ffn": ffn, "num_experts": model.num_experts, "experts_per_token": model.num_experts_per_tok,
        "levels": out_levels, "expert_parallel": out_ep,
    }


def render(r: dict[str, Any]) -> str:
    lines = [f"Rooflines: {r['model']} on {r['num_gpus']:,} x {r['gpu']} ({r['topology'] or 'default topology'}), "
             f"{r['precision']}, C = {r['flops_per_s'] / 1e12:,.0f} TFLOP/s "
             f"({'achievable: catalog efficiencies' if r['achievable'] else 'dense peak, links at full rate: the idealized rooflines'})",
             "Compute-bound above these tokens per GPU per step (a DP/FSDP group spanning the level):"]
    lines.append(table_text(
        ["level", ("GPUs", "right"), ("AR GB/s", "right"), ("DP", "right"), ("FSDP", "right"), ("TP bound", "right"),
         ("max TP", "right")],
        [[lv["level"], f"{lv['gpus']:,}", f"{lv['allreduce_bandwidth_gb_per_s']:,.0f}",
          f"{math.floor(lv['dp_tokens_per_gpu']):,}", f"{math.floor(lv['fsdp_tokens_per_gpu']):,}",
          "F/" + format(lv["tp_bound_divisor"], ",.0f"), f"{lv['tp_max_degree']:.1f}"] for lv in r["levels"]],
        indent=2).rstrip("\n"))
    lines.append(f"  (TP: compute-bound while TP degree < F / divisor; F = {r['ffn']:,})")
    if r["expert_parallel"]:
        lines.append(f"Expert parallelism (E = {r['num_experts']}, k = {r['experts_per_token']}): tokens per GPU "
                     "above which the expert-gradient all-reduce hides")
        lines.append(table_text(
            [("EP", "right"), ("tokens/GPU", "right"), ("per step", "right"), ("with FSDP", "right"), "crosses"],
            [[e["ep"], f"{math.floor(e['tokens_per_gpu']):,}", f"{e['tokens_per_step'] / 1e6:,.1f}M",
              f"{e['tokens_per_step_with_fsdp'] / 1e6:,.1f}M", ", ".join(e["levels_crossed"]) or "nothing"]
             for e in r["expert_parallel"]], indent=2).rstrip("\n"))
    return "\n".join(lines) + "\n"

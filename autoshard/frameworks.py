"""Framework profiles (autoshard/data/frameworks.yaml): what a launcher runs and keeps in memory."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml


@dataclass(frozen=True)
class FrameworkProfile:
    name: str
    weight_bytes: float
    grad_bytes: float
    master_bytes: float
    adam_state_bytes: float
    grad_reduce_bytes: float
    zero_stages: tuple[int, ...]
    schedules: tuple[str, ...]
    tp_comm_overlap: bool
    ep_overlap: bool
    moe_folding: bool
    uneven_stages: bool
    source: str
    moe_layer_host_s: float = 0.0  # exposed host time per MoE layer and micro-batch (fwd + bwd)
    moe_expert_host_s: float = 0.0  # ... and per local expert of that layer (grouped-MLP path)
    attention_kernel_factor: float = 1.0  # attention kernel rate relative to FlashAttention-3 / cuDNN
    recompute_module_host_s: float = 0.0  # host time of one recompute module per layer and micro-batch
    cuda_graphs: bool = False  # can capture the whole training step in CUDA graphs
    moe_dispatchers: tuple[str, ...] = ("alltoall",)  # expert dispatchers it runs; the first is its default
    moe_token_drop: bool = False  # can drop and pad expert inputs to a capacity (training.moe_capacity_factor)

    def optimizer_state_bytes(self, optimizer: str) -> float:
        """Bytes per parameter the optimizer keeps (master weights + moments); SGD keeps one moment."""
        moments = self.adam_state_bytes if optimizer in ("adam", "adamw") else self.adam_state_bytes / 2
        return self.master_bytes + moments


def _dispatchers(name: str, values: list[str]) -> tuple[str, ...]:
    """A profile's expert dispatchers, checked against the names plans take (spec.Dispatcher)."""
    from typing import get_args  # noqa: PLC0415

    from .spec import Dispatcher  # noqa: PLC0415

    bad = [v for v in values if v not in get_args(Dispatcher)]
    if bad or not values:
        raise ValueError(f"frameworks.yaml: {name}.moe_dispatchers: {bad or 'empty'} (valid: {get_args(Dispatcher)})")
    return tuple(values)


@functools.cache
def profiles() -> dict[str, FrameworkProfile]:
    data = yaml.safe_load(resources.files("autoshard.data").joinpath("frameworks.yaml").read_text())
    out = {}
    for name, row in data["frameworks"].items():
        out[name] = FrameworkProfile(
            name=name, weight_bytes=float(row["weight_bytes"]), grad_bytes=float(row["grad_bytes"]),
            master_bytes=float(row["master_bytes"]), adam_state_bytes=float(row["adam_state_bytes"]),
            grad_reduce_bytes=float(row["grad_reduce_bytes"]), zero_stages=tuple(row["zero_stages"]),
            schedules=tuple(row["schedules"]), tp_comm_overlap=bool(row["tp_comm_overlap"]),
            ep_overlap=bool(row["ep_overlap"]), moe_folding=bool(row["moe_folding"]),
            uneven_stages=bool(row["uneven_stages"]), source=" ".join(str(row["source"]).split()),
            moe_layer_host_s=float(row.get("moe_layer_host_ms", 0.0)) / 1e3,
            moe_expert_host_s=float(row.get("moe_expert_host_ms", 0.0)) / 1e3,
            attention_kernel_factor=float(row.get("attention_kernel_factor", 1.0)),
            recompute_module_host_s=float(row.get("recompute_module_host_ms", 0.0)) / 1e3,
            cuda_graphs=bool(row.get("cuda_graphs", False)),
            moe_dispatchers=_dispatchers(name, row.get("moe_dispatchers", ["alltoall"])),
            moe_token_drop=bool(row.get("moe_token_drop", False)))
    return out


def get_framework(name: str) -> FrameworkProfile:
    return profiles()[name]

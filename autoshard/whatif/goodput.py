"""Goodput: the effective training-time ratio under failures, checkpoints and restarts (Young/Daly)."""

from __future__ import annotations

import dataclasses
import functools
import math
from importlib import resources
from typing import Any

import yaml

from ..catalog import get_gpu
from .schema import ReliabilitySpec

# =============================================================================================
# Reliability and goodput
# =============================================================================================


@functools.cache
def reliability_defaults() -> dict[str, Any]:
    text = resources.files("autoshard.data").joinpath("failures.yaml").read_text(encoding="utf-8")
    return dict(yaml.safe_load(text))


def young_daly_interval_s(mtbf_s: float, checkpoint_s: float) -> float:
    """Young's optimal checkpoint interval sqrt(2 x MTBF x checkpoint time) (seconds of work)."""
    return math.sqrt(2.0 * mtbf_s * checkpoint_s)


@dataclasses.dataclass(frozen=True)
class Goodput:
    ratio: float  # useful work / wall-clock time (effective training-time ratio)
    mtbf_s: float  # of the whole cluster
    checkpoint_bytes: float
    checkpoint_s: float  # write time per checkpoint
    interval_s: float  # work between checkpoints
    restart_s: float  # per failure, incl. reading the checkpoint back
    failures_per_gpu_hour: float  # hardware failures (0 when reliability is disabled)
    preemptions_per_gpu_hour: float = 0.0  # spot capacity reclaimed (spot options only)


def reliability_figure(spec: ReliabilitySpec, key: str) -> float:
    v = getattr(spec, key)
    return float(reliability_defaults()[key] if v is None else v)


def failure_rate(spec: ReliabilitySpec, gpu: str) -> float:
    v = spec.failures_per_gpu_hour
    if isinstance(v, dict):
        table = {get_gpu(k).id: x for k, x in v.items()}
        if gpu in table:
            return float(table[gpu])
        return float(reliability_defaults()["failures_per_gpu_hour"])
    return float(reliability_defaults()["failures_per_gpu_hour"] if v is None else v)


def goodput(num_gpus: int, params: float, spec: ReliabilitySpec | None = None, gpu: str = "h100-sxm", *,
            spot: bool = False) -> Goodput:
    """Effective training-time ratio of a cluster of `num_gpus` training a `params`-parameter model.

    Interruptions are hardware failures (unless reliability is disabled) plus, on spot capacity,
    preemptions (`spot_preemptions_per_gpu_hour`, counted even when reliability is disabled); each
    costs a restart and on average half a checkpoint interval of work."""
    spec = spec or ReliabilitySpec()
    size = params * reliability_figure(spec, "checkpoint_bytes_per_param")
    bw = max(reliability_figure(spec, "storage_min_gb_per_s"), num_gpus * reliability_figure(spec, "storage_gb_per_s_per_gpu"))
    if spec.storage_max_gb_per_s is not None:
        bw = min(bw, spec.storage_max_gb_per_s)
    io_s = size / (bw * 1e9)
    delta = reliability_figure(spec, "checkpoint_overhead_s") + io_s
    restart = reliability_figure(spec, "restart_s") + io_s
    fail = failure_rate(spec, gpu) if spec.enabled else 0.0
    pre = reliability_figure(spec, "spot_preemptions_per_gpu_hour") if spot else 0.0
    lam = fail + pre
    if lam <= 0:
        return Goodput(1.0, math.inf, size, delta, math.inf, restart, fail, pre)
    mtbf = 3600.0 / (lam * num_gpus)
    tau = spec.checkpoint_interval_s or young_daly_interval_s(mtbf, delta)
    ratio = (1.0 - (restart + (tau + delta) / 2.0) / mtbf) / (1.0 + delta / tau)
    return Goodput(max(0.0, ratio), mtbf, size, delta, tau, restart, fail, pre)

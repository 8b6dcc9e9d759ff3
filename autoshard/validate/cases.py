"""A validation run's records: `Case` (a run the model can price) and `Skip` (one it cannot, and
why), and the readers of a run row's measured figures (step time, peak memory, batch, DP size)
that validate/__init__.py and modern.py share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, overload

from ..errors import InputError


PRECISION_MAP = {
    "fp16 mixed": "bf16",
    "fp16": "bf16",
    "bf16": "bf16",
    "bf16 mixed": "bf16",
    "fp8": "fp8",
}


# ---------------------------------------------------------------------------------------
# Rows -> cases
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One measured run, ready for `evaluate`."""

    id: str
    source_group: str
    gpu: str
    precision: str
    gpu_count: int
    problem: Any  # autoshard.spec.Problem
    plan: Any  # autoshard.spec.Plan
    measured_step_s: float
    notes: tuple[str, ...] = ()
    recompute_published: bool = True
    recipe: str = ""  # the precision recipe as run (fp8-current, mxfp8, ...); "" = `precision`
    framework: str = "megatron"
    arch: str = ""  # Hopper, Blackwell, ...; "" = from the GPU id
    measured_peak_memory_gib: float | None = None  # torch.cuda.max_memory_allocated as the row states it


@dataclass(frozen=True)
class Skip:
    id: str
    source_group: str
    reason: str


def source_group(row: Mapping[str, Any]) -> str:
    """The row's `source_group` (the label of its per-source table line), else its `source_family`, else
    its `source` up to the first comma."""
    for key in ("source_group", "source_family"):
        if str(row.get(key) or "").strip():
            return str(row[key]).strip()
    return str(row.get("source") or "unknown").split(",")[0].strip() or "unknown"


def filled_notes(row: Mapping[str, Any]) -> list[str]:
    """A row's `filled` (field -> where a value the source did not print comes from) as notes; a flat
    text (a CSV cell) is one note."""
    filled = row.get("filled")
    if not filled:
        return []
    if isinstance(filled, Mapping):
        return [f"{k} filled: {v}" for k, v in sorted(filled.items())]
    return [f"filled: {filled}"]


GB_PER_GIB = 2**30 / 1e9


def measured_peak_memory_gib(row: Mapping[str, Any]) -> float | None:
    """A row's measured peak memory per GPU in GiB: `measured_peak_memory_gib`, else
    `measured_peak_memory_gb` (1e9 bytes) converted; None where the row states neither."""
    gib, gb = row.get("measured_peak_memory_gib"), row.get("measured_peak_memory_gb")
    for key, v in (("measured_peak_memory_gib", gib), ("measured_peak_memory_gb", gb)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e5):
            raise InputError(f"expected a positive number, got {v!r}", field=f"{row.get('id')}.{key}")
    if gib is not None:
        return float(gib)
    if gb is not None:
        return float(gb) / GB_PER_GIB
    return None


def narayanan_flops(row: Mapping[str, Any]) -> float:
    """FLOPs per iteration of Narayanan et al. 2021 eq. (3) (counts the recompute forward)."""
    B, s, l, h, V = (float(row[k]) for k in ("global_batch_seqs", "seq_len", "layers", "hidden", "vocab"))
    return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))


def measured_step(row: Mapping[str, Any]) -> tuple[float | None, str]:
    """(measured step time in s, how it was obtained) or (None, why not)."""
    if row.get("step_time_s"):
        return float(row["step_time_s"]), "step_time_s as published"
    if row.get("tflops_formula") == "megatron-eq3" and row.get("tflops_per_gpu") and row.get("gpu_count"):
        if any(row.get(k) in (None, 0) for k in ("global_batch_seqs", "seq_len", "layers", "hidden", "vocab")):
            return None, "eq. (3) needs B, s, l, h, V"
        f = narayanan_flops(row)
        return f / (float(row["tflops_per_gpu"]) * 1e12 * int(row["gpu_count"])), \
            f"derived: eq.(3) F={f:.4g} / ({row['tflops_per_gpu']} TFLOP/s x {row['gpu_count']} GPUs)"
    if row.get("tokens_per_sec") and row.get("global_batch_tokens"):
        return float(row["global_batch_tokens"]) / float(row["tokens_per_sec"]), \
            "derived: global_batch_tokens / tokens_per_sec"
    return None, "no measured step time (no step_time_s, tflops_per_gpu or tokens_per_sec)"


@overload
def as_int(v: Any, default: int) -> int: ...
@overload
def as_int(v: Any, default: None = None) -> int | None: ...
def as_int(v: Any, default: int | None = None) -> int | None:
    """A row's integer field (`default` where absent or empty)."""
    if v is None or v == "":
        return default
    return int(v)


def global_batch_seqs(row: Mapping[str, Any]) -> int | None:
    """A row's global batch in sequences: as given, or its tokens over the sequence length."""
    gbs = as_int(row.get("global_batch_seqs"))
    if gbs is None and row.get("global_batch_tokens"):
        gbs = int(row["global_batch_tokens"]) // int(row["seq_len"])
    return gbs


def row_dp(row: Mapping[str, Any], n: int, tp: int, pp: int, cp: int,
           notes: list[str]) -> tuple[int | None, str | None]:
    """A row's data-parallel degree and, where it cannot be had, why: its `dp` as given, else
    gpu_count / (tp*pp*cp) (noted in `notes`), or (None, the reason) where that does not divide."""
    dp = as_int(row.get("dp"))
    if dp is None:
        if n % (tp * pp * cp):
            return None, f"tp*pp*cp = {tp * pp * cp} does not divide gpu_count = {n}"
        dp = n // (tp * pp * cp)
        notes.append(f"dp derived: {dp}")
    return dp, None

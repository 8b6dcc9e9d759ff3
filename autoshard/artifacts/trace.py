"""PyTorch profiler traces (Chrome trace JSON, `torch.profiler` `export_chrome_trace` /
`tensorboard_trace_handler`, `.json` or `.json.gz`) -> GPU time per step by kernel class.

The format is Kineto's: a JSON object with `traceEvents`, a list of complete events (`"ph": "X"`,
`ts` / `dur` in microseconds). GPU kernels have `"cat": "kernel"`; the operator that launched one
(`"cat": "cpu_op"`, e.g. `aten::mm`) shares its `args["External id"]` and, with `record_shapes`,
carries `"Input Dims"` and `"Input type"`. Collectives carry the c10d fields (`torch/csrc/profiler/
util.h`: `Collective name`, `In msg nelems`, `Out msg nelems`, `Group size`, `dtype`) on the
`record_param_comms` operator and, in recent PyTorch, on the NCCL kernel itself. Profiled steps are
the `ProfilerStep#N` annotations.

Kernel classes, by kernel name (first match): NCCL (`nccl`), attention (`flash`, `fmha`, `attn`,
`attention`, `sdpa`), GEMM (`gemm`, `xmma`, `cutlass`, `nvjet`, `cublas`, `matmul`, `wgmma`), other.
GEMMs are grouped by the launching operator's input shapes and dtype where recorded; collectives by
name, message bytes and group size. Host gaps: the time inside the profiled steps when no kernel,
copy or memset runs on the device (the union of their intervals, subtracted from the steps' span).
"""

from __future__ import annotations

import json
import os
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from .files import MAX_TRACE_BYTES, at_line, read_text

NCCL = re.compile(r"nccl", re.I)
ATTENTION = re.compile(r"flash|fmha|attn|attention|sdpa", re.I)
GEMM = re.compile(r"gemm|xmma|cutlass|nvjet|cublas|matmul|wgmma", re.I)
STEP = re.compile(r"^ProfilerStep#(\d+)$")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# bytes per element of the c10d `dtype` names (c10 ScalarType names)
DTYPE_BYTES = {"Float": 4, "float32": 4, "Double": 8, "Half": 2, "float16": 2, "BFloat16": 2, "bfloat16": 2,
               "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Byte": 1, "Char": 1, "Bool": 1, "Int": 4, "Long": 8, "Short": 2}
# collective name (c10d, lower-cased, underscores dropped) -> the nccl-tests name
COLLECTIVES = (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
               ("alltoall", "alltoall"), ("broadcast", "broadcast"), ("send", "sendrecv"), ("recv", "sendrecv"))


def collective_kind(name: str) -> str:
    n = name.lower().replace("_", "")
    for key, kind in COLLECTIVES:
        if key in n:
            return kind
    return name.lower()


@dataclass
class Collective:
    kind: str  # all_reduce, all_gather, reduce_scatter, alltoall, ...
    bytes: int  # the larger of the input and output message (the gathered / full size)
    group_size: int
    calls: float = 0.0  # per step
    time_s: float = 0.0  # per step


@dataclass
class TraceSummary:
    path: str
    steps: int
    device: str | None
    rank: int | None
    world_size: int | None
    span_s: float  # the profiled steps' span on the device, per step
    by_class_s: dict[str, float]  # gemm, attention, nccl, other, host_gap: seconds per step
    gemm_by_shape_s: dict[str, float] = field(default_factory=dict)  # "aten::mm [a,b]x[b,c] BFloat16" -> s/step
    collectives: list[Collective] = field(default_factory=list)  # per step
    notes: list[str] = field(default_factory=list)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    start = None
    for a, b in sorted(intervals):
        if start is None or a > end:
            if start is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if start is not None:
        total += end - start
    return total


def read_trace(path: str | os.PathLike[str]) -> TraceSummary:
    src = str(path)
    text = read_text(src, MAX_TRACE_BYTES, "trace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise at_line(src, exc.lineno, f"not JSON: {exc.msg} (column {exc.colno})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        raise at_line(src, None, "not a Chrome trace: no 'traceEvents' list")
    steps: list[tuple[float, float]] = []
    ops: dict[Any, dict[str, Any]] = {}
    kernels: list[dict[str, Any]] = []
    device_iv: list[tuple[float, float]] = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), str(e.get("name", ""))
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            raise at_line(src, None, f"traceEvents[{i}] ({name!r}): 'ts' / 'dur' missing or not a number") from None
        if dur < 0:
            raise at_line(src, None, f"traceEvents[{i}] ({name!r}): negative duration {dur}")
        args: dict[str, Any] = e["args"] if isinstance(e.get("args"), dict) else {}
        if cat in ("cpu_op", "user_annotation") and STEP.match(name):
            steps.append((ts, ts + dur))
        elif cat == "cpu_op":
            ext = args.get("External id")
            if ext is not None and ("Input Dims" in args or "Collective name" in args):
                if "Collective name" in args or ext not in ops:  # the collective's fields win
                    ops[ext] = args
        elif cat in DEVICE_CATS:
            device_iv.append((ts, ts + dur))
            if cat == "kernel":
                kernels.append({"name": name, "ts": ts, "dur": dur, "args": args})
    notes: list[str] = []
    if steps:
        t0, t1 = min(a for a, _ in steps), max(b for _, b in steps)
        nsteps = len(steps)
        # The device runs a step's kernels after the host issued them: the window is from the first
        # kernel that starts inside the steps to the last kernel that starts before the next step ends.
        inside = [iv for iv in device_iv if t0 <= iv[0] <= t1]
        if inside:
            t0, t1 = min(a for a, _ in inside), max(b for _, b in inside)
        kernels = [k for k in kernels if t0 <= k["ts"] <= t1]
        device_iv = [iv for iv in device_iv if t0 <= iv[0] <= t1]
    else:
        if not device_iv:
            raise at_line(src, None, "no GPU kernels in the trace (profile with activities=[CPU, CUDA])")
        t0, t1 = min(a for a, _ in device_iv), max(b for _, b in device_iv)
        nsteps = 1
        notes.append("no ProfilerStep#N annotations (profile with schedule= and prof.step()): the whole trace is "
                     "counted as one step")
    if not kernels:
        raise at_line(src, None, "no GPU kernels inside the profiled steps (profile with activities=[CPU, CUDA])")
    by = {"gemm": 0.0, "attention": 0.0, "nccl": 0.0, "other": 0.0}
    shapes: dict[str, float] = {}
    colls: dict[tuple[str, int, int], Collective] = {}
    unsized = 0
    for k in kernels:
        name, dur, args = k["name"], k["dur"] * 1e-6, k["args"]
        op: dict[str, Any] = ops.get(args.get("External id"), {})
        if NCCL.search(name):
            by["nccl"] += dur
            meta = args if "Collective name" in args else op
            if "Collective name" in meta:
                nbytes = max(int(meta.get("In msg nelems") or 0), int(meta.get("Out msg nelems") or 0)) * \
                    DTYPE_BYTES.get(str(meta.get("dtype")), 0)
                ckey = (collective_kind(str(meta["Collective name"])), nbytes, int(meta.get("Group size") or 0))
                c = colls.setdefault(ckey, Collective(*ckey))
                c.calls += 1
                c.time_s += dur
            else:
                unsized += 1
        elif ATTENTION.search(name):
            by["attention"] += dur
        elif GEMM.search(name):
            by["gemm"] += dur
            if "Input Dims" in op:
                dims = "x".join("[" + ",".join(str(d) for d in dd) + "]" for dd in op["Input Dims"] if dd)
                types = sorted({str(t).replace("c10::", "") for t in op.get("Input type", []) if t})
                key = f"{dims} {'/'.join(types)}".strip()
                shapes[key] = shapes.get(key, 0.0) + dur
        else:
            by["other"] += dur
    if unsized:
        notes.append(f"{unsized} NCCL kernel(s) without c10d sizes (record_shapes off, or an old PyTorch): counted in "
                     "the nccl time, not by size")
    span = (t1 - t0) * 1e-6
    by["host_gap"] = max(0.0, span - _union_length(device_iv) * 1e-6)
    per = 1.0 / nsteps
    dist: dict[str, Any] = doc["distributedInfo"] if isinstance(doc, dict) and isinstance(doc.get("distributedInfo"),
                                                                                          dict) else {}
    props: list[Any] = doc["deviceProperties"] if isinstance(doc, dict) and isinstance(doc.get("deviceProperties"),
                                                                                       list) else []
    device = str(props[0].get("name")) if props and isinstance(props[0], dict) and props[0].get("name") else None
    for c in colls.values():
        c.time_s *= per
        c.calls *= per
    return TraceSummary(
        path=src, steps=nsteps, device=device,
        rank=dist.get("rank") if isinstance(dist.get("rank"), int) else None,
        world_size=dist.get("world_size") if isinstance(dist.get("world_size"), int) else None,
        span_s=span * per, by_class_s={k: v * per for k, v in by.items()},
        gemm_by_shape_s={k: v * per for k, v in sorted(shapes.items(), key=lambda kv: (-kv[1], kv[0]))},
        collectives=sorted(colls.values(), key=lambda c: (c.kind, c.bytes, c.group_size)), notes=notes)


BUS_FACTOR = {  # nccl-tests' bus-bandwidth factors (src/*.cu getBw): busbw = algbw x factor
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}


def collective_busbw(c: Collective) -> float | None:
    """Bus bandwidth (bytes/s) of one collective of the trace, as nccl-tests defines it; None when it
    has no size or no factor. The kernel time includes waiting for late ranks and sharing the GPU with
    overlapped compute, so this is a lower bound of what the links deliver."""
    f = BUS_FACTOR.get(c.kind)
    if f is None or c.group_size < 2 or c.bytes <= 0 or c.time_s <= 0 or c.calls <= 0:
        return None
    return c.bytes / (c.time_s / c.calls) * f(c.group_size)


def median_or_none(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None

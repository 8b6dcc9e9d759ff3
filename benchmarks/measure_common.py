"""The loop the one-GPU measurement scripts share (measure_steps.py, measure_mcore_steps.py): each
configuration measured in turn, a failure or an out-of-memory recorded and the run going on, the output
file rewritten after every configuration so a run cut short keeps what it measured."""
from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable

import torch


def run_grid(out: dict, path: str, items: list[tuple[dict, Callable[[], dict]]], budget_s: float) -> None:
    """Append to `out["runs"]` the row of each (label, measure) item: `measure()`'s, or the label with
    `oom` / `error`, or with `skipped` once `budget_s` seconds have passed; `path` holds `out` after each."""
    start = time.perf_counter()
    for label, measure in items:
        if time.perf_counter() - start > budget_s:
            row = dict(label, skipped="time budget")
        else:
            try:
                row = measure()
            except torch.OutOfMemoryError as e:
                row = dict(label, oom=str(e)[:300])
            except Exception as e:  # record and go on: one failure must not cost the whole run
                row = dict(label, error=f"{type(e).__name__}: {e}"[:800])
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        out["runs"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("model_args", "step_s_all")}), flush=True)
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


GIB = 1024**3


def time_steps(row: dict, zero_grad: Callable[[], None], forward: Callable[[], torch.Tensor],
               backward_step: Callable[[torch.Tensor], None], warmup: int, steps: int) -> torch.Tensor:
    """Run `warmup` + `steps` training steps (zero_grad, forward -> loss, backward_step(loss)) and record
    in `row`: the memory allocated between steps after the warm-up (optimizer states exist; peak stats
    reset there), before and after the last forward, the median step time (CUDA synchronised), every
    timed step and the median host enqueue time (the step's Python time before the final sync).
    Returns the last loss."""
    cuda = torch.cuda.is_available()
    times: list[float] = []
    host: list[float] = []
    loss = torch.zeros(())
    for i in range(warmup + steps):
        last = i == warmup + steps - 1
        if i == warmup and cuda:
            torch.cuda.synchronize()
            row["allocated_between_steps_gib"] = torch.cuda.memory_allocated() / GIB
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        zero_grad()
        if last and cuda:
            row["allocated_before_forward_gib"] = torch.cuda.memory_allocated() / GIB
        loss = forward()
        if last and cuda:
            row["allocated_after_forward_gib"] = torch.cuda.memory_allocated() / GIB
        backward_step(loss)
        t1 = time.perf_counter()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            host.append(t1 - t0)
    row["step_s_median"] = statistics.median(times)
    row["step_s_all"] = times
    row["host_enqueue_s_median"] = statistics.median(host)
    return loss

"""The loop the one-GPU measurement scripts share (measure_steps.py, measure_mcore_steps.py): each
configuration measured in turn, a failure or an out-of-memory recorded and the run going on, the output
file rewritten after every configuration so a run cut short keeps what it measured."""
from __future__ import annotations

import gc
import json
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

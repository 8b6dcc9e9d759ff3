"""Benchmark: a 200-option what-if sweep (target: under 2 minutes on 2 cores).

    python benchmarks/bench_whatif.py [--jobs 2] [--time-limit 1.0] [--options 200] [--out DIR]
                                      [--executor local|dask] [--scheduler tcp://host:8786]

Llama 3 8B (sequence 4,096, 256 sequences per step, 100B tokens) on 10 GPU types x 20
cluster sizes (8 to 160 GPUs in steps of 8), cloud prices, sensitivities by re-evaluation.
Prints the wall time, the per-option solve times and how many plans were proven optimal.
`--executor dask` times the same sweep on a Dask cluster (`pip install 'autoshard[dask]'`): a local
cluster of --jobs worker processes started for the run (its start-up is in the wall time), or the
scheduler at --scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoshard.whatif import run_study  # noqa: E402

GPUS = ["v100-sxm", "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h100-pcie", "h800-sxm", "h200-sxm", "b200",
        "mi300x", "rtx-4090"]


def study(n_options: int, sensitivity: str) -> dict:
    per_gpu = max(1, -(-n_options // len(GPUS)))
    options = []
    left = n_options
    for g in GPUS:
        k = min(per_gpu, left)
        if k <= 0:
            break
        options.append({"gpu": g, "num_gpus": [8 * (i + 1) for i in range(k)]})
        left -= k
    return {
        "name": f"bench-{n_options}",
        "workloads": [{"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 256},
                       "tokens": 1.0e11}],
        "options": options,
        "pricing": {"mode": "cloud"},
        "constraints": {"budget_usd": 2.0e5, "deadline_days": 30},
        "sensitivity": sensitivity,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--time-limit", type=float, default=1.0, help="per-option solver time limit (s)")
    ap.add_argument("--options", type=int, default=200)
    ap.add_argument("--sensitivity", default="evaluate", choices=["solve", "evaluate", "off"])
    ap.add_argument("--no-report", action="store_true", help="skip the plots and report")
    ap.add_argument("--out", default=None)
    ap.add_argument("--executor", default="local", choices=["local", "dask"])
    ap.add_argument("--scheduler", default=None, metavar="ADDRESS", help="Dask scheduler (default: a local cluster)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-whatif-"))
    t0 = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int, label: str) -> None:
        now = time.perf_counter() - t0
        if done == total or now - last[0] > 10:
            last[0] = now
            print(f"  {now:6.1f} s  {done}/{total}", flush=True)

    res = run_study(study(args.options, args.sensitivity), out, jobs=args.jobs, time_limit_s=args.time_limit,
                    progress=progress, report=not args.no_report, executor=args.executor,
                    scheduler=args.scheduler)
    wall = time.perf_counter() - t0
    rows = res.rows
    solve = [r["solve_time_s"] for r in rows if r.get("solve_time_s") is not None]
    status = Counter(r.get("solver_status") or ("infeasible" if not r.get("feasible") else "?") for r in rows)
    doc = json.loads((out / "results.json").read_text())
    figures = {
        "options": len(rows),
        "executor": args.executor + (f" @ {args.scheduler}" if args.scheduler else ""),
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "time_limit_s": args.time_limit,
        "sensitivity": args.sensitivity,
        "wall_s": round(wall, 1),
        "per_option_wall_s": round(wall * args.jobs / max(1, len(rows)), 2),
        "solve_s_median": round(statistics.median(solve), 2) if solve else None,
        "solve_s_max": round(max(solve), 2) if solve else None,
        "status": dict(sorted(status.items())),
        "recommended": (doc.get("recommended") or {}).get("option"),
        "under_2_min": wall < 120,
        "out": str(out),
    }
    for k, v in figures.items():
        print(f"{k:>20}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Solver speed benchmark: prints solve time, status and the chosen plan for the issue's cases.

    python benchmarks/bench_solve.py            # all cases
    python benchmarks/bench_solve.py --layers   # solve time vs number of layers (24 -> 200)
"""

from __future__ import annotations

import argparse
import sys
import time

from autoshard import load_problem
from autoshard.solver import solve

CASES = {
    "llama3-405b on 16,384 H100 (seq 8192, 16M tokens)": {
        "model": "llama3-405b", "training": {"seq_len": 8192, "global_batch_size": 2048},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 16384}},
    "deepseek-v3 on 2,048 H800": {
        "model": "deepseek-v3", "training": {"seq_len": 4096, "global_batch_size": 15360},
        "cluster": {"gpu": "h800-sxm", "num_gpus": 2048}},
    "gpt3-175b on 1,024 A100": {
        "model": "gpt3-175b", "training": {"seq_len": 2048, "global_batch_size": 1536},
        "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1024}},
    "llama3-70b on 640 H100 (seed)": {
        "model": "llama3-70b", "training": {"seq_len": 4096, "global_batch_size": 960},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 640}},
}


def run(name: str, doc: dict, limit: float) -> None:
    p = load_problem(doc)
    t0 = time.perf_counter()
    s = solve(p, time_limit_s=limit, top_k=0)
    dt = time.perf_counter() - t0
    st = s.solver
    print(f"{name}: {dt:6.2f} s  {st.status}  step {s.estimate.step_time_s:.3f} s  MFU {s.estimate.mfu:.1%}  "
          f"candidates {st.candidates}  pruned mem {st.pruned_by_memory} bound {st.pruned_by_bound}  "
          f"CP-SAT solves {st.cp_sat_solves}  gap {100 * st.gap:.2f}%\n    plan: {s.plan.short()}  placement {s.plan.placement}  "
          f"stages {s.plan.stage_layers}", flush=True)


def brute_force_ratio() -> None:
    """Solve a small problem and enumerate every plan of the same space with the evaluator
    (every placement, stage split and per-layer recompute); print both optima and times."""
    import itertools

    from autoshard.cost import Config, assemble, context, layer_table
    from autoshard.solver import candidates, _placements

    doc = {"model": {"preset": "llama3-8b", "num_hidden_layers": 8},
           "training": {"seq_len": 4096, "global_batch_size": 32},
           "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 16},
           "search": {"tp": [1, 2, 4], "pp": [1, 2, 4], "cp": [1], "micro_batch_size": [1, 2],
                      "zero_stage": [0, 1], "schedule": ["1f1b", "zero_bubble"], "recompute": ["none", "full"]}}
    p = load_problem(doc)
    t0 = time.perf_counter()
    s = solve(p, time_limit_s=120, top_k=0, gap_limit=0.0)
    t_solve = time.perf_counter() - t0
    ctx = context(p)
    L = p.model.num_hidden_layers
    t0 = time.perf_counter()
    best, n = float("inf"), 0
    for cfg0 in candidates(p, ctx):
        for cfg in _placements(p, ctx, cfg0):
            table = layer_table(ctx, cfg)
            V = cfg.pp * cfg.vpp
            for cuts in itertools.combinations(range(1, L), V - 1):
                b = (0, *cuts, L)
                split = [b[i + 1] - b[i] for i in range(V)]
                for rc in itertools.product(("none", "full"), repeat=L):
                    e = assemble(ctx, table, split, list(rc), cfg.plan(list(rc), split), [])
                    n += 1
                    if e.fits and e.step_time_s < best:
                        best = e.step_time_s
    t_bf = time.perf_counter() - t0
    print(f"brute force: {n} plans in {t_bf:.1f} s, optimum {best:.6f} s; solver {s.estimate.step_time_s:.6f} s "
          f"({s.solver.status}, exact) in {t_solve:.2f} s; same optimum: "
          f"{abs(best - s.estimate.step_time_s) <= s.solver.rounding_tolerance_s}; ratio {t_bf / t_solve:.0f}x")


def layers_curve(limit: float) -> None:
    for L in (24, 48, 96, 144, 200):
        doc = {"model": {"preset": "gpt3-175b", "num_hidden_layers": L},
               "training": {"seq_len": 2048, "global_batch_size": 1536},
               "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 1024}}
        run(f"gpt3-style, {L} layers, 1,024 A100", doc, limit)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("--brute-force", action="store_true")
    ap.add_argument("--only", default=None)
    ap.add_argument("--time-limit", type=float, default=120)
    a = ap.parse_args()
    if a.layers:
        layers_curve(a.time_limit)
        sys.exit(0)
    if a.brute_force:
        brute_force_ratio()
        sys.exit(0)
    for name, doc in CASES.items():
        if a.only is None or a.only in name:
            run(name, doc, a.time_limit)

"""Peak memory against Megatron-LM's functional tests (`validation/megatron_functional_memory.json`).

    python benchmarks/bench_megatron_memory.py            # error per case, median / p90 / worst
    python benchmarks/bench_megatron_memory.py --json     # the same as JSON
    python benchmarks/bench_megatron_memory.py --from-checkout PATH/TO/Megatron-LM/.git  # regenerate the file

Each case of the file is Megatron-LM's tests/functional_tests/test_cases/gpt/<case>/model_config.yaml
(MODEL_ARGS; paths dropped) beside the largest `mem-max-allocated-bytes` of its
golden_values_dev_dgx_h100.json, run on one node of 8 H100 (tests/test_utils/recipes/h100/gpt.yaml:
nodes 1, gpus 8). The figure is the last rank's (training.py logs it through the tensorboard writer that
only rank world_size - 1 holds), so it is compared with the stage that holds the output layer and the loss.
`autoshard.validate.megatron_args` reads the arguments; nothing is read from a case's name.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from autoshard import Plan, evaluate, load_problem
from autoshard.validate import validation_file
from autoshard.validate.megatron_args import problem_and_plan

GIB = 2**30
CASES_DIR = "tests/functional_tests/test_cases/gpt"
GOLDEN = "golden_values_dev_dgx_h100.json"
NUM_GPUS = 8  # tests/test_utils/recipes/h100/gpt.yaml: nodes 1, gpus 8


def predict(case: dict) -> tuple[float, bool]:
    """(the last stage's predicted peak in bytes, fits) of one case."""
    problem, plan = problem_and_plan(case["args"], NUM_GPUS, "h100")
    est = evaluate(load_problem(problem), Plan(**plan))
    if not est.stages:
        raise ValueError("; ".join(est.reasons))
    last = next(s for s in est.stages if s.has_lm_head)
    return last.peak_memory_gib * GIB, est.fits


def results(path: Path | None = None) -> tuple[list[dict], list[tuple[str, str]]]:
    """(per-case results, (case, why) of the cases autoshard cannot state)."""
    data = json.loads((path or validation_file("megatron_functional_memory.json")).read_text())
    out, skipped = [], []
    for case in data["cases"]:
        try:
            ours, fits = predict(case)
        except ValueError as e:
            skipped.append((case["case"], str(e)))
            continue
        out.append({"case": case["case"], "measured_gib": case["measured_peak_bytes"] / GIB, "predicted_gib": ours / GIB,
                    "error": ours / case["measured_peak_bytes"] - 1, "fits": fits})
    return out, skipped


def summary(rows: list[dict]) -> dict:
    errs = sorted(abs(r["error"]) for r in rows)
    p90 = errs[min(len(errs) - 1, int(round(0.9 * (len(errs) - 1))))]
    return {"cases": len(rows), "median_abs_error": statistics.median(errs), "p90_abs_error": p90,
            "worst_error": max((r["error"] for r in rows), key=abs), "within_3pct": sum(e <= 0.03 for e in errs),
            "predicted_not_to_fit": sum(not r["fits"] for r in rows)}


def from_checkout(git_dir: str) -> dict:
    """The cases of a Megatron-LM checkout (its git directory; HEAD): every GPT training case on one 8-GPU
    node with a measured peak (hidden 512 small GPTs and the 7B memory_speed cases)."""
    def show(p: str) -> str:
        return subprocess.run(["git", "-C", git_dir, "show", f"HEAD:{p}"], capture_output=True, text=True, check=True).stdout
    head = subprocess.run(["git", "-C", git_dir, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    files = subprocess.run(["git", "-C", git_dir, "ls-tree", "-r", "--name-only", "HEAD", CASES_DIR],
                           capture_output=True, text=True, check=True).stdout.split()
    cases = []
    for f in sorted(files):
        if not f.endswith("/" + GOLDEN):
            continue
        d = f.rsplit("/", 1)[0]
        args = (yaml.safe_load(show(d + "/model_config.yaml")) or {}).get("MODEL_ARGS") or {}
        peak = json.loads(show(f)).get("mem-max-allocated-bytes")
        if not isinstance(peak, dict) or args.get("--hidden-size") not in (512, 4096) or "--micro-batch-size" not in args:
            continue
        if args.get("--hidden-size") == 4096 and args.get("--num-layers") != 32:
            continue
        values = [v for v in peak["values"].values() if isinstance(v, (int, float)) and v == v]
        kept = {k: v for k, v in args.items() if not (isinstance(v, str) and "${" in v)}
        try:
            problem_and_plan(kept, NUM_GPUS, "h100")
        except (KeyError, ValueError):
            continue
        cases.append({"case": d.rsplit("/", 1)[1], "source_ref": f"NVIDIA/Megatron-LM@{head[:10]}:{d}",
                      "measured_peak_bytes": int(max(values)), "args": kept})
    return {"source": "NVIDIA/Megatron-LM functional tests, golden_values_dev_dgx_h100.json mem-max-allocated-bytes "
                      "(largest logged iteration, last rank) beside model_config.yaml MODEL_ARGS; 1 node x 8 H100 "
                      "(tests/test_utils/recipes/h100/gpt.yaml)", "commit": head, "cases": cases}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the per-case results and the summary as JSON")
    ap.add_argument("--from-checkout", metavar="GIT_DIR", help="regenerate the cases file from a Megatron-LM git directory")
    ap.add_argument("--file", type=Path, help="the cases file (default: validation/megatron_functional_memory.json)")
    a = ap.parse_args(argv)
    if a.from_checkout:
        out = a.file or validation_file("megatron_functional_memory.json")
        out.write_text(json.dumps(from_checkout(a.from_checkout), indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    rows, skipped = results(a.file)
    s = summary(rows)
    if a.json:
        print(json.dumps({"cases": rows, "skipped": skipped, "summary": s}, indent=1))
        return 0
    for r in sorted(rows, key=lambda r: r["error"]):
        print(f"{r['error']:+7.1%}  {r['predicted_gib']:6.3f} / {r['measured_gib']:6.3f} GiB  {r['case']}")
    for name, why in skipped:
        print(f"skipped  {name}: {why}")
    print(f"{s['cases']} cases: median |error| {s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}, worst "
          f"{s['worst_error']:+.1%}, within 3%: {s['within_3pct']}, predicted not to fit: {s['predicted_not_to_fit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

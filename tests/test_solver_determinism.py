"""The answer is a function of the problem and the work budget: the same JSON (timing aside) on a
quiet machine and beside a neighbour spinning on every core; a wall-clock limit that fires says so."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard import load_problem
from autoshard.solver import solve

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys; from autoshard.cli import main; sys.exit(main(sys.argv[1:]))"
TIMING = ("solve_time_s",)  # the only solver fields that depend on the clock


def _solve_json(problem: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CLI, "solve", str(ROOT / "problems" / problem), "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    for k in TIMING:
        doc["solver"].pop(k)
    return doc


@pytest.mark.parametrize("problem", ["mixtral-8x7b-64xh100.yaml", "llama3-8b-64xh100.yaml",
                                     "finetune-llama3-8b-8xrtx4090.yaml"])
def test_same_answer_beside_a_busy_neighbour(problem):
    quiet = _solve_json(problem)
    # A neighbour spinning on every core (2 on the machines this runs on): the solver gets a fraction
    # of the CPU, so every wall-clock decision would show.
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(2, os.cpu_count() or 2))]
    try:
        busy = _solve_json(problem)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert busy["solver"]["limit_fired"] is None and quiet["solver"]["limit_fired"] is None
    assert json.dumps(busy, sort_keys=True) == json.dumps(quiet, sort_keys=True)


def test_a_fired_wall_limit_is_reported_with_the_command_that_proves_the_optimum():
    p = load_problem(ROOT / "problems" / "mixtral-8x7b-64xh100.yaml")
    sol = solve(p, time_limit_s=0.5)  # far below what its budget takes
    assert sol.solver.limit_fired == "wall" and sol.solver.stopped_by == "wall-clock safety net"
    assert sol.solver.prove_command == "--time-limit 600"  # (the default safety net: the budget decides)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CLI, "solve", str(ROOT / "problems" / "mixtral-8x7b-64xh100.yaml"),
                          "--time-limit", "0.5", "--quiet"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    first = out.stdout.splitlines()[:2]
    assert first[0].startswith("LIMIT FIRED (wall): the wall-clock safety net"), first
    assert "proven gap" in first[0]
    assert first[1].startswith("To prove the optimum: autoshard solve "), first
    assert "--time-limit 600" in first[1] and "0.5" not in first[1], first


def test_a_work_budget_too_small_stops_the_proof_the_same_way_every_time():
    p = load_problem(ROOT / "problems" / "mixtral-8x7b-64xh100.yaml")
    a = solve(p, work_limit=0.5, top_k=0)
    b = solve(p, work_limit=0.5, top_k=0)
    assert a.solver.limit_fired == "work" and a.solver.status == "FEASIBLE"
    assert a.solver.prove_command == "--work-limit 2"
    assert a.plan == b.plan and a.solver.gap == b.solver.gap and a.solver.work_s == b.solver.work_s

"""The committed solutions/ must match problems/ and the current cost model.

Solving the big bundled problems takes minutes, so CI does not re-solve them. Instead,
cheaply, for every problem file in problems/ (top-level *.yaml / *.yml / *.json with a
`model` key; what-if studies in problems/studies/ are not problems):

- `solutions/<stem>.json` exists;
- its `input_sha256` equals the hash `autoshard batch` would compute now for the settings
  the record stores (`settings.time_limit_s`, `settings.top_k`), i.e. the problem file, the
  files it refers to and the autoshard version did not change since it was solved;
- re-evaluating its stored plan with the current cost model reproduces the stored
  estimate's step_time_s, mfu and peak_memory_gib: a cost-model change that was not
  followed by regeneration fails here (the input hash does not see code changes).

Every failure says how to regenerate.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from autoshard import evaluate, load_plan, load_problem
from autoshard.batch import SUMMARY_NAME, input_key
from autoshard.errors import InputError
from autoshard.fileio import read_document

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = REPO / "problems"
SOLUTIONS = REPO / "solutions"
REGENERATE = "solutions/ is stale: run `autoshard batch problems/ -o solutions/ --force --jobs 2`"
CHECKED = ("step_time_s", "mfu", "peak_memory_gib")
REL = 1e-9


def problem_files() -> list[Path]:
    """Top-level problem files of problems/, as `autoshard batch problems/` would find them."""
    out = []
    for p in sorted(PROBLEMS.iterdir()):
        if p.name.startswith(".") or not p.is_file() or p.suffix.lower() not in (".yaml", ".yml", ".json"):
            continue
        try:
            doc = read_document(p)
        except InputError:  # `batch` reports an unreadable file as bad input, with a record
            out.append(p)
            continue
        if isinstance(doc, dict) and "model" in doc:
            out.append(p)
    return out


PROBLEM_FILES = problem_files()


def stale(detail: str) -> None:
    pytest.fail(f"{REGENERATE}\n  ({detail})", pytrace=False)


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    # `autoshard batch problems/` runs from the repository root (paths inside problem files,
    # hf_config and catalog, are read relative to the problem file, whatever the working directory).
    monkeypatch.chdir(REPO)


def read_record(problem: Path) -> dict[str, Any]:
    path = SOLUTIONS / f"{problem.stem}.json"
    rel = f"solutions/{path.name}"
    if not path.is_file():
        stale(f"{rel} is missing for {problem.relative_to(REPO)}")
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        stale(f"{rel} is not valid JSON: {exc}")
    if not isinstance(rec, dict):
        stale(f"{rel} is not a solution record")
    return rec


def test_problems_found():
    assert PROBLEM_FILES, "no problem files in problems/"


@pytest.mark.parametrize("problem", PROBLEM_FILES, ids=lambda p: p.stem)
def test_solution_matches_input(problem: Path):
    rec = read_record(problem)
    rel = f"solutions/{problem.stem}.json"
    settings = rec.get("settings")
    if not isinstance(settings, dict) or "time_limit_s" not in settings or "top_k" not in settings:
        stale(f"{rel} has no `settings` (time_limit_s, top_k): it was not written by `autoshard batch`")
    key = input_key(problem.relative_to(REPO), settings["time_limit_s"], settings["top_k"])
    if rec.get("input_sha256") != key:
        stale(f"{rel}: input_sha256 {rec.get('input_sha256')} != {key}, the hash of "
              f"{problem.relative_to(REPO)} (its bytes, the files it names, the autoshard version, "
              f"time_limit_s={settings['time_limit_s']}, top_k={settings['top_k']}) now")


@pytest.mark.parametrize("problem", PROBLEM_FILES, ids=lambda p: p.stem)
def test_solution_matches_cost_model(problem: Path):
    rec = read_record(problem)
    rel = f"solutions/{problem.stem}.json"
    if "error" in rec:  # infeasible / bad input: nothing to re-evaluate (the hash test covers the input)
        assert "plan" not in rec
        return
    if not isinstance(rec.get("plan"), dict) or not isinstance(rec.get("estimate"), dict):
        stale(f"{rel} has neither a plan and estimate nor an error")
    est = evaluate(load_problem(problem.relative_to(REPO)), load_plan(rec["plan"]))
    stored = rec["estimate"]
    now = est.model_dump(mode="json")
    diffs = []
    for k in CHECKED:
        a, b = stored.get(k), now.get(k)
        if not (isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=REL)):
            diffs.append(f"{k}: stored {a!r}, the cost model now gives {b!r}")
    if diffs:
        stale(f"{rel}, plan `{rec.get('plan_summary')}` re-evaluated: " + "; ".join(diffs))


@pytest.mark.parametrize("problem", PROBLEM_FILES, ids=lambda p: p.stem)
def test_solver_objective_is_what_evaluate_prices(problem: Path):
    """One cost model: the plan `solve` returns is priced by `evaluate` no slower than the objective the
    solver proved (within its rounding tolerance; a tie-break may find the same family a little faster).
    Mixtral 8x7B's solution broke this (objective 5.37 s, evaluate 6.27 s): the warm start priced a
    Megatron full-recompute projection with the EP overlap that evaluate turns off beside it."""
    rec = read_record(problem)
    if "error" in rec:
        return
    objective, tol = rec["solver"]["objective_s"], rec["solver"]["rounding_tolerance_s"]
    step = rec["estimate"]["step_time_s"]
    assert step <= objective * (1 + 1e-9) + tol, (
        f"solutions/{problem.stem}.json: evaluate prices the plan at {step:.4f} s, the solver's objective is "
        f"{objective:.4f} s")


def test_no_orphan_solutions():
    """Every solutions/<name>.json belongs to a problem (a removed or renamed problem leaves one)."""
    names = {p.stem for p in PROBLEM_FILES}
    orphans = sorted(p.name for p in SOLUTIONS.glob("*.json") if p.stem not in names)
    if orphans:
        stale(f"no problem for {', '.join(orphans)}: delete them (and their .md) before regenerating")


def test_summary_lists_every_problem():
    path = SOLUTIONS / SUMMARY_NAME
    if not path.is_file():
        stale(f"solutions/{SUMMARY_NAME} is missing")
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    names = sorted(r.get("name", "") for r in rows)
    want = sorted(p.stem for p in PROBLEM_FILES)
    if names != want:
        stale(f"solutions/{SUMMARY_NAME} lists {names}, problems/ has {want}")

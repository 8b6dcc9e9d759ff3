"""The library's face is typed for its users: `py.typed` ships, and a type checker sees `load_problem`,
`evaluate` and `solve` with their real signatures (not Any), as a user's code would import them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

USER_CODE = '''
from typing import assert_type

from autoshard import Estimate, Plan, Problem, Solution, evaluate, load_problem, solve

problem = load_problem("problems/llama3-70b-640xh100.yaml")
assert_type(problem, Problem)
assert_type(evaluate(problem, Plan(tp=8, pp=4)), Estimate)
assert_type(solve(problem, time_limit_s=10.0, top_k=0), Solution)
step: float = evaluate(problem, Plan()).step_time_s
wrong: str = solve(problem).estimate.step_time_s  # a float: the checker must say so
'''


def test_py_typed_ships_with_the_package():
    assert (ROOT / "autoshard" / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["autoshard"]


@pytest.mark.slow
def test_a_type_checker_sees_the_real_signatures(tmp_path):
    pytest.importorskip("mypy")
    user = tmp_path / "user.py"
    user.write_text(USER_CODE, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "/dev/null", "--ignore-missing-imports",
                           "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"), str(user)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ": error:" in ln]
    # Exactly the one deliberate mistake: assert_type would fail on Any-typed results, and an Any
    # result would let the wrong annotation through.
    assert len(lines) == 1, proc.stdout
    assert "user.py:11:" in lines[0] and 'type "float"' in lines[0] and 'variable has type "str"' in lines[0]


@pytest.mark.slow
def test_mypy_is_clean():
    """The package type-checks with the project's mypy configuration (pyproject.toml): a regression
    anywhere in autoshard/ fails here, and CI runs it in the slow tier."""
    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "mypy", "autoshard"], cwd=repo, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]

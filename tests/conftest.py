"""Test tiers. The README's test command runs the fast tier, `-m "not slow and not launchers"`;
`.ci/run` then runs `-m slow` and `-m launchers`.

- `launchers`: everything under tests/launchers/ (the exports checked with torch, megatron-core,
  torchtitan, DeepSpeed and JAX; skipped where those are not installed).
- `slow`: a test that starts a process (its body, or a helper of its module, runs `subprocess`,
  `Popen` or `sys.executable`: interpreter start-up and imports cost 1-3 s a time), the Dask suite
  (a local cluster per test), and the solves measured at 3 s or more (SLOW below, durations from
  `pytest --durations` on a loaded 2-core machine).
"""

import ast
import functools
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPAWNS = ("subprocess.", "Popen", "sys.executable")
SLOW_MODULES = {"test_whatif_dask.py"}  # a Dask LocalCluster per test, 7-9 s each
# (module, test function): measured seconds (the slowest parameter) on the loaded machine.
SLOW = {
    ("test_solver.py", "test_solver_matches_brute_force"): 31.0,
    ("test_solver.py", "test_memory_bound_is_sound_and_binds_under_pressure"): 20.7,
    ("test_solver.py", "test_memory_tmax_is_the_least_slowest_rank_over_every_fitting_plan"): 7.4,
    ("test_solver.py", "test_solver_matches_brute_force_in_fp8"): 6.3,
    ("test_solver.py", "test_rank_cuts_keep_every_optimum"): 4.5,
    ("test_solver_search.py", "test_placements_are_rank_orders_the_launcher_sets"): 12.7,
    ("test_solver_search.py", "test_budget_is_deterministic_work_busy_or_quiet"): 11.7,
    ("test_solver_search.py", "test_candidates_are_every_valid_configuration_in_order"): 9.9,
    ("test_solver_search.py", "test_two_threads_stay_within_the_work_budget"): 9.1,
    ("test_solver_search.py", "test_same_answer_with_one_or_two_threads"): 4.4,
    ("test_framework_model.py", "test_hierarchical_dispatch_sends_a_token_once_per_remote_node"): 20.8,
    ("test_framework_model.py", "test_windowed_attention_splits_its_context_with_all_to_all_on_transformer_engine"): 13.1,
    ("test_fuzz.py", "test_load_problem_returns_a_problem_or_raises_input_error"): 4.2,
    ("test_validate.py", "test_calibration_round_trip"): 3.9,
}


@functools.cache
def _spawning_helpers(path: str) -> frozenset[str]:
    """Module-level functions of a test file that start a process."""
    src = Path(path).read_text(encoding="utf-8")
    names = set()
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
            if any(k in (ast.get_source_segment(src, node) or "") for k in SPAWNS):
                names.add(node.name)
    return frozenset(names)


def _spawns(item: pytest.Item) -> bool:
    fn = getattr(item, "function", None)
    if fn is None:
        return False
    try:
        body = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return any(k in body for k in SPAWNS) or any(f"{h}(" in body for h in _spawning_helpers(str(item.path)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        if "launchers" in path.relative_to(ROOT).parts[:2]:
            item.add_marker(pytest.mark.launchers)
            continue
        name = getattr(item, "originalname", item.name)
        if path.name in SLOW_MODULES or (path.name, name) in SLOW or _spawns(item):
            item.add_marker(pytest.mark.slow)

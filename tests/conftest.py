"""Test tiers. The README's test command runs the fast tier, `-m "not slow and not launchers"`;
`.ci/run` then runs `-m slow` and `-m launchers`.

- `launchers`: everything under tests/launchers/ (the exports checked with torch, megatron-core,
  torchtitan, DeepSpeed and JAX; skipped where those are not installed).
- `slow`: a test that starts a process (its body, or a helper of its module, runs `subprocess`,
  `Popen` or `sys.executable`: interpreter start-up and imports cost 1-3 s a time), the Dask suite
  (a local cluster per test), and the tests measured slowest (SLOW below: seconds from
  `pytest --durations` on a loaded 2-core machine; the fast tier took 98 CPU seconds before the
  second group below was marked, 58 after: 932 tests in 3 min 20 s at a load average of 7).
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
    ("test_batch_dask.py", "test_run_on_dask_closes_the_cluster_it_started_and_keeps_what_finished"): 29.0,
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
    # From a run of the fast tier (`-m "not slow and not launchers" --durations=40`) on the same loaded
    # machine, where the tier took 98 CPU seconds and 8.5 minutes: the tests of 8.8 s and more.
    ("test_whatif.py", "test_run_study_writes_results_and_report"): 31.9,
    ("test_solver_search.py", "test_top3_costs_little_more_than_top0_and_gives_distinct_families"): 22.0,
    ("test_solver_search.py", "test_megatron_plans_its_recompute_modules"): 19.7,
    ("test_reasons.py", "test_reasons_cross_a_process_boundary_with_their_fields"): 17.5,
    ("test_validate.py", "test_intervals_contain_the_stated_fraction_of_dev_residuals"): 17.3,
    ("test_whatif.py", "test_spot_goodput_falls_and_cost_falls"): 15.6,
    ("test_fuzz.py", "test_load_plan_returns_a_plan_or_raises_input_error"): 13.4,
    ("test_fuzz.py", "test_evaluate_random_plans_is_finite_and_non_negative"): 12.8,
    ("test_solver_search.py", "test_tp_in_node_and_unknown_names"): 12.5,
    ("test_solver_search.py", "test_named_alternative_is_the_restricted_optimum"): 11.2,
    ("test_validate.py", "test_modern_dev_report_by_source_and_regime"): 11.0,
    ("test_solver.py", "test_bounds_never_exceed_evaluate"): 10.5,
    ("test_validate.py", "test_full_dev_runs_report"): 9.9,
    ("test_validate.py", "test_modern_dev_json_has_regimes"): 9.6,
    ("test_reference.py", "test_placement_profiles_from_runs_equal_the_direct_computation"): 9.3,
    ("test_solver.py", "test_bounds_never_exceed_evaluate_in_fp8"): 8.8,
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

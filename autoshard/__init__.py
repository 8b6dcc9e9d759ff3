"""autoshard: find the fastest way to parallelize LLM training that fits, and what it costs.

Library entry points (typed, no global state):

    from autoshard import load_problem, evaluate, solve, Plan
    problem = load_problem("problems/llama3-70b-640xh100.yaml")
    estimate = evaluate(problem, Plan(tp=8, pp=4, zero_stage=1))
    solution = solve(problem, time_limit_s=30)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

from .errors import AutoshardError, InfeasibleError, InputError
from .loader import load_plan, load_problem
from .spec import ModelSpec, Plan, Problem, SearchSpec, TopologyLevel, TrainingSpec, ClusterSpec

__all__ = [
    "__version__", "AutoshardError", "InfeasibleError", "InputError", "load_plan", "load_problem",
    "ModelSpec", "Plan", "Problem", "SearchSpec", "TopologyLevel", "TrainingSpec", "ClusterSpec",
    "evaluate", "Estimate", "solve", "Solution",
]

# What type checkers see (typed signatures, not Any); at run time `__getattr__` imports them on first
# use. `compare` stays in `autoshard.compare` (a function of that name here would be replaced by the
# submodule on its first import).
if TYPE_CHECKING:
    from .cost import Estimate, evaluate
    from .solver import Solution, solve


def __getattr__(name: str) -> object:  # lazy: keep `import autoshard` light (no CP-SAT import until solving)
    if name in ("evaluate", "Estimate"):
        from . import cost
        return getattr(cost, name)
    if name in ("solve", "Solution"):
        from . import solver
        return getattr(solver, name)
    raise AttributeError(name)

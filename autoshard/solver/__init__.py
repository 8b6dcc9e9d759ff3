"""Find the plan with the minimum step time that fits: numpy bounds + CP-SAT.

The decision space splits in two:

- **Global knobs** (tp, cp, ep, pp, dp, vpp, sequence parallel, ZeRO stage, micro-batch,
  schedule, placement of the mesh axes). `candidates()` enumerates the combinations the
  divisibility rules and `search:` allow; `bounds()` computes, vectorized with numpy over
  all of them, a sound lower bound on step time (compute at the achievable matmul rate,
  perfectly balanced stages, the schedule's warm-up and cool-down) and on peak memory
  (everything recomputed, ZeRO sharding applied). Candidates whose memory bound exceeds
  HBM are pruned; the rest are ordered by their time bound refined with the recompute HBM
  forces (`bounds._forced_tmax`, a convex-hull relaxation of `_memory_tmax`), refined lazily
  in that order (`bounds.RefinedOrder`: only as far as the search reads).
- **The combinatorial core** (`StageModel`, a CP-SAT model): for one global configuration,
  how many layers of each kind (dense, MoE) every virtual pipeline stage holds (contiguous,
  uneven allowed, dense layers first) and which recompute mode each layer uses, subject to
  HBM on every rank, minimizing the evaluator's step time: pipeline time with warm-up and
  cool-down, plus the slowest rank's data-parallel tail. All coefficients come from
  `cost.layer_table`, the same numbers `evaluate` sums; seconds are scaled to integer
  units of 0.1 us, bytes to KiB (rounded up, so a plan the model accepts always fits).

Branch and bound ties them together (`_Search`):

1. A warm start (`_warm_start`, no CP-SAT) builds real plans on the most promising
   configurations: greedy per-rank recompute mixes, then memory-aware stage splits.
2. Candidates are visited in order of their (refined) numpy bound; the search stops when the next
   bound cannot beat the incumbent. Each surviving configuration meets, in order of cost,
   the bound of its optimistic table (every group on consecutive GPUs: valid for every
   placement), the same with the recompute HBM forces (`_memory_tmax`), and per placement
   its exact table bound; only then CP-SAT, with the incumbent as a cutoff.
3. A proof stopped by its per-solve cap keeps its proven bound and is resumed at the end
   with the work left. CP-SAT runs as a descent (first solution under the cutoff, then a lower
   cutoff), so a configuration is closed as soon as nothing is left under the incumbent less the
   gap limit, without proving its own optimum.

`OPTIMAL` therefore means every candidate was either pruned by a sound bound or closed by
CP-SAT (nothing under the cutoff, or solved to optimality) (tests check every bound against `evaluate`, and the optimum against
brute-force enumeration). Every returned plan is re-evaluated with `evaluate`, and the
CP-SAT objective must match it to within the rounding.

Determinism: the budget is deterministic work (CP-SAT deterministic time, at its measured CPU rate
`search.CP_SAT_WORK_PER_DET`, plus counted Python work:
candidates, warm-start configurations, visits, memory bounds, placement tables, stage models;
`search.UNIT_*`), the wall-clock limit only a safety net that reports itself (`SolverStats.
limit_fired`, `stopped_by`, `prove_command`); candidates are enumerated in a fixed order, each CP-SAT solve runs
single-threaded with a fixed seed (two placements' descents may run in two threads, from the same
incumbent, merged in order), ties are broken by a second CP-SAT pass (fewest recomputed
layers, then layers as early as possible) and by candidate order. `SolverStats.fingerprint`
hashes the problem, the versions and the budget.

Alternatives (`families`): the best plan of each of the K best families (degrees and schedule
kind) other than the chosen plan's, from the same search; families within 0.5% of each other share
one line naming what differs.

Runnable: candidates and placements pass `cost.launch_reasons` (the launchers' rank orders, ZeRO
beside a pipeline), the predicate `evaluate --strict`, `compare` and `export` use. Headroom: the
search keeps `search.DEFAULT_HEADROOM_FRACTION` of HBM free unless the problem sets
`search.headroom_gib` (docs/solver.md); the answer is evaluated on the problem as given.

The package, by part: `candidates` (the declared space, placements), `bounds` (numpy and
table bounds), `stage_model` (the CP-SAT model), `warm_start` (greedy plans), `search` (branch
and bound, budget, `solve`), `families` (plan families, named alternatives), `explain` (plan
differences, infeasibility), `records` (what `solve` returns).
"""

from __future__ import annotations

from .bounds import (
    _memory_tmax,
    _optimistic_table,
    _stage_extras,
    _summary,
    _table_bound,
    _tail_bound,
    _zero3_lower_bound,
    balanced_max,
    bounds,
)
from .candidates import DEFAULT_MAX_VPP, DEFAULT_MBS, _config_key, _placements, _space, _with_placement, candidates
from .explain import describe_difference, explain_infeasible, explain_no_candidates, run_length
from .records import Alternative, Solution, SolverStats
from .families import family_key, family_name, named
from .search import DEFAULT_WORK_LIMIT, RUNNER_UP_CONFIGS, RUNNER_UP_SLOWER, _Budget, _Found, _Search, fingerprint, solve
from .stage_model import MEM_UNIT_BYTES, TIME_UNIT_S, StageModel, _b, _rounding_tolerance, _t
from .warm_start import WARM_SPLIT_CONFIGS, WARM_START_CONFIGS, _Greedy, _warm_start

__all__ = [
    "Alternative", "Solution", "SolverStats", "StageModel", "balanced_max", "bounds", "candidates",
    "describe_difference", "explain_infeasible", "explain_no_candidates", "run_length", "solve",
    "DEFAULT_MBS", "DEFAULT_MAX_VPP", "TIME_UNIT_S", "MEM_UNIT_BYTES", "DEFAULT_WORK_LIMIT", "family_key",
    "family_name", "fingerprint",
]

"""What-if studies of hardware purchases: time, money and energy to train one or more models.

A study file names workloads (model + training setup + token budget), candidate hardware
options (GPU type x count x topology / network tier, with ranges to sweep), prices (cloud
$/GPU-hour, or capex + power) and constraints (budget, power cap, deadline). `run_study`
solves the best plan of every option (in parallel), adds goodput (failures, checkpoints,
restarts), cost and energy, sensitivities to faster hardware, the Pareto front of time vs
cost, and a purchase decision made with CP-SAT; it writes `results.json`, `results.csv`,
`report.md`, `report.html` and PNG plots. The options are solved by a local process pool, or
(`executor="dask"`, the `autoshard[dask]` extra) on a Dask cluster for sweeps larger than one machine.

Assumptions (all overridable in the study file, all written into results.json):

- Time to train = steps x step time / goodput, steps = ceil(tokens / tokens per step).
- Goodput (Meta's "effective training-time ratio"): failures arrive at a per-GPU rate
  (default from the Llama 3 paper: 419 unexpected interruptions in 54 days on 16,384 H100s),
  so the cluster MTBF is M = 1 / (rate x GPUs). Checkpoints of C bytes (14 B/param) are written
  at the storage bandwidth in delta seconds, every tau = sqrt(2 M delta) seconds of work
  (Young 1974; Daly 2006 to first order). Each failure costs the restart time R plus on average
  half an interval of lost work; the useful fraction of wall time is
  (1 - (R + (tau + delta) / 2) / M) / (1 + delta / tau), which falls as the cluster grows. On
  spot capacity preemptions (default 3.42e-5 per GPU-hour) add to the failure rate. Goodput is
  that ratio times (1 - other_loss_fraction), losses outside the cost model (default 0).
  Efficiency as seed 002 defines it: useful tokens/s over the cluster's peak = MFU x goodput.
- Power per GPU (power_figure `catalog`) = TDP + node overhead (CPUs, NICs, switches, fans;
  default 30% of TDP, 10% for GB200 whose catalog TDP is already a rack share), or the catalog's
  `system_power_w` of another source (`seeds`: GB200 NVL72 at 132 kW per rack); facility power =
  GPUs x that x PUE; energy = facility power x wall-clock hours (GPUs taken at full power
  throughout: an upper bound). Each recommendation is also given under the other figures.
- Cloud cost = $/GPU-hour x GPUs x wall-clock hours (power included in the rate); spot: the
  same less `spot_discount` (default 70%, seed 003).
  Owned cost = capex x training days / (amortization years x 365) + energy x $/kWh, with capex =
  GPUs x purchase price (catalog: per GPU incl. its server share) + nodes x $/node + scale-out
  ports x $/port. One purchase per option; a mix of GPU types is a `fleet:` of pools (`fleet`).

Public API: `load_study`, `run_study`, `optimize_purchase`, `pareto_front`, `goodput`,
`young_daly_interval_s`, `solve_option`, `sensitivities`.

The parts: `schema` (the study file and its expansion), `goodput` (failures, checkpoints,
restarts), `sensitivity` (one option's best plan and its sensitivity to faster hardware),
`pricing` (cost, capex, power, energy), `purchase` (Pareto front and the CP-SAT choice),
`runner` (local / Dask executors, rows, results files) and `report` (report.md, report.html, PNGs).

SIGTERM during `run_study` is handled like Ctrl-C (`Terminated`, a KeyboardInterrupt; the command
line exits 143): the finished options are written, the workers stop without tracebacks.
"""

from .goodput import Goodput, failure_rate, goodput, reliability_defaults, young_daly_interval_s
from .pricing import (
    NODE_OVERHEAD_FRACTION,
    NODE_OVERHEAD_FRACTION_GPU,
    USD_PER_PORT_PER_GB_S,
    default_notes,
    node_overhead_w,
    port_price_usd,
    price_option,
)
from .purchase import (
    Candidate,
    Decision,
    explain_decision,
    optimize_purchase,
    pareto_front,
    resolve_objective,
    violations,
)
from ..dask_run import DASK_EXTRA_HINT
from .runner import (
    CSV_COLUMNS,
    EXECUTORS,
    TIMING_FIELDS,
    ProgressFn,
    ProgressLine,
    StudyResult,
    Task,
    Terminated,
    _execute,
    results_csv,
    run_study,
    run_task,
)
from .schema import (
    AMORTIZATION_YEARS,
    DEFAULT_TIME_LIMIT_S,
    PUE,
    SCHEMA_VERSION,
    USD_PER_KWH,
    ConstraintSpec,
    NetworkSpec,
    Option,
    OptionSpec,
    PricingSpec,
    RangeSpec,
    ReliabilitySpec,
    Study,
    StudySpec,
    Workload,
    WorkloadSpec,
)
from .study import load_study
from .sensitivity import HBM_SIBLING, SLOWDOWN, SolvedOption, levels_problem, sensitivities, solve_option

__all__ = [
    "AMORTIZATION_YEARS", "CSV_COLUMNS", "DASK_EXTRA_HINT", "DEFAULT_TIME_LIMIT_S", "EXECUTORS", "HBM_SIBLING",
    "NODE_OVERHEAD_FRACTION", "NODE_OVERHEAD_FRACTION_GPU", "PUE", "SCHEMA_VERSION", "SLOWDOWN", "TIMING_FIELDS",
    "USD_PER_KWH", "USD_PER_PORT_PER_GB_S", "Candidate", "ConstraintSpec", "Decision", "Goodput", "NetworkSpec",
    "Option", "OptionSpec", "PricingSpec", "ProgressFn", "ProgressLine", "RangeSpec", "ReliabilitySpec", "SolvedOption", "Study",
    "StudyResult", "StudySpec", "Task", "Terminated", "Workload", "WorkloadSpec", "default_notes", "explain_decision",
    "failure_rate", "goodput", "load_study", "node_overhead_w", "optimize_purchase", "pareto_front",
    "port_price_usd", "price_option", "reliability_defaults", "resolve_objective", "results_csv", "run_study",
    "run_task", "sensitivities", "solve_option", "violations", "young_daly_interval_s", "_execute",
    "levels_problem",
]

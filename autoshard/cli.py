"""The `autoshard` command line.

Exit codes: 0 ok; 1 the plan does not fit / no feasible plan; 2 bad input (one line on
stderr: file, field path, what is wrong; also an output path that is an input, and a closed
standard output); 3 internal error; 130 interrupted (SIGINT, honoured even when inherited as
ignored). See docs/faults.md, "What is guaranteed". `--json` prints one JSON object
on stdout; progress and warnings go to stderr.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from . import __version__
from .errors import AutoshardError, InfeasibleError, InputError, InternalError, is_input_overflow
from .fileio import atomic_write, dumps_json, guard_output, read_document, same_file
from .spec import DEFAULT_GAP_LIMIT, DEFAULT_TIME_LIMIT_S, DEFAULT_WORK_LIMIT

EXIT_OK, EXIT_INFEASIBLE, EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# AUTOSHARD_DEBUG=1 lets an internal error (exit 3) raise with its traceback, for a bug report.
DEBUG_ENV = "AUTOSHARD_DEBUG"


class Command(NamedTuple):
    """One subcommand: its handler, the function that adds its arguments, its one-line help."""

    name: str
    run: Callable[[argparse.Namespace], int]
    add_args: Callable[[argparse.ArgumentParser], None]
    help: str


COMMANDS: dict[str, Command] = {}  # by name; `cli_parser` adds them in COMMAND_ORDER


def command(name: str, help_: str, add_args: Callable[[argparse.ArgumentParser], None],
            ) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register `autoshard NAME`: the decorated handler, beside the function that adds its arguments."""
    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = Command(name, run, add_args, help_)
        return run
    return register


def _print_json(obj: Any) -> None:
    sys.stdout.write(dumps_json(obj))


def _write_or_print(text: str, out: str | None) -> None:
    if out:
        try:
            atomic_write(out, text)
        except OSError as exc:
            raise InputError(f"cannot write: {exc.strerror or exc}", source=out, field="--output") from None
    else:
        sys.stdout.write(text)


def _flush_stdout() -> None:
    """Flush stdout now, so that a failed write (`> /dev/full`, a closed pipe) is one line here
    rather than a traceback at interpreter exit; the unwritten rest goes to /dev/null."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        _silence_stdout()
        raise InputError(f"cannot write: {exc.strerror or exc}", source="<stdout>") from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that what could not be written is not retried at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def parse_bytes(text: str) -> float:
    """`1e9`, `33.5MB`, `1GiB`, `512 KiB` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtT]i?)?[bB]?\s*", text)
    if not m:
        raise InputError(f"not a byte count: {text!r} (examples: 1e9, 33.5MB, 1GiB)", field="BYTES")
    value, unit = float(m.group(1)), (m.group(2) or "").lower()
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}[unit]
    if not math.isfinite(value * scale) or value * scale > MAX_BYTES:
        raise InputError(f"{text.strip()} is larger than the {MAX_BYTES:.3g} bytes allowed", field="BYTES")
    if value <= 0:
        raise InputError("the byte count must be positive", field="BYTES")
    return value * scale


MAX_BYTES = 2.0**60  # 1 EiB: larger than any collective, and its time stays finite


def _check_limits(a: argparse.Namespace) -> None:
    """Bad option values are bad input (exit 2), not an infeasible problem."""
    limit = getattr(a, "time_limit", None)
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise InputError(f"must be a number of seconds > 0, got {limit:g}", field="--time-limit")
    work = getattr(a, "work_limit", None)
    if work is not None and not (math.isfinite(work) and work > 0):
        raise InputError(f"must be a positive amount of work, got {work:g}", field="--work-limit")
    top = getattr(a, "top", None)
    if top is not None and top < 0:
        raise InputError(f"must be >= 0, got {top}", field="--top")
    gap = getattr(a, "gap", None)
    if gap is not None and not (math.isfinite(gap) and 0 <= gap < 1):
        raise InputError(f"must be a fraction in [0, 1), got {gap:g}", field="--gap")
    if getattr(a, "output", None) == "":
        raise InputError("must be a file or folder name, got an empty string", field="--output")


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_out_dir(path: str) -> None:
    """Fail before any work when the output directory cannot be created or written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError("output path exists and is not a directory", source=path)
    probe = _nearest_existing(p)
    if not probe.is_dir():
        raise InputError(f"cannot create the output directory: {probe} is not a directory", source=path)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"cannot create the output directory: {probe} is not writable", source=path)


# ---- plans -------------------------------------------------------------------------------

def check_plan(problem: Any, plan: Any, source: str | None, root: str = "", problem_source: str | None = None) -> None:
    """An invalid plan (degrees that do not divide, a knob its framework lacks: `cost.config_reasons`)
    is bad input: one InputError naming the file, the field of the first reason (`cost.Reason.field`)
    and every reason.
    A plan that is valid but does not fit is not checked here (`evaluate` exits 1 for it)."""
    from .cost import config_reasons  # noqa: PLC0415

    _, reasons = config_reasons(problem, plan)
    if not reasons:
        return
    field = getattr(reasons[0], "field", None)  # a cost.Reason names its field; a plain str names none
    what = "invalid plan: "
    if field and field.startswith("training."):  # about the problem (its framework, its training settings)
        source, what = problem_source or source, ""
    else:
        field = ".".join(x for x in (root, field) if x) or None
    raise InputError(what + "; ".join(reasons), source=source, field=field)


def plan_from_argument(text: str) -> tuple[Any, str, str]:
    """(plan, its source for messages, the field path of the plan in that source) of a --plan value:
    a plan file, a problem or solution file with a `plan:` section, or inline `tp=8,pp=4,...`."""
    from .compare import plan_argument  # noqa: PLC0415

    plan = plan_argument(text)
    if not Path(text).exists():
        return plan, "--plan", ""
    doc = read_document(text)
    return plan, text, "plan" if isinstance(doc, dict) and isinstance(doc.get("plan"), dict) else ""


# ---- commands ----------------------------------------------------------------------------


def _add_evaluate_args(e: argparse.ArgumentParser) -> None:
    """`autoshard evaluate`'s arguments."""
    e.add_argument("problem", metavar="PROBLEM")
    e.add_argument("--plan", metavar="PLAN", help="plan file (YAML/JSON, or a solution JSON / YAML) or inline "
                   "tp=8,pp=4,...; default: the problem's `plan:`")
    e.add_argument("--json", action="store_true")
    e.add_argument("--strict", action="store_true",
                   help="exit 1 when the framework's launcher would refuse the plan (rank order, ZeRO beside a "
                        "pipeline: `launch_reasons` in --json); without it the plan is priced and flagged")
    e.add_argument("--headroom", type=float, default=None, metavar="GIB", help="HBM (GiB per GPU) the plan must leave free, on top of the 2 GiB reserve (default: the problem's `search: {headroom_gib: X}`, else 0)")


@command("evaluate", "Step time, MFU and per-stage memory of a given plan.",
         _add_evaluate_args)
def cmd_evaluate(a: argparse.Namespace) -> int:
    from .cost import evaluate  # noqa: PLC0415
    from .loader import load_plan, load_problem, with_headroom  # noqa: PLC0415
    from .render import estimate_text  # noqa: PLC0415

    problem = with_headroom(load_problem(a.problem), a.headroom)
    if a.plan:  # a plan file (or a problem / solution with `plan:`) or inline tp=8,pp=4 (as `compare`)
        plan, plan_file, root = plan_from_argument(a.plan)
    else:
        doc = read_document(a.problem)
        if not isinstance(doc, dict) or "plan" not in doc:
            raise InputError("no --plan given and the problem file has no `plan:` section", source=a.problem)
        plan, plan_file, root = load_plan(a.problem), a.problem, "plan"
    check_plan(problem, plan, plan_file, root, a.problem)  # invalid: bad input (exit 2), as in `compare`
    est = evaluate(problem, plan)
    refused = launch_refusals(problem, plan)  # priced, but its framework's launcher would refuse it
    if a.json:
        _print_json({**est.model_dump(mode="json"), "launchable": not refused, "launch_reasons": refused})
    else:
        if refused:
            print(f"NOT LAUNCHABLE by {problem.framework}: " + "; ".join(refused))
        sys.stdout.write(estimate_text(problem, est, reasons=False))
        print(f"launch: {'refused (' + str(len(refused)) + ' reason' + 's' * (len(refused) > 1) + ')' if refused else 'accepted'}"
              f" by {problem.framework}'s launcher")
    for reason in est.reasons:  # why the plan does not fit: stderr, naming the plan's file
        print(f"autoshard: infeasible: {plan_file}: {reason}", file=sys.stderr)
    for reason in refused:
        print(f"autoshard: {'error' if a.strict else 'warning'}: {plan_file}: not launchable: {reason}",
              file=sys.stderr)
    if not est.fits or (refused and a.strict):
        return EXIT_INFEASIBLE
    return EXIT_OK


def launch_refusals(problem: Any, plan: Any) -> list[str]:
    """Why the problem's framework would refuse to launch `plan` (`cost.launch_reasons`: rank order,
    ZeRO beside a pipeline); empty when it launches. The one predicate `evaluate`, `compare`, `export`
    and the solver share."""
    from .cost import launch_reasons  # noqa: PLC0415

    return [str(r) for r in launch_reasons(problem, plan)]


RECORD_SUFFIXES = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}  # `solve -o`: else the Markdown report


def solution_file_text(path: str, record: dict[str, Any], markdown: str) -> str:
    """What `solve -o PATH` writes: the machine record as JSON (.json) or YAML (.yaml / .yml: the
    same content, so `evaluate --plan` and `export` read either), else the Markdown report."""

    kind = RECORD_SUFFIXES.get(Path(path).suffix.lower())
    if kind == "JSON":
        return dumps_json(record)
    if kind == "YAML":
        import json  # noqa: PLC0415

        import yaml  # noqa: PLC0415

        return ("# autoshard solution record (the same content as `autoshard solve --json`)\n"
                + yaml.safe_dump(json.loads(dumps_json(record)), sort_keys=False, allow_unicode=True, width=120))
    return markdown


def _named_paths(problem_file: str) -> list[str]:
    """The files a problem file names (`model.hf_config`, `cluster.catalog`), resolved against its
    folder: inputs of the command as much as the problem file itself."""
    from .loader import file_folder, problem_paths, resolve_path  # noqa: PLC0415

    try:
        doc = read_document(problem_file)
    except InputError:
        return []
    return [resolve_path(v, file_folder(problem_file)) for _, v in problem_paths(doc) if isinstance(v, str)]


def _add_solve_args(s: argparse.ArgumentParser) -> None:
    """`autoshard solve`'s arguments."""
    s.add_argument("problem", metavar="PROBLEM", help="problem file (YAML or JSON)")
    s.add_argument("--json", action="store_true", help="print the solution as one JSON object")
    s.add_argument("-o", "--output", metavar="FILE",
                   help="write the solution: .json the machine record (as --json), .yaml / .yml the same record "
                        "in YAML, any other name the Markdown report")
    s.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help=f"wall-clock safety net in seconds (default {DEFAULT_TIME_LIMIT_S:g}); the budget is --work-limit, "
                        "so the answer does not depend on the machine unless this fires (the report's first lines "
                        "say so; --json: solver.limit_fired 'wall')")
    s.add_argument("--work-limit", type=float, default=None, metavar="W",
                   help="search budget in deterministic work units: CP-SAT's deterministic time plus counted "
                        "Python work (candidates, bounds, stage models), about a second of one core each "
                        f"(default {DEFAULT_WORK_LIMIT:g}); --json: solver.limit_fired 'work' when it stops the proof")
    s.add_argument("--top", type=int, default=3, metavar="K",
                   help="the best plan of each of the K best families (degrees tp, cp, ep, pp and the schedule) other "
                        "than the chosen plan's, from the same search (default 3; 0 skips it)")
    s.add_argument("--alternatives", metavar="NAMES",
                   help="named alternatives, comma-separated: no-cp, no-pp, no-ep, tp-in-node, ep-in-node, "
                        "ep-across-nodes, 1f1b, even-stages, no-recompute, or a fixed degree such as tp8 (each the best "
                        "plan under that restriction)")
    s.add_argument("--compare", metavar="PLAN",
                   help="also explain, term by term, how the chosen plan differs from this one (a plan file or "
                        "inline tp=8,pp=4,...)")
    s.add_argument("--quiet", action="store_true", help="no live progress on stderr (it is drawn only on a terminal)")
    s.add_argument("--gap", type=float, default=DEFAULT_GAP_LIMIT, metavar="G",
                   help="relative optimality gap that counts as OPTIMAL (default 0.001; 0 = exact proof)")
    s.add_argument("--robust", action="store_true",
                   help="choose, among the optimum and its alternatives, the plan whose 80%% prediction "
                        "interval has the lowest upper end (the least bad case the validation residuals allow)")
    s.add_argument("--hf-config", metavar="CONFIG_JSON", help="take the model from a Hugging Face config.json")
    s.add_argument("--headroom", type=float, default=None, metavar="GIB", help="HBM (GiB per GPU) the plan must leave free, on top of the 2 GiB reserve (default: the problem's `search: {headroom_gib: X}`, else 0)")


@command("solve", "Find the minimum-step-time plan that fits (CP-SAT), with proof of optimality.",
         _add_solve_args)
def cmd_solve(a: argparse.Namespace) -> int:
    from .loader import load_problem, with_headroom  # noqa: PLC0415
    from .render import estimate_text, solution_markdown, solution_record  # noqa: PLC0415
    from .solver import solve  # noqa: PLC0415

    problem = with_headroom(load_problem(a.problem), a.headroom)
    if a.hf_config:
        from .catalog import not_a_fifo  # noqa: PLC0415
        from .hf import model_from_hf_config  # noqa: PLC0415

        not_a_fifo(a.hf_config)
        problem = problem.model_copy(update={"model": model_from_hf_config(a.hf_config)})
    if a.output:  # never an input (the problem, the files it names, --hf-config, --compare's plan file)
        guard_output(a.output, [a.problem, a.hf_config, a.compare, problem.cluster.catalog,
                                *_named_paths(a.problem)])
        try:
            Path(a.output).resolve().parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create the output directory: {exc.strerror or exc}", source=a.output,
                             field="--output") from None
    try:
        from .progress import solve_progress  # noqa: PLC0415

        with solve_progress(a.quiet or a.json, Path(a.problem).stem) as progress:
            sol = solve(problem, time_limit_s=a.time_limit, top_k=a.top, gap_limit=a.gap, work_limit=a.work_limit,
                        alternatives=[x.strip() for x in (a.alternatives or "").split(",") if x.strip()],
                        progress=progress)
        point = None  # the point-estimate solution, under --robust (what solver.status / objective are about)
        if getattr(a, "robust", False):
            from .solver.robust import robust_choice  # noqa: PLC0415

            point, sol = sol, robust_choice(sol)
    except InfeasibleError as exc:
        if a.json:
            _print_json({"status": "INFEASIBLE", "reason": exc.reason, "suggestions": exc.suggestions})
        print(f"{a.problem}: infeasible: {exc}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except InputError as exc:  # (a `search:` field the framework cannot run: the problem file's)
        raise exc.at(a.problem) from None
    record = solution_record(a.problem, problem, sol, point=point)
    from .batch import record_problem_paths  # noqa: PLC0415

    record_problem_paths(record, a.problem)
    if a.hf_config:  # the model is not the problem file's: `export` rebuilds the problem from both
        record["problem"]["hf_config"] = os.path.abspath(a.hf_config)
    comparison = None
    if a.compare:  # why the chosen plan beats the user's (`autoshard compare`)
        from .compare import compare  # noqa: PLC0415

        mine, source, root = plan_from_argument(a.compare)
        check_plan(problem, mine, source if source != "--plan" else "--compare", root, a.problem)
        comparison = compare(problem, mine, sol.plan)
        record["compare"] = {"plan": comparison.a.plan.model_dump(mode="json"),
                             **comparison.model_dump(mode="json", exclude={"a", "b"})}
    if a.output:
        _write_or_print(solution_file_text(a.output, record, solution_markdown(problem, sol, point)), a.output)
    if a.json:
        _print_json(record)
    else:
        notice = limit_notice(sol, a.problem)
        if notice:
            print(notice)
        sys.stdout.write(estimate_text(problem, sol.estimate))
        st = sol.solver
        from .render import (alternative_line, alternatives_note_line, dualpipe_line, robust_text,  # noqa: PLC0415
                             solver_status_text)

        print(f"solver: {solver_status_text(sol, point)} in {st.solve_time_s:.2f} s (gap {100 * (st.gap or 0):.2f}%), "
              f"{st.candidates} candidate configurations, {st.pruned_by_memory} pruned by memory, "
              f"{st.pruned_by_bound} by bound, {st.cp_sat_solves} CP-SAT solves")
        if st.dualpipe_plans:
            print(dualpipe_line(st))
        print(f"memory headroom kept by the search: {st.headroom_gib:g} GiB per GPU beside each stage's free memory "
              + ("(default: 5% of HBM, the memory model's measured error; --headroom 0 for the edge)"
                 if st.headroom_default else "(search.headroom_gib / --headroom)"))
        if point is not None:
            print(robust_text(point, sol))

        for alt in sol.alternatives:
            print(alternative_line(sol.estimate, alt))
        if note := alternatives_note_line(sol):
            print(note)
        if comparison is not None:
            from .compare import comparison_text  # noqa: PLC0415

            sys.stdout.write("\n" + comparison_text(comparison))
    return EXIT_OK


def limit_notice(sol: Any, problem_path: str) -> str:
    """The report's first lines when a limit stopped the search: which, the proven gap, and the command
    that proves the optimum (`SolverStats.prove_command`); empty when the search ended by itself."""
    import shlex  # noqa: PLC0415

    st = sol.solver
    if not st.limit_fired:
        return ""
    what = ("the wall-clock safety net (--time-limit) stopped the search: the answer may depend on this "
            "machine's load" if st.limit_fired == "wall" else
            f"the work budget ({st.work_limit:g} units) stopped the proof")
    args = [a for a in sys.argv[1:]]
    flag = st.prove_command.split()[0]
    if flag in args:  # replace the value given
        i = args.index(flag)
        args[i:i + 2] = st.prove_command.split()
    else:
        args += st.prove_command.split()
    cmd = shlex.join(["autoshard", *args]) if args and args[0] == "solve" else \
        shlex.join(["autoshard", "solve", problem_path, *st.prove_command.split()])
    return (f"LIMIT FIRED ({st.limit_fired}): {what}; {st.status}, proven gap {100 * (st.gap or 0):.2f}%.\n"
            f"To prove the optimum: {cmd}")


def _plan_label(arg: str, index: int) -> str:
    """How `compare` names a --plan: a file by its stem, a short inline plan by itself, else A / B."""
    if Path(arg).suffix in (".yaml", ".yml", ".json"):
        return Path(arg).stem
    return f"plan {arg}" if len(arg) < 40 else f"plan {'AB'[index]}"


def _add_compare_args(cm: argparse.ArgumentParser) -> None:
    """`autoshard compare`'s arguments."""
    cm.add_argument("problem", metavar="PROBLEM")
    cm.add_argument("--plan", action="append", metavar="PLAN",
                    help="a plan file (YAML/JSON, a solution JSON) or inline tp=8,pp=4,...; once: against the "
                         "solver's chosen plan; twice: the two plans; none: the problem's `plan:` against the chosen")
    cm.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                    help=f"solver safety net (default {DEFAULT_TIME_LIMIT_S:g})")
    cm.add_argument("--json", action="store_true")
    cm.add_argument("--quiet", action="store_true", help="no live progress on stderr")


@command("compare", "Why one plan is faster than another: both evaluated, the step-time difference "
                    "decomposed term by term and the memory by component, one sentence per term.",
         _add_compare_args)
def cmd_compare(a: argparse.Namespace) -> int:
    from .compare import compare, comparison_text, plan_argument  # noqa: PLC0415
    from .loader import load_problem  # noqa: PLC0415

    problem = load_problem(a.problem)
    if len(a.plan or []) > 2:
        raise InputError(f"at most two plans, got {len(a.plan)}", field="--plan")
    plans = []
    for x in a.plan or []:  # an invalid plan is bad input naming its file and field (as in `evaluate`)
        plan, source, root = plan_from_argument(x)
        check_plan(problem, plan, source, root, a.problem)
        plans.append(plan)
    labels = [_plan_label(x, i) for i, x in enumerate(a.plan or [])]
    for x, plan in zip(a.plan or [], plans):
        for reason in launch_refusals(problem, plan):
            print(f"autoshard: warning: {x}: not launchable: {reason}", file=sys.stderr)
    if len(labels) == 2 and labels[0] == labels[1]:
        labels = [f"{lab} (A)" if i == 0 else f"{lab} (B)" for i, lab in enumerate(labels)]
    if not plans:  # the problem's own `plan:` (as `evaluate`)
        doc = read_document(a.problem)
        if not isinstance(doc, dict) or "plan" not in doc:
            raise InputError("no --plan given and the problem file has no `plan:` section", source=a.problem)
        plans, labels = [plan_argument(a.problem)], ["the problem's plan"]
        check_plan(problem, plans[0], a.problem, "plan", a.problem)
    if len(plans) == 1:  # against the solver's choice
        from .progress import solve_progress  # noqa: PLC0415
        from .solver import solve  # noqa: PLC0415

        try:
            with solve_progress(a.quiet or a.json, Path(a.problem).stem) as progress:
                sol = solve(problem, time_limit_s=a.time_limit, top_k=0, progress=progress)
        except InfeasibleError as exc:
            print(f"{a.problem}: infeasible: {exc}", file=sys.stderr)
            return EXIT_INFEASIBLE
        plans.append(sol.plan)
        labels.append("the chosen plan")
    comparison = compare(problem, plans[0], plans[1], labels[0], labels[1])
    if a.json:
        _print_json(comparison.model_dump(mode="json"))
    else:
        sys.stdout.write(comparison_text(comparison))
    return EXIT_OK


def _add_collective_args(c: argparse.ArgumentParser) -> None:
    """`autoshard collective`'s arguments."""
    c.add_argument("op", choices=["all_gather", "reduce_scatter", "all_reduce", "all_to_all",
                                  "all-gather", "reduce-scatter", "all-reduce", "all-to-all"], metavar="OP",
                   help="all_gather | reduce_scatter | all_reduce | all_to_all")
    c.add_argument("bytes", metavar="BYTES", help="message size: total gathered / reduced bytes (all_to_all: sent per GPU)")
    c.add_argument("--cluster", required=True, metavar="PRESET", help="topology preset, e.g. dgx-h100-superpod")
    c.add_argument("--gpus", required=True, type=int, metavar="N", help="GPUs in the group (consecutive ranks)")
    c.add_argument("--gpu", metavar="GPU", help="GPU type (for its network efficiency; default h100-sxm)")
    c.add_argument("--raw", action="store_true",
                   help="price at the raw link rates (default: the GPU's achievable-bandwidth efficiencies, as the "
                        "solver applies them)")
    c.add_argument("--efficiency", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old scripts
    c.add_argument("--json", action="store_true")


@command("collective", "Time of one collective on a cluster preset (ring and tree formulas level by level, as the solver prices them).",
         _add_collective_args)
def cmd_collective(a: argparse.Namespace) -> int:
    import dataclasses  # noqa: PLC0415

    from .catalog import get_gpu, get_topology  # noqa: PLC0415
    from .schema_errors import validate  # noqa: PLC0415
    from .spec import ClusterSpec  # noqa: PLC0415
    from .topology import cluster_graph, collective_s, contiguous_profile, resolve_levels  # noqa: PLC0415

    nbytes = parse_bytes(a.bytes)
    if a.gpus < 1:
        raise InputError("must be >= 1", field="--gpus")
    get_topology(a.cluster)
    gpu = get_gpu(a.gpu) if a.gpu else get_gpu("h100-sxm")
    try:
        cluster = validate(ClusterSpec, {"gpu": gpu.id, "num_gpus": a.gpus, "topology": a.cluster})
    except InputError as exc:  # e.g. more GPUs than any cluster: name the option, not the schema field
        raise InputError(exc.message, field="--gpus" if exc.field == "num_gpus" else exc.field) from None
    levels = resolve_levels(cluster, gpu)
    raw = bool(getattr(a, "raw", False))
    if raw:
        levels = tuple(dataclasses.replace(lv, bytes_per_s=lv.link_bytes_per_s) for lv in levels)
    prof = contiguous_profile(cluster_graph(levels, a.gpus), a.gpus)
    t = collective_s(a.op.replace("-", "_"), levels, prof, nbytes)
    if not math.isfinite(t):
        raise InputError(f"the time of {nbytes:g} B is not a finite number; give a smaller size", field="BYTES")
    algbw = nbytes / t if t > 0 else None  # one GPU: nothing moves
    factor = {"all_reduce": 2 * (a.gpus - 1) / a.gpus}.get(a.op.replace("-", "_"), (a.gpus - 1) / a.gpus)
    eff = gpu.efficiency
    applied = "raw link rates (--raw)" if raw else \
        f"{gpu.id} efficiencies as the solver applies them (scale-up {eff.scaleup:g}, scale-out {eff.scaleout:g} " \
        "of the link rate, oversubscription, NVLS gain)"
    out = {"op": a.op, "bytes": nbytes, "gpus": a.gpus, "cluster": a.cluster, "gpu": gpu.id, "time_s": t,
           "algorithm_bandwidth_bytes_per_s": algbw, "bus_bandwidth_bytes_per_s": algbw and algbw * factor,
           "levels_crossed": prof.crossed(levels), "efficiency_applied": not raw, "bandwidths": applied}
    if a.json:
        _print_json(out)
    elif algbw is None:
        print(f"{a.op} over 1 GPU on {a.cluster}: 0 us (nothing to exchange)")
    else:
        print(f"{a.op} of {nbytes:.4g} B over {a.gpus} GPUs on {a.cluster}: {t * 1e6:.1f} us; "
              f"algorithm bandwidth {algbw / 1e9:.1f} GB/s, bus bandwidth {algbw * factor / 1e9:.1f} GB/s; "
              f"crosses {', '.join(out['levels_crossed']) or 'nothing'}; with {applied}")
    return EXIT_OK


def _add_catalog_args(k: argparse.ArgumentParser) -> None:
    """`autoshard catalog`'s arguments."""
    k.add_argument("--json", action="store_true")


@command("catalog", "List GPUs, topologies, precisions and model presets.",
         _add_catalog_args)
def cmd_catalog(a: argparse.Namespace) -> int:
    from .catalog import _models, get_gpu, get_topology, gpu_ids, model_ids, topology_ids  # noqa: PLC0415

    gpus = [get_gpu(g) for g in gpu_ids()]
    topos = [get_topology(t) for t in topology_ids()]
    if a.json:
        from .catalog import _recipes  # noqa: PLC0415

        _print_json({"gpus": [g.model_dump() for g in gpus], "topologies": [t.model_dump() for t in topos],
                     "precisions": [r.model_dump() for r in _recipes()[0].values()],
                     "models": {k: _models()[k] for k in model_ids()}})
        return EXIT_OK
    from .catalog import _recipes  # noqa: PLC0415
    from .tables import table_text  # noqa: PLC0415

    def tf(x: float | None) -> str:
        return f"{x:.0f}" if x else "-"

    sys.stdout.write(table_text(
        ["GPU", ("16-bit TF", "right"), ("fp8 TF", "right"), ("fp4 TF", "right"), ("HBM GB", "right"),
         ("usable GiB", "right"), ("HBM TB/s", "right"), ("link GB/s", "right"), ("TDP W", "right"),
         ("$/GPU-h", "right"), "aliases"],
        [[g.id, f"{g.peak_tflops.get('bf16', g.peak_tflops.get('fp16', 0.0)):.0f}", tf(g.peak_tflops.get("fp8")),
          tf(g.peak_tflops.get("fp4")), f"{g.hbm_gb:g}", f"{g.hbm_usable_gib:.2f}", f"{g.hbm_tb_per_s:.2f}",
          f"{g.scaleup_gb_per_s:.0f}", f"{g.tdp_w:.0f}", f"{g.price.usd_per_gpu_hour:.2f}", ", ".join(g.aliases)]
         for g in gpus]))
    print("\nPrecisions each GPU trains in:")
    sys.stdout.write(table_text(["GPU", "training.precision"],
                                [[g.id, ", ".join(p for p in g.precisions if p != "fp8")] for g in gpus], indent=2))
    print("\nTopologies (levels, innermost first: name, GPUs per domain x GB/s per GPU):")
    sys.stdout.write(table_text(
        ["topology", "levels", "also"],
        [[t.id, " -> ".join(f"{x.name} {x.size}x{x.bandwidth_gb_per_s:g}{' SHARP' if x.sharp else ''}"
                            for x in t.levels), ", ".join(t.aliases)] for t in topos], indent=2))
    print("\nPrecisions (training.precision; fp8 = fp8-delayed, the frameworks' default recipe):")
    sys.stdout.write(table_text(["precision", "GEMMs", "recipe"],
                                [[r.id, r.gemm_dtype, r.name] for r in _recipes()[0].values()], indent=2))
    print("\nModel presets: " + ", ".join(model_ids()))
    print("Sources: `autoshard catalog --json` (every figure carries its source).")
    return EXIT_OK


def _model_arg(text: str):
    """A model preset name or a Hugging Face config.json path -> ModelSpec (bad input: one line)."""
    from pydantic import ValidationError  # noqa: PLC0415

    from .catalog import resolve_model  # noqa: PLC0415
    from .spec import ModelSpec  # noqa: PLC0415

    value = {"hf_config": text} if (text.endswith(".json") or os.path.sep in text) else text
    try:
        return ModelSpec(**resolve_model(value))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError(f"{err.get('msg', 'invalid model')}", field="MODEL." + ".".join(str(x) for x in err.get("loc", ()))) from None


def _add_rooflines_args(r: argparse.ArgumentParser) -> None:
    """`autoshard rooflines`'s arguments."""
    r.add_argument("model", metavar="MODEL", help="model preset, Hugging Face config.json, or a problem file (YAML: "
                   "its model, GPU, topology, precision and GPU count, each overridable)")
    r.add_argument("--gpu", metavar="GPU", help="GPU id or alias (autoshard catalog); required unless MODEL is a problem")
    r.add_argument("--topology", metavar="PRESET", help="topology preset (default: the GPU's standard system)")
    r.add_argument("--precision", default=None, metavar="P", help="training precision: its GEMM peak is C (default bf16)")
    r.add_argument("--gpus", type=int, metavar="N", help="cluster size (default: the topology's top level)")
    r.add_argument("--achievable", action="store_true",
                   help="use the catalog's matmul and network efficiencies (default: dense peak and full link rates, the idealized rooflines)")
    r.add_argument("--json", action="store_true")


@command("rooflines", "Seed 001's rooflines: tokens per GPU above which DP, FSDP and EP stay "
                      "compute-bound, and the TP bound F / divisor, per topology level.",
         _add_rooflines_args)
def cmd_rooflines(a: argparse.Namespace) -> int:
    from .catalog import get_gpu, get_topology  # noqa: PLC0415
    from .rooflines import render, rooflines  # noqa: PLC0415

    topology, precision, gpus = a.topology, a.precision, a.gpus
    if a.model.endswith((".yaml", ".yml")):  # a problem file: its model, GPU, topology, precision and size
        from .loader import load_problem  # noqa: PLC0415

        problem = load_problem(a.model)
        model, gpu_name = problem.model, a.gpu or problem.cluster.gpu
        topology = topology or problem.cluster.topology
        precision = precision or problem.training.precision
        gpus = gpus or max(2, problem.cluster.num_gpus)
    else:
        if not a.gpu:
            raise InputError("required unless MODEL is a problem file", field="--gpu")
        model, gpu_name = _model_arg(a.model), a.gpu
    gpu = get_gpu(gpu_name)
    if isinstance(topology, str):
        get_topology(topology)
    if gpus is not None and not 2 <= gpus <= 1 << 20:
        raise InputError(f"must be in 2..{1 << 20}, got {gpus}", field="--gpus")
    r = rooflines(model, gpu, topology, precision=precision or "bf16", num_gpus=gpus, achievable=a.achievable)
    if a.json:
        _print_json(r)
    else:
        sys.stdout.write(render(r))
    return EXIT_OK


def _add_serve_memory_args(sm: argparse.ArgumentParser) -> None:
    """`autoshard serve-memory`'s arguments."""
    sm.add_argument("model", nargs="?", metavar="MODEL",
                    help="model preset, Hugging Face config.json, or a problem file (its model and GPU)")
    sm.add_argument("--params", metavar="N", help="weights only: a parameter count instead of MODEL (e.g. 100e12)")
    sm.add_argument("--gpu", metavar="GPU", help="GPU id or alias; required unless MODEL is a problem file")
    sm.add_argument("--batch", type=int, default=1, metavar="B", help="concurrent sequences (default 1)")
    sm.add_argument("--context", type=int, default=4096, metavar="L", help="tokens per sequence, prompt + output (default 4096)")
    sm.add_argument("--precision", default="bf16", metavar="P",
                    help="weight precision: bf16, fp16, fp8, mxfp8, nvfp4 (default bf16)")
    sm.add_argument("--kv-precision", default="bf16", metavar="P", help="KV-cache precision: bf16, fp16, fp8 (default bf16)")
    sm.add_argument("--prefill-tokens", type=int, default=8192, metavar="T",
                    help="tokens of one prefill chunk (vLLM's max_num_batched_tokens; default 8192)")
    sm.add_argument("--memory-utilization", type=float, default=0.9, metavar="F",
                    help="share of usable HBM the server may use (vLLM's gpu_memory_utilization; default 0.9)")
    sm.add_argument("--gpus-per-node", type=int, default=8, metavar="N", help="largest TP degree (default 8)")
    sm.add_argument("--request-rate", type=float, metavar="R",
                    help="disaggregated prefill/decode sizing for R requests/s: each pool's GPUs and the KV "
                         "transfer between them")
    sm.add_argument("--prompt-tokens", type=int, metavar="P", help="prompt tokens per request (default: --context)")
    sm.add_argument("--output-tokens", type=int, metavar="O", help="output tokens per request (default 256)")
    sm.add_argument("--tpot-ms", type=float, metavar="MS",
                    help="time-per-output-token target: decode batches no larger than meet it")
    sm.add_argument("--json", action="store_true")


@command("serve-memory", "Inference memory: weights + KV cache (GQA/MLA) + activations, "
                         "and the fewest GPUs to hold and to serve a model.",
         _add_serve_memory_args)
def cmd_serve_memory(a: argparse.Namespace) -> int:
    from .catalog import get_gpu  # noqa: PLC0415
    from .serving import disaggregated, render, render_disaggregated, serve_memory  # noqa: PLC0415

    if (a.model is None) == (a.params is None):
        raise InputError("give either MODEL or --params (not both)", field="MODEL")
    params = None
    if a.params is not None:
        try:
            params = float(a.params)
        except ValueError:
            raise InputError(f"not a number: {a.params!r}", field="--params") from None
    gpu_name, model = a.gpu, None
    if a.model and a.model.endswith((".yaml", ".yml")):  # a problem file: its model and GPU (flags override)
        from .loader import load_problem  # noqa: PLC0415

        problem = load_problem(a.model)
        model, gpu_name = problem.model, a.gpu or problem.cluster.gpu
    elif a.model:
        model = _model_arg(a.model)
    if not gpu_name:
        raise InputError("required unless MODEL is a problem file", field="--gpu")
    r = serve_memory(get_gpu(gpu_name), model=model, params=params, batch=a.batch, context=a.context,
                     precision=a.precision, kv_precision=a.kv_precision, prefill_tokens=a.prefill_tokens,
                     memory_utilization=a.memory_utilization, gpus_per_node=a.gpus_per_node)
    if a.request_rate is not None:
        if model is None or params is not None:
            raise InputError("disaggregated sizing needs a model (its KV cache and FLOPs), not --params",
                             field="--request-rate")
        prompt = a.prompt_tokens if a.prompt_tokens is not None else a.context
        output = a.output_tokens if a.output_tokens is not None else 256
        r["disaggregated"] = disaggregated(
            get_gpu(gpu_name), model, request_rate=a.request_rate, prompt_tokens=prompt, output_tokens=output,
            precision=a.precision, kv_precision=a.kv_precision, tpot_ms=a.tpot_ms,
            memory_utilization=a.memory_utilization, gpus_per_node=a.gpus_per_node)
    elif a.prompt_tokens is not None or a.output_tokens is not None or a.tpot_ms is not None:
        raise InputError("--prompt-tokens, --output-tokens and --tpot-ms size disaggregated serving: give "
                         "--request-rate too", field="--request-rate")
    if a.json:
        _print_json(r)
    else:
        sys.stdout.write(render(r))
        if "disaggregated" in r:
            sys.stdout.write(render_disaggregated(r["disaggregated"]))
    return EXIT_OK


def _hf_model_of_record(info: dict[str, Any], solution: str) -> Any:
    """The model of a record solved with `--hf-config` (its absolute path, else found from the
    record's folder), or one line telling the command that rebuilds it."""
    from .catalog import not_a_fifo  # noqa: PLC0415
    from .hf import model_from_hf_config  # noqa: PLC0415

    path = Path(str(info["hf_config"]))
    for cand in (path, Path(os.path.abspath(solution)).parent / path.name):
        if cand.is_file():
            not_a_fifo(str(cand))
            return model_from_hf_config(str(cand))
    raise InputError(f"the plan was solved with --hf-config {path}, which is not found: write a problem file with "
                     f"`model: {{hf_config: CONFIG_JSON}}` and pass --problem PROBLEM", source=solution,
                     field="problem.hf_config")


def _add_export_args(x: argparse.ArgumentParser) -> None:
    """`autoshard export`'s arguments."""
    x.add_argument("solution", metavar="SOLUTION", help="solution JSON (from solve/batch) or a plan file")
    x.add_argument("--format", required=True, choices=["megatron", "torchtitan", "deepspeed", "maxtext", "jax"],
                   help="megatron: pretrain_gpt.py flags; torchtitan: v0.2 TOML (+ 0.3 overrides); deepspeed: "
                        "JSON config; maxtext: MaxText YAML config; jax: JSON of mesh and PartitionSpecs")
    x.add_argument("--problem", metavar="PROBLEM", help="the problem file (default: the one named in the solution)")
    x.add_argument("-o", "--output", metavar="FILE")


@command("export", "Write a plan as launcher configuration (megatron, torchtitan, deepspeed, "
                   "maxtext, jax).",
         _add_export_args)
def cmd_export(a: argparse.Namespace) -> int:
    from .export import export_plan  # noqa: PLC0415
    from .loader import load_plan, load_problem  # noqa: PLC0415

    doc = read_document(a.solution)
    info: dict[str, Any] = doc["problem"] if isinstance(doc, dict) and isinstance(doc.get("problem"), dict) else {}
    problem_path = a.problem
    if not problem_path and info:
        from .batch import find_problem_file  # noqa: PLC0415

        problem_path = find_problem_file(info, a.solution)
        if problem_path is None and (info.get("path") or info.get("abs_path")):
            raise InputError(f"the problem file {info.get('path') or info.get('abs_path')!r} named in the solution "
                             "is not found from here nor from the solution's folder: pass --problem PROBLEM",
                             source=a.solution)
    if not problem_path:
        raise InputError("cannot tell which problem this plan is for: pass --problem PROBLEM", source=a.solution)
    problem = load_problem(problem_path)
    if not a.problem and info.get("hf_config"):  # solved with --hf-config: the model came from that file
        problem = problem.model_copy(update={"model": _hf_model_of_record(info, a.solution)})
    if not a.problem and info.get("model") not in (None, problem.model.name):
        raise InputError(f"the plan is for model {info['model']!r} but {problem_path} now describes "
                         f"{problem.model.name!r} (solved with --hf-config?): pass --problem PROBLEM",
                         source=a.solution)
    plan = load_plan(a.solution)
    if a.output:  # never an input: the solution, the problem file, the files it names
        guard_output(a.output, [a.solution, problem_path, info.get("hf_config"), problem.cluster.catalog,
                                *_named_paths(problem_path)])
    exp = export_plan(problem, plan, a.format)
    for w in exp.warnings:
        print(f"warning: {w}", file=sys.stderr)
    _write_or_print(exp.text, a.output)
    return EXIT_OK


def _add_batch_args(b: argparse.ArgumentParser) -> None:
    """`autoshard batch`'s arguments."""
    b.add_argument("inputs", nargs="+", metavar="DIR_OR_GLOB")
    b.add_argument("-o", "--output", required=True, metavar="DIR")
    b.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="problems solved at once, each in its own process (default 1: in this process; 0: one per CPU)")
    b.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, metavar="S",
                   help=f"wall-clock safety net per problem in seconds (default {DEFAULT_TIME_LIMIT_S:g}, as `solve`; the "
                        "budget is deterministic work)")
    b.add_argument("--top", type=int, default=3, metavar="K",
                   help="alternatives per problem: the best plan of the K next-best families (default 3; 0 skips them)")
    b.add_argument("--gap", type=float, default=DEFAULT_GAP_LIMIT, metavar="G",
                   help="relative optimality gap that counts as OPTIMAL (default 0.001; 0 = exact proof)")
    b.add_argument("--force", action="store_true", help="re-solve problems whose input did not change")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--executor", choices=["local", "dask"], default=None,
                   help="local: this process or a process pool (default); dask: a Dask cluster solves the problems "
                        "and this process writes the records (needs pip install 'autoshard[dask]'; the workers read "
                        "the problem files at the same paths: a shared filesystem)")
    b.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="Dask scheduler address, e.g. tcp://host:8786 (implies --executor dask; default: a local "
                        "cluster of --jobs workers started for the run)")
    b.add_argument("--headroom", type=float, default=None, metavar="GIB", help="HBM (GiB per GPU) the plan must leave free, on top of the 2 GiB reserve (default: each problem's `search: {headroom_gib: X}`, else 0)")


@command("batch", "Solve every problem file in directories / globs, in parallel, incrementally.",
         _add_batch_args)
def cmd_batch(a: argparse.Namespace) -> int:
    from .batch import ProgressBar, run_batch, summary_table  # noqa: PLC0415

    if a.scheduler and a.executor == "local":
        raise InputError("a scheduler address needs --executor dask", field="--scheduler")
    executor = a.executor or ("dask" if a.scheduler else "local")
    result = run_batch(a.inputs, a.output, jobs=a.jobs, time_limit_s=a.time_limit, force=a.force, top_k=a.top,
                       gap_limit=a.gap, progress=None if a.quiet else ProgressBar(), headroom_gib=a.headroom,
                       executor=executor, scheduler=a.scheduler)
    sys.stdout.write(summary_table(result))
    return result.exit_code


WHATIF_OUTPUTS = ("results.json", "results.csv", "report.md", "report.html")  # what `whatif -o DIR` writes


def _add_whatif_args(w: argparse.ArgumentParser) -> None:
    """`autoshard whatif`'s arguments."""
    w.add_argument("study", metavar="STUDY")
    w.add_argument("-o", "--output", required=True, metavar="DIR")
    w.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="worker processes (0: one per CPU); with --executor dask and no --scheduler, "
                        "the workers of the local Dask cluster")
    w.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="solver limit per option (default: the study's time_limit_s, else 10 s)")
    w.add_argument("--executor", choices=["local", "dask"], default=None,
                   help="local: a process pool on this machine (default); dask: a Dask cluster "
                        "(needs pip install 'autoshard[dask]')")
    w.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="Dask scheduler address, e.g. tcp://host:8786 (implies --executor dask; default: "
                        "a local cluster of --jobs workers started for the run)")
    w.add_argument("--quiet", action="store_true", help="no progress on stderr")


@command("whatif", "What-if study of hardware options: time, money, energy, Pareto front, report.",
         _add_whatif_args)
def cmd_whatif(a: argparse.Namespace) -> int:
    from .whatif import ProgressLine, load_study, run_study  # noqa: PLC0415

    if a.jobs < 0:
        raise InputError(f"must be >= 0 (0: one worker per CPU), got {a.jobs}", field="--jobs")
    study = load_study(a.study)  # a bad study file is reported before the output directory
    _check_out_dir(a.output)
    for name in WHATIF_OUTPUTS:  # the output guard: no file the study writes replaces the study
        if same_file(Path(a.output) / name, a.study):
            raise InputError(f"{name} would replace the study file {a.study}: choose another output folder",
                             source=a.output, field="--output")
    if a.scheduler and a.executor == "local":
        raise InputError("a scheduler address needs --executor dask", field="--scheduler")
    executor = a.executor or ("dask" if a.scheduler else "local")
    progress = None if a.quiet else ProgressLine()
    try:
        result = run_study(study, a.output, jobs=a.jobs, time_limit_s=a.time_limit, progress=progress,
                           executor=executor, scheduler=a.scheduler)
    finally:
        if progress is not None:
            progress.close()
    for w in result.document.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    sys.stdout.write(result.summary_text(warnings=False))
    missing = [rec for rec in result.recommendations if rec["option"] is None]
    for rec in missing:  # the results are written; no option answers the question
        print(f"autoshard: infeasible: {rec['scope']}: {rec['reason']}", file=sys.stderr)
    return EXIT_INFEASIBLE if missing else EXIT_OK


def _add_validate_args(v: argparse.ArgumentParser) -> None:
    """`autoshard validate`'s arguments."""
    v.add_argument("runs", nargs="?", default=None, metavar="RUNS.json",
                   help="measured runs (dev_runs / modern_runs shape; default: the project's validation/dev_runs.json, or $AUTOSHARD_VALIDATION); "
                        "a file of ablation groups is detected and ranked as with --ablations")
    v.add_argument("--ablations", metavar="FILE", help="groups of measured configurations of one model on one "
                   "cluster: measured vs predicted order, pairwise concordance, top-1 and OOM/fit agreement")
    v.add_argument("--catalog", metavar="CATALOG", help="calibrated catalog overlay to apply")
    v.add_argument("--json", action="store_true")


@command("validate", "Compare predicted step times with published measured runs.",
         _add_validate_args)
def cmd_validate(a: argparse.Namespace) -> int:
    from .validate import format_report, validate  # noqa: PLC0415
    from .validate.ablations import format_ablations, is_ablations_file, validate_ablations  # noqa: PLC0415

    if a.ablations or (a.runs and is_ablations_file(a.runs)):
        if a.ablations and a.runs:
            raise InputError("give either RUNS.json or --ablations FILE, not both", field="validate")
        abl = validate_ablations(a.ablations or a.runs, catalog=a.catalog)
        if a.json:
            _print_json(abl.to_json())
        else:
            sys.stdout.write(format_ablations(abl) + "\n")
        return EXIT_OK
    report = validate(a.runs, catalog=a.catalog)
    if a.json:
        _print_json(report.to_json())
    else:
        sys.stdout.write(format_report(report).rstrip("\n") + "\n")  # ends with a newline, like every command
    return EXIT_OK


def _add_calibrate_args(cal: argparse.ArgumentParser) -> None:
    """`autoshard calibrate`'s arguments."""
    cal.add_argument("measurements", nargs="?", default=None, metavar="MEASUREMENTS",
                     help="runs as JSON (dev_runs shape) or CSV (or give --logs instead)")
    cal.add_argument("-o", "--output", required=True, metavar="CATALOG.yaml")
    cal.add_argument("--logs", nargs="+", metavar="DIR|FILE", help="training logs (Megatron-LM, Megatron-DeepSpeed, "
                     "torchtitan, DeepSpeed), one run per file; a directory: its *.log, *.txt, *.out, *.err files")
    cal.add_argument("--traces", nargs="+", metavar="DIR|FILE", help="PyTorch profiler Chrome traces (.json, "
                     ".json.gz) of those runs: each belongs to the log in its folder (or to the only log)")
    cal.add_argument("--nccl-tests", nargs="+", metavar="DIR|FILE", help="nccl-tests output (all_reduce_perf, "
                     "all_gather_perf, reduce_scatter_perf, alltoall_perf): the topology's level efficiencies")
    cal.add_argument("--config", nargs="+", metavar="TOML", help="torchtitan job configs (one for all torchtitan "
                     "logs, or one per log folder; a .toml next to the log is not read unless named)")
    cal.add_argument("--problem", metavar="PROBLEM", help="a problem file: its cluster (GPU, topology), and its model "
                     "and batch where a log does not give them")
    cal.add_argument("--model", metavar="MODEL", help="the model of logs that do not give its dimensions (torchtitan): "
                     "a preset name or a Hugging Face config.json")
    cal.add_argument("--gpu", metavar="ID", help="the GPU of the runs (catalog id; default: the problem file's, else "
                     "the one the log names)")
    cal.add_argument("--topology", metavar="PRESET", help="the cluster's topology preset (default: the problem "
                     "file's, else the GPU's)")
    cal.add_argument("--catalog", metavar="CATALOG", help="start from this overlay instead of the built-in catalog")
    cal.add_argument("--no-loo", action="store_true", help="with --logs: skip the leave-one-run-out check (one refit "
                     "per run; on by default)")
    cal.add_argument("--loo", action="store_true", help="with a runs file: add the leave-one-run-out check (each run "
                     "predicted by a fit on the others, before -> after)")
    cal.add_argument("--common-ratio", action="store_true", help="fit first one ratio that moves every fitted "
                     "efficiency factor together (the step-level ratio two trial runs measure best), then the "
                     "factors the runs tell apart from it (docs/calibration.md)")
    cal.add_argument("--json", action="store_true", help="print the result as JSON (with --logs)")
    cal.add_argument("--quiet", action="store_true", help="no live progress on stderr (it is drawn only on a terminal)")


@command("calibrate", "Fit the catalog's efficiency factors to your own measured runs: a runs "
                      "file, or the training logs, profiler traces and nccl-tests output of your cluster (docs/calibration.md).",
         _add_calibrate_args)
def cmd_calibrate(a: argparse.Namespace) -> int:
    from .calibrate import calibrate, network_warnings  # noqa: PLC0415
    from .progress import TerminalLine, wanted  # noqa: PLC0415

    if a.logs:
        if a.measurements:
            raise InputError("give either MEASUREMENTS (a runs file) or --logs, not both", field="calibrate")
        return _calibrate_artifacts(a)
    if a.measurements is None:
        raise InputError("give MEASUREMENTS (a runs file) or --logs DIR|FILES", field="calibrate")
    extra = [f for f in ("traces", "nccl_tests", "config", "problem", "model", "gpu", "topology", "catalog",
                         "no_loo") if getattr(a, f)]
    if extra or a.json:
        raise InputError(f"--{(extra or ['json'])[0].replace('_', '-')} goes with --logs", field="calibrate")
    line = TerminalLine() if wanted(a.quiet) else None  # a live line on a terminal (as solve), else nothing

    def progress(text: str) -> None:
        import time  # noqa: PLC0415

        if line is not None:
            line.show(f"calibrate {time.monotonic() - line.t0:.0f}s: {text}")

    loo_text = ""
    try:
        res = calibrate(a.measurements, a.output, progress=progress if line is not None else None,
                        common_ratio=a.common_ratio)
        if a.loo:
            from .artifacts.profile import format_loo, leave_one_out  # noqa: PLC0415
            from .validate import convert, load_runs  # noqa: PLC0415

            cases, _ = convert(load_runs(a.measurements))
            loo_text = format_loo(*leave_one_out(cases, list(res.runs_used),
                                                 progress=progress if line is not None else None,
                                                 common_ratio=a.common_ratio))
    finally:
        if line is not None:
            line.close(erase=True)  # the summary and warnings follow
    summary = getattr(res, "summary", None)
    sys.stdout.write(summary() if callable(summary) else f"wrote {a.output}\n")
    sys.stdout.write(loo_text)
    for w in network_warnings(res):
        print(f"warning: {w}", file=sys.stderr)
    return EXIT_OK


def _calibrate_artifacts(a: argparse.Namespace) -> int:
    """`calibrate --logs ...`: training logs, traces and nccl-tests output -> a calibrated overlay."""
    from .artifacts.profile import calibrate_artifacts, load_inputs, to_json  # noqa: PLC0415
    from .artifacts.runs import RunContext  # noqa: PLC0415
    from .loader import load_problem  # noqa: PLC0415
    from .progress import TerminalLine, wanted  # noqa: PLC0415

    if a.catalog is not None and not Path(a.catalog).is_file():
        raise InputError("no such file", source=a.catalog, field="--catalog")
    ctx = RunContext(problem=load_problem(a.problem) if a.problem else None,
                     model=_model_arg(a.model) if a.model else None, gpu=a.gpu, topology=a.topology)
    if a.gpu is not None:
        from .catalog import get_gpu  # noqa: PLC0415

        get_gpu(a.gpu)  # an unknown id: one line naming the valid ones
    if a.topology is not None:
        from .catalog import get_topology  # noqa: PLC0415

        get_topology(a.topology)
    if a.loo:
        raise InputError("--loo goes with a runs file (with --logs it is on; --no-loo turns it off)", field="--loo")
    runs, traces, tests, inputs = load_inputs(a.logs, a.traces or [], a.nccl_tests or [], a.config or [], ctx)
    line = TerminalLine() if wanted(a.quiet) else None

    def progress(text: str) -> None:
        if line is not None:  # (passed only where there is a line)
            line.show(f"calibrate: {text}")

    try:
        res = calibrate_artifacts(runs, traces, tests, a.output, inputs=inputs, base_catalog=a.catalog,
                                  loo=not a.no_loo, progress=progress if line is not None else None,
                                  common_ratio=a.common_ratio)
    finally:
        if line is not None:
            line.close(erase=True)
    if a.json:
        _print_json(to_json(res))
    else:
        sys.stdout.write(res.summary())
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return EXIT_OK


# ---- parser ------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors are bad input too: exit 2 and one line on stderr (the usage is in --help)."""

    def error(self, message: str) -> Any:
        self.exit(EXIT_INPUT, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


# The order of `autoshard --help`'s command list.
COMMAND_ORDER = ("solve", "compare", "evaluate", "collective", "catalog", "rooflines", "serve-memory", "export", "batch", "whatif", "validate", "calibrate")


def cli_parser() -> argparse.ArgumentParser:
    """`autoshard`'s parser: the top-level options, then each registered command (`@command`: its
    handler with its `_add_<cmd>_args`) in COMMAND_ORDER. Nothing command-specific is added here."""
    p = _Parser(
        prog="autoshard",
        description="Find the fastest way to parallelize LLM training that fits in HBM, and what it costs.",
        epilog="Exit codes: 0 ok, 1 does not fit / infeasible, 2 bad input (also -o naming an input, or stdout "
               "closed), 3 internal error, 130 interrupted (Ctrl-C: nothing partial written), 143 whatif stopped by "
               "SIGTERM (finished options kept).")
    p.add_argument("--version", action="version", version=f"autoshard {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_ORDER:
        c = COMMANDS[name]
        sp = sub.add_parser(name, help=c.help, description=c.help)
        sp.set_defaults(func=c.run)
        c.add_args(sp)
    return p


def internal_error_line(exc: BaseException, source: str | None = None) -> str:
    """An unexpected exception (the solver's CP-SAT refusing a model, a library failing, a bug) as one
    line naming the problem file; an integer overflow is a size the model cannot hold, i.e. a unit
    mistake in the input (`errors.is_input_overflow`), anything else asks for a bug report."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    first = re.sub(r"[:\s]*(linear\s*)?\{?\s*$", "", first)
    text = f"the solver failed: {first}" if "CP-SAT" in first else f"internal error: {type(exc).__name__}: {first}"
    if is_input_overflow(exc):
        text += " (a size too large for the solver's integers: check the problem's numbers for a unit mistake, " \
                "e.g. training.global_batch_size counts sequences, not tokens)"
    else:
        text += f" (a bug in autoshard: please report it with the problem file; {DEBUG_ENV}=1 shows the traceback)"
    return ": ".join(x for x in (source, text) if x).replace("\r", "\\r").replace("\n", "\\n")


def _honour_sigint() -> None:
    """Ctrl-C (SIGINT) interrupts every command, also when autoshard was started with SIGINT ignored
    (a background job of a shell script, `autoshard solve ... & kill -INT $!`): the solve stops,
    nothing partial is written and the exit code is 130. Main thread only (a library caller's
    threads keep their own handlers)."""
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _stdout_closed() -> bool:
    """Whether standard output is closed (`autoshard catalog >&-`): Python then sets sys.stdout to None."""
    out = sys.stdout
    if out is None:
        return True
    try:
        os.fstat(out.fileno())
    except (OSError, ValueError, AttributeError):
        return not hasattr(out, "getvalue")  # a StringIO (tests) has no descriptor and is open
    return False


def main(argv: list[str] | None = None) -> int:
    parser = cli_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "func", None):
        parser.print_help()
        return EXIT_INPUT
    if _stdout_closed():  # refused before any work (nothing written), as `ls >&-` does: exit 2
        if sys.stderr is not None:
            print("autoshard: error: <stdout>: standard output is closed; redirect it (> /dev/null to discard it)",
                  file=sys.stderr)
        return EXIT_INPUT
    _honour_sigint()
    try:
        _check_limits(a)
        rc = a.func(a)
        _flush_stdout()
        return rc
    except InputError as exc:
        print(f"autoshard: error: {exc.line()}", file=sys.stderr)
        return EXIT_INPUT
    except InfeasibleError as exc:
        print(f"autoshard: infeasible: {exc}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except InternalError as exc:  # e.g. every option of a what-if study failed, none for bad input
        print(f"autoshard: error: {' '.join(str(exc).split())} (not the input: a bug in autoshard, or workers "
              "that died; please report it)", file=sys.stderr)
        return EXIT_INTERNAL
    except AutoshardError as exc:  # e.g. every option of a what-if study failed
        print(f"autoshard: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt as exc:  # Ctrl-C: 130; SIGTERM during whatif (exc.exit_code): 143
        print("autoshard: interrupted; finished outputs were kept", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_INTERRUPTED)
    except BrokenPipeError:
        return EXIT_OK
    except OSError as exc:  # e.g. stdout on a full disk: one line, not a traceback
        where = exc.filename or "<stdout>"
        _silence_stdout()
        print(f"autoshard: error: {where}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as exc:  # noqa: BLE001  CP-SAT refusing a model, or a bug: one line, never a traceback
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"autoshard: error: {internal_error_line(exc, getattr(a, 'problem', None))}", file=sys.stderr)
        return EXIT_INPUT if is_input_overflow(exc) else EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())

"""The study run: tasks solved by a local process pool or a Dask cluster, rows (goodput, cost, energy),
recommendations, results.json / results.csv, and the report."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import io
import math
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import AutoshardError, InfeasibleError, InputError, InternalError, is_input_overflow
from ..fileio import atomic_write, dumps_json
from ..progress import TerminalLine
from ..render import json_safe
from .report import money, power
from ..spec import Problem
from .fleet import fleet_answer
from .goodput import goodput, reliability_defaults
from .pricing import price_option
from .purchase import Candidate, explain_decision, optimize_purchase, pareto_front, runner_up, violations
from .schema import (
    DEFAULT_TIME_LIMIT_S,
    SCHEMA_VERSION,
    SensitivityMode,
    Option,
    Study,
    StudySpec,
    Workload,
    power_figures,
)
from .sensitivity import sensitivities, solve_option
from .study import load_study
from ..cost import FLOP_CONVENTION, flops_per_token_parts, total_params
from ..cost.intervals import overlaps
from ..dask_run import import_distributed, run_on_dask
from .report import write_report

CSV_COLUMNS = (
    "workload", "option", "gpu", "num_gpus", "topology", "mode", "feasible", "meets_constraints", "pareto",
    "recommended", "plan", "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "ideal_days",
    "model_flops", "hardware_flops",
    "goodput", "goodput_efficiency", "time_to_train_days", "cost_usd", "capex_usd", "energy_mwh", "power_mw", "tokens_per_usd",
    "step_time_low_s", "step_time_high_s", "time_to_train_days_low", "time_to_train_days_high", "cost_usd_low",
    "cost_usd_high", "energy_mwh_low", "energy_mwh_high",
    "mtbf_h", "checkpoint_s", "checkpoint_interval_s", "binding", "gain_internode_2x_pct",
    "gain_nvlink_2x_pct", "gain_hbm_plus_pct", "gain_fp8_pct", "violations", "reason", "solver_status",
    "solve_time_s",
)
TIMING_FIELDS = ("solve_time_s", "elapsed_s", "task_time_s")
MAX_TRAIN_DAYS = 365_000.0  # 1,000 years: an option slower than that is reported, not priced


# =============================================================================================
# Tasks (run in worker processes)
# =============================================================================================


@dataclasses.dataclass(frozen=True)
class Task:
    key: str
    problem: Problem
    label: str
    num_gpus: int
    time_limit_s: float
    sensitivity: SensitivityMode
    scratch: str


def _ignore_sigint() -> None:
    """Pool worker setup: Ctrl-C and SIGTERM (a terminal, or a job scheduler signalling the whole
    process group) are the parent's to handle: it writes what finished and kills the workers
    (SIGKILL). A worker killed by the signal itself would be reported as a failed option."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Terminated(KeyboardInterrupt):
    """SIGTERM while a study runs (Slurm, Kubernetes, `kill`): handled like Ctrl-C, the finished
    options are kept and written; the command line exits with 143 (128 + SIGTERM)."""

    exit_code = 128 + signal.SIGTERM


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Any:
    """SIGTERM raises `Terminated` inside the block (main thread only; restored after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_held() -> Any:
    """Ignore SIGINT and SIGTERM inside the block (writing what finished after an interrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def run_task(task: Task) -> dict[str, Any]:
    """Solve one (workload, hardware) pair: JSON-ready dict, never raises for a bad option.

    Module-level and picklable: the process pool and the Dask executor both run it."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"key": task.key}
    # A worker on another machine (Dask scheduler) does not see the client's scratch directory:
    # the sensitivities then use a temporary directory of their own.
    scratch = task.scratch if task.scratch and os.path.isdir(task.scratch) else None
    try:
        solved = solve_option(task.problem, time_limit_s=task.time_limit_s)
    except InfeasibleError as exc:
        out.update(status="infeasible", reason=exc.reason, suggestions=list(exc.suggestions))
    except Exception as exc:  # noqa: BLE001  (one broken option must not sink the sweep; reported per row)
        out.update(status="error", reason=f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                   input_error=isinstance(exc, InputError) or is_input_overflow(exc))
    else:
        est = solved.estimate
        out.update(
            status="ok", plan=est.plan.model_dump(mode="json", exclude_none=True), plan_short=est.plan.short(),
            step_time_s=est.step_time_s, tokens_per_s=est.tokens_per_s, mfu=est.mfu,
            peak_memory_gib=est.peak_memory_gib, memory_capacity_gib=est.memory_capacity_gib,
            time_breakdown_s=dict(est.time_breakdown_s), bottleneck=est.bottleneck,
            solver_status=solved.status, solve_time_s=solved.solve_time_s,
            step_time_interval_s=list(est.step_time_interval_s) if est.step_time_interval_s else None,
            recompute_factor=est.flop_budget.recompute_factor if est.flop_budget else 1.0)
        try:
            out["sensitivity"] = sensitivities(task.problem, solved, mode=task.sensitivity,
                                               time_limit_s=task.time_limit_s, scratch=scratch)
        except Exception as exc:  # noqa: BLE001
            out["sensitivity"] = {"gains_pct": {}, "shares": {}, "binding": "unknown",
                                  "notes": [f"sensitivity failed: {type(exc).__name__}: {exc}"[:300]]}
    out["task_time_s"] = time.perf_counter() - t0
    return out

# =============================================================================================
# The study run
# =============================================================================================


@dataclasses.dataclass
class StudyResult:
    out_dir: Path
    complete: bool
    rows: list[dict[str, Any]]
    recommended: dict[str, Any] | None
    recommendations: list[dict[str, Any]]
    files: list[Path]
    elapsed_s: float
    document: dict[str, Any]

    def summary_text(self, *, warnings: bool = True) -> str:
        """A few lines for a terminal: the recommendation(s), the warnings (each in full, unless
        `warnings=False`: the command line prints them on stderr) and where the files are."""
        lines = []
        for rec in self.recommendations:
            lines.append(f"{rec['scope']}: {rec['option'] or 'no recommendation'}")
            lines.append(f"  {rec['reason']}")
            for f, alt in rec.get("under_other_power_figures", {}).items():
                lines.append(f"  with the power figure '{f}' instead of '{rec['power_figure']}': "
                             + (f"{alt['option']} ({alt['time_to_train_days']:.1f} days, {money(alt['cost_usd'])}, "
                                f"{power(alt['power_mw'])})" if alt["option"] else "no recommendation")
                             + (" (the same)" if alt["option"] == rec["option"] else ""))
        if warnings:
            lines += [f"warning: {w}" for w in self.document.get("warnings", [])]
        feas = sum(1 for r in self.rows if r.get("feasible"))
        lines.append(f"{feas} of {len(self.rows)} rows have a feasible plan; {self.elapsed_s:.1f} s")
        lines.append(f"wrote {self.out_dir / 'results.json'}, results.csv"
                     + (", report.md, report.html" if any(p.name == "report.html" for p in self.files) else "")
                     + f" and {sum(1 for p in self.files if p.suffix == '.png')} plot(s) in {self.out_dir}")
        return "\n".join(lines) + "\n"


ProgressFn = Callable[[int, int, str], None]


class ProgressLine(TerminalLine):
    """A `progress` callback for stderr: on a terminal one line redrawn in place (carriage return,
    cut to the terminal's width, the rest of the line cleared), else one plain line per finished
    option (no carriage returns in logs)."""

    def __call__(self, done: int, total: int, label: str) -> None:
        line = f"[{done}/{total}] {time.monotonic() - self.t0:.0f} s" + (f" {label}" if label else "")
        try:
            if self.tty:
                cols = shutil.get_terminal_size((80, 24)).columns
                self.stream.write("\r" + line[:max(10, cols - 1)] + "\x1b[K")
                self.pending = done < total
                if not self.pending:
                    self.stream.write("\n")
            elif label:
                self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


def _tasks(study: Study, time_limit_s: float, scratch: str) -> dict[str, Task]:
    tasks: dict[str, Task] = {}
    for w in study.workloads:
        for o in study.options:
            key = _task_key(w, o)
            if key not in tasks:
                tasks[key] = Task(key, w.problem(o, study.spec.networks), f"{w.base} on {o.hw_id}", o.num_gpus,
                                  time_limit_s, study.spec.sensitivity, scratch)
    return tasks


def _task_key(w: Workload, o: Option) -> str:
    h = hashlib.sha256(w.problem_key.encode()).hexdigest()[:12]
    return f"{h}:{o.hw_id}:{o.catalog or ''}"


def _execute(tasks: Sequence[Task], jobs: int, progress: ProgressFn | None, done: dict[str, dict], *,
             executor: str = "local", scheduler: str | None = None) -> None:
    """Run tasks, filling `done` as they finish (so an interrupt keeps what finished)."""
    total = len(tasks)
    order = sorted(tasks, key=lambda t: (-t.num_gpus, t.key))  # big clusters first: better balance
    if progress:
        progress(0, total, "")
    if executor == "dask":
        _execute_dask(order, jobs, progress, done, scheduler)
        return
    if jobs <= 1 or total <= 1:
        for t in order:
            done[t.key] = run_task(t)
            if progress:
                progress(len(done), total, t.label)
        return
    _execute_local(order, jobs, progress, done)


def _execute_local(order: Sequence[Task], jobs: int, progress: ProgressFn | None, done: dict[str, dict]) -> None:
    """Run tasks on a pool of `jobs` worker processes (concurrent.futures: a worker that dies, e.g.
    killed with its process group by a job scheduler's SIGTERM, breaks the pool instead of wedging it
    the way multiprocessing.Pool's terminate() waits forever on a queue lock the dead worker held).
    On an interrupt the workers are killed at once; what finished stays in `done`."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait  # noqa: PLC0415
    from concurrent.futures.process import BrokenProcessPool  # noqa: PLC0415

    total = len(order)
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    ex = ProcessPoolExecutor(max_workers=min(jobs, total), mp_context=ctx, initializer=_ignore_sigint)
    procs: list[Any] = []
    try:
        futures = {ex.submit(run_task, t): t for t in order}  # first in, first out: big clusters first
        procs = list((getattr(ex, "_processes", None) or {}).values())
        pending = set(futures)
        rank = {f: i for i, f in enumerate(futures)}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=rank.__getitem__):
                task = futures[fut]
                try:
                    res = fut.result()
                except BrokenProcessPool as exc:  # a worker died (killed, out of memory): reported per row
                    res = {"key": task.key, "status": "error",
                           "reason": f"worker process died: {' '.join(str(exc).split())}"[:300]}
                done[task.key] = res
                if progress:
                    progress(len(done), total, task.label)
        ex.shutdown(wait=True)
    except BaseException:
        procs += [p for p in (getattr(ex, "_processes", None) or {}).values() if p not in procs]
        ex.shutdown(wait=False, cancel_futures=True)
        for proc in procs:  # the solves in flight are abandoned: kill now, not after their time limit
            with contextlib.suppress(Exception):
                proc.kill()
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.join(timeout=5)
        raise


# ---- Dask executor (optional extra: pip install 'autoshard[dask]') ------------------------------

EXECUTORS = ("local", "dask")
def _dask_failure(task: Task, exc: BaseException) -> dict[str, Any]:
    """A task that the cluster could not run (worker lost, autoshard missing on a worker): an error row."""
    return {"key": task.key, "status": "error",
            "reason": f"dask: {type(exc).__name__}: {exc}".splitlines()[0][:300]}


def _execute_dask(order: Sequence[Task], jobs: int, progress: ProgressFn | None, done: dict[str, dict],
                  scheduler: str | None) -> None:
    """Run tasks on a Dask cluster (`dask_run.run_on_dask`: the scheduler at `scheduler`, else a
    LocalCluster of `jobs` single-threaded worker processes started for this run). The same `run_task`
    as the local pool; results are kept in `done` as they complete, so what finished before an
    interrupt stays there."""
    total = len(order)

    def finished(task: Task, res: dict[str, Any]) -> None:
        done[res["key"]] = res
        if progress:
            progress(len(done), total, task.label)

    run_on_dask(order, run_task, jobs=jobs, scheduler=scheduler, key_prefix="autoshard-whatif",
                on_result=finished, on_error=_dask_failure)


def workload_flops(w: Workload) -> dict[str, Any]:
    """A workload's training FLOP budget under the cost model's convention (cost.FLOP_CONVENTION):
    model FLOPs per token x its tokens, and the plain 6 N T (4 N T for LoRA) beside it."""
    per_n, n, attn = flops_per_token_parts(w.model, w.training)
    per_token = per_n * n + attn
    return {"convention": FLOP_CONVENTION, "matmul_params": float(n), "model_flops_per_token": float(per_token),
            "weight_flops_per_token": float(per_n * n), "attention_flops_per_token": float(attn),
            "model_flops": per_token * w.tokens, "weight_flops": per_n * n * w.tokens}


def _row(study: Study, w: Workload, o: Option, res: dict[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": w.name, "option": o.id, "gpu": o.gpu, "num_gpus": o.num_gpus,
                           "topology": o.topology, "mode": o.mode, "tokens": w.tokens}
    if res is None or res.get("status") != "ok":
        row.update(feasible=False, status=(res or {}).get("status", "not run"),
                   reason=(res or {}).get("reason", "not run"),
                   suggestions=(res or {}).get("suggestions", []))
        return row
    row["status"] = "ok"
    rel = study.spec.reliability
    gp = goodput(o.num_gpus, total_params(w.model), rel, o.gpu, spot=o.mode == "spot")
    other_loss = float(reliability_defaults()["other_loss_fraction"] if rel.other_loss_fraction is None
                       else rel.other_loss_fraction)
    steps = math.ceil(w.tokens / w.training.tokens_per_step)
    ideal_s = steps * res["step_time_s"]
    row.update({k: res[k] for k in ("plan", "plan_short", "step_time_s", "tokens_per_s", "mfu", "peak_memory_gib",
                                    "memory_capacity_gib", "time_breakdown_s", "bottleneck", "solver_status",
                                    "solve_time_s")})
    # The FLOP budget: the workload's model FLOPs (the same on every option) and this plan's hardware
    # FLOPs, its recompute included.
    flops = workload_flops(w)
    factor = float(res.get("recompute_factor", 1.0))
    row.update(model_flops=flops["model_flops"], recompute_factor=factor,
               hardware_flops=factor * flops["model_flops"])
    sens = res.get("sensitivity") or {}
    gains = sens.get("gains_pct", {})
    row.update(binding=sens.get("binding"), resource_shares=sens.get("shares", {}),
               relax_gain_pct=sens.get("relax_gain_pct", {}),
               hbm_plus_gpu=sens.get("hbm_plus_gpu"), sensitivity_notes=sens.get("notes", []),
               memory_utilization=sens.get("memory_utilization"))
    for k in ("internode_2x", "nvlink_2x", "hbm_plus", "fp8"):
        row[f"gain_{k}_pct"] = gains.get(k)
    # Goodput as the seeds define it (seed 002): useful tokens per second after every loss, and that
    # over the cluster's theoretical maximum (every GPU at its peak FLOP/s) as an efficiency: the
    # step's own losses (communication, bubbles, memory traffic: MFU) times the training-time ratio
    # (failures, checkpoints, restarts, spot preemptions) times the losses outside the cost model.
    ratio = gp.ratio * (1.0 - other_loss)
    row.update(steps=steps, ideal_days=ideal_s / 86400, goodput=ratio, training_time_ratio=gp.ratio,
               other_loss_fraction=other_loss, mtbf_h=gp.mtbf_s / 3600,
               checkpoint_gb=gp.checkpoint_bytes / 1e9, checkpoint_s=gp.checkpoint_s,
               checkpoint_interval_s=gp.interval_s, restart_s=gp.restart_s,
               failures_per_gpu_hour=gp.failures_per_gpu_hour, preemptions_per_gpu_hour=gp.preemptions_per_gpu_hour,
               goodput_tokens_per_s=res["tokens_per_s"] * ratio,
               peak_tokens_per_s=res["tokens_per_s"] / res["mfu"] if res["mfu"] > 0 else None,
               goodput_efficiency=res["mfu"] * ratio)
    if gp.ratio <= 0:
        row.update(feasible=False, status="no_progress",
                   reason=f"the cluster fails faster than it can checkpoint and restart: MTBF "
                          f"{_duration(gp.mtbf_s)} vs {_duration(gp.restart_s)} per restart + "
                          f"{_duration(gp.checkpoint_s)} per checkpoint, so no work survives (goodput 0)")
        return row
    wall_s = ideal_s / ratio
    if not wall_s <= MAX_TRAIN_DAYS * 86400:
        row.update(feasible=False, status="too_long",
                   reason=f"training would take {wall_s / 86400 / 365:.3g} years (goodput {100 * ratio:.3g}%), more "
                          f"than the {MAX_TRAIN_DAYS / 365:,.0f} years this study prices")
        return row
    row.update(time_to_train_days=wall_s / 86400, **price_option(study, o, wall_s))
    row.update(_interval_bounds(study, o, res, wall_s))
    figures = power_figures([o])
    if len(figures) > 1:  # the facility power under every figure the catalog has for this GPU
        row["power_mw_by_figure"] = {f: price_option(study, o, wall_s, power_figure=f)["power_mw"] for f in figures}
    row["tokens_per_usd"] = w.tokens / row["cost_usd"] if row["cost_usd"] > 0 else None
    row["feasible"] = True
    return row


def _interval_bounds(study: Study, o: Option, res: dict[str, Any], wall_s: float) -> dict[str, float]:
    """The 80% interval of the plan's step time (`Estimate.step_time_interval_s`, from the validation
    residuals of its regime) carried to the option's time to train, cost and energy: the wall time scales
    with the step time (goodput does not depend on it), and so do the cloud bill, the energy and the
    amortized capex; the capex and the power draw do not. Empty when the estimate has no interval."""
    iv = res.get("step_time_interval_s")
    step = res["step_time_s"]
    if not iv or not step > 0:
        return {}
    out = {"step_time_low_s": float(iv[0]), "step_time_high_s": float(iv[1])}
    for tag, bound in (("low", iv[0]), ("high", iv[1])):
        wall = wall_s * (float(bound) / step)
        priced = price_option(study, o, wall)
        out.update({f"time_to_train_days_{tag}": wall / 86400, f"cost_usd_{tag}": priced["cost_usd"],
                    f"energy_mwh_{tag}": priced["energy_mwh"]})
    return out


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _why_no_candidates(rows: Sequence[dict[str, Any]]) -> str:
    """Why no option has a feasible plan, by cause (reliability, no plan fits, solver errors, not run)."""
    causes = (("no_progress", "fail faster than they can checkpoint and restart"),
              ("too_long", "would take more than 1,000 years"), ("infeasible", "have no plan that fits"),
              ("error", "failed to solve"), ("not run", "were not run"))
    parts = []
    for status, words in causes:
        hit = [r for r in rows if not r.get("feasible") and r.get("status", "not run") == status]
        if hit:
            why = hit[0]["reason"].split(": ", 1)[-1] if status == "no_progress" else hit[0]["reason"]
            parts.append(f"{len(hit)} of {len(rows)} {words} (e.g. {hit[0]['gpu']} x{hit[0]['num_gpus']}: {why})")
    return "no option has a feasible plan: " + "; ".join(parts) if parts else "no option has a feasible plan"


def _candidate(row_group: Sequence[dict[str, Any]], cid: str) -> Candidate | None:
    if not all(r.get("feasible") for r in row_group):
        return None
    return Candidate(cid, sum(r["time_to_train_days"] for r in row_group) * 86400,
                     sum(r["cost_usd"] for r in row_group), max(r["capex_usd"] for r in row_group),
                     max(r["power_mw"] for r in row_group))


def _recommend(study: Study, rows: list[dict[str, Any]], scope: str, group: list[Workload]) -> dict[str, Any]:
    cons = study.spec.constraints
    by = {(r["workload"], r["option"]): r for r in rows}
    cands: list[Candidate] = []
    for o in study.options:
        grp = [by.get((w.name, o.id)) for w in group]
        if any(g is None for g in grp):
            continue
        c = _candidate(grp, o.id)  # type: ignore[arg-type]
        if c is not None:
            cands.append(c)
    dec = optimize_purchase(cands, cons)
    chosen = cands[dec.index] if dec.index is not None else None
    bounds = {c.id: _group_bounds([by[(w.name, c.id)] for w in group]) for c in cands}
    reason = explain_decision(cands, dec, cons) if cands else \
        _why_no_candidates([r for r in rows if r["workload"] in {w.name for w in group}])
    hardware = {o.id: o.hw_id for o in study.options}
    second = runner_up(cands, dec, lambda c: hardware[c.id])  # another cluster, so another plan
    close = None
    if chosen is not None and second is not None:
        close = _interval_comparison(chosen, second, bounds, dec.objective)
        reason += "; " + close["text"]
    mine = bounds.get(chosen.id, {}) if chosen else {}
    return json_safe({
        "scope": scope, "workloads": [w.name for w in group], "option": chosen.id if chosen else None,
        "objective": dec.objective, "status": dec.status, "constraints": cons.model_dump(exclude_none=True),
        "time_to_train_days": chosen.time_s / 86400 if chosen else None,
        "cost_usd": chosen.cost_usd if chosen else None, "capex_usd": chosen.capex_usd if chosen else None,
        "power_mw": chosen.power_mw if chosen else None, **mine,
        "candidates": len(cands), "meeting_constraints": sum(dec.meets),
        "runner_up": close, "reason": reason,
    })


def _group_bounds(group: Sequence[dict[str, Any]]) -> dict[str, float]:
    """A candidate's 80% bounds of time (days) and cost over the workloads it serves (summed: the
    workloads' errors taken as moving together); empty when a row has no interval."""
    keys = ("time_to_train_days_low", "time_to_train_days_high", "cost_usd_low", "cost_usd_high")
    if not group or not all(all(r.get(k) is not None for k in keys) for r in group):
        return {}
    return {k: sum(r[k] for r in group) for k in keys}


def _interval_comparison(chosen: Candidate, other: Candidate, bounds: Mapping[str, dict[str, float]],
                         objective: str) -> dict[str, Any]:
    """Whether the chosen option and the runner-up on the objective (the best option on other
    hardware that meets the constraints) lie within each other's 80% interval (of time to train, or of cost when the objective is cost), in words."""
    a, b = bounds.get(chosen.id) or {}, bounds.get(other.id) or {}
    key, unit = ("time_to_train_days", "time to train") if objective == "time" else ("cost_usd", "cost")

    def span(x: Mapping[str, float]) -> str:
        lo, hi = x[f"{key}_low"], x[f"{key}_high"]
        return f"{lo:.1f}-{hi:.1f} days" if key == "time_to_train_days" else f"{money(lo)}-{money(hi)}"

    out: dict[str, Any] = {"option": other.id, "time_to_train_days": other.time_s / 86400,
                           "cost_usd": other.cost_usd, **b, "compared_on": key}
    if not a or not b:
        out.update(overlap=None, text=f"the runner-up {other.id} cannot be compared on an interval (no interval "
                                      "for one of the plans)")
        return out
    hit = overlaps((a[f"{key}_low"], a[f"{key}_high"]), (b[f"{key}_low"], b[f"{key}_high"]))
    out["overlap"] = hit
    if hit:
        out["text"] = (f"the runner-up {other.id} ({span(b)}) and {chosen.id} ({span(a)}) are within each other's 80% "
                       f"interval of {unit}: the model cannot tell them apart; decide on cost and availability")
    else:
        out["text"] = (f"the runner-up {other.id} ({span(b)}) lies outside {chosen.id}'s 80% interval of {unit} "
                       f"({span(a)}): the model tells them apart")
    return out


def _recommendations(study: Study, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if study.spec.combine == "sum":
        return [_recommend(study, rows, "all workloads on one cluster, one after another", list(study.workloads))]
    return [_recommend(study, rows, f"workload {w.name}", [w]) for w in study.workloads]


def _warnings(study: Study, rows: list[dict[str, Any]]) -> list[str]:
    """Checks a reader should see: non-monotone scaling (often a solver time limit), unproven plans, errors."""
    out: list[str] = []
    seen: set[str] = set()
    for w in study.workloads:
        if w.base in seen:
            continue
        seen.add(w.base)
        wr = [r for r in rows if r["workload"] == w.name and r.get("step_time_s") is not None]
        series: dict[tuple[str, str], dict[int, dict]] = {}
        for r in wr:
            series.setdefault((r["gpu"], r["topology"]), {})[r["num_gpus"]] = r
        for (g, t), pts in series.items():
            ns = sorted(pts)
            for a, b in zip(ns, ns[1:]):
                ra, rb = pts[a], pts[b]
                if rb["tokens_per_s"] < ra["tokens_per_s"] * 0.999:
                    why = (f"its plan is {rb['solver_status']}, not proven optimal: a longer time_limit_s may find a "
                           "better one" if rb.get("solver_status") != "OPTIMAL" else
                           "more GPUs do not help this global batch size")
                    out.append(f"{w.base}: {g} x{b} ({t}) is slower than x{a} ({rb['tokens_per_s']:,.0f} vs "
                               f"{ra['tokens_per_s']:,.0f} tokens/s); {why}")
        unproven = sorted({f"{r['gpu']} x{r['num_gpus']}" for r in wr
                           if r.get("solver_status") not in (None, "OPTIMAL")})
        if unproven:
            out.append(f"{w.base}: {len(unproven)} plan(s) hit the solver time limit (FEASIBLE, not proven optimal): "
                       + ", ".join(unproven[:12]) + (" ..." if len(unproven) > 12 else ""))
        errs = {r["option"].rsplit("/", 1)[0]: r for r in rows
                if r["workload"] == w.name and r.get("status") == "error"}
        for r in errs.values():
            out.append(f"{w.base}: {r['gpu']} x{r['num_gpus']} ({r['topology']}) failed: {r['reason']}")
    return out


def _document(study: Study, results: dict[str, dict], complete: bool, elapsed: float, jobs: int,
              time_limit_s: float, *, recommend: bool = True,
              executor: str = "local") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    for w in study.workloads:
        for o in study.options:
            res = results.get(_task_key(w, o))
            if res is None and not complete:
                continue
            rows.append(_row(study, w, o, res))
    cons = study.spec.constraints
    pareto: dict[str, list[str]] = {}
    for w in study.workloads:
        wr = [r for r in rows if r["workload"] == w.name]
        feas = [r for r in wr if r.get("feasible")]
        for r in wr:
            if r.get("feasible"):
                v = violations(Candidate(r["option"], r["time_to_train_days"] * 86400, r["cost_usd"],
                                         r["capex_usd"], r["power_mw"]), cons)
                r["violations"] = v
                r["meets_constraints"] = not v
            else:
                r["violations"] = []
                r["meets_constraints"] = False
        # The Pareto front of time vs cost counts only the options that meet every constraint (budget,
        # capex, power cap, deadline): the recommended option is then always on it.
        ok = [r for r in feas if r["meets_constraints"]]
        flags = pareto_front([(r["time_to_train_days"], r["cost_usd"]) for r in ok])
        for r, on_front in zip(ok, flags):
            r["pareto"] = on_front
        for r in wr:
            r.setdefault("pareto", False)
        pareto[w.name] = [r["option"] for r in feas if r["pareto"]]
    warnings = _warnings(study, rows)
    recs = _recommendations(study, rows) if recommend else []
    if recs:  # the same question under every other power figure the catalog has for these GPUs
        figure = study.spec.pricing.power_figure
        for f in power_figures(study.options):
            if f == figure:
                continue
            alt = dataclasses.replace(study, spec=study.spec.model_copy(update={
                "pricing": study.spec.pricing.model_copy(update={"power_figure": f})}))
            alt_rows = [_row(alt, w, o, results.get(_task_key(w, o))) for w in study.workloads for o in study.options
                        if results.get(_task_key(w, o)) is not None or complete]
            for rec, other in zip(recs, _recommendations(alt, alt_rows)):
                rec.setdefault("under_other_power_figures", {})[f] = {
                    k: other[k] for k in ("option", "time_to_train_days", "cost_usd", "power_mw", "reason")}
        for rec in recs:
            rec["power_figure"] = figure
    recommended = recs[0] if recs else None
    for r in rows:
        r["recommended"] = any(rec["option"] == r["option"] and r["workload"] in rec["workloads"] for rec in recs)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "study": study.name,
        "description": study.spec.description,
        "source": study.source,
        "complete": complete,
        "combine": study.spec.combine,
        "sensitivity_mode": study.spec.sensitivity,
        "workloads": [{"name": w.name, "model": w.model.name, "tokens": w.tokens,
                       "training": w.training.model_dump(mode="json"), "flop_budget": workload_flops(w)}
                      for w in study.workloads],
        "options": [o.id for o in study.options],
        "constraints": cons.model_dump(exclude_none=True),
        "assumptions": list(study.notes),
        "rows": rows,
        "fleet": fleet_answer(study, rows) if study.pools and complete else None,
        "warnings": warnings,
        "pareto": pareto,
        "recommended": recommended,
        "recommendations": recs,
        "timing": {"elapsed_s": elapsed, "jobs": jobs, "executor": executor, "time_limit_s": time_limit_s,
                   "tasks_done": len(results)},
    }
    return json_safe(doc), rows


def results_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), extrasaction="ignore", lineterminator="\n")
    wr.writeheader()
    for r in rows:
        out = {}
        for k in CSV_COLUMNS:
            v = r.get("plan_short") if k == "plan" else r.get(k)
            if isinstance(v, float):
                v = f"{v:.6g}"
            elif isinstance(v, list):
                v = "; ".join(str(x) for x in v)
            elif v is None:
                v = ""
            out[k] = v
        wr.writerow(out)
    return buf.getvalue()


def _write_results(out_dir: Path, doc: dict[str, Any], rows: Sequence[dict[str, Any]]) -> list[Path]:
    paths = [out_dir / "results.json", out_dir / "results.csv"]
    with _write_errors(out_dir):
        atomic_write(paths[1], results_csv(rows))
        atomic_write(paths[0], dumps_json(doc))
    return paths


def _probe_writable(out: Path) -> None:
    """Create the output directory and write (then remove) a probe file in it: one-line InputError
    when that fails (a read-only mount, /proc, a full disk, no permission)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".autoshard-probe-", dir=out)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise InputError(f"cannot write here: {exc.strerror or exc}", source=str(out)) from None


@contextlib.contextmanager
def _write_errors(out_dir: Path) -> Any:
    """An OSError while writing (a full disk, a read-only mount) as one line naming the file."""
    try:
        yield
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(exc.filename or out_dir)) from None


def run_study(study: str | os.PathLike[str] | Mapping[str, Any] | StudySpec | Study, out_dir: str | os.PathLike[str],
              *, jobs: int = 1, time_limit_s: float | None = None, progress: ProgressFn | None = None,
              report: bool = True, executor: str = "local", scheduler: str | None = None) -> StudyResult:
    """Run a what-if study and write its results and report into `out_dir`.

    `jobs`: worker processes (0: one per CPU). `time_limit_s`: per solve (default: the
    study's `time_limit_s`, else 10 s). `progress(done, total, label)` is called with
    done=0 before the first task and after each finished task (label: "workload on
    gpu/num_gpus/topology"). On KeyboardInterrupt the finished rows are written to
    results.json (`complete: false`) and results.csv, and the interrupt is re-raised.

    SIGTERM (Slurm, Kubernetes) is handled like Ctrl-C: it raises `Terminated`, a
    KeyboardInterrupt, after the finished rows are written; workers stop without tracebacks.
    A write that fails (full disk, read-only folder) raises a one-line InputError.

    `executor`: "local" (default: a process pool on this machine) or "dask" (needs the
    `autoshard[dask]` extra): the options are solved on the Dask scheduler at `scheduler`
    (e.g. "tcp://host:8786"; `jobs` is then unused: the cluster's workers decide), else on a
    `distributed.LocalCluster` of `jobs` single-threaded worker processes started for this run.
    Remote workers need the same autoshard installed and any catalog files a study names at the
    same paths. The results are the same as the local executor's (timing fields aside).
    """
    if executor not in EXECUTORS:
        raise InputError(f"unknown executor {executor!r} (valid: {', '.join(EXECUTORS)})", field="executor")
    if scheduler and executor != "dask":
        raise InputError("a scheduler address needs the dask executor", field="scheduler")
    if executor == "dask":
        import_distributed()  # fail on the missing extra before any work
    st = study if isinstance(study, Study) else load_study(study)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a directory", source=str(out))
    _probe_writable(out)  # before any solve: a sweep must not run for an hour and then fail to write
    limit = float(time_limit_s if time_limit_s is not None else (st.spec.time_limit_s or DEFAULT_TIME_LIMIT_S))
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
        raise InputError(f"must be a number of worker processes >= 0 (0: one per CPU), got {jobs!r}", field="jobs")
    jobs = (os.cpu_count() or 1) if jobs == 0 else jobs
    t0 = time.perf_counter()
    with _sigterm_as_interrupt():
        scratch = tempfile.mkdtemp(prefix="autoshard-whatif-")
        results: dict[str, dict] = {}
        written = False
        try:
            tasks = _tasks(st, limit, scratch)
            _execute(list(tasks.values()), jobs, progress, results, executor=executor, scheduler=scheduler)
            doc, rows = _document(st, results, True, time.perf_counter() - t0, jobs, limit, executor=executor)
            files = _write_results(out, doc, rows)
            written = True
        except KeyboardInterrupt:
            # Keep what finished: rows and Pareto flags, no purchase decision (complete: false).
            if not written:
                with _signals_held():  # a second signal must not cut the write short
                    doc, rows = _document(st, results, False, time.perf_counter() - t0, jobs, limit,
                                          recommend=False, executor=executor)
                    _write_results(out, doc, rows)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        errors = [r for r in results.values() if r.get("status") == "error"]
        if results and len(errors) == len(results):  # bad input (exit 2) if any option says so, else a bug (3)
            kind = AutoshardError if any(r.get("input_error") for r in errors) else InternalError
            raise kind(f"every option failed to solve (see {out / 'results.json'}); the first: {errors[0]['reason']}")
        if report:
            with _write_errors(out):
                files += write_report(doc, out)
    return StudyResult(out, True, rows, doc["recommended"], doc["recommendations"], files,
                       time.perf_counter() - t0, doc)

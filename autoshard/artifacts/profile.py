"""`autoshard calibrate --logs ...`: a calibrated catalog overlay from the artifacts a team has.

1. Training logs -> measured runs (`runs.measured_run`): Problem, Plan, steady step time.
2. nccl-tests output -> the topology's level efficiencies, measured: per test, the bus bandwidth at
   large sizes (the median of the rows of at least min(1 GiB, the largest size), the better of
   out-of-place and in-place) over the link rate of the level the test spans (one host: the first
   level, `scaleup`; several hosts: the second, `scaleout`), the median over the tests of a level. An
   all-reduce inside an NVLink-SHARP (NVLS) level is left out: its bus bandwidth includes the switch's
   reduction, which the cost model prices separately. A ratio above 1 is refused (the topology is
   not the one measured); one outside the NCCL-like range 0.75-0.85 is a warning.
3. Profiler traces -> per-term factors where they separate the terms: the GEMM efficiency of the
   run's precision = the model's GEMM time at 100 % efficiency / the measured GEMM kernel time per step
   (median over the runs with traces); the model's GEMM time is read from the cost model itself (the
   compute + recompute time at two efficiencies, T = G / f + rest). A level that no nccl-tests output
   measures gets its efficiency from the traces' large collectives (kernel time includes waiting and
   sharing the GPU with overlapped compute: a lower bound, warned).
4. The factors measured in 2-3 are written into a base overlay and kept; `calibrate()` fits the
   others to the runs' step times (its identifiability rule decides which).
5. Leave-one-run-out: for every run, steps 2-4 without that run's log and traces, then its error;
   "before" is the base catalog's error on the same run. Printed and written in the overlay header.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from ..errors import InputError
from ..fileio import atomic_write, check_output_file
from .files import expand
from .logs import LogRun, read_log, read_toml
from .nccl import NcclTest, read_nccl_tests
from .runs import MeasuredRun, RunContext, measured_run
from .trace import TraceSummary, collective_busbw, read_trace
from ..calibrate import base_efficiencies, efficiency_of, calibrate, network_warnings
from ..catalog import gemm_dtype_of, get_gpu, get_topology
from ..cost import evaluate
from ..validate import with_catalog
from ..validate.modern import gpu_id

LOG_PATTERNS = ("*.log", "*.txt", "*.out", "*.err")
TRACE_PATTERNS = ("*.json", "*.json.gz")
NCCL_PATTERNS = ("*.log", "*.txt", "*.out")
LARGE_BYTES = 2**30
NETWORK_RANGE = (0.75, 0.85)  # as autoshard.calibrate.NETWORK_RANGE (README: NCCL-like)
MATMUL_RANGE = (0.2, 1.0)  # calibrate's search range (LO, HI)


@dataclass
class Measured:
    """Factors measured from nccl-tests / traces for one GPU: name -> (value, how)."""

    factors: dict[str, tuple[float, str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass
class ArtifactCalibration:
    out_path: str
    runs: list[dict[str, Any]]  # id, log, format, steps, step_s, plan
    measured: dict[str, dict[str, Any]]  # gpu -> factor -> {value, how}
    fitted: dict[str, list[str]]  # gpu -> factors fitted by calibrate
    in_sample_before_pct: dict[str, float]
    in_sample_after_pct: dict[str, float]
    loo_before_pct: dict[str, float]
    loo_after_pct: dict[str, float]
    warnings: list[str]
    inputs: list[str]

    def summary(self) -> str:
        """What `calibrate --logs` prints: the same lines as the overlay's header (`report_lines`)."""
        return f"wrote {self.out_path}\n" + "\n".join(report_lines(self)) + "\n"


def report_lines(r: ArtifactCalibration) -> list[str]:
    """The calibration's one rendering, printed by `calibrate --logs` and written (as comments) at the
    top of the overlay: inputs, each run's steady step, the measured and the fitted factors, the error
    before -> after in sample and leave-one-run-out (the warnings go to stderr and into the header)."""
    lines = [f"calibrated on {len(r.runs)} run(s) from {len(r.inputs)} file(s)", "inputs:"]
    lines += [f"  {p}" for p in r.inputs]
    lines.append("runs (steady step time = median over the logged values after warm-up):")
    lines += [f"  {x['id']}: {x['format']} {x['gpu']} x{x['num_gpus']} {x['plan']}: {x['step_s']:.6g} s "
              f"({x['steady']} of {x['logged']} values)" for x in r.runs]
    for gpu, facs in sorted(r.measured.items()):
        lines += [f"  {gpu} {name} = {d['value']:.4g} measured: {d['how']}" for name, d in sorted(facs.items())]
    for gpu, names in sorted(r.fitted.items()):
        lines.append(f"  {gpu}: fitted to step times: {', '.join(names) or 'nothing'}")
    lines.append("error on your runs, |predicted - measured| / measured (median):")
    lines.append(f"  in-sample:            {_med(r.in_sample_before_pct)} -> {_med(r.in_sample_after_pct)}")
    if r.loo_after_pct:
        lines.append(f"  leave-one-run-out:    {_med(r.loo_before_pct)} -> {_med(r.loo_after_pct)}")
        lines += [f"    {rid}: {r.loo_before_pct[rid]:+.1f}% -> {r.loo_after_pct[rid]:+.1f}%"
                  for rid in sorted(r.loo_after_pct)]
    else:
        lines.append("  leave-one-run-out:    needs at least 2 runs")
    return lines


def _med(errs: dict[str, float]) -> str:
    return f"{statistics.median(abs(v) for v in errs.values()):.1f}%" if errs else "n/a"


def _gemm_key(precision: str) -> str:
    return gemm_dtype_of(precision)


# ---------------------------------------------------------------------------------------------
# nccl-tests -> level efficiencies
# ---------------------------------------------------------------------------------------------


def _levels_of(problem: Any) -> list[Any]:
    topo = problem.cluster.topology if problem.cluster.topology is not None else get_gpu(problem.cluster.gpu).default_topology
    return list(get_topology(topo).levels) if isinstance(topo, str) else list(topo)


def nccl_factors(tests: list[NcclTest], problem: Any) -> Measured:
    """Level efficiencies (scaleup / scaleout) from nccl-tests on the cluster of `problem`."""
    out = Measured()
    levels = _levels_of(problem)
    per: dict[str, list[tuple[float, str]]] = {}
    for t in tests:
        if t.ranks < 2:
            out.warnings.append(f"{Path(t.path).name}: {t.ranks} rank: no bus traffic, not used")
            continue
        li = 0 if t.nodes <= 1 and t.ranks <= levels[0].size else 1
        if li >= len(levels):
            out.warnings.append(f"{Path(t.path).name}: spans {t.nodes} hosts but the topology has one level: not used")
            continue
        lv = levels[li]
        if li == 0 and t.collective == "all_reduce" and lv.sharp:
            out.warnings.append(f"{Path(t.path).name}: all_reduce on the NVLink-SHARP level {lv.name}: its bus bandwidth "
                                "includes the switch reduction (priced separately), not used for the level's efficiency")
            continue
        busbw, rows = t.large_busbw_gb_per_s(min(LARGE_BYTES, max(r.size_bytes for r in t.rows)))
        ratio = busbw / lv.bandwidth_gb_per_s
        name = "scaleup" if li == 0 else "scaleout"
        where = f"{Path(t.path).name} line {rows[0].line}"
        if ratio > 1.0:
            raise InputError(f"{t.collective} bus bandwidth {busbw:g} GB/s over {t.ranks} ranks is above the "
                             f"{lv.bandwidth_gb_per_s:g} GB/s per GPU of level {lv.name!r}: the topology is not the "
                             "one measured (give --topology)", source=f"{t.path}:{rows[0].line}")
        per.setdefault(name, []).append((ratio, f"{t.collective} {t.ranks} ranks/{t.nodes} host(s) "
                                                f"{busbw:g} GB/s busbw at >= {rows[0].size_bytes:,} B ({where}) / "
                                                f"{lv.bandwidth_gb_per_s:g} GB/s {lv.name}"))
    for name, vals in per.items():
        v = statistics.median(r for r, _ in vals)
        out.factors[name] = (round(v, 4), "; ".join(h for _, h in vals))
        lo, hi = NETWORK_RANGE
        if not lo <= v <= hi:
            out.warnings.append(f"{name} = {v:.3g} measured by nccl-tests is outside the NCCL-like range {lo:g}-{hi:g} of "
                                "the link rate: check the topology's link rates and the test's size range")
    return out


# ---------------------------------------------------------------------------------------------
# Traces -> GEMM efficiency, collective efficiency
# ---------------------------------------------------------------------------------------------


def _with_matmul(case: Any, gpu_eff: dict[str, Any], key: str, value: float, tmp: Path, n: int) -> Any:
    eff = {k: (dict(v) if isinstance(v, dict) else v) for k, v in gpu_eff.items()}
    eff["matmul"][key] = value
    p = tmp / f"gemm-{n}.yaml"
    p.write_text(yaml.safe_dump({"gpus": {case.gpu: {"efficiency": eff}}}), encoding="utf-8")
    return with_catalog(case, p)


def model_gemm_time_s(case: Any, base_eff: dict[str, Any]) -> float:
    """The cost model's GEMM time of the run per step at 100 % GEMM efficiency: compute + recompute is
    G / f + rest in the GEMM efficiency f, so G = (T(f1) - T(f2)) / (1/f1 - 1/f2)."""
    key = _gemm_key(case.precision)
    f0 = float(base_eff["matmul"].get(key, base_eff["matmul"].get("bf16")))
    f1, f2 = f0, f0 * 0.8
    with tempfile.TemporaryDirectory(prefix="autoshard-gemm-") as d:
        tmp = Path(d)
        t = []
        for i, f in enumerate((f1, f2)):
            c = _with_matmul(case, base_eff, key, f, tmp, i)
            est = evaluate(c.problem, c.plan)
            t.append(est.time_breakdown_s.get("compute", 0.0) + est.time_breakdown_s.get("recompute", 0.0))
    return (t[0] - t[1]) / (1 / f1 - 1 / f2)


def trace_factors(runs: list[MeasuredRun], traces: dict[str, list[TraceSummary]], base: dict[str, dict[str, Any]],
                  measured_net: set[str]) -> dict[str, Measured]:
    """Per GPU: matmul.<dtype> from GEMM kernel time; scaleup / scaleout from collectives where no
    nccl-tests measure them."""
    out: dict[str, Measured] = {}
    gemm: dict[tuple[str, str], list[tuple[float, str]]] = {}
    net: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for r in runs:
        ts = traces.get(r.id) or []
        if not ts:
            continue
        case = r.case()
        eff = base[case.gpu]
        measured_gemm = statistics.mean(t.by_class_s["gemm"] for t in ts)
        key = _gemm_key(case.precision)
        if measured_gemm > 0:
            g = model_gemm_time_s(case, eff)
            gemm.setdefault((case.gpu, key), []).append(
                (g / measured_gemm, f"{r.id}: model GEMM time at 100% {g:.4g} s / measured GEMM kernels "
                                    f"{measured_gemm:.4g} s per step ({len(ts)} trace(s))"))
        levels = _levels_of(case.problem)
        for t in ts:
            for c in t.collectives:
                bw = collective_busbw(c)
                if bw is None or c.bytes < 2**24:
                    continue
                li = 0 if c.group_size <= levels[0].size else 1
                if li >= len(levels) or (li == 0 and c.kind == "all_reduce" and levels[0].sharp):
                    continue
                name = "scaleup" if li == 0 else "scaleout"
                net.setdefault((case.gpu, name), []).append(
                    (bw / (levels[li].bandwidth_gb_per_s * 1e9),
                     f"{Path(t.path).name}: {c.kind} {c.bytes:,} B over {c.group_size} ranks"))
    for (gpu, key), vals in sorted(gemm.items()):
        m = out.setdefault(gpu, Measured())
        v = statistics.median(x for x, _ in vals)
        lo, hi = MATMUL_RANGE
        if not lo <= v <= hi:
            m.warnings.append(f"matmul.{key} = {v:.3g} from the traces is outside its physical range [{lo:g}, {hi:g}] "
                              "(GEMM time at the peak rate / measured GEMM time): the model counts GEMM work the run "
                              "does not do, or the kernels were misclassified; clipped")
            v = min(hi, max(lo, v))
        m.factors[f"matmul.{key}"] = (round(v, 4), "; ".join(h for _, h in vals))
    for (gpu, name), vals in sorted(net.items()):
        if name in measured_net:
            continue
        m = out.setdefault(gpu, Measured())
        v = min(1.0, statistics.median(x for x, _ in vals))
        m.factors[name] = (round(v, 4), f"traces' collectives (median of {len(vals)}): " + "; ".join(h for _, h in vals[:3]))
        m.warnings.append(f"{name} = {v:.3g} from profiler NCCL kernel times, a lower bound (kernels wait for late ranks "
                          "and share the GPU with overlapped compute): nccl-tests output measures it better")
    return out


# ---------------------------------------------------------------------------------------------
# The calibration
# ---------------------------------------------------------------------------------------------


def _base_efficiency(gpu: str, base_catalog: str | None) -> dict[str, Any]:
    return efficiency_of(gpu, base_efficiencies(base_catalog))


def _errors(cases: list[Any], catalog: str | None) -> dict[str, float]:
    out = {}
    for c in cases:
        est = evaluate(with_catalog(c, catalog).problem, c.plan)
        out[c.id] = (est.step_time_s - c.measured_step_s) / c.measured_step_s * 100.0 if est.step_time_s > 0 else math.nan
    return out


def _fit(runs: list[MeasuredRun], tests: list[NcclTest], traces: dict[str, list[TraceSummary]],
         base_catalog: str | None, out_path: str, tmp: Path, tag: str,
         progress: Callable[[str], None] | None = None, common_ratio: bool = False
         ) -> tuple[Any, dict[str, Measured], str]:
    """Measure, then fit the rest: returns (calibrate's result, measured factors per GPU, base overlay path)."""
    cases = [r.case() for r in runs]
    gpus = sorted({c.gpu for c in cases})
    base = {g: _base_efficiency(g, base_catalog) for g in gpus}
    measured: dict[str, Measured] = {}
    for g in gpus:
        first = next(r for r in runs if r.problem.cluster.gpu == g)
        measured[g] = nccl_factors([t for t in tests if not t.gpu_name or _same_gpu(t.gpu_name, g)], first.problem)
    for g, m in trace_factors(runs, traces, base, {n for g in gpus for n in measured[g].factors}).items():
        measured[g].factors.update(m.factors)
        measured[g].warnings.extend(m.warnings)
    entries = {g: e for g, e in base_efficiencies(base_catalog).items()}
    keep: set[str] = set()
    for g in gpus:
        eff = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base[g].items()}
        for name, (v, _) in measured[g].factors.items():
            if name.startswith("matmul."):
                eff["matmul"][name.split(".", 1)[1]] = v
            else:
                eff[name] = v
            keep.add(name)
        entries[g] = eff
    base_path = tmp / f"base-{tag}.yaml"
    base_path.write_text(yaml.safe_dump({"gpus": {g: {"efficiency": e} for g, e in sorted(entries.items())}}),
                         encoding="utf-8")
    res = calibrate(f"{len(runs)} training log(s)", out_path, base_catalog=str(base_path), cases=cases,
                    keep_factors=tuple(sorted(keep)), progress=progress, common_ratio=common_ratio)
    return res, measured, str(base_path)


def _same_gpu(name: str, gpu: str) -> bool:
    gid = gpu_id(name)
    return gid is None or gid == gpu


def load_inputs(logs: list[str], traces: list[str], nccl: list[str], configs: list[str], ctx: RunContext
                ) -> tuple[list[MeasuredRun], dict[str, list[TraceSummary]], list[NcclTest], list[str]]:
    log_files = expand(logs, LOG_PATTERNS, "training logs")
    trace_files = expand(traces, TRACE_PATTERNS, "profiler traces") if traces else []
    nccl_files = expand(nccl, NCCL_PATTERNS, "nccl-tests output") if nccl else []
    cfg_files = expand(configs, ("*.toml",), "TOML job configs") if configs else []
    logs_read: list[LogRun] = [read_log(p) for p in log_files]
    cfgs = {str(p): read_toml(p) for p in cfg_files}
    for lr in logs_read:
        if lr.format != "torchtitan":
            continue
        near_cfg = [c for c in cfgs if Path(c).parent == Path(lr.path).parent]
        pick = near_cfg if len(near_cfg) == 1 else list(cfgs) if len(cfgs) == 1 else []
        if pick:
            ctx.configs[lr.path] = cfgs[pick[0]]
    runs = [measured_run(lr, ctx, i + 1) for i, lr in enumerate(logs_read)]
    stems = [Path(r.log.path).stem for r in runs]
    if len(set(stems)) < len(stems):  # train.log in a folder per run: name the runs by their folders
        for r in runs:
            r.id = f"{r.id[:2]}-{Path(r.log.path).parent.name}-{Path(r.log.path).stem}"
    by_run: dict[str, list[TraceSummary]] = {}
    for p in trace_files:
        t = read_trace(p)
        near = [r for r in runs if Path(r.log.path).parent == p.parent]
        if len(near) != 1 and len(runs) != 1:
            raise InputError("which run does this trace belong to? put each run's log and traces in a folder of their "
                             f"own ({len(near)} logs in this trace's folder)", source=str(p))
        owner = near[0] if len(near) == 1 else runs[0]
        by_run.setdefault(owner.id, []).append(t)
    tests = [read_nccl_tests(p) for p in nccl_files]
    inputs = [str(p) for p in [*log_files, *cfg_files, *trace_files, *nccl_files]]
    return runs, by_run, tests, inputs


def calibrate_artifacts(runs: list[MeasuredRun], traces: dict[str, list[TraceSummary]], tests: list[NcclTest],
                        out_path: str, *, inputs: list[str], base_catalog: str | None = None, loo: bool = True,
                        progress: Callable[[str], None] | None = None,
                        common_ratio: bool = False) -> ArtifactCalibration:
    check_output_file(out_path)
    out_real = os.path.realpath(out_path)
    for p in inputs:
        if os.path.realpath(p) == out_real:
            raise InputError("the output is one of the inputs: it would be replaced", source=str(out_path),
                             field="--output")
    if not runs:
        raise InputError("no training runs to calibrate on", field="--logs")
    with tempfile.TemporaryDirectory(prefix="autoshard-artifacts-") as d:
        tmp = Path(d)
        scratch_out = tmp / "fit.yaml"
        res, measured, _ = _fit(runs, tests, traces, base_catalog, str(scratch_out), tmp, "all", progress,
                                  common_ratio)
        cases = [r.case() for r in runs]
        before = _errors(cases, base_catalog)
        after = _errors(cases, str(scratch_out))
        loo_before: dict[str, float] = {}
        loo_after: dict[str, float] = {}
        if loo and len(runs) >= 2:
            for i, r in enumerate(runs):
                if progress:
                    progress(f"leave-one-run-out {i + 1}/{len(runs)}: without {r.id}")
                rest = [x for x in runs if x.id != r.id]
                out_i = tmp / f"loo-{i}.yaml"
                _fit(rest, tests, {k: v for k, v in traces.items() if k != r.id}, base_catalog, str(out_i), tmp,
                     f"loo{i}", common_ratio=common_ratio)
                c = r.case()
                loo_before[r.id] = before[r.id]
                loo_after[r.id] = _errors([c], str(out_i))[r.id]
        text = scratch_out.read_text(encoding="utf-8")
    warnings: list[str] = []
    for g, m in sorted(measured.items()):
        warnings.extend(f"{g}: {w}" for w in m.warnings)
    for fit in res.fits:
        warnings.extend(f"{fit.gpu}: {w}" for w in fit.warnings)
        capped = [name for name, why in fit.kept.items() if "identify at most" in why]
        if capped:
            warnings.append(f"{fit.gpu}: {len(fit.runs)} run(s) fit at most {max(1, len(fit.runs) // 2)} factor(s); "
                            f"{'moved by the common ratio only' if 'step' in fit.fitted else 'kept at their base values'}: "
                            f"{', '.join(capped)} (more runs, differing in size, layout or "
                            "node count, let the fit tell them apart)")
        for name, why in fit.kept.items():
            if why.startswith("not identified"):
                moved = "moves with the common ratio only" if "step" in fit.fitted else "keeps its base value"
                warnings.append(f"{fit.gpu}: the runs cannot tell {name} apart from the factors before it ({why}); it "
                                f"{moved}: add runs that differ in it (another size, parallel layout or node count)")

    warnings.extend(network_warnings(res))
    if len(runs) < 2:
        warnings.append("one run: no leave-one-run-out check is possible; the fit is not proven on held-back runs")
    result = ArtifactCalibration(
        out_path=str(out_path),
        runs=[{"id": r.id, "log": r.log.path, "format": r.log.format, "steady": len(r.log.steady),
               "logged": len(r.log.samples), "step_s": r.log.step_s, "plan": r.plan.short(),
               "gpu": r.problem.cluster.gpu, "num_gpus": r.problem.cluster.num_gpus, "notes": r.notes} for r in runs],
        measured={g: {n: {"value": v, "how": h} for n, (v, h) in m.factors.items()} for g, m in measured.items()},
        fitted={f.gpu: list(f.fitted) for f in res.fits},
        in_sample_before_pct=before, in_sample_after_pct=after, loo_before_pct=loo_before, loo_after_pct=loo_after,
        warnings=warnings, inputs=inputs)
    _write(out_path, _header(result) + text)
    return result


def _header(r: ArtifactCalibration) -> str:
    """The overlay's comment header: how to use it, then `report_lines`."""
    lines = ["autoshard calibrate --logs: a catalog overlay calibrated from training artifacts.",
             "Use it with `cluster: {catalog: <this file>}` in a problem (solve, evaluate, batch, whatif).", "",
             *report_lines(r), *(f"warning: {w}" for w in r.warnings), ""]
    return "".join(f"# {ln}".rstrip() + "\n" for ln in lines)


def _write(path: str, text: str) -> None:
    try:
        atomic_write(path, text)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path), field="--output") from None


def to_json(r: ArtifactCalibration) -> dict[str, Any]:
    return dataclasses.asdict(r)


def leave_one_out(cases: list[Any], ids: list[str], base_catalog: str | None = None,
                  progress: Callable[[str], None] | None = None, common_ratio: bool = False
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Leave-one-run-out of `calibrate()` on converted runs (a runs file): for each run of `ids`, fit on
    the others and predict it. Returns (before, after): signed errors % under the base catalog and under
    the fit without the run."""
    by_id = {c.id: c for c in cases}
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="autoshard-loo-") as d:
        for i, rid in enumerate(ids):
            if progress:
                progress(f"leave-one-run-out {i + 1}/{len(ids)}: without {rid}")
            rest = [c for c in cases if c.id != rid and c.id in ids]
            held = by_id[rid]
            before[rid] = _errors([held], base_catalog)[rid]
            if not rest:
                continue
            out = Path(d) / f"loo-{i}.yaml"
            try:
                calibrate(f"without {rid}", out, base_catalog=base_catalog, cases=rest, common_ratio=common_ratio)
            except InputError:  # nothing left to fit on for this GPU: the base catalog predicts it
                after[rid] = before[rid]
                continue
            after[rid] = _errors([held], str(out))[rid]
    return before, after


def format_loo(before: dict[str, float], after: dict[str, float]) -> str:
    if not after:
        return "leave-one-run-out: needs at least 2 runs\n"
    lines = [f"leave-one-run-out, median |error|: {_med(before)} -> {_med(after)}"]
    lines += [f"  {rid}: {before[rid]:+.1f}% -> {after[rid]:+.1f}%" for rid in sorted(after)]
    return "\n".join(lines) + "\n"


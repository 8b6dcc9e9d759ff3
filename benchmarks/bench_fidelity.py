"""Fidelity: predicted vs measured step times and plan orders on the three validation files.

    python benchmarks/bench_fidelity.py [--full] [--json] [--markdown] [--loso] [--catalog OVERLAY]
                                        [--calibrate] [--runs PATH] [--modern PATH] [--ablations PATH]
                                        [--write-intervals [PATH]]

Run it before and after every cost-model change (about 10 s). It prints, for
validation/dev_runs.json (the project's copies; $AUTOSHARD_VALIDATION overrides) (2021-2024 Megatron dense runs) and modern_runs_dev.json
(2024-2026 stacks: MoE, Blackwell, FP8 recipes) the summary (median, p90, worst |error|) and
the per-source and per-regime tables, and for ablations_dev.json the ranking summary
(pairwise concordance, blind pairs, top-1, OOM/fit). `--full` adds every run and every group;
the activation-memory check against Korthikanti et al. 2022 closes the output.
`--calibrate` also fits the catalog's efficiency factors on dev_runs (into a temporary overlay)
and prints that file's table again with them.
`--loso` adds leave-one-source-out (autoshard/validate/loso.py, about 30 s on two cores): for each
source family of the three files every fitted factor is refitted without it (calibrate's objective
and grid, one sweep, parabolic refinement), its runs and its ablation pairs are predicted, and the
LOSO median / p90 / worst and pair concordance print beside the in-sample figures, with the table of
fitted factors. `--markdown` prints docs/fidelity.md (its LOSO tables included, and the same check of a
structure with fewer factors: about a minute).
`--write-intervals` fits the prediction intervals (measured/predicted quantiles per regime) on
the dev and modern residuals and writes autoshard/data/intervals.yaml (or PATH).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoshard.calibrate import calibrate, format_calibration  # noqa: E402
from autoshard.validate import (  # noqa: E402
    format_groups,
    format_korthikanti,
    format_report,
    korthikanti_check,
    memory_line,
    validate,
    validation_file,
)
from autoshard.validate.ablations import format_ablations, summary_line, validate_ablations  # noqa: E402
from autoshard.validate.loso import GLOBAL_FACTORS, PER_GPU_FACTORS, format_loso, loso, markdown_loso, markdown_trial  # noqa: E402



def summary_text(report, title: str) -> str:  # type: ignore[no-untyped-def]
    s = report.summary
    lines = [f"== {title}: {report.runs_path}",
             f"summary: n={s.n} (skipped {len(report.skipped)})  median |err| {s.median_abs_error_pct:.1f}%  "
             f"p90 |err| {s.p90_abs_error_pct:.1f}%  worst {s.worst_id} ({s.worst_error_pct:+.1f}%)"]
    if report.memory is not None:
        lines.append(memory_line(report.memory))
    lines.append("")
    lines += format_groups(report.by_source, "source")
    lines.append("")
    lines += format_groups(report.by_regime, "regime")
    return "\n".join(lines)


def _md_groups(report, title: str) -> list[str]:  # type: ignore[no-untyped-def]
    rows = [f"| {title} | runs | median \\|err\\| | p90 \\|err\\| | median signed | worst |", "|---|---|---|---|---|---|"]
    for g in list(report.by_source) + [None] + list(report.by_regime):
        if g is None:
            rows.append("| *by regime* | | | | | |")
            continue
        rows.append(f"| {g.source_group} | {g.runs} | {g.median_abs_error_pct:.1f}% | {g.p90_abs_error_pct:.1f}% | "
                    f"{g.median_error_pct:+.1f}% | {g.worst_error_pct:+.1f}% ({g.worst_id}) |")
    s = report.summary
    rows.append(f"| **all** | **{s.n}** | **{s.median_abs_error_pct:.1f}%** | **{s.p90_abs_error_pct:.1f}%** | | "
                f"**{s.worst_error_pct:+.1f}%** ({s.worst_id}) |")
    return rows


def per_file_loso(lo, dev, modern) -> list[str]:  # type: ignore[no-untyped-def]
    """LOSO median / p90 / worst per runs file, beside its in-sample (catalog) figures."""
    import statistics  # noqa: PLC0415

    from autoshard.validate import p90  # noqa: PLC0415

    out = []
    for name, rep in (("dev", dev), ("modern", modern)):
        if rep is None:
            continue
        ids = [r.id for r in rep.results if r.id in lo.errors]
        if not ids:
            continue
        e = [lo.errors[i]["loso"] for i in ids]
        a = [abs(x) for x in e]
        s = rep.summary
        out.append(f"{name}: in-sample median {s.median_abs_error_pct:.1f}% p90 {s.p90_abs_error_pct:.1f}%  ->  LOSO "
                   f"median {statistics.median(a):.1f}% p90 {p90(a):.1f}% worst {max(e, key=abs):+.1f}% "
                   f"(n={len(ids)})")
    return out


def markdown(dev, modern, abl, lo=None, trial=None) -> str:  # type: ignore[no-untyped-def]
    """docs/fidelity.md: the fidelity tables, from this run."""
    from autoshard.cost.intervals import table  # noqa: PLC0415

    out = ["# Fidelity", "",
           "Generated by `python benchmarks/bench_fidelity.py --markdown` (do not edit by hand): predicted vs "
           "measured step times and plan orders on the project's `validation/` files, in-sample (the catalog "
           "as shipped, whose factors were fitted on these rows) and leave-one-source-out (LOSO: every fitted "
           "factor refitted without the family, autoshard/validate/loso.py). A cost-model change is adopted "
           "when LOSO improves, never on the in-sample figures alone.", ""]
    if lo is not None:
        out += ["## Leave-one-source-out", "",
                "A source family is a row's `source_family` (validation/README.md: the publication series, e.g. "
                "Megatron-Bridge's performance summaries of every release, torchtitan's benchmarks and docs). For each "
                "family, every fitted factor is refitted on its rows outside the family and the family's runs and "
                "ablation pairs are priced with them. Fit: calibrate's objective (sum of squared log errors) on its "
                "17-point grid over [0.2, 1] (framework factors: a linear grid over their range), a parabola through "
                "the best three points instead of the golden-section steps, one sweep, each factor with the others at "
                "their catalog values. The matmul factors are end-to-end factors per GPU generation and precision "
                "(autoshard/data/matmul.yaml) over each GPU's sourced GEMM rate (published MAMF x the clock under "
                "its power limit, autoshard/data/gpus.yaml `gemm_achievable`, not fitted): a GPU whose rows are "
                "left out is priced from its own sourced rate. A factor whose rows all belong to the left-out "
                "family takes its prior: for a matmul factor the geometric mean of the same precision's other "
                "fitted factors in that fold, for a framework factor the value without the term. Factors fitted on ablation groups (allocator "
                "overhead, recompute-module host time) keep their value unless their family is the one left out. "
                "'refit' is the same procedure on every row (in-sample), 'catalog' the values as shipped.", ""]
        out += [f"- {line}" for line in per_file_loso(lo, dev, modern)]
        out += ["", "Per left-out family (catalog = in-sample as shipped; refit = this procedure on every row; LOSO "
                "= refitted without the family). Ablation pairs: those measured >= 8% apart, ordered right.", ""]
        out += markdown_loso(lo)
        if trial is not None:
            out += ["", "Other factor structures, measured by the same procedure (the catalog is not changed by them): "
                    "the structure before 2026-11-27, one free matmul factor per GPU and precision (a factor left "
                    "without rows takes its GPU's sourced rate x the others' fitted / sourced ratio), and one "
                    "end-to-end factor per precision for every GPU.", ""]
            out += markdown_trial(lo, trial)
        out += ["", "Fitted factors not refitted here: the GEMM shape constants GEMM_K_OVERHEAD and "
                "STREAM_K_RECOVERY (autoshard/cost/constants.py, fitted with the matmul efficiencies), held at "
                "their values; the attention constants are fitted on kernel measurements "
                "(autoshard/data/kernel_measurements.json), not on these rows.", "", "## In-sample", ""]
    out += [f"Dev runs (`dev_runs.json`, {dev.summary.n} priced, {len(dev.skipped)} skipped):", ""]
    out += _md_groups(dev, "source")
    if modern:
        out += ["", f"Modern runs (`modern_runs_dev.json`, {modern.summary.n} priced, {len(modern.skipped)} "
                "skipped with the reason in the report):", ""]
        out += _md_groups(modern, "source")
        if modern.memory is not None:
            m = modern.memory
            out += ["", f"Peak memory of the {m.n} modern runs that state it (the allocator's peak, against the "
                    f"model's allocated peak without the runtime reserve): median |err| {m.median_abs_error_pct:.1f}%, "
                    f"p90 {m.p90_abs_error_pct:.1f}%, worst {m.worst_error_pct:+.1f}% ({m.worst_id}); predicted not to "
                    f"fit but ran: {m.predicted_oom_that_ran}."]
    if abl:
        s = abl.summary
        out += ["", f"Ranking (`ablations_dev.json`, {s.groups} groups): concordance {s.pairs_concordant}/"
                f"{s.pairs_compared} = {s.concordance_pct:.0f}% of the pairs measured >= 8% apart, "
                f"{s.blind_pairs} pairs predicted equal (within 1%) that measured >= 4% apart, top-1 "
                f"{s.top1_agree}/{s.top1_groups}, OOM/fit {s.oom_agree}/{s.oom_total}.", "",
                "| group | metric | configs | concordant / compared | predicted equal, measured apart (knob) | top-1 | OOM/fit |",
                "|---|---|---|---|---|---|---|"]
        for g in abl.groups:
            blind = "; ".join(f"#{p.a}/#{p.b} {p.measured_apart_pct:.0f}% ({'+'.join(k.split(':')[0] for k in p.knobs)})" for p in g.blind)
            top = "-" if g.top1 is None else "yes" if g.top1 else "no"
            out.append(f"| {g.id} | {g.metric} | {len(g.configs)} | {g.concordant}/{len(g.compared)} | {blind or '-'} | "
                       f"{top} | {g.oom_agree}/{g.oom_total} |")
    doc = table()
    if doc:
        out += ["", f"Prediction intervals (`autoshard/data/intervals.yaml`, {doc['date']}: measured / predicted "
                "over the dev and modern runs):", "",
                "| regime | runs | 10th pct | median | 90th pct |", "|---|---|---|---|---|"]
        for name, q in doc["regimes"].items():
            out.append(f"| {name} | {q['n']} | {q['low']:.2f} | {q['median']:.2f} | {q['high']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(validation_file("dev_runs.json")),
                    help="dev runs file (default: the project's validation/, or $AUTOSHARD_VALIDATION)")
    ap.add_argument("--modern", default=str(validation_file("modern_runs_dev.json")), help="modern runs file")
    ap.add_argument("--ablations", default=str(validation_file("ablations_dev.json")), help="ablation groups file")
    ap.add_argument("--catalog", help="calibrated catalog overlay to apply")
    ap.add_argument("--full", action="store_true", help="every run and every ablation group, not only the summaries")
    ap.add_argument("--calibrate", action="store_true", help="also fit the efficiency factors on dev_runs and re-validate")
    ap.add_argument("--json", action="store_true", help="print the three reports as one JSON document")
    ap.add_argument("--markdown", action="store_true", help="print the README's fidelity tables (per source, "
                    "per regime, ranking, intervals) from this run")
    ap.add_argument("--loso", action="store_true", help="also leave-one-source-out: refit every fitted factor "
                    "without each source family and predict its runs and ablation pairs (about 30 s)")
    ap.add_argument("--write-intervals", nargs="?", const="", default=None, metavar="PATH",
                    help="write the prediction intervals fitted on the dev and modern residuals "
                         "(default autoshard/data/intervals.yaml)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    dev = validate(args.runs, catalog=args.catalog)
    t_dev = time.perf_counter() - t0
    modern = validate(args.modern, catalog=args.catalog) if Path(args.modern).is_file() else None
    t_mod = time.perf_counter() - t0 - t_dev
    abl = validate_ablations(args.ablations, catalog=args.catalog) if Path(args.ablations).is_file() else None
    t_abl = time.perf_counter() - t0 - t_dev - t_mod

    if args.write_intervals is not None:
        from autoshard.cost.intervals import DATA_PATH, fit_intervals, write_intervals  # noqa: PLC0415

        out = Path(args.write_intervals) if args.write_intervals else DATA_PATH
        reports = [r for r in (dev, modern) if r is not None]
        doc = fit_intervals(reports)
        write_intervals(doc, out)
        print(f"wrote {out}: " + ", ".join(f"{k} n={v['n']} [{v['low']:.3f}, {v['high']:.3f}]"
                                           for k, v in doc["regimes"].items()))
        return 0

    lo = None
    if args.loso or args.markdown:
        t0 = time.perf_counter()
        lo = loso([p for p in (args.runs, args.modern) if Path(p).is_file()],
                  args.ablations if Path(args.ablations).is_file() else None)
        t_loso = time.perf_counter() - t0
    if args.markdown:
        runs = [p for p in (args.runs, args.modern) if Path(p).is_file()]
        abl_path = args.ablations if Path(args.ablations).is_file() else None
        trial = [("one free matmul factor per GPU and precision (before 2026-11-27)",
                  loso(runs, abl_path, factors=PER_GPU_FACTORS)),
                 ("one end-to-end factor per precision for every GPU", loso(runs, abl_path, factors=GLOBAL_FACTORS))]
        print(markdown(dev, modern, abl, lo, trial))
        return 0
    if args.json:
        print(json.dumps({"dev": dev.to_json(), "modern": modern.to_json() if modern else None,
                          "ablations": abl.to_json() if abl else None,
                          "loso": dataclasses.asdict(lo) if lo is not None else None},
                         indent=2, sort_keys=True, default=str))
        return 0

    if args.full:
        print(format_report(dev))
        print()
        if modern:
            print(format_report(modern))
            print()
        if abl:
            print(format_ablations(abl))
            print()
    print(summary_text(dev, "dev runs"))
    print()
    if modern:
        print(summary_text(modern, "modern runs"))
        print()
    if abl:
        print(f"== ablations: {abl.path}")
        print(summary_line(abl.summary))
        print()
    if lo is not None:
        print(format_loso(lo))
        print("\n".join(per_file_loso(lo, dev, modern)))
        print()
    print(f"(dev {t_dev:.1f} s, modern {t_mod:.1f} s, ablations {t_abl:.1f} s"
          + (f", LOSO {t_loso:.1f} s)" if lo is not None else ")"))
    if args.full:
        print("\nActivation memory per layer vs Korthikanti et al. 2022 (GPT-3 175B layer, s=2048, b=1, t=8, "
              "no FlashAttention):")
        print(format_korthikanti(korthikanti_check()))
    if args.calibrate:
        with tempfile.TemporaryDirectory(prefix="autoshard-fidelity-") as tmp:
            out = Path(tmp) / "calibrated.yaml"
            t0 = time.perf_counter()
            result = calibrate(dev.runs_path, out, base_catalog=args.catalog)
            dt = time.perf_counter() - t0
            print(f"\nCalibration on the dev runs ({dt:.1f} s):")
            print(format_calibration(result))
            print("\nWith the calibrated catalog:")
            print(format_report(validate(dev.runs_path, catalog=out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

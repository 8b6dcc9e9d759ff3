"""Calibrate on two plans of a group, rank the rest: the way a team would use `autoshard calibrate`.

On the published ablation groups (`validation/ablations_dev.json`: several measured plans of one
model on one cluster), for every group with at least three measured configurations that price:

* calibrate (`autoshard.calibrate.calibrate`, the fit of `autoshard calibrate`; `--method` picks its
  options, default `--common-ratio`) on two of
  its configurations: the first two listed ("first two", what a team running two trial jobs does),
  and, separately, every pair of them ("every pair", averaged by pooling);
* price every configuration of the group with and without the calibrated overlay
  (`validate.ablations.group_result`, the same pricing as `autoshard validate --ablations`);
* score only what the calibration did not see: the step-time error of each held-out configuration
  (|predicted - measured| / measured, the median over all held-out evaluations) and the pair
  concordance over the pairs with at least one held-out member that were measured at least 8 % apart
  (the validate rule).

    PYTHONPATH=. python benchmarks/bench_calibrate_groups.py [--groups FILE] [--every-pair] [--markdown]
        [--method one-factor|common-ratio|common-ratio+1] [--compare]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autoshard.calibrate import STEP, calibrate
from autoshard.validate import Case, completed_plan
from autoshard.validate.ablations import APART, config_row, group_result, load_groups
from autoshard.validate.modern import modern_row_to_case

# The project's copy (facts as fields, GPU names the catalog resolves), not shared/validation's older one.
DEFAULT = Path(__file__).resolve().parents[1] / "validation" / "ablations_dev.json"


def measured_step_s(group: dict[str, Any], measured: dict[str, Any]) -> float | None:
    """The published step time, else global batch x sequence / (tokens per second per GPU x GPUs)."""
    if isinstance(measured.get("step_time_s"), (int, float)) and measured["step_time_s"] > 0:
        return float(measured["step_time_s"])
    tps = measured.get("tokens_per_sec_per_gpu")
    if isinstance(tps, (int, float)) and tps > 0:
        return group["global_batch_seqs"] * group["seq_len"] / (tps * group["gpu_count"])
    return None


def group_cases(group: dict[str, Any]) -> dict[int, Case]:
    """The configurations that ran and convert, as cases with the plan `group_result` prices and the
    measured step time (config_row's is a placeholder: the ablation check compares orders only)."""
    out = {}
    for i, cfg in enumerate(group["configs"]):
        step = measured_step_s(group, cfg["measured"])
        if str(cfg["measured"].get("status", "ok")).upper() == "OOM" or step is None:
            continue
        row, _ = config_row(group, cfg, i)
        tp_ov, ep_ov = row.get("tp_comm_overlap"), row.get("ep_overlap")
        case = modern_row_to_case(row)
        if not isinstance(case, Case):
            continue
        plan = completed_plan(case)
        upd = {}
        if tp_ov is not None:
            upd["tp_comm_overlap"] = tp_ov and plan.tp > 1 and plan.sp
        if ep_ov is not None:
            upd["ep_overlap"] = ep_ov and plan.ep > 1
        out[i] = case.__class__(**{**case.__dict__, "id": f"{group['id']}#{i}", "plan": plan.model_copy(update=upd),
                                   "recompute_published": True, "measured_step_s": step})
    return out


def score(group: dict[str, Any], cases: dict[int, Case], held: set[int], catalog: str | None) -> tuple[list[float], int, int]:
    """(|errors| % of the held-out configurations, pairs compared, pairs concordant) under `catalog`."""
    res = group_result(group, catalog=catalog)
    errs = []
    for c in res.configs:
        if c.index in held and c.index in cases and c.predicted_step_s:
            m = cases[c.index].measured_step_s
            errs.append(abs(c.predicted_step_s - m) / m * 100.0)
    pairs = [p for p in res.pairs if (p.a in held or p.b in held) and p.measured_apart_pct >= 100 * APART]
    return errs, len(pairs), sum(p.concordant for p in pairs)


def run(path: Path, every_pair: bool, **fit: Any) -> list[dict[str, Any]]:
    rows = []
    for group in load_groups(path):
        cases = group_cases(group)
        if len(cases) < 3:
            continue
        idx = sorted(cases)
        choices = list(itertools.combinations(idx, 2)) if every_pair else [tuple(idx[:2])]
        acc = {"before_err": [], "after_err": [], "before_pairs": [0, 0], "after_pairs": [0, 0], "fitted": set(),
               "ratios": []}
        for pick in choices:
            held = set(idx) - set(pick)
            with tempfile.TemporaryDirectory(prefix="bench-cal-") as d:
                out = Path(d) / "overlay.yaml"
                res = calibrate(f"{group['id']} configs {pick}", out, cases=[cases[i] for i in pick], **fit)
                acc["fitted"].update(n for f in res.fits for n in f.fitted)
                acc["ratios"] += [f.step_ratio for f in res.fits if STEP in f.fitted]
                eb, nb, cb = score(group, cases, held, None)
                ea, na, ca = score(group, cases, held, str(out))
            acc["before_err"] += eb
            acc["after_err"] += ea
            acc["before_pairs"][0] += nb
            acc["before_pairs"][1] += cb
            acc["after_pairs"][0] += na
            acc["after_pairs"][1] += ca
        rows.append({"group": group["id"], "configs": len(cases), "calibrations": len(choices), **acc})
    return rows


def _pct(a: int, b: int) -> str:
    return f"{100 * b / a:.0f}% ({b}/{a})" if a else "n/a"


def table(rows: list[dict[str, Any]], markdown: bool) -> str:
    head = ["group", "plans", "fits", "fitted", "common ratio", "held-out median err before", "after",
            "held-out pairs concordant before", "after"]
    lines = []
    for r in rows:
        ratio = (f"{min(r['ratios']):.3g}" + (f"-{max(r['ratios']):.3g}" if max(r["ratios"]) > min(r["ratios"]) else "")
                 if r["ratios"] else "-")
        lines.append([r["group"], str(r["configs"]), str(r["calibrations"]), ", ".join(sorted(r["fitted"])) or "-", ratio,
                      f"{statistics.median(r['before_err']):.1f}%" if r["before_err"] else "n/a",
                      f"{statistics.median(r['after_err']):.1f}%" if r["after_err"] else "n/a",
                      _pct(*r["before_pairs"]), _pct(*r["after_pairs"])])
    eb = [e for r in rows for e in r["before_err"]]
    ea = [e for r in rows for e in r["after_err"]]
    pb = [sum(r["before_pairs"][0] for r in rows), sum(r["before_pairs"][1] for r in rows)]
    pa = [sum(r["after_pairs"][0] for r in rows), sum(r["after_pairs"][1] for r in rows)]
    lines.append(["all", str(sum(r["configs"] for r in rows)), str(sum(r["calibrations"] for r in rows)), "", "",
                  f"{statistics.median(eb):.1f}%" if eb else "n/a", f"{statistics.median(ea):.1f}%" if ea else "n/a",
                  _pct(*pb), _pct(*pa)])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(x) + " |" for x in lines]
        return "\n".join(out) + "\n"
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*x) for x in [head, *lines]) + "\n"


METHODS = {
    "one-factor": {},  # one factor per two runs, in calibrate's fixed order (matmul first): the default fit
    "common-ratio": {"common_ratio": True},  # `calibrate --common-ratio`
    "common-ratio+1": {"common_ratio": True, "extra_terms": 1},  # the ratio and one more identified factor
}


def overall(rows: list[dict[str, Any]]) -> tuple[float, float, int, int, int, int, int, int]:
    """Over all groups: median error before, after; pairs and concordant pairs before, after; held-out
    evaluations; calibrations."""
    eb = [e for r in rows for e in r["before_err"]]
    ea = [e for r in rows for e in r["after_err"]]
    return (statistics.median(eb), statistics.median(ea), sum(r["before_pairs"][0] for r in rows),
            sum(r["before_pairs"][1] for r in rows), sum(r["after_pairs"][0] for r in rows),
            sum(r["after_pairs"][1] for r in rows), len(eb), sum(r["calibrations"] for r in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=Path, default=DEFAULT)
    ap.add_argument("--every-pair", action="store_true", help="also calibrate on every pair of each group")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--method", choices=sorted(METHODS), default="common-ratio",
                    help="the fit: one-factor (calibrate's default), common-ratio (--common-ratio; default here), "
                         "common-ratio+1 (the ratio and one more factor the two runs identify)")
    ap.add_argument("--compare", action="store_true", help="only the all-groups line of every method")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    protocols = [False, True] if a.every_pair else [False]
    if a.compare:
        print("| calibrated on | fit | held-out evaluations (calibrations) | held-out median error: built-in -> "
              "calibrated | held-out pairs ordered right: built-in -> calibrated |")
        print("|---|---|---|---|---|")
        for every in protocols:
            for name, fit in METHODS.items():
                mb, ma, nb, cb, na, ca, n, k = overall(run(a.groups, every, **fit))
                print(f"| {'every pair' if every else 'the first two plans'} | {name} | {n} ({k}) | "
                      f"{mb:.1f}% -> {ma:.1f}% | {_pct(nb, cb)} -> {_pct(na, ca)} |")
    else:
        for every in protocols:
            rows = run(a.groups, every, **METHODS[a.method])
            print(f"fit {a.method}: calibrated on {'every pair' if every else 'the first two'} of each group's "
                  "measured plans; scored on the others")
            sys.stdout.write(table(rows, a.markdown))
            print()
    print(f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

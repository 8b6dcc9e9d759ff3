"""What-if with uncertainty (issue 32 item 6): each option's time to train, cost and energy carry the 80%
interval of its plan's step time, and the recommendation says when the chosen option and the runner-up
lie within each other's interval."""

from __future__ import annotations

import csv
import json
import math

import pytest
import yaml

from autoshard.cost.intervals import DATA_PATH, regime
from autoshard.whatif import Candidate, ConstraintSpec, optimize_purchase, run_study
from autoshard.whatif.purchase import runner_up

# One small workload (a restricted plan space: each solve well under a second, proven optimal).
BASE = {
    "name": "intervals",
    "workloads": [{"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64}, "tokens": 5.0e10,
                   "search": {"tp": [1, 2], "pp": [1, 2], "cp": 1}}],
    # Every price stated here, so the arithmetic below is worked by hand from the study alone.
    "pricing": {"mode": ["cloud", "own"], "usd_per_gpu_hour": {"h100": 2.5}, "purchase_usd_per_gpu": {"h100": 30000},
                "usd_per_node": 0.0, "usd_per_kwh": 0.1, "pue": 1.3, "amortization_years": 4.0},
    "sensitivity": "off",
    "time_limit_s": 30.0,
}
OVERLAP_WORDS = "within each other's 80% interval"


def _run(tmp_path, options, **extra):
    res = run_study({**BASE, "options": options, **extra}, tmp_path, jobs=1)
    return res, json.loads((tmp_path / "results.json").read_text())


def test_bounds_are_the_step_interval_through_the_options_own_arithmetic(tmp_path):
    _, doc = _run(tmp_path, [{"gpu": "h100-sxm", "num_gpus": 8}])
    rows = {r["mode"]: r for r in doc["rows"]}
    cloud, own = rows["cloud"], rows["own"]
    # The step-time interval: the predicted step x the 10th / 90th percentile of measured / predicted of
    # the plan's regime, read here from the data file itself.
    regimes = yaml.safe_load(DATA_PATH.read_text())["regimes"]
    q = regimes[regime(cloud["time_breakdown_s"], cloud["step_time_s"], moe=False)]
    step = cloud["step_time_s"]
    assert cloud["step_time_low_s"] == pytest.approx(step * q["low"], rel=1e-12)
    assert cloud["step_time_high_s"] == pytest.approx(step * q["high"], rel=1e-12)
    # Hand-worked: 5e10 tokens / (64 x 4096) per step -> 190,735 steps; wall = steps x step / goodput.
    steps = math.ceil(5.0e10 / (64 * 4096))
    assert steps == 190_735
    for tag, s in (("low", step * q["low"]), ("high", step * q["high"])):
        days = steps * s / cloud["goodput"] / 86400
        assert cloud[f"time_to_train_days_{tag}"] == pytest.approx(days, rel=1e-9)
        # cloud: $2.50 per GPU-hour x 8 GPUs; energy: 8 x (700 W TDP + 30% node overhead) x PUE 1.3
        assert cloud[f"cost_usd_{tag}"] == pytest.approx(2.5 * 8 * days * 24, rel=1e-9)
        energy = 8 * 700 * 1.3 * 1.3 * days * 24 / 1e6
        assert cloud[f"energy_mwh_{tag}"] == pytest.approx(energy, rel=1e-9)
        # owned: the capex is fixed; the amortized capex (4 years) and the electricity ($0.10/kWh) scale
        assert own[f"cost_usd_{tag}"] == pytest.approx(240_000 * days / (4 * 365) + energy * 1000 * 0.1, rel=1e-9)
        assert own[f"time_to_train_days_{tag}"] == cloud[f"time_to_train_days_{tag}"]
    assert own["capex_usd"] == 8 * 30_000  # one node: no scale-out ports
    assert cloud["time_to_train_days_low"] < cloud["time_to_train_days"] < cloud["time_to_train_days_high"]
    with open(tmp_path / "results.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    for key in ("time_to_train_days_low", "time_to_train_days_high", "cost_usd_low", "cost_usd_high",
                "energy_mwh_low", "energy_mwh_high", "step_time_low_s", "step_time_high_s"):
        assert float(table[0][key]) == pytest.approx(doc["rows"][0][key], rel=1e-5), key
    md = (tmp_path / "report.md").read_text()
    assert "| days 80% |" in md and f"{cloud['time_to_train_days_low']:.1f}-{cloud['time_to_train_days_high']:.1f}" in md


def _overlap(a, b):
    return a["time_to_train_days_low"] <= b["time_to_train_days_high"] and \
        b["time_to_train_days_low"] <= a["time_to_train_days_high"]


def test_overlap_sentence_only_for_options_the_model_cannot_tell_apart(tmp_path):
    # H100 and H200 x 8: the same FLOP/s, the H200's more HBM bandwidth moves the step by a few percent,
    # well inside an interval of -9% / +12%: the model cannot tell them apart.
    _, doc = _run(tmp_path / "near", [{"gpu": "h100-sxm", "num_gpus": 8}, {"gpu": "h200", "num_gpus": 8}],
                  pricing={"mode": "cloud", "usd_per_gpu_hour": {"h100": 2.5}})
    rec = doc["recommended"]
    a, b = doc["rows"]
    assert _overlap(a, b)
    assert rec["runner_up"]["overlap"] is True and OVERLAP_WORDS in rec["reason"]
    assert {rec["option"], rec["runner_up"]["option"]} == {a["option"], b["option"]}
    assert OVERLAP_WORDS in (tmp_path / "near" / "report.md").read_text()
    # 8 vs 16 H100: twice the GPUs, about half the time; the intervals (x0.91 .. x1.12) are far apart.
    _, doc = _run(tmp_path / "far", [{"gpu": "h100-sxm", "num_gpus": [8, 16]}],
                  pricing={"mode": "cloud", "usd_per_gpu_hour": {"h100": 2.5}})
    rec = doc["recommended"]
    a, b = doc["rows"]
    assert not _overlap(a, b)
    assert rec["runner_up"]["overlap"] is False and OVERLAP_WORDS not in rec["reason"]
    assert "the model tells them apart" in rec["reason"]
    assert OVERLAP_WORDS not in (tmp_path / "far" / "report.md").read_text()


def test_runner_up_is_the_next_best_on_other_hardware():
    cands = [Candidate("h100/8/x/cloud", 100.0, 10.0, 0.0, 1.0), Candidate("h100/8/x/own", 100.0, 5.0, 50.0, 1.0),
             Candidate("b200/8/x/cloud", 120.0, 9.0, 0.0, 1.0), Candidate("b200/16/x/cloud", 110.0, 30.0, 0.0, 1.0)]
    dec = optimize_purchase(cands, ConstraintSpec())
    assert cands[dec.index].id == "h100/8/x/own"  # fastest, then cheapest
    hw = lambda c: c.id.rsplit("/", 1)[0]  # noqa: E731
    assert runner_up(cands, dec, hw).id == "b200/16/x/cloud"  # not the same cluster rented
    assert runner_up(cands, dec).id == "h100/8/x/cloud"



def test_fleet_jobs_and_makespans_carry_their_intervals(tmp_path):
    study = {**BASE, "pricing": {"mode": "own"}, "fleet": [
        {"name": "owned-8", "gpu": "h100-sxm", "num_gpus": 8},
        {"name": "new-16", "gpu": "h100-sxm", "num_gpus": 16, "owned": False}]}
    res = run_study(study, tmp_path, jobs=1)
    fleet = res.document["fleet"]
    rows = {r["option"]: r for r in res.rows}
    pool_opt = {p["name"]: p["option"] for p in fleet["pools"]}
    for s in fleet["scenarios"]:
        for j in s["jobs"]:
            r = rows[pool_opt[j["pool"]]]
            assert (j["time_to_train_days_low"], j["time_to_train_days_high"]) == (
                r["time_to_train_days_low"], r["time_to_train_days_high"])
        # one job: the makespan's bounds are that job's
        (j,) = s["jobs"]
        assert (s["makespan_days_low"], s["makespan_days_high"]) == (
            j["time_to_train_days_low"], j["time_to_train_days_high"])
    by = {s["scenario"]: s for s in fleet["scenarios"]}
    own, buy = by["owned pools only"], by["owned + buy new-16"]
    reason = fleet["recommendation"]["reason"]
    # 8 vs 16 GPUs: about half the time, the intervals apart.
    assert own["makespan_days_low"] > buy["makespan_days_high"]
    assert "80% intervals do not overlap" in reason and OVERLAP_WORDS not in reason
    md = (tmp_path / "report.md").read_text()
    assert f"80%: {own['makespan_days_low']:.1f}-{own['makespan_days_high']:.1f}" in md

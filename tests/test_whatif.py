"""What-if studies: goodput, Pareto front, CP-SAT purchase choice vs brute force, end-to-end report."""

from __future__ import annotations

import csv
import json
import math
import random

import pytest

from autoshard.errors import InputError
from autoshard.loader import load_problem
from autoshard.whatif import (
    Candidate,
    ConstraintSpec,
    ReliabilitySpec,
    levels_problem,
    goodput,
    load_study,
    optimize_purchase,
    pareto_front,
    run_study,
    run_task,
    violations,
    young_daly_interval_s,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SMALL = {
    "name": "small",
    # A restricted plan space keeps every solve well under a second and proven optimal (deterministic).
    "workloads": [{"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64}, "tokens": 5.0e10,
                   "search": {"tp": [1, 2], "pp": [1, 2], "cp": 1}}],
    "options": [{"gpu": "h100-sxm", "num_gpus": [8, 16]}, {"gpu": "b200", "num_gpus": 8}],
    "pricing": {"mode": ["cloud", "own"], "usd_per_gpu_hour": {"h100": 2.5}},
    "constraints": {"budget_usd": 4000.0, "deadline_days": 8},
    "time_limit_s": 30.0,  # proven optimal well within it, also on a loaded machine (runs are compared)
}


# ---- goodput -------------------------------------------------------------------------------------


def test_young_daly_interval():
    assert young_daly_interval_s(3600.0, 50.0) == pytest.approx(math.sqrt(2 * 3600 * 50))
    # The interval Young's formula gives is where the first-order waste delta/tau + tau/(2M) is least.
    m, d = 10_000.0, 30.0
    tau = young_daly_interval_s(m, d)
    waste = lambda t: d / t + t / (2 * m)  # noqa: E731
    assert waste(tau) < waste(0.8 * tau) and waste(tau) < waste(1.25 * tau)


def test_goodput_falls_as_the_cluster_grows():
    ratios = [goodput(n, 70e9).ratio for n in (8, 64, 512, 4096, 16384, 65536)]
    assert all(a > b for a, b in zip(ratios, ratios[1:])), ratios
    assert ratios[0] > 0.99
    g = goodput(16384, 405e9)  # Llama 3 405B scale: the paper reports > 90% effective training time
    assert g.mtbf_s / 3600 == pytest.approx(54 * 24 / 419, rel=0.01)
    assert 0.85 < g.ratio < 0.97
    assert g.interval_s == pytest.approx(young_daly_interval_s(g.mtbf_s, g.checkpoint_s))
    off = goodput(16384, 405e9, ReliabilitySpec(enabled=False))
    assert off.ratio == 1.0


# ---- Pareto front and purchase optimizer ---------------------------------------------------------------


def _pareto_by_sweep(points):
    """Independent check: sort by (time, cost) and keep the points that lower the best cost so far."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best = set(), math.inf
    for i in order:
        if points[i][1] < best:
            front.add(i)
            best = points[i][1]
    # exact duplicates of a front point are on the front too
    for i in range(len(points)):
        if any(points[i] == points[j] for j in front):
            front.add(i)
    return [i in front for i in range(len(points))]


def test_pareto_front_matches_a_sweep():
    rng = random.Random(7)
    for _ in range(50):
        pts = [(rng.randint(1, 30), rng.randint(1, 30)) for _ in range(rng.randint(1, 25))]
        assert pareto_front(pts) == _pareto_by_sweep(pts)


def _brute_force(cands, cons: ConstraintSpec, objective: str):
    ok = [i for i, c in enumerate(cands)
          if (cons.budget_usd is None or c.cost_usd <= cons.budget_usd)
          and (cons.capex_budget_usd is None or c.capex_usd <= cons.capex_budget_usd)
          and (cons.power_cap_mw is None or c.power_mw <= cons.power_cap_mw)
          and (cons.deadline_days is None or c.time_s <= cons.deadline_days * 86400)]
    if not ok:
        return None
    if objective == "time":
        return min(ok, key=lambda i: (cands[i].time_s, cands[i].cost_usd, i))
    return min(ok, key=lambda i: (cands[i].cost_usd, cands[i].time_s, i))


def test_purchase_choice_equals_brute_force():
    rng = random.Random(11)
    checked = 0
    for trial in range(60):
        n = rng.randint(1, 14)
        cands = [Candidate(f"o{i}", time_s=86400 * rng.randint(5, 200) + rng.randint(1, 999),
                           cost_usd=rng.randint(1, 400) * 25_000.0 + rng.randint(1, 99) / 100,
                           capex_usd=rng.choice([0.0, rng.randint(10, 90) * 1e6]),
                           power_mw=rng.randint(1, 300) / 10) for i in range(n)]
        cons = ConstraintSpec(
            budget_usd=rng.choice([None, rng.randint(20, 400) * 25_000.0 + 0.5]),
            capex_budget_usd=rng.choice([None, None, rng.randint(10, 90) * 1e6 + 1.0]),
            power_cap_mw=rng.choice([None, rng.randint(1, 300) / 10 + 0.05]),
            deadline_days=rng.choice([None, rng.randint(5, 200) + 0.5]),
            objective=rng.choice(["auto", "time", "cost"]))
        dec = optimize_purchase(cands, cons)
        want = _brute_force(cands, cons, dec.objective)
        assert dec.index == want, (trial, dec, want)
        assert list(dec.meets) == [not violations(c, cons) for c in cands]
        checked += want is not None
    assert checked > 10  # the constraints left something to choose in many trials


def test_objective_auto():
    cands = [Candidate("fast", 10 * 86400, 9e6, 0, 1), Candidate("cheap", 50 * 86400, 2e6, 0, 1)]
    assert cands[optimize_purchase(cands, ConstraintSpec()).index].id == "fast"
    assert cands[optimize_purchase(cands, ConstraintSpec(deadline_days=60)).index].id == "cheap"
    assert cands[optimize_purchase(cands, ConstraintSpec(budget_usd=5e6)).index].id == "cheap"
    assert optimize_purchase(cands, ConstraintSpec(budget_usd=1e6)).index is None


# ---- study loading -----------------------------------------------------------------------------------


def test_load_study_expands_and_sorts():
    st = load_study({**SMALL, "options": [{"gpu": ["b200", "h100"], "num_gpus": {"start": 8, "stop": 32}}]})
    ids = [o.id for o in st.options]
    assert ids[0] == "h100-sxm/8/dgx-h100-superpod/cloud"  # catalog order, then topology, count, mode
    assert len(ids) == 2 * 3 * 2
    assert [o.num_gpus for o in st.options if o.gpu == "b200" and o.mode == "own"] == [8, 16, 32]
    multi = load_study({**SMALL, "workloads": [{**SMALL["workloads"][0], "tokens": [1e12, 5e12]}]})
    assert [w.name for w in multi.workloads] == ["llama3-8b @ 1T tokens", "llama3-8b @ 5T tokens"]


@pytest.mark.parametrize("patch, field", [
    ({"bogus": 1}, "bogus"),
    ({"options": [{"gpu": "h1000", "num_gpus": 8}]}, "options.0.gpu"),
    ({"options": [{"gpu": "h100", "num_gpus": 8, "topology": "nope"}]}, "options.0.topology"),
    ({"workloads": [{"model": "llama9", "training": {"seq_len": 1, "global_batch_size": 1}, "tokens": 1}]},
     "workloads.0.model"),
    ({"pricing": {"usd_per_gpu_hour": {"h1000": 1.0}}}, "pricing.usd_per_gpu_hour.h1000"),
    ({"constraints": {"budget_usd": -1}}, "constraints.budget_usd"),
    ({"options": [{"gpu": "h100", "num_gpus": {"start": 64, "stop": 8}}]}, "options.0.num_gpus"),
])
def test_load_study_errors_name_the_field(patch, field):
    with pytest.raises(InputError) as exc:
        load_study({**SMALL, **patch})
    assert exc.value.field is not None and exc.value.field.startswith(field), exc.value.line()
    assert "\n" not in exc.value.line()


def test_doubled_levels_baseline_is_identical():
    from autoshard.cost import evaluate
    from autoshard.spec import Plan

    p = load_problem({"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64},
                      "cluster": {"gpu": "h100", "num_gpus": 64}})
    plan = Plan(tp=2, pp=2, zero_stage=1)
    base = evaluate(p, plan).step_time_s
    assert evaluate(levels_problem(p, lambda i: 1.0), plan).step_time_s == pytest.approx(base, rel=1e-12)
    assert evaluate(levels_problem(p, lambda i: 2.0), plan).step_time_s <= base


# ---- end to end ------------------------------------------------------------------------------------


def test_run_study_writes_results_and_report(tmp_path):
    seen = []
    res = run_study(SMALL, tmp_path, jobs=2, progress=lambda d, t, label: seen.append((d, t)))
    assert seen[0] == (0, 3) and seen[-1] == (3, 3)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["complete"] is True
    rows = doc["rows"]
    assert len(rows) == 3 * 2  # 3 hardware options x 2 pricing modes, one workload
    for key in ("gpu", "num_gpus", "step_time_s", "tokens_per_s", "time_to_train_days", "cost_usd", "energy_mwh",
                "goodput", "pareto", "feasible"):
        assert all(key in r for r in rows), key
    feas = [r for r in rows if r["feasible"]]
    assert feas, rows
    ok = [r for r in feas if r["meets_constraints"]]  # the front counts only options meeting every constraint
    flags = pareto_front([(r["time_to_train_days"], r["cost_usd"]) for r in ok])
    assert [r["pareto"] for r in ok] == flags and not any(r["pareto"] for r in feas if not r["meets_constraints"])
    # goodput falls with the GPU count; energy = GPUs x (TDP + overhead) x PUE x hours
    h100 = {r["num_gpus"]: r for r in feas if r["gpu"] == "h100-sxm" and r["mode"] == "cloud"}
    if 8 in h100 and 16 in h100:
        assert h100[16]["goodput"] < h100[8]["goodput"]
        r = h100[8]
        assert r["energy_mwh"] == pytest.approx(8 * 700 * 1.3 * 1.3 * r["time_to_train_days"] * 24 / 1e6, rel=1e-9)
        assert r["cost_usd"] == pytest.approx(2.5 * 8 * r["time_to_train_days"] * 24, rel=1e-9)
    rec = doc["recommended"]
    assert rec is not None and "reason" in rec
    cands = [r for r in feas if r["meets_constraints"]]
    if cands:
        best = min(cands, key=lambda r: (r["time_to_train_days"], r["cost_usd"]))
        assert rec["option"] == best["option"] == res.recommended["option"]
    with open(tmp_path / "results.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(rows) and "goodput" in table[0]
    for name in ("report.md", "report.html", "time_vs_cost_w1.png", "cost_energy_w1.png", "step_breakdown_w1.png",
                 "sensitivity_w1.png", "scaling_w1.png"):
        path = tmp_path / name
        assert path.exists() and path.stat().st_size > 1000, name
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == PNG_MAGIC
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*"))


def run_interrupted(out, **run_kwargs) -> dict:
    """Run a two-option study, interrupt it (Ctrl-C) after the first option finishes; return
    results.json. Shared with the Dask executor's tests."""
    study = {**SMALL, "options": [{"gpu": "h100-sxm", "num_gpus": [8, 16]}], "pricing": {"mode": "cloud"},
             "sensitivity": "off"}

    def progress(done, total, label):
        if done == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_study(study, out, progress=progress, **run_kwargs)
    return json.loads((out / "results.json").read_text())


def test_interrupt_keeps_finished_options(tmp_path):
    doc = run_interrupted(tmp_path, jobs=1)
    assert doc["complete"] is False
    assert len(doc["rows"]) == 1 and doc["rows"][0]["num_gpus"] == 16  # big clusters run first
    assert not (tmp_path / "report.html").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]


CONTRACT = """
workloads:
  - model: llama3-70b
    training: {seq_len: 8192, global_batch_size: 1024, precision: bf16}
    tokens: 15.0e12
options:
  - {gpu: h100-sxm, num_gpus: [512, 1024]}
  - {gpu: b200, num_gpus: [512], topology: dgx-b200}
pricing: {mode: cloud, usd_per_gpu_hour: {h100-sxm: 2.5, b200: 4.5}}
constraints: {budget_usd: 5.0e6, deadline_days: 120}
"""


def test_contract_study_file_loads(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(CONTRACT)
    st = load_study(path)
    assert [o.id for o in st.options] == ["h100-sxm/512/dgx-h100-superpod/cloud",
                                          "h100-sxm/1024/dgx-h100-superpod/cloud", "b200/512/dgx-b200/cloud"]
    assert st.workloads[0].tokens == 15.0e12 and st.spec.constraints.budget_usd == 5.0e6
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONTRACT.replace("deadline_days", "deadline_dayz"))
    with pytest.raises(InputError) as exc:
        load_study(bad)
    assert exc.value.line().startswith(str(bad)) and "constraints.deadline_dayz" in exc.value.line()


def test_results_json_is_byte_stable_apart_from_timing(tmp_path):
    study = {**SMALL, "options": [{"gpu": "h100-sxm", "num_gpus": 8}], "sensitivity": "off"}

    def strip(d):
        if isinstance(d, dict):
            return {k: strip(v) for k, v in d.items() if k not in ("solve_time_s", "timing")}
        if isinstance(d, list):
            return [strip(v) for v in d]
        return d

    a = run_study(study, tmp_path / "a", report=False).document
    b = run_study(study, tmp_path / "b", report=False).document
    assert json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)


def test_combine_sum_buys_one_cluster_for_every_workload(tmp_path):
    wl = SMALL["workloads"][0]
    study = {**SMALL, "workloads": [{**wl, "name": "a", "tokens": 2e10}, {**wl, "name": "b", "tokens": 3e10}],
             "combine": "sum", "sensitivity": "off", "constraints": {}}
    res = run_study(study, tmp_path, report=False)
    rec = res.recommended
    assert rec["workloads"] == ["a", "b"] and len(res.recommendations) == 1
    rows = {(r["workload"], r["option"]): r for r in res.rows}
    total = {o: (rows[("a", o)]["time_to_train_days"] + rows[("b", o)]["time_to_train_days"],
                 rows[("a", o)]["cost_usd"] + rows[("b", o)]["cost_usd"])
             for (_, o) in rows if rows[("a", o)]["feasible"]}
    assert rec["option"] == min(total, key=lambda o: total[o])  # fastest, then cheapest
    assert rec["time_to_train_days"] == pytest.approx(total[rec["option"]][0])
    assert rec["cost_usd"] == pytest.approx(total[rec["option"]][1])


def test_report_without_failures(tmp_path):
    """reliability.enabled: false means a cluster that never fails: goodput 1, no MTBF or
    checkpoint interval; the report shows "-" for them instead of crashing."""
    study = {**SMALL, "options": [{"gpu": "h100-sxm", "num_gpus": 8}], "pricing": {"mode": "cloud"},
             "reliability": {"enabled": False}}
    run_study(study, tmp_path, jobs=1)
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert rows and all(r["goodput"] == 1.0 for r in rows if r["feasible"])
    md = (tmp_path / "report.md").read_text()
    goodput_table = md[md.index("### Goodput"):]
    row = next(ln for ln in goodput_table.splitlines() if ln.startswith("| h100-sxm x8 |"))
    mfu = rows[0]["mfu"]  # efficiency = MFU x goodput (seed 002), goodput 100% here
    assert row.startswith("| h100-sxm x8 | - |") and row.endswith(f"| 100.0% | {100 * mfu:.1f}% |"), row


# ---- faults (issue 15): sweep ranges, token budgets, SIGTERM, full disk, --jobs, no progress -----------


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from autoshard.cli import main as cli_main

    try:
        rc = cli_main(list(args))
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("num_gpus, message", [
    ({"start": 64, "stop": 8}, "options.0.num_gpus: range: stop (8) is below start (64): give start <= stop"),
    ({"start": 8, "stop": 64, "step": 8, "factor": 2}, "options.0.num_gpus: range: give step (8) or factor (2), not both"),
    ({"start": 1, "stop": 100_000, "step": 1},
     "options.0.num_gpus: range: the range from 1 to 100000 has 100,000 values, more than the 4,096 allowed"),
    ({"start": 1, "stop": 1 << 20, "factor": 1.001}, "has more than 4,096 values, more than the 4,096 allowed"),
    ({"start": 0, "stop": 8}, "options.0.num_gpus: range start: Input should be greater than or equal to 1 (got 0)"),
    ({"start": 8}, "options.0.num_gpus: range stop: required field is missing"),
    ({"start": 8, "stop": 64, "factor": 1}, "options.0.num_gpus: range factor: Input should be greater than 1"),
    ({"start": 8, "stop": 64, "stpe": 8}, "options.0.num_gpus: range stpe: unknown field (closest: stop, step"),
    ([8, 0], "options.0.num_gpus: item 1 (0) must be from 1 to 1,048,576, got 0"),
    ([], "options.0.num_gpus: an empty list allows nothing"),
    (-8, "options.0.num_gpus: a GPU count must be from 1 to 1,048,576, got -8"),
    (8.5, "options.0.num_gpus: a GPU count must be a whole number, got 8.5"),
    ("eight", "options.0.num_gpus: expected a GPU count, a list of counts or a range {start, stop, step or factor}"),
])
def test_sweep_range_errors_are_one_plain_line(num_gpus, message):
    with pytest.raises(InputError) as exc:
        load_study({**SMALL, "options": [{"gpu": "h100", "num_gpus": num_gpus}]})
    line = exc.value.line()
    assert message in line, line
    for internal in ("constrained-int", "list[", "RangeSpec", "Value error", "\n"):
        assert internal not in line, line


def test_sweep_ranges_expand_exactly():
    def counts(spec):
        return [o.num_gpus for o in load_study({**SMALL, "pricing": {"mode": "cloud"},
                                                "options": [{"gpu": "h100", "num_gpus": spec}]}).options]

    assert counts({"start": 8, "stop": 64}) == [8, 16, 32, 64]  # default: doubling
    assert counts({"start": 8, "stop": 40, "step": 16}) == [8, 24, 40]
    assert counts({"start": 1000, "stop": 5000, "factor": 1.5}) == [1000, 1500, 2250, 3375]
    assert counts({"start": 1, "stop": 4096, "step": 1}) == list(range(1, 4097))  # exactly the 4,096 allowed
    assert counts("16") == [16] and counts(["8", 16]) == [8, 16]  # counts written as text, as YAML may give them


@pytest.mark.parametrize("tokens, message", [
    (1.0e30, "workloads.0.tokens: the budget 1e+30 is more than the 1e+16 allowed"),
    ([1e12, 1e30], "workloads.0.tokens: item 1 1e+30 is more than the 1e+16 allowed"),
    (-5, "workloads.0.tokens: the budget must be a number of tokens >= 1, got -5"),
    (1e-300, "workloads.0.tokens: the budget must be a number of tokens >= 1, got 1e-300"),
    (math.inf, "workloads.0.tokens: the budget must be a number of tokens >= 1, got inf"),
    ("lots", "workloads.0.tokens: the budget must be a number of tokens, got 'lots'"),
])
def test_token_budget_errors(tokens, message):
    with pytest.raises(InputError) as exc:
        load_study({**SMALL, "workloads": [{**SMALL["workloads"][0], "tokens": tokens}]})
    assert message in exc.value.line()


def test_token_budget_as_yaml_text(tmp_path):
    # YAML 1.1 reads `5.0e10` (no sign in the exponent) as a string; it is still a number of tokens,
    # and a bare `off` (read as false) is still the sensitivity mode "off".
    path = tmp_path / "study.yaml"
    path.write_text(CONTRACT.replace("15.0e12", "5.0e10") + "sensitivity: off\n")
    st = load_study(path)
    assert st.workloads[0].tokens == 5.0e10 and st.spec.sensitivity == "off"


def test_huge_values_are_chosen_by_enumeration_equal_to_brute_force():
    """Values beyond CP-SAT's range (a 1e30-token budget's centuries, an infinite price) never give
    MODEL_INVALID and a null choice: the same lexicographic rule, by enumeration."""
    rng = random.Random(5)
    for trial in range(40):
        n = rng.randint(1, 10)
        cands = [Candidate(f"o{i}", time_s=rng.choice([1e20, 3e21, 86400.0 * rng.randint(1, 99)]) * rng.randint(1, 9),
                           cost_usd=rng.choice([1e18, math.inf, 1e6 * rng.randint(1, 9)]),
                           capex_usd=0.0, power_mw=rng.randint(1, 30) / 10) for i in range(n)]
        cons = ConstraintSpec(budget_usd=rng.choice([None, 5e6, 1e30]), deadline_days=rng.choice([None, 50.0, 1e17]),
                              power_cap_mw=rng.choice([None, 2.05]), objective=rng.choice(["time", "cost"]))
        dec = optimize_purchase(cands, cons)
        assert dec.index == _brute_force(cands, cons, dec.objective), trial
        assert dec.status in ("OPTIMAL", "ENUMERATED")
    big = [Candidate("slow", 1e21, 1e19, 0.0, 1.0), Candidate("slower", 2e21, 1e19, 0.0, 1.0)]
    dec = optimize_purchase(big, ConstraintSpec())
    assert (dec.index, dec.status) == (0, "ENUMERATED")


def test_failures_faster_than_checkpoint_and_restart_say_so(tmp_path, capsys):
    """A cluster that fails every few minutes (here 1 failure per GPU-hour on 8 GPUs: MTBF 7.5 min,
    against a 600 s restart) makes no progress: the recommendation says exactly that, and the
    command exits 1 (infeasible) after writing the results."""
    study = {**SMALL, "options": [{"gpu": "h100-sxm", "num_gpus": 8}], "pricing": {"mode": "cloud"},
             "sensitivity": "off", "reliability": {"failures_per_gpu_hour": 1.0}}
    res = run_study(study, tmp_path / "lib", report=False)
    row = res.rows[0]
    assert row["feasible"] is False and row["mtbf_h"] == pytest.approx(1 / 8)
    assert row["reason"].startswith("the cluster fails faster than it can checkpoint and restart: MTBF 7.5 min")
    reason = res.recommended["reason"]
    assert reason.startswith("no option has a feasible plan: 1 of 1 fail faster than they can checkpoint and restart")
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(study))
    rc, out, err = _cli(capsys, "whatif", str(path), "-o", str(tmp_path / "cli"), "--quiet")
    assert rc == 1 and "Traceback" not in err
    assert "autoshard: infeasible: workload llama3-8b: no option has a feasible plan: 1 of 1 fail faster" in err
    assert json.loads((tmp_path / "cli" / "results.json").read_text())["recommended"]["option"] is None


def test_jobs_must_not_be_negative(tmp_path, capsys):
    rc, out, err = _cli(capsys, "whatif", "problems/studies/cloud-vs-buy.yaml", "-o", str(tmp_path / "o"),
                        "--jobs", "-1")
    assert (rc, out) == (2, "") and err == "autoshard: error: --jobs: must be >= 0 (0: one worker per CPU), got -1\n"
    assert not (tmp_path / "o").exists()
    with pytest.raises(InputError, match="jobs: must be a number of worker processes >= 0"):
        run_study(SMALL, tmp_path / "o", jobs=-2)


def test_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    import errno

    import autoshard.whatif.runner as runner

    def full(path, data, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(runner, "atomic_write", full)
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps({**SMALL, "options": [{"gpu": "h100-sxm", "num_gpus": 8}], "sensitivity": "off"}))
    rc, out, err = _cli(capsys, "whatif", str(path), "-o", str(tmp_path / "out"), "--quiet")
    assert rc == 2 and out == ""
    assert err == f"autoshard: error: {tmp_path / 'out' / 'results.csv'}: cannot write: No space left on device\n"


def test_progress_line_never_writes_carriage_returns_into_logs():
    import io

    from autoshard.whatif import ProgressLine

    log = io.StringIO()
    p = ProgressLine(log)
    for d, label in ((0, ""), (1, "llama3-8b on h100-sxm/16/dgx-h100-superpod"), (2, "llama3-8b on b200/8/dgx-b200")):
        p(d, 2, label)
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text
    assert [ln.split("] ")[0] for ln in text.splitlines()] == ["[1/2", "[2/2"]

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    p = ProgressLine(tty)
    p(0, 3, "")
    p(1, 3, "a much longer label " * 20)
    p(2, 3, "short")
    p.close()  # interrupted before 3/3: the line is ended
    lines = tty.getvalue().split("\r")[1:]
    assert all(ln.endswith("\x1b[K") or ln.endswith("\x1b[K\n") for ln in lines), lines  # each redraw clears the rest
    assert max(len(ln) for ln in lines) <= 80 + 4 and tty.getvalue().endswith("\n")


def test_cli_prints_each_warning(tmp_path, capsys, monkeypatch):
    import autoshard.whatif.runner as runner

    monkeypatch.setattr(runner, "_warnings", lambda study, rows: ["llama3-8b: b200 x16 is slower than x8"])
    path = tmp_path / "study.yaml"
    path.write_text(json.dumps({**SMALL, "options": [{"gpu": "h100-sxm", "num_gpus": 8}], "sensitivity": "off"}))
    rc, out, err = _cli(capsys, "whatif", str(path), "-o", str(tmp_path / "out"), "--quiet")
    assert rc == 0 and err == "warning: llama3-8b: b200 x16 is slower than x8\n"
    assert "warning(s)" not in out


SIGNAL_STUDY = {**SMALL, "options": [{"gpu": ["h100-sxm", "h200-sxm", "b200"], "num_gpus": [8, 16, 32, 64]}],
                "pricing": {"mode": "cloud"}, "sensitivity": "evaluate"}  # 12 options: SIGTERM comes after the 1st


@pytest.mark.parametrize("group", [False, True], ids=["parent", "process-group"])
def test_sigterm_keeps_finished_options_and_exits_143(tmp_path, group):
    """SIGTERM (Slurm, Kubernetes) as Ctrl-C: exit 143, the finished options written (complete:
    false), no traceback from the workers, whether only the parent or the whole process group is
    signalled (Slurm's scancel signals every process of the step). With multiprocessing.Pool a
    process-group SIGTERM hung the command in 4-7 of 40 tries (terminate() waited on a queue lock
    a killed worker held); the workers now ignore the signal and the parent kills them."""
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "study.yaml"
    path.write_text(json.dumps(SIGNAL_STUDY))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "autoshard.cli", "whatif", str(path), "-o", str(out),
                             "--jobs", "2"], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    err = []
    for line in proc.stderr:  # not a TTY: one plain line per finished option
        err.append(line)
        if line.startswith("[1/"):
            break
    (os.killpg if group else os.kill)(proc.pid, signal.SIGTERM)
    _, rest = proc.communicate(timeout=60)
    err = "".join(err) + rest
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "\r" not in err, err
    assert err.rstrip().endswith("autoshard: interrupted; finished outputs were kept"), err
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False and doc["rows"] and doc["recommended"] is None, (err, doc["rows"])
    assert not [r for r in doc["rows"] if r.get("status") == "error"]  # no option reported as failed by the stop
    assert not [p for p in out.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]


# ---- what a buyer sees: plots and report (issue 15) ------------------------------------------------


def _synthetic_rows():
    """Options around a 5 MW power cap, a $10M budget and a 60-day deadline (days, $M, MW, gpu x n)."""
    spec = [("b200", 4096, 20, 8.9, 6.9), ("gb200", 2304, 28, 9.3, 3.95), ("b200", 2048, 34, 7.6, 3.5),
            ("mi300x", 2048, 61, 7.5, 2.6), ("h100-sxm", 4096, 39, 9.6, 4.9), ("h200-sxm", 4096, 36, 12.5, 4.9),
            ("h100-sxm", 512, 320, 8.5, 0.6)]
    cons = ConstraintSpec(budget_usd=10e6, deadline_days=60, power_cap_mw=5.0)
    rows = []
    for gpu, n, days, musd, mw in spec:
        c = Candidate(f"{gpu}/{n}/x/cloud", days * 86400, musd * 1e6, 0.0, mw)
        v = violations(c, cons)
        rows.append({"gpu": gpu, "num_gpus": n, "topology": "x", "mode": "cloud", "option": c.id, "feasible": True,
                     "time_to_train_days": days, "cost_usd": musd * 1e6, "power_mw": mw, "energy_mwh": mw * days * 24,
                     "cloud_usd": musd * 1e6, "violations": v, "meets_constraints": not v})
    ok = [r for r in rows if r["meets_constraints"]]
    for r, f in zip(ok, pareto_front([(r["time_to_train_days"], r["cost_usd"]) for r in ok])):
        r["pareto"] = f
    dec = optimize_purchase([Candidate(r["option"], r["time_to_train_days"] * 86400, r["cost_usd"], 0.0, r["power_mw"])
                             for r in rows], cons)
    for i, r in enumerate(rows):
        r.setdefault("pareto", False)
        r["recommended"] = i == dec.index
    return rows, cons


def _figure(monkeypatch, plot, *args):
    """Run a plot function and return its matplotlib figure (drawn, not closed)."""
    import autoshard.whatif.report as report

    figs = []
    monkeypatch.setattr(report, "_png", lambda fig: (figs.append(fig), fig.canvas.draw(), b"")[2])
    plt = report._plt()
    monkeypatch.setattr(plt, "close", lambda fig=None: None)
    plot(*args)
    return figs[0]


def test_time_cost_plot_star_on_the_constrained_front_and_every_point_labelled(monkeypatch):
    from autoshard.whatif.report import plot_time_cost

    rows, cons = _synthetic_rows()
    rec = next(r for r in rows if r["recommended"])
    # b200 x4096 is faster and cheaper than the recommended GB200 but breaks the 5 MW cap: not on the front
    assert rec["gpu"] == "gb200" and rec["pareto"]
    assert not next(r for r in rows if r["num_gpus"] == 4096 and r["gpu"] == "b200")["pareto"]
    fig = _figure(monkeypatch, plot_time_cost, rows, ["h100-sxm", "h200-sxm", "b200", "gb200", "mi300x"],
                  cons.model_dump(exclude_none=True), "t")
    ax = fig.axes[0]
    texts = [t for t in ax.texts if " x" in t.get_text()]
    names = {t.get_text() for t in texts}
    assert "b200 x4096 (over power cap)" in names and "h200-sxm x4096 (over budget)" in names
    assert "h100-sxm x512 (misses deadline)" in names and "gb200 x2304" in names
    assert len(texts) == len(rows)  # every point labelled, the ones off the front too
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    frame = ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 for b in boxes)
    ticks = [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
    assert ax.get_xscale() == "log" and "20" in ticks and "100" in ticks  # plain numbers on the log axis
    assert not any("times" in t or "^" in t or "mathdefault" in t for t in ticks), ticks
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("Pareto front (of the options") for t in legend)


def test_cost_bars_mark_options_that_miss_a_constraint(monkeypatch):
    from autoshard.whatif.report import plot_cost_energy

    rows, _ = _synthetic_rows()
    fig = _figure(monkeypatch, plot_cost_energy, rows, "t", False)
    ax1 = fig.axes[0]
    notes = {t.get_text() for t in ax1.texts}
    assert "$12.5M  over budget" in notes and "$8.5M  misses deadline" in notes and "$8.9M  over power cap" in notes
    assert "$9.3M" in notes  # the recommended option meets everything: no mark
    hatched = [p for p in ax1.patches if p.get_hatch()]
    assert len(hatched) == sum(not r["meets_constraints"] for r in rows)
    labels = [t.get_text() for t in ax1.get_yticklabels()]
    assert sum(t.startswith("* ") for t in labels) == 1
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "* recommended" in legend and any(t.startswith("hatched: misses") for t in legend)


def test_binding_is_named_only_for_a_meaningful_gain(tmp_path):
    from autoshard.whatif.sensitivity import BINDING_MIN_GAIN_PCT

    run_study({**SMALL, "pricing": {"mode": "cloud"}, "constraints": {}}, tmp_path, report=False)
    raw = json.loads((tmp_path / "results.json").read_text())
    assert BINDING_MIN_GAIN_PCT == 5.0
    for r in raw["rows"]:
        gains = r["relax_gain_pct"]
        best = max(gains, key=lambda k: (gains[k], k))
        if gains[best] >= 5.0:
            assert r["binding"] == best
        else:
            assert r["binding"] == "none"
        # twice a resource's speed is estimated as half its share of the step
        for k, share in r["resource_shares"].items():
            assert gains[k] == pytest.approx(50.0 * share, abs=1e-3)


def test_report_html_tables_fit_a_window(tmp_path):
    """Structural check of what Chromium showed at 1,280 px: each table in a horizontally scrolling
    wrapper, long cells allowed to wrap, numbers kept whole; the `*` and the front explained."""
    import re

    run_study({**SMALL, "sensitivity": "off"}, tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert html.count("<table>") == html.count('<div class="tw"><table>') > 0
    assert ".tw{max-width:100%;overflow-x:auto}" in html and "td.w{white-space:normal" in html
    assert "td{" not in html or "white-space:nowrap" in html
    for cell in re.findall(r'<td class="w">(.*?)</td>', html):
        assert len(re.sub("<[^>]+>", "", cell)) > 16
    for cell in re.findall(r"<td>(.*?)</td>", html):
        assert len(re.sub("<[^>]+>", "", cell)) <= 16 + 11  # escaped / tagged, still short
    assert "`*` marks the recommended option" in (tmp_path / "report.md").read_text()


def test_report_html_is_report_md_rendered():
    """report.html renders report.md's own Markdown (markdown-it-py, CommonMark + tables): emphasis and
    code spans become tags, an escaped `|` stays inside its cell, raw HTML in a text is shown, not run."""
    from autoshard.whatif.report import _Doc  # noqa: PLC0415

    d = _Doc()
    d.h(2, "Options <b>")
    d.p("**h100** is `tp8` <script>alert(1)</script>")
    d.table(["option", "days"], [["h100-sxm x 1024 | superpod", "9.2"]])
    md, html = d.markdown(), d.html("t")
    assert "| h100-sxm x 1024 \\| superpod | 9.2 |" in md
    assert "<h2>Options &lt;b&gt;</h2>" in html and "<script>" not in html and "&lt;script&gt;" in html
    assert "<p><strong>h100</strong> is <code>tp8</code>" in html
    assert '<div class="tw"><table>' in html and '<td class="w">h100-sxm x 1024 | superpod</td>' in html
    assert "<td>9.2</td>" in html and html.count("<td") == 2


# ---- spot capacity, goodput as the seeds define it, GB200 rack power (issue 16) ------------------------


def test_spot_price_reproduces_the_seeds_worked_example():
    """Seed 003: Llama 3 8B on 8 A100 (p4d.24xlarge, $32.77/h) for ~8 days = $6,291; spot instances
    save 70% -> $1,887 (the seed's range: 60-90%)."""
    from autoshard.whatif import Option, price_option

    st = load_study({**SMALL, "options": [{"gpu": "a100-sxm-40gb", "num_gpus": 8}],
                     "pricing": {"mode": ["cloud", "spot"], "usd_per_gpu_hour": {"a100-sxm-40gb": 32.77 / 8}}})
    wall_s = 8 * 86400
    cloud = price_option(st, Option("a100-sxm-40gb", 8, "dgx-a100-superpod", "cloud"), wall_s)
    spot = price_option(st, Option("a100-sxm-40gb", 8, "dgx-a100-superpod", "spot"), wall_s)
    assert cloud["cost_usd"] == pytest.approx(32.77 * 24 * 8)  # $6,291.84
    assert round(cloud["cost_usd"]) == 6292 and round(spot["cost_usd"]) == 1888  # the seed rounds to $6,291 / $1,887
    assert spot["cost_usd"] == pytest.approx(0.3 * cloud["cost_usd"]) and spot["spot_discount"] == 0.7
    for discount in (0.6, 0.9):
        st2 = load_study({**SMALL, "pricing": {"mode": "spot", "spot_discount": discount}})
        opt = Option("h100-sxm", 8, "dgx-h100-superpod", "spot")
        assert price_option(st2, opt, 3600.0)["usd_per_gpu_hour"] == pytest.approx(2.5 * (1 - discount))


def test_spot_goodput_falls_and_cost_falls(tmp_path):
    """Spot: preemptions (3.42e-5 per GPU-hour, AWS's top interruption bucket on 8-GPU instances)
    add to the failure rate (1.97e-5, Llama 3), so goodput falls and the run takes longer, but the
    70% discount still makes it cheaper: the saving is 1 - 0.3 x (time on spot / time on demand)."""
    study = {**SMALL, "pricing": {"mode": ["cloud", "spot"], "usd_per_gpu_hour": {"h100": 2.5}},
             "sensitivity": "off", "constraints": {}}
    res = run_study(study, tmp_path, report=True)  # the report draws spot options too
    assert (tmp_path / "report.html").exists() and (tmp_path / "time_vs_cost_w1.png").exists()
    by = {(r["gpu"], r["num_gpus"], r["mode"]): r for r in res.rows}
    for (gpu, n, mode), spot in by.items():
        if mode != "spot":
            continue
        cloud = by[(gpu, n, "cloud")]
        assert spot["mtbf_h"] == pytest.approx(1 / ((1.9733e-5 + 3.42e-5) * n))
        assert cloud["mtbf_h"] == pytest.approx(1 / (1.9733e-5 * n))
        assert spot["goodput"] < cloud["goodput"] and spot["time_to_train_days"] > cloud["time_to_train_days"]
        saving = 1 - spot["cost_usd"] / cloud["cost_usd"]
        assert saving == pytest.approx(1 - 0.3 * spot["time_to_train_days"] / cloud["time_to_train_days"])
        assert 0.6 < saving < 0.7
    assert "spot preemptions: 3.42e-05/GPU-h" in " ".join(res.document["assumptions"])


def test_goodput_counts_every_loss_as_the_seeds_define_it(tmp_path):
    """Seed 002: goodput = useful tokens per second after every loss; over the cluster's theoretical
    maximum it is an efficiency (its example: 10,000 of 12,000 tokens/s = 83.3%). Here: MFU (the
    step's own losses) x training-time ratio (failures, checkpoints) x (1 - other losses)."""
    from autoshard.catalog import get_gpu
    from autoshard.cost import model_flops_per_step
    from autoshard.loader import load_problem

    study = {**SMALL, "options": [{"gpu": "h100-sxm", "num_gpus": 16}], "pricing": {"mode": "cloud"},
             "sensitivity": "off"}
    base = run_study(study, tmp_path / "a", report=False).rows[0]
    lossy = run_study({**study, "reliability": {"other_loss_fraction": 0.25}}, tmp_path / "b", report=False).rows[0]
    wl = SMALL["workloads"][0]
    problem = load_problem({"model": wl["model"], "training": wl["training"],
                            "cluster": {"gpu": "h100-sxm", "num_gpus": 16}})
    flops_per_token = model_flops_per_step(problem) / (64 * 4096)
    peak = 16 * get_gpu("h100-sxm").peak_flops("bf16") / flops_per_token  # tokens/s with every GPU at peak
    assert base["peak_tokens_per_s"] == pytest.approx(peak, rel=1e-9)
    assert base["goodput_efficiency"] == pytest.approx(base["mfu"] * base["training_time_ratio"], rel=1e-12)
    # useful tokens per wall-clock second: the token budget over the time to train (steps round up)
    steps_tokens = base["steps"] * 64 * 4096
    assert base["goodput_tokens_per_s"] == pytest.approx(steps_tokens / (base["time_to_train_days"] * 86400), rel=1e-9)
    assert base["goodput_tokens_per_s"] / base["peak_tokens_per_s"] == pytest.approx(base["goodput_efficiency"])
    assert lossy["goodput"] == pytest.approx(0.75 * base["goodput"])
    assert lossy["time_to_train_days"] == pytest.approx(base["time_to_train_days"] / 0.75)
    assert lossy["goodput_efficiency"] == pytest.approx(0.75 * base["goodput_efficiency"])


def test_gb200_rack_power_under_both_figures():
    """The catalog's GB200 share (1,200 W + 10% node overhead = 95 kW per 72-GPU rack) against the
    seeds' 120-132 kW per rack (seed 002; the top, 1,833 W per GPU): GB200 x 2,304 at PUE 1.3 draws
    3.95 MW by the first and 5.49 MW by the second, over the bundled study's 5 MW cap."""
    from autoshard.whatif import Option, price_option

    st = load_study("problems/studies/llama3-70b-hardware.yaml")
    assert st.spec.pricing.power_figure == "seeds"
    gb = Option("gb200", 2304, "gb200-nvl72", "cloud")
    seeds = price_option(st, gb, 3600.0)["power_mw"]
    catalog = price_option(st, gb, 3600.0, power_figure="catalog")["power_mw"]
    assert catalog == pytest.approx(2304 * 1200 * 1.10 * 1.3 / 1e6) and 72 * 1200 * 1.10 / 1e3 == pytest.approx(95.04)
    assert seeds == pytest.approx(2304 * 132_000 / 72 * 1.3 / 1e6, rel=1e-4) and seeds > 5.0 > catalog
    b200 = Option("b200", 2048, "dgx-b200", "cloud")  # no other figure for B200: the same under both
    assert price_option(st, b200, 3600.0)["power_mw"] == price_option(st, b200, 3600.0, power_figure="catalog")[
        "power_mw"] < 5.0
    with pytest.raises(InputError, match=r"pricing.power_figure: unknown power figure 'vendor' \(valid: catalog, seeds"):
        load_study({**SMALL, "pricing": {"power_figure": "vendor"}})
    # a figure the study's GPUs lack is not an error: those GPUs use the catalog figure
    h100_only = load_study({**SMALL, "options": [{"gpu": "h100", "num_gpus": 8}], "pricing": {"power_figure": "seeds"}})
    assert price_option(h100_only, Option("h100-sxm", 8, "dgx-h100-superpod", "cloud"), 3600.0)["power_mw"] == \
        pytest.approx(8 * 910 * 1.3 / 1e6)


def test_recommendation_under_both_power_figures(tmp_path, capsys):
    """A cap between GB200's two power figures flips the answer: under the catalog figure GB200 x144
    is allowed, under the seeds' rack figure it breaks the cap and B200 x128 is chosen; the results,
    the summary and the report give both answers."""
    study = {"name": "power", "workloads": [{"model": "llama3-8b", "tokens": 2e10,
                                             "training": {"seq_len": 4096, "global_batch_size": 1152},
                                             "search": {"tp": 1, "pp": 1, "cp": 1}}],
             "options": [{"gpu": "gb200", "num_gpus": 144, "topology": "gb200-nvl72"},
                         {"gpu": "b200", "num_gpus": 128}],
             "pricing": {"mode": "cloud", "power_figure": "seeds"}, "sensitivity": "off",
             "constraints": {"power_cap_mw": 0.3}}
    res = run_study(study, tmp_path, report=True)
    rows = {r["gpu"]: r for r in res.rows}
    assert rows["gb200"]["power_mw"] == pytest.approx(144 * 1833.3 * 1.3 / 1e6)  # 0.343 MW > 0.3
    assert rows["gb200"]["power_mw_by_figure"]["catalog"] == pytest.approx(144 * 1320 * 1.3 / 1e6)  # 0.247 MW
    rec = res.recommended
    assert rec["power_figure"] == "seeds" and rec["option"] == "b200/128/dgx-b200/cloud"
    alt = rec["under_other_power_figures"]["catalog"]
    assert rows["gb200"]["time_to_train_days"] < rows["b200"]["time_to_train_days"]  # why the catalog picks GB200
    assert alt["option"] == "gb200/144/gb200-nvl72/cloud"
    text = res.summary_text()
    assert "with the power figure 'catalog' instead of 'seeds': gb200/144/gb200-nvl72/cloud" in text
    md = (tmp_path / "report.md").read_text()
    assert ("Power figure: this study uses `seeds`; under `catalog` the answer would be **gb200/144/gb200-nvl72/cloud**"
            in md) and "by `seeds` that option breaks: power 343 kW > cap 300 kW." in md


def test_the_documented_study_file_loads():
    """problems/studies/README.md's annotated study (every field) is a valid study."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[1] / "problems" / "studies" / "README.md").read_text(encoding="utf-8")
    st = load_study(yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1)))
    assert st.spec.pricing.spot_discount == 0.7 and st.spec.reliability.spot_preemptions_per_gpu_hour == 3.42e-5
    assert {o.mode for o in st.options} >= {"cloud", "own"}


@pytest.mark.parametrize("patch, message", [
    ({"pricing": {"mode": "spot", "spot_discount": 1.0}}, "pricing.spot_discount: the value must be from 0 to 1 (excluded), got 1"),
    ({"pricing": {"spot_discount": {"h100": -0.1}}}, "pricing.spot_discount: h100 must be from 0 to 1 (excluded), got -0.1"),
    ({"pricing": {"node_overhead_w": -5}}, "pricing.node_overhead_w: the value must be from 0 to 100000, got -5"),
    ({"reliability": {"failures_per_gpu_hour": 1e308}}, "reliability.failures_per_gpu_hour: the value must be from 0 to 1"),
    ({"reliability": {"failures_per_gpu_hour": {"h100": -1}}}, "reliability.failures_per_gpu_hour: h100 must be from 0 to 1"),
    ({"pricing": {"usd_per_gpu_hour": {"h100": 1e308}}}, "pricing.usd_per_gpu_hour.h100: Input should be less than or equal to 10000"),
    ({"reliability": {"restart_s": 1e308}}, "reliability.restart_s: Input should be less than or equal to 1000000"),
    ({"reliability": {"checkpoint_interval_s": 1e-300}}, "reliability.checkpoint_interval_s: Input should be greater than or equal to 1"),
    ({"reliability": {"other_loss_fraction": 1.0}}, "reliability.other_loss_fraction: Input should be less than or equal to 0.99"),
    ({"pricing": {"mode": "own", "amortization_years": 1e-300}}, "pricing.amortization_years: Input should be greater than or equal to 0.1"),
    ({"constraints": {"budget_usd": math.inf}}, "constraints.budget_usd: Input should be a finite number"),
    ({"constraints": {"power_cap_mw": math.nan}}, "constraints.power_cap_mw: Input should be a finite number"),
])
def test_absurd_prices_and_rates_are_one_plain_line(patch, message):
    """Inputs that made the report crash (an infinite cost in matplotlib), divide by zero (an infinite
    failure rate) or print 200-digit figures: bounded far beyond any real figure, one line each."""
    with pytest.raises(InputError) as exc:
        load_study({**SMALL, **patch})
    line = exc.value.line()
    assert message in line and "constrained-float" not in line, line


def test_a_study_that_expands_to_too_many_options():
    spec = {**SMALL, "pricing": {"mode": ["cloud", "own", "spot"]},
            "options": [{"gpu": ["h100", "b200"], "num_gpus": {"start": 1, "stop": 4096, "step": 1}}]}
    with pytest.raises(InputError) as exc:  # 2 GPUs x 4,096 counts x 3 modes = 24,576
        load_study(spec)
    assert exc.value.line() == ("options.0: the study expands to more than 20,000 hardware options (GPU x count x "
                                "topology x pricing mode): split it, or sweep with a larger step or factor")
    assert len(load_study({**spec, "pricing": {"mode": "cloud"}}).options) == 8192


def test_an_output_folder_that_cannot_be_written_fails_before_solving(tmp_path, monkeypatch):
    """`-o /proc/x` passed the command line's permission check, solved every option (35 s for the
    cloud-vs-buy study) and then failed to write: now the folder is created and probed first."""
    import autoshard.whatif.runner as runner

    def boom(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("solved before checking the output folder")

    monkeypatch.setattr(runner, "_execute", boom)
    with pytest.raises(InputError) as exc:
        run_study(SMALL, "/proc/autoshard-test/out")
    assert exc.value.line().startswith("/proc/autoshard-test/out: cannot write here: ")


def _dies_on_16_gpus(task):  # module level: the worker pool pickles it by name
    import os

    if task.num_gpus == 16:
        os._exit(1)  # a worker killed mid-solve (out of memory, SIGKILL)
    return run_task(task)  # the real one (imported above; the test patches the runner's name)


def test_a_worker_that_dies_is_reported_not_a_hang(tmp_path, monkeypatch):
    """A worker process that dies breaks the pool: its option and those still queued are error rows
    ('worker process died'), never a hang (multiprocessing.Pool waited forever for the lost task)."""
    import autoshard.whatif.runner as runner

    monkeypatch.setattr(runner, "run_task", _dies_on_16_gpus)
    study = {**SMALL, "pricing": {"mode": "cloud"}, "sensitivity": "off"}
    try:
        res = run_study(study, tmp_path, jobs=2, report=False)
        rows = res.rows
    except Exception as exc:  # every option failed: one line, results written
        assert "every option failed to solve" in str(exc)
        rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    died = [r for r in rows if r.get("status") == "error"]
    assert any(r["num_gpus"] == 16 for r in died)
    assert all(r["reason"].startswith("worker process died") for r in died)


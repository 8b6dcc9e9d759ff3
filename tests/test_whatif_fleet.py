"""What-if fleets (issue 34): pools owned and to be bought; each job on one pool; the job mix's time,
cost and energy, which pool runs each job, and what to buy next. End to end on the bundled study."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.errors import InputError
from autoshard.whatif import run_study
from autoshard.whatif.study import load_study

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "problems" / "studies" / "fleet-h100-plus-b200.yaml"


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fleet")
    res = run_study(STUDY, out, jobs=2)
    return res, out


def test_owned_h100_and_candidate_b200_end_to_end(fleet_run):
    res, out = fleet_run
    fleet = res.document["fleet"]
    assert [(p["name"], p["gpu"], p["num_gpus"], p["owned"]) for p in fleet["pools"]] == [
        ("owned-h100", "h100-sxm", 1024, True), ("new-b200", "b200", 512, False)]
    rows = {(r["workload"], r["option"]): r for r in res.rows}
    pool_opt = {p["name"]: p["option"] for p in fleet["pools"]}
    jobs = ["llama3-70b-2T", "llama3-8b-4T"]
    days = {(j, p): rows[(j, o)]["time_to_train_days"] for j in jobs for p, o in pool_opt.items()}
    cost = {(j, p): rows[(j, o)]["cost_usd"] for j in jobs for p, o in pool_opt.items()}
    by = {s["scenario"]: s for s in fleet["scenarios"]}
    # Owned pools only: both jobs one after the other on the H100s.
    own = by["owned pools only"]
    assert own["makespan_days"] == pytest.approx(days[(jobs[0], "owned-h100")] + days[(jobs[1], "owned-h100")])
    assert own["capex_usd"] == 0 and own["violations"]  # 26 days > the 24-day deadline
    # With the B200 pool: brute force over the 4 assignments, the cheapest that meets the deadline.
    buy = by["owned + buy new-b200"]
    best = None
    for a in itertools.product(["owned-h100", "new-b200"], repeat=2):
        busy = {}
        for j, p in zip(jobs, a):
            busy[p] = busy.get(p, 0.0) + days[(j, p)]
        span, c = max(busy.values()), sum(cost[(j, p)] for j, p in zip(jobs, a))
        if span <= 24 and (best is None or c < best[1]):
            best = (dict(zip(jobs, a)), c, span)
    assert buy["assignment"] == best[0] == {"llama3-70b-2T": "owned-h100", "llama3-8b-4T": "new-b200"}
    assert buy["running_cost_usd"] == pytest.approx(best[1]) and buy["makespan_days"] == pytest.approx(best[2])
    assert buy["energy_mwh"] == pytest.approx(sum(rows[(j, pool_opt[p])]["energy_mwh"] for j, p in best[0].items()))
    # The B200 pool's capex counts once: 512 x the catalog's purchase price.
    assert buy["capex_usd"] == rows[("llama3-8b-4T", pool_opt["new-b200"])]["capex_usd"] > 0
    assert not buy["violations"]
    rec = fleet["recommendation"]
    assert rec["buy"] == ["new-b200"] and "days sooner" in rec["reason"]
    report = (out / "report.md").read_text()
    assert "## Fleet: which pool runs each job, and what to buy next" in report
    assert "**buy new-b200: owned + buy new-b200" in report and "llama3-8b-4T -> new-b200" in report
    assert json.loads((out / "results.json").read_text())["fleet"]["recommendation"]["buy"] == ["new-b200"]


def test_fleet_bad_input_is_one_line(tmp_path):
    doc = {"workloads": [{"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64},
                          "tokens": 1e9}],
           "fleet": [{"name": "a", "gpu": "h100", "num_gpus": 8}, {"name": "b", "gpu": "h1000", "num_gpus": 8}]}
    with pytest.raises(InputError) as exc:
        load_study(doc)
    assert exc.value.field == "fleet.1.gpu"
    doc["fleet"][1] = {"name": "a", "gpu": "b200", "num_gpus": 8}
    with pytest.raises(InputError, match="two fleet pools are named 'a'"):
        load_study(doc)
    with pytest.raises(InputError, match="give `options` or a `fleet`"):
        load_study({**doc, "fleet": []})
    f = tmp_path / "s.yaml"
    f.write_text("workloads: [{model: llama3-8b, training: {seq_len: 4096, global_batch_size: 64}, tokens: 1e9}]\n"
                 "fleet: [{name: a, gpu: h100, num_gpus: 0}]\n")
    r = subprocess.run([sys.executable, "-m", "autoshard.cli", "whatif", str(f), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "fleet.0.num_gpus" in r.stderr and len(r.stderr.strip().splitlines()) == 1

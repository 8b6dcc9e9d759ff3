"""The newcomer audit's command-line defects: each test runs the real CLI (in this process) on the
input the audit used and checks what the user now sees."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from autoshard import cli
from cli_helpers import one_line, run_cli

ROOT = Path(__file__).resolve().parents[1]
OK = "tests/data/bad/ok_problem.yaml"  # relative: the tests run at the repository root
P640 = "problems/llama3-70b-640xh100.yaml"  # global_batch_size 960, 640 H100
PCIE = {"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 256, "precision": "bf16"},
        "cluster": {"gpu": "h100-pcie", "num_gpus": 256}}


main = run_cli


def write(path: Path, doc: dict) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# ---- 1. a batch given in tokens --------------------------------------------------------------------


def test_batch_given_in_tokens_is_bad_input_naming_the_sequences_meant(tmp_path, capsys):
    """4,000,000 'sequences' of 4096 tokens (the user meant 4M tokens): CP-SAT overflowed with a
    traceback; now one line, exit 2, nothing written, and `batch` records it as bad input."""
    prob = write(tmp_path / "units3.yaml", {"model": "llama3-70b", "cluster": {"gpu": "h100-sxm", "num_gpus": 640},
                                            "training": {"seq_len": 4096, "global_batch_size": 4_000_000}})
    want = (f"autoshard: error: {prob}: training.global_batch_size: 4,000,000 sequences x 4096 tokens = 16.4B tokens "
            "per step, more than the 1B allowed; global_batch_size counts sequences (did you mean 977?)")
    for argv in (["solve", prob, "-o", str(tmp_path / "sol.json")], ["evaluate", prob, "--plan", "tp=8,pp=4"]):
        rc, out, err = main(capsys, *argv)
        assert rc == 2 and out == "" and one_line(err) == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["units3.yaml"]
    rc, out, err = main(capsys, "batch", prob, "-o", str(tmp_path / "out"), "--quiet")
    rec = json.loads((tmp_path / "out" / "units3.json").read_text())
    assert rc == 2 and rec["error"]["kind"] == "input" and "did you mean 977?" in rec["error"]["message"]


def test_the_token_bound_lets_every_real_batch_through():
    """1e9 tokens per step is the bound: 244,140 x 4096 (just under) loads, one more sequence does not."""
    from autoshard.errors import InputError
    from autoshard.loader import MAX_TOKENS_PER_STEP, load_problem

    base = {"model": "llama3-8b", "cluster": {"gpu": "h100", "num_gpus": 8}}
    n = int(MAX_TOKENS_PER_STEP // 4096)
    assert load_problem({**base, "training": {"seq_len": 4096, "global_batch_size": n}}).training.tokens_per_step <= 1e9
    with pytest.raises(InputError, match=r"244,141 sequences x 4096 tokens = 1,000,001,536 tokens per step, more "
                                         r"than the 1B allowed; .* \(did you mean 60\?\)"):
        load_problem({**base, "training": {"seq_len": 4096, "global_batch_size": n + 1}})


def test_a_runtime_error_of_the_solver_is_one_line(capsys, monkeypatch):
    """Whatever CP-SAT still rejects reaches the user as one line naming the problem, never a traceback."""
    import autoshard.solver as solver

    def reject(*a, **k):
        raise RuntimeError("CP-SAT rejected the stage model: Possible integer overflow in constraint: linear {\n"
                           "  vars: 0\n  coeffs: -8847718141\n}")

    monkeypatch.setattr(solver, "solve", reject)
    for argv in (["solve", OK], ["compare", OK, "--plan", "tp=1,pp=1", "--quiet"]):
        rc, out, err = main(capsys, *argv)
        line = one_line(err)
        assert rc == 2 and out == ""
        assert line.startswith(f"autoshard: error: {OK}: the solver failed: CP-SAT rejected the stage model: "
                               "Possible integer overflow in constraint (")
        assert "global_batch_size counts sequences" in line and "vars" not in line


def test_an_internal_error_is_one_line_with_its_own_exit_code(capsys, monkeypatch):
    """A bug (any exception that is not bad input, infeasibility or an interrupt) exits 3, not 2: the
    user is told it is autoshard's fault and how to get the traceback, in one line naming the problem.
    AUTOSHARD_DEBUG=1 lets it raise with its traceback."""
    import autoshard.solver as solver

    def broken(*a, **k):
        raise KeyError("stage_layers")

    monkeypatch.setattr(solver, "solve", broken)
    monkeypatch.delenv("AUTOSHARD_DEBUG", raising=False)
    rc, out, err = main(capsys, "solve", OK)
    line = one_line(err)
    assert rc == 3 and out == ""
    assert line.startswith(f"autoshard: error: {OK}: internal error: KeyError: 'stage_layers' (a bug in autoshard")
    assert "AUTOSHARD_DEBUG=1" in line and "Traceback" not in err

    def cpsat(*a, **k):  # CP-SAT refusing a model for another reason than a too-large number: ours to fix
        raise RuntimeError("CP-SAT rejected the stage model: MODEL_INVALID")

    monkeypatch.setattr(solver, "solve", cpsat)
    rc, _, err = main(capsys, "solve", OK)
    assert rc == 3 and "the solver failed: CP-SAT rejected the stage model: MODEL_INVALID (a bug" in one_line(err)

    monkeypatch.setenv("AUTOSHARD_DEBUG", "1")
    with pytest.raises(RuntimeError, match="MODEL_INVALID"):
        cli.main(["solve", OK])


# ---- 2. solve --robust says what it picked ---------------------------------------------------------


def test_robust_pick_is_reported_in_text_and_json(tmp_path, capsys, monkeypatch):
    """The solver status and objective are the point-estimate optimum's: when --robust picks another
    plan the text says so next to `solver: OPTIMAL`, and the JSON records `solver.selection`."""
    import autoshard.solver.robust as robust

    prob = write(tmp_path / "pcie.yaml", PCIE)
    rc, out, _ = main(capsys, "solve", prob, "--json", "--quiet")
    point = json.loads(out)
    assert rc == 0 and point["solver"]["selection"] == "point" and "point_estimate" not in point["solver"]

    real = robust.robust_choice
    picked: list = []

    def spy(sol):
        picked.append((sol, real(sol)))
        return picked[-1][1]

    monkeypatch.setattr(robust, "robust_choice", spy)
    rc, out, _ = main(capsys, "solve", prob, "--json", "--quiet", "--robust")
    rob = json.loads(out)
    sol, chosen = picked[-1]
    st = rob["solver"]
    assert rc == 0 and st["selection"] == "robust"
    assert st["point_estimate"]["plan_summary"] == sol.plan.short() == point["plan_summary"]
    assert abs(st["point_estimate"]["step_time_s"] - st["objective_s"]) <= st["rounding_tolerance_s"] + 1e-12
    assert st["point_estimate"]["same_plan"] is (chosen.plan == sol.plan)
    rc, text, _ = main(capsys, "solve", prob, "--quiet", "--robust")
    if chosen.plan != sol.plan:  # this problem: the pipelined plan has the lower upper bound
        assert rob["estimate"]["step_time_s"] > st["objective_s"]
        assert f"solver: OPTIMAL (point estimate {sol.estimate.step_time_s:.3f} s/step) in " in text
        assert "--robust picked the plan with the lowest upper end of the 80% interval" in text
        assert f"point-estimate optimum `{sol.plan.short()}`" in text
    else:
        assert "--robust: the point-estimate optimum also has the lowest upper end" in text

    # Forced: --robust picking the first alternative is always said, in the text and the Markdown.
    monkeypatch.setattr(robust, "robust_choice", lambda s: s.model_copy(update={
        "plan": s.alternatives[0].plan, "estimate": s.alternatives[0].estimate}))
    rc, text, _ = main(capsys, "solve", prob, "--quiet", "--robust", "-o", str(tmp_path / "r.md"))
    assert rc == 0 and "solver: OPTIMAL (point estimate " in text and "--robust picked the plan" in text
    md = (tmp_path / "r.md").read_text()
    assert "(picked by --robust)" in md and "| selection | robust" in md


# ---- 3, 4. invalid plans: exit 2 everywhere, naming the file, the field and the real reason ----------


def test_invalid_plan_is_bad_input_in_evaluate_and_compare(tmp_path, capsys):
    bad = write(tmp_path / "bad.yaml", {"tp": 8, "pp": 3})
    want = f"autoshard: error: {bad}: pp: invalid plan: tp*cp*pp = 24 does not divide the 640 GPUs"
    for argv in (["evaluate", P640, "--plan", bad], ["evaluate", P640, "--plan", bad, "--json"],
                 ["compare", P640, "--plan", bad, "--quiet"], ["solve", P640, "--compare", bad, "--quiet"]):
        rc, out, err = main(capsys, *argv)
        assert rc == 2 and out == "" and one_line(err) == want, (argv, err)
    # tp1 pp1: dp = 640 divides the GPUs; the batch does not split (the old text said `no dp: ... do not divide`)
    flat = write(tmp_path / "flat.yaml", {"plan": {"tp": 1, "pp": 1}})
    reason = "global_batch_size=960 is not a multiple of dp*micro_batch_size = 640"
    for argv in (["evaluate", P640, "--plan", flat], ["compare", P640, "--plan", flat, "--quiet"]):
        rc, out, err = main(capsys, *argv)
        assert rc == 2 and out == "" and one_line(err) == f"autoshard: error: {flat}: plan.dp: invalid plan: {reason}"
    rc, out, err = main(capsys, "evaluate", P640, "--plan", "tp=1,pp=1")
    assert rc == 2 and one_line(err) == f"autoshard: error: --plan: dp: invalid plan: {reason}" and "no dp" not in err


def test_plan_text_names_the_dp_it_derives(capsys):
    from autoshard import evaluate, load_problem
    from autoshard.render import estimate_text
    from autoshard.spec import Plan

    problem = load_problem(P640)
    text = estimate_text(problem, evaluate(problem, Plan(tp=1, pp=1)))
    assert "plan: tp1 pp1 dp640 " in text and "no dp" not in text and "global_batch_size=960" in text
    text = estimate_text(problem, evaluate(problem, Plan(tp=8, pp=3)))
    assert "(no dp: tp*cp*pp = 24 does not divide the 640 GPUs)" in text


def test_evaluate_accepts_inline_plans_like_compare(tmp_path, capsys):
    plan = write(tmp_path / "plan.yaml", {"tp": 8, "pp": 4})
    rc, from_file, _ = main(capsys, "evaluate", P640, "--plan", plan, "--json")
    rc2, inline, err = main(capsys, "evaluate", P640, "--plan", "tp=8,pp=4", "--json")
    assert rc == rc2 == 0 and inline == from_file, err
    rc, _, err = main(capsys, "evaluate", P640, "--plan", "tp=8,pp=4,zero_stage=7")
    assert rc == 2 and one_line(err).startswith("autoshard: error: --plan: zero_stage: ")


# ---- 5, 6. solve -o FILE.yaml, export after --hf-config -------------------------------------------


def test_solve_output_yaml_is_the_record_and_reads_back(tmp_path, capsys):
    rc, out, _ = main(capsys, "solve", OK, "--json", "--top", "0")
    record = json.loads(out)
    record["solver"].pop("solve_time_s")
    for name in ("sol.yaml", "sol.yml"):
        rc, _, err = main(capsys, "solve", OK, "--top", "0", "-o", str(tmp_path / name))
        doc = yaml.safe_load((tmp_path / name).read_text())
        assert rc == 0 and isinstance(doc, dict), err
        doc["solver"].pop("solve_time_s")
        assert doc == record
        rc, text, err = main(capsys, "evaluate", OK, "--plan", str(tmp_path / name))
        assert rc == 0 and f"plan: {record['plan_summary']}" in text, err
    rc, _, _ = main(capsys, "solve", OK, "--top", "0", "-o", str(tmp_path / "sol.md"))
    assert (tmp_path / "sol.md").read_text().startswith("# ")


def test_export_after_solve_with_hf_config(tmp_path, capsys):
    hf = "tests/data/hf/Qwen2-7B.json"
    sol = str(tmp_path / "sol.json")
    rc, _, err = main(capsys, "solve", OK, "--hf-config", hf, "--top", "0", "-o", sol, "--quiet")
    assert rc == 0, err
    assert json.loads(Path(sol).read_text())["problem"]["hf_config"] == str((ROOT / hf).resolve())
    rc, out, err = main(capsys, "export", sol, "--format", "megatron")
    assert rc == 0 and "Traceback" not in err, err
    assert re.search(r"--hidden-size 3584\b", out) and re.search(r"--num-layers 28\b", out)


# ---- 7, 8. what-if plots and money / power --------------------------------------------------------


def test_step_breakdown_gives_every_part_its_own_colour(monkeypatch):
    from matplotlib.axes import Axes

    from autoshard.whatif import report

    assert set(report.TIME_COLORS) == set(report.TIME_KEYS)
    assert len(set(report.TIME_COLORS.values())) == len(report.TIME_KEYS)
    drawn: dict[str, str] = {}
    real = Axes.barh

    def barh(self, *a, **k):
        drawn[k["label"]] = k["color"]
        return real(self, *a, **k)

    monkeypatch.setattr(Axes, "barh", barh)
    row = {"gpu": "h100-sxm", "topology": "dgx-h100-superpod", "num_gpus": 8, "step_time_s": 1.0, "mfu": 0.5,
           "mode": "cloud", "option": "h100-sxm/8/dgx-h100-superpod/cloud", "feasible": True,
           "time_breakdown_s": {k: 1.0 for k in report.TIME_KEYS}}
    png = report.plot_step_breakdown([row], "t", False, ["h100-sxm"])
    assert png.startswith(b"\x89PNG") and len(drawn) == 12 and len(set(drawn.values())) == 12
    assert drawn["compute"] != drawn["DP comm (exposed)"]


def test_money_and_power_show_what_the_comparison_needs():
    from autoshard.whatif.purchase import Candidate, violations
    from autoshard.whatif.report import money, power, power_vs
    from autoshard.whatif.schema import ConstraintSpec

    cand = Candidate(id="gb200/1152", time_s=86400.0, cost_usd=12.04e6, capex_usd=0.0, power_mw=5.004)
    cons = ConstraintSpec(budget_usd=12e6, power_cap_mw=5.0)
    assert violations(cand, cons) == ["cost $12.04M > budget $12M", "power 5.004 MW > cap 5 MW"]
    assert money(12.3e6) == "$12.3M" and power(4.85) == "4.85 MW"
    assert power(8 * 910 * 1.3 / 1e6) == "9.46 kW" and power_vs(0.343, 0.3) == ("343 kW", "300 kW")


# ---- 9. MFU against which peak ---------------------------------------------------------------------


def test_mfu_of_a_low_precision_plan_names_its_peak(tmp_path, capsys):
    doc = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64, "precision": "fp8"},
           "cluster": {"gpu": "h100-sxm", "num_gpus": 8}, "plan": {"tp": 1, "pp": 1, "recompute": "full"}}
    rc, out, _ = main(capsys, "evaluate", write(tmp_path / "fp8.yaml", doc))
    mfu = json.loads(main(capsys, "evaluate", str(tmp_path / "fp8.yaml"), "--json")[1])["mfu"]
    assert f"MFU {100 * mfu:.1f}% of the fp8 peak (1,979 TFLOP/s)  HFU" in out
    rc, out, _ = main(capsys, "evaluate", write(tmp_path / "bf16.yaml", {**doc, "training": {
        **doc["training"], "precision": "bf16"}}))
    assert re.search(r"MFU [0-9.]+%  HFU", out) and "peak (" not in out


# ---- 10. calibrate: progress on a terminal, network efficiencies outside the README's range ---------


def test_calibrate_warns_when_network_efficiencies_leave_the_nccl_range(tmp_path, capsys, monkeypatch):
    import autoshard.calibrate as cal

    eff = {"matmul": {"bf16": 0.7}, "hbm": 0.85, "scaleup": 0.4983, "scaleout": 0.8}
    fit = cal.GpuFit(gpu="h100-sxm", runs=["a", "b"], fitted=["scaleup", "scaleout"], kept={}, elasticity_rms={},
                     before=eff, after=eff, objective_before=1.0, objective_after=0.5)
    summary = cal.ErrorSummary(2, 1.0, "a", 1.0)
    result = cal.CalibrationResult(out_path="c.yaml", measurements_path="r.json", runs_used=["a", "b"], excluded=[],
                                   fits=[fit], before=summary, after=summary)
    (warning,) = cal.network_warnings(result)
    assert "outside the NCCL-like range 0.75-0.85" in warning and "h100-sxm scaleup 0.498" in warning
    assert "scaleout" not in warning.split(":")[1]
    assert cal.network_warnings(cal.CalibrationResult(**{**result.__dict__, "fits": [
        cal.GpuFit(**{**fit.__dict__, "fitted": ["matmul.bf16"]})]})) == []  # kept factors are not fitted

    seen: list[str] = []

    def fake(measurements, out, *, progress=None, **k):
        if progress is not None:
            progress("pricing 2 runs under the base catalog")
        seen.append("called")
        return result

    monkeypatch.setattr(cal, "calibrate", fake)
    monkeypatch.setattr("autoshard.progress.wanted", lambda quiet: not quiet)  # as on a terminal
    rc, out, err = main(capsys, "calibrate", "r.json", "-o", str(tmp_path / "c.yaml"))
    assert rc == 0 and seen and "calibrated on 2 runs" in out
    assert "pricing 2 runs under the base catalog" in err and f"warning: {warning}" in err
    rc, out, err = main(capsys, "calibrate", "r.json", "-o", str(tmp_path / "c.yaml"), "--quiet")
    assert rc == 0 and err == f"warning: {warning}\n"  # --quiet: no progress, the warning stays


# ---- 11. README -------------------------------------------------------------------------------------


def test_readme_cli_table_lists_every_option_of_every_command():
    import argparse

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `autoshard ([a-z-]+) [^\n]*", text, re.M)}
    parser = cli.cli_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(rows) == set(sub.choices)
    for name, sp in sub.choices.items():
        usage = rows[name].split("` |")[0]
        for action in sp._actions:
            if action.help == argparse.SUPPRESS or not action.option_strings or action.dest == "help":
                continue
            assert any(re.search(rf"{re.escape(o)}\b", usage) for o in action.option_strings), (name, action.dest)

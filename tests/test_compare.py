"""`autoshard compare`: two plans side by side, the step-time difference decomposed term by term.

The decomposition is checked against `evaluate` called independently (every term is the
evaluator's own breakdown, the terms add up to each step time and their differences to the
step-time difference), and on the seed case: Llama 3 70B on 640 H100, the seed's published
plan (TP8 SP PP4 DP20 ZeRO-1, shared/seeds/004) against the plan the solver chooses.
"""

import json
from pathlib import Path

import pytest

from autoshard import Plan, load_problem
from autoshard.cli import main
from autoshard.compare import compare, comparison_text, plan_argument
from autoshard.cost import evaluate
from autoshard.errors import InputError
from autoshard.loader import load_plan

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "problems" / "llama3-70b-640xh100.yaml"

PLANS = [  # valid plans of the seed problem that exercise different terms
    Plan(tp=8, sequence_parallel=True, pp=4, zero_stage=1, schedule="1f1b"),
    Plan(tp=1, cp=8, pp=5, vpp=3, schedule="interleaved"),
    Plan(tp=4, cp=2, pp=4, zero_stage=3, schedule="zero_bubble", recompute="full"),
    Plan(tp=8, pp=8, vpp=5, schedule="interleaved", micro_batch_size=2, recompute="selective"),
    Plan(tp=2, pp=1, zero_stage=3, recompute="full"),
]


@pytest.fixture(scope="module")
def problem():
    return load_problem(SEED)


@pytest.mark.parametrize("i,j", [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)])
def test_terms_are_the_evaluators_and_sum_to_the_step_time_difference(problem, i, j):
    a, b = PLANS[i], PLANS[j]
    ea, eb = evaluate(problem, a), evaluate(problem, b)  # independently of compare
    c = compare(problem, a, b)
    assert c.step_delta_s == pytest.approx(eb.step_time_s - ea.step_time_s, rel=1e-12, abs=1e-12)
    total = sum(t.delta for t in c.time_terms_s)
    assert total == pytest.approx(eb.step_time_s - ea.step_time_s, rel=1e-9, abs=1e-9)
    for t in c.time_terms_s:
        if t.key == "rounding":  # only ever the evaluator's own round-off
            assert abs(t.delta) < 1e-6 * max(ea.step_time_s, eb.step_time_s)
            continue
        assert t.a == pytest.approx(ea.time_breakdown_s.get(t.key, 0.0), abs=1e-15)
        assert t.b == pytest.approx(eb.time_breakdown_s.get(t.key, 0.0), abs=1e-15)
        assert t.why.strip()
    assert {t.key for t in c.time_terms_s} >= set(ea.time_breakdown_s) | set(eb.time_breakdown_s)
    # Largest difference first.
    deltas = [abs(t.delta) for t in c.time_terms_s]
    assert deltas == sorted(deltas, reverse=True)
    # Memory: the fullest stage's components add up to each peak.
    mem = sum(t.delta for t in c.memory_terms_gib)
    assert mem == pytest.approx(eb.peak_memory_gib - ea.peak_memory_gib, rel=1e-9, abs=1e-9)


def test_explains_the_seeds_published_plan_against_the_chosen_one(problem):
    from autoshard.solver import solve

    seed = load_plan(SEED)  # the seed's recommendation: TP8 + SP, PP4, ZeRO-1
    assert (seed.tp, seed.pp, seed.sequence_parallel) == (8, 4, True)
    sol = solve(problem, top_k=0)
    c = compare(problem, seed, sol.plan, "seed plan", "chosen plan")
    seed_s, chosen_s = evaluate(problem, seed).step_time_s, evaluate(problem, sol.plan).step_time_s
    assert c.step_delta_s == pytest.approx(chosen_s - seed_s)
    # The solver's plan is optimal within its proven gap, so the seed's is no faster than that allows.
    assert chosen_s <= seed_s / (1 - sol.solver.gap) + sol.solver.rounding_tolerance_s
    faster = "chosen plan" if chosen_s < seed_s else "seed plan"
    assert c.summary.lower().startswith(faster)
    tp = next(t for t in c.time_terms_s if t.key == "tp_comm")
    assert tp.a == pytest.approx(evaluate(problem, seed).time_breakdown_s["tp_comm"])
    assert "TP8" in tp.why and f"TP{sol.plan.tp}" in tp.why
    assert "sequence parallel" in tp.why  # the seed plan's TP collectives are reduce-scatter + all-gather
    text = comparison_text(c)
    assert "seed plan" in text and "chosen plan" in text and sol.plan.short() in text
    # Every term of the breakdown is there, with the numbers evaluate reports.
    for key, value in evaluate(problem, seed).time_breakdown_s.items():
        assert any(t.key == key and t.a == pytest.approx(value) for t in c.time_terms_s)


def test_a_plan_that_does_not_fit_is_compared_and_an_invalid_one_is_bad_input(problem):
    big = Plan(tp=1, pp=2, zero_stage=0)  # 35B parameters per GPU, unsharded: far over 80 GB
    c = compare(problem, big, PLANS[0])
    assert not c.a.fits and "does not fit" in c.summary
    with pytest.raises(InputError, match="invalid"):
        compare(problem, Plan(tp=3), PLANS[0])  # 3 divides neither the heads nor the GPUs


def test_inline_plans():
    p = plan_argument("tp=8, pp=4,sequence_parallel=true,schedule=interleaved,vpp=2")
    assert (p.tp, p.pp, p.sequence_parallel, p.schedule, p.vpp) == (8, 4, True, "interleaved", 2)
    assert plan_argument(str(SEED)).tp == 8  # a problem file's `plan:`
    with pytest.raises(InputError):
        plan_argument("tp=eight")


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_two_plans_json(capsys):
    rc, out, err = run(capsys, "compare", str(SEED), "--plan", "tp=8,pp=4,sequence_parallel=true",
                       "--plan", "tp=1,cp=8,pp=5,vpp=3,schedule=interleaved", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    total = sum(t["delta"] for t in doc["time_terms_s"])
    assert total == pytest.approx(doc["b"]["step_time_s"] - doc["a"]["step_time_s"], rel=1e-9)


def test_cli_names_two_long_inline_plans_apart_and_says_what_dispatch_changes(capsys):
    dsv3 = SEED.parent / "deepseek-v3-2048xh800.yaml"
    base = "tp=1,ep=32,pp=8,zero_stage=1,recompute=full"
    rc, out, err = run(capsys, "compare", str(dsv3), "--plan", base, "--plan", base + ",moe_dispatcher=deepep")
    assert rc == 0, err
    lines = out.splitlines()
    # the plans' table (rich): a header row, then one row per plan, named by its label
    assert lines[0].split() == ["plan", "s/step", "MFU", "peak", "GiB"]
    assert lines[1].startswith("plan A  ") and lines[2].startswith("plan B  ") and " deepep " in lines[2]
    assert " deepep " not in lines[1]
    ep = next(line for line in lines if line.strip().startswith("expert all-to-all"))
    assert "EP32 (plan A) vs EP32 deepep (plan B)" in ep
    a, b = (float(x) for x in ep.split()[2:4])
    assert b < 0.6 * a  # 4 nodes per EP32 group: a token crosses to ~2.7 of 3 remote nodes, not 6 of 8 copies


@pytest.mark.parametrize("plan,needle", [("tp=3", "invalid"), ("no-such-file.yaml", "no-such-file.yaml"),
                                         ("tp=8,bogus=1", "bogus")])
def test_cli_bad_plans_are_one_line_exit_2(capsys, plan, needle):
    rc, out, err = run(capsys, "compare", str(SEED), "--plan", plan, "--plan", "tp=8,pp=4")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_solve_compare(capsys):
    rc, out, err = run(capsys, "solve", str(SEED), "--top", "0", "--compare", "tp=8,pp=4,sequence_parallel=true",
                       "--json")
    assert rc == 0, err
    doc = json.loads(out)
    cmp_ = doc["compare"]
    assert cmp_["plan"]["tp"] == 8
    assert sum(t["delta"] for t in cmp_["time_terms_s"]) == pytest.approx(cmp_["step_delta_s"], rel=1e-9)
    assert cmp_["step_delta_s"] == pytest.approx(doc["estimate"]["step_time_s"]
                                                 - evaluate(load_problem(SEED), plan_argument("tp=8,pp=4,sequence_parallel=true")).step_time_s)


def test_explains_deepseek_v3s_published_plan_against_the_chosen_one():
    """The second seed case: DeepSeek-V3 on 2,048 H800, published EP64 over 8 nodes, PP16, ZeRO-1 DP, TP1
    (problems/deepseek-v3-2048xh800.yaml; DualPipe is priced as the closest schedule the space has)."""
    from autoshard.solver import solve

    problem = load_problem(ROOT / "problems" / "deepseek-v3-2048xh800.yaml")
    published = Plan(tp=1, ep=64, pp=16, zero_stage=1, schedule="zero_bubble")
    sol = solve(problem, top_k=0)
    c = compare(problem, published, sol.plan, "published plan", "chosen plan")
    ea, eb = evaluate(problem, published), evaluate(problem, sol.plan)
    assert sum(t.delta for t in c.time_terms_s) == pytest.approx(eb.step_time_s - ea.step_time_s, rel=1e-9, abs=1e-9)
    ep = next(t for t in c.time_terms_s if t.key == "ep_comm")
    assert ep.a == pytest.approx(ea.time_breakdown_s["ep_comm"]) and ep.a > 0
    assert "EP64" in ep.why and f"EP{sol.plan.ep}" in ep.why
    # Whether the published plan fits is said, with the evaluator's own reason.
    assert ("published plan does not fit" in c.summary) == (not ea.fits)
    if not ea.fits:
        assert ea.reasons[0] in c.summary

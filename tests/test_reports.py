"""What every report shows (parameter count, total and active, and the framework priced for) and the
terminal tables (`catalog`, `compare`) drawn by rich: columns that never run together, headers in
full, no all-zero rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.catalog import gpu_ids, precision_ids, resolve_model
from autoshard.cli import main
from autoshard.compare import compare, comparison_text
from autoshard.cost.params import active_params, total_params
from autoshard.render import estimate_text, model_text
from autoshard.spec import ModelSpec
from autoshard.tables import table_text

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "problems" / "llama3-70b-640xh100.yaml"


def preset(name: str) -> ModelSpec:
    return ModelSpec(**resolve_model(name))


# ---- parameter counts -----------------------------------------------------------------------------


@pytest.mark.parametrize("name,count", [
    # The safetensors totals of meta-llama/Meta-Llama-3-8B, -70B and Llama-3.1-405B on Hugging Face.
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496), ("llama3-405b", 405_853_388_800)])
def test_dense_parameter_counts_are_the_checkpoints(name, count):
    m = preset(name)
    assert total_params(m) == count and active_params(m) == count


@pytest.mark.parametrize("name,total,active,rel", [
    ("deepseek-v3", 671e9, 37e9, 0.02),   # DeepSeek-V3 README_WEIGHTS: 671B main model, 37B activated
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.005),  # Mistral AI, "Mixtral of experts": 46.7B total, 12.9B per token
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02)])  # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
def test_moe_parameter_counts_are_the_published_ones(name, total, active, rel):
    m = preset(name)
    assert total_params(m) == pytest.approx(total, rel=2e-3)
    assert active_params(m) == pytest.approx(active, rel=rel)


def test_every_report_names_the_parameters_and_the_framework(tmp_path, capsys):
    problem = load_problem(SEED)
    text = estimate_text(problem, evaluate(problem, Plan(tp=8, pp=4)))
    assert text.splitlines()[1] == "model: 70.6B parameters, all active; priced for megatron"
    moe = load_problem(ROOT / "problems" / "deepseek-v3-2048xh800.yaml")
    assert model_text(moe) == "671.0B parameters, 37.6B active per token; priced for megatron"
    titan = tmp_path / "titan.yaml"
    titan.write_text("model: llama3-8b\ntraining: {seq_len: 2048, global_batch_size: 16}\n"
                     "cluster: {gpu: h100, num_gpus: 8}\nframework: torchtitan\nsearch: {tp: [1, 2], pp: 1}\n",
                     encoding="utf-8")
    assert main(["evaluate", str(titan), "--plan", "tp=2,zero_stage=3"]) == 0
    assert "model: 8.0B parameters, all active; priced for torchtitan\n" in capsys.readouterr().out
    out = tmp_path / "sol.md"
    assert main(["solve", str(titan), "--top", "0", "-o", str(out), "--quiet"]) == 0
    assert "Model: 8.0B parameters, all active; priced for torchtitan." in out.read_text(encoding="utf-8")


# ---- tables ---------------------------------------------------------------------------------------


def test_table_keeps_markup_and_never_joins_columns():
    text = table_text(["a", ("b", "right")], [["[tp4]", 1], ["a-very-long-cell", 22]], width=10_000)
    lines = text.splitlines()
    assert lines[0].split() == ["a", "b"] and lines[1].split() == ["[tp4]", "1"]
    assert lines[2].split() == ["a-very-long-cell", "22"]
    assert all(line == line.rstrip() for line in lines)


def test_catalog_columns_stay_apart(capsys):
    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["GPU", "16-bit", "TF"]
    ids, precisions = set(gpu_ids()), set(precision_ids())
    start = lines.index("Precisions each GPU trains in:") + 2
    rows = lines[start:start + len(ids)]
    assert {r.split()[0] for r in rows} == ids  # the longest id (h100-hbm2e-96gb) stands apart
    for r in rows:
        assert r.split()[1].rstrip(",") in precisions


def test_compare_shows_long_labels_whole_and_drops_all_zero_rows():
    problem = load_problem(SEED)
    a, b = Plan(tp=8, pp=4), Plan(tp=4, pp=4, zero_stage=1)
    text = comparison_text(compare(problem, a, b, "the published plan", "the chosen plan"))
    head = next(line for line in text.splitlines() if line.strip().startswith("term"))
    assert "the published plan" in head and "the chosen plan" in head
    c = compare(problem, a, b)
    zero = [t for t in c.time_terms_s if t.a == 0 and t.b == 0]
    assert zero  # neither plan has CP, EP or host time: those terms exist and are zero
    shown = comparison_text(c)
    from autoshard.compare import TIME_NAMES  # noqa: PLC0415

    for t in zero:
        assert f"  {TIME_NAMES.get(t.key, t.key)}  " not in shown


def test_incomplete_alternatives_say_so_in_every_report(capsys):
    """Where the alternatives' share of the search ran out (`solver.alternatives_complete` false), the
    text, the markdown and the CLI say the alternatives are the best found, not each family's proven best;
    where it did not, none of them says it."""
    from autoshard.render import solution_markdown, solution_text
    from autoshard.solver import solve

    problem = load_problem("problems/llama3-8b-64xh100.yaml")
    sol = solve(problem, top_k=3)
    assert sol.solver.alternatives_complete and sol.alternatives  # (this bundled problem completes)
    short = sol.model_copy(update={"solver": sol.solver.model_copy(update={"alternatives_complete": False})})
    for render in (solution_text, solution_markdown):
        assert "a family the share did not reach may be closer" not in render(problem, sol)
        assert "a family the share did not reach may be closer" in render(problem, short)
    assert main(["solve", "problems/mixtral-8x7b-64xh100.yaml"]) == 0  # (its share runs out: bundled record)
    out = capsys.readouterr().out
    assert "  (alternatives: the best found within their share of the search's work" in out

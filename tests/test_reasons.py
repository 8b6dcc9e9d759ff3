"""Structured invalid-plan reasons: `cost.config_reasons` returns `cost.Reason`s, strs that name the
field they are about, and the CLI prints that field in its one error line (`file: plan.tp: invalid
plan: ...`) without reading the message text."""

from __future__ import annotations

import copy
import itertools
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import yaml

from autoshard import load_problem
from autoshard.cost import Reason, config_reasons
from autoshard.spec import Plan
from cli_helpers import one_line, run_cli

P640 = "problems/llama3-70b-640xh100.yaml"  # llama3-70b (64 heads, 8 KV heads, 80 layers), 640 H100, batch 960
MIX = "problems/mixtral-8x7b-64xh100.yaml"  # 8 experts, moe_intermediate_size 14336, 64 H100
OK = "tests/data/bad/ok_problem.yaml"  # llama3-8b on 8 GPUs

# (id, problem file, what the problem changes (framework, training settings), plan,
#  the field of the first reason, how that reason starts)
CASES = [
    ("tp-heads", P640, {}, {"tp": 5}, "tp", "tp=5 does not divide num_attention_heads=64"),
    ("cp-product", P640, {}, {"tp": 8, "cp": 3}, "cp", "tp*cp*pp = 24 does not divide the 640 GPUs"),
    ("pp-product", P640, {}, {"tp": 8, "pp": 3}, "pp", "tp*cp*pp = 24 does not divide the 640 GPUs"),
    ("cp-seq", P640, {}, {"cp": 5}, "cp", "cp=5: seq_len=4096 must be divisible by 2*cp"),
    ("dp-world", P640, {}, {"tp": 8, "dp": 4}, "dp", "tp*cp*pp*dp = 32 but the cluster has 640 GPUs"),
    ("dp-batch", P640, {}, {"tp": 1, "pp": 1}, "dp",
     "global_batch_size=960 is not a multiple of dp*micro_batch_size = 640"),
    ("ep-dense", P640, {}, {"tp": 8, "pp": 4, "ep": 2}, "ep", "ep=2, etp=8 need a mixture-of-experts model"),
    ("ep-experts", MIX, {}, {"ep": 3}, "ep", "ep=3 does not divide num_experts=8"),
    ("etp", MIX, {}, {"tp": 2, "etp": 3}, "etp", "etp=3 does not divide moe_intermediate_size=14336"),
    ("vpp-schedule", P640, {}, {"tp": 8, "pp": 4, "vpp": 2}, "vpp", "vpp=2 needs schedule 'interleaved'"),
    ("vpp-layers", P640, {}, {"tp": 8, "pp": 8, "vpp": 20, "schedule": "interleaved"}, "vpp",
     "pp*vpp = 160 virtual stages exceed the 80 layers"),
    ("schedule-framework", P640, {}, {"tp": 8, "pp": 4, "vpp": 2, "schedule": "dualpipev"}, "schedule",
     "megatron has no 'dualpipev' pipeline schedule"),
    ("schedule-pp", P640, {}, {"tp": 8, "pp": 4, "schedule": "interleaved"}, "schedule",
     "schedule 'interleaved' needs pp >= 2 and vpp >= 2"),
    ("micro-batches", P640, {}, {"tp": 8, "pp": 4, "vpp": 2, "schedule": "interleaved", "micro_batch_size": 8},
     "micro_batch_size", "interleaved schedule: 6 micro-batches is not a multiple of pp=4"),
    ("dispatcher", MIX, {"framework": "deepspeed"}, {"moe_dispatcher": "deepep"}, "moe_dispatcher",
     "deepspeed has no deepep expert dispatcher"),
    ("cuda-graphs", OK, {"framework": "deepspeed"}, {"cuda_graphs": True}, "cuda_graphs",
     "deepspeed cannot capture the training step in CUDA graphs"),
    ("zero-stage", OK, {"framework": "torchtitan"}, {"zero_stage": 2}, "zero_stage",
     "torchtitan runs ZeRO stages [0, 3], not 2"),
    ("sp-beside-cp", OK, {"framework": "deepspeed"}, {"tp": 2, "cp": 2}, "sequence_parallel",
     "deepspeed's context parallelism (cp=2) cannot run beside TP sequence parallelism"),
    ("cp-comm-framework", OK, {"framework": "deepspeed"}, {"cp": 2}, "cp_comm_type",
     "deepspeed splits the context with cp_comm_type a2a only"),
    ("cp-comm-window", OK, {"model": "gpt-oss-20b"}, {"cp": 2}, "cp_comm_type",
     "cp=2 with sliding-window attention: megatron's Transformer Engine attention runs it only with cp_comm_type a2a"),
    ("cp-comm-heads", P640, {}, {"tp": 8, "cp": 2, "pp": 2, "cp_comm_type": "a2a"}, "cp_comm_type",
     "cp_comm_type a2a scatters heads over cp=2"),
    ("tp-overlap", P640, {}, {"tp": 8, "pp": 4, "sequence_parallel": False, "tp_comm_overlap": True},
     "tp_comm_overlap", "tp_comm_overlap needs sequence parallelism"),
    ("ep-overlap", MIX, {"framework": "deepspeed"}, {"ep_overlap": True}, "ep_overlap",
     "deepspeed cannot overlap expert all-to-all with compute"),
    ("stage-layers-count", P640, {}, {"tp": 8, "pp": 4, "stage_layers": [20, 20, 20]}, "stage_layers",
     "stage_layers has 3 entries, expected pp*vpp = 4"),
    ("stage-layers-sum", P640, {}, {"tp": 8, "pp": 4, "stage_layers": [20, 20, 20, 21]}, "stage_layers",
     "stage_layers sum to 81, the model has 80 layers"),
    ("recompute", P640, {}, {"tp": 8, "pp": 4, "recompute": ["full"] * 79}, "recompute",
     "recompute lists 79 layers, the model has 80"),
    ("training-main-grads", OK, {"framework": "maxtext", "training": {"main_grads": "bf16"}},
     {"zero_stage": 0, "schedule": "gpipe"}, "training.main_grads", "maxtext keeps its gradients in fp32, not bf16"),
    ("training-fp8-params", OK, {"framework": "deepspeed", "training": {"fp8_params": True}}, {},
     "training.fp8_params", "deepspeed cannot keep its weights in FP8"),
    ("training-capacity", MIX, {"framework": "torchtitan", "training": {"moe_capacity_factor": 1.25}},
     {"zero_stage": 3}, "training.moe_capacity_factor", "torchtitan routes dropless"),
]


def problem_doc(path: str, change: dict) -> dict:
    doc = yaml.safe_load(Path(path).read_text())
    doc = {k: v for k, v in doc.items() if k != "plan"}
    for key, value in change.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) else value
    return doc


def problem_of(path: str, change: dict):
    return load_problem(problem_doc(path, change))


@pytest.mark.parametrize(("path", "change", "plan", "field", "start"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_first_reason_names_its_field_and_the_cli_prints_it(tmp_path, capsys, path, change, plan, field, start):
    _, reasons = config_reasons(problem_of(path, change), Plan(**plan))
    assert reasons and reasons[0].startswith(start), reasons
    assert isinstance(reasons[0], Reason) and reasons[0].field == field

    prob = tmp_path / "problem.yaml"
    prob.write_text(yaml.safe_dump(problem_doc(path, change)))
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump({"plan": plan}))
    rc, out, err = run_cli(capsys, "evaluate", str(prob), "--plan", str(plan_file))
    joined = "; ".join(reasons)
    if field.startswith("training."):  # about the problem: its file and its training settings
        want = f"autoshard: error: {prob}: {field}: {joined}"
    else:
        want = f"autoshard: error: {plan_file}: plan.{field}: invalid plan: {joined}"
    assert rc == 2 and out == "" and one_line(err) == want


def test_the_cases_cover_the_reasons_asked_for():
    fields = {c[4] for c in CASES}
    assert {"tp", "cp", "pp", "dp", "ep", "etp", "vpp", "schedule", "moe_dispatcher", "cuda_graphs",
            "stage_layers"} <= fields and any(f.startswith("training.") for f in fields)


def _sweep():
    """Every reason of a grid of plans (degrees that do and do not divide, every schedule, knobs the
    frameworks lack) on dense and MoE problems under every framework, plus the CASES above."""
    for path, change, plan, *_ in (c[1:] for c in CASES):
        yield from config_reasons(problem_of(path, change), Plan(**plan))[1]
    for path, fw in itertools.product((OK, MIX), ("megatron", "torchtitan", "automodel", "deepspeed", "maxtext")):
        problem = problem_of(path, {"framework": fw, "training": {"main_grads": "bf16", "moe_capacity_factor": 2.0,
                                                                  "fp8_params": True}})
        for tp, cp, pp, vpp, ep, schedule in itertools.product((1, 3, 8), (1, 3), (1, 2, 5), (1, 2), (1, 3),
                                                               ("1f1b", "interleaved", "dualpipev", "zero_bubble")):
            plan = Plan(tp=tp, cp=cp, pp=pp, vpp=vpp, ep=ep, etp=5 if ep > 1 else None, schedule=schedule,
                        zero_stage=2, micro_batch_size=3, cuda_graphs=True, tp_comm_overlap=True,
                        sequence_parallel=cp > 1 or None, ep_overlap=True, moe_dispatcher="deepep",
                        cp_comm_type="a2a" if cp > 1 else "p2p", stage_layers=[1] * (pp * vpp), recompute=["full"])
            yield from config_reasons(problem, plan)[1]


def test_every_reason_names_a_field():
    """A reason added without a field fails here: every one the sweep meets is a Reason whose field
    is a plan field or `training.X` of the problem."""
    plan_fields = set(Plan.model_fields)
    training_fields = set(type(load_problem(OK).training).model_fields)
    seen = set()
    for reason in _sweep():
        assert isinstance(reason, Reason) and reason.field is not None, reason
        name = reason.field.removeprefix("training.")
        assert name in (training_fields if reason.field.startswith("training.") else plan_fields), reason.field
        seen.add(reason.field)
    assert len(seen) >= 20, seen  # the sweep meets most of the reasons, not a handful


def test_a_reason_is_a_str_and_keeps_its_field_through_pickle():
    r = Reason("tp=3 does not divide num_attention_heads=64", field="tp")
    assert isinstance(r, str) and r == "tp=3 does not divide num_attention_heads=64" and r.field == "tp"
    assert "; ".join([r, "x"]) == f"{r}; x" and r.startswith("tp=3") and hash(r) == hash(str(r))
    assert Reason("no field").field is None
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(r, protocol=proto))
        assert type(back) is Reason and back == r and back.field == "tp"
    assert copy.deepcopy(r).field == copy.copy(r).field == "tp"
    _, reasons = config_reasons(problem_of(P640, {}), Plan(tp=8, cp=3))
    assert [(x.field, str(x)) for x in pickle.loads(pickle.dumps(reasons))] == [(x.field, str(x)) for x in reasons]


def _reasons_in_a_worker(tp: int, cp: int) -> list[Reason]:
    return config_reasons(load_problem(P640), Plan(tp=tp, cp=cp))[1]


def test_reasons_cross_a_process_boundary_with_their_fields():
    """As in `batch`: a spawned worker's reasons come back as Reasons with their fields."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as ex:
        reasons = ex.submit(_reasons_in_a_worker, 8, 3).result(timeout=120)
    assert [type(r) for r in reasons] == [Reason, Reason] and [r.field for r in reasons] == ["cp", "cp"]

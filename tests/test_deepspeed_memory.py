"""DeepSpeed's memory as BigScience measured it: BF16_Optimizer's gradients and the OOM boundary of
BLOOM's logbook (tr11-176B-ml/chronicles-prequel.md, Megatron-DeepSpeed on Jean Zay's A100 80GB)."""

import pytest

from autoshard import cost
from autoshard.frameworks import get_framework


def _bloom(hidden, layers, heads, tp, pp, dp, mbs, gbs=2048, precision="fp16 (inferred)"):
    from autoshard.validate import completed_plan
    from autoshard.validate.ablations import config_row
    from autoshard.validate.modern import modern_row_to_case

    from validation_facts import logbook_group

    group = logbook_group({"name": "BLOOM-candidate", "hidden": hidden, "layers": layers, "heads": heads},
                          tp * pp * dp, gbs, precision)
    row, _ = config_row(group, {"tp": tp, "pp": pp, "dp": dp, "zero_stage": 1, "micro_batch": mbs}, 0)
    row["step_time_s"] = 100.0
    case = modern_row_to_case(row)
    return case, cost.evaluate(case.problem, completed_plan(case))


def test_bf16_optimizer_keeps_bf16_and_fp32_gradients():
    # DeepSpeed's pipeline engine clears the bf16 gradients before each backward and folds them into
    # the fp32 ones after it without clearing them: 2 + 4 bytes per parameter, reduced in fp32
    fw = get_framework("deepspeed", "fp32")
    assert (fw.grad_bytes, fw.grad_reduce_bytes) == (6.0, 4.0)
    assert get_framework("deepspeed").grad_bytes == 2.0


def test_bloom_bf16_runs_hold_the_logbooks_four_extra_bytes_per_parameter():
    # "The additional memory usage is 4bytes x params and it's not sharded across gpus" (02-28)
    fp16_case, fp16 = _bloom(14336, 70, 64, 4, 12, 8, 2)
    bf16_case, bf16 = _bloom(14336, 70, 64, 4, 12, 8, 2, precision="bf16")
    assert bf16_case.problem.training.main_grads == "fp32" and fp16_case.problem.training.main_grads is None
    params = fp16.memory_breakdown_gib["weights"] / 2  # GiB of parameters (2 bytes each)
    assert bf16.memory_breakdown_gib["gradients"] - fp16.memory_breakdown_gib["gradients"] == pytest.approx(4 * params)
    # nvidia-smi read 59 GB on that line (02-28): 1.36x the priced peak, the fp16 lines' 1.15-1.45
    assert 59 / bf16.peak_memory_gib == pytest.approx(1.3, abs=0.15)


@pytest.mark.parametrize("line,fits", [
    ((14336, 72, 64, 2, 6, 32, 2), False),  # 02-25: OOM
    ((14336, 72, 64, 2, 6, 32, 1), False),  # 02-25: OOM
    ((12288, 100, 64, 4, 6, 16, 2, 2048, "bf16"), False),  # 02-28: OOM
    ((12288, 100, 64, 4, 6, 16, 1, 2048, "bf16"), False),  # 02-28: OOM
    ((12288, 106, 96, 4, 12, 8, 4, 2048, "bf16"), True),  # 02-28: ran at 79 GB
    ((14336, 72, 64, 8, 2, 24, 2, 2016), True),  # 02-25: ran at 76 GB
    ((13824, 78, 96, 4, 6, 16, 4), True),  # 02-27: ran at 75 GB
])
def test_bloom_logbooks_oom_boundary(line, fits):
    _, est = _bloom(*line)
    assert est.fits is fits
    if not fits:
        assert "allocator overhead" in est.reasons[0]


def test_allocator_overhead_divides_the_capacity_for_deepspeed_only():
    from autoshard.loader import load_problem

    base = {"name": "cap", "model": "llama3-8b", "training": {"seq_len": 4096, "global_batch_size": 64},
            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8}}
    ds = cost.context(load_problem({**base, "framework": "deepspeed"}))
    mg = cost.context(load_problem({**base, "framework": "megatron"}))
    assert ds.capacity_bytes * 1.2 == pytest.approx(mg.capacity_bytes)
    assert mg.capacity_bytes == pytest.approx(ds.gpu.hbm_bytes - cost.RESERVE_GIB * cost.GIB)


def test_reports_say_why_deepspeeds_usable_memory_is_smaller():
    from autoshard.loader import load_problem
    from autoshard.render import estimate_text

    problem = load_problem({"name": "cap", "model": "llama3-8b", "framework": "deepspeed",
                            "training": {"seq_len": 4096, "global_batch_size": 64},
                            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8}})
    text = estimate_text(problem, cost.evaluate(problem, {"tp": 1, "pp": 1, "zero_stage": 1, "micro_batch_size": 1,
                                                         "recompute": "full"}))
    assert "/ 65.0 GiB usable (deepspeed's 1.2x allocator overhead)" in text


def test_bf16_optimizer_folds_every_micro_batchs_gradients_at_18_bytes_per_parameter():
    # update_hp_grads after each backward: hp_grad.add_(lp.grad.to(float32)) over every parameter
    fw = get_framework("deepspeed", "fp32")
    assert fw.grad_accum_bytes_per_param == 18.0 and get_framework("deepspeed").grad_accum_bytes_per_param == 0.0
    fp16_case, fp16 = _bloom(12288, 106, 64, 4, 12, 8, 2)
    bf16_case, bf16 = _bloom(12288, 106, 64, 4, 12, 8, 2, precision="bf16")
    ctx = cost.context(bf16_case.problem)
    stage = max(bf16.stages, key=lambda s: s.backward_s)
    twin = fp16.stages[stage.rank]
    params = twin.memory_gib["weights"] * cost.GIB / 2  # that stage's parameters (2 bytes each)
    assert stage.backward_s - twin.backward_s == pytest.approx(18 * params / ctx.hbm_bytes_per_s, rel=0.05)
    # BLOOM's logbook, the same 106-layer model and layout on 02-27 (fp16) and 02-28 (BF16_Optimizer):
    # 110.96 -> 116.54 s (64 heads)
    assert bf16.step_time_s / fp16.step_time_s == pytest.approx(116.54 / 110.96, abs=0.015)

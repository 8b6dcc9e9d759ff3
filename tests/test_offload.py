"""CPU optimizer offload in the search (issue 34): planned where the framework runs it and nothing
fits without it, suggested by the infeasibility message as the smallest fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autoshard import Plan, evaluate, load_problem, solve
from autoshard.errors import InfeasibleError, InputError
from autoshard.frameworks import get_framework

# The seeds' buying guide (003): Llama 3 70B on one 8 x H100 node fits only with the optimizer offloaded.
P70_8 = {"model": "llama3-70b", "training": {"seq_len": 4096, "global_batch_size": 64},
         "cluster": {"gpu": "h100-sxm", "num_gpus": 8}}


def _p(**extra):
    return load_problem({**P70_8, **extra})


def test_offload_profiles():
    # Megatron-Core's HybridDeviceOptimizer runs on the distributed optimizer; DeepSpeed's ZeRO-Offload
    # with ZeRO 1-3; torchtitan has no optimizer-only offload.
    assert get_framework("megatron").optimizer_offload_zero_stages == (1,)
    assert get_framework("deepspeed").optimizer_offload_zero_stages == (1, 2, 3)
    assert get_framework("torchtitan").optimizer_offload_zero_stages == ()
    est = evaluate(_p(), Plan(tp=8, zero_stage=0, optimizer_offload=True))
    assert not est.fits and any("offloads the optimizer to the CPU only with ZeRO stage 1" in r for r in est.reasons)


def test_solve_finds_the_offload_plan_for_70b_on_8_h100():
    # 70B x 16 B (bf16 weights, fp32 grads, fp32 master + 2 moments) = 1.1 TB > 8 x 80 GB: no plan fits
    # with the optimizer on the GPUs; with its 12 B per parameter in host memory, one does.
    sol = solve(_p(), time_limit_s=60)
    plan, est = sol.plan, sol.estimate
    assert plan.optimizer_offload and est.fits and plan.zero_stage == 1
    assert "optimizer-offload" in plan.short()
    assert est.stages[0].memory_gib["optimizer_states"] == 0.0 and est.time_breakdown_s["optimizer"] > 0
    # The same plan with the optimizer on the GPUs does not fit: the offload is what makes it fit.
    on_gpu = evaluate(_p(), plan.model_copy(update={"optimizer_offload": False}))
    assert not on_gpu.fits and on_gpu.peak_memory_gib > est.memory_capacity_gib
    # Nothing fits without it: the plain search is infeasible.
    with pytest.raises(InfeasibleError):
        solve(_p(search={"optimizer_offload": False}), time_limit_s=60)


def test_infeasible_without_offload_names_offload_as_the_fix():
    with pytest.raises(InfeasibleError) as exc:
        solve(_p(search={"optimizer_offload": False}), time_limit_s=60)
    fix = exc.value.suggestions[0]
    assert fix.startswith("CPU optimizer offload") and "Megatron --optimizer-cpu-offload" in fix
    assert "search: {optimizer_offload: true}" in fix
    # The plan it names fits with the offload, at the memory it says.
    text = fix.split("): ", 1)[1].split(" then needs ")[0]
    fields = dict(tok.split("=", 1) for tok in text.split() if "=" in tok)
    plan = Plan(tp=int(text.split()[0][2:]), zero_stage=1, recompute=fields["recompute"], optimizer_offload=True)
    est = evaluate(_p(), plan)
    assert est.fits and f"then needs {est.peak_memory_gib:.1f} GiB" in fix


def test_a_framework_without_offload_is_pointed_to_one_that_has_it():
    with pytest.raises(InfeasibleError) as exc:
        solve(_p(framework="torchtitan"), time_limit_s=60)
    assert any(s.startswith("CPU optimizer offload") and "framework: megatron, which has it" in s
               for s in exc.value.suggestions)
    with pytest.raises(InputError, match="torchtitan has no CPU optimizer offload"):
        solve(_p(framework="torchtitan", search={"optimizer_offload": True}), time_limit_s=5)


def test_cli_exit_codes(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("model: llama3-70b\ntraining: {seq_len: 4096, global_batch_size: 64}\n"
                 "cluster: {gpu: h100-sxm, num_gpus: 8}\nsearch: {optimizer_offload: false}\n")
    r = subprocess.run([sys.executable, "-m", "autoshard.cli", "solve", str(f), "--quiet", "--time-limit", "60"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "to fix: CPU optimizer offload" in r.stderr and "Traceback" not in r.stderr

"""JAX remat as the JAX launchers run it: the `mlp_up` recompute module (the MLP's fc1 and activation
re-run, fc2 not), MaxText's custom remat policy and HSDP mesh in the export, and the dev-runs
converter reading a row's recompute modules and framework."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.cost import Config, context, layer_table, with_modes
from autoshard.errors import InputError
from autoshard.export import export_plan
from autoshard.validate import Case, Skip, run_to_case


def _llama8b(framework: str = "megatron", gpus: int = 1):
    return load_problem({"model": "llama3-8b", "framework": framework,
                         "training": {"seq_len": 4096, "global_batch_size": 8},
                         "cluster": {"gpu": "h100", "num_gpus": gpus}})


def _dense_layer(problem, plan: Plan, mode: str):
    ctx = with_modes(context(problem), mode)
    table = layer_table(ctx, Config.of(plan, problem.cluster.num_gpus))
    return table.layers[("dense", mode)], table.layers[("dense", "none")]


def test_mlp_up_reruns_fc1_and_drops_the_mlp_activations():
    # Llama 3 8B on one GPU, micro-batch 1 of 4096 tokens: hidden 4096, SwiGLU width 14336.
    p = _llama8b()
    plan = Plan(recompute="mlp_up")
    up, none = _dense_layer(p, plan, "mlp_up")
    T, h, ffn = 4096, 4096, 14336
    # Re-run FLOPs: the gate and up projections, 2 x T x h x 2 ffn = 962,072,674,304 (hand-worked); fc2 not.
    assert up.hfu_flops - none.hfu_flops == pytest.approx(962_072_674_304)
    assert 2 * T * h * 2 * ffn == 962_072_674_304
    # Dropped: the two bf16 fc1 outputs and fc2's bf16 input, 6 B x T x ffn = 352,321,536 B per layer.
    assert none.act_bytes - up.act_bytes == pytest.approx(352_321_536)
    # Megatron's `mlp` re-runs fc2 as well: more time for the same activations dropped.
    mlp, _ = _dense_layer(p, Plan(recompute="mlp"), "mlp")
    assert mlp.act_bytes == pytest.approx(up.act_bytes)
    assert mlp.hfu_flops - up.hfu_flops == pytest.approx(2 * T * ffn * h)  # fc2's GEMM
    assert 0 < up.bwd["recompute"] < mlp.bwd["recompute"]


def test_megatron_export_refuses_mlp_up():
    p = _llama8b()
    with pytest.raises(InputError, match="mlp_up"):
        export_plan(p, Plan(recompute="mlp_up"), "megatron")


def test_maxtext_export_writes_the_dgx_cloud_custom_policy_and_hsdp_mesh():
    # NVIDIA/dgxc-benchmarking v24.11.1 maxtext/configure.sh (Llama 2 70B, BF16, 64 nodes): remat_policy
    # custom with query/key/value/qkv/out_proj and mlpwo on 'device', the rest (context, mlpwi_0/1) at
    # base.yml's 'remat'; ici_fsdp 8, dcn_fsdp 16, dcn_data 64 / 16 = 4.
    p = load_problem({"model": "llama2-70b", "framework": "maxtext",
                      "training": {"seq_len": 4096, "global_batch_size": 1024},
                      "cluster": {"gpu": "h100", "num_gpus": 512}})
    plan = Plan(zero_stage=3, schedule="gpipe", micro_batch_size=2, dp_replicate=4,
                recompute="core_attn+mlp_up+layernorm")
    e = evaluate(p, plan)
    assert e.fits, e.reasons
    cfg = dict(line.split(": ", 1) for line in export_plan(p, plan, "maxtext").text.splitlines()
               if ": " in line and not line.startswith("#"))
    assert cfg["remat_policy"] == '"custom"'
    keys = Path(__file__).parent / "launchers" / "data" / "maxtext_base_keys.txt"  # MaxText's base.yml keys
    assert set(cfg) <= {k.strip() for k in keys.read_text().splitlines() if k.strip() and not k.startswith("#")}
    want = {"context": "remat", "mlpwi_0": "remat", "mlpwi_1": "remat", "mlpwo": "device",
            "query_proj": "device", "key_proj": "device", "value_proj": "device", "qkv_proj": "device",
            "out_proj": "device", "decoder_layer_input": "device"}
    assert {k: cfg[k].strip('"') for k in want} == want
    mesh = {k: int(cfg[k]) for k in ("ici_fsdp_parallelism", "dcn_fsdp_parallelism", "dcn_data_parallelism",
                                    "ici_data_parallelism")}
    assert mesh == {"ici_fsdp_parallelism": 8, "dcn_fsdp_parallelism": 16, "dcn_data_parallelism": 4,
                    "ici_data_parallelism": 1}
    # The plain JAX export cannot shard over groups: it says so.
    assert any("dp_replicate 4" in w for w in export_plan(p, plan, "jax").warnings)


def _maxtext_row(**extra):
    row = {"id": "r", "source": "test", "model": "Llama 2 70B", "layers": 80, "hidden": 8192, "ffn": 28672,
           "heads": 64, "kv_heads": 8, "vocab": 32000, "seq_len": 4096, "gpu": "H100 80GB HBM3",
           "gpu_count": 512, "precision": "BF16", "dp": 512, "fsdp": True, "micro_batch": 2,
           "global_batch_seqs": 1024, "step_time_s": 7.091, "topology": "dgx-h100-400g"}
    return {**row, **extra}


def test_dev_row_states_recompute_modules_and_framework():
    case = run_to_case(_maxtext_row(activation_recompute="selective: core_attn, mlp_up, layernorm",
                                    framework="maxtext", dp_replicate=4))
    assert isinstance(case, Case)
    assert case.problem.framework == "maxtext" and case.recompute_published
    assert case.plan.recompute == "core_attn+mlp_up+layernorm"
    assert (case.plan.schedule, case.plan.dp_replicate, case.plan.zero_stage) == ("gpipe", 4, 3)
    # Without the fields: the Megatron profile, 1f1b, the recompute left to the solver.
    plain = run_to_case(_maxtext_row())
    assert isinstance(plain, Case)
    assert (plain.problem.framework, plain.plan.schedule, plain.recompute_published) == ("megatron", "1f1b", False)
    bad = run_to_case(_maxtext_row(activation_recompute="selective: core_attn, everything"))
    assert isinstance(bad, Skip) and "has no mapping" in bad.reason

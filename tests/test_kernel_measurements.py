"""The cost model's kernel rates against the GPU measurements recorded in
autoshard/data/kernel_measurements.json (benchmarks/measure_kernels.py on lent H100 and H200 machines;
benchmarks/bench_kernels.py prints the whole comparison). No GPU is needed here."""

import json
import math
import statistics
import sys
from importlib import resources
from pathlib import Path

import pytest

from autoshard.catalog import get_gpu
from autoshard.cost import attention_head_dim_factor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_kernels  # noqa: E402

DOC = json.loads(resources.files("autoshard.data").joinpath("kernel_measurements.json").read_text(encoding="utf-8"))
MACHINES = {d["machine"]["gpu"]: d for d in DOC["machines"]}


def test_measurements_say_where_and_when_they_were_taken():
    assert "measure_kernels.py" in DOC["source"]
    assert set(MACHINES) == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    for doc in MACHINES.values():
        assert doc["date"] == "2026-11-26" and doc["machine"]["torch"].startswith("2.11")
        assert doc["machine"]["sm_count"] == 132
        assert len(doc["gemm"]) == 89 and len(doc["attention"]) == 18 and len(doc["grouped_gemm"]) == 18
        assert all(r["bf16_tflops"] > 0 and r["fp8_tensorwise_tflops"] > 0 for r in doc["gemm"])
    # A second run of each kind, on a fresh machine: the spread the comparisons below live with.
    for doc in DOC["repeats"]:
        assert bench_kernels.repeat_spread(MACHINES[doc["machine"]["gpu"]], doc) < 0.04


@pytest.mark.parametrize("name,catalog", [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200-sxm")])
def test_catalog_hbm_rate_matches_a_measured_copy(name, catalog):
    # The catalog's achievable HBM rate (datasheet x efficiency.hbm) against a 1 GiB device copy.
    gpu = get_gpu(catalog)
    measured = MACHINES[name]["copy_bytes_per_s"]
    assert measured / (gpu.hbm_tb_per_s * 1e12 * gpu.efficiency.hbm) == pytest.approx(1.0, abs=0.10)


@pytest.mark.parametrize("name,catalog", [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200-sxm")])
def test_head_dim_factor_matches_measured_cudnn_attention(name, catalog):
    # Causal cuDNN attention at head dim 64 (64 heads) against 128 (32 heads), the same tokens: the
    # exponential-unit model's 0.75 on Hopper.
    for seq in (4096, 8192):
        measured = bench_kernels.attention_ratio(MACHINES[name], "cudnn", seq)
        assert measured == pytest.approx(attention_head_dim_factor(64, get_gpu(catalog)), abs=0.04)


@pytest.mark.parametrize("name,catalog", [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200-sxm")])
def test_shape_model_on_the_layer_gemms_of_dense_models(name, catalog):
    # Llama 3 8B / 70B layer GEMMs at TP 1-8 (K >= 2048, M >= 4096) and the 8192 square: the shape
    # model's efficiency, relative to the large shapes', within a median 6% of the measured.
    gpu = get_gpu(catalog)
    for key in ("bf16_tflops", "fp8_tensorwise_tflops"):
        rows = [r for r in bench_kernels.gemm_rows(MACHINES[name], gpu, key) if bench_kernels.dense_layer(r)]
        logs = [abs(math.log(r["model_rel"] / r["measured_rel"])) for r in rows]
        assert len(rows) >= 50
        assert statistics.median(logs) < 0.06, key



@pytest.mark.parametrize("name,catalog", [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200-sxm")])
def test_grouped_expert_gemms_at_training_token_counts(name, catalog):
    # One grouped launch for a layer's local experts (Qwen3-30B at EP8, DeepSeek-V3 at EP32, gpt-oss at
    # EP16) with 2,048 tokens per expert: the shape model (groups share the waves) within a median 10%.
    rows = [r for r in bench_kernels.grouped_rows(MACHINES[name], get_gpu(catalog)) if r["m"] >= 2048]
    assert len(rows) == 6
    assert statistics.median(abs(math.log(r["model_rel"] / r["measured_rel"])) for r in rows) < 0.10


@pytest.mark.parametrize("backend,framework", [("cudnn", "megatron"), ("flash", "torchtitan")])
def test_attention_backward_rate_is_the_measured_one(backend, framework):
    # Backward TFLOP/s over forward TFLOP/s (FlashAttention's 2.5x FLOP count) of every recorded shape:
    # cuDNN's fused attention (Transformer Engine, Megatron) and SDPA's FlashAttention-2 (torchtitan).
    from autoshard.frameworks import get_framework

    ratios = [r["bwd_tflops"] / r["fwd_tflops"] for doc in MACHINES.values() for r in doc["attention"]
              if r["backend"] == backend]
    assert len(ratios) == 18
    assert get_framework(framework).attention_backward_rate == pytest.approx(statistics.median(ratios), abs=0.01)
    assert max(ratios) < 1.1  # no backend runs its backward faster than its forward by more than noise


H100_RECIPE_RUNS = [r for r in DOC["fp8_recipes"]["runs"] if r["machine"]["gpu"] == "NVIDIA H100 80GB HBM3"]


@pytest.mark.parametrize("scaling,recipe", [("rowwise", "fp8-rowwise"), ("blockwise", "fp8-blockwise")])
def test_scaled_gemm_factors_are_the_measured_ones(scaling, recipe):
    # Row-wise (torchao) and 1x128 / 128x128 block-wise (DeepSeek-V3, TE Float8BlockScaling) scaled FP8
    # GEMMs against the per-tensor-scaled GEMM of the same run: the recipe's gemm_efficiency_factor is
    # the H100 median over the dense layer GEMMs of two runs, and H200's lies within 5% of it.
    from autoshard.catalog import get_recipe

    assert len(H100_RECIPE_RUNS) == 2
    factor = get_recipe(recipe).gemm_efficiency_factor
    h100 = [x for run in H100_RECIPE_RUNS for x in bench_kernels.recipe_ratios(run, scaling)]
    assert len(h100) == 2 * 57
    assert factor == pytest.approx(statistics.median(h100), abs=0.01)
    for run in DOC["fp8_recipes"]["runs"]:
        assert statistics.median(bench_kernels.recipe_ratios(run, scaling)) == pytest.approx(factor, abs=0.05)


def test_torchao_quantization_bytes_are_the_measured_ones():
    # Whole linear layers (forward + backward) in torchao's FP8 under torch.compile on H100: the casts'
    # HBM bytes per element of X, W and dY, as priced for torchtitan (tensorwise, current scaling) and by
    # the row-wise recipe, and both above Transformer Engine's fused cast-transpose count.
    from autoshard.catalog import quant_overhead_bytes_per_element
    from autoshard.frameworks import get_framework

    gpu = get_gpu("h100-sxm")
    rows = bench_kernels.linear_rows(DOC["fp8_linear"], gpu)
    assert len(rows) == 4
    tensorwise = statistics.median(r["tensorwise_bytes"] for r in rows)
    rowwise = statistics.median(r["rowwise_bytes"] for r in rows)
    assert dict(get_framework("torchtitan").quant_hbm_bytes_per_element)["fp8-current"] == pytest.approx(tensorwise, abs=0.1)
    assert quant_overhead_bytes_per_element("fp8-rowwise", gpu) == pytest.approx(rowwise, abs=0.1)
    assert quant_overhead_bytes_per_element("fp8-current", gpu) < tensorwise < rowwise


def test_rowwise_costs_what_it_measures_over_tensorwise_per_linear_layer():
    # The priced time of a linear layer's forward + backward in torchao row-wise over tensorwise (GEMM
    # factor and quantization bytes together) against the measured ratio of the same four layers.
    rows = bench_kernels.linear_rows(DOC["fp8_linear"], get_gpu("h100-sxm"))
    measured = statistics.median(r["measured_speedup"]["tensorwise"] / r["measured_speedup"]["rowwise"] for r in rows)
    priced = statistics.median(r["model_speedup"]["tensorwise"] / r["model_speedup"]["rowwise"] for r in rows)
    assert 1.05 < measured < 1.2
    assert priced == pytest.approx(measured, abs=0.04)


def test_attention_rate_by_call_size_is_the_measured_one():
    # cuDNN attention kernel times (no host time) of 36 calls on H100, 4-64 heads x 1k-32k tokens: the
    # fixed time per call and the causal tail (cost.attention_call_s) price them within a median 7%,
    # where one flat rate is off by 10-15% and by up to 9x on the smallest calls.
    rows = bench_kernels.attention_grid_rows(DOC["attention_grid"], get_gpu("h100-sxm"))
    assert len(rows) == 36
    for d, bound in (("fwd", 0.06), ("bwd", 0.075)):
        model = statistics.median(abs(math.log(r[f"model_{d}_s"] / r[f"{d}_kernel_s"])) for r in rows)
        flat = statistics.median(abs(math.log(r[f"flat_{d}_s"] / r[f"{d}_kernel_s"])) for r in rows)
        assert model < bound < flat, d
    # The order that decides TP and CP degrees: fewer heads or a shorter sequence per GPU run slower.
    rel = {(r["heads"], r["seq"]): r["flat_fwd_s"] / r["model_fwd_s"] for r in rows if r["causal"]}
    assert rel[(8, 8192)] < rel[(32, 8192)] < rel[(64, 8192)]
    assert rel[(32, 2048)] < rel[(32, 4096)] < rel[(32, 8192)]


def test_blocking_launch_cost_per_layer_is_the_measured_one():
    # CUDA_LAUNCH_BLOCKING=1 (BLOOM's runs) costs one Megatron-DeepSpeed layer per micro-batch a host
    # time that does not grow with the micro-batch or shrink with TP: measured on H100 at BLOOM's shapes,
    # against the constant fitted on the logbook.
    from autoshard.cost.constants import BLOCKING_LAYER_HOST_S

    costs = [r["blocking_cost_ms"] / 1e3 for r in DOC["launch_blocking"]["layers"]]
    assert len(costs) == 6
    assert max(costs) / min(costs) < 1.4  # per layer and micro-batch, whatever the shapes
    assert BLOCKING_LAYER_HOST_S == pytest.approx(statistics.median(costs), rel=0.15)

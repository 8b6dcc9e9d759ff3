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

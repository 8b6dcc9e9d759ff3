"""`autoshard rooflines` pinned to seed 001's worked numbers (REFERENCE §5)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.catalog import get_gpu, get_model
from autoshard.rooflines import rooflines
from autoshard.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
DENSE_16K = ModelSpec(name="f16k", num_hidden_layers=2, hidden_size=4096, intermediate_size=16384,
                      num_attention_heads=32, vocab_size=32000)


def by_level(r):
    return {lv["level"]: lv for lv in r["levels"]}


def test_h100_superpod_dp_fsdp_tp_match_seed_001():
    r = rooflines(DENSE_16K, get_gpu("h100-sxm"), "dgx-h100-superpod")
    lv = by_level(r)
    # DP with SHARP: 989e12 / (2 x 450e9) = 1,098 in a node; 989e12 / (2 x 400e9) = 1,236 at SU or spine.
    assert math.floor(lv["nvlink"]["dp_tokens_per_gpu"]) == 1098
    assert math.floor(lv["leaf"]["dp_tokens_per_gpu"]) == 1236
    assert math.floor(lv["spine"]["dp_tokens_per_gpu"]) == 1236
    assert lv["leaf"]["allreduce_bandwidth_gb_per_s"] == pytest.approx(400)  # REF §3's AllReduce bandwidth
    # FSDP: twice DP, 2,472 tokens per GPU; >= 5M tokens on 2,048 GPUs.
    assert math.floor(lv["leaf"]["fsdp_tokens_per_gpu"]) == 2472
    assert 2048 * lv["leaf"]["fsdp_tokens_per_gpu"] >= 5e6
    # TP inside a node: Y < F / (C (N-1) / (N W)) = F / 1,923 (001 prints F / 1,746 with C = 898e12).
    assert round(lv["nvlink"]["tp_bound_divisor"]) == 1923
    assert round(lv["nvlink"]["tp_bound_divisor"] * 898 / 989) == 1746
    assert 8 <= lv["nvlink"]["tp_max_degree"] < 9  # F = 16k: about 8-9 way, i.e. one node


def test_deepseek_like_moe_with_64_way_ep_needs_4944_tokens_per_gpu():
    # E C / (2 k W_AR): 1,236 x 256 / 8 / 8 = 4,944 (4,945 unrounded); 10M tokens on 2,048 GPUs,
    # 20M counting FSDP's factor 2.
    r = rooflines(get_model("deepseek-v3"), get_gpu("h100-sxm"), "dgx-h100-superpod", num_gpus=2048)
    ep = {e["ep"]: e for e in r["expert_parallel"]}[64]
    assert ep["tokens_per_gpu"] == pytest.approx(4944, abs=1.5)
    assert ep["expert_allreduce_bandwidth_gb_per_s"] == pytest.approx(3200)  # 8x the leaf's 400 GB/s
    assert ep["tokens_per_step"] == pytest.approx(10e6, rel=0.02)
    assert ep["tokens_per_step_with_fsdp"] == pytest.approx(20e6, rel=0.02)
    # 8-way EP stays inside a node: no gain at the leaf (E/k x the DP number).
    ep8 = {e["ep"]: e for e in r["expert_parallel"]}[8]
    assert ep8["tokens_per_gpu"] == pytest.approx(1236.25 * 256 / 8, rel=1e-6)


def test_nvlink5_halves_the_dp_roofline():
    # REF §5: B200/NVL72 "roughly doubles every roofline": the DP bound 1,098 -> 549 (Hopper's C on
    # NVLink5's 900 GB/s). With Blackwell's own C the bound is 2,500e12 / (2 x 900e9) = 1,388.
    r = rooflines(DENSE_16K, get_gpu("h100-sxm"), "gb200-nvl72")
    assert math.floor(by_level(r)["nvlink"]["dp_tokens_per_gpu"]) == 549
    r = rooflines(DENSE_16K, get_gpu("gb200"), "gb200-nvl72")
    assert math.floor(by_level(r)["nvlink"]["dp_tokens_per_gpu"]) == 1388


def test_without_in_network_reduction_dp_needs_about_twice_the_tokens():
    # A100 SuperPOD has no SHARP in the catalog: the ring all-reduce moves 2 (N-1)/N B.
    r = rooflines(DENSE_16K, get_gpu("a100"), "dgx-a100-superpod")
    lv = by_level(r)["nvlink"]
    assert lv["dp_tokens_per_gpu"] == pytest.approx(312e12 * 2 * 7 / 8 / (2 * 300e9))


def test_achievable_uses_catalog_efficiencies():
    peak = by_level(rooflines(DENSE_16K, get_gpu("h100"), None))["leaf"]["dp_tokens_per_gpu"]
    ach = by_level(rooflines(DENSE_16K, get_gpu("h100"), None, achievable=True))["leaf"]["dp_tokens_per_gpu"]
    assert ach != peak and ach > 0


def test_cli_json_and_bad_input():
    proc = subprocess.run([sys.executable, "-m", "autoshard.cli", "rooflines", "deepseek-v3", "--gpu", "h100",
                           "--topology", "dgx-h100-superpod", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert math.floor(doc["levels"][0]["dp_tokens_per_gpu"]) == 1098
    for argv in (["rooflines", "deepseek-v3", "--gpu", "h1000"], ["rooflines", "nosuchmodel", "--gpu", "h100"],
                 ["rooflines", "llama3-8b", "--gpu", "a100", "--precision", "fp8"]):
        proc = subprocess.run([sys.executable, "-m", "autoshard.cli", *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_problem_file_gives_model_gpu_topology_and_size():
    # DeepSeek-V3 on 2,048 H800 in fp8: C = 1,979e12; H800's NVLink (200 GB/s egress) binds the DP
    # all-reduce everywhere (8 x 50 GB/s = 400 at the leaf): 1,979e12 / (2 x 200e9) = 4,947.
    proc = subprocess.run([sys.executable, "-m", "autoshard.cli", "rooflines", "problems/deepseek-v3-2048xh800.yaml",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["gpu"], doc["topology"], doc["precision"], doc["num_gpus"]) == ("h800-sxm", "h800-cluster", "fp8", 2048)
    assert math.floor(doc["levels"][-1]["dp_tokens_per_gpu"]) == 4947
    proc = subprocess.run([sys.executable, "-m", "autoshard.cli", "rooflines", "llama3-8b"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--gpu" in proc.stderr

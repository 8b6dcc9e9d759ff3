"""`autoshard serve-memory`: weights + KV cache (GQA / MLA) + activations, GPUs to hold and to serve."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoshard.catalog import get_gpu, get_model
from autoshard.errors import InputError
from autoshard.serving import kv_values_per_token_layer, serve_memory

ROOT = Path(__file__).resolve().parents[1]


def test_100t_parameters_need_about_1000_b200_just_to_hold():
    # seed002: 100T parameters x 2 B = "182 TB" (it is 182 TiB: 200e12 B) -> ~1,000 B200 (180 GB usable)
    # or ~700 B300 (288 GB); ~125 B200 nodes or ~86 B300 nodes of 8.
    r = serve_memory(get_gpu("b200"), params=100e12)
    assert r["weights_bytes"] == 200e12 and r["weights_bytes"] / 2**40 == pytest.approx(181.9, abs=0.1)
    assert 1000 <= r["min_gpus_to_hold_weights"] <= 1100
    assert r["min_nodes_to_hold_weights"] == pytest.approx(125, rel=0.06)
    r = serve_memory(get_gpu("b300"), params=100e12)
    assert 650 <= r["min_gpus_to_hold_weights"] <= 750
    assert r["min_nodes_to_hold_weights"] == pytest.approx(86, rel=0.03)
    # Holding is the floor of serving.
    assert r["min_gpus_to_serve"] >= r["min_gpus_to_hold_weights"]


def test_kv_cache_gqa_and_mla_per_token():
    # Llama 3 70B (80 layers, 8 KV heads of 128): 2 x 8 x 128 x 80 x 2 B = 320 KiB per token in bf16.
    m = get_model("llama3-70b")
    r = serve_memory(get_gpu("h100"), model=m, batch=1, context=1)
    assert r["kv_cache_bytes"] == 327_680
    # DeepSeek-V3 MLA caches the 512-wide latent and the 64-wide RoPE key: (512 + 64) x 61 x 2 B,
    # 57x less than the 128 full heads of 128 + 128 it stands for (DeepSeek-V2 §2.1.2).
    d = get_model("deepseek-v3")
    assert kv_values_per_token_layer(d) == 576
    r = serve_memory(get_gpu("h200"), model=d, batch=1, context=1)
    assert r["kv_cache_bytes"] == 576 * 61 * 2
    assert 2 * 128 * 128 / 576 == pytest.approx(56.9, abs=0.1)
    # fp8 KV halves it.
    r8 = serve_memory(get_gpu("h200"), model=d, batch=1, context=1, kv_precision="fp8")
    assert r8["kv_cache_bytes"] == r["kv_cache_bytes"] / 2


def test_serving_layouts():
    # Llama 3 8B in bf16 (16 GB) with a short batch serves on one 80 GB GPU; 70B needs at least 2 to hold.
    r = serve_memory(get_gpu("h100"), model=get_model("llama3-8b"), batch=8, context=8192)
    assert r["min_gpus_to_serve"] == 1
    r = serve_memory(get_gpu("h100"), model=get_model("llama3-70b"), batch=32, context=8192)
    assert r["min_gpus_to_hold_weights"] == 2 and r["min_gpus_to_serve"] == 4
    assert r["serve_layout"]["per_gpu_gib"] <= 0.9 * get_gpu("h100").hbm_usable_gib
    # nvfp4 weights take 0.5625 B/param: 3.6x less than bf16.
    b = serve_memory(get_gpu("b200"), model=get_model("llama3-70b"), precision="nvfp4")
    w = serve_memory(get_gpu("b200"), model=get_model("llama3-70b"))
    assert w["weights_bytes"] / b["weights_bytes"] == pytest.approx(2 / 0.5625)


def test_bad_input():
    with pytest.raises(InputError):
        serve_memory(get_gpu("a100"), model=get_model("llama3-8b"), precision="fp8")  # no fp8 on A100
    with pytest.raises(InputError):
        serve_memory(get_gpu("h100"), model=get_model("llama3-8b"), batch=0)
    for argv in (["serve-memory", "--gpu", "b200"], ["serve-memory", "llama3-8b", "--params", "1e9", "--gpu", "b200"],
                 ["serve-memory", "--params", "-5", "--gpu", "b200"], ["serve-memory", "--params", "x", "--gpu", "b200"]):
        proc = subprocess.run([sys.executable, "-m", "autoshard.cli", *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, argv


def test_cli_json():
    proc = subprocess.run([sys.executable, "-m", "autoshard.cli", "serve-memory", "--params", "100e12", "--gpu", "b200",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 1000 <= json.loads(proc.stdout)["min_gpus_to_hold_weights"] <= 1100


def test_problem_file_gives_model_and_gpu():
    proc = subprocess.run([sys.executable, "-m", "autoshard.cli", "serve-memory", "problems/llama3-70b-640xh100.yaml",
                           "--batch", "32", "--context", "8192", "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["model"], doc["gpu"]) == ("llama3-70b", "h100-sxm")
    assert doc["kv_cache_bytes"] == 32 * 8192 * 327_680

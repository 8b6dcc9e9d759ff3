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


# ---- disaggregated prefill / decode (issue 34) ---------------------------------------------------------
# Hand-worked for Llama 3 70B on H100 SXM (989 TFLOP/s bf16 x its published achievable-GEMM fraction 0.803
# (MAMF 794.5 / 989) x the Ampere/Hopper end-to-end factor 0.779 (data/matmul.yaml); 3.35 TB/s HBM
# x 0.85; dgx-h100-superpod leaf 50 GB/s per GPU x scale-out efficiency 0.85), 10 requests/s of 2,048
# prompt + 256 output tokens. Llama 3 70B: L 80, d 8192, 64 heads and 8 KV heads of 128, FFN 28,672,
# vocab 128,256, 70,553,706,496 parameters.
L70, D70, V70 = 80, 8192, 128256
MATMUL_NO_HEAD = 80 * (8192 * 128 * (2 * 64 + 2 * 8) + 3 * 8192 * 28672)  # 68,451,041,280
KV_TOKEN = 80 * 2 * 8 * 128 * 2  # 327,680 B per token in bf16


def _disagg(**kw):
    from autoshard.serving import disaggregated

    args = dict(request_rate=10.0, prompt_tokens=2048, output_tokens=256)
    return disaggregated(get_gpu("h100"), get_model("llama3-70b"), **{**args, **kw})


def test_disaggregated_prefill_pool_by_hand():
    d = _disagg()
    p = d["prefill"]
    assert MATMUL_NO_HEAD == 68_451_041_280
    # every prompt token through every matmul weight but the LM head; the LM head for the last position
    assert p["matmul_flops_per_request"] == 2 * MATMUL_NO_HEAD * 2048 + 2 * V70 * D70 == 280_377_566_429_184
    # causal attention, forward: L x heads x (128 + 128) x P^2
    assert p["attention_flops_per_request"] == 80 * 64 * 256 * 2048**2 == 5_497_558_138_880
    rate = 989e12 * 0.803 * 0.779
    gpu_s = (280_377_566_429_184 + 5_497_558_138_880) / rate  # 0.4621 GPU-s per prompt
    assert p["gpu_seconds_per_request"] == pytest.approx(gpu_s, rel=1e-12)
    # 141 GB of bf16 weights need 2 H100 per instance; 10 x 0.4621 = 4.62 GPUs busy -> 3 instances, 6 GPUs
    assert p["instance_gpus"] == 2 and p["gpus_exact"] == pytest.approx(10 * gpu_s)
    assert (p["instances"], p["gpus"]) == (3, 6)
    assert p["seconds_per_prompt"] == pytest.approx(gpu_s / 2)


def test_disaggregated_decode_pool_by_hand():
    dc = _disagg()["decode"]
    weights = 70_553_706_496 * 2
    act = 2 * (2 * 8192 + 8192 + 2 * 8 * 128 + 2 * 28672) + 4 * V70  # one decode token's working set + logits
    bw4 = 3.35e12 * 0.85 * 4
    # TP4: 4 x 90% of 79.65 GiB less the weights and working set, over 2,304-token sequences' KV
    room = 4 * 0.9 * 79.65 * 2**30 - weights - act
    batch = int(room // (KV_TOKEN * 2304))
    assert batch == 220
    step = (weights + batch * KV_TOKEN * (2048 + 128)) / bw4  # KV at the mean length P + O/2
    assert step == pytest.approx(0.02616, abs=1e-5)
    # 220 / 26.2 ms = 8,409 tokens/s per instance >= 10 x 256 = 2,560 needed: one TP4 instance. TP2 holds
    # only 16 sequences (597 tokens/s, 5 instances = 10 GPUs), TP8 one instance of 8: TP4 is the fewest.
    assert (dc["tp"], dc["instance_gpus"], dc["instances"], dc["gpus"]) == (4, 4, 1, 4)
    assert dc["batch"] == batch and dc["step_s"] == pytest.approx(step, rel=1e-12)
    assert dc["tokens_per_s_per_instance"] == pytest.approx(batch / step) and dc["tokens_per_s_needed"] == 2560
    tp2 = next(o for o in dc["instance_options"] if o["tp"] == 2)
    assert tp2["batch"] == 16 and tp2["gpus"] == 10


def test_tpot_target_caps_the_decode_batch():
    # 20 ms per output token on TP4: (0.020 x bw - weights) / (KV per token x 2,176) = 121 sequences
    dc = _disagg(tpot_ms=20.0)["decode"]
    bw4 = 3.35e12 * 0.85 * 4
    assert dc["tp"] == 4 and dc["batch"] == int((0.020 * bw4 - 70_553_706_496 * 2) // (KV_TOKEN * 2176)) == 121
    assert dc["step_s"] <= 0.020 and dc["meets_tpot"]
    # 5 ms is below even the weights' read time (141 GB / 11.4 TB/s = 12.4 ms on TP4, 6.2 ms on TP8)
    assert not _disagg(tpot_ms=5.0)["decode"]["meets_tpot"]


def test_kv_transfer_by_hand():
    k = _disagg()["kv_transfer"]
    assert k["bytes_per_request"] == 2048 * KV_TOKEN == 671_088_640  # 640 MiB
    # over the prefill instance's 2 GPUs' leaf NICs at 50 GB/s x 0.85
    assert k["seconds_per_request"] == pytest.approx(671_088_640 / (2 * 42.5e9))  # 7.9 ms
    assert k["bytes_per_s_total"] == pytest.approx(10 * 671_088_640)
    assert k["link_utilization"] == pytest.approx(10 * 671_088_640 / (6 * 42.5e9))


def test_disaggregated_cli():
    base = [sys.executable, "-m", "autoshard.cli", "serve-memory", "llama3-70b", "--gpu", "h100",
            "--request-rate", "10", "--prompt-tokens", "2048", "--output-tokens", "256"]
    out = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split()[:2] == ["pool", "GPUs"])
    rows = {line.split()[0]: line.split() for line in lines[first:first + 4]}  # the pools' table (rich)
    assert rows["pool"] == ["pool", "GPUs", "instances", "each", "instance", "load"]
    assert rows["prefill"][:7] == ["prefill", "6", "3", "TP", "2", "x", "PP"] and rows["prefill"][7] == "1"
    assert rows["decode"][:8] == ["decode", "4", "1", "TP", "4", "x", "PP", "1"] and rows["total"] == ["total", "10"]
    assert "KV transfer: 640.0 MiB per request, 7.9 ms" in out
    doc = json.loads(subprocess.run(base + ["--json"], capture_output=True, text=True, check=True).stdout)
    assert doc["disaggregated"]["total_gpus"] == 10
    bad = subprocess.run(base[:7] + ["--output-tokens", "256"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--request-rate" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    bad = subprocess.run(base[:7] + ["--request-rate", "-1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--request-rate" in bad.stderr

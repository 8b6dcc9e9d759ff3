"""The training FLOP budget (issue 34): model FLOPs per token x tokens under the named convention
(6 N + causal attention), the plain 6 N T beside it, and hardware FLOPs with recompute; checked
against hand-worked numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.cost import FLOP_CONVENTION

# Llama 3 70B (config.json): L 80, d 8192, 64 heads, 8 KV heads of 128, FFN 28,672 (SwiGLU), vocab 128,256.
# Matmul weights a token passes through: per layer attention 8192 x 128 x (2 x 64 + 2 x 8) = 150,994,944
# and MLP 3 x 8192 x 28,672 = 704,643,072; x 80 = 68,451,041,280; + LM head 128,256 x 8192 = 1,050,673,152.
N_70B = 69_501_714_432
# Causal attention per token at s = 4096: 3 x L x heads x s x (d_qk + d_v) = 3 x 80 x 64 x 4096 x 256.
ATTN_70B_4K = 16_106_127_360


def _problem(tokens=None, **training):
    t = {"seq_len": 4096, "global_batch_size": 960, **training}
    if tokens is not None:
        t["tokens"] = tokens
    return load_problem({"model": "llama3-70b", "training": t, "cluster": {"gpu": "h100-sxm", "num_gpus": 640}})


def test_llama3_70b_per_token_and_total():
    est = evaluate(_problem(15e12), Plan(tp=8, pp=4))
    b = est.flop_budget
    assert b.matmul_params == N_70B
    assert b.weight_flops_per_token == 6 * N_70B == 417_010_286_592  # seed 004: "6 x 70e9 = 420 GFLOP per token"
    assert b.attention_flops_per_token == ATTN_70B_4K
    assert b.model_flops_per_token == 6 * N_70B + ATTN_70B_4K
    assert b.convention == FLOP_CONVENTION and "6 N + attention" in b.convention and "causal" in b.convention
    # 15T tokens: 6 N T = 6.255e24; with attention 6.497e24. Steps: 15e12 / (4096 x 960) rounded up.
    assert b.tokens == 15e12 and b.steps == 3_814_698
    assert b.weight_flops == pytest.approx(6 * N_70B * 15e12, rel=1e-12)
    assert b.model_flops == pytest.approx((6 * N_70B + ATTN_70B_4K) * 15e12, rel=1e-12)
    # MFU is the same convention per step: model FLOPs per step / (step time x peak of 640 GPUs).
    assert b.model_flops_per_step == pytest.approx(b.model_flops_per_token * 4096 * 960, rel=1e-12)
    assert est.mfu == pytest.approx(b.model_flops_per_step / (est.step_time_s * 640 * 989e12), rel=1e-3)
    # No recompute: hardware FLOPs are the model FLOPs; compute days are steps x step time.
    assert b.recompute_factor == pytest.approx(1.0) and b.hardware_flops == pytest.approx(b.model_flops)
    assert b.compute_days == pytest.approx(3_814_698 * est.step_time_s / 86400)
    assert b.gpu_hours == pytest.approx(3_814_698 * est.step_time_s * 640 / 3600)


def test_full_recompute_adds_a_forward():
    # Full recompute re-runs every layer's forward in the backward: 1 extra forward on 3 (fwd 1 + bwd 2)
    # for the layers; the LM head is not recomputed, so a little under 4/3.
    b = evaluate(_problem(15e12), Plan(tp=8, pp=4, recompute="full")).flop_budget
    assert 1.30 < b.recompute_factor < 4 / 3
    assert b.hardware_flops == pytest.approx(b.recompute_factor * b.model_flops)
    est = evaluate(_problem(15e12), Plan(tp=8, pp=4, recompute="full"))
    assert est.hfu / est.mfu == pytest.approx(b.recompute_factor)


def test_without_tokens_only_per_token_figures():
    b = evaluate(_problem(), Plan(tp=8, pp=4)).flop_budget
    assert b.model_flops_per_token == 6 * N_70B + ATTN_70B_4K
    assert b.tokens is None and b.model_flops is None and b.steps is None and b.hardware_flops is None


def test_lora_counts_four_n():
    b = evaluate(_problem(1e9, finetune="lora"), Plan(tp=8, pp=4)).flop_budget
    assert b.flops_per_param_per_token == 4 and b.weight_flops_per_token == 4 * b.matmul_params


def test_seeds_dense_100t_model_on_29t_tokens():
    """Seed 002: 'a dense 100T-parameter model on ~29T tokens needs 1.2e29 FLOP'. 6 N T gives 1.74e28,
    about 7x less; the attention term cannot make up the gap at any realistic sequence length (it would
    have to be ~6x the weight term). Hand-worked model: d 65,536, 512 heads of 128 (MHA), GELU MLP 4d,
    1,940 layers, vocab 65,536: N = 1,940 x 12 d^2 + V d = 99,991,133,618,176."""
    model = {"num_hidden_layers": 1940, "hidden_size": 65536, "intermediate_size": 262144,
             "num_attention_heads": 512, "num_key_value_heads": 512, "vocab_size": 65536, "hidden_act": "gelu"}
    p = load_problem({"model": model, "training": {"seq_len": 4096, "global_batch_size": 4096, "tokens": 29e12},
                      "cluster": {"gpu": "b200", "num_gpus": 16384}})
    b = evaluate(p, Plan(tp=8, pp=64, zero_stage=1)).flop_budget  # fits or not, the budget is the same
    n = 1940 * 12 * 65536**2 + 65536 * 65536
    assert n == 99_991_133_618_176 and b.matmul_params == n
    assert b.weight_flops == pytest.approx(6 * n * 29e12, rel=1e-12)
    assert round(b.weight_flops / 1e28, 2) == 1.74
    # Attention at 4k: 6 L s d = 6 x 1940 x 4096 x 65536 = 3.12e12 per token, 0.5% of 6 N.
    assert b.attention_flops_per_token == 6 * 1940 * 4096 * 65536
    assert 1.74e28 < b.model_flops < 1.75e28
    assert 6.8 < 1.2e29 / b.model_flops < 7.0  # the document's figure, ~7x ours


def test_cli_prints_the_budget_and_json_carries_it(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("model: llama3-70b\ntraining: {seq_len: 4096, global_batch_size: 960, tokens: 15e12}\n"
                 "cluster: {gpu: h100-sxm, num_gpus: 640}\n")
    run = [sys.executable, "-m", "autoshard.cli", "evaluate", str(f), "--plan", "tp=8,pp=4"]
    text = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert "FLOP budget (6 N + causal attention per token" in text
    assert "model 4.33e+11 FLOP/token (6N 4.17e+11 + attention 1.61e+10" in text
    assert "over 1.5e+13 tokens: model 6.5e+24 FLOP (6 N T alone 6.26e+24)" in text and "3,814,698 steps" in text
    doc = json.loads(subprocess.run(run + ["--json"], capture_output=True, text=True, check=True).stdout)
    fb = (doc.get("estimate") or doc)["flop_budget"]
    assert fb["weight_flops_per_token"] == 6 * N_70B and fb["steps"] == 3_814_698


def test_bad_token_budget_is_one_line(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("model: llama3-70b\ntraining: {seq_len: 4096, global_batch_size: 960, tokens: -5}\n"
                 "cluster: {gpu: h100-sxm, num_gpus: 640}\n")
    r = subprocess.run([sys.executable, "-m", "autoshard.cli", "evaluate", str(f), "--plan", "tp=8"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "training.tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1

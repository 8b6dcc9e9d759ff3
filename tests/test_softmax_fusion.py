"""Materialized attention's softmax: where Megatron's fused kernel runs and what its PyTorch fallback
costs, checked against the kernel's own launch arithmetic and BLOOM's measured logbook lines."""

import pytest

from autoshard import cost
from autoshard.cost import Config, Shapes, softmax_batches_per_block, unfused_softmax_reason

# get_batch_per_block of megatron/fused_kernels/scaled_masked_softmax.h, worked by hand for rows of n:
# next power of two p (log2_ceil), warp = min(p, 32) threads, 128 / warp warps per block, 2 rows per
# warp while p <= 128. n = 2048 keys: p 2048, 4 warps x 1 row = 4.
BATCHES_PER_BLOCK = {2048: 4, 4096: 4, 256: 4, 128: 8, 64: 8, 32: 8, 28: 8, 26: 8, 16: 16, 14: 16, 12: 16,
                     8: 32, 4: 64, 2: 128, 1: 256}


@pytest.mark.parametrize("n,expect", sorted(BATCHES_PER_BLOCK.items()))
def test_batches_per_block_follow_the_kernels_launch_arithmetic(n, expect):
    assert softmax_batches_per_block(n) == expect


def _problem(rule: str, heads: int = 64, hidden: int = 13312, seq: int = 2048, flash: bool = False) -> dict:
    return {"name": "softmax-check",
            "model": {"name": "bloom-like", "num_hidden_layers": 12, "hidden_size": hidden,
                      "intermediate_size": 4 * hidden, "num_attention_heads": heads, "num_key_value_heads": heads,
                      "vocab_size": 250880, "hidden_act": "gelu", "dropout": True},
            "training": {"seq_len": seq, "global_batch_size": 256, "precision": "fp16",
                         "flash_attention": flash, "softmax_fusion": rule},
            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 8}}


def _cfg(tp: int, mbs: int) -> Config:
    return Config(tp=tp, cp=1, ep=1, pp=1, dp=8 // tp, vpp=1, sp=False, zero=1, mbs=mbs, schedule="1f1b",
                  placement="tp-cp-ep-dp-pp")


def _reason(rule: str, heads: int, tp: int, mbs: int, seq: int = 2048, flash: bool = False) -> str | None:
    from autoshard.loader import load_problem

    ctx = cost.context(load_problem(_problem(rule, heads, hidden=128 * heads, seq=seq, flash=flash)))
    return unfused_softmax_reason(ctx, Shapes(ctx, _cfg(tp, mbs)))


@pytest.mark.parametrize("heads,tp,mbs,fused", [
    # bigscience-workshop/Megatron-DeepSpeed, Feb 2022: rows per block from the heads per GPU
    (64, 8, 1, False), (64, 8, 2, False), (64, 8, 4, True), (64, 8, 8, True),  # 8 per GPU: 32 rows
    (96, 8, 2, False), (96, 8, 4, True),  # 12 per GPU: 16 rows
    (112, 8, 4, False), (112, 4, 2, True),  # 14 per GPU: 56 is not a multiple of 16; 28 x 2 = 56 of 8
    (104, 4, 2, False),  # 26 x 2 = 52, not a multiple of 8
    (64, 4, 1, True), (64, 4, 2, True), (128, 4, 2, True),  # 16 and 32 per GPU
    (32, 8, 8, False),  # 4 per GPU: 64 rows per block
])
def test_bigscience_2022_check_refuses_the_shapes_blooms_logbook_found_slow(heads, tp, mbs, fused):
    why = _reason("bigscience-2022", heads, tp, mbs)
    assert (why is None) == fused
    if not fused:
        assert f"= {heads // tp * mbs}," in why and "heads per GPU" in why


@pytest.mark.parametrize("heads,tp,mbs", [(64, 8, 2), (96, 8, 2), (112, 8, 4), (104, 4, 2), (32, 8, 8)])
def test_megatrons_own_check_fuses_every_multiple_of_four(heads, tp, mbs):
    # NVIDIA's check (fixed 2021-08-13) asks heads per GPU x micro-batch to be a multiple of 4 only
    assert _reason("megatron", heads, tp, mbs) is None


def test_the_fallback_also_covers_long_keys_off_and_never_flash():
    assert "4096" in _reason("megatron", 64, 8, 1, seq=8192)
    assert "2048" in _reason("bigscience-2022", 64, 8, 4, seq=4096)
    assert "off" in _reason("off", 64, 8, 4)
    assert _reason("off", 64, 8, 4, flash=True) is None  # FlashAttention has no separate softmax


def test_unfused_softmax_prices_its_bytes_and_keeps_fp32_probabilities():
    from autoshard.loader import load_problem

    ctx = cost.context(load_problem(_problem("bigscience-2022")))
    sh = Shapes(ctx, _cfg(8, 2))
    scores = 2 * 2048 * 2048 * 8  # micro-batch x queries x keys x heads per GPU
    f, b = cost.unfused_softmax_s(ctx, sh)
    assert f == pytest.approx(cost.UNFUSED_SOFTMAX_FWD_BYTES * scores / ctx.hbm_bytes_per_s)
    assert b == pytest.approx(cost.UNFUSED_SOFTMAX_BWD_BYTES * scores / ctx.hbm_bytes_per_s)
    assert cost.unfused_softmax_s(ctx, Shapes(ctx, _cfg(8, 4))) == (0.0, 0.0)
    # Activations kept without recompute: the fp32 softmax output beside the fp16 probabilities
    # (7 B per score with dropout against the fused kernel's 5)
    from autoshard.cost.layers import _activation_bytes

    ctx_ok = cost.context(load_problem(_problem("megatron")))
    cfg = _cfg(8, 2)
    slow = _activation_bytes(ctx, cfg, Shapes(ctx, cfg), "dense")["none"]
    fast = _activation_bytes(ctx_ok, cfg, Shapes(ctx_ok, cfg), "dense")["none"]
    assert slow - fast == pytest.approx(2 * scores)


def _bloom_step(hidden, layers, heads, tp, pp, mbs):
    from autoshard.validate import completed_plan
    from autoshard.validate.ablations import config_row
    from autoshard.validate.modern import modern_row_to_case

    from validation_facts import logbook_group

    group = logbook_group({"name": "BLOOM-candidate", "hidden": hidden, "layers": layers, "heads": heads}, 384)
    row, _ = config_row(group, {"tp": tp, "pp": pp, "dp": 384 // (tp * pp), "zero_stage": 1, "micro_batch": mbs}, 0)
    row["step_time_s"] = 100.0
    case = modern_row_to_case(row)
    assert case.problem.training.softmax_fusion == "bigscience-2022"
    return cost.evaluate(case.problem, completed_plan(case))


@pytest.mark.parametrize("a,b,measured,tol", [
    # (faster, slower, measured slower / faster), BLOOM's logbook (chronicles-prequel.md), 384 A100s
    ((13312, 84, 64, 8, 6, 4), (13312, 84, 64, 8, 6, 2), 135.55 / 122.93, 0.02),  # 02-23: micro-batch 4 vs 2
    ((14336, 72, 64, 8, 6, 4), (14336, 72, 112, 8, 6, 4), 138.72 / 120.18, 0.02),  # 02-23: 64 vs 112 heads
    ((13312, 82, 64, 4, 12, 2), (13312, 82, 104, 4, 12, 2), 123.71 / 104.45, 0.02),  # 02-28: 64 vs 104 heads
    ((14336, 70, 64, 4, 12, 2), (14336, 70, 112, 4, 12, 2), 104.50 / 102.03, 0.02),  # 02-28: both fused
    # 02-26, the pair the model used to predict equal: TP 4 / PP 12 at micro-batch 4 against TP 8 /
    # PP 6 at micro-batch 2 (the softmax explains about half of the 14.5%)
    ((13312, 84, 64, 4, 12, 4), (13312, 84, 64, 8, 6, 2), 129.61 / 113.21, 0.08),
])
def test_bloom_logbook_steps_the_softmax_check_explains(a, b, measured, tol):
    # Nothing here is fitted: the fallback's bytes come from the PyTorch ops it runs.
    fast, slow = _bloom_step(*a), _bloom_step(*b)
    ratio = slow.step_time_s / fast.step_time_s
    assert ratio == pytest.approx(measured, abs=tol)
    assert ratio > 1.02 or measured < 1.03
    unfused = [w for w in slow.warnings if "softmax runs unfused" in w]
    assert bool(unfused) == (measured > 1.05)


@pytest.mark.parametrize("cp_comm,fused", [("p2p", True), ("a2a", False), ("allgather", True)])
def test_context_parallel_calls_are_checked_at_their_own_shape(cp_comm, fused):
    # 112 heads at TP2 and CP2, micro-batch 1, Feb 2022's check: the p2p ring calls 56 heads on
    # 1,024-key chunks (56 rows, a multiple of 8), Ulysses' all-to-all 28 heads on all 2,048 keys (28:
    # not), all-gather 56 heads' 1,024 queries on 2,048 keys
    from autoshard.loader import load_problem

    ctx = cost.context(load_problem(_problem("bigscience-2022", 112, hidden=112 * 128)))
    cfg = Config(tp=2, cp=2, ep=1, pp=1, dp=2, vpp=1, sp=False, zero=1, mbs=1, schedule="1f1b",
                 placement="tp-cp-ep-dp-pp", cp_comm=cp_comm)
    why = unfused_softmax_reason(ctx, Shapes(ctx, cfg))
    assert (why is None) == fused
    if not fused:
        assert "28 x 1 = 28" in why


def test_feb20_groups_take_the_head_count_of_the_logbooks_probes():
    # The Feb-20 tables give no NHEADS; 32 (the Feb-17 probes') runs every micro-batch up to 8
    # unfused under that month's check, as the sweeps show: 187B on 320 A100s (tp8 pp10 dp4),
    # measured 151.07 s at micro-batch 2 and 147.43 s at 4 (a step of 2.5%, where 8-16 heads per
    # GPU would have put micro-batch 2 on the fallback and 4 on the kernel)
    from autoshard.validate import completed_plan
    from autoshard.validate.ablations import config_row
    from autoshard.validate.modern import modern_row_to_case

    import json

    from validation_facts import ABLATIONS

    # the project's copy of the 02-20 187B group, whose `filled` states the heads and where they come from
    (group,) = [g for g in json.loads(ABLATIONS.read_text()) if g["id"] == "bloom-0220-187b-320gpu-mbs"]
    steps = {}
    for mbs in (2, 4):
        row, notes = config_row(group, {"tp": 8, "pp": 10, "dp": 4, "zero_stage": 1, "micro_batch": mbs}, 0)
        assert row["heads"] == 32 and any("Feb-17" in n for n in notes)
        row["step_time_s"] = 100.0
        case = modern_row_to_case(row)
        est = cost.evaluate(case.problem, completed_plan(case))
        assert any("softmax runs unfused" in w for w in est.warnings)
        steps[mbs] = est.step_time_s
    assert steps[2] / steps[4] == pytest.approx(151.07 / 147.43, abs=0.02)


def test_exports_warn_where_the_plan_leaves_the_softmax_unfused():
    from autoshard import Plan
    from autoshard.export import export_plan
    from autoshard.loader import load_problem

    doc = _problem("bigscience-2022")
    doc["cluster"]["num_gpus"] = 16
    problem = load_problem(doc)
    slow = export_plan(problem, Plan(tp=8, pp=2, micro_batch_size=2, recompute="full"), "megatron")
    fast = export_plan(problem, Plan(tp=8, pp=2, micro_batch_size=4, recompute="full"), "megatron")
    assert any("softmax runs unfused" in w and "8 x 2 = 16" in w for w in slow.warnings)
    assert not any("softmax" in w for w in fast.warnings)

"""Context parallelism's p2p ring as each framework runs it: the merge and gradient-accumulation HBM
traffic between the per-step attention calls and the bytes of the K/V gradients it sends back
(FrameworkProfile.cp_ring_hbm_bytes / cp_grad_exchange_bytes)."""

import dataclasses

import pytest

from autoshard import Plan, load_problem
from autoshard.cost import BF16, Config, Shapes, context, cp_comm_s, layer_table
from autoshard.cost.constants import COMM_INTERFERENCE
from autoshard.cost.kernels import cp_ring_merge_s
from autoshard.frameworks import _ring_bytes
from autoshard.topology import all_gather_s, contiguous_profile


def _llama8b(framework: str, seq: int = 262144, gpus: int = 8):
    # torchtitan's Table 2 shape (benchmarks/llama3_h100_202412_torchtitan.md): Llama 3.1 8B, 8 GPUs, CP 8
    return load_problem({"model": "llama3-8b", "framework": framework,
                         "training": {"seq_len": seq, "global_batch_size": 1},
                         "cluster": {"gpu": "h100", "num_gpus": gpus}})


def _cfg(cp: int, comm: str = "p2p") -> Config:
    return Config.of(Plan(tp=1, cp=cp, pp=1, zero_stage=3, recompute="full", cp_comm_type=comm), 8 // cp)


def test_pytorch_ring_merges_by_its_eager_ops():
    # Hand count from torch/distributed/tensor/experimental/_attention.py for Llama 3 8B at 262,144
    # tokens over cp 8: 32,768 tokens per GPU x 32 query heads x 128 = 134,217,728 output elements,
    # a quarter as many of K (8 K/V heads). Forward: 7 later steps at 32.5 B per
    # output element (fp32 cast 6 + three fp32 elementwise ops 32 = 38 on steps i <= rank; half of that
    # plus a torch.cat of the whole output, 27, on the others) and 8 B per K element (K and V packed
    # by torch.cat), once 12 (first cast 6, final cast 6) and 8 (contiguous K, V).
    # Backward: 7 x 11.5 + 20 per output element, 7 x 47 + 64 per K element.
    ctx = context(_llama8b("torchtitan"))
    sh = Shapes(ctx, _cfg(8))
    e = 32768 * 32 * 128
    assert sh.tokens * sh.a_local * sh.d_v == e
    fwd, bwd = cp_ring_merge_s(ctx, sh, 8)
    assert fwd == pytest.approx(e * ((7 * 32.5 + 12) + (7 * 8 + 8) / 4) / ctx.hbm_bytes_per_s)
    assert bwd == pytest.approx(e * ((7 * 11.5 + 20) + (7 * 47 + 64) / 4) / ctx.hbm_bytes_per_s)
    # One step has nothing to merge; a profile that states no bytes prices none.
    assert cp_ring_merge_s(ctx, sh, 1) == (0.0, 0.0)
    mctx = context(_llama8b("megatron"))
    assert cp_ring_merge_s(mctx, Shapes(mctx, _cfg(8)), 8) == (0.0, 0.0)


def test_merges_land_in_the_attention_layer():
    # The same layer with the profile's bytes struck out differs by exactly the merges: forward
    # (which full recompute re-runs) and backward.
    p = _llama8b("torchtitan")
    with_bytes, without = context(p), context(p)
    without.__dict__["framework"] = dataclasses.replace(without.framework, cp_ring_hbm_bytes=())
    fwd, bwd = cp_ring_merge_s(with_bytes, Shapes(with_bytes, _cfg(8)), 8)
    a = layer_table(with_bytes, _cfg(8)).layers[("dense", "full")]
    b = layer_table(without, _cfg(8)).layers[("dense", "full")]
    assert fwd > 0 and a.fwd["compute"] - b.fwd["compute"] == pytest.approx(fwd)
    assert a.bwd["compute"] - b.bwd["compute"] == pytest.approx(bwd)
    # The all-gather form runs one attention call over all keys: nothing to merge.
    ag = _cfg(8, "allgather")
    assert layer_table(with_bytes, ag).layers[("dense", "full")].fwd["compute"] == pytest.approx(
        layer_table(without, ag).layers[("dense", "full")].fwd["compute"])


def test_ring_passes_fp32_gradients_where_the_framework_does():
    # PyTorch's ring backward (torchtitan) sends dK/dV accumulated in fp32 (convert_to_f32, twice the
    # K/V's bytes) by all-to-all once a step, cp sends of a chunk where the all-gather of K/V moves
    # cp - 1: with nothing to hide under, the backward is K/V + dK/dV + one more dK/dV chunk, 1 + 2 +
    # 2/7 rings at cp 8. Megatron / TE pass K/V and bf16 gradients chunk by chunk: twice.
    for fw, heads, factor in (("torchtitan", 8, 3 + 2 / 7), ("megatron", 8, 2.0)):
        ctx = context(_llama8b(fw))
        sh = Shapes(ctx, _cfg(8))
        prof = contiguous_profile(ctx.graph, 8)
        ring = all_gather_s(ctx.levels, prof, 8 * BF16 * sh.tokens * heads * (sh.d_qk + sh.d_v))
        fwd, bwd = cp_comm_s(ctx, 8, prof, sh, core_s=0.0)
        assert fwd == pytest.approx(ring) and bwd == pytest.approx(factor * ring)


def test_allgather_rotation_hides_only_under_the_first_step():
    # torchtitan's default context_parallel_rotate_method "allgather" (PyTorch _AllGatherRotater): the
    # gather is issued with step 0 and awaited at step 1, so it hides under 1/cp of the layer's
    # attention; Transformer Engine's ring passes a chunk under every step. With attention worth 4
    # rings, cp 8: the gather has half a ring to hide under (half exposed), TE's ring all of it.
    for fw, exposed in (("torchtitan", 0.5), ("megatron", 0.0)):
        ctx = context(_llama8b(fw))
        sh = Shapes(ctx, _cfg(8))
        prof = contiguous_profile(ctx.graph, 8)
        ring = all_gather_s(ctx.levels, prof, 8 * BF16 * sh.tokens * 8 * (sh.d_qk + sh.d_v))
        fwd, _ = cp_comm_s(ctx, 8, prof, sh, core_s=4 * ring)
        assert fwd == pytest.approx(exposed * ring + COMM_INTERFERENCE * (ring - exposed * ring))


def test_profile_ring_bytes_reject_unknown_keys():
    assert dict(_ring_bytes("x", {"fwd_q_step": 1, "bwd_kv_call": 2.5})) == {"fwd_q_step": 1.0, "bwd_kv_call": 2.5}
    with pytest.raises(ValueError, match="cp_ring_hbm_bytes"):
        _ring_bytes("x", {"fwd_out": 1})

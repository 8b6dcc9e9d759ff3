"""Measure end-to-end training steps and peak memory of small models on one GPU.

Runs torchtitan's own model code (``torchtitan.models.llama3`` and ``torchtitan.models.deepseek_v3``,
torchtitan 0.2.2) the way torchtitan's ``parallelize_llama`` / ``parallelize_deepseekv3`` wrap it:
FSDP2 ``fully_shard`` per transformer block and at the root with
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (here over a one-rank mesh, so the
collectives are no-ops but the parameter, gradient and optimizer buffers are the ones a sharded run
keeps per GPU), torchtitan's ``apply_ac`` for activation checkpointing (``none`` / ``full`` /
``selective`` op-level), AdamW (fused, fp32 states), torchtitan's ``cross_entropy_loss`` (fp32 logits),
random token batches.

For each configuration it records the median step time over the timed steps (CUDA synchronised,
``time.perf_counter``), ``torch.cuda.max_memory_allocated`` over the timed steps (peak memory stats
reset after the warm-up steps, so the optimizer states exist), the memory allocated between steps
(parameters, gradients freed, optimizer states) and the parameter count.

It was run on GPU machines lent to the project; its outputs are shipped in ``validation/measured/``
(``steps_torchtitan*.json``, ``sweep_torchtitan*.json``, ``compiled_torchtitan.json``), turned into runs by
``benchmarks/measured_steps_to_runs.py`` (``validation/measured_steps.json``) and compared with the
cost model by ``tests/test_measured_steps.py`` and ``tests/test_measured_data.py``. Nothing in autoshard
depends on running it.

    python benchmarks/measure_steps.py --out steps.json            # on a GPU
    python benchmarks/measure_steps.py --smoke --device cpu        # logic check without a GPU
"""
from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from torchtitan.components.loss import cross_entropy_loss
from torchtitan.config.job_config import ActivationCheckpoint, Compile
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.models.deepseek_v3.infra.parallelize import _op_sac_save_list as DEEPSEEK_SAC_SAVE_LIST
from torchtitan.models.deepseek_v3.model.args import DeepSeekV3ModelArgs
from torchtitan.models.deepseek_v3.model.model import DeepSeekV3Model
from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list as LLAMA_SAC_SAVE_LIST
from torchtitan.models.llama3.infra.parallelize import apply_compile
from torchtitan.models.llama3.model.model import Transformer
from torchtitan.models.moe import MoEArgs

from measure_common import GIB, run_grid, time_steps


# name -> (family, model kwargs). Llama shapes follow Llama 3.2 1B / 3B (hidden, layers, heads, kv heads,
# FFN width, vocab) and a 512-wide model whose step is dominated by fixed per-kernel costs; the MoE shape
# is DeepSeek-V2-Lite's (torchtitan's "16B" flavour) cut to 4 layers so fp32 Adam fits one GPU.
MODELS = {
    "llama-0.1b": ("llama", dict(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, vocab_size=32000,
                                 multiple_of=256, ffn_dim_multiplier=None, rope_theta=500000)),
    "llama-1b": ("llama", dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
                               multiple_of=256, ffn_dim_multiplier=1.5, rope_theta=500000)),
    "llama-3b": ("llama", dict(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, vocab_size=128256,
                               multiple_of=256, ffn_dim_multiplier=1.0, rope_theta=500000)),
    "moe-dsv2lite-4l": ("deepseek", dict(vocab_size=102400, dim=2048, inter_dim=10944, moe_inter_dim=1408,
                                         n_layers=4, n_dense_layers=1, n_heads=16, q_lora_rank=0,
                                         kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                         v_head_dim=128, mscale=0.707)),
}

# (model, seq_len, micro_batch, ac_mode)
GRID = [
    ("llama-0.1b", 2048, 1, "none"),
    ("llama-0.1b", 2048, 4, "none"),
    ("llama-0.1b", 8192, 1, "none"),
    ("llama-1b", 2048, 1, "none"),
    ("llama-1b", 4096, 1, "none"),
    ("llama-1b", 8192, 1, "none"),
    ("llama-1b", 4096, 2, "none"),
    ("llama-1b", 4096, 4, "none"),
    ("llama-1b", 8192, 1, "full"),
    ("llama-1b", 8192, 1, "selective"),
    ("llama-1b", 8192, 4, "full"),
    ("llama-3b", 4096, 1, "none"),
    ("llama-3b", 4096, 1, "full"),
    ("llama-3b", 4096, 1, "selective"),
    ("llama-3b", 8192, 1, "full"),
    ("llama-3b", 8192, 2, "full"),
    ("moe-dsv2lite-4l", 4096, 1, "none"),
    ("moe-dsv2lite-4l", 4096, 1, "full"),
    ("moe-dsv2lite-4l", 8192, 1, "full"),
    ("moe-dsv2lite-4l", 4096, 2, "none"),
]
# Layer sweeps at few tokens (step time = host time) and at 4k tokens (memory per layer): the slope over
# layers is the per-layer host time and saved-activation bytes, the intercept the embedding/loss part.
# "llama-1b-Lk" is llama-1b with k layers; fsdp False runs the same model without fully_shard (bf16
# parameters, fp32 AdamW states), separating FSDP2's per-block hooks from the layer's own launches.
SWEEP = [(f"llama-1b-L{k}", seq, 1, ac, fsdp) for k in (2, 4, 8, 16) for seq, ac, fsdp in
         ((256, "none", True), (256, "none", False), (4096, "none", True), (4096, "full", True))]
# torch.compile per block (torchtitan's apply_compile, between AC and FSDP as parallelize_llama orders
# them) and of the loss: the host time per layer and the memory of a compiled step
COMPILE_GRID = [("llama-1b-L4", 256, 1, "none", True), ("llama-1b-L16", 256, 1, "none", True),
                ("llama-1b-L16", 4096, 1, "none", True), ("llama-1b-L16", 4096, 1, "full", True),
                ("llama-1b-L16", 8192, 1, "none", True), ("llama-1b-L16", 4096, 4, "none", True)]
SMOKE_GRID = [("tiny-llama", 128, 2, "none"), ("tiny-llama", 128, 2, "full"), ("tiny-moe", 128, 1, "selective")]
SMOKE_MODELS = {
    "tiny-llama": ("llama", dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=32)),
    "tiny-moe": ("deepseek", dict(vocab_size=256, dim=64, inter_dim=128, moe_inter_dim=32, n_layers=2,
                                  n_dense_layers=1, n_heads=4, q_lora_rank=0, kv_lora_rank=32,
                                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)),
}


def build_model(family: str, kwargs: dict, seq_len: int) -> torch.nn.Module:
    """The model on the meta device, built from torchtitan's own classes."""
    if family == "llama":
        args = TransformerModelArgs(max_seq_len=seq_len, **kwargs)
        with torch.device("meta"):
            return Transformer(args)
    moe = MoEArgs(num_experts=64, num_shared_experts=2, top_k=6, score_func="softmax", route_norm=False,
                  score_before_experts=False, _debug_force_load_balance=True)
    if kwargs["dim"] < 256:  # smoke test: few experts, no grouped GEMM on a CPU
        moe = MoEArgs(num_experts=4, num_shared_experts=1, top_k=2, _debug_force_load_balance=True,
                      use_grouped_mm=False)
    args = DeepSeekV3ModelArgs(max_seq_len=seq_len, moe_args=moe, **kwargs)
    args.moe_impl = "standard"  # set by update_from_config in torchtitan's trainer (no expert parallelism)
    with torch.device("meta"):
        return DeepSeekV3Model(args)


def parallelize(model: torch.nn.Module, mesh, ac_mode: str, fsdp: bool = True, compile_: bool = False,
                family: str = "llama") -> None:
    """torchtitan's order: activation checkpointing per block, compile per block, then fully_shard per
    block and root. Per-op selective checkpointing gets the model's own save list, as torchtitan's
    parallelize_llama / parallelize_deepseekv3 pass it (torchtitan 0.2.2 apply_ac defaults it to an empty
    set: every op re-run, what full checkpointing does; the measurements of 2026-11-27 ran so, see
    docs/measurements.md)."""
    if ac_mode != "none":
        save_list = DEEPSEEK_SAC_SAVE_LIST if family == "deepseek" else LLAMA_SAC_SAVE_LIST
        apply_ac(model, ActivationCheckpoint(mode=ac_mode, selective_ac_option="op"),
                 model_compile_enabled=compile_, op_sac_save_list=save_list)
    if compile_:
        apply_compile(model, Compile(enable=True, backend="inductor"))
    if not fsdp:
        return
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def measure(name: str, family: str, kwargs: dict, seq_len: int, mbs: int, ac_mode: str, mesh, device,
            warmup: int, steps: int, fsdp: bool = True, compile_: bool = False) -> dict:
    row: dict = {"model": name, "family": family, "model_args": kwargs, "seq_len": seq_len,
                 "micro_batch": mbs, "ac_mode": ac_mode, "fsdp": fsdp, "compile": compile_}
    loss_fn = torch.compile(cross_entropy_loss) if compile_ else cross_entropy_loss
    model = build_model(family, kwargs, seq_len)
    row["params"] = sum(p.numel() for p in model.parameters())
    parallelize(model, mesh, ac_mode, fsdp, compile_, family)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=device)
    if not fsdp:
        model.to(torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    vocab = kwargs["vocab_size"]
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(0, vocab, (mbs, seq_len + 1), generator=gen).to(device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    def backward_step(loss: torch.Tensor) -> None:
        loss.backward()
        opt.step()

    loss = time_steps(row, lambda: opt.zero_grad(set_to_none=True), lambda: loss_fn(model(inputs), labels),
                      backward_step, warmup, steps)
    if device.type == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(inputs), labels).backward()
            opt.step()
            torch.cuda.synchronize()
        row["cuda_kernels_per_step"] = sum(e.count for e in prof.key_averages()
                                           if e.device_type == torch.autograd.DeviceType.CUDA)
    row["loss"] = float(loss.detach()) / (mbs * seq_len)  # torchtitan sums the loss
    if device.type == "cuda":
        row["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        row["max_memory_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="steps.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny models, for a logic check without a GPU")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=360.0, help="start no new configuration after this")
    ap.add_argument("--sweep", action="store_true", help="the layer sweeps (SWEEP) instead of GRID")
    ap.add_argument("--compile", action="store_true", help="the compiled configurations (COMPILE_GRID)")
    a = ap.parse_args()
    device = torch.device(a.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group(backend, rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    mesh = init_device_mesh(device.type, (1,))
    models, grid = (SMOKE_MODELS, SMOKE_GRID) if a.smoke else (MODELS, GRID)
    grid = [(*g, True) for g in grid]
    if a.sweep or a.compile:
        fam, base = MODELS["llama-1b"]
        models = {f"llama-1b-L{k}": (fam, dict(base, n_layers=k)) for k in (2, 4, 8, 16)}
        grid = SWEEP if a.sweep else COMPILE_GRID
    out = {"source": "benchmarks/measure_steps.py on a GPU machine lent to the autoshard project (device tool)",
           "date": time.strftime("%Y-%m-%d"),
           "machine": {"gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "cuda": torch.version.cuda,
                       "python": platform.python_version(),
                       "torchtitan": "0.2.2"},
           "method": "torchtitan 0.2.2 model classes, FSDP2 fully_shard per block + root over a one-rank mesh, "
                     "MixedPrecisionPolicy(bf16 params, fp32 reduce), torchtitan apply_ac, fused AdamW, "
                     "fp32-logit cross entropy, random tokens; median of the timed steps after warm-up; "
                     "peak = torch.cuda.max_memory_allocated over the timed steps",
           "runs": []}
    items = [({"model": name, "seq_len": seq, "micro_batch": mbs, "ac_mode": ac},
              functools.partial(measure, name, *models[name], seq, mbs, ac, mesh, device, a.warmup, a.steps,
                                fsdp, a.compile))
             for name, seq, mbs, ac, fsdp in grid]
    run_grid(out, a.out, items, a.budget_s)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

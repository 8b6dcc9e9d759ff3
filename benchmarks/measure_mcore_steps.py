"""Measure training steps and peak memory of a small GPT under Megatron-core on one GPU.

megatron-core 0.16.1's ``GPTModel`` with the local (non-Transformer-Engine) layer spec, wrapped the
way Megatron-LM's ``pretrain`` wraps it: ``DistributedDataParallel`` with fp32 gradient buffers and
the distributed optimizer (``get_megatron_optimizer``; without TE or apex it uses torch's AdamW over
fp32 main parameters), bf16 parameters, RMSNorm, SwiGLU, RoPE, the vocab-parallel cross entropy, and
``recompute_granularity`` none / selective (core attention) / full (uniform, 1 layer). Attention is
the local spec's unfused ``DotProductAttention`` (it keeps the softmax of every head).

Output shipped in ``validation/measured/``; nothing in autoshard depends on running it.

    python benchmarks/measure_mcore_steps.py --out mcore.json       # on a GPU
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
import torch.nn.functional as F

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer import TransformerConfig

from measure_common import GIB, run_grid, time_steps

# Llama 3.2 1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, vocab 128256)
SHAPE = dict(num_layers=16, hidden_size=2048, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=8192)
VOCAB = 128256
GRID = [(2048, 1, "none"), (2048, 1, "selective"), (2048, 1, "full"), (4096, 1, "selective"), (2048, 4, "full")]
# layer sweep: (layers, seq, micro-batch, recompute); few tokens: host time per layer; 2k tokens: memory per layer
SWEEP = [(k, seq, 1, "none") for seq in (256, 2048) for k in (2, 4, 8, 16)]


def build(seq_len: int, recompute: str, layers: int) -> tuple:
    kw = {}
    if recompute == "selective":
        kw = dict(recompute_granularity="selective")
    elif recompute == "full":
        kw = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    cfg = TransformerConfig(**dict(SHAPE, num_layers=layers), gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
                            add_bias_linear=False, bf16=True, params_dtype=torch.bfloat16,
                            hidden_dropout=0.0, attention_dropout=0.0, **kw)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=VOCAB, max_sequence_length=seq_len, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False).cuda()
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                                     use_distributed_optimizer=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True,
                                                 use_distributed_optimizer=True), [ddp])
    return cfg, ddp, opt


def measure(seq_len: int, mbs: int, recompute: str, warmup: int, steps: int, layers: int = 16) -> dict:
    row: dict = {"model": "gpt-1b-llama-shape" + ("" if layers == 16 else f"-L{layers}"),
                 "model_args": dict(SHAPE, num_layers=layers, vocab_size=VOCAB), "seq_len": seq_len,
                 "micro_batch": mbs, "recompute": recompute}
    cfg, ddp, opt = build(seq_len, recompute, layers)
    row["params"] = sum(p.numel() for p in ddp.parameters())
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(0, VOCAB, (mbs, seq_len + 1), generator=gen).cuda()
    inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    pos = torch.arange(seq_len, device="cuda").unsqueeze(0).expand(mbs, -1)
    mask = torch.ones(1, 1, seq_len, seq_len, device="cuda", dtype=torch.bool).triu(1)

    def zero_grad() -> None:
        ddp.zero_grad_buffer()
        opt.zero_grad()

    def backward_step(loss: torch.Tensor) -> None:
        loss.backward()
        ddp.finish_grad_sync()
        opt.step()

    loss = time_steps(row, zero_grad, lambda: ddp(inputs, pos, mask, labels=labels).float().mean(),
                      backward_step, warmup, steps)
    row["loss"] = float(loss.detach())
    row["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    row["max_memory_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="mcore.json")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=120.0)
    ap.add_argument("--sweep", action="store_true", help="the layer sweep (SWEEP) instead of GRID")
    a = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29532")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    out = {"source": "benchmarks/measure_mcore_steps.py on a GPU machine lent to the autoshard project (device tool)",
           "date": time.strftime("%Y-%m-%d"),
           "machine": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
                       "python": platform.python_version(), "megatron_core": "0.16.1"},
           "method": "megatron-core GPTModel, local layer spec (unfused attention), DDP with fp32 grad buffers and "
                     "the distributed optimizer (torch AdamW fallback: no TE/apex), bf16; median of the timed steps; "
                     "peak = torch.cuda.max_memory_allocated over the timed steps",
           "runs": []}
    grid = SWEEP if a.sweep else [(16, *g) for g in GRID]
    items = [({"seq_len": seq, "micro_batch": mbs, "recompute": rc},
              functools.partial(measure, seq, mbs, rc, a.warmup, a.steps, layers))
             for layers, seq, mbs, rc in grid]
    run_grid(out, a.out, items, a.budget_s)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

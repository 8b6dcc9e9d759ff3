"""Measure what CUDA_LAUNCH_BLOCKING=1 costs one transformer layer per micro-batch on the local GPU, as
BigScience ran BLOOM (tr11-176B-ml: `export CUDA_LAUNCH_BLOCKING=1` against NCCL hangs), and write JSON.

Needs a CUDA GPU and PyTorch; nothing in autoshard imports this. The layer is Megatron-DeepSpeed's of
2022 in plain PyTorch at BLOOM's per-GPU shapes under tensor parallelism (13,312 hidden, 104 heads,
2,048 tokens; unfused attention with materialized scores, dropout, GeLU MLP; no collectives: one GPU),
run forward, recomputed forward and backward (activation checkpointing, as BLOOM trained). Each
(tp, micro-batch) runs in a child process with CUDA_LAUNCH_BLOCKING 0 and then 1 (the variable is read
when CUDA starts); the difference per layer and micro-batch is what `cost.constants.
BLOCKING_LAYER_HOST_S` prices. Results: autoshard/data/kernel_measurements.json `launch_blocking`.

    python benchmarks/measure_launch_blocking.py -o blocking.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

H, HEADS, SEQ = 13312, 104, 2048


def layer_ms(tp: int, mbs: int) -> tuple[float, int]:
    """(median ms of one layer's forward + recompute + backward, CUDA kernels per call)."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.utils.checkpoint import checkpoint

    dev, dt = "cuda", torch.bfloat16
    hp, heads, hd = H // tp, HEADS // tp, H // HEADS
    w = {k: (torch.randn(*s, device=dev, dtype=dt) * 0.02).requires_grad_() for k, s in
         {"qkv": (3 * hp, H), "proj": (H, hp), "fc1": (4 * hp, H), "fc2": (H, 4 * hp)}.items()}
    ln1, ln2 = (torch.nn.LayerNorm(H, device=dev, dtype=dt) for _ in range(2))
    mask = torch.triu(torch.ones(SEQ, SEQ, device=dev, dtype=torch.bool), 1)

    def layer(x):
        qkv = F.linear(ln1(x), w["qkv"]).view(SEQ, mbs, heads, 3 * hd)
        q, k, v = (t.reshape(SEQ, mbs * heads, hd).transpose(0, 1) for t in qkv.split(hd, dim=-1))
        s = torch.baddbmm(torch.empty(mbs * heads, SEQ, SEQ, device=dev, dtype=dt), q, k.transpose(1, 2),
                          beta=0.0, alpha=hd ** -0.5).masked_fill(mask, -10000.0)
        p = F.dropout(torch.softmax(s.float(), -1).to(dt), 0.1)
        x = x + F.dropout(F.linear(torch.bmm(p, v).transpose(0, 1).reshape(SEQ, mbs, hp), w["proj"]), 0.1)
        return x + F.dropout(F.linear(F.gelu(F.linear(ln2(x), w["fc1"])), w["fc2"]), 0.1)

    x = torch.randn(SEQ, mbs, H, device=dev, dtype=dt, requires_grad=True)
    g = torch.randn_like(x)

    def step():
        checkpoint(layer, x, use_reentrant=False).backward(g)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / 5 * 1e3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
    return statistics.median(runs), kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="JSON file to write")
    ap.add_argument("--child", nargs=2, type=int, metavar=("TP", "MBS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        ms, kernels = layer_ms(*a.child)
        print(json.dumps({"ms": ms, "kernels": kernels}))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing measured", file=sys.stderr)
        return 1
    rows = []
    for tp in (4, 8):
        for mbs in (1, 2, 4):
            row = {"tp": tp, "micro_batch": mbs}
            for blocking in ("0", "1"):
                env = {**os.environ, "CUDA_LAUNCH_BLOCKING": blocking}
                out = subprocess.run([sys.executable, __file__, "--child", str(tp), str(mbs)], env=env,
                                     capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
                got = json.loads(out)
                row[f"blocking{blocking}_ms"] = got["ms"]
                row.setdefault("kernels", got["kernels"])
            row["blocking_cost_ms"] = row["blocking1_ms"] - row["blocking0_ms"]
            rows.append(row)
            print(f"tp{tp} mbs{mbs}: {row['blocking0_ms']:.2f} ms async, {row['blocking1_ms']:.2f} ms blocking "
                  f"(+{row['blocking_cost_ms']:.2f} ms, {row['kernels']} kernels)")
    doc = {"machine": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__},
           "date": datetime.date.today().isoformat(), "layers": rows}
    if a.output:
        tmp = f"{a.output}.tmp{os.getpid()}"  # written whole, then renamed, as measure_kernels.py does
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(tmp, a.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

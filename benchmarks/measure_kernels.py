"""Measure GEMM (bf16, fp8), attention and HBM copy throughput on the local GPU, for the shapes the
cost model prices (`cost.kernels._gemm_s`, `cost.core_attention_s`), and write them as JSON.

Needs a CUDA GPU and PyTorch with CUDA; nothing in autoshard imports this (no run-time or CI
dependency on a GPU). The results are recorded, with the machine and the date, in
autoshard/data/kernel_measurements.json and compared with the model by benchmarks/bench_kernels.py.

    python benchmarks/measure_kernels.py -o kernels.json

Method: CUDA events around `REPS` launches after `WARMUP` launches, the median of three such
timings; random normal inputs (zeros run faster on Hopper); FLOPs counted as 2 M K N per GEMM and,
for causal attention, 2 x 2 B H S^2 D / 2 forward and 2.5x that backward (FlashAttention's count).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys

WARMUP, REPS = 3, 10

# (label, M tokens, K, N): the layer GEMMs of the models the validation runs train, per TP degree
# (QKV, attention output, MLP fc1 gate+up, fc2), and expert GEMMs at the tokens one expert sees.
def gemm_shapes() -> list[tuple[str, int, int, int]]:
    out = []
    for name, h, ffn, kv in (("llama3-70b", 8192, 28672, 1024), ("llama3-8b", 4096, 14336, 1024)):
        for t in (1, 2, 4, 8):
            for m in (4096, 16384):
                out += [(f"{name} tp{t} qkv", m, h, (h + 2 * kv) // t), (f"{name} tp{t} proj", m, h // t, h),
                        (f"{name} tp{t} fc1", m, h, 2 * ffn // t), (f"{name} tp{t} fc2", m, ffn // t, h)]
    for name, h, f in (("qwen3-30b-a3b expert", 2048, 768), ("deepseek-v3 expert", 7168, 2048),
                       ("gpt-oss expert", 2880, 2880)):
        for m in (128, 512, 2048, 8192):
            out += [(f"{name} fc1", m, h, 2 * f), (f"{name} fc2", m, f, h)]
    out += [("square 8192", 8192, 8192, 8192)]
    return out


def grouped_shapes() -> list[tuple[str, int, int, int, int]]:
    """(label, experts in one launch, tokens per expert, K, N): one GPU's local experts at common EP."""
    out = []
    for name, g, h, f in (("qwen3-30b-a3b ep8", 16, 2048, 768), ("deepseek-v3 ep32", 8, 7168, 2048),
                          ("gpt-oss ep16", 8, 2880, 2880)):
        for t in (128, 512, 2048):
            out += [(f"{name} fc1", g, t, h, 2 * f), (f"{name} fc2", g, t, f, h)]
    return out


def attention_shapes() -> list[tuple[int, int, int, int]]:
    """(batch, heads, seq, head_dim), causal."""
    return [(b, h, s, d) for d, h in ((64, 64), (128, 32), (128, 8)) for s in (2048, 4096, 8192)
            for b in ((2,) if s < 8192 else (1,))]


def timed(torch, fn) -> float:
    """Median over three runs of the mean time of REPS calls (seconds)."""
    for _ in range(WARMUP):
        fn()
    runs = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPS):
            fn()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / 1e3 / REPS)
    return statistics.median(runs)


def measure_gemms(torch) -> list[dict]:
    out = []
    fp8 = hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")
    for label, m, k, n in gemm_shapes():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        s = timed(torch, lambda: a @ b.t())
        row = {"label": label, "m": m, "k": k, "n": n, "bf16_s": s, "bf16_tflops": 2 * m * k * n / s / 1e12}
        if fp8:
            a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
            one = torch.ones((), device="cuda", dtype=torch.float32)
            try:
                s8 = timed(torch, lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                                           out_dtype=torch.bfloat16))
                row.update(fp8_tensorwise_s=s8, fp8_tensorwise_tflops=2 * m * k * n / s8 / 1e12)
            except RuntimeError as exc:  # (shapes the kernel refuses)
                row["fp8_error"] = str(exc).splitlines()[0][:200]
        out.append(row)
    return out


def measure_grouped(torch) -> list[dict]:
    """Expert GEMMs as one grouped launch (torch._grouped_mm, CUTLASS on Hopper), as Megatron's grouped
    MLP runs them; FLOPs 2 x tokens x K x N summed over the experts."""
    out = []
    if not hasattr(torch, "_grouped_mm"):
        return out
    for label, g, t, k, n in grouped_shapes():
        a = torch.randn(g * t, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
        offs = torch.arange(t, g * t + 1, t, device="cuda", dtype=torch.int32)
        row = {"label": label, "groups": g, "m": t, "k": k, "n": n}
        try:
            s = timed(torch, lambda: torch._grouped_mm(a, b, offs=offs, out_dtype=torch.bfloat16))
            row.update(bf16_s=s, bf16_tflops=2 * g * t * k * n / s / 1e12)
        except (RuntimeError, TypeError) as exc:
            row["error"] = str(exc).splitlines()[0][:200]
        out.append(row)
    return out


def measure_attention(torch) -> list[dict]:
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for b, h, s, d in attention_shapes():
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        flops_fwd = 2 * 2 * b * h * s * s * d / 2
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            row = {"backend": name, "batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True}
            try:
                with sdpa_kernel(backend):
                    fwd = timed(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    g = torch.randn_like(o)

                    def both():
                        out_ = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(out_, (q, k, v), g)

                    fb = timed(torch, both)
                row.update(fwd_s=fwd, fwd_tflops=flops_fwd / fwd / 1e12, fwd_bwd_s=fb,
                           bwd_tflops=2.5 * flops_fwd / max(fb - fwd, 1e-9) / 1e12)
            except RuntimeError as exc:
                row["error"] = str(exc).splitlines()[0][:200]
            out.append(row)
    return out


def measure_copy(torch) -> float:
    """HBM bytes per second of a device-to-device copy (read + write counted)."""
    x = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    s = timed(torch, lambda: y.copy_(x))
    return 2 * x.numel() / s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True, help="JSON file to write")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing measured", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    p = torch.cuda.get_device_properties(0)
    doc = {
        "machine": {"gpu": p.name, "sm_count": p.multi_processor_count, "memory_gib": p.total_memory / 2**30,
                    "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "date": datetime.date.today().isoformat(),
        "method": __doc__.split("Method: ", 1)[1].strip(),
        "copy_bytes_per_s": measure_copy(torch),
        "gemm": measure_gemms(torch),
        "grouped_gemm": measure_grouped(torch),
        "attention": measure_attention(torch),
    }
    tmp = f"{a.output}.tmp{os.getpid()}"  # written whole, then renamed: no half-written results
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, a.output)
    print(f"{p.name}: copy {doc['copy_bytes_per_s'] / 1e12:.2f} TB/s, {len(doc['gemm'])} GEMMs, "
          f"{len(doc['attention'])} attention runs -> {a.output}")
    for r in doc["gemm"][:4] + doc["gemm"][-3:]:
        print(f"  {r['label']:<28} {r['m']:>6} {r['k']:>6} {r['n']:>6}  bf16 {r['bf16_tflops']:6.0f}  "
              f"fp8 {r.get('fp8_tensorwise_tflops', 0):6.0f} TFLOP/s")
    for r in doc["grouped_gemm"]:
        print(f"  grouped {r['label']:<24} {r['groups']:>3} x {r['m']:>5} {r['k']:>6} {r['n']:>6}  "
              f"bf16 {r.get('bf16_tflops', 0):6.0f} TFLOP/s  {r.get('error', '')}")
    for r in doc["attention"][:6]:
        print(f"  attn {r['backend']:<5} b{r['batch']} h{r['heads']} s{r['seq']} d{r['head_dim']}  "
              f"fwd {r.get('fwd_tflops', 0):5.0f}  bwd {r.get('bwd_tflops', 0):5.0f} TFLOP/s  {r.get('error', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

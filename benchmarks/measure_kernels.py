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


def fp8_scales(torch, m: int, k: int, n: int) -> dict:
    """The dequantization scales `torch._scaled_mm` takes per FP8 recipe (their values do not change the
    time): one per tensor (TE current/delayed scaling, torchao tensorwise); one per row of A and per
    column of B (torchao rowwise, cuBLAS's outer-vector scaling); DeepSeek-V3's 1x128 activation tiles
    and 128x128 weight blocks (TE Float8BlockScaling; cuBLAS block scaling on sm90 from CUDA 12.9),
    laid out as PyTorch's test_scaled_mm_vs_emulated_block_wise passes them (1x128 scales outer-dim
    major)."""
    f32 = dict(device="cuda", dtype=torch.float32)
    out = {"tensorwise": (torch.ones((), **f32), torch.ones((), **f32)),
           "rowwise": (torch.ones(m, 1, **f32), torch.ones(1, n, **f32))}
    if k % 128 == 0 and n % 128 == 0:
        out["blockwise"] = (torch.ones(k // 128, m, **f32).t(), torch.ones(n // 128, k // 128, **f32).t())
    return out


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
            for recipe, (sa, sb) in fp8_scales(torch, m, k, n).items():
                try:
                    s8 = timed(torch, lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb,
                                                               out_dtype=torch.bfloat16))
                    row[f"fp8_{recipe}_s"] = s8
                    row[f"fp8_{recipe}_tflops"] = 2 * m * k * n / s8 / 1e12
                except (RuntimeError, ValueError) as exc:  # (shapes or layouts the kernel refuses)
                    row[f"fp8_{recipe}_error"] = str(exc).splitlines()[0][:200]
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
        if hasattr(torch, "_scaled_grouped_mm"):  # torchao's FP8 row-wise MoE training path
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.transpose(-2, -1).contiguous().to(torch.float8_e4m3fn).transpose(-2, -1)
            sa = torch.ones(g * t, device="cuda", dtype=torch.float32)
            sb = torch.ones(g, n, device="cuda", dtype=torch.float32)
            try:
                s8 = timed(torch, lambda: torch._scaled_grouped_mm(a8, b8, sa, sb, offs=offs,
                                                                   out_dtype=torch.bfloat16))
                row.update(fp8_rowwise_s=s8, fp8_rowwise_tflops=2 * g * t * k * n / s8 / 1e12)
            except (RuntimeError, TypeError) as exc:
                row["fp8_rowwise_error"] = str(exc).splitlines()[0][:200]
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


def linear_shapes() -> list[tuple[str, int, int, int]]:
    """(label, M tokens, K in, N out) of whole linear layers timed forward + backward per FP8 recipe."""
    return [("llama3-8b qkv", 16384, 4096, 6144), ("llama3-8b fc1", 16384, 4096, 28672),
            ("llama3-8b fc2", 16384, 14336, 4096), ("llama3-70b tp8 fc1", 8192, 8192, 7168)]


def measure_fp8_linear(torch) -> list[dict]:
    """One linear layer's forward and backward (Y = X W^T, dX = dY W, dW = dY^T X) in bf16 and as torchao's
    Float8Linear runs it under torch.compile: tensorwise (one amax per tensor, the FP8 transposes copied)
    and rowwise (each operand scaled along its reduction dimension, so X, W and dY are each quantized twice,
    once per axis). The quantization kernels are torch.compile'd (Triton, as torchao's are); the GEMMs are
    torch._scaled_mm. Also times the three GEMMs alone on pre-quantized inputs, so the difference is what
    quantizing costs."""
    f8, big = torch.float8_e4m3fn, 448.0

    def q_tensor(x):
        s = big / x.abs().amax().float().clamp(min=1e-12)
        q = (x.float() * s).clamp(-big, big).to(f8)
        return q, q.t().contiguous(), s.reciprocal()

    def q_rows(x):
        s = big / x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
        return (x.float() * s).clamp(-big, big).to(f8), s.reciprocal()

    def q_cols_t(x):
        s = big / x.abs().amax(dim=0, keepdim=True).float().clamp(min=1e-12)
        return (x.float() * s).clamp(-big, big).to(f8).t().contiguous(), s.reciprocal()

    torch._dynamo.config.cache_size_limit = 64  # one compiled kernel set per shape, no eager fallback
    qt, qr, qc = (torch.compile(f, dynamic=False) for f in (q_tensor, q_rows, q_cols_t))
    mm, bf = torch._scaled_mm, torch.bfloat16
    out = []
    for label, m, k, n in linear_shapes():
        x, w, g = (torch.randn(*sh, device="cuda", dtype=bf) for sh in ((m, k), (n, k), (m, n)))
        row = {"label": label, "m": m, "k": k, "n": n, "flops": 3 * 2 * m * k * n}

        def bf16():
            return x @ w.t(), g @ w, g.t() @ x

        def tensorwise():
            xq, xqt, xs = qt(x)
            wq, wqt, ws = qt(w)
            gq, gqt, gs = qt(g)
            return (mm(xq, wq.t(), xs, ws, out_dtype=bf), mm(gq, wqt.t(), gs, ws, out_dtype=bf),
                    mm(gqt, xqt.t(), gs, xs, out_dtype=bf))

        def rowwise():
            xq, xs = qr(x)
            wq, ws = qr(w)
            gq, gs = qr(g)
            wct, wcs = qc(w)
            gct, gcs = qc(g)
            xct, xcs = qc(x)
            return (mm(xq, wq.t(), xs, ws.t(), out_dtype=bf), mm(gq, wct.t(), gs, wcs, out_dtype=bf),
                    mm(gct, xct.t(), gcs.t(), xcs, out_dtype=bf))

        try:
            row["bf16_s"] = timed(torch, bf16)
            for name, fn, quant in (("tensorwise", tensorwise, lambda: (qt(x), qt(w), qt(g))),
                                    ("rowwise", rowwise, lambda: (qr(x), qr(w), qr(g), qc(w), qc(g), qc(x)))):
                row[f"{name}_s"] = timed(torch, fn)
                row[f"{name}_quant_s"] = timed(torch, quant)
        except Exception as exc:  # noqa: BLE001 (compile or kernel refusals are recorded, not fatal)
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        out.append(row)
    return out


def attention_grid_shapes() -> list[tuple[int, int, int, bool]]:
    """(heads, seq, head_dim, causal) at batch 1: the heads one GPU keeps under TP and the sequence it
    attends over under CP, for the kernel's rate by call size."""
    return ([(h, s, 128, True) for h in (4, 8, 16, 32, 64) for s in (1024, 2048, 4096, 8192, 16384, 32768)]
            + [(h, s, 128, False) for h in (8, 32) for s in (1024, 4096, 16384)])


def measure_attention_grid(torch) -> list[dict]:
    """cuDNN SDPA (what Transformer Engine runs on Hopper) forward and forward + backward per shape."""
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for h, s, d, causal in attention_grid_shapes():
        q, k, v = (torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        flops_fwd = 2 * 2 * h * s * s * d / (2 if causal else 1)
        row = {"backend": "cudnn", "batch": 1, "heads": h, "seq": s, "head_dim": d, "causal": causal}
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                fwd = timed(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                g = torch.randn(1, h, s, d, device="cuda", dtype=torch.bfloat16)

                def both():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    torch.autograd.grad(o, (q, k, v), g)

                fb = timed(torch, both)
                fwd_gpu = kernel_s(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                fb_gpu = kernel_s(torch, both)
            row.update(fwd_s=fwd, fwd_tflops=flops_fwd / fwd / 1e12, fwd_bwd_s=fb,
                       bwd_tflops=2.5 * flops_fwd / max(fb - fwd, 1e-9) / 1e12,
                       fwd_kernel_s=fwd_gpu, fwd_bwd_kernel_s=fb_gpu)
        except RuntimeError as exc:
            row["error"] = str(exc).splitlines()[0][:200]
        out.append(row)
    return out


def kernel_s(torch, fn, reps: int = 10) -> float:
    """GPU time of one call: the summed durations of its kernels (torch.profiler), so host overhead that
    a loop of small calls cannot hide does not count."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / 1e6 / reps


def measure_copy(torch) -> float:
    """HBM bytes per second of a device-to-device copy (read + write counted)."""
    x = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    s = timed(torch, lambda: y.copy_(x))
    return 2 * x.numel() / s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True, help="JSON file to write")
    ap.add_argument("--sections", default="copy,gemm,grouped,attention,fp8_linear,attention_grid",
                    help="comma-separated parts to measure (default: all of copy,gemm,grouped,attention,fp8_linear,attention_grid)")
    a = ap.parse_args()
    parts = set(a.sections.split(","))
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
        "copy_bytes_per_s": measure_copy(torch) if "copy" in parts else 0.0,
        "gemm": measure_gemms(torch) if "gemm" in parts else [],
        "grouped_gemm": measure_grouped(torch) if "grouped" in parts else [],
        "attention": measure_attention(torch) if "attention" in parts else [],
        "fp8_linear": measure_fp8_linear(torch) if "fp8_linear" in parts else [],
        "attention_grid": measure_attention_grid(torch) if "attention_grid" in parts else [],
    }
    tmp = f"{a.output}.tmp{os.getpid()}"  # written whole, then renamed: no half-written results
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, a.output)
    print(f"{p.name}: copy {doc['copy_bytes_per_s'] / 1e12:.2f} TB/s, {len(doc['gemm'])} GEMMs, "
          f"{len(doc['attention'])} attention runs -> {a.output}")
    for r in doc["gemm"]:
        print(f"  {r['label']:<28} {r['m']:>6} {r['k']:>6} {r['n']:>6}  bf16 {r['bf16_tflops']:6.0f}  fp8 "
              + "  ".join(f"{x} {r.get(f'fp8_{x}_tflops', 0):5.0f}" for x in ("tensorwise", "rowwise", "blockwise"))
              + "  " + " ".join(v[:60] for key, v in r.items() if key.endswith("error")))
    for r in doc["grouped_gemm"]:
        print(f"  grouped {r['label']:<24} {r['groups']:>3} x {r['m']:>5} {r['k']:>6} {r['n']:>6}  "
              f"bf16 {r.get('bf16_tflops', 0):6.0f}  fp8 rowwise {r.get('fp8_rowwise_tflops', 0):6.0f} TFLOP/s  "
              f"{r.get('error', '')} {r.get('fp8_rowwise_error', '')[:80]}")
    for r in doc["fp8_linear"]:
        print(f"  linear {r['label']:<20} {r['m']:>6} {r['k']:>6} {r['n']:>6}  fwd+bwd ms: bf16 {r.get('bf16_s', 0) * 1e3:.3f}  "
              + "  ".join(f"{x} {r.get(f'{x}_s', 0) * 1e3:.3f} (quant {r.get(f'{x}_quant_s', 0) * 1e3:.3f})"
                          for x in ("tensorwise", "rowwise")) + f"  {r.get('error', '')}")
    for r in doc["attention_grid"]:
        print(f"  attn grid h{r['heads']} s{r['seq']} {'causal' if r['causal'] else 'full'}  fwd {r.get('fwd_tflops', 0):5.0f}  "
              f"bwd {r.get('bwd_tflops', 0):5.0f} TFLOP/s  kernels fwd {r.get('fwd_kernel_s', 0) * 1e6:8.1f} us "
              f"fwd+bwd {r.get('fwd_bwd_kernel_s', 0) * 1e6:8.1f} us  {r.get('error', '')}")
    for r in doc["attention"][:6]:
        print(f"  attn {r['backend']:<5} b{r['batch']} h{r['heads']} s{r['seq']} d{r['head_dim']}  "
              f"fwd {r.get('fwd_tflops', 0):5.0f}  bwd {r.get('bwd_tflops', 0):5.0f} TFLOP/s  {r.get('error', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

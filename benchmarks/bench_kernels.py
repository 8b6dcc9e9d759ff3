"""The cost model's kernel rates against the GPU measurements in autoshard/data/kernel_measurements.json
(written by benchmarks/measure_kernels.py on a lent GPU; nothing here needs a GPU).

    python benchmarks/bench_kernels.py [--all]

Per machine it prints:
- HBM: the catalog's achievable bandwidth (datasheet x `efficiency.hbm`) against a measured copy;
- GEMMs: the shape model (`cost.gemm_shape_efficiency`) against the measured rate of each shape,
  both relative to their median over the large shapes (M, K, N >= 4096), since the catalog's matmul
  factor is a training-level figure fitted on whole runs, not an isolated kernel's; and that level;
- attention: the head-dimension factor (`cost.attention_head_dim_factor`) against the measured
  cuDNN ratio of head dim 64 to 128, the backward's rate against the forward's beside the one the
  framework profile prices, and the rate by call size (fewer heads per GPU, shorter sequences) that
  the attention grid's kernel times price (`cost.attention_call_s`);
- FP8 recipes: the row-wise and block-wise scaled GEMMs' rate over the per-tensor one beside the recipe's
  `gemm_efficiency_factor`, and whole linear layers (forward + backward, torchao under torch.compile):
  the quantization bytes per element and the speedup over bf16, measured and priced.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoshard.catalog import get_gpu  # noqa: E402
from autoshard.cost import attention_head_dim_factor, gemm_shape_efficiency  # noqa: E402
from autoshard.frameworks import get_framework  # noqa: E402

DATA = ROOT / "autoshard" / "data" / "kernel_measurements.json"
CATALOG_OF = {"NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H200": "h200-sxm"}


def large(r: dict) -> bool:
    return min(r["m"], r["k"], r["n"]) >= 4096


def dense_layer(r: dict) -> bool:
    """A dense model's layer GEMM at a training micro-batch, K not short (README: short K is slower)."""
    return r["m"] >= 4096 and r["k"] >= 2048 and "expert" not in r["label"]


def gemm_rows(doc: dict, gpu, key: str) -> list[dict]:
    """Each shape's measured and modelled efficiency relative to the large shapes' median."""
    rows = [r for r in doc["gemm"] if r.get(key)]
    meas_ref = statistics.median(r[key] for r in rows if large(r))
    model_ref = statistics.median(gemm_shape_efficiency(gpu, r["m"], r["k"], r["n"]) for r in rows if large(r))
    return [{**r, "measured_rel": r[key] / meas_ref,
             "model_rel": gemm_shape_efficiency(gpu, r["m"], r["k"], r["n"]) / model_ref,
             "large_median_tflops": meas_ref} for r in rows]


def grouped_rows(doc: dict, gpu) -> list[dict]:
    """Grouped expert GEMMs (one launch for a GPU's local experts): measured and modelled rate relative
    to the single large bf16 GEMMs' median, the model as `cost.kernels._gemm_s` prices them: the shape
    efficiency, capped by the HBM roofline (each expert's weights read for its few tokens)."""
    single = [r for r in doc["gemm"] if large(r)]
    meas_ref = statistics.median(r["bf16_tflops"] for r in single)
    model_ref = statistics.median(gemm_shape_efficiency(gpu, r["m"], r["k"], r["n"]) for r in single)
    hbm = gpu.hbm_tb_per_s * 1e12 * gpu.efficiency.hbm
    out = []
    for r in doc.get("grouped_gemm", []):
        if not r.get("bf16_tflops"):
            continue
        g, m, k, n = r["groups"], r["m"], r["k"], r["n"]
        compute = gemm_shape_efficiency(gpu, m, k, n, g) / model_ref * meas_ref
        memory = 2.0 * m * k * n * g / (2.0 * (m * k + k * n + m * n) * g / hbm) / 1e12
        out.append({**r, "measured_rel": r["bf16_tflops"] / meas_ref, "model_rel": min(compute, memory) / meas_ref,
                    "memory_bound": memory < compute})
    return out


def repeat_spread(doc: dict, repeat: dict | None) -> float | None:
    """Median |log| of the bf16 GEMM rates of two runs of the same shapes."""
    if not repeat:
        return None
    pairs = [(a["bf16_tflops"], b["bf16_tflops"]) for a, b in zip(doc["gemm"], repeat["gemm"]) if a["label"] == b["label"]]
    return statistics.median(abs(math.log(a / b)) for a, b in pairs)


def attention_ratio(doc: dict, backend: str, seq: int, field: str = "fwd_tflops") -> float | None:
    """Measured rate at head dim 64 (64 heads) over head dim 128 (32 heads), same tokens."""
    pick = {r["head_dim"]: r.get(field) for r in doc["attention"]
            if r["backend"] == backend and r["seq"] == seq and r["heads"] in (64, 32)}
    return pick[64] / pick[128] if pick.get(64) and pick.get(128) else None


def shape_lines(rows: list[dict], logs: list[float], key: str, show_all: bool) -> list[str]:
    """One line per shape off by more than 25% (every shape with `show_all`)."""
    out = []
    for r, x in zip(rows, logs):
        if show_all or abs(x) > 0.25:
            groups = f"{r['groups']:>3} x " if "groups" in r else ""
            bound = " (HBM-bound)" if r.get("memory_bound") else ""
            out.append(f"    {r['label']:<28} {groups}M {r['m']:>6} K {r['k']:>6} N {r['n']:>6}  {r[key]:6.0f} TFLOP/s  "
                       f"relative: measured {r['measured_rel']:.2f}, model {r['model_rel']:.2f}{bound}")
    return out


def report(doc: dict, show_all: bool, repeat: dict | None = None) -> list[str]:
    m = doc["machine"]
    gpu = get_gpu(CATALOG_OF.get(m["gpu"], m["gpu"]))
    out = [f"{m['gpu']} ({gpu.name}), {doc['date']}, torch {m['torch']}"]
    spread = repeat_spread(doc, repeat)
    if spread is not None:
        out.append(f"  run to run (a second machine of the kind): bf16 GEMM rates differ by a median {spread:.3f} |log|")
    hbm = gpu.hbm_tb_per_s * 1e12 * gpu.efficiency.hbm
    out.append(f"  HBM: catalog {hbm / 1e12:.2f} TB/s ({gpu.hbm_tb_per_s} x {gpu.efficiency.hbm}), "
               f"measured copy {doc['copy_bytes_per_s'] / 1e12:.2f} TB/s ({doc['copy_bytes_per_s'] / hbm:.2f}x)")
    for key, prec in (("bf16_tflops", "bf16"), ("fp8_tensorwise_tflops", "fp8")):
        rows = gemm_rows(doc, gpu, key)
        if not rows:
            continue
        logs = [math.log(r["model_rel"] / r["measured_rel"]) for r in rows]
        dense = [x for x, r in zip(logs, rows) if dense_layer(r)]
        level = rows[0]["large_median_tflops"]
        peak = gpu.peak_flops(prec) / 1e12
        out.append(f"  GEMM {prec}: large shapes {level:.0f} TFLOP/s = {level / peak:.2f} of the {peak:.0f} peak "
                   f"(catalog training factor {gpu.efficiency.matmul.get(prec, 0):.2f}); shape model vs measured "
                   f"(relative): median |log| {statistics.median(map(abs, logs)):.3f}, the {len(dense)} dense layer "
                   f"GEMMs (K >= 2048) {statistics.median(map(abs, dense)):.3f} (mean signed {statistics.mean(dense):+.3f}), "
                   f"worst {max(map(abs, logs)):.2f}")
        out += shape_lines(rows, logs, key, show_all)
    grouped = grouped_rows(doc, gpu)
    if grouped:
        logs = [math.log(r["model_rel"] / r["measured_rel"]) for r in grouped]
        big = [x for x, r in zip(logs, grouped) if r["m"] >= 512]
        out.append(f"  grouped expert GEMMs (torch._grouped_mm, one launch per layer's local experts): model (shape, HBM "
                   f"roofline) vs measured, relative to the large single GEMMs: median |log| "
                   f"{statistics.median(map(abs, logs)):.3f} (mean signed {statistics.mean(logs):+.3f}); at >= 512 tokens "
                   f"per expert {statistics.median(map(abs, big)):.3f} ({statistics.mean(big):+.3f})")
        out += shape_lines(grouped, logs, "bf16_tflops", show_all)
    for seq in (4096, 8192):
        ratio = attention_ratio(doc, "cudnn", seq)
        if ratio:
            out.append(f"  attention (cuDNN, causal, seq {seq}): head dim 64 / 128 measured {ratio:.2f}, "
                       f"model {attention_head_dim_factor(64, gpu):.2f}")
    cud = {(r["heads"], r["seq"], r["head_dim"]): r for r in doc["attention"] if r["backend"] == "cudnn" and "error" not in r}
    if (32, 8192, 128) in cud and (32, 2048, 128) in cud:
        long_, short = cud[(32, 8192, 128)], cud[(32, 2048, 128)]
        out.append(f"  loop timing (host time included): seq 2048 runs at {short['fwd_tflops'] / long_['fwd_tflops']:.2f} of "
                   "seq 8192's forward rate (head dim 128); priced by call size from kernel times (attention grid)")
    ratios = sorted(r["bwd_tflops"] / r["fwd_tflops"] for r in cud.values())
    if ratios:
        out.append(f"  attention backward / forward rate: median {statistics.median(ratios):.2f} of {len(ratios)} cuDNN shapes "
                   f"({ratios[0]:.2f}-{ratios[-1]:.2f}; priced: Megatron's profile "
                   f"{get_framework('megatron').attention_backward_rate:.2f})")
    if (8, 4096, 128) in cud and (32, 4096, 128) in cud:
        out.append(f"  loop timing: 8 heads per GPU run at {cud[(8, 4096, 128)]['fwd_tflops'] / cud[(32, 4096, 128)]['fwd_tflops']:.2f}"
                   " of 32 heads' forward rate (seq 4096, head dim 128); priced by call size (attention grid)")
    fa = attention_ratio(doc, "flash", 8192)
    if fa:
        out.append(f"  PyTorch's FlashAttention-2 (not what Megatron runs on Hopper): head dim 64 / 128 {fa:.2f}, "
                   f"{cud[(32, 8192, 128)]['fwd_tflops'] / next(r['fwd_tflops'] for r in doc['attention'] if r['backend'] == 'flash' and (r['heads'], r['seq'], r['head_dim']) == (32, 8192, 128)):.2f}x slower than cuDNN at 128")
    return out


def recipe_ratios(run: dict, recipe: str) -> list[float]:
    """FP8 GEMM rate with `recipe`'s scales over the per-tensor-scaled rate of the same run, per dense
    layer GEMM (M >= 4096, K >= 2048)."""
    return [r[f"fp8_{recipe}_tflops"] / r["fp8_tensorwise_tflops"] for r in run["gemm"]
            if dense_layer(r) and r.get(f"fp8_{recipe}_tflops")]


def linear_rows(doc: dict, gpu) -> list[dict]:
    """Per measured linear layer (forward + backward): the quantization bytes per element of X, W and dY
    at the catalog's HBM rate, and the bf16 / FP8 time ratio measured and priced for torchtitan (torchao's
    casts; `cost.kernels._gemm_s`, three times the forward: the backward is priced at twice it)."""
    from autoshard import load_problem  # noqa: PLC0415
    from autoshard.cost import context  # noqa: PLC0415
    from autoshard.cost.kernels import _gemm_s  # noqa: PLC0415

    ctx = {p: context(load_problem({"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64,
                                                                        "precision": p},
                                    "cluster": {"gpu": gpu.id, "num_gpus": 8}, "framework": "torchtitan"}))
           for p in ("bf16", "fp8-current", "fp8-rowwise")}
    hbm = gpu.hbm_tb_per_s * 1e12 * gpu.efficiency.hbm
    out = []
    for r in doc.get("fp8_linear", []):
        if "error" in r:
            continue
        m, k, n = r["m"], r["k"], r["n"]
        elements = m * k + k * n + m * n
        model = {p: 3 * _gemm_s(c, m, k, n) for p, c in ctx.items()}
        out.append({**r, "tensorwise_bytes": r["tensorwise_quant_s"] * hbm / elements,
                    "rowwise_bytes": r["rowwise_quant_s"] * hbm / elements,
                    "measured_speedup": {"tensorwise": r["bf16_s"] / r["tensorwise_s"], "rowwise": r["bf16_s"] / r["rowwise_s"]},
                    "model_speedup": {"tensorwise": model["bf16"] / model["fp8-current"],
                                      "rowwise": model["bf16"] / model["fp8-rowwise"]}})
    return out


def attention_grid_rows(grid: dict, gpu) -> list[dict]:
    """Per measured cuDNN attention call: the kernel time and what `cost.core_attention_s` adds to the
    FLOPs at the large calls' rate (`attention_call_s`: a fixed time per call and the causal tail), and
    the backward priced at 2.5x the forward over the measured large-call backward / forward rate."""
    import types  # noqa: PLC0415

    from autoshard.cost.kernels import attention_call_s  # noqa: PLC0415

    rows = [r for r in grid.get("attention_grid", []) if r.get("fwd_kernel_s")]

    def flops(r):
        return 4.0 * r["heads"] * r["seq"] ** 2 * r["head_dim"] / (2 if r["causal"] else 1)

    def large(r):
        return r["causal"] and r["heads"] * r["seq"] ** 2 >= 32 * 8192**2

    rate = statistics.median(flops(r) / r["fwd_kernel_s"] for r in rows if large(r))
    bwd_rate = statistics.median(2.5 * flops(r) / (r["fwd_bwd_kernel_s"] - r["fwd_kernel_s"]) for r in rows if large(r)) / rate
    ctx = types.SimpleNamespace(gpu=gpu)
    out = []
    for r in rows:
        model = types.SimpleNamespace(sliding_window=None, sliding_window_layers=0.0, attention_chunk_size=None,
                                      chunked_attention_layers=0.0)
        sh = types.SimpleNamespace(m=model, cp=1, cp_comm="p2p", seq=r["seq"], d_qk=r["head_dim"], d_v=r["head_dim"],
                                   doc=None)  # one sequence per row: no packed documents
        fwd = flops(r) / rate + attention_call_s(ctx, sh, rate, r["causal"])
        out.append({**r, "flat_fwd_s": flops(r) / rate, "model_fwd_s": fwd, "model_bwd_s": 2.5 * fwd / bwd_rate,
                    "flat_bwd_s": 2.5 * flops(r) / rate / bwd_rate, "bwd_kernel_s": r["fwd_bwd_kernel_s"] - r["fwd_kernel_s"]})
    return out


def attention_grid_report(data: dict) -> list[str]:
    grid = data.get("attention_grid")
    if not grid:
        return []
    gpu = get_gpu(CATALOG_OF.get(grid["machine"]["gpu"], grid["machine"]["gpu"]))
    rows = attention_grid_rows(grid, gpu)
    out = [f"Attention by call size: cuDNN kernel time per call vs priced ({grid['machine']['gpu']}, {len(rows)} calls, "
           "4-64 heads x 1k-32k tokens; |log| error):"]
    for d in ("fwd", "bwd"):
        model = [abs(math.log(r[f"model_{d}_s"] / r[f"{d}_kernel_s"])) for r in rows]
        flat = [abs(math.log(r[f"flat_{d}_s"] / r[f"{d}_kernel_s"])) for r in rows]
        out.append(f"  {d}: median {statistics.median(model):.3f}, worst {max(model):.2f} "
                   f"(one flat rate: median {statistics.median(flat):.3f}, worst {max(flat):.2f})")
    for r in rows:
        if r["seq"] in (2048, 8192) and r["causal"]:
            out.append(f"    h{r['heads']:<3} seq {r['seq']:>6} causal  forward rate / large calls: measured "
                       f"{r['flat_fwd_s'] / r['fwd_kernel_s']:.2f}, priced {r['flat_fwd_s'] / r['model_fwd_s']:.2f}")
    return out


def fp8_report(data: dict) -> list[str]:
    """The FP8 recipes' GEMM rates and whole linear layers against what precisions.yaml prices."""
    from autoshard.catalog import get_recipe, quant_overhead_bytes_per_element  # noqa: PLC0415

    out = []
    runs = data.get("fp8_recipes", {}).get("runs", [])
    if runs:
        out.append("FP8 recipes: GEMM rate over the per-tensor-scaled GEMM of the same run, median of the dense layer GEMMs")
        for recipe, name in (("rowwise", "fp8-rowwise"), ("blockwise", "fp8-blockwise")):
            per_run = ", ".join(f"{run['machine']['gpu'].replace('NVIDIA ', '')} {statistics.median(recipe_ratios(run, recipe)):.3f}"
                                for run in runs)
            out.append(f"  {recipe:<9} {per_run}  (priced: {name} gemm_efficiency_factor "
                       f"{get_recipe(name).gemm_efficiency_factor})")
        for run in runs:
            g = [r["fp8_rowwise_tflops"] / r["bf16_tflops"] for r in run.get("grouped_gemm", []) if r.get("fp8_rowwise_tflops")]
            if g:
                out.append(f"  grouped expert GEMMs, FP8 row-wise over bf16 ({run['machine']['gpu']}): median {statistics.median(g):.2f} "
                           f"({min(g):.2f}-{max(g):.2f}; 512 tokens x Qwen3-30B's narrow experts are the slow end)")
    lin = data.get("fp8_linear")
    if lin:
        gpu = get_gpu(CATALOG_OF.get(lin["machine"]["gpu"], lin["machine"]["gpu"]))
        rows = linear_rows(lin, gpu)
        out.append(f"FP8 linear layers, forward + backward, torchao under torch.compile ({lin['machine']['gpu']}, {lin['date']}):")
        for r in rows:
            out.append(f"  {r['label']:<20} M {r['m']:>6} K {r['k']:>6} N {r['n']:>6}  quant B/element tensorwise "
                       f"{r['tensorwise_bytes']:.1f} rowwise {r['rowwise_bytes']:.1f}  speedup over bf16 measured / priced: "
                       f"tensorwise {r['measured_speedup']['tensorwise']:.2f} / {r['model_speedup']['tensorwise']:.2f}, "
                       f"rowwise {r['measured_speedup']['rowwise']:.2f} / {r['model_speedup']['rowwise']:.2f}")
        if rows:
            out.append(f"  median quant bytes per element of X, W, dY: tensorwise {statistics.median(r['tensorwise_bytes'] for r in rows):.1f} "
                       f"(priced for torchtitan {dict(get_framework('torchtitan').quant_hbm_bytes_per_element)['fp8-current']}; "
                       f"Transformer Engine's fused cast-transpose count is {quant_overhead_bytes_per_element('fp8-current', gpu)}), rowwise {statistics.median(r['rowwise_bytes'] for r in rows):.1f} "
                       f"(priced fp8-rowwise {quant_overhead_bytes_per_element('fp8-rowwise', gpu)})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every GEMM shape, not only those off by more than 25%%")
    ap.add_argument("--data", default=str(DATA), help="kernel measurements (measure_kernels.py output, or the data file)")
    a = ap.parse_args()
    data = json.loads(Path(a.data).read_text(encoding="utf-8"))
    docs = data.get("machines", [data])
    repeats = {r["machine"]["gpu"]: r for r in data.get("repeats", [])}
    if "source" in data:
        print(data["source"])
    for doc in docs:
        print("\n".join(report(doc, a.all, repeats.get(doc["machine"]["gpu"]))))
    print("\n".join(attention_grid_report(data) + fp8_report(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

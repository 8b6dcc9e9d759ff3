"""Held-out check: the BLOOM logbook's 48-node topology sweeps (Feb 21-28 2022), priced.

    python benchmarks/bench_bloom_logbook.py CHRONICLES.md [--all] [--json]

CHRONICLES.md is `train/tr11-176B-ml/chronicles-prequel.md` of bigscience-workshop/bigscience (read
it from a checkout; nothing is fetched). Between its sections "48 node contenders" and "Hanging Issue"
it tables about 90 measured iterations of BLOOM candidates on Jean Zay's A100s: TP 1-8, PP 2-48, DP
4-24, micro-batch 1-8, 16-256 heads. shared/validation/ablations_dev.json holds three of these tables
(02-26); the rest are lines the cost model was never compared with while it was built.

Each line becomes an ablation configuration of a group with that table's NHIDDEN / NLAYERS / NHEADS
(heads 64 where the table has no column: "all NHEADS=64 (above too)") and is converted by
`autoshard validate --ablations`'s own code (validate.ablations.group_result: Megatron-DeepSpeed,
CUDA_LAUNCH_BLOCKING=1, full recompute, Jean Zay's network). The single-node max-TFLOPs probes (a
`Layers` column and no DP) are skipped (their batch is given as both 512 and 2048), as is a line whose
DP x TP x PP is not its nodes' GPUs (02-21: 40 nodes at DP 8, TP 8, PP 10).

Lines from 02-28 on ran bf16 with Megatron-DeepSpeed's BF16_Optimizer (fp32 gradient accumulation,
the logbook's "Rebalancing layers"); earlier ones fp16.

It prints the median, p90 and worst |error|, the median signed error by (TP, micro-batch) and by date
(the logbook's 02-25 "PCIe/NUMA fix" raised every later figure 1-5%), the memory column's OOM/fit
agreement (its OOM lines included) and measured (nvidia-smi) over priced peak memory, and with --all
every line. About 3 s.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoshard.validate.ablations import group_result  # noqa: E402

FIRST, LAST = "## 48 node contenders", "## Hanging Issue"


def logbook_rows(text: str) -> tuple[list[dict], int]:
    """(measured lines with their model, lines skipped) of the sweep sections."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(FIRST))
    end = next(i for i, line in enumerate(lines) if line.startswith(LAST))
    hidden = layers = None
    header: list[str] = []
    rows, skipped = [], 0
    for line in lines[start:end]:
        m = re.search(r"N?HIDDEN=(\d+)\s*[/;]\s*NLAYERS=(\d+)", line)
        if m:
            hidden, layers = int(m.group(1)), int(m.group(2))
            continue
        if m := re.match(r"^NLAYERS=(\d+)", line):
            layers = int(m.group(1))
            continue
        if m := re.match(r"^NHIDDEN=(\d+)$", line):
            hidden = int(m.group(1))
            continue
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "Nodes":
            header = cells
            continue
        row = dict(zip(header, cells))
        date = row.get("Notes", "")[-5:]
        mem = row.get("Mem", "")
        oom = mem == "OOM"
        if not re.fullmatch(r"0?2-2\d", date) or not (oom or re.fullmatch(r"[\d.]+", row.get("Sec/it", ""))):
            continue
        if "DP" not in row or int(row["DP"]) * int(row["TP"]) * int(row["PP"]) != 8 * int(row["Nodes"]):
            skipped += 1  # a probe without DP, or a line whose degrees do not multiply to its GPUs
            continue
        m = re.fullmatch(r"(\d+)GB", mem)
        rows.append({"date": date, "hidden": hidden, "layers": layers, "nodes": int(row["Nodes"]),
                     "dp": int(row["DP"]), "tp": int(row["TP"]), "pp": int(row["PP"]), "mbs": int(row["MBS"]),
                     "heads": int(row.get("NHEADS") or 64), "gbs": int(row["GBS"]), "zero": int(row.get("ZS") or 1),
                     "measured_s": None if oom else float(row["Sec/it"]),
                     "memory": "OOM" if oom else int(m.group(1)) if m else None})
    return rows, skipped


# What validation/ablations_dev.json states for the logbook's groups (validation/README.md): Megatron-DeepSpeed
# of Feb 2022 on Jean Zay (fused softmax with that month's check, no FlashAttention, no sequence parallelism,
# CUDA_LAUNCH_BLOCKING=1, --checkpoint-activations in every tr11 launcher); GPT-style models with BLOOM's
# 250,880-token vocabulary; bf16 runs on BF16_Optimizer (gradients accumulated and reduced in fp32).
LOGBOOK_FACTS = {"source_family": "BigScience Megatron-DeepSpeed", "framework": "deepspeed", "gpu": "A100 SXM 80GB",
                 "gpu_as_published": "A100 SXM 80GB (Jean Zay), 8 per node", "topology": "jean-zay-a100",
                 "flash_attention": False, "sp": False, "launch_blocking": True, "softmax_fusion": "bigscience-2022",
                 "recompute": "full"}
GPT_MODEL = {"hidden_act": "gelu", "dropout": True, "tie_word_embeddings": True}


def precision_of(date: str) -> str:
    """fp16 until 02-27; from 02-28 bf16 with Megatron-DeepSpeed's BF16_Optimizer ("from now on the
    testing is happening with BF16 optimizer that was just written to accumulate gradients in fp32",
    the logbook's "Rebalancing layers")."""
    return "bf16" if date.zfill(5) >= "02-28" else "fp16 (inferred)"


def price(r: dict) -> tuple[float, bool | None, float | None]:
    """The line's predicted step, whether it fits and its peak memory (GiB): a one-configuration
    ablation group, through `validate --ablations`'s own conversion (ablations.group_result)."""
    precision = precision_of(r["date"])
    group = {"id": "bloom-logbook", "source": "BigScience BLOOM-176B pre-training logbook ('chronicles-prequel')",
             "interconnect": "NVLink within node; 4 Omni-Path (OPA) links per node", "seq_len": 2048,
             "precision": precision, "gpu_count": 8 * r["nodes"], "global_batch_seqs": r["gbs"],
             "model": {"name": "BLOOM-candidate", "hidden": r["hidden"], "layers": r["layers"], "heads": r["heads"],
                       "kv_heads": r["heads"], "ffn": 4 * r["hidden"], "vocab": 250880, **GPT_MODEL},
             **LOGBOOK_FACTS, **({"main_grads": "fp32"} if precision == "bf16" else {}),
             "configs": [{"tp": r["tp"], "pp": r["pp"], "dp": r["dp"], "zero_stage": r["zero"], "micro_batch": r["mbs"],
                          "measured": {"step_time_s": r["measured_s"]} if r["measured_s"] else {"status": "OOM"}}]}
    res = group_result(group).configs[0]
    return res.predicted_step_s or 0.0, res.fits, res.peak_gib


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("chronicles", type=Path, help="train/tr11-176B-ml/chronicles-prequel.md")
    ap.add_argument("--all", action="store_true", help="print every line")
    ap.add_argument("--json", action="store_true", help="print the lines as JSON")
    args = ap.parse_args(argv)
    lines, skipped = logbook_rows(args.chronicles.read_text())
    for r in lines:
        step, r["fits"], peak = price(r)
        r["peak_gib"] = None if peak is None else round(peak, 2)
        if r["measured_s"]:
            r["predicted_s"] = round(step, 3)
            r["error_pct"] = round(100 * (r["predicted_s"] / r["measured_s"] - 1), 2)
    if args.json:
        print(json.dumps(lines, indent=1))
        return 0
    rows = [r for r in lines if r["measured_s"]]
    if args.all:
        for r in rows:
            print(f"{r['date']} h{r['hidden']} L{r['layers']} heads {r['heads']:3d} tp{r['tp']} pp{r['pp']} dp{r['dp']} "
                  f"mbs{r['mbs']} gbs {r['gbs']}: measured {r['measured_s']:7.2f} s  predicted {r['predicted_s']:7.2f} s"
                  f"  {r['error_pct']:+6.1f}%")
    errs = sorted(abs(r["error_pct"]) for r in rows)
    worst = max(rows, key=lambda r: abs(r["error_pct"]))
    print(f"BLOOM logbook 02-21..02-28: {len(rows)} lines ({skipped} skipped: single-node probes, inconsistent degrees)  "
          f"median |error| {statistics.median(errs):.1f}%  p90 {errs[int(0.9 * (len(errs) - 1))]:.1f}%  "
          f"worst {worst['error_pct']:+.1f}% ({worst['date']} h{worst['hidden']} heads {worst['heads']} "
          f"tp{worst['tp']} pp{worst['pp']} mbs{worst['mbs']})")
    for title, key in (("by (tp, micro-batch)", lambda r: (r["tp"], r["mbs"])),
                       ("by date (02-25: the PCIe/NUMA fix)", lambda r: "before 02-25" if r["date"] < "02-25" else "02-25 on")):
        groups: dict = defaultdict(list)
        for r in rows:
            groups[key(r)].append(r["error_pct"])
        print(f"  median signed error {title}: " + "  ".join(
            f"{k}: {statistics.median(v):+.1f}% ({len(v)})" for k, v in sorted(groups.items())))
    memory = [r for r in lines if r["memory"] is not None and r["fits"] is not None]
    agree = sum((r["memory"] != "OOM") == r["fits"] for r in memory)
    ratios = sorted(r["memory"] / r["peak_gib"] for r in memory if r["memory"] != "OOM" and r["peak_gib"])
    wrong = [f"{r['date']} h{r['hidden']} L{r['layers']} tp{r['tp']} pp{r['pp']} dp{r['dp']} mbs{r['mbs']} "
             f"({r['memory']}, peak {r['peak_gib']:.1f} GiB)" for r in memory if (r["memory"] != "OOM") != r["fits"]]
    print(f"  memory column (nvidia-smi): OOM/fit {agree}/{len(memory)} ({sum(r['memory'] == 'OOM' for r in memory)} OOM)"
          f"{'  wrong: ' + '; '.join(wrong) if wrong else ''};  measured GB / priced peak GiB: median "
          f"{statistics.median(ratios):.2f} (range {ratios[0]:.2f}-{ratios[-1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

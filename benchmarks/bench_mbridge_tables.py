"""Held-out check: every line of Megatron-Bridge's published performance tables, priced.

    python benchmarks/bench_mbridge_tables.py TABLES.md [TABLES.md ...] [--all] [--json]

The tables are `docs/performance-summary.md` and `docs/performance-summary-archive.md` of
NVIDIA-NeMo/Megatron-Bridge (read them from a checkout; nothing is fetched). The dev file
validation/modern_runs_dev.json holds 48 of their lines, one per configuration (the newest
release); this prints the others, the lines the cost model was never compared with while it was
built. Each line is converted the way `autoshard validate` converts a dev row: the model's shape
from the dev row of the same model (the tables print only degrees), the GPU system from a dev row
of the same system, and the settings the release's recipe ran from autoshard/data/mbridge_recipes.yaml
(looked up by release, model, system, precision and GPU count; Megatron's defaults where no entry
exists, and the line is then marked `no recipe`). A model no Megatron-Bridge dev row has takes its
shape from another source's dev row of the same model (Kimi K2: NeMo AutoModel's). Lines of models
the dev file lacks (DeepSeek-V4, Nemotron 3 Super/Ultra), or that the cost model cannot express
(hybrid Mamba models), are counted and skipped.

It prints the median, p90 and worst |error| over the held-out lines, by model, and (with --all)
every line. About 3 s.

    python benchmarks/bench_mbridge_tables.py TABLES.md [...] --pairs

compares GPU systems instead, free of any fitted factor a pair shares: every two lines of one release,
model label, precision, GPU count, batch and degrees (TP, PP, CP, VP, EP, micro-batch) on two systems
(every line, the dev file's included), their measured speed ratio (tokens/s/GPU) beside the model's.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoshard.validate import Case, evaluate_case, load_runs, run_to_case  # noqa: E402
from autoshard.validate.cases import as_int  # noqa: E402
from autoshard.validate.modern import RECIPE_FIELDS, RECIPE_KNOBS, applied_recipe, gpu_arch, gpu_id, precision_recipe  # noqa: E402

DEV = Path(__file__).resolve().parents[1] / "validation" / "modern_runs_dev.json"


@functools.cache
def recipe_table() -> dict[str, dict[str, Any]]:
    """autoshard/data/mbridge_recipes.yaml `runs`: what Megatron-Bridge's performance recipes ran, per
    published table line (read from the recipes at each release; per-row evidence in
    docs/validation/mbridge_*_recipes_evidence.yaml)."""
    text = resources.files("autoshard.data").joinpath("mbridge_recipes.yaml").read_text(encoding="utf-8")
    return dict(yaml.safe_load(text)["runs"])


def recipe_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """What Megatron-Bridge's performance recipe ran for a line of its published tables (`recipe_table`),
    as recorded: the entry of the row's id, else the entry of the same table line (release, model, GPU
    system, precision and GPU count), else the settings on which every entry of the same release, model
    and GPU system agrees (another GPU count or precision of one recipe). Empty where nothing is known.
    A line states it as its `framework_recipe` field (validation/README.md), which the conversion reads
    (`autoshard.validate.modern.recipe_facts`); the 48 Megatron-Bridge rows of validation/ carry theirs."""
    table = recipe_table()
    own = table.get(str(row.get("id") or ""))
    if own is None:
        other = row.get("other_metrics") or {}
        key = (str(other.get("release") or ""), str(other.get("source_model_label") or row.get("model") or ""),
               str(row.get("gpu") or ""))
        same = [e for e in table.values() if (e["release"], e["model"], e["gpu"]) == key]
        # the entry of the row's own table line (precision as printed and GPU count), where one is recorded
        line = [e for e in same if str(e.get("precision", "")).lower() == str(row.get("precision") or "").lower()
                and e.get("num_gpus") == as_int(row.get("gpu_count"))]
        same = line or same
        own = {k: same[0].get(k) for k in RECIPE_KNOBS
               if same and all(e.get(k) == same[0].get(k) for e in same)} | (
            {"confidence": min((e["confidence"] for e in same), key=("low", "medium", "high").index),
             "source": same[0]["source"]} if same else {})
    return {k: own[k] for k in RECIPE_FIELDS if k in own}


def recipe_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """`recipe_entry` as the conversion applies it (`autoshard.validate.modern.applied_recipe`)."""
    return applied_recipe(recipe_entry(row))


def base_label(label: str) -> str:
    """'Qwen3_235B_a22B (tokendrop)' -> 'Qwen3_235B_a22B': the model whose shape a line uses."""
    return re.sub(r"\s*\(.*?\)\s*", "", label or "").strip()


def model_key(name: str) -> str:
    """'Kimi_K2' (a table's label) and 'Kimi K2' (another source's row) -> 'kimik2'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_tables(text: str) -> list[dict[str, str]]:
    """Every pre-training table line of a Megatron-Bridge performance summary, as a dict of its cells
    plus `release`, `model` and `System` (sections are '## <release> NeMo Container', then either
    '#### Model: X' with a System column or '#### System: X' with a Model column)."""
    release = model = system = None
    header: list[str] | None = None
    pretrain = False
    out = []
    for line in text.splitlines():
        if m := re.match(r"^## (\S+) NeMo Container", line):
            release, header = m.group(1), None
        elif line.startswith("### "):
            pretrain, header = "Pre-Training" in line, None
        elif m := re.match(r"^#### Model: (.+)", line):
            model, system, header = m.group(1).strip(), None, None
        elif m := re.match(r"^#### System: (.+)", line):
            system, model, header = m.group(1).strip(), None, None
        elif line.startswith("|") and release and pretrain:
            cells = _cells(line)
            if cells[0] in ("System", "Model"):
                header = cells
            elif header and not set(line) <= set("|-: "):
                d = dict(zip(header, cells))
                d.update(release=release, model=d.get("Model", model) or "", System=d.get("System", system) or "")
                out.append(d)
    return out


def _num(cell: str | None) -> float | None:
    m = re.match(r"([\d.]+)", re.sub(r"\[.*?\]", "", cell or "").strip())
    return float(m.group(1)) if m else None


def line_to_row(d: dict[str, str], shape: dict, system: dict) -> dict | None:
    """A table line as a modern_runs row (the dev row `shape` of its model gives the shape, the dev
    row `system` of its GPU system the node); None where a degree or the throughput is missing."""
    try:
        n, gbs, mbs, seq = (int(_num(d[k])) for k in ("#-GPUs", "GBS", "MBS", "Sequence Length"))
        tp, pp, cp = (int(_num(d[k])) for k in ("TP", "PP", "CP"))
        ep = int(_num(d.get("EP")) or 1)  # 'n/a' for dense models
    except (KeyError, TypeError):
        return None
    tps = _num(d.get("Tokens / sec / GPU"))
    if not tps:
        return None
    vp = d.get("VP")
    vp = None if vp in (None, "", "n/a", "1") else int(_num(vp))
    precision = re.sub(r"\s*\(.*\)", "", d.get("Precision") or "").strip() or "FP8"  # 25.09: no column
    row = copy.deepcopy(shape)
    # the shape row's architecture fields stay; its run's facts go (the line states its own system and
    # precision; the release recipe, `recipe_entry`, gives overlaps, graphs, dispatcher and recompute
    # as the line's `framework_recipe`)
    for k in ("topology", "precision_recipe", "tp_comm_overlap", "ep_overlap", "cuda_graphs", "moe_dispatcher",
              "moe_capacity_factor", "fp8_params", "measured_peak_memory_gib", "measured_peak_memory_gb",
              "framework_recipe"):
        row.pop(k, None)
    for k in ("gpu", "gpus_per_node", "nvlink_domain_gpus", "interconnect", "topology"):
        if k in system:
            row[k] = system[k]
    # every Megatron-Bridge performance recipe: grad_reduce_in_fp32 false; its FP8 / FP4 mixed-precision
    # configs keep low-precision primary weights (mixed_precision.py bf16_with_fp8_{delayed,current}_scaling_mixed
    # / bf16_with_mxfp8_mixed: fp8_param_gather True; bf16_with_nvfp4_mixed: fp4_param_gather True;
    # subchannel, the blockwise recipe FP8-MX runs on Hopper: False)
    recipe, _ = precision_recipe({"precision": precision}, gpu_arch(gpu_id(system["gpu"]) or ""))
    row.update(framework="megatron", source_family="Megatron-Bridge", main_grads="bf16",
               fp8_params=recipe in ("fp8", "fp8-delayed", "fp8-current", "mxfp8", "nvfp4"))
    if re.search(r"token[-_ ]?drop(?!less)", d["model"].lower()):  # the table's '(tokendrop)' label
        row["moe_capacity_factor"] = 1.0
    row.update(
        id=f"table_{d['release']}_{base_label(d['model'])}_{d['System']}_{precision}_{n}gpu_tp{tp}pp{pp}cp{cp}vp{vp}ep{ep}mbs{mbs}",
        source="NVIDIA NeMo Megatron-Bridge performance summary", source_ref="", notes="",
        gpu_count=n, precision=precision, global_batch_seqs=gbs, global_batch_tokens=gbs * seq, micro_batch=mbs,
        seq_len=seq, tp=tp, pp=pp, cp=cp, ep=ep, dp=n // (tp * pp * cp), vpp_chunks=vp, etp=None, sp=None, zero_stage=None,
        fsdp=bool(_num(d.get("FSDP")) or 0), grad_accum=None, activation_recompute=None, layers_per_virtual_stage=None,
        tokens_per_sec_per_gpu=tps, tokens_per_sec=tps * n, tflops_per_gpu=None, step_time_s=gbs * seq / (tps * n),
        other_metrics={"release": d["release"], "source_model_label": d["model"]})
    entry = recipe_entry(row)  # what the release's recipe ran for this line (autoshard/data/mbridge_recipes.yaml)
    if entry:
        row["framework_recipe"] = entry
    return row


def pair_key(row: Mapping[str, Any]) -> tuple:
    """What two table lines must share to be one configuration on two GPU systems: the release, the
    model's label as printed, precision, GPU count, batch and every degree."""
    other = row.get("other_metrics") or {}
    return (str(other.get("release")), str(other.get("source_model_label")), str(row.get("precision")),
            row.get("gpu_count"), row.get("global_batch_seqs"), row.get("micro_batch"), row.get("seq_len"),
            row.get("tp"), row.get("pp"), row.get("cp"), row.get("vpp_chunks") or 1, row.get("ep"),
            bool(row.get("fsdp")))


def system_pairs(lines: list[tuple[Mapping[str, Any], float, float]]) -> dict[tuple[str, str], list[dict]]:
    """Same-configuration pairs of table lines on two GPU systems. `lines`: (row, measured step s, predicted
    step s). Returns {(system a, system b): [{key, measured, predicted}]} with a before b in name order and
    the ratios step(a) / step(b), the speed of b over a, measured and predicted."""
    by: dict[tuple, dict[str, tuple[float, float]]] = defaultdict(dict)
    for row, measured, predicted in lines:
        by[pair_key(row)][str(row["gpu"])] = (measured, predicted)
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for key, systems in sorted(by.items(), key=lambda kv: str(kv[0])):
        names = sorted(systems)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                (ma, pa), (mb, pb) = systems[a], systems[b]
                out[(a, b)].append({"key": key, "measured": ma / mb, "predicted": pa / pb})
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", help="Megatron-Bridge docs/performance-summary*.md")
    ap.add_argument("--dev", default=str(DEV), help="modern_runs_dev.json (shapes, systems; its lines are left out)")
    ap.add_argument("--all", action="store_true", help="print every held-out line")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pairs", action="store_true",
                    help="same-configuration lines on two GPU systems: measured vs predicted speed ratio")
    a = ap.parse_args()
    runs = load_runs(a.dev)
    dev = [r for r in runs if r["id"].startswith("mbridge_")]
    shapes, systems = {}, {}
    for r in runs:
        systems.setdefault(r["gpu"], r)
    for r in dev:
        shapes.setdefault(model_key(base_label(r["other_metrics"]["source_model_label"])), r)
    for r in runs:  # a model no Megatron-Bridge dev row has (Kimi K2): another source's row (`line_to_row`
        shapes.setdefault(model_key(r["model"]), r)  # replaces its run's degrees, batch and recompute)
    in_dev = {(r["other_metrics"]["release"], base_label(r["other_metrics"]["source_model_label"]), r["gpu"],
               r["gpu_count"], r["tp"], r["pp"], r["ep"], r["micro_batch"]) for r in dev}
    # a dev row whose layout was corrected to its release's recipe (other_metrics.table_layout_as_printed) is
    # still its table line: the line's release, label, system, GPU count and measured throughput name it
    in_dev |= {(r["other_metrics"]["release"], base_label(r["other_metrics"]["source_model_label"]), r["gpu"],
                r["gpu_count"], float(r["tokens_per_sec_per_gpu"])) for r in dev}
    lines = [d for t in a.tables for d in parse_tables(Path(t).read_text(encoding="utf-8"))]
    results, skipped = [], defaultdict(int)
    for d in lines:
        label = base_label(d["model"])
        if model_key(label) not in shapes or d["System"] not in systems:
            skipped[f"no dev row of {label if label not in shapes else d['System']}"] += 1
            continue
        row = line_to_row(d, shapes[model_key(label)], systems[d["System"]])
        if row is None:
            skipped["degrees or throughput missing"] += 1
            continue
        if not a.pairs and ((d["release"], label, row["gpu"], row["gpu_count"], row["tp"], row["pp"], row["ep"],
                             row["micro_batch"]) in in_dev or (d["release"], label, row["gpu"], row["gpu_count"],
                                                                float(row["tokens_per_sec_per_gpu"])) in in_dev):
            continue
        case = run_to_case(row)
        if not isinstance(case, Case):
            skipped[case.reason.split(":")[0][:60]] += 1
            continue
        res = evaluate_case(case)
        if not hasattr(res, "error_pct"):
            skipped["does not evaluate"] += 1
            continue
        results.append({"id": row["id"], "model": label, "error_pct": round(res.error_pct, 1), "plan": res.plan,
                        "recipe": bool(recipe_of(row)), "row": row, "measured_s": res.measured_step_s,
                        "predicted_s": res.predicted_step_s})
    if a.pairs:
        pairs = system_pairs([(r["row"], r["measured_s"], r["predicted_s"]) for r in results])
        for (sa, sb), ps in sorted(pairs.items()):
            ms, pr = [p["measured"] for p in ps], [p["predicted"] for p in ps]
            print(f"{sb} / {sa}: {len(ps)} pairs  measured speed ratio median {statistics.median(ms):.3f} "
                  f"({min(ms):.3f}-{max(ms):.3f})  predicted median {statistics.median(pr):.3f}")
            if a.all:
                for p in ps:
                    print(f"    measured {p['measured']:.3f}  predicted {p['predicted']:.3f}  {p['key']}")
        return 0
    for r in results:
        del r["row"], r["measured_s"], r["predicted_s"]
    if a.json:
        print(json.dumps({"lines": results, "skipped": dict(skipped)}, indent=1))
        return 0
    errs = sorted(abs(r["error_pct"]) for r in results)
    if not errs:
        print("no held-out line converted")
        return 1
    p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]
    print(f"held-out table lines: {len(errs)}  median |error| {statistics.median(errs):.1f}%  p90 {p90:.1f}%  "
          f"worst {errs[-1]:.1f}%  (with a recipe entry: {sum(r['recipe'] for r in results)})")
    by = defaultdict(list)
    for r in results:
        by[r["model"]].append(r["error_pct"])
    for model, es in sorted(by.items()):
        print(f"  {model:<18} {len(es):>3} lines  median |error| {statistics.median(map(abs, es)):5.1f}%  "
              f"median signed {statistics.median(es):+6.1f}%")
    for why, k in sorted(skipped.items()):
        print(f"  skipped {k:>3}: {why}")
    if a.all:
        for r in sorted(results, key=lambda r: r["error_pct"]):
            print(f"  {r['error_pct']:+7.1f}%  {'' if r['recipe'] else '(no recipe) '}{r['id']}  {r['plan'][:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Turn the one-GPU step measurements (validation/measured/*.json) into a runs file `autoshard validate` reads.

    python benchmarks/measured_steps_to_runs.py > validation/measured_steps.json

Each measured configuration becomes one modern-format row (validation/README.md): the model's shape
as the measurement script built it, one H100 SXM or H200 SXM at 700 W (nvidia-smi,
validation/measured/smi*.csv),
the framework it ran under, the recompute mode, the measured median step time and
`measured_peak_memory_gib` (torch.cuda.max_memory_allocated). Failed or out-of-memory
configurations are left out (the OOM is kept in the raw file).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from autoshard.catalog import resolve_gpu_id

HERE = Path(__file__).resolve().parent.parent / "validation" / "measured"
SOURCE_FAMILY = "autoshard GPU measurements"


def _llama_ffn(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """torchtitan FeedForward's width: int(2/3 * 4 * dim), times the multiplier, rounded up to multiple_of."""
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _gpu(doc: dict) -> str:
    """The catalog id of the GPU the raw file names (torch.cuda.get_device_name), through the catalog's
    aliases: 'NVIDIA H100 80GB HBM3' -> h100-sxm."""
    return resolve_gpu_id(doc["machine"]["gpu"])


def _base(run: dict, framework: str, raw: str, gpu: str) -> dict:
    return {
        "source": f"autoshard's own measurement on one {gpu} lent to the project, {raw}",
        "source_ref": f"validation/measured/{raw}; benchmarks/measure_steps.py, benchmarks/measure_mcore_steps.py",
        "source_family": SOURCE_FAMILY, "confidence": "primary", "framework": framework,
        "gpu": gpu, "gpu_count": 1, "gpus_per_node": 1, "nvlink_domain_gpus": 1,
        "interconnect": "one GPU: no communication", "precision": "BF16",
        "tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": None, "etp": None, "sp": False,
        "seq_len": run["seq_len"], "micro_batch": run["micro_batch"], "global_batch_seqs": run["micro_batch"],
        "global_batch_tokens": run["micro_batch"] * run["seq_len"], "grad_accum": 1,
        "step_time_s": round(run["step_s_median"], 5),
        "measured_peak_memory_gib": round(run["max_memory_allocated_gib"], 3),
        "hidden_act": "silu", "tie_word_embeddings": False, "dropout": False,
        "other_metrics": {"params": run["params"],
                          "allocated_between_steps_gib": round(run["allocated_between_steps_gib"], 3),
                          "max_memory_reserved_gib": round(run["max_memory_reserved_gib"], 3)},
    }


def torchtitan_rows(doc: dict, raw: str, tag: str = "") -> list[dict]:
    rows = []
    for run in doc["runs"]:
        if "step_s_median" not in run or not run.get("fsdp", True):
            continue  # the no-FSDP sweep points are not a torchtitan configuration: kept in the raw file
        a = run["model_args"]
        gpu = _gpu(doc)
        row = _base(run, "torchtitan", raw, gpu)
        row.update(id=f"{gpu.split('-')[0]}_torchtitan_{run['model']}_s{run['seq_len']}_mb{run['micro_batch']}_{run['ac_mode']}{tag}",
                   model=run["model"], params_b=round(run["params"] / 1e9, 4), layers=a["n_layers"],
                   hidden=a["dim"], heads=a["n_heads"], vocab=a["vocab_size"], zero_stage=3, fsdp=True,
                   flash_attention=True, activation_recompute=run["ac_mode"] if run["ac_mode"] != "none" else "none",
                   notes="torchtitan 0.2.2 model classes under FSDP2 on a one-rank mesh (bf16 params, fp32 "
                         "reduce), eager (no torch.compile), fused AdamW, random tokens; "
                         f"AC {run['ac_mode']} (selective = per-op SAC)")
        if run["family"] == "llama":
            row.update(kv_heads=a["n_kv_heads"], head_dim=a["dim"] // a["n_heads"],
                       ffn=_llama_ffn(a["dim"], a["multiple_of"], a["ffn_dim_multiplier"]))
        else:
            row.update(kv_heads=a["n_heads"], ffn=a["inter_dim"], moe_experts=64, moe_shared_experts=2,
                       moe_top_k=6, moe_ffn=a["moe_inter_dim"], first_k_dense=a["n_dense_layers"],
                       q_lora_rank=None, kv_lora_rank=a["kv_lora_rank"], qk_nope_head_dim=a["qk_nope_head_dim"],
                       qk_rope_head_dim=a["qk_rope_head_dim"], v_head_dim=a["v_head_dim"], ep=1)
        rows.append(row)
    return rows


def mcore_rows(doc: dict, raw: str, tag: str = "") -> list[dict]:
    rows = []
    for run in doc["runs"]:
        if "step_s_median" not in run:
            continue
        a = run["model_args"]
        gpu = _gpu(doc)
        row = _base(run, "megatron", raw, gpu)
        row.update(id=f"{gpu.split('-')[0]}_mcore_{run['model']}_s{run['seq_len']}_mb{run['micro_batch']}_{run['recompute']}{tag}",
                   model=run["model"], params_b=round(run["params"] / 1e9, 4), layers=a["num_layers"],
                   hidden=a["hidden_size"], heads=a["num_attention_heads"], kv_heads=a["num_query_groups"],
                   ffn=a["ffn_hidden_size"], vocab=a["vocab_size"], zero_stage=1, fsdp=False,
                   flash_attention=False, activation_recompute=run["recompute"],
                   # measure_mcore_steps.py leaves TransformerConfig.masked_softmax_fusion at its default,
                   # False (megatron/core/transformer/transformer_config.py), and megatron-core's wheel
                   # ships no fused softmax kernel (scaled_upper_triang_masked_softmax_cuda comes with
                   # apex / a Megatron-LM build): FusedScaleMaskSoftmax runs torch's fp32 softmax
                   softmax_fusion="off",
                   # nor gradient_accumulation_fusion: ModelParallelConfig's default False (no apex
                   # fused_weight_gradient_mlp_cuda on the machine either)
                   gradient_accumulation_fusion=False,
                   notes="megatron-core 0.16.1 GPTModel, local layer spec (unfused DotProductAttention, no "
                         "Transformer Engine), DDP fp32 grad buffers + distributed optimizer, bf16; "
                         "masked_softmax_fusion False (the TransformerConfig default): softmax in PyTorch, "
                         f"fp32; recompute {run['recompute']}")
        rows.append(row)
    return rows


def main() -> int:
    def read(name: str) -> dict:
        return json.loads((HERE / name).read_text())
    rows = torchtitan_rows(read("steps_torchtitan.json"), "steps_torchtitan.json")
    rows += torchtitan_rows(read("steps_torchtitan_repeat.json"), "steps_torchtitan_repeat.json", "_repeat")
    rows += torchtitan_rows(read("sweep_torchtitan.json"), "sweep_torchtitan.json", "_sweep")
    rows += torchtitan_rows(read("steps_torchtitan_h200.json"), "steps_torchtitan_h200.json")
    rows += torchtitan_rows(read("sweep_torchtitan_h200.json"), "sweep_torchtitan_h200.json", "_sweep")
    rows += mcore_rows(read("steps_mcore.json"), "steps_mcore.json")
    rows += mcore_rows(read("sweep_mcore.json"), "sweep_mcore.json", "_sweep")
    json.dump(rows, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

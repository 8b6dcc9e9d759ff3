"""The facts validation/ablations_dev.json states for the BigScience logbook's groups (validation/README.md,
"Fields that state facts"), for tests that build groups of their own: Megatron-DeepSpeed of Feb 2022 on
Jean Zay's A100s, GPT-style models with BLOOM's 250,880-token vocabulary."""

import json
from pathlib import Path

ABLATIONS = Path(__file__).resolve().parents[1] / "validation" / "ablations_dev.json"
GROUP_FACTS = ("source", "source_family", "framework", "gpu", "topology", "seq_len", "flash_attention", "sp",
               "launch_blocking", "softmax_fusion", "recompute")


def logbook_group(model: dict, gpu_count: int, global_batch_seqs: int = 2048, precision: str = "fp16",
                  group_id: str = "bloom-0220-187b-320gpu-mbs") -> dict:
    """A group with the logbook's facts as the project's copy states them, for `model` (hidden, layers,
    heads; ffn 4 h, BLOOM's vocabulary and the GPT architecture where not given). bf16 runs went through
    Megatron-DeepSpeed's BF16_Optimizer, which accumulates and reduces the gradients in fp32."""
    (src,) = [g for g in json.loads(ABLATIONS.read_text()) if g["id"] == group_id]
    group = {k: src[k] for k in GROUP_FACTS if k in src}
    m = {"vocab": 250880, "ffn": 4 * model["hidden"], "kv_heads": model.get("heads"), "hidden_act": "gelu",
         "dropout": True, "tie_word_embeddings": True} | model
    group.update(id="logbook-test", model=m, gpu_count=gpu_count, global_batch_seqs=global_batch_seqs,
                 precision=precision)
    if "bf16" in precision:
        group["main_grads"] = "fp32"
    return group


def logbook_model(group_id: str) -> dict:
    """The model of one of the project's logbook groups (its filled layers, heads, ffn and vocab)."""
    (src,) = [g for g in json.loads(ABLATIONS.read_text()) if g["id"] == group_id]
    return dict(src["model"])

"""Problems of published measurements that more than one test module checks against."""

from autoshard import load_problem
from autoshard.spec import Problem

# NeMo's CUDA-graph ablation (NVIDIA NeMo docs/source/features/optimizations/cudagraphs.md): GPT-3 20B on 16
# GH200, TP 4, micro-batch 2, FP8, 750 -> 836 TFLOP/s with graphs, a step 0.897x as long. Its global batch
# is not stated; the tests use 256 sequences.
GPT3_20B = {"name": "gpt3-20b", "num_hidden_layers": 44, "hidden_size": 6144, "intermediate_size": 24576,
            "num_attention_heads": 48, "vocab_size": 50257, "hidden_act": "gelu", "model_type": "gpt2"}
NEMO_GRAPHS_STEP_RATIO = 750 / 836


def nemo_cuda_graph_ablation() -> Problem:
    """The ablation's problem (plans: tp 4, dp 4, micro-batch 2)."""
    return load_problem({"model": GPT3_20B, "framework": "megatron",
                         "training": {"seq_len": 2048, "global_batch_size": 256, "precision": "fp8"},
                         "cluster": {"gpu": "gh200", "num_gpus": 16}})

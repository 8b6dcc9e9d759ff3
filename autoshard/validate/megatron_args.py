"""Megatron-LM launch arguments -> a Problem and a Plan (the functional tests' memory check).

Megatron-LM's functional tests (tests/functional_tests/test_cases/gpt/<case>/model_config.yaml) state
every argument of a run beside its measured `mem-max-allocated-bytes` (golden_values_dev_dgx_h100.json,
`torch.cuda.memory_stats()["allocated_bytes.all.peak"]` logged by the last rank, which holds the output
layer and the loss). `validation/megatron_functional_memory.json` keeps those arguments and the largest
logged peak per case; `problem_and_plan` reads the arguments as Megatron's own defaults read them
(megatron/training/arguments.py), nothing from a case's name. `benchmarks/bench_megatron_memory.py`
prints the error per case and regenerates the file from a Megatron-LM checkout.

Read so (Megatron's defaults in brackets):

=================================================  ==========================================================
argument                                           autoshard
=================================================  ==========================================================
--num-layers, --hidden-size, --num-attention-heads  num_hidden_layers, hidden_size, num_attention_heads
--ffn-hidden-size [4 h; --swiglu: int(8h/3/64)*64]  intermediate_size (arguments.py validate_args)
--group-query-attention --num-query-groups          num_key_value_heads [heads]
--swiglu                                            hidden_act silu (gated), else gelu
--vocab-size [GPT-2 BPE: 50,257]                    padded to a multiple of --make-vocab-size-divisible-by
                                                    [128] x TP (training/tokenizer _vocab_size_with_padding)
--untie-embeddings-and-output-weights               tie_word_embeddings false [tied]
--qk-layernorm                                      qk_layernorm
--position-embedding-type [learned_absolute]        learned_position_embeddings = --max-position-embeddings
                                                    (learned_absolute), else 0
--hidden-dropout / --attention-dropout [0.1]        dropout: either above 0
--multi-latent-attention, --q-lora-rank, ...        the MLA dimensions
--fp16 / --bf16; --fp8-format with --fp8-recipe    precision (fp8 tensorwise -> fp8-current, delayed ->
                                                    fp8-delayed, mxfp8, blockwise); --fp8-param-gather
--transformer-impl local, --attention-backend      flash_attention false (the scores materialized)
  unfused
--tensor/pipeline/context-model-parallel-size       tp, pp, cp; dp = world / (tp pp cp)
--num-layers-per-virtual-pipeline-stage,            vpp, schedule interleaved
  --num-virtual-stages-per-pipeline-rank
--decoder-first/last-pipeline-num-layers,           stage_layers
  --account-for-embedding/loss-in-pipeline-split
--sequence-parallel                                 sequence_parallel [off]
--use-distributed-optimizer [off: DDP]              zero_stage 1 [0]; --use-megatron-fsdp: 3
--num-distributed-optimizer-instances               dp_replicate
--overlap-grad-reduce / --overlap-param-gather      overlap_grad_reduce / overlap_param_gather [off]
--recompute-granularity full / selective            recompute
--tp-comm-overlap                                   tp_comm_overlap [off]
--no-create-attention-mask-in-dataloader           training.attention_mask_in_batch false [true]
--cross-entropy-loss-fusion                         training.cross_entropy_fusion [off]
--defer-embedding-wgrad-compute                     training.defer_embedding_wgrad [off]
--no-gradient-accumulation-fusion                   training.gradient_accumulation_fusion false [true]
=================================================  ==========================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

GPT2_BPE_VOCAB = 50257  # megatron/training/tokenizer: GPT2BPETokenizer over the GPT-2 vocab.json
MAKE_VOCAB_DIVISIBLE_BY = 128  # arguments.py --make-vocab-size-divisible-by default
DEFAULT_DROPOUT = 0.1  # arguments.py --hidden-dropout / --attention-dropout defaults
FP8_RECIPES = {"tensorwise": "fp8-current", "delayed": "fp8-delayed", "mxfp8": "mxfp8",
               "blockwise": "fp8-blockwise"}  # arguments.py --fp8-recipe choices (default delayed)


def _on(args: Mapping[str, Any], name: str) -> bool:
    v = args.get(name, False)
    return v is True or (isinstance(v, str) and v.lower() == "true")


def padded_vocab(args: Mapping[str, Any]) -> int:
    """Megatron's padded vocabulary (tokenizer _vocab_size_with_padding): a multiple of
    --make-vocab-size-divisible-by x TP."""
    vocab = int(args.get("--vocab-size") or GPT2_BPE_VOCAB)
    mult = int(args.get("--make-vocab-size-divisible-by", MAKE_VOCAB_DIVISIBLE_BY)) * int(
        args.get("--tensor-model-parallel-size", 1))
    return -(-vocab // mult) * mult


def model_of(args: Mapping[str, Any]) -> dict[str, Any]:
    h = int(args["--hidden-size"])
    swiglu = _on(args, "--swiglu")
    ffn = args.get("--ffn-hidden-size") or (int(4 * h * 2 / 3 / 64) * 64 if swiglu else 4 * h)
    heads = int(args["--num-attention-heads"])
    kv = int(args.get("--num-query-groups", heads)) if _on(args, "--group-query-attention") else heads
    drop = max(float(args.get("--hidden-dropout", DEFAULT_DROPOUT)), float(args.get("--attention-dropout", DEFAULT_DROPOUT)))
    model: dict[str, Any] = {
        "name": "megatron-gpt", "num_hidden_layers": int(args["--num-layers"]), "hidden_size": h,
        "intermediate_size": int(ffn), "num_attention_heads": heads, "num_key_value_heads": kv,
        "vocab_size": padded_vocab(args), "hidden_act": "silu" if swiglu else "gelu",
        "tie_word_embeddings": not _on(args, "--untie-embeddings-and-output-weights"), "dropout": drop > 0}
    if _on(args, "--multi-latent-attention"):
        model.update(q_lora_rank=args.get("--q-lora-rank"), kv_lora_rank=int(args.get("--kv-lora-rank", 32)),
                     qk_nope_head_dim=int(args.get("--qk-head-dim", 128)),
                     qk_rope_head_dim=int(args.get("--qk-pos-emb-head-dim", 64)),
                     v_head_dim=int(args.get("--v-head-dim", 128)))
    if _on(args, "--qk-layernorm"):
        model["qk_layernorm"] = True
    if args.get("--position-embedding-type", "learned_absolute") == "learned_absolute":
        model["learned_position_embeddings"] = int(args.get("--max-position-embeddings") or args["--seq-length"])
    if "--kv-channels" in args:
        model["head_dim"] = int(args["--kv-channels"])
    return model


def precision_of(args: Mapping[str, Any]) -> str:
    if args.get("--fp8-format"):
        return FP8_RECIPES.get(str(args.get("--fp8-recipe", "delayed")), "fp8")
    return "fp16" if _on(args, "--fp16") else "bf16"


def stage_layers_of(args: Mapping[str, Any], pp: int, vpp: int) -> list[int] | None:
    """Layers of every virtual stage where the arguments make them uneven (pipeline_parallel/utils,
    transformer_block get_num_layers_to_build), else None (even)."""
    layers = int(args["--num-layers"])
    if _on(args, "--account-for-embedding-in-pipeline-split") or _on(args, "--account-for-loss-in-pipeline-split"):
        emb, loss = _on(args, "--account-for-embedding-in-pipeline-split"), _on(args, "--account-for-loss-in-pipeline-split")
        slots = layers + emb + loss
        per = slots // (pp * vpp)
        out = [per] * (pp * vpp)
        if emb:
            out[0] -= 1
        if loss:
            out[-1] -= 1
        return out
    first, last = args.get("--decoder-first-pipeline-num-layers"), args.get("--decoder-last-pipeline-num-layers")
    if first is None and last is None:
        return None
    first, last = int(first or 0), int(last or 0)
    middle = pp - (first > 0) - (last > 0)
    rest = layers - first - last
    mid = [rest // middle] * middle if middle else []
    return ([first] if first else []) + mid + ([last] if last else [])


def problem_and_plan(args: Mapping[str, Any], num_gpus: int, gpu: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Problem and Plan (as dicts) a Megatron-LM run of these arguments on `num_gpus` GPUs is."""
    tp = int(args.get("--tensor-model-parallel-size", 1))
    pp = int(args.get("--pipeline-model-parallel-size", 1))
    cp = int(args.get("--context-parallel-size", 1))
    dp = num_gpus // (tp * pp * cp)
    layers = int(args["--num-layers"])
    vpp = 1
    if args.get("--num-layers-per-virtual-pipeline-stage"):
        vpp = layers // pp // int(args["--num-layers-per-virtual-pipeline-stage"])
    elif args.get("--num-virtual-stages-per-pipeline-rank"):
        vpp = int(args["--num-virtual-stages-per-pipeline-rank"])
    flash = not (args.get("--transformer-impl") == "local" or args.get("--attention-backend") == "unfused")
    training: dict[str, Any] = {
        "seq_len": int(args["--seq-length"]), "global_batch_size": int(args["--global-batch-size"]),
        "precision": precision_of(args), "flash_attention": flash,
        "fp8_params": bool(args.get("--fp8-format")) and _on(args, "--fp8-param-gather")}
    if not _on(args, "--no-create-attention-mask-in-dataloader"):  # GPTDatasetConfig.create_attention_mask
        training["attention_mask_in_batch"] = True
    if _on(args, "--cross-entropy-loss-fusion"):
        training["cross_entropy_fusion"] = True
    if _on(args, "--no-gradient-accumulation-fusion"):
        training["gradient_accumulation_fusion"] = False
    if _on(args, "--defer-embedding-wgrad-compute"):
        training["defer_embedding_wgrad"] = True
        training["wgrad_deferral_limit"] = int(args.get("--wgrad-deferral-limit", 0))
    zero = 3 if _on(args, "--use-megatron-fsdp") else (1 if _on(args, "--use-distributed-optimizer") else 0)
    plan: dict[str, Any] = {
        "tp": tp, "pp": pp, "cp": cp, "dp": dp, "vpp": vpp, "schedule": "interleaved" if vpp > 1 else "1f1b",
        "micro_batch_size": int(args["--micro-batch-size"]), "zero_stage": zero,
        "sequence_parallel": _on(args, "--sequence-parallel"),
        "overlap_grad_reduce": _on(args, "--overlap-grad-reduce"),
        "overlap_param_gather": _on(args, "--overlap-param-gather"),
        "tp_comm_overlap": _on(args, "--tp-comm-overlap")}
    if zero and args.get("--num-distributed-optimizer-instances"):
        plan["dp_replicate"] = int(args["--num-distributed-optimizer-instances"])
    gran = args.get("--recompute-granularity")
    if gran in ("full", "selective"):
        plan["recompute"] = gran
    if (stages := stage_layers_of(args, pp, vpp)) is not None:
        plan["stage_layers"] = stages
    if not math.isfinite(dp) or dp < 1 or dp * tp * pp * cp != num_gpus:
        raise ValueError(f"tp {tp} x pp {pp} x cp {cp} does not divide {num_gpus} GPUs")
    problem = {"model": model_of(args), "training": training,
               "cluster": {"gpu": gpu, "num_gpus": num_gpus}, "framework": "megatron"}
    return problem, plan

"""Plans for the launcher suite: every bundled solution and further plans covering interleaving,
uneven stages, CP, EP/ETP folding, SP, recompute variants, ZeRO/FSDP, FP8 and MoE models.

Each launcher module imports the launcher's own code and skips when it is not installed
(`pip install -e '.[launchers]'`, as .ci/run does)."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import numpy as np

from autoshard import load_plan, load_problem
from autoshard.cost import Config
from autoshard.export import export_plan
from autoshard.spec import Plan, Problem

REPO = Path(__file__).resolve().parents[2]


def _problem(model: str | dict, num_gpus: int, gbs: int, seq: int = 4096, gpu: str = "h100-sxm", **training) -> Problem:
    return load_problem({"model": model, "cluster": {"gpu": gpu, "num_gpus": num_gpus},
                         "training": {"seq_len": seq, "global_batch_size": gbs, **training}})


LLAMA = _problem("llama3-70b", 640, 1280)
# priced for a stack that takes any per-layer recompute list (`search: {recompute_layout: per_layer}`)
LLAMA_LISTS = LLAMA.model_copy(update={"search": LLAMA.search.model_copy(update={"recompute_layout": "per_layer"})})
FULL2 = (["full"] * 2 + ["none"] * 18) * 4  # full recompute on the first 2 layers of each of 4 stages
IRREGULAR = ["full"] * 3 + ["none"] * 17 + ["full"] + ["none"] * 19 + ["selective"] * 5 + ["none"] * 35
UNEVEN_VPP = [8, 10, 10, 10, 10, 11, 11, 10]
# --recompute-method block --recompute-num-layers 9 over UNEVEN_VPP: the 8-layer chunk recomputes all 8
BLOCK9_UNEVEN_VPP = [m for n in UNEVEN_VPP for m in ["full"] * min(9, n) + ["none"] * (n - min(9, n))]
DSV3_SPLIT = [7, 8, 8, 8, 8, 8, 8, 6]
DSV3 = _problem("deepseek-v3", 640, 1280)
DSV3_LISTS = DSV3.model_copy(update={"search": DSV3.search.model_copy(update={"recompute_layout": "per_layer"})})
# The shape of plan: full recompute where the deepest pipeline queue is (stage 0 all, stage 1
# half), none elsewhere; a per-layer stack runs it, Megatron does not (refused, never exported as block).
DSV3_STAGE0 = ["full"] * 7 + ["full"] * 4 + ["none"] * 4 + ["none"] * 46
DSV3_BLOCK2 = [m for n in DSV3_SPLIT for m in ["full", "full"] + ["none"] * (n - 2)]

FURTHER: dict[str, tuple[Problem, Plan]] = {
    "interleaved-vpp2": (LLAMA, Plan(tp=8, pp=4, vpp=2, schedule="interleaved")),
    "uneven-first-last": (LLAMA, Plan(tp=8, pp=4, stage_layers=[18, 22, 22, 18])),
    "uneven-layout": (LLAMA, Plan(tp=8, pp=4, stage_layers=[17, 22, 23, 18])),
    "uneven-interleaved": (LLAMA, Plan(tp=8, pp=4, vpp=2, schedule="interleaved",
                                       stage_layers=[8, 10, 10, 10, 10, 11, 11, 10])),
    "cp2-fp8": (_problem("llama3-70b", 640, 1280, precision="fp8"), Plan(tp=8, cp=2, pp=4)),
    "zero3-fsdp-full-recompute": (LLAMA, Plan(tp=8, zero_stage=3, micro_batch_size=2, recompute="full")),
    "zero2-fsdp-selective": (LLAMA, Plan(tp=8, pp=4, zero_stage=2, recompute="selective")),
    "recompute-block-prefix": (LLAMA, Plan(tp=8, pp=4, recompute=FULL2)),
    "recompute-irregular": (LLAMA_LISTS, Plan(tp=8, pp=4, recompute=IRREGULAR)),
    "recompute-block-uneven-interleaved": (LLAMA, Plan(tp=8, pp=4, vpp=2, schedule="interleaved",
                                                       stage_layers=UNEVEN_VPP, recompute=BLOCK9_UNEVEN_VPP)),
    "recompute-offload-first-layers": (_problem("llama3-8b", 64, 256), Plan(tp=2, recompute=["offload"] * 12
                                                                             + ["none"] * 20)),
    "recompute-modules-moe": (_problem("qwen3-30b-a3b", 16, 512), Plan(tp=1, pp=2, ep=8, etp=1,
                                                                       recompute="layernorm+moe_act")),
    "deepseek-v3-block-recompute": (DSV3, Plan(tp=2, pp=8, ep=8, stage_layers=DSV3_SPLIT, recompute=DSV3_BLOCK2)),
    "deepseek-v3-per-layer-recompute": (DSV3_LISTS, Plan(tp=2, pp=8, ep=8, stage_layers=DSV3_SPLIT,
                                                         recompute=DSV3_STAGE0)),
    "no-sp-cp-pp-first-order": (LLAMA, Plan(tp=4, sequence_parallel=False, cp=2, pp=2,
                                            placement="tp-cp-ep-pp-dp")),
    "pp-before-dp-order": (LLAMA, Plan(tp=8, pp=4, placement="tp-cp-ep-pp-dp")),
    "mixtral-ep-in-dp": (_problem("mixtral-8x7b", 64, 256), Plan(tp=2, pp=2, ep=4)),
    "mixtral-folded-etp1": (_problem("mixtral-8x7b", 64, 256), Plan(tp=4, ep=8, etp=1)),
    "mixtral-cp-ep": (_problem("mixtral-8x7b", 64, 256), Plan(tp=2, cp=2, ep=4)),
    "mixtral-overlaps": (_problem("mixtral-8x7b", 64, 256),
                         Plan(tp=2, ep=4, tp_comm_overlap=True, ep_overlap=True)),
    "deepseek-v3-uneven-selective": (_problem("deepseek-v3", 640, 1280),
                                     Plan(tp=2, pp=8, ep=8, stage_layers=[7, 8, 8, 8, 8, 8, 8, 6],
                                          recompute="selective")),
    "deepseek-v3-default-split": (_problem("deepseek-v3", 640, 1280), Plan(pp=8, ep=16)),
    "long-context-hierarchical-cp": (_problem("llama3-70b", 512, 64, seq=131072),
                                     Plan(tp=2, cp=16, pp=4, recompute="full", cp_comm_type="a2a+p2p")),
    "deepseek-v3-deepep": (_problem("deepseek-v3", 640, 1280), Plan(pp=8, ep=16, moe_dispatcher="deepep")),
    "llama3-8b-bf16-main-grads": (_problem("llama3-8b", 64, 256, main_grads="bf16"), Plan(tp=2, pp=2, zero_stage=1)),
    "llama3-70b-fp8-params": (_problem("llama3-70b", 64, 128, precision="fp8-current", fp8_params=True, main_grads="bf16"),
                              Plan(tp=4, pp=8, vpp=5, schedule="interleaved")),
    "llama3-70b-nvfp4-params": (_problem("llama3-70b", 64, 128, gpu="b200", precision="nvfp4", fp8_params=True),
                                Plan(tp=2, pp=4)),
    "gpt-oss-style-sliding-window": (
        Problem(model={"name": "gpt-oss-style", "num_hidden_layers": 8, "hidden_size": 2880, "intermediate_size": 11520,
                       "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088,
                       "sliding_window": 128, "sliding_window_layers": 0.5},
                cluster={"gpu": "h100-sxm", "num_gpus": 16}, training={"seq_len": 4096, "global_batch_size": 64}),
        Plan(tp=2, pp=2)),
    "llama3-8b-fp32-main-grads": (_problem("llama3-8b", 64, 256, main_grads="fp32"), Plan(tp=2, pp=2, zero_stage=1)),
    "qwen3-30b-token-drop": (_problem("qwen3-30b-a3b", 16, 512, moe_capacity_factor=1.25),
                             Plan(tp=1, pp=2, ep=8, etp=1)),
    "qwen3-hybridep-cuda-graphs": (_problem("qwen3-235b-a22b", 512, 1024),
                                   Plan(tp=1, pp=8, ep=16, moe_dispatcher="hybridep", cuda_graphs=True)),
    "qwen3-folded-interleaved": (_problem("qwen3-235b-a22b", 512, 1024),
                                 Plan(tp=4, pp=4, vpp=2, schedule="interleaved", ep=16, etp=1,
                                      stage_layers=[11, 12, 12, 12, 12, 12, 12, 11])),
    # expert TP different from TP (MoE parallel folding): experts over etp x ep x edp of each stage
    "qwen3-etp2-tp1": (_problem("qwen3-30b-a3b", 64, 512), Plan(tp=1, pp=2, ep=8, etp=2)),
    "qwen3-folded-cp-pp-before-dp": (_problem("qwen3-30b-a3b", 64, 512),
                                     Plan(tp=4, cp=2, pp=2, ep=8, etp=1, placement="tp-cp-ep-pp-dp")),
    # presets with shape overrides: not the preset's torchtitan flavor. Registrable in torchtitan's llama3
    # (head_dim = dim / heads): a custom flavor; FFN 512 < int(2 * 4 * 256 / 3) = 682 takes the
    # ffn_dim_multiplier path. The override (6 layers, width 256, the preset's 32 x 128 heads)
    # is no llama3 shape: an unregistered flavor name and a warning, never the 8B flavor.
    "llama3-8b-override-registrable": (
        _problem({"preset": "llama3-8b", "num_hidden_layers": 6, "hidden_size": 256, "num_attention_heads": 16,
                  "num_key_value_heads": 4, "head_dim": 16, "intermediate_size": 512}, 8, 64, seq=2048),
        Plan(tp=2, pp=2)),
    "llama3-8b-override-width-only": (
        _problem({"preset": "llama3-8b", "num_hidden_layers": 6, "hidden_size": 256}, 8, 64, seq=2048),
        Plan(tp=2, pp=2)),
    "llama3-8b-pure-dp": (_problem("llama3-8b", 64, 512), Plan(zero_stage=0, micro_batch_size=2)),
    "llama3-8b-zero-bubble": (_problem("llama3-8b", 64, 512), Plan(tp=2, pp=4, schedule="zero_bubble")),
    # precision recipes (autoshard/data/precisions.yaml), on GPUs that run them (gpus.yaml)
    "fp8-current": (_problem("llama3-70b", 640, 1280, precision="fp8-current"), Plan(tp=8, pp=4)),
    "fp8-rowwise": (_problem("llama3-70b", 640, 1280, precision="fp8-rowwise"), Plan(tp=8, pp=4)),
    "fp8-blockwise-moe": (_problem("deepseek-v3", 640, 1280, precision="fp8-blockwise"), Plan(pp=8, ep=16)),
    "mxfp8-b200": (_problem("llama3-70b", 512, 1024, gpu="b200", precision="mxfp8"), Plan(tp=8, pp=2)),
    "nvfp4-b200": (_problem("llama3-70b", 512, 1024, gpu="b200", precision="nvfp4"), Plan(tp=4, pp=2)),
    "fp16-a100": (_problem("llama3-8b", 64, 512, gpu="a100-sxm-80gb", precision="fp16"), Plan(tp=2)),
    # model knobs (issue 29 part 2): first / last blocks in BF16, MTP with the all-gather dispatcher,
    # packed documents, a hybrid Mamba2 / attention model
    "fp8-current-bf16-ends": (_problem("llama3-70b", 640, 1280, precision="fp8-current", bf16_layers_at_start=2,
                                       bf16_layers_at_end=4), Plan(tp=8, pp=4)),
    "deepseek-v3-mtp-allgather": (_problem({"preset": "deepseek-v3", "num_nextn_predict_layers": 1}, 640, 1280),
                                  Plan(tp=2, pp=8, ep=8, stage_layers=DSV3_SPLIT, moe_dispatcher="allgather")),
    "llama3-8b-packed-documents": (_problem("llama3-8b", 64, 256, mean_document_tokens=1024), Plan(tp=2, pp=2)),
    "nemotron-h-8b-hybrid": (_problem({"hf_config": str(REPO / "tests" / "data" / "hf" / "Nemotron-H-8B-Base-8K.json")},
                                      16, 64, seq=8192), Plan(tp=2, pp=2, stage_layers=[26, 26])),
}


def bundled() -> dict[str, tuple[Problem, Plan]]:
    out = {}
    for sol in sorted((REPO / "solutions").glob("*.json")):
        out["bundled:" + sol.stem] = (load_problem(REPO / "problems" / f"{sol.stem}.yaml"), load_plan(sol))
    return out


@functools.cache
def all_cases() -> dict[str, tuple[Problem, Plan]]:
    return {**bundled(), **FURTHER}


CASE_IDS = sorted([*(f"bundled:{p.stem}" for p in (REPO / "solutions").glob("*.json")), *FURTHER])
# Plans whose recompute list Megatron cannot run (layouts.py megatron_reason): the Megatron
# export refuses them (InputError, exit 2 on the CLI) rather than write another plan's flags.
MEGATRON_REFUSED = {"recompute-irregular", "deepseek-v3-per-layer-recompute"}
MEGATRON_CASES = [c for c in CASE_IDS if c not in MEGATRON_REFUSED]


@functools.cache
def exported(case: str, fmt: str):
    prob, plan = all_cases()[case]
    return export_plan(prob, plan, fmt)


def full_plan(case: str) -> tuple[Problem, Plan, int]:
    prob, plan = all_cases()[case]
    dp = prob.cluster.num_gpus // (plan.tp * plan.pp * plan.cp)
    return prob, plan.model_copy(update={"dp": dp}), dp


def plan_groups(plan: Plan, dp: int, axes: tuple[str, ...]) -> list[list[int]]:
    """The plan's own process groups (autoshard.spec.Plan: placement innermost first, EP carved out of
    DP; under MoE parallel folding no EP axis of its own): ranks that differ only in the coordinates
    of `axes`, sorted."""
    folded = plan.ep > 1 and Config.of(plan, dp).folded
    sizes = {"tp": plan.tp, "cp": plan.cp, "ep": 1 if folded else plan.ep, "dp": dp if folded else dp // plan.ep,
             "pp": plan.pp}
    order = plan.axes
    world = int(np.prod([sizes[a] for a in order]))
    coords = np.array(list(itertools.product(*[range(sizes[a]) for a in reversed(order)])))[:, ::-1]
    strides = np.cumprod([1] + [sizes[a] for a in order[:-1]])
    ranks = coords @ strides
    assert sorted(ranks.tolist()) == list(range(world))
    keep = [i for i, a in enumerate(order) if a not in axes]
    groups: dict[tuple, list[int]] = {}
    for c, r in zip(coords, ranks):
        groups.setdefault(tuple(c[keep]), []).append(int(r))
    return sorted(sorted(g) for g in groups.values())

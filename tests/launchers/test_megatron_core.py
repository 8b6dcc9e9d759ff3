"""Megatron exports against megatron-core 0.16.1's own code (CPU, fake process group).

- every flag is a Megatron-LM flag: a `TransformerConfig` / `MLATransformerConfig` /
  `DistributedDataParallelConfig` field under Megatron's own naming rule (`--field-name`,
  megatron/training/argument_utils.py) or a listed renamed / training flag;
- `TransformerConfig(**fields from the flags)` runs its own validation (`__post_init__`) and
  describes the planned model (shape, MoE layer pattern, router, MTP, norms, rotary base, dropout);
- `parallel_state.initialize_model_parallel` accepts the degrees and rank order under a fake process
  group of the real world size, and its rank lists per axis (`RankGenerator`) equal the plan's;
- `get_num_layers_to_build` / `get_transformer_layer_offset` give every rank the planned layers;
- the recompute flags select exactly the planned layers: megatron-core's own
  `TransformerBlock._checkpointed_forward` run on a stand-in block per virtual stage records which
  layers run inside its checkpoint; selective modules apply to every layer; TE offloads the first
  `--cpu-offloading-num-layers`; plans Megatron cannot run are refused (MEGATRON_REFUSED), and a
  brute force over small models shows the planner's predicate accepts exactly the lists Megatron's
  settings produce;
- `ConstantNumMicroBatchesCalculator` gives the planned number of micro-batches.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import re
import shlex
import types
import warnings
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core / torch not installed (pip install -e '.[launchers]')", allow_module_level=True)

from autoshard.export import model_family  # noqa: E402
from autoshard.topology import _expert_groups  # noqa: E402

from autoshard import evaluate  # noqa: E402
from autoshard.errors import InputError  # noqa: E402
from autoshard.export import export_plan  # noqa: E402
from autoshard.layouts import megatron_recompute  # noqa: E402
from autoshard.spec import canonical_recompute  # noqa: E402

from launcher_cases import (  # noqa: E402
    MEGATRON_CASES, MEGATRON_REFUSED, all_cases, exported, full_plan, plan_groups)

# Megatron-LM flags whose dest differs from the config field (megatron/training/arguments.py and
# argument_utils.py at d98e8a64dd).
RENAMES = {
    "--num-experts": "num_moe_experts",
    "--norm-epsilon": "layernorm_epsilon",
    "--fp8-format": "fp8",
    "--fp4-format": "fp4",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
}
# Flags Megatron-LM's training scripts read outside these configs (megatron/training/arguments.py,
# d98e8a64dd), and how the tests use them.
TRAINING_FLAGS = {
    "--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings", "--vocab-size",
    "--ckpt-format", "--group-query-attention", "--untie-embeddings-and-output-weights",
    "--position-embedding-type", "--use-tp-pp-dp-mapping", "--swiglu", "--disable-bias-linear",
    "--num-layers-per-virtual-pipeline-stage", "--multi-latent-attention", "--no-check-for-nan-in-loss-and-grad",
    "--grad-reduce-in-bf16",  # arguments.py: accumulate_allreduce_grads_in_fp32 False -> DDP grad_reduce_in_fp32 False
    "--fp4-param-gather",  # DistributedDataParallelConfig.fp4_param_gather at d98e8a64dd; newer than megatron-core 0.16.1
    "--squared-relu",  # arguments.py: activation_func squared_relu (non-gated), as core_transformer_config_from_args
    "--dataloader-inter-document-masking",  # arguments.py: the dataloader returns cu_seqlens per document (THD)
    "--hybrid-layer-pattern",  # arguments.py: a hybrid model's blocks (M, *, -, E), `|` at stage boundaries
    "--no-create-attention-mask-in-dataloader",  # arguments.py: no [b, 1, s, s] mask in the batch (as priced)
    "--no-gradient-accumulation-fusion",  # arguments.py: gradient_accumulation_fusion False (ModelParallelConfig's default)
}
PRECISIONS = yaml.safe_load((Path(__file__).resolve().parents[2] / "autoshard" / "data" / "precisions.yaml")
                            .read_text()) or {}


@pytest.fixture(scope="module", autouse=True)
def _launcher():
    """Import torch and megatron-core when the first test of this module runs, not at collection:
    the rest of the suite (which forks workers) runs before them in a process without their threads."""
    global torch, dist, ps, DistributedDataParallelConfig, Fp4Recipe, Fp8Recipe  # noqa: PLW0603
    global ConstantNumMicroBatchesCalculator, MLATransformerConfig, TransformerConfig  # noqa: PLW0603
    global get_num_layers_to_build, get_transformer_layer_offset, FakeStore, DDP_FIELDS, TC_FIELDS, _HAS_TE  # noqa: PLW0603
    global OPT_FIELDS  # noqa: PLW0603
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.enums import Fp4Recipe, Fp8Recipe
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    from torch.testing._internal.distributed.fake_pg import FakeStore
    DDP_FIELDS = {f.name for f in fields(DistributedDataParallelConfig)}
    OPT_FIELDS = {f.name for f in fields(OptimizerConfig)}  # --optimizer-cpu-offload, --use-precision-aware-optimizer
    TC_FIELDS = {f.name for f in fields(MLATransformerConfig)}
    _HAS_TE = importlib.util.find_spec("transformer_engine") is not None
    yield


def flags_of(text: str) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {}
    for line in text.splitlines():
        if line.startswith("--"):
            tok = shlex.split(line.removesuffix(" \\"))
            out[tok[0]] = tok[1] if len(tok) == 2 else [_value(t) for t in tok[1:]] if len(tok) > 2 else True
    return out


def _value(v: str | bool | list):
    if v is True or isinstance(v, list):
        return v
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def megatron_config(f: dict):
    """The TransformerConfig Megatron-LM builds from these flags (core_transformer_config_from_args)."""
    kw: dict = {}
    for flag, value in f.items():
        if flag in TRAINING_FLAGS:
            continue
        name = RENAMES.get(flag, flag[2:].replace("-", "_"))
        if (name in DDP_FIELDS or name in OPT_FIELDS) and name not in TC_FIELDS:
            continue
        assert name in TC_FIELDS, f"{flag} is no Megatron config field"
        kw[name] = _value(value)
    if kw.get("cpu_offloading_num_layers", 0) > 0:  # arguments.py validate_args: N > 0 turns cpu_offloading on
        kw["cpu_offloading"] = True
    if isinstance(kw.get("recompute_modules"), str):  # arguments.py nargs='*': a list even of one
        kw["recompute_modules"] = [kw["recompute_modules"]]
    if "window_size" in kw:  # arguments.py tuple_type: "left,right" -> (left, right)
        kw["window_size"] = tuple(int(x) for x in str(kw["window_size"]).split(","))
    if "moe_layer_freq" in kw:  # arguments.py moe_freq_type: eval of a Python list expression
        kw["moe_layer_freq"] = eval(str(kw["moe_layer_freq"]), {"__builtins__": {}})  # noqa: S307
    if "--swiglu" in f:
        kw.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    if "--squared-relu" in f:  # arguments.py core_transformer_config_from_args: squared_relu, not gated
        from megatron.core.activations import squared_relu  # noqa: PLC0415

        kw.update(gated_linear_unit=False, activation_func=squared_relu)
    if "--disable-bias-linear" in f:
        kw["add_bias_linear"] = False
    if "--num-layers-per-virtual-pipeline-stage" in f:
        per = int(f["--num-layers-per-virtual-pipeline-stage"])
        kw["virtual_pipeline_model_parallel_size"] = kw["num_layers"] // (kw["pipeline_model_parallel_size"] * per)
    if kw.get("bf16") or kw.get("fp16"):  # arguments.py params_dtype; core_transformer_config_from_args pipeline_dtype
        kw["params_dtype"] = kw["pipeline_dtype"] = torch.bfloat16 if kw.get("bf16") else torch.float16
    if not _HAS_TE and ((kw.get("num_moe_experts") and kw.get("fp8")) or kw.get("fp4")):
        # TransformerConfig asks Transformer Engine for MoE + FP8 (>= 1.7) and FP4; CPU CI has no TE: the
        # recipe flags are checked by value in test_transformer_config_is_the_planned_model.
        for k in ("fp8", "fp8_recipe", "fp4", "fp4_recipe"):
            kw.pop(k, None)
    if "--multi-latent-attention" in f:
        return MLATransformerConfig(**kw)
    kw = {k: v for k, v in kw.items() if k in {x.name for x in fields(TransformerConfig)}}
    return TransformerConfig(**kw)


@pytest.fixture(scope="module")
def fake_world(_launcher):
    """Start a fake process group of the requested size (rank 0); torn down after each use."""
    def start(world: int) -> None:
        if dist.is_initialized():
            ps.destroy_model_parallel()
            dist.destroy_process_group()
        dist.init_process_group(backend="fake", rank=0, world_size=world, store=FakeStore())
    yield start
    if dist.is_initialized():
        ps.destroy_model_parallel()
        dist.destroy_process_group()


@pytest.mark.parametrize("case", MEGATRON_CASES)
def test_flags_are_megatron_flags(case: str) -> None:
    f = flags_of(exported(case, "megatron").text)
    for flag in f:
        name = RENAMES.get(flag, flag[2:].replace("-", "_"))
        assert flag in TRAINING_FLAGS or name in TC_FIELDS or name in DDP_FIELDS, flag


@pytest.mark.skipif(not os.environ.get("MEGATRON_LM"), reason="set MEGATRON_LM to a Megatron-LM checkout to "
                    "check the training flags against its argument definitions (CI has none)")
def test_training_flags_are_megatron_lm_flags() -> None:
    """Each training flag is spelled in megatron/training/arguments.py, or generated from a config
    dataclass field by ArgumentGroupFactory (`--field-name`; True-default bools as `--disable-x`)."""
    import glob  # noqa: PLC0415

    root = os.environ["MEGATRON_LM"]
    text = "".join(open(p).read() for p in [os.path.join(root, "megatron/training/arguments.py"),
                                             *glob.glob(os.path.join(root, "megatron/training/config/*.py")),
                                             *glob.glob(os.path.join(root, "megatron/core/**/*config*.py"),
                                                        recursive=True)])
    for flag in sorted(TRAINING_FLAGS):
        dest = {"--disable-bias-linear": "add_bias_linear"}.get(flag, flag[2:].replace("-", "_"))
        assert f"'{flag}'" in text or re.search(rf"^\s+{dest}\s*:", text, re.M), flag


@pytest.mark.parametrize("case", MEGATRON_CASES)
def test_transformer_config_is_the_planned_model(case: str) -> None:
    prob, plan, dp = full_plan(case)
    m = prob.model
    out = exported(case, "megatron")
    f = flags_of(out.text)
    cfg = megatron_config(f)  # Megatron's own validation runs here
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads) == (
        m.num_hidden_layers, m.hidden_size, m.num_attention_heads)
    assert cfg.ffn_hidden_size == m.intermediate_size
    if not m.is_mla:
        assert (cfg.num_query_groups or cfg.num_attention_heads) == m.kv_heads
        assert cfg.kv_channels == m.head_size
    assert cfg.gated_linear_unit == m.gated
    assert (cfg.hidden_dropout, cfg.attention_dropout) == ((0.1, 0.1) if m.dropout else (0.0, 0.0))
    fam = model_family(m) or {}
    if fam.get("rotary_base"):  # a GPTModel argument (gpt_builders: rotary_base=args.rotary_base)
        assert float(f["--rotary-base"]) == fam["rotary_base"]
    assert cfg.qk_layernorm == (fam.get("family") in ("qwen3", "deepseek-v3"))
    if m.sliding_window:  # TE's (left, right) window; one full-attention layer in 1 / (1 - share)
        assert tuple(cfg.window_size) == (m.sliding_window - 1, 0)
        assert cfg.window_attn_skip_freq == round(1 / (1 - m.sliding_window_layers))
    else:
        assert cfg.window_size is None
    if m.is_moe:
        assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size) == (
            m.num_experts, m.num_experts_per_tok, m.expert_ffn)
        freq = cfg.moe_layer_freq if isinstance(cfg.moe_layer_freq, list) else \
            [int(i % cfg.moe_layer_freq == 0) for i in range(cfg.num_layers)]
        assert ["moe" if x else "dense" for x in freq] == m.layer_kinds()
        assert cfg.moe_aux_loss_coeff > 0
        assert cfg.expert_model_parallel_size == plan.ep
        assert cfg.expert_tensor_parallel_size == plan.expert_tp
        cf = prob.training.moe_capacity_factor  # token drop: drop and pad to the capacity
        assert (cfg.moe_expert_capacity_factor, cfg.moe_pad_expert_input_to_capacity) == (cf, cf is not None)
    else:
        assert cfg.num_moe_experts is None
    if fam.get("family") == "deepseek-v3":
        assert (cfg.moe_router_score_function, cfg.moe_router_enable_expert_bias) == ("sigmoid", True)
        assert (cfg.moe_router_num_groups, cfg.moe_router_group_topk) == (8, 4)
        assert cfg.moe_router_topk_scaling_factor == 2.5
        assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_head_dim, cfg.qk_pos_emb_head_dim, cfg.v_head_dim) == (
            m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)
    assert cfg.mtp_num_layers == (m.num_nextn_predict_layers or None)  # the model's stated MTP depth
    prec = prob.training.precision
    assert (cfg.fp16, cfg.bf16) == ((True, False) if prec == "fp16" else (False, True))
    if prec not in ("bf16", "fp16"):  # a low-precision recipe Megatron knows (megatron.core.enums)
        assert ("--fp8-recipe" in f) != ("--fp4-recipe" in f)
        if "--fp8-recipe" in f:
            assert f["--fp8-format"] in ("e4m3", "hybrid") and f["--fp8-recipe"] in {r.value for r in Fp8Recipe}
        else:
            assert f["--fp4-format"] == "e2m1" and f["--fp4-recipe"] in {r.value for r in Fp4Recipe}
        # the recipe the precision catalog names for Megatron (autoshard/data/precisions.yaml)
        named = re.search(r"Megatron --fp8-recipe (\w+)", PRECISIONS.get(prec, {}).get("name", ""))
        if named:
            assert f["--fp8-recipe"] == named.group(1)
        else:
            assert any(w.startswith(f"precision {prec}:") for w in out.warnings) or prec in (
                "fp8", "fp8-blockwise", "nvfp4")
    assert cfg.sequence_parallel == (plan.sp and plan.tp > 1)
    # TP / CP on Hopper: Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 (arguments.py validate_args),
    # except with Megatron-FSDP or the expert-overlap path.
    needs = (plan.tp > 1 or plan.cp > 1) and plan.zero_stage < 2 and not cfg.overlap_moe_expert_parallel_comm \
        and prob.cluster.gpu not in ("b200", "gb200")
    assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in out.text) == needs
    if plan.zero_stage >= 2:
        assert f["--ckpt-format"] == "fsdp_dtensor" and "--use-megatron-fsdp" in f


@pytest.mark.parametrize("case", MEGATRON_CASES)
def test_process_groups_are_the_plans(case: str, fake_world) -> None:
    prob, plan, dp = full_plan(case)
    out = exported(case, "megatron")
    f = flags_of(out.text)
    world = prob.cluster.num_gpus
    order = "tp-cp-ep-pp-dp" if "--use-tp-pp-dp-mapping" in f else "tp-cp-ep-dp-pp"
    tp, pp, cp = (int(f[k]) for k in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                      "--context-parallel-size"))
    ep = int(f.get("--expert-model-parallel-size", 1))
    etp = int(f.get("--expert-tensor-parallel-size", tp))
    fake_world(world)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 context_parallel_size=cp, expert_model_parallel_size=ep,
                                 expert_tensor_parallel_size=etp, order=order, create_gloo_process_groups=False)
    assert ps.get_data_parallel_world_size() == dp
    dense = ps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    edp = world // (etp * ep * pp)
    expert = ps.RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order)
    # rank 0's groups as initialized are the generators' first groups
    assert dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()) == dense.get_ranks("tp")[0]
    assert dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()) == dense.get_ranks("pp")[0]
    if ep > 1:
        assert dist.get_process_group_ranks(ps.get_expert_model_parallel_group()) == expert.get_ranks("ep")[0]
    order_warned = any("placement" in w and ("not expressible" in w or "use-tp-pp-dp-mapping" in w)
                       for w in out.warnings)
    mine = {a: plan_groups(plan, dp, axes) for a, axes in
            (("tp", ("tp",)), ("cp", ("cp",)), ("pp", ("pp",)), ("dp", ("ep", "dp")))}
    theirs = {a: sorted(sorted(g) for g in dense.get_ranks(a)) for a in ("tp", "cp", "pp", "dp")}
    if order_warned:
        assert theirs["tp"] == mine["tp"]  # TP stays innermost either way
    else:
        assert theirs == mine
    if ep > 1:
        megatron_ep = sorted(sorted(g) for g in expert.get_ranks("ep"))
        folded = etp != plan.tp or dp % plan.ep
        if folded:
            sizes = {"tp": plan.tp, "cp": plan.cp, "ep": 1, "dp": dp, "pp": plan.pp}
            _, ep_rows, _ = _expert_groups(plan.axes, sizes, etp, plan.ep)
            assert megatron_ep == sorted(sorted(map(int, r)) for r in ep_rows)
        elif plan.cp > 1:  # the export says Megatron's EP groups differ from the plan's: they do
            assert megatron_ep != plan_groups(plan, dp, ("ep",))
            assert any("expert groups differ from the plan" in w for w in out.warnings)
        elif not order_warned:
            assert megatron_ep == plan_groups(plan, dp, ("ep",))


@pytest.mark.parametrize("case", MEGATRON_CASES)
def test_layers_per_rank_and_recompute(case: str, fake_world) -> None:
    prob, plan, dp = full_plan(case)
    out = exported(case, "megatron")
    f = flags_of(out.text)
    cfg = megatron_config(f)
    L = prob.model.num_hidden_layers
    stages = list(plan.stage_layers) if plan.stage_layers else None
    if stages is None:
        from autoshard.cost import even_split  # noqa: PLC0415
        stages = even_split(L, plan.pp * plan.vpp)
    vpp = cfg.virtual_pipeline_model_parallel_size or 1
    if cfg.pipeline_model_parallel_layout is not None:
        vpp = cfg.pipeline_model_parallel_layout.virtual_pipeline_model_parallel_size or 1
    assert vpp == plan.vpp
    fake_world(prob.cluster.num_gpus)
    moe = prob.model.is_moe
    ps.initialize_model_parallel(tensor_model_parallel_size=cfg.tensor_model_parallel_size,
                                 pipeline_model_parallel_size=cfg.pipeline_model_parallel_size,
                                 context_parallel_size=cfg.context_parallel_size, create_gloo_process_groups=False,
                                 virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                                 expert_model_parallel_size=cfg.expert_model_parallel_size if moe else 1,
                                 expert_tensor_parallel_size=cfg.expert_tensor_parallel_size if moe
                                 else cfg.tensor_model_parallel_size)
    planned = plan.recompute_per_layer(L)
    recomputed: list[str] = []
    read_stages: list[int] = []
    for c in range(cfg.pipeline_model_parallel_size * vpp):
        r, v = c % plan.pp, c // plan.pp
        ps.set_pipeline_model_parallel_rank(r)  # the layout reads the rank from parallel_state
        n = get_num_layers_to_build(cfg, vp_stage=v if vpp > 1 else None, pp_rank=r)
        off = get_transformer_layer_offset(cfg, vp_stage=v if vpp > 1 else None, pp_rank=r)
        assert (off, n) == (sum(stages[:c]), stages[c]), (r, v)
        read_stages.append(n)
        recomputed += megatron_runs(cfg, n, first_layer=off)
    assert recomputed == planned  # exactly the priced list, layer by layer: never the closest setting
    assert not any("recompute" in w and "not" in w and "expressible" in w for w in out.warnings)
    # Re-priced from what Megatron will run: degrees from its config and parallel_state, layers per virtual
    # stage from get_num_layers_to_build, recompute per layer from _checkpointed_forward, batch from its
    # micro-batch calculator; the rest of the plan (placement, overlaps, dispatcher: checked by the tests
    # above) as planned. The estimate equals the priced one.
    read_dp = ps.get_data_parallel_world_size()
    calc = ConstantNumMicroBatchesCalculator(int(f["--global-batch-size"]), int(f["--micro-batch-size"]), read_dp,
                                            False, 0)
    assert calc.get_current_global_batch_size() == prob.training.global_batch_size
    back = plan.model_copy(update={
        "tp": cfg.tensor_model_parallel_size, "pp": cfg.pipeline_model_parallel_size,
        "cp": cfg.context_parallel_size, "dp": read_dp, "vpp": vpp, "stage_layers": read_stages,
        "recompute": recomputed, "micro_batch_size": int(f["--micro-batch-size"]),
        "sequence_parallel": bool(cfg.sequence_parallel) or (plan.sp and plan.tp == 1),
        **({"ep": cfg.expert_model_parallel_size, "etp": cfg.expert_tensor_parallel_size} if moe else {})})
    priced, rerun = evaluate(prob, plan), evaluate(prob, back)
    assert rerun.step_time_s == priced.step_time_s and rerun.fits == priced.fits
    assert [s.peak_memory_gib for s in rerun.stages] == [s.peak_memory_gib for s in priced.stages]


def megatron_runs(cfg, n: int, first_layer: int = 0) -> list[str]:
    """Per layer of a model chunk of `n` layers (the first at global index `first_layer`), what
    Megatron runs under `cfg`: "full" where megatron-core 0.16.1's own
    `TransformerBlock._checkpointed_forward` (run on a stand-in block whose layers record whether they
    execute inside `tensor_parallel.checkpoint`) checkpoints the layer; the selective modules
    (`recompute_modules`, read by every TransformerLayer) where the granularity is selective; "offload"
    for the first `cpu_offloading_num_layers` layers of the model (Transformer Engine's offload context,
    TransformerBlock.__init__) where `cpu_offloading` is on; "none" elsewhere."""
    from megatron.core.transformer import transformer_block as tb  # noqa: PLC0415

    if cfg.recompute_granularity == "selective":
        return [canonical_recompute("+".join(cfg.recompute_modules or ["core_attn"]))] * n
    if cfg.recompute_granularity != "full":
        k = cfg.cpu_offloading_num_layers if getattr(cfg, "cpu_offloading", False) else 0
        return ["offload" if first_layer + j < k else "none" for j in range(n)]
    inside, ran = [False], []

    class Layer:
        def __init__(self, i: int):
            self.layer_number = first_layer + i + 1

        def __call__(self, hidden_states, context=None, **_):
            ran.append("full" if inside[0] else "none")
            return hidden_states, context

    def checkpoint(fn, distribute_saved_activations, *args):
        inside[0] = True
        try:
            return fn(*args)
        finally:
            inside[0] = False

    layers = [Layer(i) for i in range(n)]
    block = types.SimpleNamespace(config=cfg, num_layers_per_pipeline_rank=n, _get_layer=lambda i: layers[i],
                                  pg_collection=None)
    saved = tb.tensor_parallel.checkpoint
    tb.tensor_parallel.checkpoint = checkpoint
    try:
        tb.TransformerBlock._checkpointed_forward(
            block, hidden_states=torch.zeros(1, requires_grad=True), attention_mask=None, context=None,
            context_mask=None, rotary_pos_emb=None, attention_bias=None, packed_seq_params=None,
            use_inner_quantization_context=False)
    finally:
        tb.tensor_parallel.checkpoint = saved
    assert len(ran) == n
    return ran


@pytest.mark.parametrize("case", sorted(MEGATRON_REFUSED))
def test_plans_megatron_cannot_run_are_refused(case: str) -> None:
    # Priced for a stack that takes per-layer lists; Megatron has no flags for the list: the export
    # refuses (exit 2 on the CLI) and names why, instead of writing the closest setting.
    prob, plan = all_cases()[case]
    with pytest.raises(InputError, match="cannot be exported to Megatron-LM") as exc:
        export_plan(prob, plan, "megatron")
    assert exc.value.field == "plan.recompute"
    # what every setting Megatron has would run instead differs from the plan (brute force below)
    L = prob.model.num_hidden_layers
    from autoshard.cost import even_split  # noqa: PLC0415
    split = list(plan.stage_layers) if plan.stage_layers else even_split(L, plan.pp * plan.vpp)
    assert tuple(plan.recompute_per_layer(L)) not in _megatron_lists(split, plan.pp, L)


def _megatron_lists(split: list[int], pp: int, L: int, modules: tuple[str, ...] = ("core_attn",)) -> set[tuple]:
    """Every per-layer list some Megatron recompute / offload setting runs over the virtual stages
    `split` (run through `megatron_runs`): none; selective with each module set; full uniform with
    every chunk size; full block with every K; offloading of N < L layers (TransformerConfig: PP 1)."""
    settings = [dict()]
    settings += [dict(recompute_granularity="selective", recompute_modules=[m]) for m in modules]
    settings += [dict(recompute_granularity="full", recompute_method=meth, recompute_num_layers=k)
                 for meth in ("uniform", "block") for k in range(1, L + 1)]
    if pp == 1 and len(split) == 1:
        settings += [dict(cpu_offloading=True, cpu_offloading_num_layers=k) for k in range(1, L)]
    out = set()
    for st in settings:
        cfg = types.SimpleNamespace(recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
                                    recompute_modules=None, cpu_offloading=False, cpu_offloading_num_layers=0,
                                    fp8=None, fp4=None, distribute_saved_activations=False)
        vars(cfg).update(st)
        lst: list[str] = []
        try:
            for c, n in enumerate(split):
                lst += megatron_runs(cfg, n, first_layer=sum(split[:c]))
        except IndexError:  # uniform with a chunk size not dividing a stage's layers: Megatron itself fails
            continue
        out.add(tuple(lst))
    return out


def _compositions(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield [b - a for a, b in zip(bounds, bounds[1:])]


def test_megatron_predicate_is_exactly_what_megatron_runs() -> None:
    # Brute force on a 6-layer model: every split over 1, 2, 3 or 4 virtual stages (pp 1, 2, 3; vpp 1,
    # 2) and every per-layer list over none / full / selective / offload (4^6 = 4,096). The planner's
    # predicate (layouts.py megatron_recompute: what the solver plans, evaluate accepts and the
    # export writes) accepts a list iff some Megatron setting runs exactly it, and the settings it
    # returns, run through megatron-core's own _checkpointed_forward, give back the list.
    L, accepted = 6, 0
    for pp, vpp in ((1, 1), (2, 1), (3, 1), (2, 2)):
        for split in _compositions(L, pp * vpp):
            runs = _megatron_lists(split, pp, L)
            for lst in itertools.product(("none", "full", "selective", "offload"), repeat=L):
                rc = megatron_recompute(split, list(lst), pp)
                assert (rc is not None) == (lst in runs), (split, lst)
                if rc is None:
                    continue
                accepted += 1
                cfg = types.SimpleNamespace(
                    recompute_granularity=rc.granularity, recompute_method=rc.method,
                    recompute_num_layers=rc.num_layers, recompute_modules=list(rc.modules) or None,
                    cpu_offloading=rc.offload_layers > 0, cpu_offloading_num_layers=rc.offload_layers,
                    fp8=None, fp4=None, distribute_saved_activations=False)
                again = [m for c, n in enumerate(split) for m in megatron_runs(cfg, n, first_layer=sum(split[:c]))]
                assert again == list(lst), (split, lst, rc)
    assert accepted > 100  # (none / selective / full everywhere, every block K, offload prefixes)


@pytest.mark.parametrize("case", MEGATRON_CASES)
def test_micro_batches(case: str) -> None:
    prob, plan, dp = full_plan(case)
    f = flags_of(exported(case, "megatron").text)
    calc = ConstantNumMicroBatchesCalculator(int(f["--global-batch-size"]), int(f["--micro-batch-size"]), dp,
                                            False, 0)
    assert calc.get() == prob.training.global_batch_size // (plan.micro_batch_size * dp)
    assert calc.get_current_global_batch_size() == prob.training.global_batch_size
    assert int(f["--seq-length"]) == prob.training.seq_len


def test_layout_strings_parse_in_megatron() -> None:
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    from autoshard.export import megatron_layout
    lay = PipelineParallelLayerLayout(megatron_layout([3, 5, 4, 2], mtp_layers=1), 2)
    assert lay.virtual_pipeline_model_parallel_size == 2
    assert re.fullmatch(r"Et\*3\|t\*5\|t\*4\|t\*2mL", megatron_layout([3, 5, 4, 2], mtp_layers=1))


def test_ast_of_moe_layer_freq_is_a_list_expression() -> None:
    # the exported --moe-layer-freq is a Python list expression, as Megatron's moe_freq_type expects
    prob_case = next(c for c in MEGATRON_CASES if "deepseek" in c)
    f = flags_of(exported(prob_case, "megatron").text)
    assert isinstance(ast.parse(str(f["--moe-layer-freq"]), mode="eval").body, ast.BinOp)


SOLVED = [  # small Megatron problems whose memory makes the solver choose recompute per layer
    {"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64},
     "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8},
     "search": {"tp": [2], "cp": [1], "pp": [2], "zero_stage": [1], "micro_batch_size": [1],
                "recompute": ["none", "selective", "full", "offload"]}},
    {"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64},
     "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8},
     "search": {"tp": [2], "cp": [4], "pp": [1], "zero_stage": [1], "micro_batch_size": [1],
                "recompute": ["none", "selective", "full", "offload"]}},
    {"model": "llama3-70b", "training": {"seq_len": 16384, "global_batch_size": 64},
     "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 64},
     "search": {"tp": [8], "pp": [4], "vpp": [1, 2], "zero_stage": [1], "micro_batch_size": [1]}},
    {"model": "qwen3-30b-a3b", "training": {"seq_len": 4096, "global_batch_size": 256},
     "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 16},
     "search": {"tp": [1], "pp": [2], "ep": [8], "zero_stage": [1], "micro_batch_size": [1],
                "recompute": ["none", "full", "moe_act", "offload"]}},
]


@pytest.mark.parametrize("doc", SOLVED, ids=[f"{d['model']}-{d['cluster']['num_gpus']}" for d in SOLVED])
def test_solved_recompute_is_what_megatron_runs(doc: dict) -> None:
    # Every plan the solver returns for Megatron (the best and its alternatives) carries a recompute list
    # Megatron has flags for, the export writes them, and megatron-core's _checkpointed_forward, re-reading
    # the exported flags, recomputes exactly the priced layers.
    from autoshard import load_problem, solve  # noqa: PLC0415
    from autoshard.cost import even_split  # noqa: PLC0415

    prob = load_problem(doc)
    sol = solve(prob, top_k=3, time_limit_s=60)
    L = prob.model.num_hidden_layers
    for plan in [sol.plan, *(a.plan for a in sol.alternatives)]:
        split = list(plan.stage_layers or even_split(L, plan.pp * plan.vpp))
        rc = list(plan.recompute_per_layer(L))
        assert megatron_recompute(split, rc, plan.pp) is not None, (plan.short(), rc)
        cfg = megatron_config(flags_of(export_plan(prob, plan, "megatron").text))
        ran = [m for c, n in enumerate(split) for m in megatron_runs(cfg, n, first_layer=sum(split[:c]))]
        assert ran == rc, plan.short()

"""Exporters: every plan x every format parses back, multiplies to the world size, keeps the
batch consistent, keeps every layer, uses only real launcher names, and is byte-stable."""

from __future__ import annotations

import json
import math
import re
import shlex
import tomllib

import pytest
import yaml

from autoshard import evaluate, load_problem
from autoshard.errors import InputError
from autoshard.export import FORMATS, Export, export_plan, megatron_layout, recompute_runs
from autoshard.spec import Plan, Problem

WORLD = 640
GBS = 1280

# Megatron-LM flags named in ECOSYSTEM.md §1.1 (parallelism/batch table, model-shape table,
# "other flags" list and the text around them). The exporter may use nothing else.
MEGATRON_ALLOWED = frozenset({
    # parallelism and batch
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--sequence-parallel", "--context-parallel-size",
    "--hierarchical-context-parallel-sizes", "--cp-comm-type", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--use-distributed-optimizer",
    "--num-distributed-optimizer-instances", "--use-megatron-fsdp", "--use-torch-fsdp2",
    "--data-parallel-sharding-strategy", "--overlap-grad-reduce", "--overlap-param-gather",
    "--tp-comm-overlap", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--recompute-modules", "--recompute-activations", "--distribute-saved-activations",
    "--micro-batch-size", "--global-batch-size", "--rampup-batch-size",
    "--microbatch-group-size-per-virtual-pipeline-stage", "--cpu-offloading-num-layers",
    "--tensor-parallel-num-weight-shards", "--use-tp-pp-dp-mapping", "--seq-length",
    # model shape (HF -> Megatron table)
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--group-query-attention", "--num-query-groups", "--kv-channels", "--max-position-embeddings",
    "--vocab-size", "--padded-vocab-size", "--make-vocab-size-divisible-by",
    "--untie-embeddings-and-output-weights", "--normalization", "--norm-epsilon", "--swiglu",
    "--position-embedding-type", "--rotary-base", "--disable-bias-linear", "--add-qkv-bias",
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--multi-latent-attention",
    "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
    "--moe-router-num-groups", "--moe-router-group-topk", "--moe-router-topk-scaling-factor",
    "--moe-router-score-function", "--mtp-num-layers", "--qk-layernorm",
    # other flags the planner needs
    "--moe-token-dispatcher-type", "--moe-grouped-gemm", "--bf16", "--fp8-format", "--fp8-recipe",
    "--transformer-impl", "--ckpt-format",
    # the planned model and overlaps: TransformerConfig fields (megatron-core 0.16.1, flag = --field-name)
    # spelled as in Megatron-LM examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh, examples/mixtral and
    # examples/post_training/modelopt/conf/Qwen/Qwen3-235B-A22B.sh (d98e8a64dd)
    "--attention-dropout", "--hidden-dropout", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
    "--moe-router-pre-softmax", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
    "--moe-router-dtype", "--mtp-loss-scaling-factor", "--rotary-scaling-factor", "--mscale",
    "--mscale-all-dim", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--fp4-format",
    "--fp4-recipe",
    # full-iteration CUDA graphs: TransformerConfig.cuda_graph_impl and arguments.py's
    # --no-check-for-nan-in-loss-and-grad, which validate_args asks for with it (Megatron-LM d98e8a64dd)
    "--cuda-graph-impl", "--cuda-graph-scope", "--no-check-for-nan-in-loss-and-grad",
    # the flex dispatcher's backend: TransformerConfig.moe_flex_dispatcher_backend (d98e8a64dd)
    "--moe-flex-dispatcher-backend",
    # the loss / output-layer memory knobs as priced (training.attention_mask_in_batch, cross_entropy_fusion,
    # defer_embedding_wgrad): arguments.py --no-create-attention-mask-in-dataloader, ModelParallelConfig
    # cross_entropy_loss_fusion / defer_embedding_wgrad_compute / wgrad_deferral_limit (d98e8a64dd)
    "--no-create-attention-mask-in-dataloader", "--cross-entropy-loss-fusion", "--defer-embedding-wgrad-compute",
    "--wgrad-deferral-limit",
    # arguments.py --no-gradient-accumulation-fusion (dest gradient_accumulation_fusion, d98e8a64dd): the
    # plan priced without Transformer Engine's dummy weight gradients (training.gradient_accumulation_fusion)
    "--no-gradient-accumulation-fusion",
})
NOT_A_MEGATRON_FLAG = ("--data-parallel-size", "--world-size")
NARGS_FLAGS = ("--hierarchical-context-parallel-sizes", "--cuda-graph-scope")  # nargs='+' in Megatron-LM arguments.py


def problem(model, search: dict | None = None, **training) -> Problem:
    return load_problem({
        "model": model,
        "cluster": {"gpu": "h100-sxm", "num_gpus": WORLD},
        "training": {"seq_len": 4096, "global_batch_size": GBS, **training},
        **({"search": search} if search else {}),
    })


LLAMA = problem("llama3-70b")
# priced for a stack that takes any per-layer recompute list (`search: {recompute_layout: per_layer}`)
LLAMA_LISTS = problem("llama3-70b", search={"recompute_layout": "per_layer"})
MIX_IRREGULAR = ["full"] * 3 + ["none"] * 17 + ["full"] * 1 + ["none"] * 19 + ["selective"] * 5 + ["none"] * 35

CASES = {
    "tp8-sp-pp4-dp20-zero1-1f1b": (LLAMA, Plan(tp=8, pp=4, zero_stage=1, schedule="1f1b")),
    "interleaved-vpp2": (LLAMA, Plan(tp=8, pp=4, vpp=2, schedule="interleaved", zero_stage=1)),
    "uneven-first-last-lighter": (LLAMA, Plan(tp=8, pp=4, stage_layers=[18, 22, 22, 18])),
    "full-iteration-cuda-graphs": (LLAMA, Plan(tp=8, pp=4, zero_stage=1, cuda_graphs=True)),
    "uneven-middle-layout": (LLAMA, Plan(tp=8, pp=4, stage_layers=[17, 22, 23, 18])),
    "uneven-interleaved-layout": (LLAMA, Plan(tp=8, pp=4, vpp=2, schedule="interleaved",
                                              stage_layers=[8, 10, 10, 10, 10, 11, 11, 10])),
    "mixtral-ep8": (problem("mixtral-8x7b"), Plan(tp=4, pp=2, ep=8, zero_stage=1)),
    "deepseek-v3-mla-ep8": (problem("deepseek-v3"), Plan(tp=2, pp=8, ep=8, stage_layers=[7, 8, 8, 8, 8, 8, 8, 6],
                                                      recompute="selective")),
    "deepseek-v3-default-split": (problem("deepseek-v3"), Plan(tp=1, pp=8, ep=16, zero_stage=1)),
    "deepseek-v3-deepep": (problem("deepseek-v3"), Plan(tp=1, pp=8, ep=16, zero_stage=1, moe_dispatcher="deepep")),
    "zero3-full-recompute": (LLAMA, Plan(tp=8, zero_stage=3, micro_batch_size=2, recompute="full")),
    "per-layer-recompute-mix": (LLAMA_LISTS, Plan(tp=8, pp=4, zero_stage=1, recompute=MIX_IRREGULAR)),
    "cp2-fp8-zero2": (problem("llama3-70b", precision="fp8"), Plan(tp=8, cp=2, pp=4, zero_stage=2)),
    "zero-bubble": (LLAMA, Plan(tp=8, pp=4, schedule="zero_bubble")),
    "tp-pp-dp-order": (LLAMA, Plan(tp=8, pp=4, placement="tp-cp-ep-pp-dp")),
    "dense-no-tp": (problem("llama3-8b"), Plan(tp=1, zero_stage=0, micro_batch_size=2)),
}

MIXED = {"per-layer-recompute-mix"}


# ---------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------


def megatron_flags(text: str) -> dict[str, str | bool]:
    flags: dict[str, str | bool] = {}
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    for i, line in enumerate(body):
        last = i == len(body) - 1
        assert line.endswith(" \\") != last, f"line continuation wrong on {line!r}"
        tokens = shlex.split(line.removesuffix(" \\"))
        assert tokens[0].startswith("--") and (len(tokens) in (1, 2) or tokens[0] in NARGS_FLAGS), line
        assert tokens[0] not in flags, f"duplicate flag {tokens[0]}"
        flags[tokens[0]] = (" ".join(tokens[1:]) if tokens[0] in NARGS_FLAGS else tokens[1]) if len(tokens) >= 2 \
            else True
    return flags


def parse_layout(layout: str) -> list[list[str]]:
    """Megatron's PipelineParallelLayerLayout.parse_str_to_list, for checking."""
    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda x: x.group(1) * int(x.group(2)), s)
    return [list(stage) for stage in s.split("|")]


def parse(fmt: str, text: str):
    if fmt == "megatron":
        return megatron_flags(text)
    if fmt == "torchtitan":
        return tomllib.loads(text)
    if fmt == "maxtext":
        return yaml.safe_load(text)
    return json.loads(text)


def resolved_dp(prob: Problem, plan: Plan) -> int:
    return prob.cluster.num_gpus // (plan.tp * plan.pp * plan.cp)


# ---------------------------------------------------------------------------------------
# Every plan x every format
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_export_parses_and_is_consistent(case: str, fmt: str) -> None:
    prob, plan = CASES[case]
    if case in MIXED and fmt == "megatron":  # Megatron runs no such list: refused, never changed
        with pytest.raises(InputError, match="cannot be exported to Megatron-LM"):
            export_plan(prob, plan, fmt)
        return
    out = export_plan(prob, plan, fmt)
    assert isinstance(out, Export) and out.fmt == fmt
    assert out.text.endswith("\n")
    doc = parse(fmt, out.text)
    L = prob.model.num_hidden_layers
    dp = resolved_dp(prob, plan)
    {"megatron": check_megatron, "torchtitan": check_torchtitan, "deepspeed": check_deepspeed,
     "maxtext": check_maxtext, "jax": check_jax}[fmt](doc, prob, plan, dp, L)
    # Header names autoshard, the plan summary and the target version.
    short = plan.model_copy(update={"dp": dp}).short()
    assert "autoshard" in out.text and short in out.text
    if case in MIXED and fmt != "jax":  # the JAX mesh/spec file carries no recompute
        assert any("recompute" in w for w in out.warnings), out.warnings
    # Determinism: byte-identical on a second export.
    again = export_plan(prob, plan, fmt)
    assert again.text == out.text and again.warnings == out.warnings


def check_megatron(f: dict, prob: Problem, plan: Plan, dp: int, L: int) -> None:
    assert set(f) <= MEGATRON_ALLOWED, set(f) - MEGATRON_ALLOWED
    assert not any(k in f for k in NOT_A_MEGATRON_FLAG)
    tp = int(f["--tensor-model-parallel-size"])
    pp = int(f["--pipeline-model-parallel-size"])
    cp = int(f["--context-parallel-size"])
    assert (tp, pp, cp) == (plan.tp, plan.pp, plan.cp)
    assert WORLD % (tp * pp * cp) == 0 and WORLD // (tp * pp * cp) == dp
    micro, gbs = int(f["--micro-batch-size"]), int(f["--global-batch-size"])
    assert gbs == GBS and gbs % (micro * dp) == 0
    assert int(f["--seq-length"]) == prob.training.seq_len
    assert int(f["--num-layers"]) == L
    assert ("--sequence-parallel" in f) == (plan.sp and plan.tp > 1)
    # Layer split.
    if "--pipeline-model-parallel-layout" in f:
        stages = parse_layout(str(f["--pipeline-model-parallel-layout"]))
        assert len(stages) % pp == 0 and len(stages) == pp * plan.vpp
        flat = [c for s in stages for c in s]
        assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == flat.count("L") == 1
        assert flat.count("t") == L and flat.count("m") == int(f.get("--mtp-num-layers", 0))
        assert not any(k in f for k in ("--num-layers-per-virtual-pipeline-stage",
                                         "--decoder-first-pipeline-num-layers"))
    elif "--decoder-first-pipeline-num-layers" in f:
        first = int(f["--decoder-first-pipeline-num-layers"])
        last = int(f["--decoder-last-pipeline-num-layers"])
        assert pp >= 2 and first > 0 and last > 0
        rest = L - first - last
        assert (pp == 2 and rest == 0) or rest % (pp - 2) == 0
        middle = rest // (pp - 2) if pp > 2 else 0
        assert first + last + middle * (pp - 2) == L
    elif "--num-layers-per-virtual-pipeline-stage" in f:
        assert int(f["--num-layers-per-virtual-pipeline-stage"]) * pp * plan.vpp == L
    else:
        assert L % pp == 0
    # ZeRO.
    assert ("--use-distributed-optimizer" in f) == (plan.zero_stage == 1)
    if plan.zero_stage >= 2:  # Megatron-FSDP (which turns the distributed optimizer on itself)
        assert f["--data-parallel-sharding-strategy"] == ("optim_grads" if plan.zero_stage == 2
                                                           else "optim_grads_params")
        assert f["--ckpt-format"] == "fsdp_dtensor"
    else:
        assert "--ckpt-format" not in f
    # The planned model: no dropout unless the model has it, RoPE base of the family.
    if not prob.model.dropout:
        assert float(f["--attention-dropout"]) == float(f["--hidden-dropout"]) == 0.0
    # MoE / MLA.
    m = prob.model
    if m.is_moe:
        assert int(f["--expert-model-parallel-size"]) == plan.ep
        assert int(f["--expert-tensor-parallel-size"]) == plan.expert_tp
        assert int(f["--num-experts"]) == m.num_experts
        assert int(f["--moe-router-topk"]) == m.num_experts_per_tok
        if m.first_k_dense_replace:
            k = m.first_k_dense_replace
            assert f["--moe-layer-freq"] == f"[0]*{k}+[1]*{L - k}"
    else:
        assert "--num-experts" not in f
    assert ("--multi-latent-attention" in f) == m.is_mla
    # Recompute.
    modes = set(plan.recompute_per_layer(L))
    if modes == {"none"}:
        assert "--recompute-granularity" not in f
    elif modes == {"full"}:
        assert (f["--recompute-granularity"], f["--recompute-method"]) == ("full", "uniform")
    elif "full" in modes:
        assert (f["--recompute-granularity"], f["--recompute-method"]) == ("full", "block")
    else:
        assert f["--recompute-granularity"] == "selective" and "--recompute-method" not in f


def check_torchtitan(doc: dict, prob: Problem, plan: Plan, dp: int, L: int) -> None:
    par, tr = doc["parallelism"], doc["training"]
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    tp, pp, cp = par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"]
    assert rep * shard * cp * tp * pp == WORLD
    assert (tp, pp, cp, rep * shard) == (plan.tp, plan.pp, plan.cp, dp)
    if plan.zero_stage == 3:
        assert (rep, shard) == (1, dp)
    local, gbs = tr["local_batch_size"], tr["global_batch_size"]
    assert gbs == GBS and gbs % (local * rep * shard) == 0
    ga = gbs // (local * rep * shard)
    if pp > 1:
        micro = par["pipeline_parallel_microbatch_size"]
        assert local % micro == 0
        n_micro = local // micro
        assert micro == plan.micro_batch_size
        assert micro * n_micro * ga * dp == GBS
        if "module_fqns_per_model_part" in par:
            parts = par["module_fqns_per_model_part"]
            assert len(parts) % pp == 0
            names = [x for part in parts for x in part]
            assert names[0] == "tok_embeddings" and names[-2:] == ["norm", "output"]
            assert [x for x in names if x.startswith("layers.")] == [f"layers.{i}" for i in range(L)]
        else:
            lps = par["pipeline_parallel_layers_per_stage"]
            assert par["pipeline_parallel_first_stage_less_layers"] == 0
            assert par["pipeline_parallel_last_stage_less_layers"] == 0
            assert L % lps == 0 and (L // lps) % pp == 0
        assert par["pipeline_parallel_schedule"] in (
            "1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble")
    else:
        assert local == plan.micro_batch_size and local * ga * dp == GBS
    assert tr["seq_len"] == prob.training.seq_len
    if prob.model.is_moe:
        ep, etp = par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]
        assert ep == plan.ep and etp in (1, tp)
        assert (shard * cp * tp) % (etp * ep) == 0  # torchtitan's efsdp must be an integer
    ac = doc["activation_checkpoint"]
    assert ac["mode"] in ("none", "selective", "full")
    if ac["mode"] == "selective":
        assert ac["selective_ac_option"] == "op" or ac["selective_ac_option"].isdigit()
    # The torchtitan >= 0.3 override line, as comments.
    override = [line for line in doc_text_lines(prob, plan, "torchtitan") if line.startswith("#   --")]
    assert len(override) == 1 and f"--parallelism.tensor_parallel_degree {tp}" in override[0]


def doc_text_lines(prob: Problem, plan: Plan, fmt: str) -> list[str]:
    return export_plan(prob, plan, fmt).text.splitlines()


def check_deepspeed(doc: dict, prob: Problem, plan: Plan, dp: int, L: int) -> None:
    a = doc["autoshard"]
    assert a["tp"] * a["pp"] * a["cp"] * a["dp"] == a["world_size"] == WORLD
    assert (a["tp"], a["pp"], a["cp"], a["ep"], a["dp"]) == (plan.tp, plan.pp, plan.cp, plan.ep, dp)
    micro, gas = doc["train_micro_batch_size_per_gpu"], doc["gradient_accumulation_steps"]
    assert micro * gas * dp == GBS == a["global_batch_size"]
    # pinned always: DeepSpeed asserts it equals micro x GAS x the data-parallel world it counts
    assert doc["train_batch_size"] == GBS
    if plan.tp * plan.pp * plan.cp > 1:
        assert "dp = " in a["note"] and f"= {dp}" in a["note"] and "mpu" in a["note"]
    assert doc["zero_optimization"]["stage"] == plan.zero_stage
    assert doc["bf16"]["enabled"] is True
    assert "pipeline" not in doc  # DeepSpeed never reads pipeline.stages / partition
    if plan.pp > 1:
        pm = a["pipeline_module"]
        assert pm["num_stages"] == plan.pp and sum(pm["stage_layers"]) == L
    args = a["megatron_deepspeed_args"]
    assert args[args.index("--tensor-model-parallel-size") + 1] == str(plan.tp)
    assert args[args.index("--pipeline-model-parallel-size") + 1] == str(plan.pp)
    assert ("activation_checkpointing" in doc) == ("full" in plan.recompute_per_layer(L))
    if isinstance(plan.recompute, list):
        assert [m for m, n in a["recompute"] for _ in range(n)] == plan.recompute


def check_maxtext(doc: dict, prob: Problem, plan: Plan, dp: int, L: int) -> None:
    param = {"data": "data", "fsdp": "fsdp", "stage": "pipeline", "context": "context",
             "expert": "expert", "tensor": "tensor"}
    size = {n: doc[f"ici_{p}_parallelism"] * doc[f"dcn_{p}_parallelism"] for n, p in param.items()}
    assert math.prod(size.values()) == WORLD
    assert (size["tensor"], size["stage"], size["context"]) == (plan.tp, plan.pp, plan.cp)
    assert size["data"] * size["fsdp"] * size["expert"] == dp
    dcn = math.prod(doc[f"dcn_{p}_parallelism"] for p in param.values())
    assert doc["num_slices"] == dcn
    assert doc["base_num_decoder_layers"] == L and doc["base_emb_dim"] == prob.model.hidden_size
    assert doc["max_target_length"] == prob.training.seq_len
    micro_total = doc["per_device_batch_size"] * WORLD * doc["gradient_accumulation_steps"]
    assert math.isclose(micro_total, GBS)
    if plan.pp > 1:  # MaxText's own assertion (configs/types.py): stages x repeats x layers/stage
        pipelined = doc.get("pipeline_parallel_layers", L)
        assert plan.pp * doc["num_pipeline_repeats"] * doc["num_layers_per_pipeline_stage"] == pipelined <= L
    assert doc["remat_policy"] in ("full", "minimal", "minimal_with_context")


def check_jax(doc: dict, prob: Problem, plan: Plan, dp: int, L: int) -> None:
    shape, names = doc["mesh_shape"], doc["axis_names"]
    assert len(shape) == len(names) == len(set(names)) == 5
    assert math.prod(shape) == WORLD
    size = dict(zip(names, shape))
    dp_axis = "fsdp" if plan.zero_stage == 3 else "data"
    assert set(names) == {"stage", dp_axis, "context", "expert", "tensor"}
    assert (size["tensor"], size["stage"], size["context"]) == (plan.tp, plan.pp, plan.cp)
    assert size[dp_axis] * size["expert"] == dp
    inner = {"tp": "tensor", "cp": "context", "ep": "expert", "dp": dp_axis, "pp": "stage"}
    assert names == [inner[a] for a in reversed(plan.axes)]
    assert len(doc["layer_stage"]) == L and sorted(set(doc["layer_stage"])) == list(range(plan.pp))
    # Every spec divides its tensor's dimension (no IndivisibleError).
    for group in ("params", "optimizer_state", "activations"):
        for name, t in doc.get(group, {}).items():
            assert len(t["spec"]) == len(t["shape"]), name
            for dim, entry in zip(t["shape"], t["spec"]):
                axes = [] if entry is None else (entry if isinstance(entry, list) else [entry])
                assert all(a in names for a in axes)
                assert dim % math.prod(size[a] for a in axes) == 0, (name, dim, entry)
    t = "tensor" if plan.tp > 1 else None
    assert doc["params"]["wo"]["spec"][0] == t


# ---------------------------------------------------------------------------------------
# Targeted behaviour
# ---------------------------------------------------------------------------------------


def test_unknown_format_lists_valid_ones() -> None:
    with pytest.raises(InputError) as err:
        export_plan(LLAMA, Plan(tp=8), "nemo")
    for fmt in FORMATS:
        assert fmt in str(err.value)


def test_format_name_is_case_insensitive() -> None:
    assert export_plan(LLAMA, Plan(tp=8), "Megatron").text == export_plan(LLAMA, Plan(tp=8), "megatron").text


def test_invalid_plan_is_an_input_error() -> None:
    with pytest.raises(InputError, match="cannot be exported"):
        export_plan(LLAMA, Plan(tp=8, pp=3), "megatron")  # 24 does not divide 640
    with pytest.raises(InputError, match="stage_layers"):
        export_plan(LLAMA, Plan(tp=8, pp=4, stage_layers=[20, 20, 20]), "jax")


def test_megatron_header_and_reference_plan() -> None:
    out = export_plan(*CASES["tp8-sp-pp4-dp20-zero1-1f1b"], "megatron")
    head = [line for line in out.text.splitlines() if line.startswith("#")]
    assert head and "autoshard" in head[0] and "core_r0.16" in out.text
    f = megatron_flags(out.text)
    assert f["--tensor-model-parallel-size"] == "8" and f["--pipeline-model-parallel-size"] == "4"
    assert f["--sequence-parallel"] is True and f["--use-distributed-optimizer"] is True
    assert f["--overlap-grad-reduce"] is True and f["--overlap-param-gather"] is True
    assert f["--num-query-groups"] == "8" and f["--swiglu"] is True and f["--bf16"] is True
    assert out.warnings == []


def test_megatron_uneven_first_last() -> None:
    f = megatron_flags(export_plan(*CASES["uneven-first-last-lighter"], "megatron").text)
    assert (f["--decoder-first-pipeline-num-layers"], f["--decoder-last-pipeline-num-layers"]) == ("18", "18")
    assert "--pipeline-model-parallel-layout" not in f


def test_megatron_layout_strings() -> None:
    assert megatron_layout([3, 4, 4, 3]) == "Et*3|t*4|t*4|t*3L"
    assert megatron_layout([1, 0, 2]) == "Et||t*2L"
    f = megatron_flags(export_plan(*CASES["uneven-middle-layout"], "megatron").text)
    assert f["--pipeline-model-parallel-layout"] == "Et*17|t*22|t*23|t*18L"
    f = megatron_flags(export_plan(*CASES["uneven-interleaved-layout"], "megatron").text)
    assert [s.count("t") for s in parse_layout(str(f["--pipeline-model-parallel-layout"]))] == \
        [8, 10, 10, 10, 10, 11, 11, 10]
    assert "--num-layers-per-virtual-pipeline-stage" not in f


def test_megatron_interleaved_even() -> None:
    f = megatron_flags(export_plan(*CASES["interleaved-vpp2"], "megatron").text)
    assert f["--num-layers-per-virtual-pipeline-stage"] == "10"


def test_megatron_fp8_zero2_cp() -> None:
    f = megatron_flags(export_plan(*CASES["cp2-fp8-zero2"], "megatron").text)
    assert (f["--fp8-format"], f["--fp8-recipe"]) == ("hybrid", "delayed")
    assert f["--use-megatron-fsdp"] is True and f["--data-parallel-sharding-strategy"] == "optim_grads"
    assert f["--context-parallel-size"] == "2"


def test_megatron_deepseek_moe_mla() -> None:
    f = megatron_flags(export_plan(*CASES["deepseek-v3-mla-ep8"], "megatron").text)
    assert f["--moe-layer-freq"] == "[0]*3+[1]*58"
    assert f["--moe-shared-expert-intermediate-size"] == "2048"
    assert f["--moe-ffn-hidden-size"] == "2048"
    assert (f["--q-lora-rank"], f["--kv-lora-rank"], f["--qk-head-dim"], f["--qk-pos-emb-head-dim"],
            f["--v-head-dim"]) == ("1536", "512", "128", "64", "128")
    assert "--group-query-attention" not in f
    assert f["--moe-token-dispatcher-type"] == "alltoall" and f["--moe-grouped-gemm"] is True
    assert f["--recompute-granularity"] == "selective"


def test_megatron_schedules_warn() -> None:
    out = export_plan(*CASES["zero-bubble"], "megatron")
    assert any("1F1B" in w for w in out.warnings), out.warnings
    # pp-before-dp order: Megatron's --use-tp-pp-dp-mapping, allowed because cp = ep = 1.
    f = megatron_flags(export_plan(*CASES["tp-pp-dp-order"], "megatron").text)
    assert f["--use-tp-pp-dp-mapping"] is True


def test_megatron_tp_pp_dp_mapping_dropped_where_megatron_rejects_it() -> None:
    # parallel_state.initialize_model_parallel asserts equal attention / expert dp sizes for a
    # non-pp-last order: with cp=2 they differ (dp vs dp*cp), so the mapping is not exported.
    out = export_plan(LLAMA, Plan(tp=8, pp=4, cp=2, placement="tp-cp-ep-pp-dp"), "megatron")
    assert "--use-tp-pp-dp-mapping" not in megatron_flags(out.text)
    # 640 GPUs, tp8 cp2 pp4: dp 10; Megatron's default order puts pipeline neighbours tp*cp*dp = 160 ranks
    # apart, the plan's pp-before-dp order tp*cp = 16
    assert any("--use-tp-pp-dp-mapping" in w and "160 ranks apart instead of 16" in w for w in out.warnings)


def test_megatron_recompute_block_prefix_is_exact() -> None:
    # The first 2 layers of every 20-layer stage fully recomputed: exactly --recompute-method block.
    modes = (["full"] * 2 + ["none"] * 18) * 4
    out = export_plan(LLAMA, Plan(tp=8, pp=4, recompute=modes), "megatron")
    f = megatron_flags(out.text)
    assert (f["--recompute-granularity"], f["--recompute-method"], f["--recompute-num-layers"]) == \
        ("full", "block", "2")
    assert not any("recompute" in w for w in out.warnings)


def test_megatron_recompute_mix_not_prefix_is_refused() -> None:
    # Full on layers 0-2 and 20, selective on 40-44: Megatron has one granularity and full only on the
    # first K layers of every virtual stage. Priced for a stack that takes lists, the Megatron export
    # refuses (exit 2 on the CLI) instead of writing block K=3 and dropping the selective layers.
    with pytest.raises(InputError) as exc:
        export_plan(*CASES["per-layer-recompute-mix"], "megatron")
    assert exc.value.field == "plan.recompute" and "granularity" in str(exc.value)
    # Priced for Megatron (framework default), evaluate says why and every export refuses the invalid plan.
    est = evaluate(LLAMA, CASES["per-layer-recompute-mix"][1])
    assert not est.fits and any("megatron cannot run this recompute list" in r for r in est.reasons)
    for fmt in FORMATS:
        with pytest.raises(InputError, match="megatron cannot run this recompute list"):
            export_plan(LLAMA, CASES["per-layer-recompute-mix"][1], fmt)


def test_torchtitan_every_nth_layer_is_exact() -> None:
    # Every 2nd block on each rank (rank-local count) -> selective_ac_option "2", no warning.
    modes = (["none", "full"] * 10) * 4
    out = export_plan(LLAMA_LISTS, Plan(tp=8, pp=4, recompute=modes), "torchtitan")
    doc = tomllib.loads(out.text)
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    assert not any("recompute" in w for w in out.warnings)


def test_torchtitan_zero_mapping() -> None:
    doc = tomllib.loads(export_plan(*CASES["zero3-full-recompute"], "torchtitan").text)
    assert doc["parallelism"]["data_parallel_shard_degree"] == 80
    assert doc["parallelism"]["data_parallel_replicate_degree"] == 1
    assert doc["activation_checkpoint"]["mode"] == "full"
    # ZeRO-1 with TP/PP: torchtitan raises "DDP has not supported > 1D parallelism" for replication,
    # so the export shards (FSDP, no reshard after forward) and names the cost.
    out = export_plan(*CASES["tp8-sp-pp4-dp20-zero1-1f1b"], "torchtitan")
    doc = tomllib.loads(out.text)
    assert (doc["parallelism"]["data_parallel_replicate_degree"], doc["parallelism"]["data_parallel_shard_degree"]) \
        == (1, 20)
    assert doc["parallelism"]["fsdp_reshard_after_forward"] == "never"
    assert any("ZeRO-1" in w and "no DDP" in w for w in out.warnings)
    assert doc["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    # Pure data parallelism stays DDP.
    doc = tomllib.loads(export_plan(*CASES["dense-no-tp"], "torchtitan").text)
    assert (doc["parallelism"]["data_parallel_replicate_degree"], doc["parallelism"]["data_parallel_shard_degree"]) \
        == (640, 1)
    assert doc["model"] == {"name": "llama3", "flavor": "8B"}
    doc = tomllib.loads(export_plan(*CASES["interleaved-vpp2"], "torchtitan").text)
    assert doc["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert doc["parallelism"]["pipeline_parallel_layers_per_stage"] == 10


def test_torchtitan_zero_bubble_keeps_layers_per_rank() -> None:
    out = export_plan(*CASES["zero-bubble"], "torchtitan")
    par = tomllib.loads(out.text)["parallelism"]
    assert par["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    if "module_fqns_per_model_part" in par:
        parts = par["module_fqns_per_model_part"]
    else:
        parts = [[None] * par["pipeline_parallel_layers_per_stage"]] * 8
    sizes = [sum(1 for x in p if x is None or x.startswith("layers.")) for p in parts]
    pp = 4
    assert [sizes[r] + sizes[2 * pp - 1 - r] for r in range(pp)] == [20] * pp  # V placement


def test_deepspeed_batch_rule_excludes_model_parallel_ranks() -> None:
    doc = json.loads(export_plan(*CASES["cp2-fp8-zero2"], "deepspeed").text)
    # dp = 640 / (tp8 * cp2 * pp4) = 10; 1280 = 1 x 128 x 10.
    assert doc["autoshard"]["dp"] == 10 and doc["gradient_accumulation_steps"] == 128
    out = export_plan(*CASES["cp2-fp8-zero2"], "deepspeed")
    assert any("cp=2" in w for w in out.warnings)
    assert any("ZeRO stage 0 or 1" in w for w in out.warnings)


def test_maxtext_mesh_and_ici_dcn_split() -> None:
    doc = yaml.safe_load(export_plan(*CASES["tp8-sp-pp4-dp20-zero1-1f1b"], "maxtext", gpus_per_node=8).text)
    assert (doc["ici_tensor_parallelism"], doc["dcn_tensor_parallelism"]) == (8, 1)
    assert (doc["ici_data_parallelism"], doc["dcn_data_parallelism"]) == (1, 20)
    assert (doc["ici_pipeline_parallelism"], doc["dcn_pipeline_parallelism"]) == (1, 4)
    assert doc["num_slices"] == 80
    # A wider node holds part of the data axis too.
    doc = yaml.safe_load(export_plan(*CASES["tp8-sp-pp4-dp20-zero1-1f1b"], "maxtext", gpus_per_node=32).text)
    assert (doc["ici_data_parallelism"], doc["dcn_data_parallelism"]) == (4, 5)
    doc = yaml.safe_load(export_plan(*CASES["zero3-full-recompute"], "maxtext").text)
    assert doc["ici_fsdp_parallelism"] * doc["dcn_fsdp_parallelism"] == 80 and doc["remat_policy"] == "full"


def test_maxtext_uneven_pipeline_pipelines_what_maxtext_can() -> None:
    # 61 DeepSeek-V3 layers over 8 stages: MaxText pipelines the 58 MoE layers of a deepseek block
    # (configs/types.py), 7 per stage = 56, and runs the rest outside the pipeline, with a warning.
    out = export_plan(*CASES["deepseek-v3-mla-ep8"], "maxtext")
    doc = yaml.safe_load(out.text)
    assert doc["decoder_block"] == "deepseek"
    assert (doc["num_layers_per_pipeline_stage"], doc["pipeline_parallel_layers"]) == (7, 56)
    assert any("outside the pipeline" in w for w in out.warnings)


def test_jax_specs_divide_the_real_shapes() -> None:
    doc = json.loads(export_plan(*CASES["tp8-sp-pp4-dp20-zero1-1f1b"], "jax").text)
    assert doc["axis_names"] == ["stage", "data", "expert", "context", "tensor"]
    assert doc["mesh_shape"] == [4, 20, 1, 1, 8]
    assert doc["params"]["wq"] == {"shape": [8192, 8192], "kind": "layer", "spec": [None, "tensor"]}
    # Optimizer state over data=20: no dimension of wq (8192) or mlp_gate (8192 x 28672/8) is a multiple of
    # 20, so ZeRO-1 sharding cannot be expressed for them: replicated, with a warning (not IndivisibleError).
    assert doc["optimizer_state"]["mlp_gate"]["spec"] == [None, "tensor"]
    assert any(w.startswith("optimizer.wq:") for w in doc["autoshard"]["warnings"])
    # dp=80 = data 5 x expert 16 (deepseek-v3, tp1): the embedding's 129280 rows = 80 x 1616 take both axes;
    # the router (7168 x 256) has no dimension that 80 divides: 16 (expert) divides 7168, 5 (data) nothing.
    doc = json.loads(export_plan(*CASES["deepseek-v3-default-split"], "jax").text)
    assert doc["mesh_shape"] == [8, 5, 16, 1, 1]
    assert doc["optimizer_state"]["embed"]["spec"] == [["data", "expert"], None]
    assert doc["optimizer_state"]["router"]["spec"] == ["expert", None]
    assert any(w.startswith("optimizer.router:") and "'data'" in w for w in doc["autoshard"]["warnings"])
    # ZeRO-3 names the data axis fsdp and shards weights over it (dp=64 divides 8192; dp=80 does not).
    prob512 = Problem(**{**LLAMA.model_dump(), "cluster": {"gpu": "h100-sxm", "num_gpus": 512}})
    doc = json.loads(export_plan(prob512, Plan(tp=8, zero_stage=3, recompute="full"), "jax").text)
    assert "fsdp" in doc["axis_names"] and doc["params"]["wq"]["spec"] == ["fsdp", "tensor"]
    doc = json.loads(export_plan(*CASES["zero3-full-recompute"], "jax").text)
    assert doc["params"]["wq"]["spec"] == [None, "tensor"]
    assert doc["params"]["embed"]["spec"] == ["tensor", None]  # 128256/8 rows; 8192 is no multiple of 80
    # Expert weights shard their expert dimension over 'expert'.
    doc = json.loads(export_plan(*CASES["mixtral-ep8"], "jax").text)
    assert doc["params"]["expert_up"]["spec"][0] == "expert"


def test_recompute_runs() -> None:
    assert recompute_runs(["full", "full", "none", "full"]) == [["full", 2], ["none", 1], ["full", 1]]


def test_exports_differ_across_formats_and_plans() -> None:
    pairs = [(c, f) for c in CASES for f in FORMATS if not (c in MIXED and f == "megatron")]
    texts = {export_plan(*CASES[c], f).text for c, f in pairs}
    assert len(texts) == len(pairs)


def test_maxtext_axis_straddling_nodes_warns() -> None:
    # tp=8 on 6-GPU nodes cannot be split into whole ICI x DCN factors.
    out = export_plan(*CASES["tp8-sp-pp4-dp20-zero1-1f1b"], "maxtext", gpus_per_node=6)
    assert any("straddles node boundaries" in w for w in out.warnings)
    doc = yaml.safe_load(out.text)
    assert doc["ici_tensor_parallelism"] * doc["dcn_tensor_parallelism"] == 8
    with pytest.raises(InputError):
        export_plan(*CASES["tp8-sp-pp4-dp20-zero1-1f1b"], "maxtext", gpus_per_node=0)


def test_default_gpus_per_node_comes_from_the_topology() -> None:
    doc = yaml.safe_load(export_plan(*CASES["tp8-sp-pp4-dp20-zero1-1f1b"], "maxtext").text)
    assert doc["ici_tensor_parallelism"] == 8 and doc["num_slices"] == 80  # h100-sxm: 8-GPU NVLink domain


def test_export_to_another_framework_than_priced_warns() -> None:
    plan = Plan(tp=8, pp=4)
    assert not any("priced for" in w for w in export_plan(LLAMA, plan, "megatron").warnings)
    out = export_plan(LLAMA, plan, "torchtitan")
    assert any("priced for megatron" in w and "framework: torchtitan" in w for w in out.warnings)
    titan = Problem(**{**LLAMA.model_dump(), "framework": "torchtitan"})
    assert not any("priced for" in w for w in export_plan(titan, Plan(tp=8, pp=4, zero_stage=3), "torchtitan").warnings)


def test_per_layer_cuda_graphs_exported_as_megatron_spells_them():
    """Megatron-LM arguments.py (d98e8a64dd): --cuda-graph-impl {none,local,transformer_engine,
    full_iteration}; --cuda-graph-scope nargs='+' (megatron-core 0.16's spelling, kept as a hidden alias of
    --cuda-graph-modules), no scope = the whole layer. Not a full-iteration graph: no NaN-check switch."""
    mixtral = problem("mixtral-8x7b")
    plan = Plan(tp=2, pp=4, ep=8, zero_stage=1, cuda_graph_scope=["moe_preprocess", "attn", "moe_router"])
    flags = megatron_flags(export_plan(mixtral, plan, "megatron").text)
    assert flags["--cuda-graph-impl"] == "transformer_engine"
    assert flags["--cuda-graph-scope"] == "attn moe_router moe_preprocess"  # Megatron's order, canonical
    assert "--no-check-for-nan-in-loss-and-grad" not in flags
    whole = megatron_flags(export_plan(LLAMA, Plan(tp=8, pp=4, zero_stage=1, cuda_graph_scope=["layer"]),
                                       "megatron").text)
    assert whole["--cuda-graph-impl"] == "transformer_engine" and "--cuda-graph-scope" not in whole


def test_cuda_graphs_exported_for_megatron_only():
    plan = Plan(tp=8, pp=4, zero_stage=1, cuda_graphs=True)
    flags = megatron_flags(export_plan(LLAMA, plan, "megatron").text)
    assert (flags["--cuda-graph-impl"], flags["--cuda-graph-scope"]) == ("local", "full_iteration")
    assert flags["--no-check-for-nan-in-loss-and-grad"] is True
    assert "--cuda-graph-impl" not in megatron_flags(export_plan(LLAMA, Plan(tp=8, pp=4, zero_stage=1), "megatron").text)
    titan = export_plan(LLAMA, plan, "torchtitan")
    assert any("CUDA graphs" in w for w in titan.warnings), titan.warnings


def test_moe_dispatcher_exported_as_megatron_flex_backend():
    prob = problem("deepseek-v3")
    for dispatcher, expect in ((None, "alltoall"), ("alltoall", "alltoall"), ("deepep", "flex"), ("hybridep", "flex")):
        flags = megatron_flags(export_plan(prob, Plan(tp=1, pp=8, ep=16, zero_stage=1, moe_dispatcher=dispatcher),
                                           "megatron").text)
        assert flags["--moe-token-dispatcher-type"] == expect
        assert flags.get("--moe-flex-dispatcher-backend") == (dispatcher if expect == "flex" else None)
    titan = export_plan(prob, Plan(tp=1, pp=8, ep=16, zero_stage=1, moe_dispatcher="deepep"), "torchtitan")
    assert any("dispatcher deepep is not exported" in w for w in titan.warnings), titan.warnings


def test_hierarchical_cp_exports_the_priced_group_sizes():
    # a2a+p2p: Ulysses all-to-all among the CP ranks of one NVLink domain, the p2p ring across domains,
    # exported as Megatron's --hierarchical-context-parallel-sizes inner outer (nargs='+').
    from autoshard import evaluate

    prob = load_problem({"model": "llama3-70b", "cluster": {"gpu": "h100-sxm", "num_gpus": 512},
                         "training": {"seq_len": 131072, "global_batch_size": 64}})
    plan = Plan(tp=2, cp=16, pp=4, zero_stage=1, recompute="full", cp_comm_type="a2a+p2p")
    flags = megatron_flags(export_plan(prob, plan, "megatron").text)
    # tp2 leaves 4 CP ranks in an 8-GPU node, and 4 divides each TP rank's 32 query and 4 KV heads.
    assert flags["--cp-comm-type"] == "a2a+p2p" and flags["--hierarchical-context-parallel-sizes"] == "4 4"
    est = evaluate(prob, plan)
    assert est.fits and est.time_breakdown_s["cp_comm"] > 0
    # With tp8 no two CP ranks share a node: the hierarchy degenerates to the p2p ring, same price.
    ring = evaluate(prob, Plan(tp=8, cp=16, pp=4, zero_stage=1, recompute="full"))
    flat = evaluate(prob, Plan(tp=8, cp=16, pp=4, zero_stage=1, recompute="full", cp_comm_type="a2a+p2p"))
    assert flat.step_time_s == pytest.approx(ring.step_time_s, rel=1e-12)
    assert megatron_flags(export_plan(prob, Plan(tp=8, cp=16, pp=4, zero_stage=1, recompute="full",
                                                 cp_comm_type="a2a+p2p"), "megatron").text)[
        "--hierarchical-context-parallel-sizes"] == "1 16"
    titan = export_plan(prob, plan, "torchtitan")
    assert any("cp_comm_type a2a+p2p is not exported" in w for w in titan.warnings), titan.warnings


# ---------------------------------------------------------------------------------------
# Recompute: what is priced is what Megatron runs (issue 31 item 17)
# ---------------------------------------------------------------------------------------

DSV3_SPLIT = [7, 8, 8, 8, 8, 8, 8, 6]
# Full recompute where the pipeline queue is deepest (stage 0 all 7 layers, stage 1 its first 4), none
# elsewhere: a per-layer stack runs it, Megatron has no flags for it.
DSV3_STAGE0 = ["full"] * 11 + ["none"] * 50


def test_deepseek_v3_per_layer_recompute_is_flagged_and_refused(tmp_path) -> None:
    from autoshard.cli import main  # noqa: PLC0415
    from autoshard.layouts import megatron_reason  # noqa: PLC0415

    plan = Plan(tp=2, pp=8, ep=8, stage_layers=DSV3_SPLIT, recompute=DSV3_STAGE0)
    lists = problem("deepseek-v3", search={"recompute_layout": "per_layer"})
    mega = problem("deepseek-v3")
    # priced for a stack that takes lists: no recompute reason (only memory: 2 of 8 stages recompute)
    assert not any("recompute" in r for r in evaluate(lists, plan).reasons)
    why = megatron_reason(DSV3_SPLIT, DSV3_STAGE0, 8)
    assert why and "7,4,0,0,0,0,0,0" in why
    est = evaluate(mega, plan)  # priced for Megatron: invalid, and says why
    assert not est.fits and any(why in r for r in est.reasons)
    # the CLI: exit 2, one line naming the field, nothing written (either problem)
    for name, prob in (("lists", lists), ("mega", mega)):
        pf, sf, out = tmp_path / f"{name}.yaml", tmp_path / f"{name}.json", tmp_path / f"{name}.sh"
        pf.write_text(yaml.safe_dump(prob.model_dump(mode="json", exclude_none=True)))
        sf.write_text(json.dumps(plan.model_dump(mode="json", exclude_none=True)))
        assert main(["export", str(sf), "--problem", str(pf), "--format", "megatron", "-o", str(out)]) == 2
        assert not out.exists()
    # The same stages with full recompute on the first 2 layers of each: Megatron's block K=2, exactly.
    block = [m for n in DSV3_SPLIT for m in ["full", "full"] + ["none"] * (n - 2)]
    f = megatron_flags(export_plan(mega, plan.model_copy(update={"recompute": block}), "megatron").text)
    assert (f["--recompute-granularity"], f["--recompute-method"], f["--recompute-num-layers"]) == \
        ("full", "block", "2")


def test_solver_plans_only_what_megatron_runs_and_exports_it_exactly() -> None:
    # Llama 3 8B, 8 x A100 40 GB, 8k tokens, TP2 PP2, recompute none / full / offload searched. Before
    # the fix the solver planned offload:3 on a PP2 pipeline (20.08 s) that megatron-core's
    # TransformerConfig refuses ("no support for Pipeline parallelism with CPU offloading") and the
    # export wrote --cpu-offloading-num-layers 1; now it plans full recompute on the first 5 layers
    # of each stage (--recompute-method block, 20.8 s), and evaluate, the solver and the export agree.
    from autoshard import load_problem, solve  # noqa: PLC0415
    from autoshard.layouts import megatron_recompute  # noqa: PLC0415

    doc = {"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64},
           "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 8},
           "search": {"tp": [2], "cp": [1], "pp": [2], "vpp": [1], "zero_stage": [1], "micro_batch_size": [1],
                      "recompute": ["none", "full", "offload"]}}
    prob = load_problem(doc)
    sol = solve(prob, top_k=0, time_limit_s=60)
    rc = list(sol.plan.recompute_per_layer(32))
    split = list(sol.plan.stage_layers or [16, 16])
    got = megatron_recompute(split, rc, 2)
    assert got is not None and "offload" not in rc
    assert not evaluate(prob, sol.plan).reasons
    f = megatron_flags(export_plan(prob, sol.plan, "megatron").text)
    if got.granularity == "full":
        assert (f["--recompute-method"], int(f["--recompute-num-layers"])) == (got.method, got.num_layers)
        # Megatron's block rule (transformer_block.py): the first K layers of every virtual stage
        k = got.num_layers
        assert rc == [m for n in split for m in ["full"] * min(k, n) + ["none"] * (n - min(k, n))]
    assert "--cpu-offloading-num-layers" not in f


# ---------------------------------------------------------------------------------------
# torchtitan: the flavor is the priced shape (issue 31 item 18)
# ---------------------------------------------------------------------------------------


def test_torchtitan_preset_with_shape_overrides_is_not_the_preset_flavor() -> None:
    def titan(model) -> tuple[dict, Export]:
        prob = load_problem({"model": model, "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
                             "training": {"seq_len": 2048, "global_batch_size": 64}})
        out = export_plan(prob, Plan(tp=2, pp=2), "torchtitan")
        return tomllib.loads(out.text), out

    doc, _ = titan("llama3-8b")  # the preset's own shape: torchtitan's 8B flavor
    assert doc["model"] == {"name": "llama3", "flavor": "8B"} and "experimental" not in doc
    # The override: 6 layers, width 256, the preset's 32 heads of 128. Not 8B; torchtitan's llama3
    # (head_dim = dim / n_heads = 8) cannot build it: a flavor registered nowhere, and the warning says so.
    doc, out = titan({"preset": "llama3-8b", "num_hidden_layers": 6, "hidden_size": 256})
    assert doc["model"]["flavor"] != "8B" and doc["model"]["flavor"].startswith("autoshard-llama3-8b-6L-256d-")
    assert any("registered nowhere" in w and "head_dim 128" in w for w in out.warnings)
    # A llama3 shape: registered by the module the job imports ([experimental] custom_import), whose text
    # the export carries; FFN 512 below int(2 * 4 * 256 / 3) = 682: ffn_dim_multiplier (512.5 / 682).
    doc, out = titan({"preset": "llama3-8b", "num_hidden_layers": 6, "hidden_size": 256, "num_attention_heads": 16,
                      "num_key_value_heads": 4, "head_dim": 16, "intermediate_size": 512})
    module = doc["experimental"]["custom_import"]
    assert f"# --- save as {module}.py" in out.text
    line = next(x for x in out.text.splitlines() if "llama3_args[" in x)
    assert f"llama3_args[{doc['model']['flavor']!r}] = TransformerModelArgs(dim=256, n_layers=6, n_heads=16, " \
           "n_kv_heads=4, vocab_size=128256, multiple_of=1, ffn_dim_multiplier=" in line
    mult = float(re.search(r"ffn_dim_multiplier=([0-9.e-]+)", line).group(1))
    assert int(mult * int(2 * 4 * 256 / 3)) == 512  # torchtitan FeedForward's sizing, multiple_of 1

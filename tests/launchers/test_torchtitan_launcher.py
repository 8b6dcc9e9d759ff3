"""torchtitan exports against torchtitan 0.2.2's own code (CPU, fake process group).

- `ConfigManager().parse_args(["--job.config_file", <export>])` loads the TOML;
- the `[model]` name/flavor is registered (`get_train_spec`) and builds the planned shape (layers,
  width, heads, head_dim, FFN width from torchtitan's own modules on the meta device), after importing
  `[experimental] custom_import` as torchtitan's Trainer does (the module saved from the export's
  comment block) where the export registers a custom flavor; or the export says the flavor is
  registered nowhere (torchtitan's llama3 cannot build the shape) and it indeed is not;
- `ParallelDims` validates the degrees and `build_mesh` gives rank 0 the plan's groups;
- the DDP branch of `parallelize_llama` ("DDP has not supported > 1D parallelism") is not taken
  with other parallelism;
- `pipeline_llm` splits a stand-in model of the planned layer count: every rank gets the planned
  layers (per-rank counts for ZBV's V placement), and torchtitan's `apply_ac` on each part
  checkpoints the planned layers (or more, where the export warns);
- the batch: local batch x data-parallel degree x accumulation = the global batch.

torchtitan 0.2.2 imports its Triton MoE kernels at import time; without Triton (CPU CI) the one
module holding them (torchtitan.models.moe.kernels) is replaced by a stub none of these tests call.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import typing
import warnings
from types import SimpleNamespace

import pytest

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchtitan") is None:
    pytest.skip("torchtitan / torch not installed (pip install -e '.[launchers]')", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _launcher():
    """Import torch and torchtitan when this module's first test runs, not at collection."""
    global torch, dist, nn, titan_ac, FakeStore, ConfigManager, ParallelDims, pipeline_llm  # noqa: PLW0603
    global get_train_spec  # noqa: PLW0603
    if importlib.util.find_spec("triton") is None and "torchtitan.models.moe.kernels" not in sys.modules:
        stub = types.ModuleType("torchtitan.models.moe.kernels")
        stub.generate_permute_indices = None  # Triton kernel: GPU only
        sys.modules["torchtitan.models.moe.kernels"] = stub
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torchtitan.distributed.activation_checkpoint as titan_ac
    import torchtitan.models  # noqa: F401  (registers the train specs)
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.protocols.train_spec import get_train_spec
    yield


from launcher_cases import CASE_IDS, exported, full_plan, plan_groups  # noqa: E402


@pytest.fixture(scope="module")
def fake_pg(_launcher):
    def start(world: int, rank: int = 0) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(backend="fake", rank=rank, world_size=world, store=FakeStore())
    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def load(case: str, tmp_path):
    path = tmp_path / f"{case.replace(':', '_')}.toml"
    path.write_text(exported(case, "torchtitan").text)
    return ConfigManager().parse_args(["--job.config_file", str(path)])


def parallel_dims(cfg, world: int):
    p = cfg.parallelism
    return ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=world)


@pytest.mark.parametrize("case", CASE_IDS)
def test_config_loads_with_the_planned_model(case: str, tmp_path) -> None:
    prob, plan, dp = full_plan(case)
    m = prob.model
    out = exported(case, "torchtitan")
    cfg = load(case, tmp_path)
    # precision: a registered converter with a recipe torchtitan accepts, or bf16 with a warning
    from torchtitan.protocols.model_converter import _registry_model_converter_cls  # noqa: PLC0415
    assert set(cfg.model.converters) <= set(_registry_model_converter_cls)
    prec = prob.training.precision
    if "quantize.linear.float8" in cfg.model.converters:
        assert cfg.quantize.linear.float8.recipe_name in ("tensorwise", "rowwise", "rowwise_with_gw_hp")
    if "quantize.linear.mx" in cfg.model.converters:
        assert cfg.quantize.linear.mx.recipe_name == "mxfp8_cublas"
    if prec not in ("bf16", "fp16") and not cfg.model.converters:
        assert any(w.startswith(f"precision {prec}:") for w in out.warnings)
    # torchtitan declares the dtypes it runs (a Literal on the field): the export must be one of them
    hint = typing.get_type_hints(type(cfg.training))["mixed_precision_param"]
    assert cfg.training.mixed_precision_param in typing.get_args(hint) == ("bfloat16", "float32")
    if prec == "fp16":
        assert any("no fp16" in w for w in out.warnings)
    if cfg.experimental.custom_import:  # torchtitan train.py: importlib.import_module(custom_import) first
        module = cfg.experimental.custom_import
        text = out.text.split(f"# --- save as {module}.py", 1)[1].split("\n", 1)[1].split("# --- end ---")[0]
        (tmp_path / f"{module}.py").write_text("".join(line[2:] + "\n" for line in text.splitlines()))
        sys.path.insert(0, str(tmp_path))
        try:
            importlib.import_module(module)
        finally:
            sys.path.remove(str(tmp_path))
    spec = get_train_spec(cfg.model.name)
    if cfg.model.flavor not in spec.model_args:  # the export says so, and it is true
        assert any("registered nowhere" in w for w in out.warnings)
        return
    a = spec.model_args[cfg.model.flavor]
    assert (a.dim, a.n_layers, a.n_heads, a.vocab_size) == (m.hidden_size, m.num_hidden_layers,
                                                           m.num_attention_heads, m.vocab_size)
    if getattr(a, "n_kv_heads", None) is not None:
        assert a.n_kv_heads == m.kv_heads
    if hasattr(a, "moe_args") and m.is_moe:
        assert (a.moe_args.num_experts, a.moe_args.top_k) == (m.num_experts, m.num_experts_per_tok)
    if hasattr(a, "n_dense_layers"):
        assert (a.n_dense_layers, a.inter_dim, a.moe_inter_dim) == (m.first_k_dense_replace, m.intermediate_size,
                                                                    m.expert_ffn)
        assert (a.q_lora_rank, a.kv_lora_rank, a.v_head_dim) == (m.q_lora_rank, m.kv_lora_rank, m.v_head_dim)
    if cfg.model.name == "llama3":  # shapes from torchtitan's own modules (FeedForward sizing, head_dim)
        with torch.device("meta"):
            model = spec.model_cls(a)
        assert len(model.layers) == m.num_hidden_layers
        assert tuple(model.layers["0"].feed_forward.w1.weight.shape) == (m.intermediate_size, m.hidden_size)
        att = model.layers["0"].attention
        assert tuple(att.wq.weight.shape) == (m.num_attention_heads * m.head_size, m.hidden_size)
        assert tuple(att.wk.weight.shape) == (m.kv_heads * m.head_size, m.hidden_size)


@pytest.mark.parametrize("case", CASE_IDS)
def test_parallel_dims_and_groups(case: str, tmp_path, fake_pg) -> None:
    prob, plan, dp = full_plan(case)
    out = exported(case, "torchtitan")
    cfg = load(case, tmp_path)
    world = prob.cluster.num_gpus
    pd = parallel_dims(cfg, world)  # validates the degrees
    p = cfg.parallelism
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == dp
    # parallelize_llama (models/llama3/infra/parallelize.py): replication without FSDP is DDP, which
    # raises "DDP has not supported > 1D parallelism" unless it spans the whole world.
    if pd.dp_replicate_enabled and not pd.fsdp_enabled:
        assert pd.dp_replicate == world
    # Batch: global = local x (replicate x shard) x gradient accumulation (trainer.py).
    t = cfg.training
    assert t.global_batch_size == prob.training.global_batch_size
    assert t.global_batch_size % (t.local_batch_size * dp) == 0
    if p.pipeline_parallel_degree > 1:
        assert t.local_batch_size // p.pipeline_parallel_microbatch_size * (
            t.global_batch_size // (t.local_batch_size * dp)) == prob.training.global_batch_size // (
            plan.micro_batch_size * dp)
    assert t.seq_len == prob.training.seq_len
    fake_pg(world)
    pd.build_mesh()
    expressible = not any("placement" in w and "not expressible" in w for w in out.warnings)
    for name, axes in (("tp", ("tp",)), ("pp", ("pp",)), ("cp", ("cp",)), ("batch", ("ep", "dp"))):
        size = {"tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "batch": dp}[name]
        if size == 1:
            continue
        ranks = sorted(pd.get_mesh(name).mesh.flatten().tolist())
        assert len(ranks) == size
        if expressible or name == "tp":
            assert ranks == plan_groups(plan, dp, axes)[0], name


@pytest.mark.parametrize("case", [c for c in CASE_IDS if full_plan(c)[1].pp > 1])
def test_pipeline_layers_and_recompute_per_rank(case: str, tmp_path, fake_pg) -> None:
    prob, plan, dp = full_plan(case)
    out = exported(case, "torchtitan")
    cfg = load(case, tmp_path)
    L = prob.model.num_hidden_layers
    pp = plan.pp

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

    class Stand(nn.Module):  # the module names torchtitan's llama3 / deepseek_v3 / qwen3 models use
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(4, 2)
            self.layers = nn.ModuleDict({str(i): Block() for i in range(L)})
            self.norm = nn.LayerNorm(2)
            self.output = nn.Linear(2, 4)

    def parallelize(model, _pd, job_config):  # as parallelize_llama: AC unless mode "none"
        if job_config.activation_checkpoint.mode != "none":
            titan_ac.apply_ac(model, job_config.activation_checkpoint)
        return model

    planned = plan.recompute_per_layer(L)
    from autoshard.cost import even_split  # noqa: PLC0415
    stages = list(plan.stage_layers) if plan.stage_layers else even_split(L, pp * plan.vpp)
    mode_of: dict[int, str] = {}
    for r in range(pp):
        fake_pg(pp, r)  # the pipeline split depends on the pp rank only
        pd = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=pp, ep=1, etp=1, world_size=pp)
        pd.build_mesh()
        titan_ac._layer_sac_count = 0  # a fresh process per rank
        _, parts, _, _ = pipeline_llm(Stand(), pd, cfg, torch.device("cpu"), SimpleNamespace(n_layers=L),
                                      parallelize, lambda *a: 0)
        mine = [int(k) for part in parts for k in part.layers.keys()]
        want = sum(stages[c] for c in range(r, pp * plan.vpp, pp))
        assert len(mine) == want, (r, len(mine), want)  # the planned layer count on every rank
        if cfg.parallelism.pipeline_parallel_schedule != "ZBVZeroBubble":
            assert mine == [i for c in range(r, pp * plan.vpp, pp)
                            for i in range(sum(stages[:c]), sum(stages[:c + 1]))]
        for part in parts:
            for k, layer in part.layers.items():
                if type(layer).__name__ != "CheckpointWrapper":
                    mode_of[int(k)] = "none"
                else:
                    kw = getattr(layer.checkpoint_fn, "keywords", {})
                    mode_of[int(k)] = "selective" if "context_fn" in kw else "full"
    got = [mode_of[i] for i in range(L)]
    if not any("recompute" in w and "not" in w for w in out.warnings):
        assert got == planned
    else:  # closest setting: at least the planned recompute on every layer
        rank = {"none": 0, "selective": 1, "full": 2}  # Megatron recompute modules: partial, as selective
        assert all(rank[g] >= rank.get(p, 1) for g, p in zip(got, planned))
    if cfg.parallelism.pipeline_parallel_schedule == "ZBVZeroBubble":
        assert any("lands on rank 0" in w for w in out.warnings)

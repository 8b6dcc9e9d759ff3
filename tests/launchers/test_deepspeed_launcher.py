"""DeepSpeed exports against DeepSpeed 0.19's own `DeepSpeedConfig` (CPU accelerator, fake process
group of the real world size), as `deepspeed.initialize` builds it:

- pure data parallelism: no mpu, every rank data-parallel, `train_batch_size` checked by DeepSpeed's
  own batch assertion against micro x GAS x world;
- pipelines: the mpu deepspeed.initialize takes from a PipelineModule (`PipelineParallelGrid` over
  DeepSpeed's `PipeModelDataParallelTopology`), which gives the plan's data-parallel size;
- TP/CP without PP: the mpu Megatron-DeepSpeed passes (data-parallel size = the plan's dp), and for
  AutoTP the config also loads without one (no pinned train_batch_size to contradict);
- DeepSpeed derives train_batch_size = the planned global batch; ZeRO stage, bf16/fp16 and
  activation checkpointing as planned; even pipeline splits equal DeepSpeed's `partition_uniform`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("deepspeed") is None:
    pytest.skip("deepspeed / torch not installed (pip install -e '.[launchers]')", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _launcher():
    """Import torch and DeepSpeed when this module's first test runs, not at collection."""
    global dscomm, dist, DeepSpeedConfig, partition_uniform, FakeStore  # noqa: PLW0603
    global PipelineParallelGrid, PipeModelDataParallelTopology  # noqa: PLW0603
    warnings.filterwarnings("ignore")
    import deepspeed.comm as dscomm
    import torch.distributed as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology
    from deepspeed.runtime.utils import partition_uniform
    from torch.testing._internal.distributed.fake_pg import FakeStore
    yield


from launcher_cases import CASE_IDS, exported, full_plan  # noqa: E402


class Mpu:
    """The model-parallel unit Megatron-DeepSpeed passes to deepspeed.initialize (megatron.mpu)."""

    def __init__(self, dp: int, mp: int, pp: int):
        self.dp, self.mp, self.pp = dp, mp, pp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return self.mp

    def get_model_parallel_rank(self) -> int:
        return 0

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.pp


@pytest.fixture(scope="module")
def ds_world(_launcher):
    def start(world: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(backend="fake", rank=0, world_size=world, store=FakeStore())
        dscomm.init_distributed(dist_backend="fake", auto_mpi_discovery=False)
        assert dscomm.get_world_size() == world
    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("case", CASE_IDS)
def test_deepspeed_config_as_initialize_builds_it(case: str, ds_world) -> None:
    prob, plan, dp = full_plan(case)
    out = exported(case, "deepspeed")
    cfg = json.loads(out.text)
    ds_world(prob.cluster.num_gpus)
    model_parallel = plan.tp * plan.pp * plan.cp
    if model_parallel == 1:
        c = DeepSpeedConfig(cfg)  # deepspeed.initialize(model=..., config=cfg): no mpu
    elif plan.pp > 1:
        # deepspeed.initialize(model=PipelineModule(...)) takes mpu = model.mpu(): the pipeline grid of
        # DeepSpeed's own topology (pipe x data x model); built here the same way
        grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(num_pp=plan.pp, num_mp=plan.tp * plan.cp,
                                                                          num_dp=dp))
        c = DeepSpeedConfig(cfg, mpu=grid)
    else:
        c = DeepSpeedConfig(cfg, mpu=Mpu(dp, plan.tp * plan.cp, plan.pp))
        assert "mpu" in cfg["autoshard"]["note"]
    assert c.world_size == dp
    assert c.train_batch_size == prob.training.global_batch_size
    assert c.train_micro_batch_size_per_gpu == plan.micro_batch_size
    assert c.gradient_accumulation_steps == prob.training.global_batch_size // (plan.micro_batch_size * dp)
    assert c.zero_optimization_stage == plan.zero_stage
    if prob.training.precision == "fp16":
        assert c.float16_config.enabled and not c.bfloat16_config.enabled
    else:
        assert c.bfloat16_config.enabled
    if plan.pp == 1 and plan.cp == 1 and plan.tp > 1 and "tensor_parallel" in cfg:
        # AutoTP: deepspeed.initialize passes no mpu (it builds the TP groups itself, after the config),
        # so the config must not pin train_batch_size: DeepSpeed derives micro x GAS x its world size.
        plain = DeepSpeedConfig(cfg)
        assert plain.train_micro_batch_size_per_gpu == plan.micro_batch_size
        assert plain.train_batch_size == plain.train_micro_batch_size_per_gpu * plain.gradient_accumulation_steps \
            * prob.cluster.num_gpus
    full = "full" in plan.recompute_per_layer(prob.model.num_hidden_layers)
    assert ("activation_checkpointing" in cfg) == full


@pytest.mark.parametrize("case", [c for c in CASE_IDS if full_plan(c)[1].pp > 1])
def test_pipeline_partition(case: str) -> None:
    prob, plan, dp = full_plan(case)
    out = exported(case, "deepspeed")
    pm = json.loads(out.text)["autoshard"]["pipeline_module"]
    assert pm["num_stages"] == plan.pp
    per_rank = [sum(pm["stage_layers"][c] for c in range(r, len(pm["stage_layers"]), plan.pp))
                for r in range(plan.pp)]
    if pm["partition_method"] == "uniform":
        bounds = partition_uniform(num_items=prob.model.num_hidden_layers, num_parts=plan.pp)
        assert [b - a for a, b in zip(bounds, bounds[1:])] == per_rank
    else:
        assert any("uneven stage layers" in w for w in out.warnings)
    if plan.vpp > 1:
        assert any("interleaved pipeline" in w for w in out.warnings)

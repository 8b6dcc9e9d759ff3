"""DeepSpeed exports against DeepSpeed 0.19's own `DeepSpeedConfig` (CPU accelerator, fake process
group of the real world size), as `deepspeed.initialize` builds it:

- pure data parallelism: no mpu, every rank data-parallel, `train_batch_size` checked by DeepSpeed's
  own batch assertion against micro x GAS x world;
- pipelines: the mpu deepspeed.initialize takes from a PipelineModule (`PipelineParallelGrid` over
  DeepSpeed's `PipeModelDataParallelTopology`), which gives the plan's data-parallel size;
- TP/CP without PP: the mpu Megatron-DeepSpeed passes (data-parallel size = the plan's dp), and for
  AutoTP DeepSpeed's own `deepspeed.utils.groups` after `_init_tp_mesh_device`, as the export's note says;
- train_batch_size is pinned to the planned global batch: with the mpu DeepSpeed's batch assertion
  accepts it, without one (every rank counted as data-parallel) it refuses the config: never a
  silently doubled batch; ZeRO stage, bf16/fp16 and activation checkpointing as planned; even
  pipeline splits equal DeepSpeed's `partition_uniform`.

No DeepSpeed op is built: `deepspeed.comm`'s TorchBackend JIT-compiles its shared-memory all-reduce
kernel (deepspeed/comm/torch.py build_shm_op; minutes cold, and a lock left by an interrupted build
blocks the next one), which a config check never calls, so the fixture replaces that one loader with
"no kernel" (what build_shm_op itself returns where the op is not compatible). Each test also runs
under an alarm (TIME_LIMIT_S) so a hang fails instead of blocking the suite.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import warnings

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("DS_BUILD_OPS", "0")  # never pre-build ops on import paths that honour it
TIME_LIMIT_S = 120  # per test: a config check takes well under a second; a JIT op build takes minutes
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("deepspeed") is None:
    pytest.skip("deepspeed / torch not installed (pip install -e '.[launchers]')", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _launcher():
    """Import torch and DeepSpeed when this module's first test runs, not at collection."""
    global dscomm, dstorch, dist, DeepSpeedConfig, partition_uniform, FakeStore  # noqa: PLW0603
    global PipelineParallelGrid, PipeModelDataParallelTopology, groups  # noqa: PLW0603
    warnings.filterwarnings("ignore")
    import deepspeed.comm as dscomm
    dstorch = importlib.import_module("deepspeed.comm.torch")  # (the attribute `torch` of deepspeed.comm is torch)
    import torch.distributed as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid, PipeModelDataParallelTopology
    from deepspeed.runtime.utils import partition_uniform
    from deepspeed.utils import groups
    from torch.testing._internal.distributed.fake_pg import FakeStore
    build = dstorch.build_shm_op
    dstorch.build_shm_op = lambda: None  # no JIT op build (see the module docstring)
    yield
    dstorch.build_shm_op = build


@pytest.fixture(autouse=True)
def _time_limit():
    """Fail a test that runs past TIME_LIMIT_S (a stuck build lock, a hung collective) instead of hanging."""
    def expire(signum, frame):
        raise TimeoutError(f"DeepSpeed launcher test ran past {TIME_LIMIT_S} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIME_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


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
        dscomm.comm.cdb = None
        groups._TENSOR_MODEL_PARALLEL_GROUP = groups._DATA_PARALLEL_GROUP = groups._MODEL_PARALLEL_GROUP = None
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
    assert cfg["train_batch_size"] == prob.training.global_batch_size
    if model_parallel == 1:
        c = DeepSpeedConfig(cfg)  # deepspeed.initialize(model=..., config=cfg): no mpu
    else:
        # Launched without a model-parallel unit DeepSpeed counts every rank as data-parallel: its own
        # batch assertion refuses the pinned global batch (the 512 reported for 256 is gone).
        with pytest.raises(AssertionError, match="train_batch_size is not equal"):
            DeepSpeedConfig(cfg)
        if plan.pp > 1:
            # deepspeed.initialize(model=PipelineModule(...)) takes mpu = model.mpu(): the pipeline grid of
            # DeepSpeed's own topology (pipe x data x model); built here the same way
            grid = PipelineParallelGrid(topology=PipeModelDataParallelTopology(
                num_pp=plan.pp, num_mp=plan.tp * plan.cp, num_dp=dp))
            c = DeepSpeedConfig(cfg, mpu=grid)
        elif "tensor_parallel" in cfg:
            # AutoTP, as the note says: DeepSpeed's own TP mesh, then its groups module as the mpu
            assert "mpu=deepspeed.utils.groups" in cfg["autoshard"]["note"]
            groups._init_tp_mesh_device(tensor_model_parallel_size=cfg["tensor_parallel"]["autotp_size"])
            c = DeepSpeedConfig(cfg, mpu=groups)
        else:
            c = DeepSpeedConfig(cfg, mpu=Mpu(dp, plan.tp * plan.cp, plan.pp))
            assert "mpu" in cfg["autoshard"]["note"]
    assert c.world_size == dp
    # re-priced from what DeepSpeed will run: micro x GAS x its data-parallel world = the planned batch
    assert c.train_batch_size == c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * c.world_size \
        == prob.training.global_batch_size
    assert c.train_micro_batch_size_per_gpu == plan.micro_batch_size
    assert c.gradient_accumulation_steps == prob.training.global_batch_size // (plan.micro_batch_size * dp)
    assert c.zero_optimization_stage == plan.zero_stage
    if prob.training.precision == "fp16":
        assert c.float16_config.enabled and not c.bfloat16_config.enabled
    else:
        assert c.bfloat16_config.enabled
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

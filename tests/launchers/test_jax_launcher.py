"""JAX and MaxText exports against JAX's own sharding code (CPU).

- every exported PartitionSpec shards its real tensor shape: `NamedSharding(AbstractMesh(mesh_shape,
  axis_names), P(*spec)).shard_shape(shape)` (which raises IndivisibleError otherwise), and the
  tensor-parallel dimension really is split tp ways;
- on 64 fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=64) the mesh over the
  devices in rank order gives device 0 the plan's groups per axis (`axis_map`: each degree's mesh
  axes), the expert groups Megatron's etp x ep x edp grid forms under MoE parallel folding
  (topology._expert_groups), and every device holds exactly the planned share of the expert weights
  (JAX's own `devices_indices_map`: E x 3 x hidden x ffn / (ep x etp), / edp more under ZeRO-3);
- the batch dimension is split exactly dp ways (micro-batch per replica as planned);
- the MaxText config uses only MaxText's own key names (tests/launchers/data/maxtext_base_keys.txt,
  read from MaxText's base.yml: MaxText itself needs Python >= 3.12), its ICI x DCN degrees match the
  mesh, and its pipeline satisfies MaxText's assertions (configs/types.py: stages x repeats x
  layers per stage == pipelined layers; micro-batches a multiple of the stages).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import yaml

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=64").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if importlib.util.find_spec("jax") is None:
    pytest.skip("jax not installed (pip install -e '.[launchers]')", allow_module_level=True)
CPU_DEVICES = 64  # --xla_force_host_platform_device_count above


@pytest.fixture(scope="module", autouse=True)
def _launcher():
    """Import JAX when this module's first test runs, not at collection (it starts threads)."""
    global jax, np, AbstractMesh, Mesh, NamedSharding, P  # noqa: PLW0603
    import jax
    import numpy as np
    from jax.sharding import AbstractMesh, Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    assert len(jax.devices()) == CPU_DEVICES
    yield


from autoshard.topology import _expert_groups  # noqa: E402

from launcher_cases import CASE_IDS, exported, full_plan, plan_groups  # noqa: E402

MAXTEXT_KEYS = {line.strip() for line in (Path(__file__).parent / "data" / "maxtext_base_keys.txt").read_text()
                .splitlines() if line.strip() and not line.startswith("#")}


def spec_of(entry: list):
    return P(*[tuple(e) if isinstance(e, list) else e for e in entry])


def degree(doc: dict, axis: str) -> int:
    size = dict(zip(doc["axis_names"], doc["mesh_shape"]))
    return math.prod(size[a] for a in doc["autoshard"]["axis_map"][axis])


def folded(prob, plan, dp: int) -> bool:
    return prob.model.is_moe and plan.ep > 1 and (plan.expert_tp != plan.tp or dp % plan.ep > 0)


@pytest.mark.parametrize("case", CASE_IDS)
def test_specs_shard_the_real_shapes(case: str) -> None:
    prob, plan, dp = full_plan(case)
    doc = json.loads(exported(case, "jax").text)
    assert math.prod(doc["mesh_shape"]) == prob.cluster.num_gpus
    assert (degree(doc, "tp"), degree(doc, "pp"), degree(doc, "cp")) == (plan.tp, plan.pp, plan.cp)
    mesh = AbstractMesh(tuple(doc["mesh_shape"]), tuple(doc["axis_names"]))
    for group in ("params", "optimizer_state", "activations"):
        for name, t in doc.get(group, {}).items():
            shard = NamedSharding(mesh, spec_of(t["spec"])).shard_shape(tuple(t["shape"]))  # raises if indivisible
            assert len(shard) == len(t["shape"])
    # the batch: each replica's micro-batch, dp replicas
    tok = doc["activations"]["tokens"]
    assert NamedSharding(mesh, spec_of(tok["spec"])).shard_shape(tuple(tok["shape"]))[0] == plan.micro_batch_size
    p = doc["params"]
    m = prob.model
    if plan.tp > 1:  # Megatron-style column / row parallel weights: split tp ways
        wo = NamedSharding(mesh, spec_of(p["wo"]["spec"])).shard_shape(tuple(p["wo"]["shape"]))
        assert wo[0] == p["wo"]["shape"][0] // plan.tp
    if m.is_moe and plan.ep > 1:  # experts split ep ways, each expert's FFN etp ways
        eu = NamedSharding(mesh, spec_of(p["expert_up"]["spec"])).shard_shape(tuple(p["expert_up"]["shape"]))
        assert eu[0] == m.num_experts // plan.ep
        assert eu[2] == m.expert_ffn // plan.expert_tp
        assert (degree(doc, "ep"), degree(doc, "etp")) == (plan.ep, plan.expert_tp)
    assert len(doc["layer_stage"]) == prob.model.num_hidden_layers
    counts = [doc["layer_stage"].count(r) for r in range(plan.pp)]
    stages = doc["stage_layers"]
    assert counts == [sum(stages[c] for c in range(r, len(stages), plan.pp)) for r in range(plan.pp)]


def _device_ids(doc: dict, n: int):
    devices = np.array(jax.devices()[:n]).reshape(doc["mesh_shape"])
    mesh = Mesh(devices, tuple(doc["axis_names"]))
    return mesh, np.vectorize(lambda d: d.id)(mesh.devices)


def _group_of_device0(doc: dict, ids, axes: list[str]) -> list[int]:
    names = list(doc["axis_names"])
    idx = tuple(slice(None) if n in axes else 0 for n in names)
    return sorted(ids[idx].ravel().tolist())


@pytest.mark.parametrize("case", [c for c in CASE_IDS if full_plan(c)[0].cluster.num_gpus <= CPU_DEVICES])
def test_mesh_groups_on_cpu_devices(case: str) -> None:
    prob, plan, dp = full_plan(case)
    doc = json.loads(exported(case, "jax").text)
    mesh, ids = _device_ids(doc, prob.cluster.num_gpus)
    amap = doc["autoshard"]["axis_map"]
    fold = folded(prob, plan, dp)
    for axis in ("tp", "cp", "pp", "dp", "ep"):
        if not amap[axis]:
            continue
        group = _group_of_device0(doc, ids, amap[axis])
        # (folded: the attention data-parallel group is all dp ranks; the plan carves EP out of DP otherwise)
        want = ("ep", "dp") if axis == "dp" and (fold or not amap["ep"]) else (axis,)
        if axis == "ep" and fold:
            continue  # (checked against Megatron's expert grid below)
        assert group in plan_groups(plan, dp, want), axis
    if fold:
        sizes = {"tp": plan.tp, "cp": plan.cp, "ep": 1, "dp": dp, "pp": plan.pp}
        rows = _expert_groups(plan.axes, sizes, plan.expert_tp, plan.ep)
        for axis, r in zip(("etp", "ep", "edp"), rows):
            if amap[axis]:
                assert _group_of_device0(doc, ids, amap[axis]) in sorted(sorted(map(int, x)) for x in r), axis
    # every device holds the planned share of the expert weights (JAX's own index map per device)
    m = prob.model
    if m.is_moe:
        planned = m.num_experts * 3 * m.hidden_size * m.expert_ffn // (plan.ep * plan.expert_tp)
        if plan.zero_stage == 3:
            planned //= prob.cluster.num_gpus // (plan.pp * plan.ep * plan.expert_tp)
        per_device = {}
        for name in ("expert_gate", "expert_up", "expert_down"):
            t = doc["params"][name]
            sharding = NamedSharding(mesh, spec_of(t["spec"]))
            for dev, index in sharding.devices_indices_map(tuple(t["shape"])).items():
                n = math.prod(len(range(*sl.indices(dim))) for sl, dim in zip(index, t["shape"]))
                per_device[dev.id] = per_device.get(dev.id, 0) + n
        assert set(per_device.values()) == {planned}, (case, sorted(set(per_device.values())), planned)


def test_folded_experts_were_replicated_before() -> None:
    # The case: TP 1, EP 8, ETP 2 on 64 GPUs. The mesh once had no expert axis and the expert
    # weights no tensor axis: every device held all 128 experts, ep x etp = 16x the planned share.
    prob, plan, dp = full_plan("qwen3-etp2-tp1")
    doc = json.loads(exported("qwen3-etp2-tp1", "jax").text)
    mesh = AbstractMesh(tuple(doc["mesh_shape"]), tuple(doc["axis_names"]))
    t = doc["params"]["expert_up"]
    shard = NamedSharding(mesh, spec_of(t["spec"])).shard_shape(tuple(t["shape"]))
    assert math.prod(t["shape"]) // math.prod(shard) == 16 == plan.ep * plan.expert_tp
    assert not any("sharded over the data axis" in w for w in exported("qwen3-etp2-tp1", "jax").warnings)


@pytest.mark.parametrize("case", CASE_IDS)
def test_maxtext_config(case: str) -> None:
    prob, plan, dp = full_plan(case)
    m = prob.model
    out = exported(case, "maxtext")
    cfg = yaml.safe_load(out.text)
    assert set(cfg) <= MAXTEXT_KEYS, set(cfg) - MAXTEXT_KEYS
    param = {"data": "data", "fsdp": "fsdp", "stage": "pipeline", "context": "context", "expert": "expert",
             "tensor": "tensor"}
    deg = {k: cfg[f"ici_{v}_parallelism"] * cfg[f"dcn_{v}_parallelism"] for k, v in param.items()}
    # MaxText's mesh: tp, cp, pp as planned; EP carved out of the data axis, or under MoE parallel folding
    # no expert axis (warned: MaxText has no etp x ep x edp grid)
    fold = folded(prob, plan, dp)
    ep = plan.ep if m.is_moe and not fold else 1
    assert (deg["tensor"], deg["context"], deg["stage"], deg["expert"]) == (plan.tp, plan.cp, plan.pp, ep)
    assert deg["data"] * deg["fsdp"] * ep == dp and (deg["fsdp"] == 1 or plan.zero_stage == 3)
    if fold:
        assert any("no maxtext mesh" in w and "not split over experts" in w for w in out.warnings)
    ici = math.prod(cfg[f"ici_{k}_parallelism"] for k in param.values())
    assert cfg["num_slices"] * ici == prob.cluster.num_gpus
    assert (cfg["base_num_decoder_layers"], cfg["base_emb_dim"], cfg["base_num_query_heads"],
            cfg["base_num_kv_heads"], cfg["base_mlp_dim"], cfg["vocab_size"]) == (
        m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.kv_heads, m.intermediate_size, m.vocab_size)
    if m.is_moe:
        assert (cfg["num_experts"], cfg["num_experts_per_tok"], cfg["base_moe_mlp_dim"]) == (
            m.num_experts, m.num_experts_per_tok, m.expert_ffn)
    assert cfg["dropout_rate"] == (0.1 if m.dropout else 0.0)
    # Batch: per_device_batch_size x devices x gradient accumulation = the global batch.
    assert math.isclose(cfg["per_device_batch_size"] * prob.cluster.num_gpus * cfg["gradient_accumulation_steps"],
                        prob.training.global_batch_size)
    if plan.pp > 1:
        # MaxText configs/types.py: pipeline_parallel_layers defaults to the decoder layers (the MoE
        # layers of a deepseek block); stages x repeats x layers per stage must equal it.
        default = m.num_moe_layers if cfg["decoder_block"] == "deepseek" else m.num_hidden_layers
        pipelined = cfg.get("pipeline_parallel_layers", default)
        assert plan.pp * cfg["num_pipeline_repeats"] * cfg["num_layers_per_pipeline_stage"] == pipelined
        assert pipelined <= m.num_hidden_layers
        assert cfg["num_pipeline_microbatches"] % plan.pp == 0 or any(
            "divisible by the stage count" in w for w in out.warnings)
        if pipelined < m.num_hidden_layers and not (cfg["decoder_block"] == "deepseek" and pipelined == default):
            assert any("outside the pipeline" in w for w in out.warnings)

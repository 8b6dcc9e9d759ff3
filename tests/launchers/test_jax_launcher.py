"""JAX and MaxText exports against JAX's own sharding code (CPU).

- every exported PartitionSpec shards its real tensor shape: `NamedSharding(AbstractMesh(mesh_shape,
  axis_names), P(*spec)).shard_shape(shape)` (which raises IndivisibleError otherwise), and the
  tensor-parallel dimension really is split tp ways;
- on 64 fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=64) the mesh over the
  devices in rank order gives device 0 the plan's groups per axis;
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


from launcher_cases import CASE_IDS, exported, full_plan, plan_groups  # noqa: E402

MAXTEXT_KEYS = {line.strip() for line in (Path(__file__).parent / "data" / "maxtext_base_keys.txt").read_text()
                .splitlines() if line.strip() and not line.startswith("#")}


def spec_of(entry: list):
    return P(*[tuple(e) if isinstance(e, list) else e for e in entry])


@pytest.mark.parametrize("case", CASE_IDS)
def test_specs_shard_the_real_shapes(case: str) -> None:
    prob, plan, dp = full_plan(case)
    doc = json.loads(exported(case, "jax").text)
    size = dict(zip(doc["axis_names"], doc["mesh_shape"]))
    assert math.prod(doc["mesh_shape"]) == prob.cluster.num_gpus
    assert (size["tensor"], size["stage"], size["context"]) == (plan.tp, plan.pp, plan.cp)
    assert size[doc["autoshard"]["axis_map"]["dp"]] * size["expert"] == dp
    mesh = AbstractMesh(tuple(doc["mesh_shape"]), tuple(doc["axis_names"]))
    for group in ("params", "optimizer_state", "activations"):
        for name, t in doc.get(group, {}).items():
            shard = NamedSharding(mesh, spec_of(t["spec"])).shard_shape(tuple(t["shape"]))  # raises if indivisible
            assert len(shard) == len(t["shape"])
    p = doc["params"]
    if plan.tp > 1:  # Megatron-style column / row parallel weights: split tp ways
        m = prob.model
        wo = NamedSharding(mesh, spec_of(p["wo"]["spec"])).shard_shape(tuple(p["wo"]["shape"]))
        assert wo[0] == p["wo"]["shape"][0] // plan.tp
        if m.is_moe and "expert_up" in p:
            eu = NamedSharding(mesh, spec_of(p["expert_up"]["spec"])).shard_shape(tuple(p["expert_up"]["shape"]))
            assert eu[2] == m.expert_ffn // plan.tp
    if plan.ep > 1 and size["expert"] > 1:
        eu = NamedSharding(mesh, spec_of(p["expert_up"]["spec"])).shard_shape(tuple(p["expert_up"]["shape"]))
        assert eu[0] == prob.model.num_experts // plan.ep
    assert len(doc["layer_stage"]) == prob.model.num_hidden_layers
    counts = [doc["layer_stage"].count(r) for r in range(plan.pp)]
    stages = doc["stage_layers"]
    assert counts == [sum(stages[c] for c in range(r, len(stages), plan.pp)) for r in range(plan.pp)]


@pytest.mark.parametrize("case", [c for c in CASE_IDS if full_plan(c)[0].cluster.num_gpus <= CPU_DEVICES])
def test_mesh_groups_on_cpu_devices(case: str) -> None:
    prob, plan, dp = full_plan(case)
    doc = json.loads(exported(case, "jax").text)
    devices = np.array(jax.devices()[: prob.cluster.num_gpus]).reshape(doc["mesh_shape"])
    mesh = Mesh(devices, tuple(doc["axis_names"]))
    ids = np.vectorize(lambda d: d.id)(mesh.devices)
    names = list(doc["axis_names"])
    inv = {v: k for k, v in doc["autoshard"]["axis_map"].items()}
    for axis in names:
        if ids.shape[names.index(axis)] == 1:
            continue
        idx = tuple(slice(None) if n == axis else 0 for n in names)
        group = sorted(ids[idx].ravel().tolist())
        # the data axis holds dp / ep ranks, or all dp ranks where the mesh has no expert axis
        axes = ("ep", "dp") if inv[axis] == "dp" and dict(zip(names, doc["mesh_shape"]))["expert"] == 1 \
            else (inv[axis],)
        assert group in plan_groups(plan, dp, axes), axis


@pytest.mark.parametrize("case", CASE_IDS)
def test_maxtext_config(case: str) -> None:
    prob, plan, dp = full_plan(case)
    m = prob.model
    out = exported(case, "maxtext")
    cfg = yaml.safe_load(out.text)
    assert set(cfg) <= MAXTEXT_KEYS, set(cfg) - MAXTEXT_KEYS
    jx = json.loads(exported(case, "jax").text)
    size = dict(zip(jx["axis_names"], jx["mesh_shape"]))
    param = {"data": "data", "fsdp": "fsdp", "stage": "pipeline", "context": "context", "expert": "expert",
             "tensor": "tensor"}
    for axis, key in param.items():
        assert cfg[f"ici_{key}_parallelism"] * cfg[f"dcn_{key}_parallelism"] == size.get(axis, 1), axis
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

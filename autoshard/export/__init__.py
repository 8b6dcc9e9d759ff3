"""Export a plan to the launchers that run it: Megatron-LM, torchtitan, DeepSpeed, MaxText, JAX.

`export_plan(problem, plan, fmt)` returns an `Export`: the text to write (a bash
flag list, a TOML file, a YAML or JSON document) and the warnings, one line each, about
what the target cannot express exactly and what that costs (to print on stderr). The
text is byte-stable: the same problem and plan give the same bytes.

Targets and the names used (ECOSYSTEM.md §1):

- `megatron`: Megatron-LM core_r0.16 (megatron-core 0.16) `pretrain_gpt.py` flags, with the
  planned model (rotary base, no dropout, router, MTP, norms) and the environment it needs.
  DP is not a flag: Megatron derives it as WORLD_SIZE // (TP*PP*CP).
- `torchtitan`: a torchtitan v0.2.x TOML job file (`--job.config_file`) with its `[model]`
  section, and the equivalent torchtitan 0.3 override line as trailing comments.
- `deepspeed`: a DeepSpeed 0.19 JSON config for `deepspeed.initialize` (micro-batch and
  gradient accumulation; the global batch only where every rank is data-parallel) plus an
  `"autoshard"` block with what DeepSpeed sets in code (PipelineModule, MoE) and the
  Megatron-DeepSpeed flags for TP/PP.
- `maxtext`: a MaxText config (base.yml key names: ici_/dcn_ degrees, batch, pipeline, model).
- `jax`: a JSON of the mesh (`mesh_shape`, `axis_names`, outermost first) and per-tensor
  shapes and PartitionSpecs that divide them, for plain JAX.

Mesh axis mapping (MaxText names): pp -> `stage`, dp -> `data` (`fsdp` under ZeRO-3),
cp -> `context`, ep -> `expert`, tp -> `tensor`.

One module per target (`megatron`, `torchtitan`, `deepspeed`, `jax`, `maxtext`), beside what they
share: `context` (the formats, `Export`, and the plan resolved against the problem), `common`
(serialization and recompute helpers) and `model_facts` (architecture facts per model family).
"""

from __future__ import annotations

from ..errors import InputError
from ..spec import Plan, Problem
from .common import dumps_json, recompute_runs
from .context import FORMATS, TARGETS, Export, _resolve, autoshard_version
from .deepspeed import _deepspeed
from .jax import _jax
from .maxtext import _maxtext
from .megatron import _megatron, megatron_layout
from .model_facts import gpu_arch, model_family, titan_flavor
from .torchtitan import _torchtitan

__all__ = ["Export", "FORMATS", "TARGETS", "autoshard_version", "dumps_json", "export_plan", "gpu_arch",
           "megatron_layout", "model_family", "recompute_runs", "titan_flavor"]


def export_plan(problem: Problem, plan: Plan, fmt: str, *, gpus_per_node: int | None = None) -> Export:
    """Render `plan` for `fmt` (one of FORMATS). Raises InputError on an unknown format or a
    plan that is invalid for the problem. `gpus_per_node` sets the ICI/DCN split of the JAX
    export (default: the innermost network level of the cluster's topology)."""
    key = str(fmt).strip().lower()
    if key not in FORMATS:
        raise InputError(f"unknown export format {fmt!r}; valid formats: {', '.join(FORMATS)}", field="format")
    ctx = _resolve(problem, plan, key, gpus_per_node)
    text = {"megatron": _megatron, "torchtitan": _torchtitan, "deepspeed": _deepspeed, "maxtext": _maxtext,
            "jax": _jax}[key](ctx)
    return Export(fmt=key, text=text, warnings=list(ctx.warnings))

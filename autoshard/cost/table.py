"""`Cost` (one micro-batch through one piece, by category) and `Table` (a config's priced pieces):
the records the cost files pass each other, kept apart so `params` / `moe` / `layers` need not
import one another."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..topology import Placement
from .constants import TIME_KEYS
from .context import Config


@dataclass
class Cost:
    """Time of one micro-batch through one piece (layer, embedding or head), split by category."""

    fwd: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_KEYS, 0.0))
    bwd: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_KEYS, 0.0))
    wgrad_s: float = 0.0  # part of the backward that computes weight gradients (zero-bubble fills)
    act_bytes: float = 0.0  # activations kept per in-flight micro-batch
    work_bytes: float = 0.0  # transient working memory while this piece runs backward
    # buffers the framework keeps for the whole run once per distinct piece (Transformer Engine's dummy
    # weight gradients, `layers.dummy_wgrad_bytes`): a stage holds its layers' largest and its head's
    held_bytes: float = 0.0
    params: float = 0.0  # parameters held on this GPU (before ZeRO sharding)
    expert_params: float = 0.0  # of which expert weights (sharded over expert-DP instead of DP)
    hfu_flops: float = 0.0  # FLOPs executed (incl. recompute), per micro-batch on this GPU
    base_flops: float = 0.0  # FLOPs a step needs without recompute (forward + backward)
    # time the EP overlap saves this piece (all-to-all hidden less host time exposed: `ep_overlap_pays`)
    ep_overlap_gain_s: float = 0.0
    # work run once per step after the rank's last backward, before its gradient sync, outside the
    # per-micro-batch times above (Megatron's deferred output-layer weight gradients: `deferred_head_wgrad`)
    deferred_s: float = 0.0

    @property
    def fwd_s(self) -> float:
        return sum(self.fwd.values())

    @property
    def bwd_s(self) -> float:
        return sum(self.bwd.values())

    @property
    def total_s(self) -> float:
        return sum(self.fwd.values()) + sum(self.bwd.values())  # (fwd_s + bwd_s, inlined: a hot path)


@dataclass
class Table:
    """Everything about a config that does not depend on per-layer choices."""

    cfg: Config
    placement: Placement
    layers: dict[tuple[str, str], Cost]  # (kind, recompute) -> cost
    embed: Cost
    head: Cost
    pp_p2p_s: float  # one send of a micro-batch's activation to the next stage
    microbatches: int
    memo: dict = field(default_factory=dict)  # figures derived from layers / embed / head alone (shared with them)


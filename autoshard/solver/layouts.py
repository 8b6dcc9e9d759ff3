"""The recompute-layout predicate the solver plans with: `autoshard.layouts` (a ground-floor module that
cost, the solver and the exports all import, so none of them imports another for it), re-exported here
under the solver's name."""

from ..layouts import (  # noqa: F401  (re-exported)
    LAUNCHER_OF,
    LAYOUTS,
    MegatronRecompute,
    block_layers,
    every_nth_layers,
    every_nth_list,
    expressible,
    layout_reason,
    megatron_reason,
    megatron_recompute,
    planned_modes,
    project,
    rank_modes,
    recompute_layout,
    search_modes,
)

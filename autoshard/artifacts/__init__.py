"""Readers for the artifacts a team already has, and the calibration built on them.

    from autoshard.artifacts import read_log, read_trace, read_nccl_tests

* `logs.read_log`: Megatron-LM / Megatron-DeepSpeed / torchtitan / DeepSpeed training logs -> steady
  step time (median after warm-up) and the logged arguments;
* `trace.read_trace`: PyTorch profiler Chrome traces -> GPU time per step by kernel class;
* `nccl.read_nccl_tests`: nccl-tests output -> bus bandwidth by size, ranks and hosts;
* `runs.measured_run`: a log (+ config / problem file) -> Problem, Plan, measured step;
* `profile.calibrate_artifacts`: `autoshard calibrate --logs ...` (see docs/calibration.md).
"""

from .logs import LogRun, read_log, read_toml
from .nccl import NcclTest, read_nccl_tests
from .trace import TraceSummary, read_trace

__all__ = ["LogRun", "NcclTest", "TraceSummary", "read_log", "read_nccl_tests", "read_toml", "read_trace"]

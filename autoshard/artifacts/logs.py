"""Training logs -> measured step times and the run's settings.

Formats, each read from the framework's own source (the test data README names the commits):

* **Megatron-LM** (`megatron/training/training.py`, `training_log`): one line per log interval,
  `[date] iteration N/ T | consumed samples: ... | elapsed time per iteration (ms): X | ... |
  global batch size: B | ...`; X is the mean over the iterations since the previous line. The
  arguments are printed once at start (`megatron/training/arguments.py`, `_print_args`): a line
  `------------------------ arguments ------------------------`, then `  name ..... value` per
  argument, then `-------------------- end of arguments ---------------------`. Megatron-DeepSpeed
  prints the same two things.
* **torchtitan** (`torchtitan/components/metrics.py`, `MetricsProcessor.log`): `step: N  loss: L
  [grad_norm: G]  memory: M GiB(P%)  tps: T  tflops: F  mfu: U%`, with ANSI colours unless
  disabled; `tps` is tokens per second per GPU (`ntokens / (time * non_data_parallel_size)`), so
  the step time is `global batch x seq_len / (tps x world size)`. The batch is read from
  `Trainer is initialized with local batch size L, global batch size G, gradient accumulation steps
  A, sequence length S, ...` (`torchtitan/train.py`), the degrees from `Building device mesh with
  parallelism: pp=.., dp_replicate=.., dp_shard=.., cp=.., tp=.., ep=.., etp=..`
  (`torchtitan/distributed/parallel_dims.py`) and the GPU from `CUDA capacity: NAME with X GiB
  memory` (`metrics.py`, `build_device_memory_monitor`); the TOML job config (`--config`) gives the
  same and the recompute mode.
* **DeepSpeed** (`deepspeed/utils/timer.py`, `ThroughputTimer.stop`): `epoch=E/micro_step=M/
  global_step=S, RunningAvgSamplesPerSec=R, CurrSamplesPerSec=C, MemAllocated=..GB,
  MaxMemAllocated=..GB`, every `steps_per_print` steps; C = train_batch_size / the last step's time,
  so the step time is `train_batch_size / C`, with `train_batch_size` from the engine's
  configuration dump (`deepspeed/runtime/config.py`, `DeepSpeedConfig.print`: `  train_batch_size
  ..... B`).

Steady state: a logged value covers the iterations since the previous logged one; values whose span
touches the first `WARMUP_ITERATIONS` iterations are dropped (compilation, NCCL set-up, allocator
growth), as is always the first logged value. The run's step time is the median of the rest.
"""

from __future__ import annotations

import ast
import os
import re
import statistics
import tomllib
from dataclasses import dataclass, field
from typing import Any

from .files import MAX_CONFIG_BYTES, MAX_LOG_BYTES, at_line, read_text

WARMUP_ITERATIONS = 3
ANSI = re.compile(r"\x1b\[[0-9;]*m")

MEGATRON_ITER = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
MEGATRON_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)\s*\|")
MEGATRON_GBS = re.compile(r"global batch size:\s*(\d+)\s*\|")
ARGS_START = re.compile(r"-{3,} arguments -{3,}\s*$")
ARGS_END = re.compile(r"-{3,} end of arguments -{3,}\s*$")
ARG_LINE = re.compile(r"^\s*(?:\S*\s)?\s*([A-Za-z_][A-Za-z0-9_]*) \.{2,} (.*?)\s*$")

TITAN_STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*(\S+)\s+(?:grad_norm:\s*\S+\s+)?memory:\s*([0-9.]+)GiB\(([0-9.]+)%\)"
                        r"\s+tps:\s*([0-9,]+)\s+tflops:\s*([0-9,.]+)\s+mfu:\s*(\S+)")
TITAN_INIT = re.compile(r"Trainer is initialized with local batch size (\d+), global batch size (\d+), "
                        r"gradient accumulation steps (\d+), sequence length (\d+)")
TITAN_MESH = re.compile(r"Building device mesh with parallelism: pp=(\d+), dp_replicate=(\d+), dp_shard=(\d+), "
                        r"cp=(\d+), tp=(\d+)(?:, ep=(\d+))?(?:, etp=(\d+))?")
TITAN_DEVICE = re.compile(r"\b[A-Z]+ capacity: (.+?) with ([0-9.]+)GiB memory")

DS_TPUT = re.compile(r"epoch=(\d+)/micro_step=(\d+)/global_step=(\d+), RunningAvgSamplesPerSec=(\S+), "
                     r"CurrSamplesPerSec=([^,\s]+)")
DS_CONFIG_START = re.compile(r"DeepSpeedEngine configuration:\s*$")
DS_CONFIG_LINE = re.compile(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*) \.{2,} (.*?)\s*$")  # after any log prefix


@dataclass
class Sample:
    """One logged step-time value: the mean over iterations (first, last]."""

    first: int  # the previous logged iteration (0 at the start)
    last: int
    step_s: float
    line: int


@dataclass
class LogRun:
    path: str
    format: str  # megatron, torchtitan, deepspeed
    samples: list[Sample]
    steady: list[Sample]
    step_s: float  # median over the steady samples
    args: dict[str, Any] = field(default_factory=dict)  # Megatron arguments / DeepSpeed config as logged
    settings: dict[str, Any] = field(default_factory=dict)  # torchtitan: batch, degrees, device
    gpu_name: str | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return (f"{os.path.basename(self.path)} ({self.format}): {len(self.steady)} steady of {len(self.samples)} "
                f"logged values, median step {self.step_s:.4g} s")


def _value(text: str) -> Any:
    t = text.strip()
    if t in ("None", "True", "False") or re.fullmatch(r"[-+]?\d+", t) or re.fullmatch(r"[-+]?[0-9.]+(e[-+]?\d+)?", t, re.I) \
            or t[:1] in "[({'\"":
        try:
            return ast.literal_eval(t)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return t
    return t


def _steady(path: str, samples: list[Sample]) -> tuple[list[Sample], float]:
    if not samples:
        raise at_line(path, None, "no step-time lines found (Megatron 'elapsed time per iteration (ms)', torchtitan "
                                  "'step: N ... tps:', DeepSpeed 'CurrSamplesPerSec=')")
    steady = [s for i, s in enumerate(samples) if i > 0 and s.first >= WARMUP_ITERATIONS]
    if not steady:
        raise at_line(path, samples[-1].line, f"only warm-up step times ({len(samples)} logged value(s), every one "
                                              f"covering the first {WARMUP_ITERATIONS} iterations or the first logged): "
                                              "log a longer run")
    return steady, statistics.median(s.step_s for s in steady)


def _megatron(path: str, lines: list[str]) -> LogRun | None:
    args: dict[str, Any] = {}
    samples: list[Sample] = []
    in_args = False
    prev = 0
    gbs_logged: set[int] = set()
    for no, raw in enumerate(lines, 1):
        line = ANSI.sub("", raw)
        if ARGS_START.search(line) and "end of" not in line:
            in_args, args = True, {}
            continue
        if in_args:
            if ARGS_END.search(line):
                in_args = False
                continue
            m = ARG_LINE.match(line)
            if m:
                args[m.group(1)] = _value(m.group(2))
            continue
        m = MEGATRON_ITER.search(line)
        if not m:
            continue
        ms = MEGATRON_MS.search(m.group(3))
        if not ms:
            continue
        it = int(m.group(1))
        try:
            value = float(ms.group(1))
        except ValueError:
            raise at_line(path, no, f"elapsed time per iteration is not a number: {ms.group(1)!r}") from None
        if not value > 0:
            raise at_line(path, no, f"elapsed time per iteration must be > 0 ms, got {ms.group(1)}")
        if it <= prev:
            raise at_line(path, no, f"iteration {it} after iteration {prev}: two runs in one file? give one log per run")
        g = MEGATRON_GBS.search(m.group(3))
        if g:
            gbs_logged.add(int(g.group(1)))
        samples.append(Sample(prev, it, value / 1000.0, no))
        prev = it
    if in_args:
        raise at_line(path, len(lines), "the arguments dump has no 'end of arguments' line (truncated log?)")
    if not samples:
        return None
    steady, med = _steady(path, samples)
    run = LogRun(path, "megatron", samples, steady, med, args=args)
    if len(gbs_logged) > 1:
        run.notes.append(f"the global batch changes during the run ({sorted(gbs_logged)}): batch ramp-up; the "
                         "arguments' global_batch_size is priced")
    return run


def _torchtitan(path: str, lines: list[str]) -> LogRun | None:
    settings: dict[str, Any] = {}
    gpu = None
    prev = 0
    tps_of: list[tuple[int, int, float, int]] = []
    for no, raw in enumerate(lines, 1):
        line = ANSI.sub("", raw)
        m = TITAN_INIT.search(line)
        if m:
            settings.update(local_batch_size=int(m.group(1)), global_batch_size=int(m.group(2)),
                            gradient_accumulation_steps=int(m.group(3)), seq_len=int(m.group(4)))
            continue
        m = TITAN_MESH.search(line)
        if m:
            names = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp")
            settings["mesh"] = {k: int(v) for k, v in zip(names, m.groups()) if v is not None}
            continue
        m = TITAN_DEVICE.search(line)
        if m:
            gpu = m.group(1).strip()
            continue
        m = TITAN_STEP.search(line)
        if m:
            step = int(m.group(1))
            tps = float(m.group(5).replace(",", ""))
            if not tps > 0:
                raise at_line(path, no, f"tps must be > 0, got {m.group(5)}")
            if step <= prev:
                raise at_line(path, no, f"step {step} after step {prev}: two runs in one file? give one log per run")
            tps_of.append((prev, step, tps, no))
            prev = step
    if not tps_of:
        return None
    run = LogRun(path, "torchtitan", [], [], 0.0, settings=settings, gpu_name=gpu)
    run.notes.append("step time = global batch x seq_len / (tps x world size): tps is tokens per second per GPU "
                     "(torchtitan metrics.py)")
    run.samples = [Sample(a, b, 1.0 / t, no) for a, b, t, no in tps_of]  # 1/tps until the batch is known
    return run


def finish_torchtitan(run: LogRun, global_batch: int, seq_len: int, world: int) -> None:
    """Turn the logged tps into step times once batch, sequence and world size are known."""
    tokens = global_batch * seq_len
    for s in run.samples:
        s.step_s = tokens * s.step_s / world
    run.steady, run.step_s = _steady(run.path, run.samples)


def _deepspeed(path: str, lines: list[str]) -> LogRun | None:
    cfg: dict[str, Any] = {}
    in_cfg = False
    rates: list[tuple[int, float, int]] = []
    for no, raw in enumerate(lines, 1):
        line = ANSI.sub("", raw)
        if DS_CONFIG_START.search(line):
            in_cfg = True
            continue
        if in_cfg:
            m = DS_CONFIG_LINE.search(line)
            if m:
                cfg[m.group(1)] = _value(m.group(2))
                continue
            if "json = " in line:
                in_cfg = False
                continue
        m = DS_TPUT.search(line)
        if m:
            try:
                cur = float(m.group(5))
            except ValueError:
                raise at_line(path, no, f"CurrSamplesPerSec is not a number: {m.group(5)!r}") from None
            if not cur > 0 or cur == float("inf"):
                raise at_line(path, no, f"CurrSamplesPerSec must be a positive number, got {m.group(5)}")
            rates.append((int(m.group(3)), cur, no))
    if not rates:
        return None
    tbs = cfg.get("train_batch_size")
    if not isinstance(tbs, int) or tbs <= 0:
        raise at_line(path, rates[0][2], "DeepSpeed throughput lines but no 'train_batch_size' in a "
                                         "'DeepSpeedEngine configuration:' dump before them: cannot turn samples/s into "
                                         "step times")
    samples = []
    for step, cur, no in rates:
        # CurrSamplesPerSec is the last global step alone (timer.py resets step_elapsed_time every step)
        samples.append(Sample(step - 1, step, tbs / cur, no))
    steady, med = _steady(path, samples)
    run = LogRun(path, "deepspeed", samples, steady, med, args=cfg)
    run.notes.append(f"step time = train_batch_size {tbs} / CurrSamplesPerSec (DeepSpeed ThroughputTimer: the last "
                     "step alone)")
    return run


def read_log(path: str | os.PathLike[str]) -> LogRun:
    """One training log -> a LogRun (the format is recognised from its lines)."""
    src = str(path)
    text = read_text(src, MAX_LOG_BYTES, "training log")
    lines = text.splitlines()
    ds = _deepspeed(src, lines)
    meg = _megatron(src, lines)
    if meg is not None:
        if ds is not None:  # Megatron-DeepSpeed prints both: Megatron's per-interval means are the step times
            meg.notes.append("DeepSpeed throughput lines ignored: Megatron's iteration lines give the step times")
            meg.args = {**{f"deepspeed.{k}": v for k, v in ds.args.items()}, **meg.args}
        return meg
    if ds is not None:
        meg_args = _megatron_args_only(lines)
        if meg_args:
            ds.args = {**{f"deepspeed.{k}": v for k, v in ds.args.items()}, **meg_args}
        return ds
    tt = _torchtitan(src, lines)
    if tt is not None:
        return tt
    raise at_line(src, None, "not a training log this version reads: no Megatron 'iteration N/ T | ... elapsed time "
                             "per iteration (ms)', torchtitan 'step: N  loss: ...  tps: ...' or DeepSpeed "
                             "'CurrSamplesPerSec=' line")


def _megatron_args_only(lines: list[str]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    in_args = False
    for raw in lines:
        line = ANSI.sub("", raw)
        if ARGS_START.search(line) and "end of" not in line:
            in_args = True
            continue
        if in_args:
            if ARGS_END.search(line):
                break
            m = ARG_LINE.match(line)
            if m:
                args[m.group(1)] = _value(m.group(2))
    return args


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A torchtitan job config (TOML) as a dict; a syntax error is one line with its line number."""
    text = read_text(path, MAX_CONFIG_BYTES, "job config")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise at_line(path, int(m.group(1)) if m else None, f"not TOML: {exc}") from None

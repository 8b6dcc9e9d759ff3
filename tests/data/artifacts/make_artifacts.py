"""Writes the artifact test files of this folder (see README.md): the exact line formats of the tools'
own source, carrying published configurations and measurements. Deterministic: run it again and the
files are byte-identical.

    python tests/data/artifacts/make_artifacts.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------------------------
# Megatron-LM: megatron/training/arguments.py _print_args and megatron/training/training.py
# training_log at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553
# ---------------------------------------------------------------------------------------------


def print_args(title: str, args: dict) -> list[str]:
    """_print_args, verbatim but for print -> list."""
    out = [f'------------------------ {title} ------------------------']
    str_list = []
    for arg in args:
        dots = '.' * (48 - len(arg))
        str_list.append('  {} {} {}'.format(arg, dots, args[arg]))
    for arg in sorted(str_list, key=lambda x: x.lower()):
        out.append(arg)
    out.append(f'-------------------- end of {title} ---------------------')
    return out


def training_log_line(stamp: str, iteration: int, train_iters: int, consumed: int, elapsed_ms: float,
                      lr: float, batch_size: int, loss: float, loss_scale: float, grad_norm: float) -> str:
    """training_log's log_string (log_throughput off, no energy, no MoE), verbatim format strings."""
    log_string = f" [{stamp}]"
    log_string += ' iteration {:8d}/{:8d} |'.format(iteration, train_iters)
    log_string += ' consumed samples: {:12d} |'.format(consumed)
    log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(elapsed_ms)
    log_string += f' learning rate: {lr:.6E} |'
    log_string += f' global batch size: {batch_size:5d} |'
    log_string += ' {}: {:.6E} |'.format('lm loss', loss)
    log_string += f' loss scale: {loss_scale:.1f} |'
    log_string += f' grad norm: {grad_norm:.3f} |'
    log_string += ' number of skipped iterations: {:3d} |'.format(0)
    log_string += ' number of nan iterations: {:3d} |'.format(0)
    return log_string


# Narayanan et al. 2021 Table 1 (shared/validation/dev_runs.json rows narayanan2021_t1_*): GPT, A100 80GB,
# fp16, full recompute, seq 2048, vocab 51200; step time from the paper's eq. (3) and TFLOP/s per GPU.
NARAYANAN = [  # id, layers, hidden, heads, tp, gpus, mbs, gbs, tflops/GPU
    ("gpt-1.7b", 24, 2304, 24, 1, 32, 16, 512, 137),
    ("gpt-3.6b", 30, 3072, 32, 2, 64, 16, 512, 138),
    ("gpt-7.5b", 36, 4096, 32, 4, 128, 16, 512, 142),
    ("gpt-18.4b", 40, 6144, 48, 8, 256, 8, 1024, 135),
]
# interval-to-interval spread of the steady values (illustrative; its median is exactly 1)
SPREAD = [1.003, 0.998, 1.000, 1.001, 0.996]


def narayanan_step_s(layers: int, hidden: int, gbs: int, gpus: int, tflops: float, seq: int = 2048,
                     vocab: int = 51200) -> float:
    f = 96 * gbs * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    return f / (tflops * 1e12 * gpus)


def megatron_log(name: str, layers: int, hidden: int, heads: int, tp: int, gpus: int, mbs: int, gbs: int,
                 tflops: float) -> str:
    args = {
        "world_size": gpus, "rank": 0, "num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": 4 * hidden,
        "num_attention_heads": heads, "kv_channels": hidden // heads, "group_query_attention": False,
        "num_query_groups": 1, "max_position_embeddings": 2048, "seq_length": 2048, "padded_vocab_size": 51200,
        "vocab_size": None, "swiglu": False, "squared_relu": False, "untie_embeddings_and_output_weights": False,
        "hidden_dropout": 0.1, "attention_dropout": 0.1, "normalization": "LayerNorm",
        "position_embedding_type": "learned_absolute", "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": None,
        "num_layers_per_virtual_pipeline_stage": None, "context_parallel_size": 1, "expert_model_parallel_size": 1,
        "data_parallel_size": gpus // tp, "sequence_parallel": False, "use_distributed_optimizer": False,
        "micro_batch_size": mbs, "global_batch_size": gbs, "rampup_batch_size": None, "fp16": True, "bf16": False,
        "fp8": None, "fp8_recipe": "delayed", "params_dtype": "torch.float16", "use_flash_attn": False,
        "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
        "num_experts": None, "moe_router_topk": 2, "tp_comm_overlap": False, "overlap_grad_reduce": True,
        "overlap_param_gather": False, "train_iters": 60, "log_interval": 10, "lr": 0.00015, "min_lr": 1e-05,
        "optimizer": "adam", "adam_beta1": 0.9, "adam_beta2": 0.95, "weight_decay": 0.1, "clip_grad": 1.0,
        "loss_scale": None, "initial_loss_scale": 4294967296, "seed": 1234, "tokenizer_type": "GPT2BPETokenizer",
        "num_workers": 2, "log_throughput": False, "eval_iters": 0,
    }
    lines = ["using world size: {}, data-parallel size: {}, context-parallel size: 1, tensor-model-parallel size: {}, "
             "pipeline-model-parallel size: 1".format(gpus, gpus // tp, tp)]
    lines += print_args("arguments", args)
    lines.append("> building GPT2BPETokenizer tokenizer ...")
    lines.append("[after dataloaders are built] datetime: 2026-11-27 08:00:05 ")
    lines.append("training ...")
    step_ms = narayanan_step_s(layers, hidden, gbs, gpus, tflops) * 1000.0
    values = [(1, step_ms * 15.0), (10, step_ms * 1.9)] + [(10 * (i + 2), step_ms * s) for i, s in enumerate(SPREAD)]
    for k, (it, ms) in enumerate(values):
        lines.append(training_log_line(f"2026-11-27 08:{1 + k:02d}:00.000000", it, 60, it * gbs, ms,
                                       1.5e-4 * min(1.0, it / 50), gbs, 10.5 - 0.05 * it, 65536.0, 1.5 - 0.01 * it))
    lines.append("[after training is done] datetime: 2026-11-27 08:09:00 ")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# torchtitan: torchtitan/components/metrics.py MetricsProcessor.log, torchtitan/train.py and
# torchtitan/distributed/parallel_dims.py at pytorch/torchtitan 4a950eaabff274567873322c206ddb481dae3567
# (the last commit with TOML job configs); logging format from torchtitan/tools/logging.py
# ---------------------------------------------------------------------------------------------

RED, GREEN, ORANGE, TURQ, BLUE, CYAN, MAGENTA, RESET = ("\033[31m", "\033[32m", "\033[38;2;180;60;0m",
                                                      "\033[38;2;54;234;195m", "\033[34m", "\033[36m", "\033[35m",
                                                      "\033[39m")


def titan(stamp: str, msg: str) -> str:
    return f"[titan] {stamp} - root - INFO - {msg}"


def titan_step(step: int, loss: float, grad_norm: float, mem_gib: float, mem_pct: float, tps: float,
               flops_per_token: float, peak_flops: float) -> str:
    tflops = flops_per_token * tps / 1e12
    mfu = 100 * flops_per_token * tps / peak_flops
    mfu_str = f"{mfu:.2f}%"
    return (f"{RED}step: {step:2}  "
            f"{GREEN}loss: {loss:8.5f}  "
            f"{ORANGE}grad_norm: {grad_norm:7.4f}  "
            f"{TURQ}memory: {mem_gib:5.2f}GiB"
            f"({mem_pct:.2f}%)  "
            f"{BLUE}tps: {round(tps):,}  "
            f"{CYAN}tflops: {tflops:,.2f}  "
            f"{MAGENTA}mfu: {mfu_str}{RESET}")


# torchtitan docs/performance.md (ablations_dev.json group torchtitan-2407-llama3-8b-64a100-ac): Llama 3 8B,
# 64 A100 80GB, FSDP, local batch 1, seq 8192, tokens per second per GPU 2904 (selective layer AC) and
# 2973 (selective op AC).
LLAMA3_8B_FLOPS_PER_TOKEN = 6 * (8_030_261_248 - 128_256 * 4096) + 12 * 32 * 4096 * 8192  # get_dense_model_nparams_and_flops
A100_BF16_PEAK = 312e12


def torchtitan_log(tps: float, ac_option: str) -> str:
    stamp = "2024-07-15 10:00:{:02d},{:03d}"
    lines = [titan(stamp.format(0, 1), "Starting job: Llama 3 8B training"),
             titan(stamp.format(0, 2), "Building device mesh with parallelism: pp=1, dp_replicate=1, dp_shard=64, "
                                       "cp=1, tp=1, ep=1, etp=1"),
             titan(stamp.format(0, 3), "CUDA capacity: NVIDIA A100-SXM4-80GB with 79.15GiB memory"),
             titan(stamp.format(1, 0), f"{BLUE}Model llama3 8B {RED}size: 8,030,261,248 total parameters{RESET}"),
             titan(stamp.format(1, 1), f"Applied selective activation checkpointing to the model ({ac_option})"),
             titan(stamp.format(2, 0), "Peak FLOPS used for computing MFU: 3.120e+14"),
             titan(stamp.format(2, 1), "Trainer is initialized with local batch size 1, global batch size 64, "
                                       "gradient accumulation steps 1, sequence length 8192, total steps 60 (warmup 200)"),
             titan(stamp.format(2, 2), "Training starts at step 1")]
    values = [(1, tps / 9.0), (10, tps * 0.93)] + [(10 * (i + 2), tps / s) for i, s in enumerate(SPREAD)]
    for k, (step, t) in enumerate(values):
        lines.append(titan(stamp.format(10 + k, 0), titan_step(step, 11.0 - 0.1 * step, 2.0 - 0.01 * step, 71.06,
                                                               89.78, t, LLAMA3_8B_FLOPS_PER_TOKEN, A100_BF16_PEAK)))
    lines.append(titan(stamp.format(30, 0), "Training completed"))
    return "\n".join(lines) + "\n"


TORCHTITAN_TOML = """# torchtitan job config (the keys of torchtitan/config/job_config.py at 4a950ea): the
# Llama 3 8B preset train_configs/llama3_8b.toml with 64 GPUs' worth of FSDP and selective AC ({option}).

[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[metrics]
log_freq = 10

[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"

[optimizer]
name = "AdamW"
lr = 3e-4
eps = 1e-8

[lr_scheduler]
warmup_steps = 200

[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0
steps = 60
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[activation_checkpoint]
mode = "selective"
selective_ac_option = "{option}"
"""

# ---------------------------------------------------------------------------------------------
# DeepSpeed: deepspeed/utils/timer.py ThroughputTimer.stop and deepspeed/runtime/config.py
# DeepSpeedConfig.print at deepspeedai/DeepSpeed edaa7221267243c7be7fb49c5d5f5c4fb97b4641; logger format
# from deepspeed/utils/logging.py
# ---------------------------------------------------------------------------------------------


def ds(stamp: str, where: str, msg: str) -> str:
    return f"[{stamp}] [INFO] [{where}] {msg}"


def deepspeed_log(step_s: float, train_batch_size: int, mbs: int) -> str:
    cfg = {"train_batch_size": train_batch_size, "train_micro_batch_size_per_gpu": mbs,
           "gradient_accumulation_steps": train_batch_size // (mbs * 4), "zero_optimization_stage": 1,
           "steps_per_print": 1, "fp16_enabled": True, "bfloat16_enabled": False, "wall_clock_breakdown": False}
    lines = [ds("2026-11-27 08:00:00,000", "config.py:1009:print", "DeepSpeedEngine configuration:")]
    for arg in sorted(cfg):
        dots = "." * (29 - len(arg))
        lines.append(ds("2026-11-27 08:00:00,001", "config.py:1013:print", "  {} {} {}".format(arg, dots, cfg[arg])))
    lines.append(ds("2026-11-27 08:00:00,002", "config.py:1015:print_user_config",
                    "  json = " + json.dumps({"train_batch_size": train_batch_size,
                                              "train_micro_batch_size_per_gpu": mbs}, sort_keys=True)))
    ga = cfg["gradient_accumulation_steps"]
    # ThroughputTimer(start_step=2): no line before the timer has run (global steps 1, 2 untimed)
    for k, step in enumerate(range(3, 9)):
        t = step_s * (1.6 if step == 3 else SPREAD[(k - 1) % len(SPREAD)])
        cur = train_batch_size / t
        lines.append(ds(f"2026-11-27 08:{k + 1:02d}:00,000", "timer.py:264:stop",
                        "epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, "
                        "MemAllocated={}GB, MaxMemAllocated={}GB".format(0, step * ga, step, cur, cur, 17.33, 34.6)))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# nccl-tests: src/util.cu (writeHeader, the device lines, writeResultHeader, writeBenchmarkLine*,
# writeResultFooter) and src/common.cu at NVIDIA/nccl-tests a0b82b2260cf5152b9f8c061bbf7eaf0ba096432
# ---------------------------------------------------------------------------------------------


def _float(value: float, width: int) -> str:
    """getFloatStr"""
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        s = fmt % (width, value)
        if len(s) <= width:
            return s
    return ("%*.1e" if width >= 7 else "%*.0e") % (width, value)


BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n}


def nccl_tests(program: str, coll: str, hosts: list[str], gpus_per_host: int, gpu_name: str, busbw_at_large: float,
               redop: str) -> str:
    n = len(hosts) * gpus_per_host
    out = ["# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
           f"# Collective test starting: {program}",
           "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 "
           "agg iters: 1 validation: 1 graph: 0 unalign: 0",
           "#",
           "# Using devices"]
    pid = 4100
    for h, host in enumerate(hosts):
        for d in range(gpus_per_host):
            out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
                       % (h * gpus_per_host + d, 0, pid + d, host, d, 0, 0x18 + 0x10 * d, 0, gpu_name))
    out.append("#")
    out.append("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
               % ("", "", "", "", ""))
    out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
               % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                  "busbw", "#wrong", 0, ""))
    out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
               % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", 0, ""))
    size = 1 << 20
    total = 0.0
    rows = 0
    while size <= 1 << 33:
        # bus bandwidth rises to its plateau as latency stops mattering: bw(S) = plateau x S / (S + S_half)
        busbw = busbw_at_large * size / (size + (4 << 20))
        algbw = busbw / BUS[coll](n)
        t_us = size / (algbw * 1e3)
        count = size // 2 if coll != "all_gather" else size // 2 // n
        line = "%12li  %12li  %8s  %6s  %6s" % (size, count, "bfloat16", redop, "%6i" % -1)
        for _ in range(2):  # out-of-place, in-place
            line += "  %7s  %6s  %6s  %6g" % (_float(t_us, 7), _float(algbw, 6), _float(busbw, 6), 0)
        out.append(line)
        total += busbw
        rows += 1
        size *= 2
    out.append("# %-20s : %d %s" % ("Out of bounds values", 0, "OK"))
    out.append("# %-20s : %g %s" % ("Avg bus bandwidth", round(total / rows, 4), ""))
    out.append("#")
    out.append(f"# Collective test concluded: {program}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# A PyTorch profiler Chrome trace (Kineto), two profiled steps on one rank
# ---------------------------------------------------------------------------------------------


def chrome_trace() -> dict:
    ev = []
    ext = 100
    corr = 5000
    t = 1_000_000.0

    def op(name, ts, dur, args):
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1234, "tid": 1234, "ts": ts, "dur": dur,
                   "args": args})

    def kernel(name, ts, dur, ext_id, extra=None):
        nonlocal corr
        corr += 1
        args = {"External id": ext_id, "device": 0, "stream": 7, "correlation": corr, "grid": [132, 1, 1],
                "block": [384, 1, 1]}
        args.update(extra or {})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args})

    for step in (5, 6):
        start = t
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1234, "tid": 1234,
                   "ts": start, "dur": 10_000.0, "args": {"External id": ext}})
        ext += 1
        gpu = start + 50.0  # the device starts 50 us after the step
        # 4 GEMMs of [8192,4096]x[4096,14336] bf16: 1,000 us each
        for _ in range(4):
            op("aten::mm", gpu - 20, 10.0, {"External id": ext, "Input Dims": [[8192, 4096], [4096, 14336]],
                                             "Input type": ["c10::BFloat16", "c10::BFloat16"]})
            kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
                   gpu, 1000.0, ext)
            ext += 1
            gpu += 1000.0
        # 2 GEMMs of [8192,4096]x[4096,4096] bf16 (nvjet): 300 us each
        for _ in range(2):
            op("aten::mm", gpu - 20, 10.0, {"External id": ext, "Input Dims": [[8192, 4096], [4096, 4096]],
                                             "Input type": ["c10::BFloat16", "c10::BFloat16"]})
            kernel("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", gpu, 300.0, ext)
            ext += 1
            gpu += 300.0
        # flash attention forward + backward: 800 + 1,600 us
        op("aten::_flash_attention_forward", gpu - 20, 10.0, {"External id": ext})
        kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >(Flash_fwd_params)",
               gpu, 800.0, ext)
        ext += 1
        gpu += 800.0
        op("aten::_flash_attention_backward", gpu - 20, 10.0, {"External id": ext})
        kernel("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t> >(Flash_bwd_params)",
               gpu, 1600.0, ext)
        ext += 1
        gpu += 1600.0
        # elementwise: 400 us, then a 500 us host gap (nothing on the device)
        op("aten::add", gpu - 20, 5.0, {"External id": ext, "Input Dims": [[8192, 4096], [8192, 4096]],
                                         "Input type": ["c10::BFloat16", "c10::BFloat16"]})
        kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
               gpu, 400.0, ext)
        ext += 1
        gpu += 400.0 + 500.0
        # reduce-scatter of 256 MiB bf16 gradients over 8 ranks (full size 134,217,728 elements): 1,500 us,
        # 500 us of it under a 500 us copy (overlap: the union counts it once)
        comm = {"Collective name": "_reduce_scatter_base", "In msg nelems": 134217728, "Out msg nelems": 16777216,
                "Group size": 8, "dtype": "BFloat16", "Process Group Name": "0", "Process Group Description": "default_pg"}
        op("record_param_comms", gpu - 20, 15.0, {"External id": ext, **comm})
        kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", gpu, 1500.0, ext, comm)
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": 8,
                   "ts": gpu, "dur": 500.0, "args": {"External id": ext + 1, "device": 0, "stream": 8}})
        ext += 2
        gpu += 1500.0
        t = start + 10_000.0
    return {"schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045870592,
                                  "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8, "pg_count": 1, "pg_config": [],
                                "nccl_version": "2.21.5"},
            "record_shapes": 1, "with_stack": 0, "traceEvents": ev, "traceName": "rank0.1732694400.pt.trace.json",
            "displayTimeUnit": "ms", "baseTimeNanos": 1732694400000000000}


def main() -> None:
    meg = HERE / "megatron"
    meg.mkdir(exist_ok=True)
    for row in NARAYANAN:
        (meg / f"{row[0]}.log").write_text(megatron_log(*row), encoding="utf-8")
    tt = HERE / "torchtitan"
    for name, tps, option in (("selective-layer", 2904, "2"), ("selective-op", 2973, "op")):
        d = tt / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "train.log").write_text(torchtitan_log(tps, option), encoding="utf-8")
        (d / "llama3_8b.toml").write_text(TORCHTITAN_TOML.format(option=option), encoding="utf-8")
    dsd = HERE / "deepspeed"
    dsd.mkdir(exist_ok=True)
    (dsd / "train.log").write_text(deepspeed_log(2.5, 512, 4), encoding="utf-8")
    # Megatron-DeepSpeed prints Megatron's arguments and iteration lines and DeepSpeed's engine config and
    # throughput lines in one log: the 1.7B run with ZeRO stage 1 from the DeepSpeed config
    mds = HERE / "megatron-deepspeed"
    mds.mkdir(exist_ok=True)
    meg_lines = megatron_log(*NARAYANAN[0]).splitlines()
    ds_lines = deepspeed_log(narayanan_step_s(24, 2304, 512, 32, 137), 512, 16).splitlines()
    at = meg_lines.index("training ...")
    (mds / "train.log").write_text("\n".join(meg_lines[:at] + ds_lines[:10] + meg_lines[at:] + ds_lines[10:]) + "\n",
                                   encoding="utf-8")
    nc = HERE / "nccl"
    nc.mkdir(exist_ok=True)
    # A100 SXM4 80GB: NVLink3 300 GB/s per GPU, HDR 25 GB/s per GPU (topology dgx-a100-superpod)
    (nc / "all_gather_perf-1node.txt").write_text(
        nccl_tests("all_gather_perf", "all_gather", ["node001"], 8, "NVIDIA A100-SXM4-80GB", 234.0, "none"))
    (nc / "reduce_scatter_perf-1node.txt").write_text(
        nccl_tests("reduce_scatter_perf", "reduce_scatter", ["node001"], 8, "NVIDIA A100-SXM4-80GB", 228.0, "sum"))
    (nc / "all_reduce_perf-2nodes.txt").write_text(
        nccl_tests("all_reduce_perf", "all_reduce", ["node001", "node002"], 8, "NVIDIA A100-SXM4-80GB", 20.4, "sum"))
    (HERE / "trace").mkdir(exist_ok=True)
    (HERE / "trace" / "rank0.pt.trace.json").write_text(json.dumps(chrome_trace(), indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Megatron-LM's own parse_args + validate_args on every Megatron export of the launcher suite.

Run by test_megatron_lm_args.py in a subprocess (it imports the checkout's `megatron` package, which
would clash with megatron-core from PyPI): python megatron_lm_validate.py <Megatron-LM checkout>.
Prints one line per rejected export and a last line `validate_args: N accepted, M rejected of T`.

The checkout needs Python >= 3.12 (`typing.override`) and Triton for three GPU-kernel modules; on a
CPU-only Python 3.11 those are stubbed (their kernels are never called by argument parsing), the GPU
is taken to be the plan's (Hopper: compute capability 9.0, Blackwell: 10.0) and Transformer Engine is
taken to be ASSUME_TE (default 2.8.0) when it is not installed.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
import traceback
import types
import typing
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
if not hasattr(typing, "override"):
    typing.override = lambda f: f


class _Stub(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


def main(checkout: str) -> int:
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        for m in ("megatron.core.transformer.moe.ops.paged_stash", "megatron.core.ssm.ops.common.causal_conv1d_varlen",
                  "megatron.core.ssm.ops.mamba2.batch_invariant_decode"):
            sys.modules[m] = _Stub(m)
    here = Path(__file__).resolve().parent
    sys.path[:0] = [checkout, str(here.parents[1]), str(here)]
    import torch
    import megatron.training.arguments as A
    if importlib.util.find_spec("transformer_engine") is None:
        from packaging.version import Version
        te = Version(os.environ.get("ASSUME_TE", "2.8.0"))
        A.is_te_min_version = lambda v, check_equality=True: te >= Version(str(v).split(".dev")[0])

    import launcher_cases as lc
    from autoshard.export import gpu_arch

    ok = bad = 0
    for case in lc.MEGATRON_CASES:
        prob, plan = lc.all_cases()[case]
        out = lc.exported(case, "megatron")
        flags, env = [], {}
        for line in out.text.splitlines():
            if line.startswith("# launch with: export "):
                k, v = line.split("export ", 1)[1].split()[0].split("=")
                env[k] = v
            elif line.startswith("--"):
                flags += shlex.split(line.removesuffix(" \\"))
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(env, WORLD_SIZE=str(prob.cluster.num_gpus), RANK="0")
        cc = (10, 0) if gpu_arch(prob).startswith("blackwell") else (9, 0)
        A.get_device_arch_version = lambda cc=cc: cc[0]
        torch.cuda.get_device_capability = lambda *a, cc=cc: cc
        sys.argv = ["pretrain_gpt.py", *flags, "--train-iters", "10", "--lr", "1e-4",
                    "--tokenizer-type", "NullTokenizer", "--mock-data"]
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                args = A.parse_args()
                A.validate_args(args, {})
            dp = prob.cluster.num_gpus // (plan.tp * plan.pp * plan.cp)
            assert args.data_parallel_size == dp, f"data_parallel_size {args.data_parallel_size} != {dp}"
            assert args.global_batch_size == prob.training.global_batch_size
            ok += 1
        except BaseException as e:  # noqa: BLE001 - SystemExit from argparse too
            bad += 1
            frames = [f for f in traceback.extract_tb(e.__traceback__) if checkout in f.filename]
            where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            print(f"rejected {case}: {type(e).__name__}: {str(e)[:300]} {where}")
    print(f"validate_args: {ok} accepted, {bad} rejected of {len(lc.MEGATRON_CASES)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1])))

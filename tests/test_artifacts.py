"""Readers of real artifact formats (tests/data/artifacts, README there) and `autoshard calibrate --logs`.

Expected numbers are worked by hand from the files' sources: Narayanan et al. 2021 eq. (3) and Table 1
for the Megatron logs, torchtitan's tps definition for its logs, DeepSpeed's ThroughputTimer for its
samples/s, nccl-tests' bus bandwidth columns and the topology's link rates, and the trace's kernels."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoshard.artifacts import read_log, read_nccl_tests, read_toml, read_trace
from autoshard.artifacts import files as files_mod
from autoshard.artifacts.profile import calibrate_artifacts, load_inputs, model_gemm_time_s
from autoshard.artifacts.runs import RunContext, measured_run
from autoshard.artifacts.trace import collective_busbw
from autoshard.catalog import get_gpu, load_overlay
from autoshard.cli import main as cli_main
from autoshard.cost import evaluate
from autoshard.errors import InputError
from autoshard.loader import load_problem
from autoshard.validate import convert, load_runs

DATA = Path(__file__).parent / "data" / "artifacts"
MEG = DATA / "megatron"
A100 = ["--gpu", "a100-sxm-80gb", "--topology", "dgx-a100-superpod"]
# Narayanan et al. 2021 Table 1: (layers, hidden, GPUs, global batch, TFLOP/s per GPU)
TABLE1 = {"gpt-1.7b": (24, 2304, 32, 512, 137), "gpt-3.6b": (30, 3072, 64, 512, 138),
          "gpt-7.5b": (36, 4096, 128, 512, 142), "gpt-18.4b": (40, 6144, 256, 1024, 135)}


def eq3_step_s(layers, hidden, gpus, batch, tflops, seq=2048, vocab=51200):
    """Narayanan et al. 2021 eq. (3): F = 96 B s l h^2 (1 + s/6h + V/16lh); step = F / (X n)."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden)) / (
        tflops * 1e12 * gpus)


# ---- training logs -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_megatron_log_steady_step_is_the_published_one(name):
    run = read_log(MEG / f"{name}.log")
    assert run.format == "megatron"
    assert [s.last for s in run.samples] == [1, 10, 20, 30, 40, 50, 60]
    assert [s.last for s in run.steady] == [20, 30, 40, 50, 60]  # iteration 1 and the interval 2-10 are warm-up
    # the log prints milliseconds to 0.1 ms: the median is the published step to within that
    assert run.step_s == pytest.approx(eq3_step_s(*TABLE1[name]), abs=0.05e-3)
    layers, hidden, gpus, batch, _ = TABLE1[name]
    a = run.args
    assert (a["num_layers"], a["hidden_size"], a["world_size"], a["global_batch_size"]) == (layers, hidden, gpus, batch)
    assert a["fp16"] is True and a["recompute_granularity"] == "full" and a["fp8"] is None


def test_launcher_prefixes_and_encoding(tmp_path):
    """torchrun --tee / srun --label put a rank prefix before every line: read the same; a byte that is not
    UTF-8 is one line naming the line it is on."""
    plain = read_log(MEG / "gpt-1.7b.log")
    pref = tmp_path / "pref.log"
    pref.write_text("".join(f"[default0]:{ln}\n" for ln in (MEG / "gpt-1.7b.log").read_text().splitlines()))
    run = read_log(pref)
    assert run.step_s == plain.step_s and run.args == plain.args
    ds = tmp_path / "ds.log"
    ds.write_text("".join(f"0: {ln}\n" for ln in (DATA / "deepspeed" / "train.log").read_text().splitlines()))
    assert read_log(ds).step_s == read_log(DATA / "deepspeed" / "train.log").step_s
    raw = (MEG / "gpt-1.7b.log").read_bytes().split(b"\n")
    raw[5] = raw[5] + b"\xff"
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"\n".join(raw))
    with pytest.raises(InputError, match=rf"{bad}:6: not UTF-8 text"):
        read_log(bad)


def test_megatron_run_prices_as_the_validation_row():
    """Two independent paths to the same run: the log's arguments dump, and the dev_runs row that
    `autoshard validate` converts. Same plan, same predicted step (the log says fp16, the row fp16 mixed,
    priced alike on A100)."""
    rows = [r for r in load_runs() if r["id"].startswith("narayanan2021_t1_")][:4]
    cases, _ = convert(rows)
    ctx = RunContext(gpu="a100-sxm-80gb", topology="dgx-a100-superpod")
    for case, name in zip(cases, ["gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b"]):
        run = measured_run(read_log(MEG / f"{name}.log"), ctx, 1)
        assert run.plan.short() == case.plan.short()
        assert evaluate(run.problem, run.plan).step_time_s == pytest.approx(
            evaluate(case.problem, case.plan).step_time_s, rel=1e-12)
        assert run.log.step_s == pytest.approx(case.measured_step_s, abs=0.05e-3)


def test_torchtitan_log_step_from_tps():
    """step = global batch x seq / (tps x world): 64 x 8192 / (2,904 x 64) s (torchtitan docs/performance.md:
    2,904 tokens/s/GPU, Llama 3 8B on 64 A100 with layer SAC)."""
    ctx = RunContext(model=load_problem({"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64},
                                         "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 64}}).model)
    layer = read_log(DATA / "torchtitan" / "selective-layer" / "train.log")
    assert layer.format == "torchtitan" and layer.gpu_name == "NVIDIA A100-SXM4-80GB"
    assert layer.settings["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 64, "cp": 1, "tp": 1, "ep": 1, "etp": 1}
    ctx.configs[layer.path] = read_toml(DATA / "torchtitan" / "selective-layer" / "llama3_8b.toml")
    run = measured_run(layer, ctx, 1)
    assert run.log.step_s == pytest.approx(64 * 8192 / (2904 * 64), rel=1e-12)
    assert run.problem.cluster.gpu == "a100-sxm-80gb" and run.problem.framework == "torchtitan"
    p = run.plan
    assert (p.tp, p.pp, p.dp, p.zero_stage, p.micro_batch_size) == (1, 1, 64, 3, 1)
    # selective_ac_option "2": blocks 2, 4, ... (a running count from 1) fully recomputed
    assert p.recompute_per_layer(32) == ["none", "full"] * 16


def test_deepspeed_log_step_from_samples_per_sec():
    run = read_log(DATA / "deepspeed" / "train.log")
    assert run.format == "deepspeed" and run.args["train_batch_size"] == 512
    # ThroughputTimer starts at global step 3 (start_step=2); step 3 is warm-up; C = 512 / step time
    assert [s.last for s in run.steady] == [4, 5, 6, 7, 8]
    assert run.step_s == pytest.approx(2.5, rel=1e-12)


def test_megatron_deepspeed_log():
    """Megatron-DeepSpeed prints both formats: Megatron's iteration lines give the step, DeepSpeed's engine
    configuration the ZeRO stage and the framework."""
    run = read_log(DATA / "megatron-deepspeed" / "train.log")
    assert run.format == "megatron" and run.step_s == pytest.approx(eq3_step_s(*TABLE1["gpt-1.7b"]), abs=0.05e-3)
    m = measured_run(run, RunContext(gpu="a100-sxm-80gb"), 1)
    assert m.plan.zero_stage == 1 and m.problem.framework == "deepspeed"
    assert any("DeepSpeed throughput lines ignored" in n for n in m.notes)


# ---- profiler trace ------------------------------------------------------------------------------


def test_trace_time_by_kernel_class():
    """Per step (two profiled steps): 4 x 1,000 + 2 x 300 us of GEMMs, 800 + 1,600 us of flash attention,
    400 us elementwise, 1,500 us reduce-scatter; 500 us idle inside each step and 600 us between them."""
    t = read_trace(DATA / "trace" / "rank0.pt.trace.json")
    assert t.steps == 2 and t.device == "NVIDIA H100 80GB HBM3" and (t.rank, t.world_size) == (0, 8)
    by = {k: round(v * 1e6, 6) for k, v in t.by_class_s.items()}
    assert by == {"gemm": 4600.0, "attention": 2400.0, "nccl": 1500.0, "other": 400.0, "host_gap": 800.0}
    assert {k: round(v * 1e6, 6) for k, v in t.gemm_by_shape_s.items()} == {
        "[8192,4096]x[4096,14336] BFloat16": 4000.0, "[8192,4096]x[4096,4096] BFloat16": 600.0}
    (c,) = t.collectives
    assert (c.kind, c.bytes, c.group_size, c.calls) == ("reduce_scatter", 134217728 * 2, 8, 1)
    # nccl-tests' reduce_scatter bus bandwidth: bytes / time x (n - 1) / n
    assert collective_busbw(c) == pytest.approx(268435456 / 1.5e-3 * 7 / 8)


# ---- nccl-tests ----------------------------------------------------------------------------------


def test_nccl_tests_table():
    t = read_nccl_tests(DATA / "nccl" / "all_gather_perf-1node.txt")
    assert (t.collective, t.ranks, t.nodes, t.gpu_name) == ("all_gather", 8, 1, "NVIDIA A100-SXM4-80GB")
    assert [r.size_bytes for r in t.rows] == [2**k for k in range(20, 34)]
    # the rows of >= 1 GiB print busbw 233.09, 233.54, 233.77, 233.89: median of the middle two
    assert [r.busbw_gb_per_s for r in t.rows[-4:]] == [233.09, 233.54, 233.77, 233.89]
    assert t.large_busbw_gb_per_s(2**30)[0] == pytest.approx((233.54 + 233.77) / 2)
    t2 = read_nccl_tests(DATA / "nccl" / "all_reduce_perf-2nodes.txt")
    assert (t2.collective, t2.ranks, t2.nodes) == ("all_reduce", 16, 2)


def test_nccl_tests_older_releases_and_mpi_prefixes(tmp_path):
    """Releases before 2.13 print no root column; Open MPI's --tag-output prefixes every line with
    "[1,0]<stdout>:" (as in the EKS / AzureML samples that publish nccl-tests output)."""
    lines = (DATA / "nccl" / "all_gather_perf-1node.txt").read_text().splitlines()
    old = []
    for ln in lines:
        if ln.startswith("#       size") or ln.startswith("#        (B)"):
            ln = ln[:46] + ln[54:]  # drop the 8-character root column of the two header lines
        elif ln[:1] != "#":
            ln = ln[:46] + ln[54:]  # and of each row
        old.append("[1,0]<stdout>:" + ln)
    p = tmp_path / "all_gather_perf.out"
    p.write_text("\n".join(old) + "\n")
    t, ref = read_nccl_tests(p), read_nccl_tests(DATA / "nccl" / "all_gather_perf-1node.txt")
    assert (t.collective, t.ranks, t.nodes) == ("all_gather", 8, 1)
    assert [(r.size_bytes, r.busbw_gb_per_s) for r in t.rows] == [(r.size_bytes, r.busbw_gb_per_s) for r in ref.rows]


# ---- calibrate --logs ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "my-profile.yaml"
    rc = cli_main(["calibrate", "--logs", str(MEG), "--nccl-tests", str(DATA / "nccl"), *A100, "-o", str(out),
                   "--quiet", "--json"])
    return rc, out


def test_calibrate_from_logs_and_nccl_tests(calibrated, capsys):
    rc, out = calibrated
    assert rc == 0
    eff = load_overlay(str(out))["a100-sxm-80gb"]
    # nccl-tests, rows >= 1 GiB: scaleup = median(all_gather (233.54 + 233.77) / 2, reduce_scatter
    # (227.56 + 227.78) / 2 GB/s) / 300 GB/s NVLink3; scaleout = all_reduce (20.36 + 20.38) / 2 GB/s over
    # 2 hosts / 25 GB/s HDR per GPU (dgx-a100-superpod)
    assert eff.scaleup == round(statistics.median([233.655 / 300, 227.67 / 300]), 4)
    assert eff.scaleout == round(20.37 / 25, 4)
    ar = read_nccl_tests(DATA / "nccl" / "all_reduce_perf-2nodes.txt")
    assert [r.busbw_gb_per_s for r in ar.rows if 2**31 <= r.size_bytes <= 2**32] == [20.36, 20.38]
    text = out.read_text()
    for name in TABLE1:
        assert f"{name}.log" in text  # the overlay names its inputs
    assert "all_reduce_perf-2nodes.txt" in text and "leave-one-run-out" in text


def test_calibration_is_used_by_problems(calibrated, tmp_path):
    """The overlay as `cluster: {catalog: ...}`: evaluate, solve, batch and whatif read it."""
    _, out = calibrated
    base = {"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 64},
            "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 16, "topology": "dgx-a100-superpod"},
            "search": {"tp": [1, 2], "pp": [1], "micro_batch_size": [1], "zero_stage": [1]}}
    cal = {**base, "cluster": {**base["cluster"], "catalog": str(out)}}
    plain, tuned = load_problem(base), load_problem(cal)
    from autoshard.spec import Plan  # noqa: PLC0415

    plan = Plan(tp=2, dp=8, micro_batch_size=1)
    assert evaluate(tuned, plan).step_time_s != evaluate(plain, plan).step_time_s
    from autoshard.solver import solve  # noqa: PLC0415

    assert solve(tuned, time_limit_s=30, top_k=0).plan is not None
    d = tmp_path / "problems"
    d.mkdir()
    (d / "tuned.yaml").write_text(yaml.safe_dump(cal))
    from autoshard.batch import run_batch  # noqa: PLC0415

    res = run_batch([d], tmp_path / "out", time_limit_s=30, top_k=0)
    assert res.exit_code == 0
    rec = json.loads((tmp_path / "out" / "tuned.json").read_text())
    assert rec["estimate"]["step_time_s"] == pytest.approx(evaluate(tuned, Plan(**{
        k: v for k, v in rec["plan"].items() if k in Plan.model_fields})).step_time_s, rel=1e-9)


def test_calibration_is_used_by_whatif(calibrated, tmp_path):
    _, out = calibrated
    from autoshard.whatif import run_study  # noqa: PLC0415

    study = {"name": "cal", "workloads": [{"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 64},
                                           "tokens": 1.0e10, "search": {"tp": [1, 2], "pp": [1], "cp": 1}}],
             "options": [{"gpu": "a100-sxm-80gb", "num_gpus": 16, "topology": "dgx-a100-superpod"},
                         {"gpu": "a100-sxm-80gb", "num_gpus": 16, "topology": "dgx-a100-superpod", "catalog": str(out)}],
             "pricing": {"mode": "cloud", "usd_per_gpu_hour": {"a100": 1.5}}, "sensitivity": "off", "time_limit_s": 30.0}
    res = run_study(study, tmp_path / "w", report=False)
    steps = sorted(r["step_time_s"] for r in res.rows)
    assert len(steps) == 2 and steps[0] != steps[1]  # the calibrated option is priced with its overlay


def test_calibration_is_deterministic(calibrated, tmp_path):
    _, out = calibrated
    again = tmp_path / "again.yaml"
    rc = cli_main(["calibrate", "--logs", str(MEG), "--nccl-tests", str(DATA / "nccl"), *A100, "-o", str(again),
                   "--quiet"])
    assert rc == 0 and again.read_bytes() == out.read_bytes()


def test_loo_before_after_printed(tmp_path, capsys):
    rc = cli_main(["calibrate", "--logs", str(MEG), *A100, "-o", str(tmp_path / "p.yaml"), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "leave-one-run-out:" in out and "in-sample:" in out
    for name in TABLE1:
        assert f"-{name}: " in out  # one before -> after line per held-out run


def test_loo_same_from_logs_as_from_the_runs_file(tmp_path, capsys):
    """The four Megatron logs and the four dev_runs rows of the same runs: the same leave-one-run-out
    figures, one path through the logs' arguments, the other through validate's row conversion."""
    rows = [r for r in load_runs() if r["id"].startswith("narayanan2021_t1_")][:4]
    (tmp_path / "runs.json").write_text(json.dumps(rows))
    assert cli_main(["calibrate", str(tmp_path / "runs.json"), "-o", str(tmp_path / "a.yaml"), "--loo", "--quiet"]) == 0
    from_rows = capsys.readouterr().out
    assert cli_main(["calibrate", "--logs", str(MEG), *A100, "-o", str(tmp_path / "b.yaml"), "--quiet"]) == 0
    from_logs = capsys.readouterr().out
    def pick(text: str) -> list[str]:  # the "  <run>: +2.9% -> +0.4%" lines after the LOO heading
        return sorted(m.group(1) for m in re.finditer(r"^ +\S+: ([+-]\d+\.\d% -> [+-]\d+\.\d%)$", text, re.M))

    loo_rows = pick(from_rows.split("leave-one-run-out", 1)[1])
    loo_logs = pick(from_logs.split("leave-one-run-out:", 1)[1])
    assert len(loo_rows) == 4 and loo_rows == loo_logs


def test_trace_gives_the_gemm_factor(tmp_path):
    """A trace whose GEMM kernels take the model's 100%-efficiency GEMM time / 0.5 gives matmul.fp16 0.5
    (the run's precision), kept by the fit."""
    ctx = RunContext(gpu="a100-sxm-80gb", topology="dgx-a100-superpod")
    runs, _, tests, inputs = load_inputs([str(MEG / "gpt-1.7b.log"), str(MEG / "gpt-3.6b.log")], [], [], [], ctx)
    run = runs[0]
    g = model_gemm_time_s(run.case(), get_gpu("a100-sxm-80gb").efficiency.model_dump())
    doc = json.loads((DATA / "trace" / "rank0.pt.trace.json").read_text())
    gemm_us = 4600.0  # per step in the shipped trace (test_trace_time_by_kernel_class)
    scale = g / 0.5 * 1e6 / gemm_us
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and ("gemm" in e["name"] or "nvjet" in e["name"]):
            e["dur"] *= scale
    tdir = tmp_path / "t"
    tdir.mkdir()
    (tdir / "rank0.json").write_text(json.dumps(doc))
    trace = read_trace(tdir / "rank0.json")
    res = calibrate_artifacts(runs, {run.id: [trace]}, tests, str(tmp_path / "o.yaml"), inputs=inputs, loo=False)
    assert res.measured["a100-sxm-80gb"]["matmul.fp16"]["value"] == pytest.approx(0.5, abs=1e-4)
    assert load_overlay(str(tmp_path / "o.yaml"))["a100-sxm-80gb"].matmul["fp16"] == pytest.approx(0.5, abs=1e-4)
    assert "matmul.fp16" not in res.fitted["a100-sxm-80gb"]
    # no nccl-tests: the trace's 256 MiB reduce-scatter over 8 GPUs (one NVLink domain) gives scaleup,
    # 268,435,456 B / 1.5 ms x 7/8 over NVLink3's 300 GB/s, flagged as a lower bound
    assert res.measured["a100-sxm-80gb"]["scaleup"]["value"] == round(268435456 / 1.5e-3 * 7 / 8 / 300e9, 4)
    assert any("scaleup" in w and "lower bound" in w for w in res.warnings)


# ---- bad input: one line, exit 2, nothing written ------------------------------------------------


def _err(capsys, argv, tmp_path):
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "o.yaml").exists()
    return err


def test_fifo_and_oversize_refused(tmp_path, capsys, monkeypatch):
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    err = _err(capsys, ["calibrate", "--logs", str(fifo), *A100, "-o", str(tmp_path / "o.yaml")], tmp_path)
    assert f"{fifo}: not a regular file" in err
    monkeypatch.setattr(files_mod, "MAX_NCCL_BYTES", 1000)
    import autoshard.artifacts.nccl as nccl_mod  # noqa: PLC0415

    monkeypatch.setattr(nccl_mod, "MAX_NCCL_BYTES", 1000)
    err = _err(capsys, ["calibrate", "--logs", str(MEG), "--nccl-tests", str(DATA / "nccl"), *A100, "-o",
                        str(tmp_path / "o.yaml")], tmp_path)
    assert "larger than the 1,000 allowed" in err


def test_bad_lines_name_file_and_line(tmp_path, capsys):
    text = (MEG / "gpt-1.7b.log").read_text().splitlines()
    # a truncated arguments dump
    bad = tmp_path / "trunc.log"
    bad.write_text("\n".join(text[:10]) + "\n")
    err = _err(capsys, ["calibrate", "--logs", str(bad), *A100, "-o", str(tmp_path / "o.yaml")], tmp_path)
    assert f"{bad}:10: the arguments dump has no 'end of arguments' line" in err
    # only warm-up
    first = next(i for i, ln in enumerate(text) if "iteration        1/" in ln)
    warm = tmp_path / "warm.log"
    warm.write_text("\n".join(text[:first + 2]) + "\n")
    err = _err(capsys, ["calibrate", "--logs", str(warm), *A100, "-o", str(tmp_path / "o.yaml")], tmp_path)
    assert f"{warm}:{first + 2}: only warm-up step times" in err
    # nccl-tests with wrong data
    lines = (DATA / "nccl" / "all_gather_perf-1node.txt").read_text().splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.strip().startswith("1073741824"))
    cells = lines[row].rsplit(None, 1)
    lines[row] = cells[0] + "       3"
    nc = tmp_path / "all_gather_perf.txt"
    nc.write_text("\n".join(lines) + "\n")
    err = _err(capsys, ["calibrate", "--logs", str(MEG), "--nccl-tests", str(nc), *A100, "-o",
                        str(tmp_path / "o.yaml")], tmp_path)
    assert f"{nc}:{row + 1}: #wrong = 3: the collective returned wrong data" in err
    # a trace that is not JSON
    tr = tmp_path / "t.json"
    tr.write_text('{"traceEvents": [\n{"ph": "X",\n')
    err = _err(capsys, ["calibrate", "--logs", str(MEG / "gpt-1.7b.log"), "--traces", str(tr), *A100, "-o",
                        str(tmp_path / "o.yaml")], tmp_path)
    assert f"{tr}:3: not JSON" in err


def test_busbw_above_the_link_rate_is_refused(tmp_path, capsys):
    """All-gather 233 GB/s measured on 8 GPUs is above a 200 GB/s NVLink: the topology is wrong."""
    topo = [{"name": "nvlink", "size": 8, "bandwidth_gb_per_s": 200}, {"name": "ib", "size": 512,
                                                                       "bandwidth_gb_per_s": 25}]
    prob = tmp_path / "p.yaml"
    prob.write_text(yaml.safe_dump({"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 64},
                                    "cluster": {"gpu": "a100-sxm-80gb", "num_gpus": 32, "topology": topo}}))
    err = _err(capsys, ["calibrate", "--logs", str(MEG / "gpt-1.7b.log"), "--problem", str(prob), "--nccl-tests",
                        str(DATA / "nccl" / "all_gather_perf-1node.txt"), "-o", str(tmp_path / "o.yaml")], tmp_path)
    assert "all_gather_perf-1node.txt:" in err and "above the 200 GB/s" in err


def test_warnings_one_run_and_out_of_range(tmp_path, capsys):
    rc = cli_main(["calibrate", "--logs", str(MEG / "gpt-1.7b.log"), "--nccl-tests",
                   str(DATA / "nccl" / "reduce_scatter_perf-1node.txt"), *A100, "-o", str(tmp_path / "o.yaml"),
                   "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "one run: no leave-one-run-out check" in err
    # reduce_scatter 227.67 / 300 = 0.759: inside 0.75-0.85, no range warning
    assert "outside the NCCL-like range" not in err


def test_output_that_is_an_input_is_refused(tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_bytes((MEG / "gpt-1.7b.log").read_bytes())
    rc = cli_main(["calibrate", "--logs", str(log), *A100, "-o", str(log), "--quiet"])
    assert rc == 2 and "the output is one of the inputs" in capsys.readouterr().err
    assert log.read_bytes() == (MEG / "gpt-1.7b.log").read_bytes()


def test_which_gpu_is_asked(tmp_path, capsys):
    err = _err(capsys, ["calibrate", "--logs", str(MEG / "gpt-1.7b.log"), "-o", str(tmp_path / "o.yaml")], tmp_path)
    assert "which GPU ran it?" in err and "--gpu" in err


def test_generator_reproduces_the_shipped_files(tmp_path):
    """The test files are what make_artifacts.py writes (deterministic): regenerate into a copy, compare."""
    import shutil  # noqa: PLC0415

    copy = tmp_path / "artifacts"
    shutil.copytree(DATA, copy)
    subprocess.run([sys.executable, str(copy / "make_artifacts.py")], check=True, capture_output=True)
    for p in sorted(DATA.rglob("*")):
        if p.is_file() and p.suffix != ".py" and p.name != "README.md":
            assert (copy / p.relative_to(DATA)).read_bytes() == p.read_bytes(), p

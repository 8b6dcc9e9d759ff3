"""Validation against published runs, calibration round trip, Korthikanti activation memory."""

from __future__ import annotations

import csv
import functools
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml

from autoshard import cost
from autoshard.calibrate import calibrate
from autoshard.catalog import get_gpu, load_overlay
from autoshard.errors import InputError
from autoshard.loader import load_problem
from autoshard.validate import (
    Case,
    Skip,
    evaluate_case,
    format_report,
    korthikanti_check,
    load_runs,
    run_to_case,
    validate,
)

DATA = Path(__file__).parent / "data" / "validation"
SUBSET = DATA / "runs_subset.json"
DEV_RUNS = Path(__file__).resolve().parents[1] / "validation" / "dev_runs.json"  # the project's copy


def rows() -> dict[str, dict]:
    return {r["id"]: r for r in json.loads(SUBSET.read_text())}


# ---- conversion ------------------------------------------------------------------------------


def test_narayanan_row_conversion():
    row = rows()["narayanan2021_t1_145.6B"]
    case = run_to_case(row)
    assert isinstance(case, Case)
    # Measured step from eq. (3), computed here independently.
    B, s, l, h, V = 2304, 2048, 80, 12288, 51200
    F = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert case.measured_step_s == pytest.approx(F / (148 * 1e12 * 1536), rel=1e-12)
    assert case.source_group == "Narayanan 2021"
    p, plan = case.problem, case.plan
    assert (p.model.num_hidden_layers, p.model.hidden_size, p.model.intermediate_size) == (80, 12288, 49152)
    assert p.model.num_attention_heads == p.model.kv_heads == 96
    assert p.model.hidden_act == "gelu" and p.model.dropout and p.model.tie_word_embeddings
    assert p.training.precision == "bf16" and not p.training.flash_attention
    assert p.training.global_batch_size == 2304 and p.training.seq_len == 2048
    assert p.cluster.gpu == "a100-sxm-80gb" and p.cluster.num_gpus == 1536
    assert p.cluster.topology == "dgx-a100-superpod"
    assert (plan.tp, plan.pp, plan.dp, plan.vpp, plan.micro_batch_size) == (8, 8, 24, 2, 2)
    assert plan.schedule == "interleaved" and plan.recompute == "full"
    assert plan.zero_stage == 0 and plan.sp is False


def test_dgxc_gpt3_row_fills_heads_and_ffn_and_says_so():
    case = run_to_case(rows()["dgxc_v24.11_gpt3_175b_fp8_256gpu"])
    assert isinstance(case, Case)
    assert case.measured_step_s == 5.96
    assert case.source_group == "DGXC Megatron GPT-3 175B"
    m = case.problem.model
    assert m.num_attention_heads == 96 and m.head_size == 128 and m.intermediate_size == 4 * 12288
    assert any("heads filled" in n for n in case.notes) and any("ffn filled" in n for n in case.notes)
    plan = case.plan
    assert (plan.tp, plan.pp, plan.dp, plan.vpp) == (4, 8, 8, 12) and plan.schedule == "interleaved"
    assert plan.sp is True and plan.zero_stage == 1 and plan.recompute == "none"
    assert case.problem.training.precision == "fp8" and case.problem.training.flash_attention
    assert case.problem.cluster.gpu == "h100-sxm" and case.problem.cluster.topology == "dgx-h100-400g"


def test_model_name_changes_nothing():
    # Facts come from the row's fields, never from its name: renaming the model (or the source) leaves
    # the problem and the plan as they were; a row without heads skips, whatever its name.
    row = rows()["dgxc_v24.11_gpt3_175b_bf16_128gpu"]
    a = run_to_case(row)
    b = run_to_case(dict(row, model="GPT-NeoX 175B", source="somebody else, 2030"))
    assert isinstance(a, Case) and isinstance(b, Case)
    assert b.problem.model.model_copy(update={"name": a.problem.model.name}) == a.problem.model
    assert b.problem.training == a.problem.training and b.plan == a.plan
    assert b.source_group == a.source_group == "DGXC Megatron GPT-3 175B"  # the row's source_group field
    skip = run_to_case({k: v for k, v in row.items() if k not in ("heads", "filled")})
    assert isinstance(skip, Skip) and "model dimensions not published (heads null)" in skip.reason
    # the architecture facts have documented defaults: gated SiLU, untied, no dropout, kv heads = heads
    bare = run_to_case({k: v for k, v in row.items() if k not in ("hidden_act", "dropout", "tie_word_embeddings")})
    m = bare.problem.model
    assert (m.hidden_act, m.tie_word_embeddings, m.dropout, m.kv_heads) == ("silu", False, False, 96)


def test_modern_model_name_changes_nothing():
    from autoshard.validate.modern import modern_row_to_case

    row = next(r for r in modern_rows().values() if r.get("kv_lora_rank"))
    a = modern_row_to_case(row)
    b = modern_row_to_case(dict(row, model="a model", id=row["id"] + "-renamed", source="unknown lab, 2031"))
    assert b.problem.model.model_copy(update={"name": a.problem.model.name, "source": a.problem.model.source}) \
        == a.problem.model
    assert b.plan == a.plan and b.framework == a.framework
    assert a.problem.model.is_mla and a.problem.model.kv_lora_rank == row["kv_lora_rank"]


def test_fsdp_llama_row():
    case = run_to_case(rows()["dgxc_v24.11_maxtext_llama2_70b_fp8_2048gpu"])
    assert isinstance(case, Case)
    assert case.source_group == "DGXC MaxText Llama-2 70B"
    m = case.problem.model
    assert m.hidden_act == "silu" and m.kv_heads == 8 and not m.tie_word_embeddings and not m.dropout
    plan = case.plan
    assert (plan.tp, plan.pp, plan.dp, plan.zero_stage, plan.micro_batch_size) == (1, 1, 2048, 3, 2)
    assert plan.schedule == "1f1b"


def test_skip_reasons_listed():
    report = validate(SUBSET)
    skipped = {s.id: s.reason for s in report.skipped}
    assert "dgxc_v24.11_grok1_314b_bf16_512gpu" in skipped
    assert "model dimensions not published" in skipped["dgxc_v24.11_grok1_314b_bf16_512gpu"]
    assert len(report.results) + len(report.skipped) == len(rows())
    text = format_report(report)
    assert "skipped" in text and "dgxc_v24.11_grok1_314b_bf16_512gpu" in text


def test_missing_runs_file_is_input_error(tmp_path):
    with pytest.raises(InputError):
        validate(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError):
        validate(bad)


# ---- report ---------------------------------------------------------------------------------


def _check_report(report):
    res = report.results
    s = report.summary
    assert s.n == len(res) > 0
    errs = [r.abs_error_pct for r in res]
    assert s.median_abs_error_pct == pytest.approx(statistics.median(errs))
    assert s.p90_abs_error_pct == pytest.approx(float(np.percentile(errs, 90)))  # linear interpolation
    worst = max(res, key=lambda r: r.abs_error_pct)
    assert s.worst_id == worst.id and s.worst_error_pct == pytest.approx(worst.error_pct)
    for r in res:
        assert r.error_pct == pytest.approx((r.predicted_step_s - r.measured_step_s) / r.measured_step_s * 100)
        assert r.abs_error_pct == pytest.approx(abs(r.error_pct))
        assert r.time_breakdown_s and r.predicted_step_s > 0
    assert sum(g.runs for g in report.by_source) == s.n
    for g in report.by_source:
        mine = [r.abs_error_pct for r in res if r.source_group == g.source_group]
        assert g.median_abs_error_pct == pytest.approx(statistics.median(mine))
        assert abs(g.worst_error_pct) == pytest.approx(max(mine))
    js = report.to_json()
    json.dumps(js)  # serializable
    assert js["summary"]["n"] == s.n and len(js["results"]) == s.n and len(js["skipped"]) == len(report.skipped)
    text = format_report(report)
    assert "summary:" in text and "median |err|" in text
    for g in report.by_source:
        assert g.source_group in text


def test_report_summary_consistent():
    report = validate(SUBSET)
    _check_report(report)
    groups = {g.source_group for g in report.by_source}
    assert {"Narayanan 2021", "DGXC Megatron GPT-3 175B", "DGXC MaxText Llama-2 70B",
            "DGXC PaxML GPT-3 175B"} <= groups


def test_full_dev_runs_report():
    report = validate()
    _check_report(report)
    assert report.summary.n + len(report.skipped) == len(load_runs(DEV_RUNS))
    assert {s.id for s in report.skipped} >= {r["id"] for r in load_runs(DEV_RUNS) if r["hidden"] is None}


def test_csv_runs_read_like_json(tmp_path):
    rs = list(rows().values())[:5]
    path = _write_csv(tmp_path / "runs.csv", rs)
    a = [run_to_case(r) for r in load_runs(path)]
    b = [run_to_case(r) for r in rs]
    for x, y in zip(a, b):
        assert type(x) is type(y)
        if isinstance(x, Case):
            assert x.problem == y.problem and x.plan == y.plan and x.measured_step_s == pytest.approx(y.measured_step_s)


# ---- calibration ------------------------------------------------------------------------------


def _write_csv(path: Path, rs: list[dict]) -> Path:
    cols = sorted({k for r in rs for k in r})
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rs:
            w.writerow({k: ("" if r.get(k) is None else str(r[k]).lower() if isinstance(r.get(k), bool) else r[k])
                        for k in cols})
    return path


def test_calibration_round_trip(tmp_path):
    """Fit H100 matmul efficiencies on the Megatron GPT-3 175B rows at 128-512 GPUs, starting
    from a deliberately wrong catalog; the held-out 1024/2048-GPU rows (same configuration,
    more data parallelism) must improve."""
    gpt3 = [r for r in rows().values() if r["id"].startswith("dgxc_v24.11_gpt3_175b")]
    fit = [r for r in gpt3 if r["gpu_count"] <= 512]
    held = [r for r in gpt3 if r["gpu_count"] >= 1024]
    assert len(fit) == 6 and len(held) == 4
    measurements = _write_csv(tmp_path / "fit.csv", fit)
    held_path = tmp_path / "held.json"
    held_path.write_text(json.dumps(held))

    good = get_gpu("h100-sxm").efficiency.model_dump()
    wrong = dict(good, matmul={"bf16": 0.45, "fp8": 0.35})
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"gpus": {"h100-sxm": {"efficiency": wrong}}}))

    out = tmp_path / "my-catalog.yaml"
    result = calibrate(measurements, out, base_catalog=base)
    assert sorted(result.runs_used) == sorted(r["id"] for r in fit)
    (gfit,) = result.fits
    assert gfit.gpu == "h100-sxm" and gfit.fitted == ["matmul.bf16", "matmul.fp8"]
    assert result.after.median_abs_error_pct < result.before.median_abs_error_pct

    overlay = load_overlay(str(out))
    eff = overlay["h100-sxm"]
    for v in (eff.matmul["bf16"], eff.matmul["fp8"], eff.hbm, eff.scaleup, eff.scaleout):
        assert 0 < v <= 1
    assert eff.matmul["bf16"] > 0.45 and eff.matmul["fp8"] > 0.35  # the wrong start was too slow-priced
    assert (eff.hbm, eff.scaleup, eff.scaleout) == (wrong["hbm"], wrong["scaleup"], wrong["scaleout"])

    before = validate(held_path, catalog=base)
    after = validate(held_path, catalog=out)
    assert after.summary.n == before.summary.n == 4
    assert after.summary.median_abs_error_pct < before.summary.median_abs_error_pct
    assert after.summary.median_abs_error_pct < 10.0

    # A problem points at the overlay through cluster.catalog.
    case = run_to_case(held[0])
    problem = load_problem({**case.problem.model_dump(exclude_none=True),
                            "cluster": {"gpu": "h100-sxm", "num_gpus": 1024, "catalog": str(out)}})
    assert cost.context(problem).gpu.efficiency == eff

    text = out.read_text()
    assert text.startswith("# ") and "Procedure" in text and fit[0]["id"] in text
    assert str(tmp_path) not in text  # date- and location-independent header

    # Deterministic: the same inputs write the same bytes.
    out2 = tmp_path / "again.yaml"
    calibrate(measurements, out2, base_catalog=base)
    assert out2.read_text() == text


def test_calibration_rejects_unusable_runs(tmp_path):
    grok = [r for r in rows().values() if "grok1" in r["id"]]
    path = tmp_path / "grok.json"
    path.write_text(json.dumps(grok))
    with pytest.raises(InputError):
        calibrate(path, tmp_path / "out.yaml")
    assert not (tmp_path / "out.yaml").exists()


# ---- activation memory vs Korthikanti et al. 2022 -------------------------------------------------

S, H, A, B, T = 2048, 12288, 96, 1, 8  # GPT-3 175B layer, micro-batch 1, tensor parallel 8
LAYERS = 8


def _problem():
    return load_problem({
        "model": {"num_hidden_layers": LAYERS, "hidden_size": H, "intermediate_size": 4 * H,
                  "num_attention_heads": A, "vocab_size": 51200, "hidden_act": "gelu", "dropout": True,
                  "tie_word_embeddings": True},
        "training": {"seq_len": S, "global_batch_size": 8, "flash_attention": False},
        "cluster": {"gpu": "h100-sxm", "num_gpus": T},
    })


def _layer_acts(tp: int, sp: bool, recompute: str) -> float:
    problem = _problem()
    ctx = cost.context(problem)
    cfg = cost.Config(tp=tp, cp=1, ep=1, pp=1, dp=T // tp, vpp=1, sp=sp, zero=1, mbs=B, schedule="1f1b",
                      placement="tp-cp-ep-dp-pp")
    return cost.layer_table(ctx, cfg).layers[("dense", recompute)].act_bytes


SBH = S * B * H


@pytest.mark.parametrize("tp,sp,recompute,expected", [
    (1, False, "none", SBH * (34 + 5 * A * S / H)),
    (T, False, "none", SBH * (10 + 24 / T + 5 * A * S / (H * T))),
    (T, True, "none", SBH * (34 / T + 5 * A * S / (H * T))),
    (T, True, "selective", 34 * SBH / T),
    (1, False, "full", 2 * SBH),
    (T, True, "full", 2 * SBH / T),
])
def test_korthikanti_activation_bytes(tp, sp, recompute, expected):
    assert _layer_acts(tp, sp, recompute) == pytest.approx(expected, rel=1e-9)


def test_korthikanti_full_recompute_in_evaluate():
    """pp=1: one micro-batch in flight; activations = layers x 2sbh + the LM head input 2sbh."""
    est = cost.evaluate(_problem(), {"tp": 1, "dp": T, "sequence_parallel": False, "recompute": "full",
                                     "micro_batch_size": 1, "zero_stage": 1})
    assert est.memory_breakdown_gib["activations"] * 2**30 == pytest.approx((LAYERS + 1) * 2 * SBH, rel=1e-9)


def test_korthikanti_check_rows():
    rs = korthikanti_check()
    assert len(rs) == 6
    for r in rs:
        assert r["ratio"] == pytest.approx(1.0, rel=1e-9)
    assert rs[0]["korthikanti_bytes"] == pytest.approx(SBH * (34 + 5 * A * S / H))
    assert not math.isnan(rs[-1]["cost_model_bytes"])


# ---- modern runs (modern_runs_dev.json rows) --------------------------------------------------

MODERN_SUBSET = DATA / "modern_subset.json"
MODERN_DEV = DEV_RUNS.parent / "modern_runs_dev.json"


def modern_rows() -> dict[str, dict]:
    return {r["id"]: r for r in json.loads(MODERN_SUBSET.read_text())}


def _fp8_family(precision: str, recipe: str) -> None:
    """training.precision is the recipe where the spec takes it, else the fp8 family."""
    from typing import get_args

    from autoshard.spec import Precision

    assert precision == (recipe if recipe in get_args(Precision) else "fp8")


def test_modern_mlperf_gb200_row():
    # MLPerf v5.0 Carina 1024 GB200: config_GB200_256x4x48xtp4pp8cp2.sh, FP8 delayed, TP overlap on.
    case = run_to_case(modern_rows()["mlperf_v50_cw_llama31_405b_gb200_fp8_1024gpu"])
    assert isinstance(case, Case), case
    assert case.source_group == "MLPerf Training" and case.framework == "megatron"
    assert case.measured_step_s == 8.4496 and case.recipe == "fp8-delayed" and case.arch == "Blackwell"
    p, plan = case.problem, case.plan
    _fp8_family(p.training.precision, "fp8-delayed")
    assert (p.model.num_hidden_layers, p.model.hidden_size, p.model.intermediate_size) == (126, 16384, 53248)
    assert (p.model.num_attention_heads, p.model.kv_heads, p.model.vocab_size) == (128, 8, 32000)
    assert p.model.hidden_act == "silu" and not p.model.tie_word_embeddings and not p.model.is_moe
    assert (p.training.seq_len, p.training.global_batch_size) == (8192, 768)
    assert (p.cluster.gpu, p.cluster.num_gpus, p.cluster.topology) == ("gb200", 1024, "gb200-nvl72")
    # 4 x 8 x 2 x 16 = 1024 GPUs; 768 = 16 dp x 1 mbs x 48 accumulation steps (MLLOG header).
    assert (plan.tp, plan.pp, plan.cp, plan.dp, plan.vpp, plan.micro_batch_size) == (4, 8, 2, 16, 8, 1)
    assert plan.schedule == "interleaved" and plan.sp and plan.zero_stage == 1 and plan.recompute == "none"
    assert plan.tp_comm_overlap is True and plan.ep_overlap is None
    assert case.recompute_published


def test_modern_moe_row_folds_experts_when_ep_exceeds_dp():
    # Qwen3-235B on 256 H100: TP2 PP8 VP4 EP32, dp = 256 / 16 = 16 < ep: experts folded over TP.
    case = run_to_case(modern_rows()["mbridge_260401_qwen3235ba22b_h100_fp8_256gpu"])
    assert isinstance(case, Case), case
    m = case.problem.model
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.num_shared_experts) == (128, 8, 1536, 0)
    assert m.head_size == 128 and m.kv_heads == 4 and m.first_k_dense_replace == 0
    plan = case.plan
    assert (plan.tp, plan.pp, plan.vpp, plan.ep, plan.dp, plan.etp) == (2, 8, 4, 32, 16, 1)
    assert case.recipe == "fp8-current"  # recipe ..._h100_fp8cs_config
    assert case.source_group == "Megatron-Bridge" and case.arch == "Hopper"
    assert any("etp not published" in n for n in case.notes)


def test_modern_gpt_oss_row_head_dim_and_empty_recompute_modules():
    case = run_to_case(modern_rows()["mbridge_2608_gptoss120b_gb200_mxfp8_64gpu"])
    assert isinstance(case, Case), case
    m = case.problem.model
    assert m.hidden_size == 2880 and m.num_attention_heads == 64 and m.head_size == 64  # 2880/64 is not 64
    assert (m.num_experts, m.num_experts_per_tok, m.expert_ffn) == (128, 4, 2880)
    assert case.recipe == "mxfp8" and case.plan.recompute == "none"  # recompute_modules=[]
    assert (case.plan.ep, case.plan.dp, case.plan.micro_batch_size) == (64, 64, 4)
    bf16 = run_to_case(modern_rows()["mbridge_260401_gptoss120b_gb200_bf16_64gpu"])
    assert bf16.recipe == "bf16" and bf16.plan.recompute == "moe_act+layernorm"  # ["layernorm", "moe_act"]


def test_modern_simumax_deepseek_v2_row_has_mla_and_etp():
    case = run_to_case(modern_rows()["simumax_b200_v12_deepseekv2tp1ep4pp2dp4l4mbc8cef"])
    assert isinstance(case, Case), case
    m = case.problem.model
    assert m.is_mla and (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim) == (1536, 512, 64)
    assert (m.num_hidden_layers, m.num_experts, m.num_shared_experts, m.first_k_dense_replace) == (4, 160, 2, 1)
    assert (case.plan.pp, case.plan.ep, case.plan.etp, case.plan.dp) == (2, 4, 1, 4)
    assert case.plan.recompute == "none" and case.plan.tp_comm_overlap is False  # "TP comm overlap disabled"
    assert case.problem.cluster.gpu == "b200" and case.source_group == "SimuMax B200"


def test_modern_simumax_rows_run_dp_communication_exposed():
    # SimuMax's Megatron launcher (MooreThreads/SimuMax@4dcaae513ba7 simu_tools/megatron_scripts/scripts/
    # run_pretrain_llama3.sh, run_pretrain_deepseekv2.sh) passes neither --overlap-grad-reduce nor
    # --overlap-param-gather, both store_true default False in Megatron-LM's arguments.py: every row states it
    dev = {r["id"]: r for r in json.loads(MODERN_DEV.read_text())}
    rows = [r for r in dev.values() if r.get("source_family") == "SimuMax B200"]
    assert len(rows) == 16
    for r in rows:
        case = run_to_case(r)
        assert case.plan.overlap_grad_reduce is False and case.plan.overlap_param_gather is False, r["id"]
    # Llama 3 70B cut to 12 layers, tp2 dp4 (--accumulate-allreduce-grads-in-fp32, distributed optimizer):
    # per layer 2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 28672 + 2 x 8192 = 855,654,400 parameters, x 12,
    # plus untied embedding and output 2 x 128,256 x 8192 and the final norm: 12,369,207,296 / tp 2 per GPU.
    # Exposed: the fp32 gradients' reduce-scatter and the bf16 weights' all-gather over dp 4, (dp-1)/dp of
    # (4 + 2) B each, over NVLink5's 900 GB/s at the catalog's 0.8 scale-up efficiency: 38.65 ms
    row = dev["simumax_b200_v12_llama370btp2pp1dp4l12mbc4cef"]
    params = (12 * (2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192) + 2 * 128256 * 8192 + 8192) / 2
    hand_s = 0.75 * (4 + 2) * params / (900e9 * 0.8)
    assert hand_s == pytest.approx(0.03865, rel=1e-3)
    exposed = cost.evaluate(run_to_case(row).problem, run_to_case(row).plan)
    assert exposed.time_breakdown_s["dp_comm"] == pytest.approx(hand_s, rel=0.03)
    stated_none = {k: v for k, v in row.items() if k not in ("overlap_grad_reduce", "overlap_param_gather")}
    hidden = cost.evaluate(run_to_case(stated_none).problem, run_to_case(stated_none).plan)
    assert hidden.time_breakdown_s["dp_comm"] < 0.25 * hand_s  # overlapped under the backward / next forward


def test_deepseek_v3_b200_rows_state_the_recipes_mtp_layer_and_layout():
    # Megatron-Bridge's DeepSeek-V3 recipe runs one MTP layer (recipes/deepseek/deepseek_v3.py at 47ff48829:51
    # `mtp_num_layers: Optional[int] = 1`, which run_script.py leaves; v0.4.0 0fbfe7d3e:84 `mtp_num_layers = 1`)
    # and for pp 16 without VP the layout [embedding + 4 decoder] + [4 decoder] x 14 + [decoder + mtp + loss]
    # (map_pp_vp_to_layout[(16, 1)]): 61 layers as 15 x 4 + 1, the MTP layer and the loss on the last stage
    dev = {r["id"]: r for r in json.loads(MODERN_DEV.read_text())}
    for rid in ("mbridge_2509_deepseekv3tokendrop_b200_fp8_256gpu",
                "mbridge_2509_deepseekv3tokendrop_b200_fp8paren_256gpu",
                "mbridge_2604_deepseekv3_b200_mxfp8_256gpu"):
        row = dev[rid]
        assert row["mtp_layers"] == row["framework_recipe"]["mtp_layers"] == 1
        case = run_to_case(row)
        assert case.plan.stage_layers == [4] * 15 + [1], rid
        assert case.problem.model.num_nextn_predict_layers == 1
        est = cost.evaluate(case.problem, case.plan)
        # the last stage holds one layer + the MTP depth (a transformer layer, its 2h -> h projection and an
        # output-layer pass) + the loss: lighter than a 4-layer stage, so the step is not set by it alone
        without = run_to_case({**row, "mtp_layers": 0})
        assert est.step_time_s > cost.evaluate(without.problem, without.plan).step_time_s, rid


def test_modern_torchtitan_rows():
    rs = modern_rows()
    c = run_to_case(rs["torchtitan_2412_table1_llama318b_8gpu_01"])
    assert isinstance(c, Case), c
    assert c.framework == "torchtitan" and c.problem.framework == "torchtitan"
    assert c.problem.cluster.gpu == "h100-hbm2e-96gb"  # Grand Teton: 96 GB HBM2e, 500 W
    assert (c.plan.dp, c.plan.micro_batch_size, c.plan.zero_stage) == (8, 2, 3)  # local batch 2, FSDP
    assert c.plan.recompute == "selective" and c.recipe == "bf16"
    big = run_to_case(rs["torchtitan_2412_table6_llama31405b_512gpu_16"])
    # 4D: FSDP 2 x TP 8 x PP 8 x CP 4; local batch 8 in 8 micro-batches; AsyncTP; torchao float8.
    assert (big.plan.tp, big.plan.pp, big.plan.cp, big.plan.dp, big.plan.micro_batch_size) == (8, 8, 4, 2, 1)
    assert big.plan.tp_comm_overlap is True and big.recipe == "fp8-current" and big.plan.recompute == "full"
    row = run_to_case(rs["torchtitan_2506_llama370btable_llama3170b_256gpu_22"])
    assert row.recipe == "fp8-rowwise"  # torchao Float8Linear recipe 'rowwise'
    assert row.plan.tp_comm_overlap is False  # "vanilla TP": torchtitan's plain DTensor TP, collectives exposed
    # Full-iteration CUDA graphs where the row says so (MLPerf's config_common_cg.sh).
    assert run_to_case(rs["mlperf_v51_llama31_405b_gb300_nvfp4_512gpu"]).plan.cuda_graphs is True
    assert run_to_case(rs["mbridge_2509_llama38b_h100_fp8_8gpu"]).plan.cuda_graphs is False
    # NeMo AutoModel dispatches with DeepEP (its profile's default); Megatron-Bridge rows get what their
    # release's recipe ran (data/mbridge_recipes.yaml): qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config
    # runs alltoall with the EP overlap; gpt_oss_120b ... gb200_fp8mx full-iteration graphs and HybridEP.
    from autoshard.cost import Config, context, dispatcher_of
    kimi = run_to_case(rs["automodel_kimik2_h100_bf16_256gpu"])
    assert dispatcher_of(context(kimi.problem), Config.of(kimi.plan, kimi.plan.dp)) == "deepep"
    qwen = run_to_case(rs["mbridge_260401_qwen3235ba22b_h100_fp8_256gpu"])
    assert (qwen.plan.moe_dispatcher, qwen.plan.ep_overlap, qwen.plan.cuda_graphs) == ("alltoall", True, False)
    oss = run_to_case(rs["mbridge_2608_gptoss120b_gb200_mxfp8_64gpu"])
    assert (oss.plan.moe_dispatcher, oss.plan.ep_overlap, oss.plan.cuda_graphs) == ("hybridep", True, True)


def test_modern_automodel_and_partial_recompute():
    rs = modern_rows()
    kimi = run_to_case(rs["automodel_kimik2_h100_bf16_256gpu"])
    assert isinstance(kimi, Case), kimi
    assert kimi.framework == "automodel" and kimi.source_group == "NeMo AutoModel"
    # AutoModel runs FSDP2 (fp32 sharded parameters, as torchtitan) with TE's fused attention (cuDNN), not SDPA.
    from autoshard.frameworks import get_framework
    auto, titan = get_framework("automodel"), get_framework("torchtitan")
    assert (auto.weight_bytes, auto.zero_stages) == (titan.weight_bytes, titan.zero_stages)
    assert auto.attention_kernel_factor == 1.0 > titan.attention_kernel_factor
    assert kimi.plan.recompute == "full" and (kimi.plan.pp, kimi.plan.vpp, kimi.plan.ep) == (8, 4, 32)
    assert kimi.problem.model.is_mla and kimi.problem.model.num_experts == 384
    l8 = run_to_case(rs["mbridge_2509_llama38b_h100_fp8_8gpu"])
    # The row's 'recompute_num_layers=5' was read from today's recipe ('HEAD recipe'); the 25.09
    # recipe itself recomputed nothing (data/mbridge_recipes.yaml, high confidence), and wins.
    assert "HEAD recipe" in rs["mbridge_2509_llama38b_h100_fp8_8gpu"]["activation_recompute"]
    assert l8.plan.recompute == "none" and l8.problem.training.main_grads == "bf16"
    from autoshard.validate.modern import recompute_of
    assert recompute_of(rs["mbridge_2509_llama38b_h100_fp8_8gpu"]["activation_recompute"], 32, 1, 1)[0] == \
        ["full"] * 5 + ["none"] * 27  # recompute_num_layers=5, PP 1
    assert l8.plan.zero_stage == 3 and l8.recipe == "fp8-current"
    mix = run_to_case(rs["nemo_2504_mixtral8x7b_gb200_fp8_64gpu"])
    assert mix.recipe == "fp8-current" and mix.problem.model.expert_ffn == 14336 and mix.plan.ep == 8


def test_modern_rows_that_cannot_convert_say_why():
    rs = modern_rows()
    nano = run_to_case(rs["mbridge_2606_nemotron3nano30ba3b_h100_fp8_16gpu"])
    assert isinstance(nano, Skip) and "Mamba" in nano.reason
    primus = run_to_case(rs["primus_pipe_llama27b_mi300_pp8_1f1b_8gpu"])
    assert isinstance(primus, Skip) and "no measured step time" in primus.reason
    gb300 = run_to_case(rs["mlperf_v51_llama31_405b_gb300_nvfp4_512gpu"])
    try:
        get_gpu("gb300")
    except InputError:
        assert isinstance(gb300, Skip) and "'gb300'" in gb300.reason
    else:
        assert isinstance(gb300, Case) and gb300.problem.cluster.gpu == "gb300" and gb300.recipe == "nvfp4"


def test_modern_names():
    from autoshard.validate.modern import gpu_id

    assert gpu_id("DGX-H100") == gpu_id("H100-SXM5-80GB") == "h100-sxm"
    assert gpu_id("H100 (96GB HBM2e, 500W power limit)") == "h100-hbm2e-96gb"
    assert gpu_id("DGX-GB200") == gpu_id("GB200") == "gb200" and gpu_id("DGX-B200") == gpu_id("B200") == "b200"
    assert gpu_id("DGX-GB300") == "gb300" and gpu_id("DGX-B300") == "b300"
    assert gpu_id("MI300") == "mi300x" and gpu_id("MI325X") == "mi325x" and gpu_id("MI355") == "mi355x"
    assert gpu_id("TPU v5p") is None


def test_old_rows_still_convert_the_old_way():
    """dev_runs rows have none of the modern fields: same cases as before (median 3.5% on the dev file)."""
    from autoshard.validate.modern import is_modern_row

    assert not any(is_modern_row(r) for r in rows().values())
    assert all(is_modern_row(r) for r in modern_rows().values())


def test_modern_dev_report_by_source_and_regime():
    rep = validate(MODERN_DEV)
    assert rep.summary.n + len(rep.skipped) == len(json.loads(MODERN_DEV.read_text()))
    assert rep.summary.n >= 70
    regimes = {g.source_group: g for g in rep.by_regime}
    assert {"dense", "MoE", "Hopper", "Blackwell", "BF16", "FP8"} <= set(regimes)
    assert regimes["dense"].runs + regimes["MoE"].runs == rep.summary.n
    for g in rep.by_source + rep.by_regime:
        members = [r for r in rep.results if g.source_group in ([r.source_group] + r.regimes)]
        errs = [r.abs_error_pct for r in members]
        assert g.runs == len(members) and g.median_abs_error_pct == pytest.approx(statistics.median(errs))
        assert g.p90_abs_error_pct == pytest.approx(float(np.percentile(errs, 90)))
    assert "regime" in format_report(rep)
    # SimuMax's 16 rows state the allocator's peak (real_alloc_gib, max_memory_allocated): every run that
    # ran is predicted to fit, and each error is measured against the row's own figure
    rows = {r["id"]: r for r in json.loads(MODERN_DEV.read_text())}
    m = [r for r in rep.results if r.measured_peak_memory_gib is not None]
    assert rep.memory.n == len(m) == 16 and rep.memory.predicted_oom_that_ran == 0
    for r in m:
        assert r.measured_peak_memory_gib == rows[r.id]["other_metrics"]["real_alloc_gib"]
        assert r.memory_error_pct == pytest.approx((r.peak_memory_gib / r.measured_peak_memory_gib - 1) * 100)


def test_modern_dev_json_has_regimes(capsys):
    from autoshard.cli import main

    assert main(["validate", str(MODERN_DEV), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    regimes = {g["source_group"]: g for g in doc["by_regime"]}
    assert regimes["dense"]["runs"] + regimes["MoE"]["runs"] == doc["summary"]["n"]
    assert all("p90_abs_error_pct" in g for g in doc["by_source"])
    assert {s["id"] for s in doc["skipped"]} >= {"primus_pipe_llama27b_mi300_pp8_1f1b_8gpu"}


# ---- ranking of ablations --------------------------------------------------------------------


def _cfg(i, t, p, fits=True, status="ok", **knobs):
    from autoshard.validate.ablations import ConfigResult

    return ConfigResult(i, f"config {i}", {"micro_batch": knobs.get("mbs", 1), "recompute": knobs.get("rc", "none")},
                        status, t, t, p, fits)


def test_ablation_metrics_on_a_hand_made_group():
    from autoshard.validate.ablations import assemble_group, summarize_ablations

    # measured times 1.00 1.10 1.03 1.20 (+ one OOM); predicted 2.00 2.30 2.10 2.01 (and 2.5 for the OOM one).
    cs = [_cfg(0, 1.00, 2.00), _cfg(1, 1.10, 2.30, mbs=2), _cfg(2, 1.03, 2.10, mbs=4),
          _cfg(3, 1.20, 2.01, fits=False, rc="full"), _cfg(4, None, 2.5, fits=False, status="OOM", mbs=8)]
    g = assemble_group("g", "hand", "step_time_s", cs)
    # By hand: pairs measured >= 8% apart: (0,1) 10.0%, (0,3) 20.0%, (1,3) 9.1%, (2,3) 16.5%;
    # (0,2) 3.0% and (1,2) 6.8% are ties. Predicted: (0,1) same order -> concordant; (0,3) 2.00 vs
    # 2.01 is within 1% -> a predicted tie, discordant; (1,3) and (2,3) predicted the other way.
    assert sorted((p.a, p.b) for p in g.compared) == [(0, 1), (0, 3), (1, 3), (2, 3)]
    assert g.concordant == 1
    assert [(p.a, p.b) for p in g.blind] == [(0, 3)]  # predicted 0.5% apart, measured 20% apart
    assert g.blind[0].knobs == ["recompute: 'none' vs 'full'"]
    assert g.measured_order == [0, 2, 1, 3] and g.predicted_order == [0, 3, 2, 1]
    assert g.top1 is True  # measured fastest #0 is the predicted fastest that fits
    assert (g.oom_agree, g.oom_total) == (4, 5)  # #3 ran but is predicted not to fit
    s = summarize_ablations([g, g])
    assert (s.pairs_compared, s.pairs_concordant, s.blind_pairs) == (8, 2, 2)
    assert s.concordance_pct == pytest.approx(25.0) and (s.top1_agree, s.top1_groups) == (2, 2)
    assert (s.oom_agree, s.oom_total) == (8, 10)


def test_ablation_rates_become_times_and_config_fields_win():
    from autoshard.validate.ablations import _metric, config_row

    cfgs = [{"measured": {"tokens_per_sec_per_gpu": 100, "mfu_pct": 40}}, {"measured": {"status": "OOM"}},
            {"measured": {"tokens_per_sec_per_gpu": 128}}]
    assert _metric(cfgs) == "tokens_per_sec_per_gpu"  # mfu_pct is not in every configuration that ran
    # a group's facts hold for every configuration; a configuration's own value of the field wins
    group = {"id": "g", "source": "x", "model": {"layers": 32, "hidden": 4096, "ffn": 14336, "heads": 32,
                                                  "vocab": 128256}, "gpu": "H100", "gpu_count": 64, "seq_len": 8192,
             "global_batch_seqs": 64, "precision": "bf16", "tp_comm_overlap": True, "recompute": "full"}
    row, _ = config_row(group, {"tp": 8, "dp": 8, "micro_batch": 1}, 0)
    assert row["tp_comm_overlap"] is True and row["activation_recompute"] == "full" and row["precision"] == "bf16"
    row, _ = config_row(group, {"tp": 8, "dp": 8, "micro_batch": 1, "tp_comm_overlap": False, "recompute": "none",
                                "precision": "fp8 tensorwise"}, 1)
    assert row["tp_comm_overlap"] is False and row["activation_recompute"] == "none"
    assert row["precision"] == "fp8 tensorwise"  # per-configuration precision in a group


ABLATIONS_DEV = DEV_RUNS.parent / "ablations_dev.json"


def test_ablations_dev_report(capsys):
    from autoshard.cli import main
    from autoshard.validate.ablations import validate_ablations

    rep = validate_ablations(ABLATIONS_DEV)
    groups = json.loads(ABLATIONS_DEV.read_text())
    assert rep.summary.groups == len(groups) == 22
    by_id = {g.id: g for g in rep.groups}
    # torchtitan Table 5: interleaved 1F1B 128 vs 1F1B 100 tokens/s/GPU -> measured order [1, 0].
    assert by_id["torchtitan-2412-405b-512gpu-pp-schedule"].measured_order == [1, 0]
    # the OOM group: two configurations measured OOM, one ran.
    oom = by_id["torchtitan-2404-llama2-70b-64a100-ac"]
    assert [c.status for c in oom.configs] == ["OOM", "OOM", "ok"] and oom.measured_order == [2]
    assert rep.summary.pairs_compared == sum(len(g.compared) for g in rep.groups) > 0
    # auto-detected from the file's shape, same as --ablations
    assert main(["validate", str(ABLATIONS_DEV), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["pairs_compared"] == rep.summary.pairs_compared
    assert main(["validate", "--ablations", str(ABLATIONS_DEV)]) == 0
    assert "concordance" in capsys.readouterr().out.splitlines()[-1]


# ---- prediction intervals -------------------------------------------------------------------


def test_regime_classification_by_hand():
    from autoshard.cost.intervals import regime

    assert regime({"compute": 8.0, "tp_comm": 1.0, "pipeline_bubble": 1.0}, 10.0, moe=True) == "moe"
    assert regime({"compute": 8.0, "pipeline_bubble": 1.0, "pp_comm": 0.5}, 10.0, moe=False) == "pipeline-bound"
    assert regime({"compute": 9.0, "pipeline_bubble": 0.7}, 10.0, moe=False) == "compute-bound"  # 7% < 8%
    assert regime({"compute": 8.0, "tp_comm": 0.5, "dp_comm": 0.25, "zero3_comm": 0.25}, 10.0, moe=False) \
        == "communication-bound"  # 10%
    assert regime({"compute": 9.1, "tp_comm": 0.9}, 10.0, moe=False) == "compute-bound"


def test_intervals_contain_the_stated_fraction_of_dev_residuals():
    from autoshard.cost.intervals import MIN_RUNS, QUANTILES, fit_intervals, residuals

    reports = [validate(DEV_RUNS), validate(MODERN_DEV)]
    doc = fit_intervals(reports)
    res = residuals(reports)
    assert doc["regimes"]["all"]["n"] == len(res) == sum(r.summary.n for r in reports)
    stated = QUANTILES[1] - QUANTILES[0]  # 80%
    for name, q in doc["regimes"].items():
        ratios = [x for g, x in res if name in ("all", g)]
        assert q["n"] == len(ratios)
        # independent quantiles: numpy's linear interpolation
        assert q["low"] == pytest.approx(np.percentile(ratios, 100 * QUANTILES[0]), abs=1e-4)
        assert q["high"] == pytest.approx(np.percentile(ratios, 100 * QUANTILES[1]), abs=1e-4)
        inside = sum(q["low"] <= x <= q["high"] for x in ratios) / len(ratios)
        if len(ratios) >= 20:
            assert abs(inside - stated) <= 0.05, (name, inside)
        elif len(ratios) >= MIN_RUNS:
            assert inside >= stated - 2 / len(ratios), (name, inside)


def test_bundled_intervals_file_and_estimates_carry_intervals():
    from autoshard.cost.intervals import interval, regime, table

    doc = table()
    assert doc is not None and doc["quantiles"] == [0.1, 0.9] and doc["date"]
    assert any("dev_runs.json" in s for s in doc["sources"]) and any("modern_runs_dev.json" in s for s in doc["sources"])
    for q in doc["regimes"].values():
        assert 0 < q["low"] <= q["median"] <= q["high"] and q["n"] >= 1
    problem = load_problem(Path(__file__).resolve().parents[1] / "problems" / "llama3-8b-64xh100.yaml")
    est = cost.evaluate(problem, {"tp": 1, "pp": 1, "dp": 64, "zero_stage": 1, "micro_batch_size": 1,
                                  "recompute": "selective"})
    assert est.step_time_s > 0 and est.step_time_interval_s is not None
    name = regime(est.time_breakdown_s, est.step_time_s, moe=False)
    q = doc["regimes"][name] if doc["regimes"].get(name, {}).get("n", 0) >= 5 else doc["regimes"]["all"]
    lo, hi = est.step_time_interval_s
    assert (lo, hi) == pytest.approx((est.step_time_s * q["low"], est.step_time_s * q["high"]))
    assert interval(2.0, "no-such-regime") == pytest.approx((2 * doc["regimes"]["all"]["low"],
                                                            2 * doc["regimes"]["all"]["high"]))
    bad = cost.evaluate(problem, {"tp": 3})
    assert bad.step_time_interval_s is None


def test_reports_say_which_runs_an_interval_comes_from():
    # The terminal and Markdown reports name the regime whose residuals set the interval, and how many
    # validation runs it holds (all runs where a regime has fewer than MIN_RUNS).
    from autoshard.cost.intervals import interval_source, regime, table
    from autoshard.render import _estimate_markdown, estimate_text

    regs = table()["regimes"]
    problem = load_problem(Path(__file__).resolve().parents[1] / "problems" / "llama3-8b-64xh100.yaml")
    est = cost.evaluate(problem, {"tp": 1, "pp": 1, "dp": 64, "zero_stage": 1, "micro_batch_size": 1,
                                  "recompute": "selective"})
    name = regime(est.time_breakdown_s, est.step_time_s, moe=False)
    words = interval_source(est, moe=False)
    assert words == f"the {regs[name]['n']} {name} validation runs"
    assert f"(80% interval from {words})" in estimate_text(problem, est)
    assert any(f"(from {words})" in line for line in _estimate_markdown(est, problem))
    moe = interval_source(est, moe=True)
    assert moe == f"the {regs['moe']['n']} MoE validation runs"


def test_indistinguishable_alternatives_and_robust_choice():
    from autoshard.cost.intervals import overlaps
    from autoshard.solver.robust import robust_choice
    from autoshard.render import alternative_line
    from autoshard.solver.records import Alternative, Solution, SolverStats

    assert overlaps((1.0, 2.0), (1.9, 3.0)) and not overlaps((1.0, 2.0), (2.1, 3.0)) and not overlaps(None, (1, 2))
    problem = load_problem(Path(__file__).resolve().parents[1] / "problems" / "llama3-8b-64xh100.yaml")
    a = cost.evaluate(problem, {"tp": 1, "dp": 64, "micro_batch_size": 1, "recompute": "selective"})
    b = cost.evaluate(problem, {"tp": 2, "dp": 32, "micro_batch_size": 1, "recompute": "selective"})
    c = cost.evaluate(problem, {"tp": 4, "dp": 16, "micro_batch_size": 1, "recompute": "selective"})
    # hand-set intervals: b is 2% slower but has the tighter upper end; c is far apart
    a = a.model_copy(update={"step_time_s": 1.00, "step_time_interval_s": (0.90, 1.50)})
    b = b.model_copy(update={"step_time_s": 1.02, "step_time_interval_s": (0.95, 1.20)})
    c = c.model_copy(update={"step_time_s": 2.00, "step_time_interval_s": (1.80, 3.00)})
    stats = SolverStats(status="OPTIMAL", solve_time_s=0.1, objective_s=1.0, objective_bound_s=1.0, gap=0.0,
                        candidates=3, pruned_by_memory=0, pruned_by_bound=0, cp_sat_solves=1, rounding_tolerance_s=0.0)
    sol = Solution(plan=a.plan, estimate=a, solver=stats, alternatives=[
        Alternative(plan=b.plan, estimate=b, differs="tp 1 -> 2", slower_pct=2.0),
        Alternative(plan=c.plan, estimate=c, differs="tp 1 -> 4", slower_pct=100.0)])
    assert "indistinguishable" in alternative_line(a, sol.alternatives[0])
    assert "indistinguishable" not in alternative_line(a, sol.alternatives[1])
    robust = robust_choice(sol)
    assert robust.plan == b.plan and robust.estimate.step_time_interval_s == (0.95, 1.20)
    assert [x.plan.tp for x in robust.alternatives] == [1, 4]
    assert robust.alternatives[0].slower_pct == pytest.approx(100 * (1.00 - 1.02) / 1.02)
    # when the point optimum also has the lowest upper end, nothing changes
    assert robust_choice(sol.model_copy(update={"alternatives": sol.alternatives[1:]})) is not None
    assert robust_choice(sol.model_copy(update={"alternatives": sol.alternatives[1:]})).plan == a.plan


def test_bad_ablation_files_are_one_line_errors(tmp_path, capsys):
    from autoshard.cli import main

    group = {"id": "g", "model": {"name": "Llama 3 8B", "layers": 32, "hidden": 4096, "ffn": 14336, "heads": 32,
                                  "kv_heads": 8, "vocab": 128256},
             "gpu": "H100", "gpu_count": 8, "seq_len": 8192, "global_batch_seqs": 16, "precision": "bf16",
             "source": "hand", "configs": [{"tp": 1, "dp": 8, "measured": {"step_time_s": 2.0}},
                                           {"tp": 2, "dp": 4, "measured": {"step_time_s": 2.5}}]}
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps([group]))
    assert main(["validate", str(ok)]) == 0  # detected by shape
    out = capsys.readouterr().out
    assert "measured order [0, 1]" in out and out.splitlines()[-1].startswith("ablations: 1 groups")
    for path, value, expect in ((("configs", 0, "tp"), "x", "[0].configs[0].tp: expected a positive whole number"),
                                (("configs", 1, "measured"), {"step_time_s": "slow"},
                                 "[0].configs[1].measured.step_time_s: expected a positive number"),
                                (("configs", 1, "measured"), {"status": "crashed"}, "measured.status"),
                                (("gpu_count",), 0, "[0].gpu_count: expected a positive whole number")):
        bad = json.loads(json.dumps(group))
        target = bad
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value
        f = tmp_path / "bad.json"
        f.write_text(json.dumps([bad]))
        assert main(["validate", "--ablations", str(f)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expect in err[0] and str(f) in err[0]


def test_modern_rows_state_their_dispatcher_and_cuda_graphs():
    from autoshard.validate.modern import cuda_graphs_of, dispatcher_of_row

    row = {"id": "r", "moe_dispatcher": "hybridep", "cuda_graphs": True,
           "notes": "Recipe at HEAD (helpers it calls: _enable_hybridep_full_iteration_mxfp8)"}
    assert dispatcher_of_row(row) == "hybridep" and cuda_graphs_of(row)
    # notes are text for people: a dispatcher or CUDA graphs named only there are not read
    plain = {"id": "p", "notes": "TE + DeepEP, full_iteration CUDA graphs"}
    assert dispatcher_of_row(plain) is None and not cuda_graphs_of(plain)
    with pytest.raises(InputError, match="p.cuda_graphs: expected true or false"):
        cuda_graphs_of(dict(plain, cuda_graphs="yes"))


# What validation/ablations_dev.json states for the BigScience logbook's groups (validation/README.md).
GPT_MODEL = {"hidden_act": "gelu", "dropout": True, "tie_word_embeddings": True}
LOGBOOK_FACTS = {"id": "logbook-test", "source": "BigScience BLOOM-176B pre-training logbook ('chronicles-prequel')",
                 "source_family": "BigScience Megatron-DeepSpeed", "framework": "deepspeed", "gpu": "A100 SXM 80GB",
                 "topology": "jean-zay-a100", "seq_len": 2048, "global_batch_seqs": 2048, "precision": "fp16",
                 "flash_attention": False, "sp": False, "launch_blocking": True, "softmax_fusion": "bigscience-2022",
                 "recompute": "full",
                 "filled": {"recompute": "full: the tr11 launchers pass --checkpoint-activations"}}


def test_bloom_logbook_configurations_run_as_megatron_deepspeed_did():
    # The BLOOM logbook's configurations: Megatron-DeepSpeed of Feb 2022 (no sequence parallelism,
    # DeepSpeed's pipeline engine, no TP overlap), with CUDA_LAUNCH_BLOCKING=1 against NCCL hangs.
    from autoshard.cost import BLOCKING_LAYER_HOST_S
    from autoshard.validate.ablations import config_row
    from autoshard.validate.modern import modern_row_to_case

    group = dict(LOGBOOK_FACTS, model={"name": "candidate 182B", "hidden": 13824, "layers": 78, "heads": 64,
                                       "vocab": 250880, "ffn": 4 * 13824, **GPT_MODEL}, gpu_count=384)
    cases = []
    for mbs in (1, 2):
        row, notes = config_row(group, {"tp": 4, "pp": 12, "dp": 8, "zero_stage": 1, "micro_batch": mbs}, mbs)
        assert row["sp"] is False and row["launch_blocking"] is True
        row["step_time_s"] = 100.0
        case = modern_row_to_case(row)
        assert case.framework == "deepspeed" and case.problem.training.launch_blocking
        assert case.plan.sequence_parallel is False
        # Jean Zay's network, not a DGX SuperPOD's: 4 x 100 Gb/s Omni-Path per 8-GPU node
        assert case.problem.cluster.topology == "jean-zay-a100"
        levels = cost.context(case.problem).levels
        assert [lv.size for lv in levels] == [8, 416] and levels[1].link_bytes_per_s == pytest.approx(4 * 100e9 / 8 / 8)
        cases.append(case)
    # Blocking launches cost each layer its launches once per micro-batch: micro-batch 1 pays twice
    # as many as micro-batch 2 (256 vs 128 micro-batches per pipeline; 78 layers over 12 stages put 6
    # or 7 on the stage that sets the pace).
    est = [cost.evaluate(c.problem, c.plan) for c in cases]
    layers = est[0].time_breakdown_s["host"] / (256 * BLOCKING_LAYER_HOST_S)
    assert round(layers) in (6, 7) and layers == pytest.approx(round(layers), rel=1e-6)
    assert est[0].time_breakdown_s["host"] == pytest.approx(2 * est[1].time_breakdown_s["host"], rel=1e-6)
    assert est[0].step_time_s > est[1].step_time_s  # as measured (148.2 vs 103.5 s)
    # DeepSpeed's pipeline engine reduces and gathers after the schedule: the whole tail is exposed
    assert est[0].time_breakdown_s["dp_comm"] == pytest.approx(est[1].time_breakdown_s["dp_comm"])
    assert est[0].time_breakdown_s["dp_comm"] > 1.0


def test_bloom_logbook_configurations_recompute_every_layer():
    # tr11's launchers pass --checkpoint-activations; the logbook's memory column (02-20, 187B on 320
    # A100s, tp8 pp10 dp4) confirms it: 33 GB at micro-batch 1 and 73 GB at 8, where keeping the
    # activations would not fit micro-batch 2 in 80 GB. Both the level and the growth must agree.
    from autoshard.cost import RESERVE_GIB
    from autoshard.validate.ablations import config_row
    from autoshard.validate.modern import modern_row_to_case

    # the project's copy of the 02-20 187B group (its filled layers, heads, ffn and vocab)
    (group,) = [g for g in json.loads(ABLATIONS_DEV.read_text()) if g["id"] == "bloom-0220-187b-320gpu-mbs"]
    peak_gb = {}
    for mbs in (1, 8):
        row, notes = config_row(group, {"tp": 8, "pp": 10, "dp": 4, "zero_stage": 1, "micro_batch": mbs}, mbs)
        assert row["activation_recompute"] == "full" and any("--checkpoint-activations" in n for n in notes)
        row["step_time_s"] = 100.0
        case = modern_row_to_case(row)
        assert case.plan.recompute == "full" and case.recompute_published
        est = cost.evaluate(case.problem, case.plan)
        assert est.fits
        peak_gb[mbs] = (est.peak_memory_gib + RESERVE_GIB) * 2**30 / 1e9
    # measured 33 and 73 GB (DeepSpeed's buckets and the allocator's slack are not priced: within 12 GB)
    assert 33 - 12 < peak_gb[1] < 33 and 73 - 12 < peak_gb[8] < 73
    assert peak_gb[8] - peak_gb[1] == pytest.approx(73 - 33, rel=0.15)
    # a run that stored every activation would not have fit micro-batch 8 at all
    held = case.plan.model_copy(update={"recompute": "none"})
    assert not cost.evaluate(case.problem, held).fits


def test_completed_plans_keep_the_runs_dispatcher():
    # Where a row does not publish its recompute, the solver picks it under the row's degrees; it must
    # not also swap the row's expert dispatcher for the one it would plan with (DeepEP / HybridEP).
    from autoshard.validate import completed_plan

    mix = run_to_case(modern_rows()["nemo_2504_mixtral8x7b_gb200_fp8_64gpu"])
    assert not mix.recompute_published and mix.plan.ep == 8
    done = completed_plan(mix)
    assert done.moe_dispatcher in (None, "alltoall")  # Megatron's default, as the run had it (the planner takes deepep)
    assert (done.tp, done.pp, done.ep, done.micro_batch_size) == (mix.plan.tp, mix.plan.pp, 8, mix.plan.micro_batch_size)


def test_completed_plans_keep_the_runs_overlaps_and_graphs():
    # The solver that fills in an unpublished recompute has no overlap / CUDA-graph knobs in its
    # search: the completed plan keeps the run's own settings (they had fallen back to the defaults).
    import dataclasses

    from autoshard.validate import completed_plan

    mix = run_to_case(modern_rows()["nemo_2504_mixtral8x7b_gb200_fp8_64gpu"])
    assert not mix.recompute_published
    stated = dict(ep_overlap=False, tp_comm_overlap=False, cuda_graphs=True, overlap_param_gather=False)
    case = dataclasses.replace(mix, plan=mix.plan.model_copy(update=stated))
    done = completed_plan(case)
    assert {k: getattr(done, k) for k in stated} == stated
    assert cost.evaluate(case.problem, done).time_breakdown_s.get("host", 0.0) == 0.0  # graphs: no host time


@functools.cache
def bench_mbridge_tables():
    """benchmarks/bench_mbridge_tables.py as a module (it is a script, not a package module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_mbridge_tables", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_mbridge_tables.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def mbridge_bench():
    """benchmarks/bench_mbridge_tables.py as a module: the lookup of Megatron-Bridge's recipe table
    (recipe_table, recipe_entry, recipe_of), which validation itself never does."""
    bench = bench_mbridge_tables()
    return bench


def test_recipe_of_reads_the_release_recipe_and_its_siblings():
    # A row of the table is looked up by id; an unlisted row of the same release, model and GPU system
    # (another GPU count or precision of one recipe) gets the settings all its listed siblings share.
    recipe_of = mbridge_bench().recipe_of

    row = modern_rows()["mbridge_260401_qwen3235ba22b_h100_fp8_256gpu"]
    assert recipe_of(row)["ep_overlap"] is True and recipe_of(row)["recompute"] == "none"
    sibling = {**row, "id": "mbridge_260401_qwen3235ba22b_h100_bf16_512gpu"}
    got = recipe_of(sibling)
    assert (got["ep_overlap"], got["dispatcher"], got["confidence"]) == (True, "alltoall", "high")
    # 25.09 token-drop Qwen3-30B: B200 and GB200 agree on everything but the GPU; unknown models get nothing.
    assert recipe_of({**row, "id": "x", "other_metrics": {"release": "25.09", "source_model_label": "Qwen3_30B_a3B (tokendrop)"},
                      "gpu": "DGX-GB200"})["capacity_factor"] == 1.0
    assert recipe_of({**row, "id": "x", "model": "Unknown", "other_metrics": {}}) == {}


def test_megatron_rows_carry_their_release_recipe_and_the_conversion_reads_the_field():
    # The recipe facts live in the rows (`framework_recipe`, validation/README.md), written from the table
    # of Megatron-Bridge's recipes (data/mbridge_recipes.yaml) unchanged; the conversion reads the field,
    # never the row's id or model name.
    from autoshard.validate.modern import framework_of, recipe_facts

    recipe_entry = mbridge_bench().recipe_entry

    shipped = {r["id"]: r for r in json.loads(MODERN_DEV.read_text())}
    carried = {rid: r for rid, r in shipped.items() if "framework_recipe" in r}
    assert len(carried) == 48 and all(framework_of(r)[0] == "megatron" for r in carried.values())
    for rid, r in carried.items():
        bare = {k: v for k, v in r.items() if k != "framework_recipe"}
        assert r["framework_recipe"] == recipe_entry(bare), rid
        assert r["framework_recipe"]["source"] and r["framework_recipe"]["confidence"] in ("high", "medium", "low")
    # qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config (26.04.01): alltoall with the EP overlap, no graphs
    row = shipped["mbridge_260401_qwen3235ba22b_h100_fp8_256gpu"]
    renamed = run_to_case({**row, "id": "another-table-line", "model": "another name"})
    assert (renamed.plan.moe_dispatcher, renamed.plan.ep_overlap) == ("alltoall", True)
    bare = run_to_case({k: v for k, v in row.items() if k != "framework_recipe"})
    assert bare.plan.ep_overlap is None and bare.plan.moe_dispatcher is None  # the framework's defaults
    # 25.09 DeepSeek-V3 on 1,024 H100: the perf matrix sets etp 1 beside tp 2 (deepseek_v3_llm_pretrain.yaml
    # perf_matrix.h100.num_gpus_1024), which the table does not print: experts over EP64 without TP
    dsv3 = shipped["mbridge_2509_deepseekv3dropless_h100_fp8_1024gpu"]
    assert dsv3["etp"] is None and dsv3["framework_recipe"]["etp"] == 1
    assert (run_to_case(dsv3).plan.tp, run_to_case(dsv3).plan.expert_tp) == (2, 1)
    assert run_to_case({k: v for k, v in dsv3.items() if k != "framework_recipe"}).plan.expert_tp == 2
    # a low-confidence entry gives no recompute, offloading or layout; everything else applies
    low = recipe_facts({"framework_recipe": {"recompute": "full", "layout": "embedding+loss", "offload_layers": 2,
                                             "ep_overlap": True, "confidence": "low", "source": "s"}})
    assert low == {"ep_overlap": True, "confidence": "low", "source": "s"}
    with pytest.raises(InputError) as exc:
        run_to_case({**row, "framework_recipe": {"ep_overlap": True, "graphs": "full_iteration"}})
    assert exc.value.field == "mbridge_260401_qwen3235ba22b_h100_fp8_256gpu.framework_recipe"
    assert "'graphs'" in str(exc.value)
    with pytest.raises(InputError):
        run_to_case({**row, "framework_recipe": "full_iteration"})


def test_recipe_of_prefers_the_entry_of_the_rows_own_table_line(monkeypatch):
    # Two lines of one release, model and system (BF16 and MXFP8) can run different recipes: a row
    # takes the entry of its own line (precision as printed, GPU count); a line without an entry
    # gets only what all the lines' entries share.
    bench = mbridge_bench()

    base = {"release": "26.04", "model": "M", "gpu": "DGX-GB200", "ep_overlap": True, "dispatcher": "hybridep",
            "recompute": "none", "confidence": "high", "source": "test"}
    table = {"a": {**base, "precision": "BF16", "num_gpus": 256, "cuda_graphs": "none"},
             "b": {**base, "precision": "MXFP8", "num_gpus": 256, "cuda_graphs": "full_iteration"}}
    monkeypatch.setattr(bench, "recipe_table", lambda: table)
    row = {"id": "x", "gpu": "DGX-GB200", "gpu_count": 256, "precision": "MXFP8",
           "other_metrics": {"release": "26.04", "source_model_label": "M"}}
    assert bench.recipe_of(row)["cuda_graphs"] == "full_iteration"
    assert bench.recipe_of({**row, "precision": "BF16"})["cuda_graphs"] == "none"
    other = bench.recipe_of({**row, "precision": "NVFP4"})
    assert "cuda_graphs" not in other and other["dispatcher"] == "hybridep" and other["ep_overlap"] is True
    assert bench.recipe_of({**row, "gpu_count": 64})["dispatcher"] == "hybridep"


def test_mbridge_recipe_table_is_well_formed():
    from typing import get_args

    from autoshard.spec import Dispatcher, Plan

    from autoshard.validate.modern import megatron_layout_stages

    table = mbridge_bench().recipe_table()
    # the 48 Megatron-Bridge rows of the dev file and the other lines of the published tables
    assert len(table) >= 176 and all(modern_rows_id in table for modern_rows_id in modern_rows() if
                                     modern_rows_id.startswith("mbridge_"))
    for rid, e in table.items():
        assert "dispatcher" not in e or e["dispatcher"] in get_args(Dispatcher), rid
        layout = e.get("layout")
        assert layout in (None, "embedding+loss") or set("".join(megatron_layout_stages(layout))) <= set("EtmL"), rid
        assert int(e.get("offload_layers", 0)) >= 0, rid
        scopes = e.get("cuda_graph_scope")
        assert scopes is None or set(scopes.split("+")) <= {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"}, rid
        assert e["cuda_graphs"] in ("none", "local", "transformer_engine", "full_iteration"), rid
        assert e["confidence"] in ("high", "medium", "low") and e["source"], rid
        Plan(recompute=e["recompute"])  # a recompute the plans take
        assert rid.startswith("mbridge_") and isinstance(e.get("ep_overlap", False), bool)
        assert e["precision"] and int(e["num_gpus"]) > 0, rid  # the table line it belongs to


def test_recipe_layouts_and_activation_offloading():
    # account_for_embedding/loss_in_pipeline_split: (layers + 2) slots split evenly, the first and last
    # virtual stage one transformer layer short (Llama 3.1 405B: 126 layers on 64 or 32 virtual stages).
    from autoshard.validate.modern import modern_row_to_case, recipe_stage_layers

    recipe_entry = mbridge_bench().recipe_entry

    assert recipe_stage_layers(126, 64, "embedding+loss") == [1] + [2] * 62 + [1]
    assert recipe_stage_layers(126, 32, "embedding+loss") == [3] + [4] * 30 + [3]
    assert recipe_stage_layers(80, 20, "embedding+loss") is None  # 82 slots do not split in 20
    assert recipe_stage_layers(126, 64, None) is None and recipe_stage_layers(126, 1, "embedding+loss") is None
    # Megatron layout strings, unrolled as Megatron-LM's parse_str_to_list does: DeepSeek-V3's 61 layers
    # on 16 virtual stages (4 per stage, the last one layer and the MTP layer), 32 stages with a last
    # stage of MTP and loss only; a layout of another stage count or layer total does not apply.
    assert recipe_stage_layers(61, 16, "Et*4|(t*4|)*14tmL") == [4] * 15 + [1]
    assert recipe_stage_layers(61, 32, "Et|(tt|)*30mL") == [1] + [2] * 30 + [0]
    assert recipe_stage_layers(61, 16, "Et*3|(t*4|)*14ttL") == [3] + [4] * 14 + [2]
    assert recipe_stage_layers(61, 8, "Et*4|(t*4|)*14tmL") is None and recipe_stage_layers(60, 16, "Et*4|(t*4|)*14tmL") is None
    # The 25.09 GB200 Llama 3 70B recipe offloads the activations of 40 of its 80 layers
    # (cpu_offloading_num_layers 40) and recomputes nothing; the row itself publishes neither.
    row = {"id": "mbridge_2509_llama370b_gb200_fp8_64gpu", "source": "NVIDIA NeMo Megatron-Bridge performance summary",
           "model": "LLAMA3_70B", "layers": 80, "hidden": 8192, "ffn": 28672, "heads": 64, "kv_heads": 8,
           "vocab": 128256, "seq_len": 8192, "gpu": "DGX-GB200", "gpu_count": 64, "gpus_per_node": 4,
           "nvlink_domain_gpus": 72, "precision": "FP8", "tp": 1, "pp": 1, "cp": 1, "dp": 64, "fsdp": True,
           "micro_batch": 2, "global_batch_seqs": 128, "step_time_s": 4.11,
           "other_metrics": {"release": "25.09", "source_model_label": "LLAMA3_70B"}, "notes": "", "etp": None}
    assert modern_row_to_case(row).plan.recompute != ["offload"] * 40 + ["none"] * 40  # stated nowhere in the row
    case = modern_row_to_case({**row, "framework_recipe": recipe_entry(row)})
    assert case.plan.recompute == ["offload"] * 40 + ["none"] * 40 and case.recompute_published


def test_published_table_lines_parse_and_convert():
    # benchmarks/bench_mbridge_tables.py reads Megatron-Bridge's performance summaries in both layouts
    # ('#### Model:' sections with a System column, '#### System:' sections with a Model column) and
    # prices a line with the shape of the dev row of its model: the 26.04 B300 Qwen3-235B line
    # (4,865 tokens/s/GPU on 256 GPUs, batch 8192 x 4096) is 26.94 s a step.
    bench = bench_mbridge_tables()
    text = """## 26.04 NeMo Container

### Pre-Training Performance

#### Model: Qwen3_235B_a22B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-B300 | 256 | MXFP8 | 8192 | 2 | 4096 | 0 | 1 | 8 | 1 | n/a | 8 | 4865 | 720 |

### SFT Performance

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP | Tokens / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|----|----|----|----|----|----|
| DGX-B300 | 8 | BF16 | 8 | 1 | 4096 | 1 | 1 | 1 | n/a | 1 | 999 |

## 25.11 NeMo Container

### Pre-Training Performance

#### System: DGX-GB200

| Model | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | GA | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|-------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|----|-----------------------|-------------------------|
| LLAMA3_8B | 8 | FP8-CS (FP8-MX) | 128 | 2 | 8192 | 0 | 1 | 1 | 1 | n/a | 1 | 8 | 31508 (29789) | 1622 (1533) |
"""
    lines = bench.parse_tables(text)
    assert [(d["release"], d["model"], d["System"]) for d in lines] == [
        ("26.04", "Qwen3_235B_a22B", "DGX-B300"), ("25.11", "LLAMA3_8B", "DGX-GB200")]  # SFT left out
    shape = modern_rows()["mbridge_260401_qwen3235ba22b_h100_fp8_256gpu"]
    row = bench.line_to_row(lines[0], shape, shape)
    assert (row["tp"], row["pp"], row["ep"], row["dp"], row["vpp_chunks"], row["micro_batch"]) == (1, 8, 8, 32, None, 2)
    assert row["step_time_s"] == pytest.approx(8192 * 4096 / (4865 * 256)) and row["fsdp"] is False
    assert row["other_metrics"] == {"release": "26.04", "source_model_label": "Qwen3_235B_a22B"}
    llama = bench.line_to_row(lines[1], shape, shape)
    assert llama["precision"] == "FP8-CS" and llama["tokens_per_sec_per_gpu"] == 31508 and llama["ep"] == 1


def test_same_configuration_lines_pair_across_gpu_systems():
    # bench_mbridge_tables --pairs: two lines of one release, model, precision, GPU count, batch and degrees
    # on two systems give the measured speed ratio free of any factor they share. Megatron-Bridge's 26.04
    # table (docs/performance-summary-archive.md): Llama 3 70B FP8 with FSDP on 64 GPUs, GB300 5,243 vs GB200
    # 4,143 tokens/s/GPU -> 1.2655; its MXFP8 lines run TP1 on GB300 and TP2 on GB200 and are no pair.
    bench = bench_mbridge_tables()
    text = """## 26.04 NeMo Container

### Pre-Training Performance

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-GB300 | 64 | MXFP8 | 256 | 1 | 8192 | 0 | 1 | 4 | 1 | 5 | n/a | 4742 | 2131 |
| DGX-GB200 | 64 | MXFP8 | 256 | 1 | 8192 | 0 | 2 | 4 | 1 | 5 | n/a | 3828 | 1721 |
| DGX-GB300 | 64 | FP8 | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | n/a | n/a | 5243 | 2355 |
| DGX-GB200 | 64 | FP8 | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | n/a | n/a | 4143 | 1861 |
"""
    rows = {r["id"]: r for r in load_runs(MODERN_DEV)}
    shape = rows["mbridge_260401_llama370b_gb300_fp8_64gpu"]
    systems = {"DGX-GB300": shape, "DGX-GB200": rows["mbridge_2511_llama370b_gb200_fp8cs_64gpu"]}
    lines = []
    for d in bench.parse_tables(text):
        row = bench.line_to_row(d, shape, systems[d["System"]])
        res = evaluate_case(run_to_case(row))
        lines.append((row, res.measured_step_s, res.predicted_step_s))
    pairs = bench.system_pairs(lines)
    assert list(pairs) == [("DGX-GB200", "DGX-GB300")] and len(pairs[("DGX-GB200", "DGX-GB300")]) == 1
    p = pairs[("DGX-GB200", "DGX-GB300")][0]
    assert p["measured"] == pytest.approx(5243 / 4143, rel=1e-9) == pytest.approx(1.2655, abs=1e-4)
    fp8 = [x for x in lines if x[0]["precision"] == "FP8"]
    assert p["predicted"] == pytest.approx(fp8[1][2] / fp8[0][2], rel=1e-9)



def test_table_lines_of_dev_rows_are_not_held_out(tmp_path, monkeypatch, capsys):
    # bench_mbridge_tables prices the published lines the dev file lacks. Megatron-Bridge's archive
    # (docs/performance-summary-archive.md @067f987df): the 26.04.01 GB300 Llama 3 70B FP8 line (5,248
    # tokens/s/GPU, EP 'n/a') is the dev row mbridge_260401_llama370b_gb300_fp8_64gpu (ep null); the 26.02.01
    # MXFP8 line (printed PP 4, VP n/a, MBS 2; 4,798) is mbridge_260201_llama370b_gb300_mxfp8_64gpu, whose
    # row states the release's recipe (v0.3.1 GB300_FP8_MX_V2: PP 4, VP 5, MBS 1); the 26.04 FP8 line (5,243)
    # has no dev row and is the one line held out.
    bench = mbridge_bench()
    table = tmp_path / "t.md"
    head = ("| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | "
            "Tokens / sec / GPU | Model TFLOP / sec / GPU |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    table.write_text(
        "## 26.04.01 NeMo Container\n\n### Pre-Training Performance\n\n#### Model: LLAMA3_70B\n\n" + head
        + "| DGX-GB300 | 64 | FP8 | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | n/a | n/a | 5248 | 2348 |\n\n"
        + "## 26.04 NeMo Container\n\n### Pre-Training Performance\n\n#### Model: LLAMA3_70B\n\n" + head
        + "| DGX-GB300 | 64 | FP8 | 256 | 2 | 8192 | 64 | 1 | 1 | 1 | n/a | n/a | 5243 | 2355 |\n\n"
        + "## 26.02.01 NeMo Container\n\n### Pre-Training Performance\n\n#### Model: LLAMA3_70B\n\n" + head
        + "| DGX-GB300 | 64 | MXFP8 | 256 | 2 | 8192 | 0 | 1 | 4 | 1 | n/a | n/a | 4798 | 2157 |\n",
        encoding="utf-8")
    monkeypatch.setattr("sys.argv", ["bench_mbridge_tables.py", str(table), "--json"])
    assert bench.main() == 0
    held = json.loads(capsys.readouterr().out)["lines"]
    assert [h["id"] for h in held] == ["table_26.04_LLAMA3_70B_DGX-GB300_FP8_64gpu_tp1pp1cp1vpNoneep1mbs2"]
    rows = {r["id"]: r for r in load_runs(MODERN_DEV)}
    mx = rows["mbridge_260201_llama370b_gb300_mxfp8_64gpu"]
    assert (mx["pp"], mx["vpp_chunks"], mx["micro_batch"], mx["grad_accum"]) == (4, 5, 1, 256 // (1 * 16))
    assert mx["other_metrics"]["table_layout_as_printed"].startswith("PP 4, VP n/a, MBS 2")

# ---- GPU spellings, measured memory (issue 29) ----------------------------------------------------


@pytest.mark.parametrize("name,gid", [
    ("H100 80GB", "h100-sxm"), ("NVIDIA H100 SXM5", "h100-sxm"), ("H100 80GB HBM3", "h100-sxm"),
    ("A100 40GB", "a100-sxm-40gb"), ("A100-SXM4-80GB", "a100-sxm-80gb"), ("NVIDIA A100 80GB", "a100-sxm-80gb"),
    ("H800", "h800-sxm"), ("NVIDIA H800 SXM5", "h800-sxm"), ("AMD Instinct MI300X", "mi300x"),
    ("DGX-B200", "b200"), ("H100 (96GB HBM2e, 500W power limit)", "h100-hbm2e-96gb"),
])
def test_gpu_spellings_resolve_through_aliases(name, gid):
    from autoshard.catalog import resolve_gpu_id

    assert resolve_gpu_id(name) == gid
    row = dict(rows()["narayanan2021_t1_145.6B"], gpu=name)
    case = run_to_case(row)
    assert case.problem.cluster.gpu == gid


def test_unknown_gpu_is_one_line_with_close_names(tmp_path, capsys):
    from autoshard.cli import main

    f = tmp_path / "runs.json"
    f.write_text(json.dumps([dict(rows()["narayanan2021_t1_145.6B"], gpu="H1OO 80GB")]))
    assert main(["validate", str(f)]) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert out.out == "" and len(err) == 1
    assert str(f) in err[0] and "narayanan2021_t1_145.6B.gpu: unknown GPU 'H1OO 80GB' (closest: h100-80gb" in err[0]


def test_measured_peak_memory_is_reported(tmp_path):
    base = rows()["narayanan2021_t1_145.6B"]
    a = dict(base, id="a", measured_peak_memory_gib=40.0)
    b = dict(base, id="b", measured_peak_memory_gb=50.0)  # 50e9 B = 46.566 GiB
    # the same run storing every activation (no recompute: 164 GiB priced): predicted not to fit, yet it "ran"
    c = dict(base, id="c", measured_peak_memory_gib=70.0, activation_recompute="none")
    f = tmp_path / "runs.json"
    f.write_text(json.dumps([a, b, c]))
    report = validate(f)
    res = {r.id: r for r in report.results}
    assert res["b"].measured_peak_memory_gib == pytest.approx(50e9 / 2**30) == pytest.approx(46.566, abs=1e-3)
    peak = res["a"].peak_memory_gib
    assert peak == res["b"].peak_memory_gib  # the same plan
    assert res["a"].memory_error_pct == pytest.approx((peak - 40.0) / 40.0 * 100)
    assert res["b"].memory_error_pct == pytest.approx((peak - 46.566) / 46.566 * 100, rel=1e-4)
    assert not res["c"].fits
    m = report.memory
    errs = sorted(abs(r.memory_error_pct) for r in res.values())
    assert m.n == 3 and m.median_abs_error_pct == pytest.approx(errs[1]) and m.predicted_oom_that_ran == 1
    assert m.worst_error_pct == max((r.memory_error_pct for r in res.values()), key=abs)
    text = format_report(report)
    assert "memory: n=3" in text and "predicted not to fit but ran: 1" in text
    assert report.to_json()["memory"]["predicted_oom_that_ran"] == 1
    # no measured peak in the file: no memory summary
    f.write_text(json.dumps([base]))
    plain = validate(f)
    assert plain.memory is None and plain.to_json()["memory"] is None and "memory:" not in format_report(plain)
    f.write_text(json.dumps([dict(base, measured_peak_memory_gib="40 GB")]))
    with pytest.raises(InputError, match=r"\[0\].measured_peak_memory_gib: not a number"):
        validate(f)


def test_validation_files_ship_with_the_project(monkeypatch, tmp_path):
    # validate, the tests and the benchmark read the project's validation/; $AUTOSHARD_VALIDATION overrides
    from autoshard.validate import RUNS_ENV, VALIDATION_DIR, default_runs_path, validation_file

    monkeypatch.delenv(RUNS_ENV, raising=False)
    assert default_runs_path() == VALIDATION_DIR / "dev_runs.json" == DEV_RUNS
    assert VALIDATION_DIR == Path(__file__).resolve().parents[1] / "validation"
    for name in ("dev_runs.json", "modern_runs_dev.json", "ablations_dev.json", "README.md"):
        assert (VALIDATION_DIR / name).is_file()
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    assert validation_file("ablations_dev.json") == tmp_path / "ablations_dev.json"
    with pytest.raises(InputError, match="points to no runs file"):
        default_runs_path()


def test_runs_row_power_cap_is_a_cluster_fact():
    # A row stating `power_cap_w` is priced with cluster.power_cap_w: an H100 SXM row capped at 500 W of its
    # 700 W runs its GEMMs at (500/700)^(1/3) = 0.894 of the clock, so its step is slower, by less than 1/0.894.
    row = dict(rows()["dgxc_v24.11_gpt3_175b_bf16_256gpu"])
    free = run_to_case(row)
    row["power_cap_w"] = 500
    capped = run_to_case(row)
    assert free.problem.cluster.power_cap_w is None and capped.problem.cluster.power_cap_w == 500
    t0 = cost.evaluate(free.problem, free.plan).step_time_s
    t1 = cost.evaluate(capped.problem, capped.plan).step_time_s
    assert t0 < t1 < t0 / (500 / 700) ** (1 / 3)


# ---- leave-one-source-out (autoshard/validate/loso.py) ------------------------------------------


def test_loso_fit_finds_the_minimum_of_a_log_quadratic():
    # Rows whose log step moves as k (log x - log x0): the least-squares factor is x0 exactly, wherever
    # x0 falls between the grid points (the parabola through the best three is exact for a quadratic).
    from autoshard.validate.loso import GRID_POINTS, fit_on, grid_of, FACTORS

    f = FACTORS[0]
    grid = grid_of(f)
    assert len(grid) == GRID_POINTS and grid[0] == pytest.approx(0.2) and grid[-1] == pytest.approx(1.0)
    for x0 in (0.3, 0.47, 0.612, 0.9):
        ks = np.array([0.5, 1.0, -0.8])
        meas = np.log(np.array([1.0, 2.0, 3.0]))
        logs = meas[:, None] + ks[:, None] * (np.log(grid)[None, :] - math.log(x0))
        assert fit_on(grid, logs, meas, True) == pytest.approx(x0, rel=1e-9)


def test_loso_leaves_each_family_out(tmp_path):
    # The dev subset: Narayanan's A100 rows and DGX Cloud's H100 rows share one fitted factor, the
    # Ampere/Hopper bf16 end-to-end factor (matmul.yaml). Leaving Narayanan out refits it on DGX Cloud's bf16
    # rows alone, and an A100 row is priced at A100's SOURCED GEMM rate (its published MAMF fraction, 271.2 /
    # 312 TFLOP/s, gpus.yaml gemm_achievable) x that factor: the held-out GPU's figure is not fitted on it.
    from autoshard.cost import evaluate
    from autoshard.validate.loso import loso

    rep = loso([SUBSET])
    fams = {f.family: f for f in rep.families}
    assert set(fams) == {"Narayanan et al. 2021", "NVIDIA DGX Cloud Benchmarking"}
    fit = {ff.factor.name: ff for ff in rep.factors}
    ah = fit["ampere-hopper end_to_end.bf16"]
    assert ah.families == ["NVIDIA DGX Cloud Benchmarking", "Narayanan et al. 2021"]
    # the fold's value is the refit on DGX Cloud's rows alone (a subset file holding only them)
    dgxc = [r for r in json.loads(SUBSET.read_text()) if r.get("source_family") == "NVIDIA DGX Cloud Benchmarking"]
    only = tmp_path / "dgxc.json"
    only.write_text(json.dumps(dgxc))
    rep_d = loso([only])
    ah_d = {ff.factor.name: ff for ff in rep_d.factors}["ampere-hopper end_to_end.bf16"]
    assert ah.loso["Narayanan et al. 2021"] == pytest.approx(ah_d.refit, rel=1e-12)
    # a Narayanan row's LOSO error is its price at A100's sourced rate x that factor
    row = rows()["narayanan2021_t1_145.6B"]
    case = run_to_case(row)
    eff = get_gpu("a100-sxm-80gb").efficiency.model_dump()
    sourced = get_gpu("a100-sxm-80gb").gemm_achievable["bf16"]
    assert sourced == pytest.approx(271.2 / 312, abs=5e-4)
    eff["matmul"]["bf16"] = round(sourced * ah.loso["Narayanan et al. 2021"], 6)
    overlay = tmp_path / "prior.yaml"
    overlay.write_text(yaml.safe_dump({"gpus": {"a100-sxm-80gb": {"efficiency": eff},
                                                "a100-sxm-40gb": {"efficiency": eff}}}))
    from autoshard.validate import with_catalog

    est = evaluate(with_catalog(case, overlay).problem, case.plan)
    assert rep.errors[case.id]["loso"] == pytest.approx((est.step_time_s / case.measured_step_s - 1) * 100, rel=1e-9)
    assert rep.errors[case.id]["catalog"] == pytest.approx(
        (evaluate(case.problem, case.plan).step_time_s / case.measured_step_s - 1) * 100, rel=1e-12)
    assert rep.loso["n"] == rep.catalog["n"] == 16  # the Grok-1 row skips


def test_factors_fitted_on_ablations_are_stated_by_the_groups_not_named_in_code():
    # Which ablation groups a factor was fitted on is a fact of the groups (`fitted_factors`), read by
    # leave-one-source-out; autoshard/validate names no source family.
    from autoshard.validate.ablations import load_groups
    from autoshard.validate.loso import FACTORS

    groups = load_groups(Path(__file__).resolve().parents[1] / "validation" / "ablations_dev.json")
    stated = {n for g in groups for n in g.get("fitted_factors") or ()}
    assert stated == {f.name for f in FACTORS if f.on_ablations} == {
        "deepspeed allocator_overhead", "megatron recompute_module_host_ms"}
    src = (Path(__file__).resolve().parents[1] / "autoshard" / "validate" / "loso.py").read_text()
    for g in groups:
        assert str(g["source_family"]) not in src

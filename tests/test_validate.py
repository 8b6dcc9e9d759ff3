"""Validation against published runs, calibration round trip, Korthikanti activation memory."""

from __future__ import annotations

import csv
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
    format_report,
    korthikanti_check,
    load_runs,
    run_to_case,
    validate,
)

DATA = Path(__file__).parent / "data" / "validation"
SUBSET = DATA / "runs_subset.json"
DEV_RUNS = Path(__file__).resolve().parents[2] / "shared" / "validation" / "dev_runs.json"


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


def test_fill_only_for_gpt3_175b():
    row = dict(rows()["dgxc_v24.11_gpt3_175b_bf16_128gpu"], model="GPT-NeoX 175B")
    skip = run_to_case(row)
    assert isinstance(skip, Skip) and "model dimensions not published" in skip.reason


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


@pytest.mark.skipif(not DEV_RUNS.is_file(), reason="shared/validation/dev_runs.json not present")
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

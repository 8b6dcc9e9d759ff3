"""Does the model ORDER plans as measured? Groups of measured configurations of one model on one
cluster (`validation/ablations_dev.json`).

    from autoshard.validate.ablations import validate_ablations, format_ablations
    print(format_ablations(validate_ablations(path)))

Each configuration of a group becomes a modern-style row (the group's model, GPU, sequence length,
global batch and precision, the configuration's degrees, recompute and overlaps) converted by
`modern.modern_row_to_case` and priced by `evaluate`. Facts come from fields (validation/README.md):
the group's `model` object and the group's fields (`GROUP_DEFAULTS`: precision, recompute, sp,
flash_attention, launch_blocking, softmax_fusion, topology, overlaps, framework, ...) hold for every
configuration, and a configuration's own field of the same name wins; nothing is read from a name or
from the notes. Metrics differ by source (step time,
tokens/s/GPU, TFLOP/s/GPU, MFU), so configurations are compared within their group only, on one
metric per group (the first of step_time_s, tokens_per_sec_per_gpu, tflops_per_gpu, mfu_pct that
every configuration that ran gives; a rate is turned into a time as its inverse: same GPUs and
global batch, so time is proportional to 1 / rate).

Per group:
- the measured and the predicted order (fastest first);
- pairwise concordance over the pairs measured at least `APART` (8%) apart: the predicted times
  order the pair the same way (a predicted tie, within `EQUAL`, counts as discordant);
- blind pairs: predicted equal (within `EQUAL`, 1%) but measured at least `BLIND` (4%) apart, with the
  knob(s) that differ between the two configurations;
- top-1: the measured fastest is the predicted fastest among the configurations that ran;
- OOM / fit: a configuration measured `status: OOM` should be predicted not to fit, the others to fit.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..fileio import read_json_file
from . import filled_notes
from . import Case, completed_plan, with_catalog
from ..cost import evaluate
from .modern import modern_row_to_case
from ..tables import table_text

APART = 0.08  # pairs measured at least this far apart (relative) must be ordered right
BLIND = 0.04  # pairs measured at least this far apart that the model predicts equal are reported
EQUAL = 0.01  # predicted within this (relative) = predicted equal
METRICS = ("step_time_s", "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu_pct")
# data-parallel facts a configuration may state (`modern.dp_knobs_of`: defaults as there)
DP_KNOB_FIELDS = ("overlap_grad_reduce", "overlap_param_gather", "reshard_after_forward", "dp_replicate")
KNOB_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "sp", "zero_stage", "fsdp", "micro_batch",
               "recompute", "schedule") + DP_KNOB_FIELDS


def is_ablations_doc(doc: Any) -> bool:
    """Whether a parsed JSON document has the ablations shape (a list of groups with `configs`)."""
    groups = doc.get("groups") if isinstance(doc, dict) else doc
    return isinstance(groups, list) and bool(groups) and all(
        isinstance(g, dict) and isinstance(g.get("configs"), list) for g in groups)


def is_ablations_file(path: str | os.PathLike[str]) -> bool:
    """Whether a JSON file has the ablations shape (cheap check; any read error -> False)."""
    try:  # the bounded reader: a FIFO, /dev/zero or a 20 GiB file is refused before a read
        return is_ablations_doc(read_json_file(path, what="ablations file"))
    except InputError:
        return False


def load_groups(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    p = Path(path)
    src = str(p)
    if not p.exists() and not p.is_symlink():
        raise InputError("ablations file not found", source=src)
    doc = read_json_file(p, what="ablations file")  # bounded reader, strict parser (duplicates, depth)
    if not is_ablations_doc(doc):
        raise InputError("expected a list of groups, each with a `configs` list", source=src)
    groups: list[dict[str, Any]] = doc["groups"] if isinstance(doc, dict) else doc  # (the shape just checked)
    for i, g in enumerate(groups):
        for k in ("gpu_count", "seq_len", "global_batch_seqs"):
            _check_count(g.get(k), f"[{i}].{k}", src, required=True)
        if not isinstance(g.get("model"), dict):
            raise InputError(f"[{i}].model: expected an object", source=src)
        for k in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "moe_experts", "moe_topk", "moe_ffn"):
            _check_count(g["model"].get(k), f"[{i}].model.{k}", src)
        for j, c in enumerate(g["configs"]):
            where = f"[{i}].configs[{j}]"
            if not isinstance(c, dict) or not isinstance(c.get("measured"), dict):
                raise InputError(f"{where}.measured: expected an object", source=src)
            for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch"):
                _check_count(c.get(k), f"{where}.{k}", src)
            meas = c["measured"]
            status = str(meas.get("status", "ok"))
            if status.upper() not in ("OK", "OOM"):
                raise InputError(f"{where}.measured.status: expected 'OOM' (or absent), got {status!r}", source=src)
            for k in METRICS:
                v = meas.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e15):
                    raise InputError(f"{where}.measured.{k}: expected a positive number, got {v!r}", source=src)
    return groups


def _check_count(v: Any, where: str, src: str, required: bool = False) -> None:
    if v is None and not required:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 24:
        raise InputError(f"{where}: expected a positive whole number, got {v!r}", source=src)


# ---------------------------------------------------------------------------------------
# Group + configuration -> a modern-style row
# ---------------------------------------------------------------------------------------


# Facts a group states once for every configuration; a configuration's own value of the same field wins.
GROUP_DEFAULTS = ("precision", "precision_recipe", "recompute", "sp", "flash_attention", "launch_blocking",
                  "softmax_fusion", "topology", "tp_comm_overlap", "ep_overlap", "main_grads", "fp8_params",
                  "cuda_graphs", "cuda_graph_scope", "moe_dispatcher", "moe_capacity_factor", "local_batch", "framework",
                  "bf16_modules", "bf16_layers_at_start", "bf16_layers_at_end", "mean_document_tokens",
                  "attention_mask_in_batch", "cross_entropy_fusion", "defer_embedding_wgrad", "wgrad_deferral_limit",
                  "gradient_accumulation_fusion")
# Model fields a group's `model` object carries into the row (validation/README.md, "Model fields").
MODEL_FIELDS = ("layers", "hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab", "moe_experts", "moe_ffn",
                "moe_shared_experts", "first_k_dense", "hidden_act", "dropout", "tie_word_embeddings",
                "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "sliding_window", "sliding_window_layers", "expert_bias", "qk_layernorm", "mamba_layers", "mtp_layers",
                "moe_shared_ffn", "hybrid_override_pattern", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
                "mamba_n_groups", "attention_chunk_size", "chunked_attention_layers", "learned_position_embeddings")


def config_row(group: dict[str, Any], cfg: dict[str, Any], index: int) -> tuple[dict[str, Any], list[str]]:
    """A modern_runs-shaped row for one configuration of a group (measured step: a placeholder).

    Every fact is read from a field: the group's `model` object, the group's fields (GROUP_DEFAULTS) and
    the configuration's, which win; `filled` (a mapping field -> where a value the source did not print
    comes from) becomes notes. Nothing is read from a name or from free-text notes."""
    model = dict(group.get("model") or {})
    notes: list[str] = filled_notes(group)
    name = str(model.get("name") or group.get("id"))
    pp = cfg.get("pp") or 1
    if model.get("moe_experts") and not model.get("ffn"):
        model["ffn"] = model.get("moe_ffn")
    if cfg.get("layers"):  # a configuration of another depth than the group's model
        model["layers"] = cfg["layers"]
    facts: dict[str, Any] = {k: group.get(k) for k in GROUP_DEFAULTS if group.get(k) is not None}
    facts.update({k: cfg[k] for k in GROUP_DEFAULTS if cfg.get(k) is not None})
    schedule = str(cfg.get("schedule") or "").lower()
    vpp = cfg.get("vpp")
    if "interleaved" in schedule and not vpp:
        vpp = 2
        notes.append("interleaved schedule, virtual stages not stated: vpp 2 (torchtitan's interleaved default)")
    mbs = cfg.get("micro_batch")
    if mbs is None:
        dp = cfg.get("dp") or 1
        local_b = int(facts["local_batch"]) if facts.get("local_batch") else max(1, int(group["global_batch_seqs"]) // dp)
        mbs = max(1, local_b // pp)
        notes.append(f"micro_batch {mbs}: local batch {local_b}" + (f" in {pp} micro-batches (one per stage)" if pp > 1 else ""))
    gpu = str(group.get("gpu") or "")
    row = {
        "id": f"{group.get('id')}#{index}", "source": str(group.get("source") or ""), "model": name,
        "source_family": group.get("source_family"),
        **{k: model.get(k) for k in MODEL_FIELDS if k in model},
        "kv_heads": model.get("kv_heads") or model.get("heads"),
        "moe_top_k": model.get("moe_topk") or model.get("moe_top_k"),
        "gpu": gpu, "gpu_count": group.get("gpu_count"), "nvlink_domain_gpus": 8,
        "seq_len": group.get("seq_len"), "global_batch_seqs": group.get("global_batch_seqs"),
        "tp": cfg.get("tp"), "pp": cfg.get("pp"), "dp": cfg.get("dp"), "cp": cfg.get("cp"), "ep": cfg.get("ep"),
        "etp": cfg.get("etp"), "zero_stage": cfg.get("zero_stage"), "fsdp": cfg.get("fsdp"),
        **{k: cfg[k] for k in DP_KNOB_FIELDS if cfg.get(k) is not None},
        "vpp_chunks": vpp, "micro_batch": mbs,
        "step_time_s": 1.0,  # placeholder: only the order is compared
        "notes": "",
    }
    row.update({k: v for k, v in facts.items() if k not in ("recompute", "local_batch")})
    row["activation_recompute"] = cfg.get("recompute") if cfg.get("recompute") is not None else facts.get("recompute")
    return row, notes


# ---------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------


@dataclass
class ConfigResult:
    index: int
    label: str  # the configuration's notes (what the source says it is)
    knobs: dict[str, Any]
    status: str  # 'ok', 'OOM'
    measured: float | None  # the group's metric as published
    measured_time: float | None  # time-like (lower is faster), comparable within the group only
    predicted_step_s: float | None
    fits: bool | None
    plan: str = ""
    reason: str = ""  # why it was not priced
    notes: list[str] = field(default_factory=list)
    peak_gib: float | None = None  # the priced plan's peak memory per GPU


@dataclass
class Pair:
    a: int
    b: int
    measured_apart_pct: float  # slower / faster - 1, measured
    predicted_apart_pct: float  # slower / faster - 1, predicted
    concordant: bool
    knobs: list[str]  # what differs between the two configurations


@dataclass
class GroupResult:
    id: str
    source: str
    metric: str
    configs: list[ConfigResult]
    measured_order: list[int]
    predicted_order: list[int]
    pairs: list[Pair]  # every pair of configurations that ran and were priced
    top1: bool | None
    oom_agree: int
    oom_total: int

    @property
    def compared(self) -> list[Pair]:
        return [p for p in self.pairs if p.measured_apart_pct >= 100 * APART]

    @property
    def concordant(self) -> int:
        return sum(p.concordant for p in self.compared)

    @property
    def blind(self) -> list[Pair]:
        return [p for p in self.pairs if p.predicted_apart_pct < 100 * EQUAL and p.measured_apart_pct >= 100 * BLIND]


@dataclass
class AblationSummary:
    groups: int
    pairs_compared: int
    pairs_concordant: int
    concordance_pct: float
    blind_pairs: int
    top1_agree: int
    top1_groups: int
    oom_agree: int
    oom_total: int


@dataclass
class AblationReport:
    path: str
    groups: list[GroupResult]
    summary: AblationSummary

    def to_json(self) -> dict[str, Any]:
        out = []
        for g in self.groups:
            d = asdict(g)
            d.update(pairs_compared=len(g.compared), pairs_concordant=g.concordant,
                     blind_pairs=[asdict(p) for p in g.blind])
            out.append(d)
        return {"ablations_path": self.path, "summary": asdict(self.summary), "groups": out}


def _metric(configs: list[dict[str, Any]]) -> str | None:
    ran = [c["measured"] for c in configs if str(c["measured"].get("status", "ok")).upper() != "OOM"]
    for m in METRICS:
        if ran and all(isinstance(x.get(m), (int, float)) and x.get(m) > 0 for x in ran):
            return m
    return None


def _knob_diff(a: ConfigResult, b: ConfigResult) -> list[str]:
    out = [f"{k}: {a.knobs.get(k)!r} vs {b.knobs.get(k)!r}" for k in a.knobs if a.knobs.get(k) != b.knobs.get(k)]
    return out or [f"not in the fields: {a.label!r} vs {b.label!r}"]


def pairs_of(configs: list[ConfigResult]) -> list[Pair]:
    """Every pair that ran and was priced, with its measured / predicted separation."""
    ok = [c for c in configs if c.measured_time and c.predicted_step_s]
    out = []
    for i, a in enumerate(ok):
        for b in ok[i + 1:]:
            ma, mb = a.measured_time, b.measured_time
            pa, pb = a.predicted_step_s, b.predicted_step_s
            m_apart = max(ma, mb) / min(ma, mb) - 1  # type: ignore[type-var, operator]
            p_apart = max(pa, pb) / min(pa, pb) - 1  # type: ignore[type-var, operator]
            concordant = p_apart >= EQUAL and (ma < mb) == (pa < pb)  # type: ignore[operator]
            out.append(Pair(a.index, b.index, 100 * m_apart, 100 * p_apart, concordant, _knob_diff(a, b)))
    return out


def group_result(group: dict[str, Any], catalog: str | os.PathLike[str] | None = None) -> GroupResult:
    configs = group["configs"]
    metric = _metric(configs) or ""
    results: list[ConfigResult] = []
    for i, cfg in enumerate(configs):
        meas = cfg["measured"]
        status = "OOM" if str(meas.get("status", "ok")).upper() == "OOM" else "ok"
        value = meas.get(metric) if status == "ok" and metric else None
        mtime = None if value is None else (float(value) if metric == "step_time_s" else 1.0 / float(value))
        knobs = {k: cfg.get(k) for k in KNOB_FIELDS}
        row, notes = config_row(group, cfg, i)
        tp_ov, ep_ov = row.get("tp_comm_overlap"), row.get("ep_overlap")
        knobs["tp_comm_overlap"], knobs["ep_overlap"] = tp_ov, ep_ov
        res = ConfigResult(i, str(cfg.get("notes") or ""), knobs, status, value, mtime, None, None, notes=notes)
        case = modern_row_to_case(row)
        if not isinstance(case, Case):
            res.reason = case.reason
            results.append(res)
            continue
        case = with_catalog(case, catalog)
        plan = completed_plan(case)
        if tp_ov is not None or ep_ov is not None:
            upd = {}
            if tp_ov is not None:
                upd["tp_comm_overlap"] = tp_ov and plan.tp > 1 and plan.sp
            if ep_ov is not None:
                upd["ep_overlap"] = ep_ov and plan.ep > 1
            plan = plan.model_copy(update=upd)
        est = evaluate(case.problem, plan)
        res.notes += list(case.notes)
        res.plan = est.plan.short()
        if est.step_time_s > 0:
            res.predicted_step_s, res.fits, res.peak_gib = est.step_time_s, est.fits, est.peak_memory_gib
        else:  # an invalid plan is not a memory prediction: left out of OOM/fit
            res.plan = ""
            res.reason = "plan rejected by the cost model: " + "; ".join(est.reasons)
        results.append(res)
    return assemble_group(str(group.get("id")), str(group.get("source") or ""), metric, results)


def assemble_group(gid: str, source: str, metric: str, results: list[ConfigResult]) -> GroupResult:
    """Orders, pairs, top-1 and OOM/fit agreement of a group's priced configurations."""
    ran = [c for c in results if c.measured_time is not None]
    measured_order = [c.index for c in sorted(ran, key=lambda c: c.measured_time)]  # type: ignore[arg-type, return-value]
    priced = [c for c in ran if c.predicted_step_s]
    predicted_order = [c.index for c in sorted(priced, key=lambda c: c.predicted_step_s)]  # type: ignore[arg-type, return-value]
    top1 = None
    if len(priced) >= 2:
        fastest = min(priced, key=lambda c: c.measured_time)  # type: ignore[arg-type, return-value]
        fitting = [c for c in priced if c.fits] or priced
        top1 = min(fitting, key=lambda c: c.predicted_step_s).index == fastest.index  # type: ignore[arg-type, return-value]
    judged = [c for c in results if c.fits is not None]
    oom_agree = sum((c.status == "OOM") == (not c.fits) for c in judged)
    return GroupResult(gid, source, metric, results, measured_order, predicted_order, pairs_of(results), top1,
                       oom_agree, len(judged))


def summarize_ablations(groups: list[GroupResult]) -> AblationSummary:
    compared = sum(len(g.compared) for g in groups)
    conc = sum(g.concordant for g in groups)
    tops = [g.top1 for g in groups if g.top1 is not None]
    return AblationSummary(
        groups=len(groups), pairs_compared=compared, pairs_concordant=conc,
        concordance_pct=100.0 * conc / compared if compared else float("nan"),
        blind_pairs=sum(len(g.blind) for g in groups), top1_agree=sum(tops), top1_groups=len(tops),
        oom_agree=sum(g.oom_agree for g in groups), oom_total=sum(g.oom_total for g in groups))


def validate_ablations(path: str | os.PathLike[str], *, catalog: str | os.PathLike[str] | None = None) -> AblationReport:
    """Price every configuration of every group and compare the orders (see the module docstring)."""
    if catalog is not None and not Path(catalog).is_file():
        raise InputError("calibrated catalog not found", source=str(catalog))
    try:
        groups = [group_result(g, catalog) for g in load_groups(path)]
    except InputError as exc:
        raise exc.at(str(path)) from None
    return AblationReport(str(path), groups, summarize_ablations(groups))


def summary_line(s: AblationSummary) -> str:
    return (f"ablations: {s.groups} groups  concordance {s.pairs_concordant}/{s.pairs_compared} = "
            f"{s.concordance_pct:.0f}% (pairs measured >= {APART:.0%} apart)  blind pairs {s.blind_pairs} "
            f"(predicted within {EQUAL:.0%}, measured >= {BLIND:.0%} apart)  top-1 {s.top1_agree}/{s.top1_groups}  "
            f"OOM/fit {s.oom_agree}/{s.oom_total}")


def format_ablations(report: AblationReport) -> str:
    lines = [f"ablations: {report.path}",
             "per group: configurations fastest first (#index as in the file); time = the group's metric as a time "
             "(rates inverted), relative to the fastest", ""]
    for g in report.groups:
        lines.append(f"[{g.id}]  metric {g.metric or '-'}  ({g.source[:70]})")
        fastest_m = min((c.measured_time for c in g.configs if c.measured_time), default=None)
        fastest_p = min((c.predicted_step_s for c in g.configs if c.predicted_step_s), default=None)
        rows = []
        for c in sorted(g.configs, key=lambda c: (c.measured_time is None, c.measured_time or 0.0)):
            meas = "OOM" if c.status == "OOM" else (f"{c.measured_time / fastest_m:.3f}" if c.measured_time and fastest_m else "-")
            pred = f"{c.predicted_step_s / fastest_p:.3f}" if c.predicted_step_s and fastest_p else "-"
            fit = "" if c.fits is None else ("fits" if c.fits else "NO FIT")
            rows.append([f"#{c.index}", meas, pred, fit, c.plan or c.reason[:90], c.label[:60]])
        lines.append(table_text(["", ("measured", "right"), ("predicted", "right"), "memory", "plan", "label"], rows,
                                indent=2).rstrip("\n"))
        lines.append(f"  measured order {g.measured_order}  predicted order {g.predicted_order}  "
                     f"concordant {g.concordant}/{len(g.compared)}  top-1 {'-' if g.top1 is None else 'yes' if g.top1 else 'NO'}"
                     f"  OOM/fit {g.oom_agree}/{g.oom_total}")
        for p in g.blind:
            lines.append(f"  predicted equal ({p.predicted_apart_pct:.1f}%) but measured {p.measured_apart_pct:.1f}% apart: "
                         f"#{p.a} vs #{p.b}: {'; '.join(p.knobs)}")
        for p in g.compared:
            if not p.concordant and p.predicted_apart_pct >= 100 * EQUAL:
                lines.append(f"  ordered wrong: #{p.a} vs #{p.b} measured {p.measured_apart_pct:.1f}% apart, "
                             f"predicted {p.predicted_apart_pct:.1f}% the other way: {'; '.join(p.knobs)}")
        lines.append("")
    lines.append(summary_line(report.summary))
    return "\n".join(lines)

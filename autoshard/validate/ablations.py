"""Does the model ORDER plans as measured? Groups of measured configurations of one model on one
cluster (`shared/validation/ablations_dev.json`).

    from autoshard.validate.ablations import validate_ablations, format_ablations
    print(format_ablations(validate_ablations(path)))

Each configuration of a group becomes a modern-style row (the group's model, GPU, sequence length,
global batch and precision, the configuration's degrees, recompute and overlaps) converted by
`modern.modern_row_to_case` and priced by `evaluate`. Metrics differ by source (step time,
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
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..fileio import read_json_file

APART = 0.08  # pairs measured at least this far apart (relative) must be ordered right
BLIND = 0.04  # pairs measured at least this far apart that the model predicts equal are reported
EQUAL = 0.01  # predicted within this (relative) = predicted equal
METRICS = ("step_time_s", "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu_pct")
KNOB_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "sp", "zero_stage", "fsdp", "micro_batch",
               "recompute", "schedule")


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
    groups = doc.get("groups") if isinstance(doc, dict) else doc
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


def _overlap_from_notes(notes: str) -> tuple[bool | None, bool | None]:
    low = notes.lower()
    tp = None
    if re.search(r"async[- ]?tp", low):
        tp = True
    elif "vanilla tp" in low:
        tp = False
    ep = None
    m = re.search(r"ep overlap (on|off)", low)
    if m:
        ep = m.group(1) == "on"
    return tp, ep


def _bloom_fill(model: dict[str, Any], pp: int) -> tuple[dict[str, Any], list[str]]:
    """BLOOM candidates: the logbook gives NHIDDEN and the size label, not always layers or heads."""
    out, notes = dict(model), []
    h = int(out["hidden"])
    vocab = out.get("vocab") or 250880
    if not out.get("vocab"):
        notes.append("vocab 250880 (BLOOM tokenizer, '~250k' in the logbook)")
    out["vocab"] = vocab
    if not out.get("ffn"):
        out["ffn"] = 4 * h
        notes.append(f"ffn = 4 h = {4 * h} (Megatron GPT default)")
    if not out.get("layers"):
        size = re.search(r"(\d+(?:\.\d+)?)B", str(out.get("name") or ""))
        params = float(size.group(1)) * 1e9 if size else float(out.get("params_b") or 0) * 1e9
        layers = max(pp, round((params - vocab * h) / (12 * h * h) / pp) * pp)
        out["layers"] = layers
        notes.append(f"layers = {layers}: from the size label (12 L h^2 + V h), rounded to a multiple of pp={pp}")
    if not out.get("heads"):
        # The Feb-20 tables do not give NHEADS. The logbook's Feb-17 probes of the same 14400-wide
        # model ran NHEADS=32 (its 20B "Best TFLOPs" config), and 32 is what the Feb-20 micro-batch
        # sweeps show: under that month's fused-softmax check (cost.unfused_softmax_reason) 8-16
        # heads per GPU would have run micro-batch 4 fused and 2 unfused, a 7-12% step the sweeps do
        # not have; 4 heads per GPU run every micro-batch up to 8 unfused.
        heads = 32
        out["heads"] = out["kv_heads"] = heads
        notes.append(f"heads = {heads} (head dim {h // heads}: NHEADS of the logbook's Feb-17 probes; the Feb-20 tables give none)")
    return out, notes


# Clusters the groups name (in `gpu` or `interconnect`) whose network is not their GPU's default system.
NAMED_CLUSTERS = {"jean zay": "jean-zay-a100"}


def config_row(group: dict[str, Any], cfg: dict[str, Any], index: int) -> tuple[dict[str, Any], list[str]]:
    """A modern_runs-shaped row for one configuration of a group (measured step: a placeholder)."""
    model = dict(group.get("model") or {})
    notes: list[str] = []
    name = str(model.get("name") or group.get("id"))
    pp = cfg.get("pp") or 1
    if name.lower().startswith("bloom"):
        model, notes = _bloom_fill(model, pp)
    if model.get("moe_experts") and not model.get("ffn"):
        model["ffn"] = model.get("moe_ffn")
    first_k = 0
    m = re.search(r"(\d+) dense \+", str(model.get("notes") or ""))
    if m:
        first_k = int(m.group(1))
    tp_ov, ep_ov = _overlap_from_notes(str(cfg.get("notes") or ""))
    group_tp_ov, _ = _overlap_from_notes(str(group.get("precision") or ""))
    schedule = str(cfg.get("schedule") or "").lower()
    vpp = cfg.get("vpp")
    if "interleaved" in schedule and not vpp:
        vpp = 2
        notes.append("interleaved schedule, virtual stages not stated: vpp 2 (torchtitan's interleaved default)")
    mbs = cfg.get("micro_batch")
    if mbs is None:
        local = re.search(r"local batch (\d+)", str(group.get("notes") or "").lower())
        dp = cfg.get("dp") or 1
        local_b = int(local.group(1)) if local else max(1, int(group["global_batch_seqs"]) // dp)
        mbs = max(1, local_b // pp)
        notes.append(f"micro_batch {mbs}: local batch {local_b}" + (f" in {pp} micro-batches (one per stage)" if pp > 1 else ""))
    gpu = str(group.get("gpu") or "")
    src = str(group.get("source") or "")
    row = {
        "id": f"{group.get('id')}#{index}", "source": src, "model": name,
        "layers": model.get("layers"), "hidden": model.get("hidden"), "ffn": model.get("ffn"),
        "heads": model.get("heads"), "kv_heads": model.get("kv_heads") or model.get("heads"),
        "head_dim": model.get("head_dim"), "vocab": model.get("vocab"),
        "moe_experts": model.get("moe_experts"), "moe_top_k": model.get("moe_topk") or model.get("moe_top_k"),
        "moe_ffn": model.get("moe_ffn"), "moe_shared_experts": model.get("moe_shared_experts"),
        "first_k_dense": first_k, "gpu": gpu, "gpu_count": group.get("gpu_count"), "nvlink_domain_gpus": 8,
        "precision": group.get("precision"), "seq_len": group.get("seq_len"),
        "global_batch_seqs": group.get("global_batch_seqs"), "tp": cfg.get("tp"), "pp": cfg.get("pp"),
        "dp": cfg.get("dp"), "cp": cfg.get("cp"), "ep": cfg.get("ep"), "etp": cfg.get("etp"),
        "sp": cfg.get("sp"), "zero_stage": cfg.get("zero_stage"), "fsdp": cfg.get("fsdp"),
        "vpp_chunks": vpp, "micro_batch": mbs, "activation_recompute": cfg.get("recompute"),
        "step_time_s": 1.0,  # placeholder: only the order is compared
        "notes": "",
    }
    where = f"{gpu} {group.get('interconnect') or ''}".lower()
    for site, topo in NAMED_CLUSTERS.items():
        if site in where:
            row["topology"] = topo
            notes.append(f"topology {topo} ({site.title()}: its network, not the {gpu.split()[0]}'s default system)")
            break
    if name.lower().startswith("bloom"):
        row["flash_attention"] = False  # 2022 Megatron-DeepSpeed: fused softmax, no FlashAttention
        row["sp"] = False  # sequence parallelism reached Megatron-LM later in 2022 (Korthikanti et al.)
        # The logbook's benchmarks from 02-17 on ran with CUDA_LAUNCH_BLOCKING=1 ("dealing with JZ
        # hanging on the large model": asynchronous launches always hung at 320 GPUs).
        row["launch_blocking"] = True
        notes.append("CUDA_LAUNCH_BLOCKING=1 (the logbook's workaround for NCCL hangs at 320+ GPUs)")
        # Its Megatron-DeepSpeed of Feb 2022 (before 1cb76a64, 2022-03-06) checked the fused softmax
        # kernel with swapped arguments (cost.unfused_softmax_reason).
        row["softmax_fusion"] = "bigscience-2022"
        if row["activation_recompute"] is None:
            # Every tr11 launcher passes --checkpoint-activations (tr11-176B-ml.slurm:122,
            # setup-test-n2.slurm:123): Megatron-DeepSpeed's full recompute of every layer. The
            # logbook's memory column agrees: 30-39 GB at micro-batch 1, growing ~6 GB per extra
            # sequence, where storing the activations would need the 80 GB.
            row["activation_recompute"] = "full"
            notes.append("recompute full: BLOOM's tr11 launchers pass --checkpoint-activations")
    if "torchtitan" in src.lower():
        row["other_metrics"] = {"local_batch_size": mbs * pp}
    row["_tp_overlap"] = tp_ov if tp_ov is not None else group_tp_ov
    row["_ep_overlap"] = ep_ov
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
    from ..cost import evaluate  # noqa: PLC0415
    from . import Case, completed_plan, with_catalog  # noqa: PLC0415
    from .modern import modern_row_to_case  # noqa: PLC0415

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
        tp_ov, ep_ov = row.pop("_tp_overlap"), row.pop("_ep_overlap")
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
    groups = [group_result(g, catalog) for g in load_groups(path)]
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
        for c in sorted(g.configs, key=lambda c: (c.measured_time is None, c.measured_time or 0.0)):
            meas = "OOM" if c.status == "OOM" else (f"{c.measured_time / fastest_m:6.3f}" if c.measured_time and fastest_m else "  -   ")
            pred = f"{c.predicted_step_s / fastest_p:6.3f}" if c.predicted_step_s and fastest_p else "  -   "
            fit = "" if c.fits is None else ("fits" if c.fits else "NO FIT")
            lines.append(f"  #{c.index} meas {meas:>6}  pred {pred:>6} {fit:<6}  {c.plan or c.reason[:90]}  | {c.label[:60]}")
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

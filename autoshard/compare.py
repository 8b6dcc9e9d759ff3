"""Why one plan is faster than another: both evaluated side by side, the step-time difference
decomposed term by term (the keys of `Estimate.time_breakdown_s`: compute, recompute, each
communication, the pipeline bubble, the data-parallel tail, the optimizer step) and the peak
memory by component (`Estimate.memory_breakdown_gib`), one sentence per term saying why.

    from autoshard.compare import compare
    c = compare(problem, mine, chosen)        # two Plans
    print(comparison_text(c))

The time terms are the critical path `evaluate` itself reports (the slowest rank's steady state
over every micro-batch, the bubble, the slowest rank's data-parallel tail), so they add up to
each plan's step time and their differences add up to the step-time difference; any remainder
(round-off) is reported as its own term, never hidden.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from .cost import Estimate, evaluate
from .errors import InputError
from .spec import Plan, Problem
from .tables import table_text
import yaml
from .loader import load_plan

# Printed names of the breakdown keys (unknown keys are printed as they are).
TIME_NAMES = {
    "compute": "compute", "recompute": "recompute", "tp_comm": "tensor-parallel communication",
    "cp_comm": "context-parallel communication", "ep_comm": "expert all-to-all", "pp_comm": "pipeline sends",
    "zero3_comm": "ZeRO-3 parameter gathers", "host": "host time", "offload": "host-memory offload traffic",
    "pipeline_bubble": "pipeline bubble",
    "dp_comm": "data-parallel gradient traffic", "optimizer": "optimizer step",
}
MEMORY_NAMES = {
    "weights": "weights", "gradients": "gradients", "optimizer_states": "optimizer states",
    "activations": "activations", "working": "working set", "zero3_gathered": "ZeRO-3 gathered weights",
}


class Term(BaseModel):
    """One term of the decomposition: its value in each plan, B - A, and why."""

    model_config = ConfigDict(frozen=True)
    key: str
    a: float
    b: float
    delta: float  # b - a
    why: str


class Comparison(BaseModel):
    """Plan A against plan B (B - A: positive means B pays more)."""

    model_config = ConfigDict(frozen=True)
    label_a: str
    label_b: str
    a: Estimate
    b: Estimate
    step_delta_s: float  # b.step_time_s - a.step_time_s
    time_terms_s: list[Term]  # sums to step_delta_s
    memory_terms_gib: list[Term]  # of each plan's fullest stage; sums to the peak-memory difference
    summary: str


def _recomputed(est: Estimate) -> int:
    rc = est.plan.recompute
    if isinstance(rc, str):  # DualPipe keeps every stage twice (one copy per direction): the model's layers
        return 0 if rc == "none" else sum(s.layers for s in est.stages) // (2 if est.plan.schedule == "dualpipe" else 1)
    return sum(1 for r in rc if r != "none")


def _slowest(est: Estimate) -> Any:
    return max(est.stages, key=lambda s: s.forward_s + s.backward_s) if est.stages else None


def _pipe(p: Plan) -> str:
    if p.pp == 1:
        return "no pipeline"
    v = f"x{p.vpp} virtual" if p.vpp > 1 else ""
    return f"PP{p.pp}{v} {p.schedule}"


def _time_why(key: str, a: Estimate, b: Estimate, la: str, lb: str) -> str:
    pa, pb = a.plan, b.plan
    sa, sb = _slowest(a), _slowest(b)
    va, vb = a.time_breakdown_s.get(key, 0.0), b.time_breakdown_s.get(key, 0.0)
    more = lb if vb > va else la
    if key == "compute":
        def work(e: Estimate, s: Any) -> str:
            p = e.plan
            if p.schedule == "dualpipe":  # each micro-batch passes one of the rank's two mirrored stages
                return (f"{s.layers if s else '?'} layers (two mirrored stages) x {e.num_microbatches // 2} "
                        f"micro-batches of {p.micro_batch_size} at TP{p.tp}{f' CP{p.cp}' if p.cp > 1 else ''}")
            return (f"{s.layers if s else '?'} layers x {e.num_microbatches} micro-batches of {p.micro_batch_size} "
                    f"at TP{p.tp}{f' CP{p.cp}' if p.cp > 1 else ''}")
        return (f"the slowest pipeline rank computes {work(a, sa)} ({la}) vs {work(b, sb)} ({lb}); "
                "fewer layers or tokens per GPU mean less time, smaller per-GPU matrices run less efficiently")
    if key == "recompute":
        return (f"{_recomputed(a)} layers recomputed ({la}) vs {_recomputed(b)} ({lb}): recompute re-runs the "
                "forward pass of those layers in the backward, traded for activation memory")
    if key == "tp_comm":
        def tp(p: Plan) -> str:
            if p.tp == 1:
                return "TP1 (none)"
            kind = "reduce-scatter + all-gather (sequence parallel)" if p.sp else "all-reduce"
            return f"TP{p.tp} {kind}{', overlapped with GEMMs' if getattr(p, 'tp_comm_overlap', False) else ''}"
        return (f"{tp(pa)} ({la}) vs {tp(pb)} ({lb}): every layer's tensor-parallel collectives sit on the "
                f"critical path, {max(va, vb):.2f} s exposed in {more}")
    if key == "cp_comm":
        return (f"CP{pa.cp} ({la}) vs CP{pb.cp} ({lb}): the context-parallel KV exchange is overlapped with "
                f"attention; what attention cannot hide is exposed ({max(va, vb):.2f} s in {more})")
    if key == "ep_comm":
        def ep(p: Plan) -> str:
            d = p.moe_dispatcher
            return f"EP{p.ep}" + (f" {d}" if d else "") + (" overlapped" if p.ep_overlap else "")
        return (f"{ep(pa)} ({la}) vs {ep(pb)} ({lb}): the expert all-to-all dispatch and combine of every MoE "
                f"layer ({max(va, vb):.2f} s in {more}); DeepEP / HybridEP send a token once per remote node "
                "and once per peer GPU hosting its experts inside a domain "
                "(node-limited routing caps those nodes), Megatron's EP overlap and DualPipe's paired chunks hide "
                "it under another micro-batch's compute (DualPipe's warm-up and cool-down chunks, run alone, pay it)")
    if key == "pp_comm":
        return (f"{_pipe(pa)} ({la}) vs {_pipe(pb)} ({lb}): activations sent between pipeline stages, once per "
                "micro-batch and virtual stage (DualPipe: its sends and receives waited for before each chunk, "
                "until the neighbour posts them)")
    if key == "zero3_comm":
        return (f"ZeRO-{pa.zero_stage} ({la}) vs ZeRO-{pb.zero_stage} ({lb}): ZeRO-3 gathers every layer's weights "
                "before its forward and backward; what compute cannot hide is exposed")
    if key == "pipeline_bubble":
        return (f"{_pipe(pa)} with {a.num_microbatches} micro-batches ({la}) vs {_pipe(pb)} with "
                f"{b.num_microbatches} ({lb}): warm-up and cool-down idle the ranks, less with more micro-batches, "
                "virtual stages or a zero-bubble schedule")
    if key == "dp_comm":
        return (f"DP{pa.dp} ZeRO-{pa.zero_stage} ({la}) vs DP{pb.dp} ZeRO-{pb.zero_stage} ({lb}): gradient "
                "reduction (and ZeRO's parameter gathers) not hidden under the last backward")
    if key == "optimizer":
        return (f"ZeRO-{pa.zero_stage} over DP{pa.dp} ({la}) vs ZeRO-{pb.zero_stage} over DP{pb.dp} ({lb}): the "
                "optimizer step updates the parameters each GPU holds (sharded by ZeRO >= 1)")
    if key == "host":
        def host(p: Plan) -> str:
            return f"EP{p.ep}" + (", full-iteration CUDA graphs" if p.cuda_graphs else "") + (
                f", per-layer CUDA graphs of {'+'.join(p.cuda_graph_scope)}" if p.cuda_graph_scope else "")
        return (f"{host(pa)} ({la}) vs {host(pb)} ({lb}): host-side time of dropless MoE layers (the dispatcher's "
                "sync, the grouped MLP's work per local expert, so fewer with more EP), recompute-module wrappers "
                f"and blocking launches; CUDA graphs replay without it ({max(va, vb):.2f} s in {more})")
    if key == "rounding":
        return "round-off of the two breakdowns (they are the evaluator's own terms)"
    return f"{TIME_NAMES.get(key, key)}: {va:.3f} s ({la}) vs {vb:.3f} s ({lb})"


def _memory_why(key: str, a: Estimate, b: Estimate, la: str, lb: str) -> str:
    pa, pb = a.plan, b.plan

    def shard(p: Plan) -> str:
        return f"1/(TP{p.tp} x PP{p.pp}){f' (experts also /EP{p.ep})' if p.ep > 1 else ''}"

    def zero_dp(p: Plan) -> str:
        return f"ZeRO-{p.zero_stage} DP{p.dp}"

    if key == "weights":
        return (f"each GPU holds {shard(pa)} of the weights ({la}) vs {shard(pb)} ({lb})"
                f"{', sharded again by ZeRO-3' if 3 in (pa.zero_stage, pb.zero_stage) else ''}")
    if key == "gradients":
        return (f"gradients follow the weights' sharding, and ZeRO-2/3 shard them over data parallelism "
                f"({zero_dp(pa)} vs {zero_dp(pb)})")
    if key == "optimizer_states":
        return (f"optimizer states follow the weights' sharding, and ZeRO >= 1 shards them over data "
                f"parallelism ({zero_dp(pa)} vs {zero_dp(pb)})")
    if key == "activations":
        sa, sb = max(a.stages, key=lambda s: s.peak_memory_gib), max(b.stages, key=lambda s: s.peak_memory_gib)
        return (f"the fullest stage keeps {sa.inflight_microbatches:g} micro-batches of {sa.layers} layers in flight "
                f"({la}) vs {sb.inflight_microbatches:g} of {sb.layers} ({lb}); TP with sequence parallelism and CP "
                f"divide each layer's activations, recompute drops them ({_recomputed(a)} vs {_recomputed(b)} "
                "layers recomputed)")
    if key == "working":
        return "the largest backward working set (or the last stage's logits)"
    if key == "zero3_gathered":
        return "ZeRO-3 keeps one layer's gathered weights (forward and backward prefetch)"
    return MEMORY_NAMES.get(key, key)


def _terms(da: dict[str, float], db: dict[str, float], why: Callable[[str], str]) -> list[Term]:
    """One Term per key of either breakdown (A's keys first, in order): both values, B - A, and why."""
    return [Term(key=k, a=da.get(k, 0.0), b=db.get(k, 0.0), delta=db.get(k, 0.0) - da.get(k, 0.0), why=why(k))
            for k in dict.fromkeys([*da, *db])]


def compare(problem: Problem, a: Plan, b: Plan, label_a: str = "your plan", label_b: str = "chosen plan") -> Comparison:
    """Plan `a` against plan `b` on `problem`, both with `evaluate`. An invalid plan (degrees that
    do not divide, an unknown layout) is InputError naming its reasons; a plan that does not fit
    in HBM is compared all the same (its memory terms say by how much)."""
    ea, eb = evaluate(problem, a), evaluate(problem, b)
    for label, e in ((label_a, ea), (label_b, eb)):
        if not e.time_breakdown_s:
            raise InputError(f"{label} is invalid: {'; '.join(e.reasons)}", field="--plan")
    terms = _terms(ea.time_breakdown_s, eb.time_breakdown_s, lambda k: _time_why(k, ea, eb, label_a, label_b))
    step_delta = eb.step_time_s - ea.step_time_s
    rest = step_delta - sum(t.delta for t in terms)
    if abs(rest) > 1e-9 * max(ea.step_time_s, eb.step_time_s):
        terms.append(Term(key="rounding", a=ea.step_time_s - sum(ea.time_breakdown_s.values()),
                          b=eb.step_time_s - sum(eb.time_breakdown_s.values()), delta=rest,
                          why=_time_why("rounding", ea, eb, label_a, label_b)))
    terms.sort(key=lambda t: -abs(t.delta))
    mterms = _terms(ea.memory_breakdown_gib, eb.memory_breakdown_gib,
                    lambda k: _memory_why(k, ea, eb, label_a, label_b))
    mterms.sort(key=lambda t: -abs(t.delta))
    faster, slower = (label_b, label_a) if step_delta < 0 else (label_a, label_b)
    sign = -1.0 if step_delta < 0 else 1.0  # deltas as what the slower plan pays more
    pays = [t for t in terms if sign * t.delta >= 0.01 * abs(step_delta)] if step_delta else []
    saves = [t for t in terms if -sign * t.delta >= 0.01 * abs(step_delta)] if step_delta else []
    if step_delta == 0:
        summary = f"{label_a} and {label_b} take the same step time ({ea.step_time_s:.3f} s)"
    else:
        summary = (f"{faster} is {100 * abs(step_delta) / max(ea.step_time_s, eb.step_time_s):.1f}% faster "
                   f"({min(ea.step_time_s, eb.step_time_s):.3f} vs {max(ea.step_time_s, eb.step_time_s):.3f} s/step); "
                   f"{slower} pays more for "
                   + ", ".join(f"{TIME_NAMES.get(t.key, t.key)} (+{sign * t.delta:.3f} s)" for t in pays[:3]))
        if saves:
            summary += " and less for " + ", ".join(f"{TIME_NAMES.get(t.key, t.key)} ({sign * t.delta:.3f} s)"
                                                    for t in saves[:2])
    if not ea.fits or not eb.fits:
        summary += "; " + "; ".join(f"{lab} does not fit ({e.reasons[0]})"
                                    for lab, e in ((label_a, ea), (label_b, eb)) if not e.fits)
    summary = summary[:1].upper() + summary[1:]
    return Comparison(label_a=label_a, label_b=label_b, a=ea, b=eb, step_delta_s=step_delta, time_terms_s=terms,
                      memory_terms_gib=mterms, summary=summary)


def comparison_text(c: Comparison) -> str:
    """A side-by-side table of both plans, the terms by size of their difference, one line each
    (terms both plans price at zero, as printed, are left out)."""
    a, b = c.a, c.b
    plans: list[str | tuple[str, str]] = ["", "plan", ("s/step", "right"), ("MFU", "right"), ("peak GiB", "right"), ""]
    lines = [table_text(plans, [[label, e.plan.short(), f"{e.step_time_s:.3f}", f"{e.mfu:.1%}",
                                 f"{e.peak_memory_gib:.1f}", "" if e.fits else "does not fit"]
                                for label, e in ((c.label_a, a), (c.label_b, b))]).rstrip("\n"),
             "", c.summary, "",
             f"step time, s ({c.label_b} - {c.label_a} = {c.step_delta_s:+.3f} s):"]
    head: list[str | tuple[str, str]] = ["term", (c.label_a, "right"), (c.label_b, "right"), ("diff", "right"), "why"]
    lines.append(table_text(head, [[TIME_NAMES.get(t.key, t.key), f"{t.a:.3f}", f"{t.b:.3f}", f"{t.delta:+.3f}", t.why]
                                   for t in c.time_terms_s if f"{t.a:.3f}" != "0.000" or f"{t.b:.3f}" != "0.000"],
                            indent=2).rstrip("\n"))
    lines += ["", f"peak memory of the fullest stage, GiB ({c.label_b} - {c.label_a} = "
                  f"{b.peak_memory_gib - a.peak_memory_gib:+.1f} GiB):"]
    lines.append(table_text(head, [[MEMORY_NAMES.get(t.key, t.key), f"{t.a:.2f}", f"{t.b:.2f}", f"{t.delta:+.2f}", t.why]
                                   for t in c.memory_terms_gib if f"{t.a:.2f}" != "0.00" or f"{t.b:.2f}" != "0.00"],
                            indent=2).rstrip("\n"))
    return "\n".join(lines) + "\n"


_INLINE = re.compile(r"\s*[a-z_]+\s*=\s*[^,=]+(\s*,\s*[a-z_]+\s*=\s*[^,=]+)*\s*")


def plan_argument(text: str) -> Plan:
    """`--plan` value: a plan file (YAML/JSON, a problem file with `plan:`, a solution JSON) or
    inline `knob=value` pairs (`tp=8,pp=4,zero_stage=1,sequence_parallel=true`)."""
    if not Path(text).exists() and _INLINE.fullmatch(text):
        doc: dict[str, Any] = {}
        for kv in text.split(","):
            k, v = (x.strip() for x in kv.split("=", 1))
            if k in doc:  # as YAML and JSON plan files refuse a key given twice, not keep the last
                raise InputError(f"duplicate key {k!r} ({k}={doc[k]!r} and {k}={v}): give each knob once",
                                 source="--plan", field=k)
            doc[k] = yaml.safe_load(v)
        try:
            return load_plan(doc)
        except InputError as exc:
            raise InputError(exc.message, source="--plan", field=exc.field) from None
    return load_plan(text)

"""`candidates` enumerates the configurations as numpy columns over the grids of degrees, in exactly
the order the nested loops it replaces gave (the solver breaks ties by index), with the same rows, the
same `Config` per index and the same bound arrays (`bounds._arrays`, `_twins`). The reference is the
former implementation, copied below verbatim: one Python tuple per configuration."""

from itertools import product

import numpy as np
import pytest

from autoshard import load_problem
from autoshard.errors import InputError
from autoshard.cost import (
    Config,
    Context,
    config_reasons,
    context,
    ep_overlap_allowed,
    ep_overlap_blocked,
    pipeline_zero_refused,
    with_modes,
)
from autoshard.layouts import search_modes
from autoshard.solver.bounds import _FIELDS, _SCHEDULES, _arrays, _twins
from autoshard.solver.candidates import (
    Candidates,
    CandidateRow,
    _space,
    candidates,
    dp_knob_fits,
    planned_cp_comm,
    planned_dispatcher,
    planned_dp_knobs,
)
from autoshard.spec import Plan, Problem


def reference_candidates(problem: Problem, ctx: Context, opt_offload: bool = False) -> tuple[list, tuple]:
    """(rows, (dispatcher, cp_comm, opt_offload, reshard, replicate)): `candidates` as it was, nested
    loops appending one tuple per configuration (copied verbatim from autoshard/solver/candidates.py at
    9321acc, only its returns changed)."""
    sp_ = _space(problem, ctx)
    if opt_offload:
        sp_["zero_stage"] = [z for z in sp_["zero_stage"] if z in ctx.framework.optimizer_offload_zero_stages]
        if not sp_["zero_stage"]:
            return [], (None, "p2p", True, None, 1)
    n = problem.cluster.num_gpus
    gbs = problem.training.global_batch_size
    rows: list[CandidateRow] = []
    dispatcher = planned_dispatcher(problem, ctx, sp_["moe_dispatcher"])
    cp_comm = planned_cp_comm(problem, ctx)
    reshard, replicate = planned_dp_knobs(problem, ctx)
    # The validity rules depend on the micro-batch only through the batch divisibility checked
    # here (dp x mbs divides the batch; interleaving: pp divides the micro-batches): checked once
    # per set of the other degrees and schedule.
    probed: dict[tuple, str | None] = {}
    # ZeRO stages the launcher refuses beside a pipeline (`cost.launch_reasons`'s rule)
    refused_zero = {z for z in sp_["zero_stage"] if pipeline_zero_refused(ctx.framework, 2, z)}

    def probe_of(key: tuple, zero: int, dp_: int | None = None, mbs_: int = 1) -> Plan:
        tp_, cp_, pp_, ep_, etp_, sched_, vpp_ = key
        return Plan(tp=tp_, cp=cp_, ep=ep_, pp=pp_, dp=dp_ if dp_ is not None else n // (tp_ * cp_ * pp_), vpp=vpp_,
                    micro_batch_size=mbs_, schedule=sched_, etp=etp_, zero_stage=zero,
                    cp_comm_type=cp_comm if cp_ > 1 else "p2p", sequence_parallel=False)
    L = problem.model.num_hidden_layers
    zero_sp = [(zero, sp) for zero, sp in product(sp_["zero_stage"], sp_["sequence_parallel"])]
    # Where the framework refuses the EP overlap beside a recompute mode the search plans (Megatron:
    # full, the moe module), a configuration that could run it is also planned with it off
    # (`ep_overlap` False): with it (None, where it pays) its layers may not use those modes.
    fw = ctx.framework
    overlap_twin = problem.model.is_moe and fw.ep_overlap and ep_overlap_blocked(ctx, search_modes(problem, ctx))
    sp_choice = True in sp_["sequence_parallel"]
    scheds = [(sched, vpp) for sched, vpp in product(sp_["schedule"], sp_["vpp"])
              if sched != "dualpipev" and (vpp > 1) == (sched == "interleaved")]
    for tp, cp, pp in product(sp_["tp"], sp_["cp"], sp_["pp"]):
        if n % (tp * cp * pp):
            continue
        dp = n // (tp * cp * pp)
        if dp not in sp_["dp"]:
            continue
        for ep, mbs, etp in product(sp_["ep"], sp_["micro_batch_size"], sp_["etp"]):
            if gbs % (dp * mbs):
                continue
            if etp is not None and etp == tp and None in sp_["etp"]:
                continue  # (etp = tp beside None: the same plan; the loops before this round kept it twice)
            etp = None if etp == tp else etp
            if etp is not None and tp == 1:
                continue  # etp = 1 = tp: the same plan as etp None
            mb = gbs // (dp * mbs)
            # ZeRO stages are all the same plan where there is nothing to shard.
            single = dp * cp == 1 and 0 in sp_["zero_stage"] and tp * cp * dp // ((etp or tp) * ep) == 1
            for sched, vpp in scheds:
                if pp * vpp > L:
                    continue  # embedding / loss pipeline slots and DualPipeV: evaluated, not searched
                if pp == 1 and sched != "1f1b" or sched == "interleaved" and mb % pp:
                    continue
                key = (tp, cp, pp, ep, etp, sched, vpp)
                if key not in probed:  # (the rules do not depend on the ZeRO stage, nor on SP but below)
                    probe = probe_of(key, sp_["zero_stage"][0], dp, mbs)
                    probed[key] = None if config_reasons(problem, probe)[1] else probe.placement
                placement = probed[key]
                if placement is None:
                    continue
                for zero, sp in zero_sp:
                    if pp > 1 and zero in refused_zero:  # (its launcher refuses it beside a pipeline)
                        continue
                    if tp == 1 and not sp and sp_choice:
                        continue  # sp is meaningless at tp=1: keep one of the two
                    if single and zero > 0:
                        continue
                    if sp and tp > 1 and cp > 1 and ctx.framework.cp_excludes_sp:
                        continue  # (DeepSpeed-Ulysses beside Megatron's SP: config_reasons)
                    if not dp_knob_fits(ctx, zero, dp, cp, max(1, tp * cp * dp // ((etp or tp) * ep)), reshard,
                                        replicate):
                        continue
                    row = (tp, cp, ep, pp, dp, vpp, sp and tp > 1, zero, mbs, sched, placement, etp)
                    rows.append((*row, None))
                    if overlap_twin and ep_overlap_allowed(ep, pp, vpp, mb):
                        rows.append((*row, False))  # right after its twin: the numpy bound groups read the first
    return rows, (dispatcher, cp_comm, opt_offload, reshard, replicate)


def reference_config(row: CandidateRow, knobs: tuple) -> Config:
    """A row as `Candidates.__getitem__` built it from its rows (at 9321acc)."""
    dispatcher, cp_comm, opt_offload, reshard, replicate = knobs
    return Config(*row[:12], ep_overlap=row[12], dispatcher=dispatcher, cp_comm=cp_comm if row[1] > 1 else "p2p",
                  opt_offload=opt_offload, reshard=reshard if row[7] == 3 else None, dp_replicate=replicate)


def reference_arrays(rows: list[CandidateRow]) -> tuple[np.ndarray, np.ndarray]:
    """`bounds._arrays` as it read the rows (at 9321acc): one object array, then per field."""
    if not rows:
        return np.zeros((0, 11)), np.zeros(0, dtype=bool)
    o = np.array(rows, dtype=object)
    col = {f: o[:, i] for i, f in enumerate(Candidates.ROW)}
    etp = col["etp"]
    col["etp"] = np.where(etp == None, -1, etp)  # noqa: E711
    sched = np.array([_SCHEDULES[x] for x in col["schedule"]], dtype=np.float64)
    fields = np.column_stack([col[f].astype(np.float64) for f in _FIELDS] + [sched])
    return fields, col["ep_overlap"] == False  # noqa: E712


def reference_twins(rows: list[CandidateRow]) -> np.ndarray:
    """Each row's twin with the EP overlap off (the next row: the same fields, ep_overlap None then False)."""
    return np.array([i + 1 if i + 1 < len(rows) and r[12] is None and rows[i + 1][12] is False
                     and rows[i + 1][:12] == r[:12] else -1 for i, r in enumerate(rows)], dtype=np.int64)


def prepared(doc: dict) -> tuple[Problem, Context]:
    p = load_problem(doc)
    ctx = context(p)
    return p, with_modes(ctx, search_modes(p, ctx))  # (as the solver's `_solve_with`)


def _doc(model: object, gpus: int, gbs: int, framework: str = "megatron", search: dict | None = None,
         seq: int = 4096) -> dict:
    doc = {"model": model, "training": {"seq_len": seq, "global_batch_size": gbs},
           "cluster": {"gpu": "h100-sxm", "num_gpus": gpus}, "framework": framework}
    return {**doc, "search": search} if search else doc


SMALL_MOE = {"name": "moe", "num_hidden_layers": 12, "hidden_size": 4096, "intermediate_size": 16384,
             "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "num_experts": 16,
             "num_experts_per_tok": 2, "moe_intermediate_size": 4096, "first_k_dense_replace": 3}

CASES = {
    "dense": (_doc("llama3-8b", 64, 512), False),
    "dense, 1,024 GPUs": (_doc("llama3-70b", 1024, 1024, seq=8192), False),
    "moe megatron": (_doc("mixtral-8x7b", 64, 512), False),
    "moe megatron, small": (_doc(SMALL_MOE, 128, 256), False),
    "deepspeed": (_doc("llama3-70b", 64, 256, "deepspeed"), False),
    "deepspeed, hierarchical": (_doc("llama3-8b", 128, 512, "deepspeed",
                                     {"dp_replicate": 2, "reshard_after_forward": 4}), False),
    "torchtitan moe": (_doc(SMALL_MOE, 64, 256, "torchtitan"), False),
    "restricted": (_doc("mixtral-8x7b", 64, 512, search={"tp": [4, 2], "zero_stage": [1],
                                                          "micro_batch_size": [2, 1]}), False),
    "offload": (_doc("llama3-8b", 64, 512), True),
    "offload, deepspeed": (_doc("llama3-70b", 64, 256, "deepspeed"), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_candidates_match_the_nested_loops(case):
    doc, offload = CASES[case]
    p, ctx = prepared(doc)
    rows, knobs = reference_candidates(p, ctx, offload)
    got = candidates(p, ctx, opt_offload=offload)
    assert rows, case  # (every case has a space)
    assert got.rows == rows  # the same configurations, in the same order
    assert len(set(rows)) == len(rows)  # each once (etp = tp beside None was enumerated twice before)
    assert [tuple(map(type, r)) for r in got.rows] == [tuple(map(type, r)) for r in rows]  # (bool stays bool)
    assert len(got) == len(rows)
    assert (got.dispatcher, got.cp_comm, got.opt_offload, got.reshard, got.dp_replicate) == knobs
    step = max(1, len(rows) // 300)
    for i in [*range(0, len(rows), step), len(rows) - 1, -1]:
        want = reference_config(rows[i], knobs)
        assert got[i] == want and hash(got[i]) == hash(want)
        assert {k: type(v) for k, v in vars(got[i]).items()} == {k: type(v) for k, v in vars(want).items()}
    assert got[2:9:3] == [reference_config(r, knobs) for r in rows[2:9:3]]
    fields, off = _arrays(got)
    ref_fields, ref_off = reference_arrays(rows)
    assert fields.dtype == np.float64 and np.array_equal(fields, ref_fields) and np.array_equal(off, ref_off)
    assert np.array_equal(_twins(got), reference_twins(rows))


def test_the_cases_cover_what_the_loops_skip():
    # (the cases above reach each rule: twins with the EP overlap off, ZeRO stages refused beside
    # pipelines, the hierarchical-sharding knobs, the restricted lists in their own order, offload)
    rows = {case: reference_candidates(*prepared(doc), offload)[0] for case, (doc, offload) in CASES.items()}
    assert any(r[12] is False for r in rows["moe megatron"])
    assert any(r[12] is False for r in rows["moe megatron, small"])
    assert not any(r[12] is False for r in rows["deepspeed"] + rows["dense"])
    assert any(r[7] >= 2 and r[3] > 1 for r in rows["moe megatron"])
    assert not any(r[7] >= 2 and r[3] > 1 for r in rows["deepspeed"])
    assert {r[7] for r in rows["offload, deepspeed"]} <= {1, 2, 3}
    assert [r[0] for r in rows["restricted"]][:1] == [4] and {r[7] for r in rows["restricted"]} == {1}
    assert {r[8] for r in rows["restricted"]} == {1, 2}
    assert any(r[11] is not None for r in rows["moe megatron"])  # (etp folded: 1 beside tp > 1)


def test_an_empty_space():
    # No ZeRO stage the framework offloads with: no candidates, and they read as empty everywhere.
    p, ctx = prepared(_doc("llama3-8b", 64, 512, search={"zero_stage": [3]}))
    got = candidates(p, ctx, opt_offload=True)
    ref, knobs = reference_candidates(p, ctx, True)
    assert ref == [] and got.rows == [] and len(got) == 0 and not got
    assert _arrays(got)[0].shape == (0, 11) and len(_twins(got)) == 0
    with pytest.raises(IndexError):
        got[0]


def test_a_restricted_zero_stage_keeps_the_stages_the_framework_runs():
    """torchtitan runs ZeRO stages 0 and 3 (FSDP2): `search.zero_stage: [1, 3]` plans the ZeRO-3 configurations
    `[3]` alone gives (the launch rules are probed with the first stage: one the framework refuses had
    refused every degree set, "no combination of degrees ... divides"), and `[1, 2]` is an error naming
    the field and the stages it runs."""
    def doc(zero: list[int]) -> dict:
        return _doc("llama3-8b", 16, 64, framework="torchtitan", search={"zero_stage": zero})

    both, only = candidates(*prepared(doc([1, 3]))), candidates(*prepared(doc([3])))
    assert len(both) == len(only) > 0 and both.rows == only.rows
    assert {r[7] for r in both.rows} == {3}
    with pytest.raises(InputError) as exc:
        candidates(*prepared(doc([1, 2])))
    assert exc.value.field == "search.zero_stage" and "torchtitan runs ZeRO stages 0, 3, not 1, 2" in exc.value.message


def test_the_rule_probes_build_the_plans_validation_builds(monkeypatch):
    # `_blocks` probes config_reasons with a validated template's copies (`model_copy(update=...)`, no
    # validation): each equals the plan validating the same fields builds, its field set included.
    built: list[Plan] = []
    copy = Plan.model_copy

    def checked(self, *, update=None, deep=False):
        got = copy(self, update=update, deep=deep)
        want = Plan(**update)
        assert got == want and got.model_dump() == want.model_dump()
        assert got.model_fields_set == want.model_fields_set
        built.append(got)
        return got

    monkeypatch.setattr(Plan, "model_copy", checked)
    for doc, offload in CASES.values():
        p, ctx = prepared(doc)
        candidates(p, ctx, opt_offload=offload)
    assert len(built) > 100

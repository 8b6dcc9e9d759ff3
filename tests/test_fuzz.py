"""Issue #6: property-based fuzzing of the loader, the solver and the cost model (hypothesis).

- `load_problem` / `load_plan` on random documents (schema field names with random values of
  random types, deletions, typos, nested junk) and on random file bytes: a Problem / Plan or an
  `InputError` whose message is one line, never any other exception.
- `solve` on random *valid* small problems: a plan that fits (and that `evaluate` prices the
  same), or `InfeasibleError` with a reason.
- `evaluate` on random plans: never NaN, inf or a negative time or memory anywhere in the
  Estimate, never an exception other than `InputError`.

Derandomized (fixed seed, no example database) so CI runs the same examples every time;
the whole file runs in well under a minute.
"""

from __future__ import annotations

import functools
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoshard.catalog import get_gpu, gpu_ids, model_ids, supports, topology_ids
from autoshard.cost import Estimate, evaluate
from autoshard.errors import InfeasibleError, InputError
from autoshard.loader import load_plan, load_problem
from autoshard.solver import solve
from autoshard.spec import (
    MESH_AXES,
    RECOMPUTES,
    SCHEDULES,
    ClusterSpec,
    ModelSpec,
    Plan,
    Problem,
    SearchSpec,
    TopologyLevel,
    TrainingSpec,
)



def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


SECTIONS: dict[str, type] = {"model": ModelSpec, "training": TrainingSpec, "cluster": ClusterSpec, "search": SearchSpec}
NAMES = {"gpu": gpu_ids(), "topology": topology_ids(), "model": model_ids(),
         "schedule": list(SCHEDULES), "recompute": list(RECOMPUTES), "precision": ["bf16", "fp8", "fp16"],
         "hidden_act": ["silu", "gelu", "relu2", "tanh"], "optimizer": ["adam", "adamw", "sgd", "lion"],
         "placement": ["tp-cp-ep-dp-pp", "dp-tp", "pp-tp-dp", "tp-xp"]}


# ---- strategies: junk ---------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-3, max_value=70),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 8, 64, 4096, 1 << 20, 1 << 21, -1, 0.5, 1e400, "", "8", "1e3", "auto", "nan"]),
    st.text(max_size=12),
)
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)


def typo(name: str) -> st.SearchStrategy[str]:
    """The field name, or a near miss: a dropped, doubled or swapped letter, other case."""
    if len(name) < 2:
        return st.just(name)
    i = st.integers(min_value=0, max_value=len(name) - 2)
    return st.one_of(
        st.just(name), st.just(name),
        i.map(lambda k: name[:k] + name[k + 1:]),
        i.map(lambda k: name[:k] + name[k] + name[k:]),
        i.map(lambda k: name[:k] + name[k + 1] + name[k] + name[k + 2:]),
        st.just(name.upper()), st.just(name.replace("_", "-")),
    )


@functools.lru_cache(maxsize=None)
def field_value(name: str) -> st.SearchStrategy[Any]:
    """A plausible value for a field (often valid), or junk."""
    plausible: list[st.SearchStrategy[Any]] = [junk]
    if name in NAMES:
        plausible.append(st.sampled_from(NAMES[name]))
        plausible.append(st.lists(st.sampled_from(NAMES[name]), max_size=3))
    plausible += [st.integers(min_value=0, max_value=64), st.lists(st.integers(min_value=0, max_value=16), max_size=4),
                  st.booleans()]
    if name == "topology":
        level = st.fixed_dictionaries({"name": st.text(max_size=4), "size": st.integers(-1, 64),
                                       "bandwidth_gb_per_s": st.floats(allow_nan=True, allow_infinity=True)},
                                      optional={f: field_value(f) for f in TopologyLevel.model_fields
                                                if f not in ("name", "size", "bandwidth_gb_per_s")})
        plausible.append(st.lists(level, max_size=3))
    return st.one_of(*plausible)


@st.composite
def section(draw: st.DrawFn, model: type) -> Any:
    names = list(model.model_fields)
    keep = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    doc = {draw(typo(k)): draw(field_value(k)) for k in keep}
    if draw(st.booleans()):
        doc.update(draw(st.dictionaries(st.text(max_size=6), junk, max_size=2)))
    return doc


VALID_BASE = {"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch_size": 16},
              "cluster": {"gpu": "h100", "num_gpus": 8}}


@st.composite
def problem_documents(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["sections", "mutated", "junk"]))
    if kind == "junk":
        return draw(junk)
    if kind == "mutated":  # a valid problem with one or two fields replaced, deleted or misspelled
        doc: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in VALID_BASE.items()}
        for _ in range(draw(st.integers(1, 2))):
            sec = draw(st.sampled_from(sorted(SECTIONS)))
            fields = list(SECTIONS[sec].model_fields)
            sub = doc.get(sec)
            if not isinstance(sub, dict):
                sub = {}
            op = draw(st.sampled_from(["set", "delete", "typo", "preset", "section"]))
            name = draw(st.sampled_from(fields))
            if op == "set":
                sub[name] = draw(field_value(name))
            elif op == "delete" and sub:
                sub.pop(draw(st.sampled_from(sorted(sub))))
            elif op == "typo" and sub:
                k = draw(st.sampled_from(sorted(sub)))
                sub[draw(typo(k))] = sub.pop(k)
            elif op == "preset" and sec == "model":
                doc["model"] = {"preset": draw(st.sampled_from(model_ids() + ["llama3-7b"])), name: draw(field_value(name))}
                continue
            else:
                doc[sec] = draw(junk)
                continue
            doc[sec] = sub
        return doc
    doc = {}
    for name in draw(st.lists(st.sampled_from(list(Problem.model_fields) + ["plan", "extra"]), unique=True)):
        if name in SECTIONS:
            doc[draw(typo(name))] = draw(st.one_of(section(SECTIONS[name]), field_value(name)))
        else:
            doc[name] = draw(junk)
    return doc


def assert_one_line(exc: InputError) -> None:
    text = exc.line()
    assert text and "\n" not in text and "\r" not in text and len(text) < 2000, text


def assert_loads_or_one_line(load, doc, kind) -> None:
    """`load(doc)` returns a `kind` or raises an InputError of one line, never anything else."""
    try:
        got = load(doc)
    except InputError as exc:
        assert_one_line(exc)
    else:
        assert isinstance(got, kind)


# ---- loader ---------------------------------------------------------------------------------------


@fuzz(400)
@given(problem_documents())
def test_load_problem_returns_a_problem_or_raises_input_error(doc):
    assert_loads_or_one_line(load_problem, doc, Problem)


plan_docs = st.one_of(section(Plan), junk, st.fixed_dictionaries({"plan": st.one_of(section(Plan), junk)}))


@fuzz(200)
@given(plan_docs)
def test_load_plan_returns_a_plan_or_raises_input_error(doc):
    assert_loads_or_one_line(load_plan, doc, Plan)


VALID_YAML = ("model: llama3-8b\ntraining: {seq_len: 2048, global_batch_size: 16}\n"
              "cluster: {gpu: h100, num_gpus: 8}\nsearch: {tp: [1, 2], pp: [1, 2]}\n")
SCRATCH = Path(tempfile.mkdtemp(prefix="autoshard-fuzz-"))


@st.composite
def file_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from([".yaml", ".json", ".yml"]))
    kind = draw(st.sampled_from(["bytes", "splice", "text"]))
    if kind == "bytes":
        return suffix, draw(st.binary(max_size=200))
    if kind == "text":
        return suffix, draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    base = VALID_YAML.encode()
    at = draw(st.integers(0, len(base)))
    cut = draw(st.integers(0, 20))
    return suffix, base[:at] + draw(st.binary(max_size=12)) + base[at + cut:]


@fuzz(300)
@given(file_bytes())
def test_load_problem_from_random_file_bytes(case):
    suffix, data = case
    path = SCRATCH / f"case{suffix}"
    path.write_bytes(data)
    try:
        problem = load_problem(path)
    except InputError as exc:
        assert_one_line(exc)
        assert str(path) in exc.line()
    else:
        assert isinstance(problem, Problem)


# ---- valid small problems: solve -------------------------------------------------------------------


@st.composite
def small_models(draw: st.DrawFn) -> dict[str, Any]:
    hidden = 64 * draw(st.integers(1, 32))
    head_dim = draw(st.sampled_from([d for d in (32, 64, 128) if hidden % d == 0]))
    heads = hidden // head_dim
    kv = draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
    m: dict[str, Any] = {
        "num_hidden_layers": draw(st.integers(1, 6)), "hidden_size": hidden,
        "intermediate_size": 64 * draw(st.integers(1, 64)), "num_attention_heads": heads,
        "num_key_value_heads": kv, "vocab_size": draw(st.integers(256, 65536)),
        "tie_word_embeddings": draw(st.booleans()), "hidden_act": draw(st.sampled_from(["silu", "gelu", "relu2"])),
    }
    if draw(st.integers(0, 3)) == 0:  # sometimes a mixture of experts
        experts = draw(st.sampled_from([2, 4, 8]))
        m.update(num_experts=experts, num_experts_per_tok=draw(st.integers(1, min(2, experts))),
                 moe_intermediate_size=64 * draw(st.integers(1, 16)),
                 first_k_dense_replace=draw(st.integers(0, m["num_hidden_layers"])))
    return m


@st.composite
def small_problems(draw: st.DrawFn) -> dict[str, Any]:
    gpus = draw(st.one_of(st.sampled_from([1, 2, 4, 8, 16]), st.integers(1, 16)))
    gpu = draw(st.sampled_from(gpu_ids()))
    # Valid by construction: a precision the GPU runs (fp8 on A100 and bf16 on V100 are bad input).
    runs = [p for p in ("bf16", "fp8") if supports(get_gpu(gpu), p)] or ["fp16"]
    return {
        "model": draw(small_models()),
        "training": {"seq_len": draw(st.sampled_from([128, 256, 512, 1024, 2048, 4096])),
                     "global_batch_size": draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 3, 12])),
                     "precision": draw(st.sampled_from(runs)),
                     "optimizer": draw(st.sampled_from(["adam", "adamw", "sgd"]))},
        "cluster": {"gpu": gpu, "num_gpus": gpus},
        # A restricted space keeps each solve well under a second.
        "search": {"tp": [1, 2], "pp": [1, 2], "cp": 1, "vpp": 1, "micro_batch_size": [1, 2],
                   "zero_stage": draw(st.sampled_from([[1], [0, 3]])), "schedule": ["1f1b"]},
    }


@fuzz(40)
@given(small_problems())
def test_solve_small_valid_problems(doc):
    problem = load_problem(doc)  # valid by construction: must not raise
    try:
        sol = solve(problem, time_limit_s=5, top_k=1)
    except InfeasibleError as exc:
        assert exc.reason.strip()
        return
    est = sol.estimate
    assert est.fits and not est.reasons
    assert est.peak_memory_gib <= est.memory_capacity_gib
    assert_finite_non_negative(est)
    assert sol.solver.status in ("OPTIMAL", "FEASIBLE")
    again = evaluate(problem, sol.plan)
    assert again.step_time_s == pytest.approx(est.step_time_s, rel=1e-9)


# ---- random plans: evaluate -------------------------------------------------------------------------


@st.composite
def plans(draw: st.DrawFn, layers: int) -> dict[str, Any]:
    pp = draw(st.sampled_from([1, 1, 2, 3, 4]))
    vpp = draw(st.sampled_from([1, 1, 2]))
    plan: dict[str, Any] = {
        "tp": draw(st.sampled_from([1, 1, 2, 4, 8, 3])), "pp": pp, "cp": draw(st.sampled_from([1, 1, 2, 4])),
        "ep": draw(st.sampled_from([1, 1, 2, 4])), "vpp": vpp,
        "sequence_parallel": draw(st.sampled_from([None, True, False])),
        "zero_stage": draw(st.integers(0, 3)), "micro_batch_size": draw(st.sampled_from([1, 1, 2, 4, 3])),
        "schedule": draw(st.sampled_from(list(SCHEDULES))),
        "placement": "-".join(draw(st.permutations(list(MESH_AXES)))),
    }
    if draw(st.booleans()):
        plan["dp"] = draw(st.integers(1, 16))
    if draw(st.booleans()):
        plan["recompute"] = draw(st.sampled_from(list(RECOMPUTES)))
    else:
        n = layers if draw(st.integers(0, 4)) else draw(st.integers(0, 8))
        plan["recompute"] = draw(st.lists(st.sampled_from(list(RECOMPUTES)), min_size=n, max_size=n))
    if draw(st.booleans()):
        chunks = pp * vpp if draw(st.integers(0, 4)) else draw(st.integers(1, 8))
        plan["stage_layers"] = draw(st.lists(st.integers(0, layers), min_size=chunks, max_size=chunks))
    return plan


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def consistent_plans(draw: st.DrawFn, problem: Problem) -> dict[str, Any]:
    """A plan whose degrees satisfy the divisibility rules (most of them fit or nearly fit)."""
    m, t, n = problem.model, problem.training, problem.cluster.num_gpus
    tps = [d for d in _divisors(n) if m.num_attention_heads % d == 0 and (m.kv_heads % d == 0 or d % m.kv_heads == 0)
           and m.intermediate_size % d == 0 and m.expert_ffn % d == 0]
    tp = draw(st.sampled_from(tps))
    cp = draw(st.sampled_from([c for c in (1, 2, 4) if (n // tp) % c == 0 and (c == 1 or t.seq_len % (2 * c) == 0)]))
    pp = draw(st.sampled_from([p for p in _divisors(n // (tp * cp)) if p <= m.num_hidden_layers]))
    dp = n // (tp * cp * pp)
    ep = draw(st.sampled_from([e for e in _divisors(dp) if m.is_moe and m.num_experts % e == 0] or [1]))
    mbs = draw(st.sampled_from(_divisors(t.global_batch_size // dp) if t.global_batch_size % dp == 0 else [1]))
    microbatches = t.global_batch_size // (dp * mbs) if t.global_batch_size % (dp * mbs) == 0 else 0
    schedules = ["1f1b", "gpipe"] + (["zero_bubble"] if pp > 1 else [])
    vpp = 1
    if pp > 1 and 2 * pp <= m.num_hidden_layers and microbatches and microbatches % pp == 0 and draw(st.booleans()):
        schedules, vpp = ["interleaved"], 2
    plan: dict[str, Any] = {"tp": tp, "cp": cp, "pp": pp, "ep": ep, "vpp": vpp, "micro_batch_size": mbs,
                            "schedule": draw(st.sampled_from(schedules)), "zero_stage": draw(st.integers(0, 3)),
                            "sequence_parallel": draw(st.sampled_from([None, True, False])),
                            "placement": "-".join(draw(st.permutations(list(MESH_AXES))))}
    if draw(st.booleans()):
        plan["dp"] = dp
    layers = m.num_hidden_layers
    plan["recompute"] = draw(st.one_of(st.sampled_from(list(RECOMPUTES)),
                                       st.lists(st.sampled_from(list(RECOMPUTES)), min_size=layers, max_size=layers)))
    if draw(st.booleans()):  # an uneven split: any composition of the layers into pp * vpp chunks
        cuts = sorted(draw(st.lists(st.integers(0, layers), min_size=pp * vpp - 1, max_size=pp * vpp - 1)))
        plan["stage_layers"] = [b - a for a, b in zip([0, *cuts], [*cuts, layers])]
    return plan


@st.composite
def problems_and_plans(draw: st.DrawFn) -> tuple[Problem, dict[str, Any]]:
    doc = draw(small_problems())
    if draw(st.integers(0, 4)) == 0:
        doc["model"] = draw(st.sampled_from(["llama3-8b", "mixtral-8x7b", "deepseek-v3", "llama3-70b"]))
        doc["cluster"]["num_gpus"] = draw(st.sampled_from([8, 16, 64]))
    problem = load_problem(doc)  # valid by construction: must not raise
    if draw(st.integers(0, 3)):
        return problem, draw(consistent_plans(problem))
    return problem, draw(plans(problem.model.num_hidden_layers))


ROUND_OFF = 1e-12


def assert_finite_non_negative(est: Estimate) -> None:
    def walk(value: Any, path: str) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, (int, float)):
            assert math.isfinite(value), f"{path} = {value}"
            # Round-off below a picosecond / picobyte is tolerated here (see test_no_negative_round_off).
            assert value >= -ROUND_OFF, f"{path} = {value}"
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}.{i}")

    walk(est.model_dump(mode="python", exclude={"plan"}), "estimate")
    assert set(est.memory_breakdown_gib) and all(s.peak_memory_gib >= 0 for s in est.stages)


@fuzz(400)
@given(problems_and_plans())
def test_evaluate_random_plans_is_finite_and_non_negative(case):
    problem, plan = case
    try:
        est = evaluate(problem, plan)
    except InputError as exc:  # a plan the schema rejects (e.g. a zero in stage_layers is fine, -1 is not)
        assert_one_line(exc)
        return
    assert isinstance(est, Estimate)
    assert_finite_non_negative(est)
    if est.reasons:
        assert not est.fits
    elif est.fits:
        assert est.step_time_s > 0 and est.peak_memory_gib <= est.memory_capacity_gib + 1e-9
        assert est.mfu <= est.hfu + 1e-12 and est.stages


# Regression (solver.py, fixed concurrently): on problems whose step time is a few milliseconds
# the rounding tolerance subtracted from the proven bound exceeded the 0.1% gap limit, so the
# status was FEASIBLE in 0.2 s although no time limit stopped the proof.
TINY_STEP = {"model": {"num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 1920,
                       "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 26117, "hidden_act": "gelu"},
             "training": {"seq_len": 256, "global_batch_size": 8, "precision": "fp8", "optimizer": "adamw"},
             "cluster": {"gpu": "h100-pcie", "num_gpus": 4},
             "search": {"tp": [1, 2], "pp": [1, 2], "cp": 1, "vpp": 1, "micro_batch_size": [1, 2],
                        "zero_stage": [0, 3], "schedule": ["1f1b"]}}


def test_millisecond_step_times_are_proven_optimal():
    sol = solve(load_problem(TINY_STEP), time_limit_s=30, top_k=0)
    assert sol.solver.solve_time_s < 30
    assert sol.solver.status == "OPTIMAL", sol.solver


# A known cost-model issue (reported): `pipeline_bubble = t_pipe - M * t[slow]` is computed by
# subtraction, and with pp=1 round-off leaves a tiny negative time (-5.4e-20 s here).
BUBBLE = ({"model": {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "vocab_size": 256},
           "training": {"seq_len": 128, "global_batch_size": 12}, "cluster": {"gpu": "v100-sxm", "num_gpus": 4}},
          {"tp": 1, "cp": 4, "pp": 1, "micro_batch_size": 2, "zero_stage": 0})


def test_no_negative_round_off():
    est = evaluate(load_problem(BUBBLE[0]), BUBBLE[1])
    assert min(est.time_breakdown_s.values()) >= 0, est.time_breakdown_s


# ---- issue 15: duplicate keys, measured-run files, output paths, collective sizes -------------------

KEY = st.sampled_from(["model", "training", "cluster", "search", "seq_len", "tp", "gpu", "a", "b"])
SCALAR = st.one_of(st.integers(-5, 5), st.sampled_from(["x", "h100", "llama3-8b", "1e9"]), st.booleans())


@fuzz(60)
@given(keys=st.lists(KEY, min_size=1, max_size=6), dup=st.integers(0, 5), value=SCALAR, flow=st.booleans(),
       depth=st.integers(0, 2))
def test_a_repeated_key_is_always_an_error_at_its_line(keys, dup, value, flow, depth):
    """Whatever the document, a mapping that repeats a key is an InputError naming that key and the
    line of its second occurrence (PyYAML alone keeps the last value silently)."""
    from autoshard.fileio import parse_yaml  # noqa: PLC0415

    keys = list(dict.fromkeys(keys))
    again = keys[dup % len(keys)]
    pad = "  " * depth
    head = "".join(f"{'  ' * i}n{i}:\n" for i in range(depth))
    if flow:
        body = pad + "m: {" + ", ".join(f"{k}: {value!r}" for k in [*keys, again]) + "}\n"
        line = depth + 1
    else:
        body = "".join(f"{pad}{k}: {value!r}\n" for k in [*keys, again])
        line = depth + len(keys) + 1
    with pytest.raises(InputError) as info:
        parse_yaml(head + body, "doc.yaml")
    msg = info.value.line()
    assert f"duplicate key {again!r}" in msg and f"at line {line}," in msg and "\n" not in msg


CELL = st.one_of(st.text(max_size=8), st.sampled_from(["inf", "-inf", "nan", "1e308", "-1", "0", "1e-9", "3.5",
                                                        "12", "fast", "", "1,5", "true"]))
COLUMNS = ["id", "model", "gpu", "gpu_count", "precision", "layers", "hidden", "vocab", "seq_len",
           "global_batch_seqs", "step_time_s", "tp", "pp"]


@fuzz(80)
@given(cells=st.lists(st.lists(CELL, min_size=len(COLUMNS), max_size=len(COLUMNS)), min_size=1, max_size=4),
       sep=st.sampled_from([",", ";", "\t"]))
def test_measured_runs_file_is_rows_or_one_line(cells, sep):
    """`read_runs` (calibrate, validate) on random CSV cells: rows whose numbers are all finite and
    in range, or one InputError line; never a ValueError, a NaN or an inf."""
    import csv  # noqa: PLC0415
    import io  # noqa: PLC0415

    from autoshard.loader import RUN_FLOAT_COLUMNS, RUN_INT_COLUMNS, read_runs  # noqa: PLC0415

    buf = io.StringIO()
    w = csv.writer(buf, delimiter=sep)
    w.writerow(COLUMNS)
    w.writerows(cells)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "runs.csv"
        path.write_text(buf.getvalue(), encoding="utf-8")
        try:
            rows = read_runs(path)
        except InputError as exc:
            assert "\n" not in exc.line() and "runs.csv" in exc.line()
            return
    assert sep == ","
    ids = [str(r["id"]).strip() for r in rows]
    assert len(set(ids)) == len(ids)
    for r in rows:
        for k, v in r.items():
            if k in RUN_INT_COLUMNS or k in RUN_FLOAT_COLUMNS:
                assert v is None or (isinstance(v, (int, float)) and math.isfinite(v)), (k, v)
        assert r["step_time_s"] is None or 1e-4 <= r["step_time_s"] <= 86_400


@fuzz(40)
@given(data=st.binary(max_size=2000), links=st.integers(0, 3))
def test_atomic_write_through_links_keeps_the_links(data, links):
    from autoshard.fileio import atomic_write  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as d:
        real = Path(d) / "real.bin"
        real.write_bytes(b"old")
        target = real
        for i in range(links):  # a chain of links: link_i -> link_{i-1} -> ... -> real.bin
            link = Path(d) / f"link{i}.bin"
            link.symlink_to(target.name)
            target = link
        atomic_write(target, data)
        assert real.read_bytes() == data and not real.is_symlink()
        assert all((Path(d) / f"link{i}.bin").is_symlink() for i in range(links))
        assert sorted(p.name for p in Path(d).iterdir()) == sorted(["real.bin", *[f"link{i}.bin" for i in range(links)]])


@fuzz(40)
@given(size=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["1e400", "1EB", "0", "-1"])),
       gpus=st.sampled_from(["1", "2", "8", "64", "0", "-3", "1048577"]))
def test_collective_is_finite_json_or_one_line(size, gpus):
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415
    import json  # noqa: PLC0415

    from autoshard import cli  # noqa: PLC0415

    text = size if isinstance(size, str) else repr(size)
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            rc = cli.main(["collective", "all_reduce", text, "--cluster", "dgx-h100-superpod", "--gpus", gpus, "--json"])
        except SystemExit as exc:  # argparse: a value it cannot parse at all (e.g. `-1.0` read as an option)
            rc = exc.code
    out, err = o.getvalue(), e.getvalue()
    assert rc in (0, 2), (text, gpus, err)
    if rc == 0:
        doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON of {text} B over {gpus}"))
        assert doc["time_s"] >= 0 and math.isfinite(doc["time_s"])
    else:
        assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err

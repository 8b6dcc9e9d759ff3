"""The solver against brute-force enumeration: OPTIMAL must mean it."""

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoshard import Plan, load_problem
from autoshard.cost import Config, assemble, context, evaluate, layer_table, with_modes
from autoshard.errors import InfeasibleError
from autoshard.solver import solve
from autoshard.layouts import block_layers, expressible, recompute_layout, search_modes
from autoshard.solver.search import search_headroom
from autoshard.solver.candidates import planned_dispatcher
from autoshard.spec import MESH_AXES


def compositions(total, parts):
    """All ways to split `total` layers into `parts` contiguous stages of >= 1 layer."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def brute_force(problem):
    """Minimum step time over every plan of the declared space, each priced by the
    evaluator's own table + assembly (the two halves of `evaluate`)."""
    # The space the solver searches: with the HBM it keeps free (`search_headroom`: the problem's
    # headroom, else the default share of HBM), which `evaluate` alone does not keep.
    head, _ = search_headroom(problem)
    problem = problem.model_copy(update={"search": problem.search.model_copy(update={"headroom_gib": head})})
    s = problem.search
    n = problem.cluster.num_gpus
    L = problem.model.num_hidden_layers
    # the modes the solver plans (`search_modes`: Megatron's recompute-module sets the model has too),
    # priced by the layer tables (`with_modes`)
    modes = search_modes(problem, context(problem))
    ctx = with_modes(context(problem), modes)
    layout = recompute_layout(ctx)
    # the expert dispatcher the solver plans with (`planned_dispatcher`: the hierarchical one where the
    # framework runs it, since it never moves more bytes than the flat all-to-all)
    dispatcher = planned_dispatcher(problem, ctx, s.allowed("moe_dispatcher", list(ctx.framework.moe_dispatchers)))
    best = None
    for tp, pp, cp, ep, mbs, zero, sched, vpp, sp, etp in itertools.product(
            s.allowed("tp", [1]), s.allowed("pp", [1]), s.allowed("cp", [1]), s.allowed("ep", [1]),
            s.allowed("micro_batch_size", [1]), s.allowed("zero_stage", [1]), s.allowed("schedule", ["1f1b"]),
            s.allowed("vpp", [1]), s.allowed("sequence_parallel", [True]),
            [None, 1] if problem.model.is_moe else [None]):
        if etp == 1 and tp == 1:
            continue  # the same plan as etp None
        plan = Plan(tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, sequence_parallel=sp, zero_stage=zero,
                    micro_batch_size=mbs, schedule=sched, etp=etp, moe_dispatcher=dispatcher if ep > 1 else None)
        est = evaluate(problem, plan)
        if est.reasons and not any("needs" in r and "GiB" in r for r in est.reasons):
            continue  # invalid degrees
        if sched == "interleaved" and est.num_microbatches % pp:
            continue
        if pp == 1 and sched != "1f1b" or tp == 1 and not sp:
            continue
        dp = n // (tp * pp * cp)
        folded = Config.of(plan, dp).folded  # MoE parallel folding: no ep axis of its own
        sizes = (tp, cp, 1, dp, pp) if folded else (tp, cp, ep, dp // ep, pp)
        live = [a for a, v in zip(MESH_AXES, sizes) if v > 1]
        orders = [] if s.placement_layout == "any" else ctx.framework.rank_orders(Config.of(plan, dp))
        for perm in itertools.permutations(live):
            if orders and not any([a for a in o.split("-") if a in live] == list(perm) for o in orders):
                continue  # a rank order the framework's launcher cannot set
            placement = "-".join([*perm, *[a for a in MESH_AXES if a not in perm]])
            cfg = Config.of(plan.model_copy(update={"placement": placement}), dp)
            table = layer_table(ctx, cfg)
            for split in compositions(L, pp * vpp):
                for rc in itertools.product(modes, repeat=L):
                    if not expressible(layout, split, list(rc), pp):
                        continue  # a list the framework's launcher cannot run (layouts.py)
                    e = assemble(ctx, table, split, list(rc), cfg.plan(list(rc), split), [])
                    if e.fits and (best is None or e.step_time_s < best[0] - 1e-12):
                        best = (e.step_time_s, cfg.plan(list(rc), split))
    return best


SPACE = {"tp": [1, 2], "pp": [1, 2], "cp": [1], "micro_batch_size": [1, 2], "zero_stage": [0, 1, 3],
         "schedule": ["1f1b", "zero_bubble", "interleaved"], "vpp": [1, 2], "sequence_parallel": [True]}


@st.composite
def small_problems(draw):
    moe = draw(st.booleans())
    layers = draw(st.integers(2, 4))
    hidden = draw(st.sampled_from([1024, 4096, 8192]))
    heads = draw(st.sampled_from([8, 16]))
    model = {"name": "rand", "num_hidden_layers": layers, "hidden_size": hidden,
             "intermediate_size": hidden * draw(st.sampled_from([2, 4])), "num_attention_heads": heads,
             "num_key_value_heads": draw(st.sampled_from([2, heads])), "vocab_size": draw(st.sampled_from([32000, 128256])),
             "hidden_act": draw(st.sampled_from(["silu", "gelu"]))}
    space = dict(SPACE)
    if moe:
        model.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=hidden,
                     first_k_dense_replace=draw(st.integers(0, layers - 1)))
        space["ep"] = [1, 2]
    space["recompute_layout"] = draw(st.sampled_from(["framework", "per_layer"]))
    space["placement_layout"] = draw(st.sampled_from(["framework", "any"]))
    gpus = draw(st.sampled_from([4, 8]))
    gpu = draw(st.sampled_from(["rtx-4090", "a100-sxm-40gb", "h100-sxm"]))
    seq = draw(st.sampled_from([1024, 4096, 8192]))
    return load_problem({"model": model, "training": {"seq_len": seq, "global_batch_size": 16},
                         "cluster": {"gpu": gpu, "num_gpus": gpus}, "search": space})


def _exact_optimum_or_infeasible(problem):
    """The brute-force optimum, and the solver's exact proof of the same (None: both say infeasible)."""
    bf = brute_force(problem)
    if bf is None:  # nothing fits as enumerated: infeasible, or a plan with the optimizer in host memory
        try:  # (planned where the framework offloads and nothing fits without it)
            offloaded = solve(problem, time_limit_s=60)
        except InfeasibleError:
            return None, None
        assert offloaded.plan.optimizer_offload and offloaded.estimate.fits
        plain = problem.model_copy(update={"search": problem.search.model_copy(update={"optimizer_offload": False})})
        with pytest.raises(InfeasibleError):
            solve(plain, time_limit_s=60)
        return None, None
    sol = solve(problem, time_limit_s=60, top_k=0, gap_limit=0.0)  # exact proof
    assert sol.solver.status == "OPTIMAL" and sol.estimate.fits
    assert sol.estimate.step_time_s == pytest.approx(bf[0], rel=1e-6, abs=sol.solver.rounding_tolerance_s)
    return bf, sol


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(small_problems())
def test_solver_matches_brute_force(problem):
    bf, sol = _exact_optimum_or_infeasible(problem)
    if bf is None:
        return
    # Default: OPTIMAL within the 0.1% gap limit, and the proven bound really is below the optimum.
    fast = solve(problem, time_limit_s=60, top_k=0)
    assert fast.solver.status == "OPTIMAL" and fast.solver.gap <= fast.solver.gap_limit + 1e-12  # (float rounding)
    assert fast.estimate.step_time_s <= bf[0] * (1 + fast.solver.gap_limit) + fast.solver.rounding_tolerance_s
    assert fast.solver.objective_bound_s <= bf[0] + fast.solver.rounding_tolerance_s


@st.composite
def small_moe_problems_with_modules(draw):
    """Small MoE problems whose search names Megatron recompute modules, on Megatron's or
    torchtitan's profile (whose ZeRO stages are 0 and 3 only)."""
    layers = draw(st.integers(2, 3))
    hidden = 4096
    model = {"name": "rand-moe", "num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": 2 * hidden,
             "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000, "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": hidden, "first_k_dense_replace": draw(st.integers(0, 1))}
    framework = draw(st.sampled_from(["megatron", "torchtitan"]))
    space = {"tp": [1, 2], "pp": [1, 2], "cp": [1], "ep": [1, 2], "micro_batch_size": [1],
             "zero_stage": [0, 1] if framework == "megatron" else [0, 3], "schedule": ["1f1b", "interleaved"],
             "vpp": [1, 2], "sequence_parallel": [True],
             "recompute": ["none", "moe_act+layernorm", "moe", "full"]}
    # 24 GB GPUs and long sequences: HBM forces recompute, and modules compete with full recompute.
    return load_problem({"model": model, "training": {"seq_len": draw(st.sampled_from([16384, 32768])),
                                                      "global_batch_size": 8},
                         "cluster": {"gpu": "rtx-4090", "num_gpus": 4},
                         "framework": framework, "search": space})


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(small_moe_problems_with_modules())
def test_solver_matches_brute_force_with_recompute_modules_and_folding(problem):
    _exact_optimum_or_infeasible(problem)


def test_objective_equals_evaluate_and_is_deterministic():
    doc = {"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch_size": 64},
           "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 16},
           "search": {"tp": [2, 4], "pp": [2, 4], "cp": [1], "zero_stage": [1], "micro_batch_size": [1]}}
    p = load_problem(doc)
    a = solve(p, time_limit_s=60)
    b = solve(load_problem(doc), time_limit_s=60)
    assert a.solver.status == "OPTIMAL"
    assert abs(a.solver.objective_s - a.estimate.step_time_s) <= a.solver.rounding_tolerance_s
    assert a.estimate == evaluate(p, a.plan)
    dump = lambda s: json.dumps({"plan": s.plan.model_dump(), "est": s.estimate.model_dump()}, sort_keys=True)  # noqa: E731
    assert dump(a) == dump(b)


def test_memory_pressure_forces_per_layer_recompute_and_uneven_stages():
    # 70B on 64 x 40 GB at 16k tokens: only fits with the distributed optimizer (fp32 main grads:
    # 6 + 12/d bytes per parameter) plus recompute on the stages holding more micro-batches.
    p = load_problem({"model": "llama3-70b", "training": {"seq_len": 16384, "global_batch_size": 64},
                      "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 64},
                      "search": {"tp": [8], "pp": [4], "zero_stage": [1], "micro_batch_size": [1],
                                 "schedule": ["1f1b"]}})
    sol = solve(p, time_limit_s=60)
    assert sol.estimate.fits
    assert sol.estimate.peak_memory_gib <= sol.estimate.memory_capacity_gib
    full = [s.recompute.get("full", 0) for s in sol.estimate.stages]
    # Earlier stages hold more in-flight micro-batches, so they recompute at least as many layers.
    assert full == sorted(full, reverse=True) and full[0] > 0


def test_block_layout_is_megatrons_recompute_num_layers():
    # --recompute-method block --recompute-num-layers K: the first K layers of every virtual stage,
    # all of a shorter one (Megatron transformer_block.py _checkpointed_forward); none elsewhere.
    from autoshard.layouts import project

    f, n = "full", "none"
    assert block_layers([3, 3, 2], [f, f, n, f, f, n, f, f]) == 2
    assert block_layers([3, 3, 2], [f, f, f, f, f, f, f, f]) == 3
    assert block_layers([3, 3, 2], [f, n, f, f, f, n, f, f]) is None  # not a prefix
    assert block_layers([3, 3, 2], [f, f, n, f, n, n, f, f]) is None  # unequal counts
    assert block_layers([2, 2], [f, n, "selective", n]) is None  # granularity is global
    assert expressible("block", [2, 2], ["selective"] * 4) and not expressible("uniform", [2, 2], [f, n, f, n])
    assert expressible("per_layer", [2, 2], [f, n, "selective", n])
    # A greedy mix becomes what Megatron runs: one mode everywhere, or K = the most a stage recomputes.
    got = project("block", [3, 3], [f, n, n, "selective", f, n], lambda i, m: {"full": 1, "selective": 2, "none": 3}[m])
    assert got == [[f] * 6, [f, f, n, f, f, n]]


def test_solved_recompute_is_what_the_launcher_runs():
    # 70B on 64 x 40 GB at 16k tokens needs recompute on the stages holding more micro-batches. Planned
    # per layer (a stack that takes a list) the early stages recompute more; for Megatron the plan is
    # --recompute-num-layers K on every virtual stage, exported exactly, never faster than per layer.
    from autoshard.export import export_plan

    doc = {"model": "llama3-70b", "training": {"seq_len": 16384, "global_batch_size": 64},
           "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 64},
           "search": {"tp": [8], "pp": [4], "zero_stage": [1], "micro_batch_size": [1], "schedule": ["1f1b"]}}
    mega = solve(load_problem(doc), top_k=0)
    free = solve(load_problem({**doc, "search": {**doc["search"], "recompute_layout": "per_layer"}}), top_k=0)
    rc = mega.plan.recompute_per_layer(80)
    k = block_layers(mega.plan.stage_layers or [20] * 4, rc) if len(set(rc)) > 1 else None
    assert k is not None and rc.count("full") == sum(min(k, n) for n in mega.plan.stage_layers)
    free_full = [s.recompute.get("full", 0) for s in free.estimate.stages]
    assert len(set(free_full)) > 1  # per layer: each stage recomputes what it must (11 layers in all)
    assert free.estimate.step_time_s < mega.estimate.step_time_s  # 46.2 vs 49.7 s: Megatron's restriction costs
    out = export_plan(load_problem(doc), mega.plan, "megatron")
    assert not any("not exactly expressible" in w or "not expressible" in w for w in out.warnings)
    assert f"--recompute-num-layers {k}" in out.text and "--recompute-method block" in out.text


def test_infeasible_names_binding_constraint_and_fix():
    p = load_problem({"model": "llama3-405b", "training": {"seq_len": 8192, "global_batch_size": 8},
                      "cluster": {"gpu": "rtx-4090", "num_gpus": 8}})
    with pytest.raises(InfeasibleError) as exc:
        solve(p, time_limit_s=30)
    msg = str(exc.value)
    assert "even with" in msg and "GiB" in msg and "more GPUs" in msg


def test_infeasible_by_the_frameworks_rules_names_the_rule_not_memory():
    """A space whose every dividing degree set the framework refuses (DeepSpeed's pipeline engine runs
    ZeRO 0-1 beside pp > 1: a pp 2, ZeRO-3 space) names that rule and the field to relax, not
    divisibility, and does not suggest --headroom 0 (no plan exists to fit); a space no degree set
    divides still says so; a memory-bound one keeps the headroom suggestion."""
    space = {"model": "llama3-8b", "framework": "deepspeed", "training": {"seq_len": 4096, "global_batch_size": 64},
             "cluster": {"gpu": "h100-sxm", "num_gpus": 16}, "search": {"pp": [2], "zero_stage": [3]}}
    with pytest.raises(InfeasibleError) as exc:
        solve(load_problem(space), time_limit_s=30)
    e = exc.value
    assert e.reason.startswith("deepspeed refuses every combination of degrees") and "ZeRO stages [0, 1]" in e.reason
    assert e.suggestions[0] == "relax search.zero_stage" and not e.memory
    assert not any("--headroom" in s for s in e.suggestions)
    with pytest.raises(InfeasibleError) as exc:  # dp 16 cannot split 63 sequences
        solve(load_problem({**space, "framework": "megatron", "training": {"seq_len": 4096, "global_batch_size": 63},
                            "search": {"dp": [16]}}), time_limit_s=30)
    assert exc.value.reason.startswith("no combination of degrees in the search space divides the 16 GPUs")
    p = load_problem({"model": "llama3-405b", "training": {"seq_len": 8192, "global_batch_size": 8},
                      "cluster": {"gpu": "rtx-4090", "num_gpus": 8}})
    with pytest.raises(InfeasibleError) as exc:
        solve(p, time_limit_s=30)
    assert exc.value.memory and any(s.startswith("--headroom 0") for s in exc.value.suggestions)


def test_balanced_max_equals_enumeration():
    """The whole-layer balance bound is exactly the best split's fullest stage."""
    import math
    import random

    from autoshard.solver import balanced_max

    rng = random.Random(5)
    for _ in range(400):
        P, tau, mp = rng.randint(1, 4), rng.uniform(0.1, 2), rng.choice([0, 1])
        L = rng.randint(P, 12)
        ex = [rng.choice([0.0, 0.3, 1.7, rng.uniform(0, 3)]) for _ in range(P)]
        best = math.inf
        for split in itertools.product(range(mp, L + 1), repeat=P):
            if sum(split) == L:
                best = min(best, max(e + n * tau for e, n in zip(ex, split)))
        assert balanced_max(tau, ex, L, mp) == pytest.approx(best, abs=1e-9)


def _random_problem(rng):
    """A small random problem over a wide space (CP, EP, every schedule and ZeRO stage,
    materialized attention, tiny token counts where weight reads bound the GEMMs)."""
    moe = rng.random() < 0.5
    hidden = rng.choice([512, 1024, 4096])
    heads = rng.choice([8, 16])
    model = {"name": "rand", "num_hidden_layers": rng.randint(2, 6), "hidden_size": hidden,
             "intermediate_size": hidden * rng.choice([2, 4]), "num_attention_heads": heads,
             "num_key_value_heads": rng.choice([2, heads]), "vocab_size": rng.choice([32000, 128256]),
             "hidden_act": rng.choice(["silu", "gelu"]), "tie_word_embeddings": rng.random() < 0.3}
    if moe:
        model.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=hidden // 2,
                     first_k_dense_replace=rng.randint(0, 1), num_shared_experts=rng.randint(0, 1))
    training = {"seq_len": rng.choice([128, 1024, 4096]), "global_batch_size": rng.choice([16, 64]),
                "flash_attention": rng.random() < 0.7, "optimizer": rng.choice(["adamw", "sgd"])}
    cluster = {"gpu": rng.choice(["rtx-4090", "a100-sxm-40gb", "h100-sxm"]), "num_gpus": rng.choice([8, 16, 32])}
    # Fine-tuning modes and framework profiles change bytes per parameter and the tail: bounds must hold.
    training["finetune"] = rng.choice(["full", "full", "lora", "qlora"])
    framework = rng.choice(["megatron", "megatron", "torchtitan", "deepspeed"])
    return load_problem({"model": model, "training": training, "cluster": cluster, "framework": framework})


@pytest.mark.parametrize("seed", range(12))
def test_bounds_never_exceed_evaluate(seed):
    """Every pruning bound (numpy over all candidates, the optimistic-table bound that
    stands for every placement, each placement's own table bound) is at most the step time
    `evaluate` gives any plan of that configuration, and the memory bound at most its peak."""
    import random

    rng = random.Random(seed)
    _check_bounds_never_exceed_evaluate(_random_problem(rng), rng)


@pytest.mark.parametrize("seed", range(6))
def test_bounds_never_exceed_evaluate_in_fp8(seed):
    """The same on Blackwell FP8 runs as Megatron-Bridge trains them: FP8 primary weights (1 B per
    parameter, no bf16 copy), bf16 main grads, TE's quantized saved inputs, token drop for MoE."""
    import random

    rng = random.Random(100 + seed)
    p = _random_problem(rng)
    training = {**p.training.model_dump(), "precision": "fp8-current", "fp8_params": True, "main_grads": "bf16",
                "moe_capacity_factor": 1.25 if p.model.is_moe else None, "finetune": "full"}
    p = load_problem({**p.model_dump(exclude={"training", "cluster", "framework"}), "training": training,
                      "cluster": {"gpu": "b200", "num_gpus": p.cluster.num_gpus}, "framework": "megatron"})
    _check_bounds_never_exceed_evaluate(p, rng)


def _check_bounds_never_exceed_evaluate(p, rng):
    from autoshard.cost import even_split
    from autoshard.solver import StageModel, _optimistic_table, _placements, _table_bound, candidates
    from autoshard.solver.bounds import _bounds

    ctx = context(p)
    cands = candidates(p, ctx)
    t_lb, m_lb, could_fit = _bounds(ctx, cands)
    t_any = _bounds(ctx, cands, memory=False)[0]  # (without the recompute HBM forces: every plan)
    assert (t_lb >= t_any).all()
    modes = ["none", "selective", "full"]
    L = p.model.num_hidden_layers
    checked = 0
    for i in rng.sample(range(len(cands)), min(40, len(cands))):
        cfg0 = cands[i]
        optimistic = _optimistic_table(ctx, cfg0)
        opt = _table_bound(ctx, optimistic, modes, exact_windows=False)
        opt_mem = _table_bound(ctx, optimistic, modes, exact_windows=False, memory=True)
        for cfg in _placements(p, ctx, cfg0):
            table = layer_table(ctx, cfg)
            own, own_mem = _table_bound(ctx, table, modes), _table_bound(ctx, table, modes, memory=True)
            V = cfg.pp * cfg.vpp
            plans = [(split, [rng.choice(modes) for _ in range(L)])
                     for split in [even_split(L, V)] + [rng.choice(list(compositions(L, V))) for _ in range(2)]]
            sm = StageModel(ctx, table, modes, False, None)
            if sm.solve(10)[0] == "OPTIMAL":  # the configuration's own optimum: where the bounds are tight
                plans.append(sm.read_plan(sm.read_counts()))
            for split, rc in plans:
                e = assemble(ctx, table, split, rc, cfg.plan(rc, split), [])
                for name, b in (("numpy", t_any[i]), ("optimistic", opt), ("table", own)):
                    assert b <= e.step_time_s * (1 + 1e-9), (cfg, name)
                if e.fits:  # the memory-aware bounds hold for plans that fit (inf: nothing does)
                    assert could_fit[i], (cfg, "numpy fit")
                    for name, b in (("numpy+memory", t_lb[i]), ("optimistic+memory", opt_mem),
                                    ("table+memory", own_mem)):
                        assert b <= e.step_time_s * (1 + 1e-9), (cfg, name)
                assert m_lb[i] <= e.peak_memory_gib * 2**30 * (1 + 1e-9), (cfg, "memory bound")
                checked += 1
    assert checked > 50


@pytest.mark.parametrize("cluster", [{"gpu": "b200", "num_gpus": 1024, "topology": "dgx-b200"},
                                     {"gpu": "gb200", "num_gpus": 576, "topology": "gb200-nvl72"},
                                     {"gpu": "h100-sxm", "num_gpus": 96}])
def test_free_tail_profiles_are_every_placements(cluster):
    """The placement-free tail's profiles (rank runs, no rank arrays) are exactly the dense and
    expert reduction groups `place_axes` gives over every order of the mesh axes, folded or not."""
    import random

    from autoshard.solver.bounds import _tail_profiles
    from autoshard.spec import divisors
    from autoshard.topology import place_axes

    ctx = context(load_problem({"model": "qwen3-235b-a22b", "training": {"seq_len": 4096, "global_batch_size": 2048},
                                "cluster": cluster}))
    n = cluster["num_gpus"]
    rng, checked = random.Random(n), 0
    while checked < 60:
        tp = rng.choice([d for d in divisors(n) if d <= 8])
        cp = rng.choice([d for d in divisors(n // tp) if d <= 16])
        pp = rng.choice([d for d in divisors(n // (tp * cp)) if d <= 16])
        dp, ep, etp = n // (tp * cp * pp), rng.choice([1, 2, 4, 8, 16, 32, 64]), rng.choice([None, 1, 2])
        if (tp * cp * dp) % ((etp or tp) * ep) or (etp is None and dp % ep):
            continue
        got = {(d.size, d.members, e.size, e.members) for d, e in _tail_profiles(ctx.graph, tp, cp, ep, dp, pp, etp)}
        want = set()
        for perm in itertools.permutations(MESH_AXES):
            pl = place_axes(ctx.graph, "-".join(perm), tp, cp, ep, dp, pp, etp)
            want.add((pl.dp_cp.size, pl.dp_cp.members, pl.edp.size, pl.edp.members))
        assert got == want, (tp, cp, ep, dp, pp, etp)
        checked += 1


@pytest.mark.parametrize("seed,cluster", [(0, {"gpu": "b200", "num_gpus": 256, "topology": "dgx-b200"}),
                                          (1, {"gpu": "h100-sxm", "num_gpus": 128}),
                                          (2, {"gpu": "b200", "num_gpus": 128, "topology": "dgx-b200"})])
def test_free_tail_bound_holds_on_multilevel_clusters(seed, cluster):
    """On clusters with several levels, where placements differ most, the placement-free bound
    (its tail the cheapest placement order's, coefficient by coefficient) stays at or below every
    placement's own tail and `evaluate` of its plans; and it is tighter than consecutive GPUs."""
    import random

    from autoshard.cost import even_split, tail_model
    from autoshard.solver import _optimistic_table, _placements, _table_bound, candidates
    from autoshard.solver.bounds import _free_tail_model, _tail_bound

    rng = random.Random(seed)
    model = dict(SMALL_MOE, num_hidden_layers=4)
    p = load_problem({"model": model, "training": {"seq_len": 4096, "global_batch_size": 512},
                      "cluster": cluster,
                      "framework": rng.choice(["megatron", "megatron", "deepspeed"]),
                      "search": {"micro_batch_size": [1, 2], "vpp": [1, 2]}})
    ctx = context(p)
    cands = candidates(p, ctx)
    modes = ["none", "selective", "full"]
    L = p.model.num_hidden_layers
    tighter = 0
    for cfg0 in rng.sample(cands, min(40, len(cands))):
        optimistic = _optimistic_table(ctx, cfg0)
        opt = _table_bound(ctx, optimistic, modes, exact_windows=False)
        free = _free_tail_model(ctx, optimistic)
        for cfg in _placements(p, ctx, cfg0):
            table = layer_table(ctx, cfg)
            tm = tail_model(ctx, table)
            for a, b in ((free.reduce, tm.reduce), (free.gather, tm.gather)):
                assert all(x <= y * (1 + 1e-12) for x, y in zip(a, b)), cfg
            assert _tail_bound(ctx, optimistic, modes, 0.0, False) <= _tail_bound(ctx, table, modes, 0.0, False) * (
                1 + 1e-9), cfg
            split = even_split(L, cfg.pp * cfg.vpp)
            rc = [rng.choice(modes) for _ in range(L)]
            e = assemble(ctx, table, split, rc, cfg.plan(rc, split), [])
            assert opt <= e.step_time_s * (1 + 1e-9), cfg
        consecutive = tail_model(ctx, optimistic)  # every group on consecutive GPUs: never dearer
        assert all(x <= y * (1 + 1e-12) for x, y in zip(consecutive.reduce + consecutive.gather,
                                                         free.reduce + free.gather))
        tighter += consecutive.reduce != free.reduce or consecutive.gather != free.gather
    assert tighter > 0


SMALL_MOE = {"name": "moe", "num_hidden_layers": 10, "hidden_size": 4096, "intermediate_size": 16384,
             "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "num_experts": 16,
             "num_experts_per_tok": 2, "moe_intermediate_size": 4096, "first_k_dense_replace": 2}


@pytest.mark.parametrize("model,gpu,gbs", [({"preset": "llama3-8b", "num_hidden_layers": 12}, "rtx-4090", 32),
                                           ({"preset": "llama3-8b", "num_hidden_layers": 12}, "a100-sxm-40gb", 64),
                                           (SMALL_MOE, "rtx-4090", 32)])
def test_memory_bound_is_sound_and_binds_under_pressure(model, gpu, gbs):
    """Where HBM forces recompute, the memory-aware bound rises above the plain one (or
    proves the configuration cannot fit) and still stays at or below each configuration's
    exact optimum (CP-SAT, evaluated); infinite only where CP-SAT finds no plan either."""
    from autoshard.solver import StageModel, _placements, _table_bound, candidates

    p = load_problem({"model": model, "training": {"seq_len": 4096, "global_batch_size": gbs},
                      "cluster": {"gpu": gpu, "num_gpus": 8},
                      "search": {"cp": [1], "zero_stage": [0, 1], "micro_batch_size": [1, 2]}})
    from autoshard.solver.bounds import _bounds

    ctx = context(p)
    modes = ["none", "selective", "full"]
    cands = candidates(p, ctx)
    # The numpy bound over every candidate, with the recompute HBM forces (`_forced_tmax`) and without.
    t_lb, _, could_fit = _bounds(ctx, cands)
    t_any = _bounds(ctx, cands, memory=False)[0]
    binding = numpy_binding = 0
    for i, cfg0 in enumerate(cands):
        table = layer_table(ctx, _placements(p, ctx, cfg0)[0])
        plain, mem = _table_bound(ctx, table, modes), _table_bound(ctx, table, modes, memory=True)
        assert mem >= plain
        sm = StageModel(ctx, table, modes, False, None)
        status = sm.solve(2)[0]
        if status == "INFEASIBLE":
            binding += mem == float("inf")
            numpy_binding += not could_fit[i]
            continue
        assert status in ("OPTIMAL", "FEASIBLE") and mem < float("inf"), cfg0
        assert could_fit[i], cfg0
        split, rc = sm.read_plan(sm.read_counts())
        best = assemble(ctx, table, split, rc, table.cfg.plan(rc, split), []).step_time_s
        assert mem <= best * (1 + 1e-9), cfg0
        assert t_lb[i] <= best * (1 + 1e-9), (cfg0, "numpy")
        binding += mem > plain * 1.01
        numpy_binding += t_lb[i] > t_any[i] * 1.01
    assert binding >= 3
    assert numpy_binding >= 3  # (the relaxation binds too: fewer configurations reach `_memory_tmax`)


def test_describe_difference_names_only_real_changes():
    from autoshard.solver import describe_difference

    a = Plan(tp=8, pp=16, dp=128, vpp=4, schedule="interleaved", placement="tp-cp-pp-dp-ep")
    b = Plan(tp=2, cp=32, pp=16, dp=16, vpp=4, schedule="interleaved", placement="tp-cp-ep-pp-dp")
    # tp, pp, dp keep their relative order: the layouts agree wherever both plans have the axis.
    assert describe_difference(a, b) == "tp 8 -> 2, cp 1 -> 32, dp 128 -> 16"
    c = b.model_copy(update={"placement": "tp-pp-cp-dp-ep"})
    assert "placement tp-cp-ep-pp-dp -> tp-pp-cp-dp-ep" in describe_difference(b, c)
    d = b.model_copy(update={"recompute": ["full"] * 2 + ["none"] * 124})
    assert describe_difference(b, d) == "recompute none -> none:124,full:2"
    assert describe_difference(b, b) == "same degrees, different layer split"


@pytest.mark.parametrize("dense,pp,vpp,seq", [(2, 2, 1, 4096), (2, 4, 1, 4096), (3, 3, 2, 4096), (3, 2, 2, 16384),
                                              (3, 3, 2, 16384)])
def test_memory_tmax_is_the_least_slowest_rank_over_every_fitting_plan(dense, pp, vpp, seq):
    """`_memory_tmax` (the recompute HBM forces, dense layers only where a dense-first split can
    put them) is at most the slowest rank's time of every plan that fits, by enumeration of every
    split (>= 1 layer per virtual stage) and per-layer recompute; and where dense placement binds,
    it equals the enumerated least (seq 16384: HBM forces recompute too)."""
    from autoshard.cost import assign_layers, rank_totals
    from autoshard.solver import _memory_tmax, _placements, candidates

    model = dict(SMALL_MOE, num_hidden_layers=8, first_k_dense_replace=dense)
    schedule = "interleaved" if vpp > 1 else "1f1b"
    p = load_problem({"model": model, "training": {"seq_len": seq, "global_batch_size": 48},
                      "cluster": {"gpu": "rtx-4090", "num_gpus": 8 * pp // 2},
                      "search": {"tp": [2], "cp": [1], "ep": [2], "pp": [pp], "vpp": [vpp], "zero_stage": [1],
                                 "micro_batch_size": [1], "schedule": [schedule], "sequence_parallel": [True]}})
    ctx = context(p)
    modes = ["none", "full"]
    kinds = p.model.layer_kinds()
    L = len(kinds)
    exact = 0
    for cfg0 in candidates(p, ctx):
        table = layer_table(ctx, _placements(p, ctx, cfg0)[0])
        bound = _memory_tmax(ctx, table, modes)
        least = float("inf")
        for split in compositions(L, pp * vpp):
            for rc in itertools.product(modes, repeat=L):
                rc = list(rc)
                e = assemble(ctx, table, split, rc, table.cfg.plan(rc, split), [])
                if not e.fits:
                    continue
                per_rank = assign_layers(kinds, rc, split, pp)
                tmax = max(rank_totals(table, ch, r == 0, r == pp - 1).time_s for r, ch in enumerate(per_rank))
                least = min(least, tmax)
        assert bound <= least * (1 + 1e-9), table.cfg
        exact += bound == pytest.approx(least, rel=1e-9)
    assert exact >= 1


def _optima_without_and_with(ctx, table, modes, cuts: str) -> list[tuple[str, int | None]]:
    """(status, objective) of the stage model's exact optimum without and with the redundant
    constraints `cuts` (a StageModel flag)."""
    from autoshard.solver import StageModel

    got = []
    for on in (False, True):
        status, obj, _ = StageModel(ctx, table, modes, False, None, **{cuts: on}).solve(20)
        got.append((status, obj))
    return got


@pytest.mark.parametrize("seq,schedules", [(8192, ["1f1b", "interleaved"]), (16384, ["interleaved", "zero_bubble"])])
def test_rank_cuts_keep_every_optimum(seq, schedules):
    """The stage model's per-rank least times (`rank_cuts`, redundant constraints from `_rank_times`)
    cut no plan: with and without them, every configuration's exact optimum is the same, under HBM
    pressure that forces recompute."""
    from autoshard.solver import _placements, candidates

    model = dict(SMALL_MOE, num_hidden_layers=8, first_k_dense_replace=2)
    p = load_problem({"model": model, "training": {"seq_len": seq, "global_batch_size": 32},
                      "cluster": {"gpu": "rtx-4090", "num_gpus": 8},
                      "search": {"cp": [1], "zero_stage": [1], "micro_batch_size": [1], "schedule": schedules,
                                 "vpp": [1, 2]}})
    ctx = context(p)
    modes = ["none", "selective", "full"]
    compared = 0
    for cfg0 in candidates(p, ctx):
        if cfg0.pp == 1:
            continue
        got = _optima_without_and_with(ctx, layer_table(ctx, _placements(p, ctx, cfg0)[0]), modes, "rank_cuts")
        assert got[0] == got[1], cfg0
        compared += got[0][0] == "OPTIMAL"
    assert compared >= 4


@pytest.mark.parametrize("framework,schedules,offload", [
    ("megatron", ["1f1b", "interleaved"], False),  # one recompute mode for every layer: the picked mode's cut
    ("megatron", ["1f1b"], True),  # activation offloading beside the pick (its layers stay free)
    ("torchtitan", ["interleaved", "zero_bubble"], False),  # per-layer modes and every-Nth
])
def test_count_cuts_keep_every_optimum(framework, schedules, offload):
    """The stage model's per-rank layer counts (`count_cuts`: t_max at least each count times its
    kind's fastest mode, or the picked mode's) cut no plan: with and without them every
    configuration's exact optimum is the same, dense and MoE layers, under HBM pressure."""
    from autoshard.solver import _placements, candidates

    model = dict(SMALL_MOE, num_hidden_layers=8, first_k_dense_replace=2)
    search = {"cp": [1], "zero_stage": [1] if framework == "megatron" else [0], "micro_batch_size": [1],
              "schedule": schedules, "vpp": [1, 2]}
    if offload:
        search["recompute"] = ["none", "full", "offload"]
    p = load_problem({"model": model, "framework": framework, "training": {"seq_len": 8192, "global_batch_size": 32},
                      "cluster": {"gpu": "rtx-4090", "num_gpus": 8}, "search": search})
    modes = search_modes(p, context(p))
    ctx = with_modes(context(p), modes)  # (the layer tables price every planned mode, as `solve`'s)
    assert ("offload" in modes) == offload
    compared = 0
    for cfg0 in candidates(p, ctx):
        got = _optima_without_and_with(ctx, layer_table(ctx, _placements(p, ctx, cfg0)[0]), modes, "count_cuts")
        assert got[0] == got[1], cfg0
        compared += got[0][0] == "OPTIMAL" and cfg0.pp > 1
    assert compared >= 4


def test_counts_under_equals_broadcast_comparison():
    """`_counts_under` (a cumulative histogram over level indices, used by `_memory_tmax`) equals
    the (P, levels, N) comparison it replaces, with ties, inf and levels that are not values."""
    import numpy as np

    from autoshard.solver.bounds import _counts_under

    rng = np.random.default_rng(0)
    for _ in range(500):
        P, N = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        t = np.round(rng.random((P, N)) * 5, 1)
        t[rng.random((P, N)) < 0.2] = np.inf
        finite = t[np.isfinite(t)]
        levels = np.unique(finite) if rng.random() < 0.5 else np.unique(np.r_[finite, rng.random(3) * 6])
        if not len(levels):
            continue
        ref = (t[:, None, :] <= levels[None, :, None]).sum(axis=2)
        assert (_counts_under(t, levels) == ref).all()


def test_memoized_table_bounds_equal_fresh_ones():
    """`_table_bound` memoizes its pipeline part and tail model in `Table.memo`, shared by every
    table with the same layer costs: over every configuration and placement of a small space (both
    schedules families, several dp, ZeRO stages and micro-batch counts sharing layer costs), the
    bound read through the shared memo equals the one computed on a fresh memo, bit for bit."""
    import dataclasses

    from autoshard.solver import _placements, candidates
    from autoshard.solver.bounds import _optimistic_table, _table_bound

    p = load_problem({"model": {"preset": "llama3-8b", "num_hidden_layers": 8},
                      "training": {"seq_len": 4096, "global_batch_size": 64},
                      "cluster": {"gpu": "h100-sxm", "num_gpus": 64},
                      "search": {"tp": [1, 2, 4], "pp": [1, 2, 4], "cp": [1, 2], "micro_batch_size": [1, 2]}})
    ctx = context(p)
    modes = ["none", "selective", "full"]
    cache, opt_cache, n = {}, {}, 0
    for cfg0 in candidates(p, ctx):
        opt = _optimistic_table(ctx, cfg0, opt_cache)
        fresh = dataclasses.replace(opt, memo={})
        for kw in ({"exact_windows": False}, {"exact_windows": False, "memory": True}):
            assert _table_bound(ctx, opt, modes, **kw) == _table_bound(ctx, fresh, modes, **kw)
        for cfg in _placements(p, ctx, cfg0):
            table = layer_table(ctx, cfg, cache)
            for kw in ({}, {"memory": True}):
                got = _table_bound(ctx, table, modes, **kw)
                assert got == _table_bound(ctx, dataclasses.replace(table, memo={}), modes, **kw), cfg
            n += 1
    assert n > 200


@st.composite
def small_fp8_problems(draw):
    """Small problems trained in FP8 as Megatron-Bridge runs it: TE's quantized saved inputs, FP8
    primary weights, bf16 main grads, token drop for MoE (the memory and tail terms they change)."""
    p = draw(small_problems())
    training = {**p.training.model_dump(), "precision": "fp8-current", "fp8_params": draw(st.booleans()),
                "main_grads": draw(st.sampled_from([None, "bf16"]))}
    if p.model.is_moe:
        training["moe_capacity_factor"] = draw(st.sampled_from([None, 1.25]))
    # 24 GB RTX 4090s (Ada has FP8 tensor cores) and long sequences: HBM decides between plans.
    training["seq_len"] = draw(st.sampled_from([8192, 16384]))
    return load_problem({**p.model_dump(exclude={"training", "cluster"}), "training": training,
                         "cluster": {"gpu": "rtx-4090", "num_gpus": p.cluster.num_gpus}})


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(small_fp8_problems())
def test_solver_matches_brute_force_in_fp8(problem):
    bf, sol = _exact_optimum_or_infeasible(problem)
    if bf is not None:
        fast = solve(problem, time_limit_s=60, top_k=0)
        assert fast.solver.objective_bound_s <= bf[0] + fast.solver.rounding_tolerance_s


def test_every_nth_layout_is_torchtitans_selective_ac_option():
    # torchtitan `selective_ac_option = N`: a counter over the blocks a rank wraps (its virtual stages in
    # order), block j fully checkpointed iff (j + 1) % N == 0 (distributed/activation_checkpoint.py).
    from autoshard.layouts import every_nth_layers, every_nth_list

    f, n = "full", "none"
    assert every_nth_list([3, 3], 1, 2) == [n, f, n, f, n, f]
    assert every_nth_list([2, 2, 2, 2], 2, 2) == [n, f, n, f, n, f, n, f]  # stages 0, 2 on rank 0
    assert every_nth_list([1, 1, 1, 1], 2, 2) == [n, n, f, f]  # rank 0 counts stages 0 then 2
    assert every_nth_layers([3, 3], [n, f, n, f, n, f], 1) == 2
    assert every_nth_layers([2, 2], [n, f, n, f], 2) == 2  # each rank counts its own blocks
    assert every_nth_layers([3, 3], [f, n, n, f, n, n], 1) is None  # the first block is never one
    assert every_nth_layers([3, 3], [n, f, n, n, f, n], 1) is None


def test_torchtitan_plans_every_nth_block_and_matches_enumeration():
    # Llama 3 70B on 64 x A100-40GB at 8k (tp8 pp4, FSDP): torchtitan has no per-layer list, but every
    # 2nd block (39 of 80) beats full checkpointing; exported exactly as selective_ac_option "2". (At 16k
    # it no longer fits: under PP torchtitan keeps the stage's gathered bf16 weights and its unsharded
    # fp32 gradients for the step, 13 GiB more: frameworks.yaml pipeline_zero3_step_sync.)
    from autoshard.export import export_plan

    doc = {"model": "llama3-70b", "framework": "torchtitan",
           "training": {"seq_len": 8192, "global_batch_size": 64},
           "cluster": {"gpu": "a100-sxm-40gb", "num_gpus": 64},
           "search": {"cp": [1], "tp": [8], "pp": [4], "zero_stage": [3], "micro_batch_size": [1], "schedule": ["1f1b"],
                      "headroom_gib": 0}}  # at the HBM edge, as the layout rule is stated
    sol = solve(load_problem(doc), top_k=0)
    rc = sol.plan.recompute_per_layer(80)
    assert every_nth_layers_of(sol) == 2 and rc.count("full") == 39
    full = evaluate(load_problem(doc), sol.plan.model_copy(update={"recompute": "full", "stage_layers": None}))
    assert sol.estimate.step_time_s < full.step_time_s
    out = export_plan(load_problem(doc), sol.plan, "torchtitan")
    assert 'selective_ac_option = "2"' in out.text and not [w for w in out.warnings if "recompute" in w]
    # and on a small problem the solver's every-Nth optimum is the enumerated one
    small = {"model": {"name": "s", "num_hidden_layers": 8, "hidden_size": 4096, "intermediate_size": 16384,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000},
             "framework": "torchtitan", "training": {"seq_len": 32768, "global_batch_size": 16},
             "cluster": {"gpu": "rtx-4090", "num_gpus": 8},
             "search": {"tp": [2], "pp": [2, 4], "cp": [1], "zero_stage": [3], "micro_batch_size": [1],
                        "schedule": ["1f1b"], "recompute": ["none", "full"], "placement": ["tp-cp-ep-dp-pp"],
                        "headroom_gib": 0}}  # (at the HBM edge: with the default 1.2 GiB free, every 2nd block)
    bf, got = _exact_optimum_or_infeasible(load_problem(small))
    # pp2 [4, 4]: every 2nd block of each rank (the 4th before torchtitan's PP kept the stage's gathered
    # weights and unsharded gradients for the step); the brute force above agrees
    assert every_nth_layers_of(got) == 2


def every_nth_layers_of(sol):
    from autoshard.layouts import every_nth_layers

    return every_nth_layers(sol.plan.stage_layers, sol.plan.recompute_per_layer(sum(sol.plan.stage_layers)), sol.plan.pp)

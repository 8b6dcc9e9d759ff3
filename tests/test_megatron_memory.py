"""Weights + gradients + optimizer states per GPU against Megatron-LM's own formula.

`megatron_weight_and_optimizer_bytes` transcribes `compute_weight_and_optimizer_memory` of
Megatron-LM megatron/training/theoretical_memory_usage.py (NVIDIA/Megatron-LM d98e8a64dd,
2026-08-22) for the cases it covers (no MTP, no latent MoE, RMSNorm, cp = 1, padded vocabulary
given): the most loaded shard (1/pp of the layers plus the embedding, plus the output layer when
untied and pp = 1) times 18 bytes per parameter, or 6 + 12/d with the distributed optimizer (d the
data-parallel size, expert data-parallel for expert weights). autoshard must agree within 3% on the
first pipeline rank of an even split (it also divides the norms by TP, which Megatron replicates).
"""

import itertools
import random

import pytest

from autoshard import Plan, evaluate, load_problem


def megatron_weight_and_optimizer_bytes(a) -> float:
    gated = 3 / 2 if a["swiglu"] else 1
    E = a["num_experts"]
    moe_layers = a["num_layers"] - a["first_k_dense"] if E else 0
    dense_layers = a["num_layers"] - moe_layers
    norm_size = 1  # RMSNorm
    h, heads = a["hidden_size"], a["num_attention_heads"]
    if a["mla"]:
        q_term = a["q_lora_rank"] * (h + heads * (a["qk_head_dim"] + a["qk_pos_emb_head_dim"]) + norm_size)
        attention = (q_term + a["kv_lora_rank"] * (h + heads * (a["qk_head_dim"] + a["v_head_dim"]) + norm_size)
                     + h * a["qk_pos_emb_head_dim"] + heads * a["v_head_dim"] * h)
    else:
        ratio = a["kv_channels"] * heads / h
        attention = 2 * h * h * ((1 + a["num_query_groups"] / heads) * ratio)
    embedding = h * a["padded_vocab_size"]
    dense_mlp = 2 * h * a["ffn_hidden_size"] * gated
    shared = 2 * h * a["shared_ffn"] * gated
    routed = 2 * h * a["moe_ffn"] * max(E, 1) * gated if E else 0
    layernorm = 2 * h * norm_size
    router = h * E if E else 0
    tp_sharded = (attention + dense_mlp) * dense_layers + (attention + shared) * moe_layers
    replicated = layernorm * dense_layers + (layernorm + router) * moe_layers + norm_size * h
    expert_sharded = routed * moe_layers
    pp, tp, etp, ep = a["pp"], a["tp"], a["etp"], a["ep"]
    tp_on_shard = (tp_sharded / pp + embedding) / tp
    rep_on_shard = replicated / pp
    exp_on_shard = expert_sharded / pp / (etp * ep)
    if a["untie"] and pp == 1:
        tp_on_shard += embedding / tp
    world = a["world"]
    edp = world // (etp * ep * pp)

    def per_param(d):
        return 18 if not a["dist_opt"] else 6 + 12 / d

    return (tp_on_shard + rep_on_shard) * per_param(a["dp"]) + exp_on_shard * per_param(edp)


def _configs():
    rng = random.Random(7)
    dense = [("llama3-8b", dict(h=4096, L=32, heads=32, kv=8, ffn=14336)),
             ("llama3-70b", dict(h=8192, L=80, heads=64, kv=8, ffn=28672)),
             ("gpt-like", dict(h=6144, L=48, heads=48, kv=48, ffn=24576))]
    out = []
    for (name, m), tp, pp, dp, dist in itertools.product(dense, (1, 2, 4, 8), (1, 2, 4), (2, 8), (True, False)):
        if m["L"] % pp or m["kv"] % tp and tp % m["kv"]:
            continue
        out.append(("dense", name, m, dict(tp=tp, pp=pp, dp=dp, ep=1, etp=tp, dist=dist)))
    rng.shuffle(out)
    out = out[:36]
    moe = dict(h=4096, L=24, heads=32, kv=4, ffn=12288, E=64, k=6, moe_ffn=1408, shared=2, first=1)
    for tp, etp, ep, pp, dp, dist in [(1, 1, 8, 1, 8, True), (2, 1, 8, 1, 4, True), (2, 2, 4, 1, 8, True),
                                      (4, 1, 16, 2, 4, True), (1, 1, 16, 2, 16, False), (2, 1, 32, 2, 16, True),
                                      (1, 1, 4, 4, 8, True), (4, 2, 8, 2, 8, True), (2, 2, 8, 3, 8, False),
                                      (8, 1, 64, 1, 8, True), (1, 1, 64, 1, 64, True), (2, 1, 16, 4, 8, True),
                                      (4, 4, 2, 1, 4, True), (1, 1, 2, 1, 2, False)]:
        # Megatron's formula puts 1/pp of every layer kind on the loaded shard: with pipelines, no
        # leading dense layer (which an even split of whole layers would give to the first stage).
        mm = moe if pp == 1 else dict(moe, first=0)
        out.append(("moe", "moe-16b", mm, dict(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp, dist=dist)))
    return out


CONFIGS = _configs()


def test_at_least_fifty_configurations():
    assert len(CONFIGS) >= 50


@pytest.mark.parametrize("kind,name,m,c", CONFIGS, ids=[f"{n}-tp{c['tp']}etp{c['etp']}ep{c['ep']}pp{c['pp']}dp{c['dp']}"
                                                     f"{'-distopt' if c['dist'] else ''}" for _, n, _, c in CONFIGS])
def test_weights_grads_optimizer_match_megatron(kind, name, m, c):
    vocab = 128000  # a multiple of 128 x tp: Megatron's padded vocabulary is the vocabulary
    model = {"name": name, "num_hidden_layers": m["L"], "hidden_size": m["h"], "intermediate_size": m["ffn"],
             "num_attention_heads": m["heads"], "num_key_value_heads": m["kv"], "vocab_size": vocab,
             "hidden_act": "silu"}
    if kind == "moe":
        model.update(num_experts=m["E"], num_experts_per_tok=m["k"], moe_intermediate_size=m["moe_ffn"],
                     num_shared_experts=m["shared"], first_k_dense_replace=m["first"])
    world = c["tp"] * c["pp"] * c["dp"]
    problem = load_problem({"model": model, "training": {"seq_len": 1024, "global_batch_size": c["dp"] * 4},
                            "cluster": {"gpu": "h200", "num_gpus": world}, "framework": "megatron"})
    plan = Plan(tp=c["tp"], pp=c["pp"], dp=c["dp"], ep=c["ep"], etp=c["etp"], zero_stage=1 if c["dist"] else 0)
    est = evaluate(problem, plan)
    assert not [r for r in est.reasons if "GiB" not in r], est.reasons
    mem = est.stages[0].memory_gib
    ours = (mem["weights"] + mem["gradients"] + mem["optimizer_states"]) * 2**30
    head_dim = m["h"] // m["heads"]
    theirs = megatron_weight_and_optimizer_bytes(dict(
        swiglu=True, num_experts=m.get("E", 0) if kind == "moe" else 0, first_k_dense=m.get("first", 0),
        num_layers=m["L"], hidden_size=m["h"], num_attention_heads=m["heads"], mla=False,
        kv_channels=head_dim, num_query_groups=m["kv"], padded_vocab_size=vocab, ffn_hidden_size=m["ffn"],
        shared_ffn=m.get("shared", 0) * m.get("moe_ffn", 0), moe_ffn=m.get("moe_ffn", 0),
        pp=c["pp"], tp=c["tp"], etp=c["etp"], ep=c["ep"], untie=True, world=world, dp=c["dp"],
        dist_opt=c["dist"]))
    assert ours == pytest.approx(theirs, rel=0.03)

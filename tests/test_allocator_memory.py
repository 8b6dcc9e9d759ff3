"""Peak memory against `torch.cuda.max_memory_allocated` of real Megatron runs.

Measured: Megatron-LM's functional tests (NVIDIA/Megatron-LM d98e8a64dd, 2026-08-22),
tests/functional_tests/test_cases/gpt/<case>/golden_values_dev_dgx_h100.json `mem-max-allocated-bytes`
(the largest value over the logged iterations) beside the case's model_config.yaml, one node of 8 H100
(tests/test_utils/recipes/h100/gpt.yaml). training.py logs `allocated_bytes.all.peak` of
torch.cuda.memory_stats() (line 3445) through the tensorboard writer, which only the last rank holds
(global_vars.py: `args.rank == (args.world_size - 1)`): the figure is the last pipeline stage's, the one
with the output layer and the loss. Both 7B cases: 32 layers, hidden 4096, 32 heads, 8 query groups,
ffn 16384 (4 x hidden, GELU: no --swiglu), untied embeddings, --vocab-size 131073 (padded to a multiple
of 128 x TP), sequence 8192, global batch 8, Megatron's default dropout 0.1, bf16, Transformer Engine,
--use-distributed-optimizer with --overlap-grad-reduce / --overlap-param-gather, no recompute, no SP.
The small GPT is tests/test_fixed_costs.py's. Facts read from each model_config.yaml: without
--use-distributed-optimizer Megatron runs plain DDP (zero_stage 0); --transformer-impl local (Megatron's
own DotProductAttention: baddbmm, fused softmax, dropout, bmm) and --attention-backend unfused
materialize the scores (flash_attention false); the rest run TE's fused attention.

The rows below state each case's facts by hand; the tests after them convert every case of
validation/megatron_functional_memory.json from its arguments (autoshard.validate.megatron_args): 58 of
60 convert, median |error| 3.5% -> 0.9%, p90 8.9% -> 1.8%, worst -27.7% -> -2.5%, 27 -> 58 within 3%, with
the terms priced here (fused cross entropy, deferred output-layer wgrad, the batch's attention masks, q/k
norms, PyTorch's per-thread and TE's userbuffers cuBLAS workspaces, interleaved in-flight chunks in
Megatron's order, the learned position table, TE's dummy weight gradients under gradient-accumulation
fusion).
"""

import json
import statistics

import pytest

from autoshard import Plan, evaluate, load_problem
from autoshard.cost.context import context
from autoshard.cost.layers import cublas_workspace_bytes
from autoshard.cost.step import interleaved_windows
from autoshard.export import export_plan
from autoshard.validate import validation_file
from autoshard.validate.megatron_args import problem_and_plan

GIB = 2**30


def _gpt7b(tp: int) -> dict:
    vocab = -(-131073 // (128 * tp)) * 128 * tp  # Megatron's padded vocabulary
    return {"name": "gpt-7b", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 16384,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": vocab, "hidden_act": "gelu",
            "tie_word_embeddings": False, "dropout": True}


SMALL_GPT = {"name": "gpt-small", "num_hidden_layers": 12, "hidden_size": 512, "intermediate_size": 2048,
             "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 50304, "hidden_act": "gelu",
             "tie_word_embeddings": True, "dropout": True}

UNFUSED = ("unfused", SMALL_GPT)  # --transformer-impl local or --attention-backend unfused: flash_attention false

# case, model, sequence, global batch, plan, measured mem-max-allocated-bytes, tolerance
ROWS = [
    # --num-layers-per-virtual-pipeline-stage 1: 8 virtual stages per rank, interleaved 1F1B
    ("gpt3_7b_tp1_pp4_memory_speed", _gpt7b(1), 8192, 8,
     dict(tp=1, pp=4, dp=2, vpp=8, schedule="interleaved", micro_batch_size=1), 60720852992, 0.03),
    ("gpt3_7b_tp4_pp1_memory_speed", _gpt7b(4), 8192, 8,
     dict(tp=4, pp=1, dp=2, micro_batch_size=2, sequence_parallel=False), 57143791616, 0.03),
    # The small model with TE's fused attention peaks 0.05-0.07 GiB above the price (-2% to -7%): what
    # it still does not count (the batch and its [b, 1, s, s] attention mask, the loss buffers, allocator
    # rounding) is that share of a 1-2.5 GiB peak.
    ("gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer", SMALL_GPT, 1024, 32,
     dict(tp=1, pp=1, dp=8, micro_batch_size=4), 2691792384, 0.03),
    ("gpt3_mcore_te_tp2_pp2_resume_torch_dist", SMALL_GPT, 1024, 32,
     dict(tp=2, pp=2, dp=2, micro_batch_size=4, zero_stage=0, sequence_parallel=False), 1428171264,
     0.05),
    ("gpt3_mcore_te_tp4_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce_param_gather", SMALL_GPT, 1024,
     32, dict(tp=4, pp=1, dp=2, micro_batch_size=4, sequence_parallel=False), 1041940992, 0.08),
    ("gpt3_mcore_te_tp2_pp2_cp2", SMALL_GPT, 1024, 32,
     dict(tp=2, pp=2, dp=1, cp=2, micro_batch_size=4, zero_stage=0, sequence_parallel=True, tp_comm_overlap=False),
     935253504, 0.06),
    # materialized attention: its scores dominate the peak, and the workspaces are a smaller share
    ("gpt3_mcore_te_tp1_pp1_dist_optimizer_fim_dataset", UNFUSED, 1024, 32,
     dict(tp=1, pp=1, dp=8, micro_batch_size=4), 4702430720, 0.03),
    ("gpt3_mcore_te_tp1_pp4_vp1", UNFUSED, 1024, 32,
     dict(tp=1, pp=4, dp=2, vpp=3, schedule="interleaved", micro_batch_size=4, zero_stage=0), 4161191424, 0.03),
    ("gpt3_mcore_te_tp4_pp1_dist_optimizer_overlap_grad_reduce_param_gather", UNFUSED, 1024, 32,
     dict(tp=4, pp=1, dp=2, micro_batch_size=4, sequence_parallel=False), 1543416320, 0.05),
    ("gpt3_mcore_tp1_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce_param_gather", UNFUSED, 1024, 32,
     dict(tp=1, pp=1, dp=8, micro_batch_size=4), 4608815616, 0.03),
    ("gpt3_mcore_tp1_pp2", UNFUSED, 1024, 32, dict(tp=1, pp=2, dp=4, micro_batch_size=4, zero_stage=0), 3633177600,
     0.03),
    ("gpt3_mcore_tp1_pp4", UNFUSED, 1024, 32, dict(tp=1, pp=4, dp=2, micro_batch_size=4, zero_stage=0), 2746575872,
     0.04),
    ("gpt3_mcore_tp4_pp1_resume_torch", UNFUSED, 1024, 32,
     dict(tp=4, pp=1, dp=2, micro_batch_size=4, zero_stage=0, sequence_parallel=False), 1598662656, 0.03),
]


@pytest.mark.parametrize("case,model,seq,gbs,plan,measured,tol", ROWS, ids=[r[0][:48] for r in ROWS])
def test_last_stage_peak_matches_megatron_max_memory_allocated(case, model, seq, gbs, plan, measured, tol):
    # every one of these cases runs --no-gradient-accumulation-fusion and Megatron's default learned
    # absolute position embeddings of --max-position-embeddings rows (the sequence length)
    training = {"seq_len": seq, "global_batch_size": gbs, "gradient_accumulation_fusion": False}
    if isinstance(model, tuple):
        model, training["flash_attention"] = model[1], False
    model = {**model, "learned_position_embeddings": seq}
    problem = load_problem({"model": model, "training": training,
                            "cluster": {"gpu": "h100", "num_gpus": 8}, "framework": "megatron"})
    est = evaluate(problem, Plan(zero_stage=plan.pop("zero_stage", 1), **plan))
    assert est.fits, est.reasons  # every one of them ran
    last = next(s for s in est.stages if s.has_lm_head)
    ours = last.peak_memory_gib * GIB
    assert ours == pytest.approx(measured, rel=tol), (case, ours / GIB, measured / GIB)
    # never above what the allocator measured by more than noise; the --transformer-impl local row (no
    # TE linear layers, fp16) is priced with TE's GEMM workspace, which that run never allocates (+1.7%)
    assert ours <= measured * 1.02


# --- Megatron-LM functional tests as converted from their arguments (validation/megatron_functional_memory.json,
# autoshard.validate.megatron_args; benchmarks/bench_megatron_memory.py prints the same figures) ---

FUNCTIONAL = json.loads(validation_file("megatron_functional_memory.json").read_text())["cases"]
BY_NAME = {c["case"]: c for c in FUNCTIONAL}


def _functional(case: dict, **training) -> tuple:
    problem, plan = problem_and_plan(case["args"], 8, "h100")
    problem["training"].update(training)
    prob = load_problem(problem)
    est = evaluate(prob, Plan(**plan))
    return prob, Plan(**plan), est


def _last_peak_bytes(est) -> float:
    return next(s for s in est.stages if s.has_lm_head).peak_memory_gib * GIB


def test_functional_cases_convert_from_their_arguments():
    """Megatron's own defaults read from the arguments: the GPT-2 BPE vocabulary (50,257) padded to a
    multiple of 128 x TP, the SwiGLU width int(8h/3 / 64) x 64, dropout 0.1 unless both are set to 0."""
    tp2 = problem_and_plan(BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist"]["args"], 8, "h100")
    assert tp2[0]["model"]["vocab_size"] == 50432 and tp2[1]["dp"] == 2 and tp2[1]["zero_stage"] == 0
    tp4 = problem_and_plan(BY_NAME["gpt3_mcore_te_tp4_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce"]["args"],
                           8, "h100")
    assert tp4[0]["model"]["vocab_size"] == 50688 and tp4[1]["zero_stage"] == 1
    swiglu = problem_and_plan(BY_NAME["gpt3_mcore_te_tp1_pp4_resume_torch_dist_swiglu"]["args"], 8, "h100")[0]["model"]
    assert (swiglu["intermediate_size"], swiglu["hidden_act"]) == (1344, "silu")
    cp = problem_and_plan(BY_NAME["gpt3_mcore_te_tp2_pp2_cp2"]["args"], 8, "h100")
    assert cp[0]["model"]["dropout"] is False and cp[1]["cp"] == 2 and cp[1]["sequence_parallel"] is True
    fp8 = problem_and_plan(BY_NAME["gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"]["args"],
                           8, "h100")
    assert fp8[0]["training"]["precision"] == "fp8-current" and fp8[0]["training"]["fp8_params"]
    assert fp8[1]["tp_comm_overlap"] is True


def test_fused_cross_entropy_holds_one_more_fp32_copy_of_the_logits():
    """--cross-entropy-loss-fusion (megatron/core/fusions/fused_cross_entropy.py, torch.compile'd): 4 more
    bytes per logit at the loss. By hand for TP 2, micro-batch 4 x 1,024 tokens, vocabulary 50,432 / 2:
    4 x 4,096 x 25,216 = 413,138,944 B; the two functional-test cases that differ only in the flag measured
    1,837,640,192 - 1,428,171,264 = 409,468,928 B apart."""
    plain = BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist"]
    fused = BY_NAME["gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion"]
    _, _, e_plain = _functional(plain)
    prob, plan, e_fused = _functional(fused)
    assert prob.training.cross_entropy_fusion
    by_hand = 4 * 4096 * 25216
    assert _last_peak_bytes(e_fused) - _last_peak_bytes(e_plain) == pytest.approx(by_hand)
    measured = fused["measured_peak_bytes"] - plain["measured_peak_bytes"]
    assert by_hand == pytest.approx(measured, rel=0.015)
    assert _last_peak_bytes(e_fused) == pytest.approx(fused["measured_peak_bytes"], rel=0.03)


def test_deferred_embedding_wgrad_keeps_the_deferred_gradients():
    """--defer-embedding-wgrad-compute --wgrad-deferral-limit 2 (tensor_parallel/layers.py): the first two
    micro-batches' bf16 logit gradients [4,096 x 25,216] and output-layer inputs [4,096 x 512] stay until the
    step's end, beside the loss of the third: 2 x 2 x 4,096 x (25,216 + 512) = 421,527,552 B by hand (the
    functional tests measured 466,747,392 B over the same run without the flag)."""
    plain = BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist"]
    defer = BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist_defer_embedding_wgrad_compute"]
    _, _, e_plain = _functional(plain)
    prob, _, e_defer = _functional(defer, gradient_accumulation_fusion=False)  # (the plain run's: no dummy wgrads)
    assert (prob.training.defer_embedding_wgrad, prob.training.wgrad_deferral_limit) == (True, 2)
    by_hand = 2 * 2 * 4096 * (25216 + 512)
    assert _last_peak_bytes(e_defer) - _last_peak_bytes(e_plain) == pytest.approx(by_hand)
    # limit 0 (Megatron's default): every micro-batch deferred, M - 1 = 3 of them beside the last loss
    _, _, e_all = _functional(defer, wgrad_deferral_limit=0, gradient_accumulation_fusion=False)
    assert _last_peak_bytes(e_all) - _last_peak_bytes(e_plain) == pytest.approx(3 * 2 * 4096 * (25216 + 512))
    _, _, e_defer = _functional(defer)  # as it ran: with the fusion, its dummy wgrads too
    assert _last_peak_bytes(e_defer) == pytest.approx(defer["measured_peak_bytes"], rel=0.04)


def test_gradient_accumulation_fusion_keeps_te_dummy_wgrads():
    """--gradient-accumulation-fusion (Megatron's default): Transformer Engine's get_dummy_wgrad caches one
    bf16 tensor per distinct weight shape for the whole run. The last stage of TP 2 x PP 2 (hidden 512,
    ffn 2048, 6 layers, tied output layer): the output layer [25,216 x 512] and the layer's qkv
    [768 x 512], proj [512 x 256], fc1 [1,024 x 512] and fc2 [512 x 1,024], by hand 2 x (12,910,592 +
    1,572,864) = 28,966,912 B (the layer norms' 1,024 B beside). Measured: the one functional case with
    the fusion on holds 545,423,872 B between iterations (golden_values mem-allocated-bytes), its twin
    without it 517,243,392 B: 28,180,480 B more."""
    defer = BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist_defer_embedding_wgrad_compute"]
    prob, _, fused = _functional(defer)
    assert prob.training.gradient_accumulation_fusion
    _, _, plain = _functional(defer, gradient_accumulation_fusion=False)
    by_hand = 2 * (25216 * 512 + 768 * 512 + 512 * 256 + 1024 * 512 + 512 * 1024)
    extra = [(a.peak_memory_gib - b.peak_memory_gib) * GIB for a, b in zip(fused.stages, plain.stages)]
    assert extra[1] == pytest.approx(by_hand, rel=1e-3)  # the last stage: the output layer's and a layer's
    assert extra[0] == pytest.approx(by_hand - 2 * 25216 * 512, rel=1e-3)  # the first: its layers' only
    assert extra[1] == pytest.approx(545_423_872 - 517_243_392, rel=0.03)
    # the cases that state --no-gradient-accumulation-fusion read so, and the export writes it back
    case = BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist"]
    problem, plan = problem_and_plan(case["args"], 8, "h100")
    assert problem["training"]["gradient_accumulation_fusion"] is False
    flags = export_plan(load_problem(problem), Plan(**plan), "megatron").text
    assert "--no-gradient-accumulation-fusion" in flags
    # not Megatron's: no dummies; LoRA: frozen weights have no weight gradient
    titan = {"model": SMALL_GPT, "framework": "torchtitan", "cluster": {"gpu": "h100", "num_gpus": 8},
             "training": {"seq_len": 1024, "global_batch_size": 32}}
    lora = {**problem, "training": {**problem["training"], "finetune": "lora", "lora_rank": 8}}
    for other, p in ((titan, Plan(tp=2, pp=1, dp=4, micro_batch_size=4, zero_stage=3)), (lora, Plan(**plan))):
        on = evaluate(load_problem({**other, "training": {**other["training"], "gradient_accumulation_fusion": True}}), p)
        off = evaluate(load_problem({**other, "training": {**other["training"], "gradient_accumulation_fusion": False}}), p)
        assert on.stages and [s.peak_memory_gib for s in on.stages] == [s.peak_memory_gib for s in off.stages]


def test_learned_position_embeddings_on_the_first_stage():
    """Megatron's default --position-embedding-type learned_absolute: a torch.nn.Embedding of
    --max-position-embeddings rows, whole on every TP rank, on the first stage only: 1,024 x 512 =
    524,288 parameters at 2 + 4 + 12 B (bf16 weight, fp32 main grad, fp32 master and Adam moments without
    the distributed optimizer) = 9,437,184 B on the embedding's stage. --position-embedding-type rope: none."""
    case = BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist"]
    problem, plan = problem_and_plan(case["args"], 8, "h100")
    assert problem["model"]["learned_position_embeddings"] == 1024
    with_table = evaluate(load_problem(problem), Plan(**plan))
    problem["model"]["learned_position_embeddings"] = 0
    without = evaluate(load_problem(problem), Plan(**plan))
    deltas = [(a.peak_memory_gib - b.peak_memory_gib) * GIB for a, b in zip(with_table.stages, without.stages)]
    assert deltas == pytest.approx([524_288 * 18, 0.0])
    rope = BY_NAME["gpt3_mcore_te_tp1_pp2_resume_torch_dist_rope_embeddings"]
    assert "learned_position_embeddings" not in problem_and_plan(rope["args"], 8, "h100")[0]["model"]
    # the export states the table it priced: learned with its rows, else rotary
    problem["model"]["learned_position_embeddings"] = 1024
    flags = export_plan(load_problem(problem), Plan(**plan), "megatron").text
    assert "--max-position-embeddings 1024" in flags and "--position-embedding-type" not in flags
    problem["model"]["learned_position_embeddings"] = 0
    assert "--position-embedding-type rope" in export_plan(load_problem(problem), Plan(**plan), "megatron").text


def test_cublas_workspaces_per_thread_and_userbuffers():
    """PyTorch's cuBLAS workspace per (handle, stream), a handle per thread: the forward's and autograd's
    (2 x 32 MiB on sm90, CUBLAS_WORKSPACE_CONFIG :4096:8 as the functional tests set it), TE's one GEMM
    workspace (32 MiB + 1 KiB), and with TE userbuffers (--tp-comm-overlap) get_cublas_workspace(ub=True):
    3 x (32 MiB + 1 KiB). The two FP8 functional tests differ in --tp-comm-overlap; the one with it
    measured its after-step allocation (mem-allocated-bytes, workspaces included) 94 MiB higher than its
    static price would say beside the other's."""
    fp8 = BY_NAME["gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap"]
    prob, plan, est = _functional(fp8)
    ctx = context(prob)
    assert cublas_workspace_bytes(ctx) == 2 * 32 * 2**20 + 32 * 2**20 + 1024
    assert cublas_workspace_bytes(ctx, tp_overlap=True) == 2 * 32 * 2**20 + 4 * (32 * 2**20 + 1024)
    problem, plan_d = problem_and_plan(fp8["args"], 8, "h100")  # the same run without the overlap
    off = evaluate(load_problem(problem), Plan(**{**plan_d, "tp_comm_overlap": False}))
    assert _last_peak_bytes(est) - _last_peak_bytes(off) == pytest.approx(3 * (32 * 2**20 + 1024))
    assert _last_peak_bytes(est) == pytest.approx(fp8["measured_peak_bytes"], rel=0.03)


def test_every_converted_functional_case_within_reach():
    """All converted cases: median |error| <= 1.0%, every one within 3%, none predicted not to fit (every one
    ran). Before the terms priced here: median 3.5%, p90 8.9%, 27 within 3%, worst -27.7%; before the learned
    position table and TE's dummy wgrads: median 1.0%, p90 2.2%, 55 within 3%, worst -3.2%."""
    errs, fits = [], []
    for case in FUNCTIONAL:
        problem, plan = problem_and_plan(case["args"], 8, "h100")
        est = evaluate(load_problem(problem), Plan(**plan))
        if not est.stages:  # Megatron's --microbatch-group-size-per-virtual-pipeline-stage 5 with pp 4
            assert "not a multiple of pp" in " ".join(est.reasons)
            continue
        errs.append(_last_peak_bytes(est) / case["measured_peak_bytes"] - 1)
        fits.append(est.fits)
    assert len(errs) >= 58 and all(fits)
    assert statistics.median(abs(e) for e in errs) <= 0.01
    assert -0.03 <= min(errs) and max(errs) <= 0.03


def test_loss_knobs_are_megatron_only_and_exported():
    base = {"model": SMALL_GPT, "training": {"seq_len": 1024, "global_batch_size": 32, "cross_entropy_fusion": True,
                                            "defer_embedding_wgrad": True, "wgrad_deferral_limit": 2},
            "cluster": {"gpu": "h100", "num_gpus": 8}}
    plan = Plan(tp=2, pp=2, dp=2, micro_batch_size=4)
    est = evaluate(load_problem({**base, "framework": "torchtitan"}), plan)
    assert not est.fits and any("cross_entropy_fusion" in r for r in est.reasons)
    assert any("defer_embedding_wgrad" in r for r in est.reasons)
    pp1 = evaluate(load_problem({**base, "framework": "megatron"}), Plan(tp=2, pp=1, dp=4, micro_batch_size=4))
    assert any("pipeline parallelism" in r for r in pp1.reasons)
    flags = export_plan(load_problem({**base, "framework": "megatron"}), plan, "megatron").text
    assert "--cross-entropy-loss-fusion" in flags and "--defer-embedding-wgrad-compute" in flags
    assert "--wgrad-deferral-limit 2" in flags


def test_dataloader_attention_masks_on_the_loading_ranks():
    """Megatron's data loader builds a [4, 1, 1024, 1024] bool causal mask per micro-batch (4,194,304 B);
    two of them are priced on the first and last stages: 8,388,608 B. The functional-test pair with and
    without --no-create-attention-mask-in-dataloader measured 7,864,320 B apart."""
    with_mask = BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist"]
    without = BY_NAME["gpt3_mcore_te_tp2_pp2_resume_torch_dist_no_create_attention_mask_in_dataloader"]
    prob, _, e_with = _functional(with_mask)
    prob_without, _, e_without = _functional(without)
    assert prob.training.attention_mask_in_batch and not prob_without.training.attention_mask_in_batch
    by_hand = 2 * 4 * 1024 * 1024
    for s_with, s_without in zip(e_with.stages, e_without.stages):  # both stages load data, pp 2
        assert (s_with.peak_memory_gib - s_without.peak_memory_gib) * GIB == pytest.approx(by_hand)
    measured = with_mask["measured_peak_bytes"] - without["measured_peak_bytes"]
    assert by_hand == pytest.approx(measured, rel=0.07)
    pp4 = evaluate(load_problem({"model": SMALL_GPT, "framework": "megatron", "cluster": {"gpu": "h100", "num_gpus": 8},
                                 "training": {"seq_len": 1024, "global_batch_size": 32, "attention_mask_in_batch": True}}),
                   Plan(tp=1, pp=4, dp=2, micro_batch_size=4))
    plain = evaluate(load_problem({"model": SMALL_GPT, "framework": "megatron", "cluster": {"gpu": "h100", "num_gpus": 8},
                                   "training": {"seq_len": 1024, "global_batch_size": 32}}),
                     Plan(tp=1, pp=4, dp=2, micro_batch_size=4))
    deltas = [(a.peak_memory_gib - b.peak_memory_gib) * GIB for a, b in zip(pp4.stages, plain.stages)]
    assert deltas == pytest.approx([by_hand, 0, 0, by_hand])  # the middle stages load no data
    flags = export_plan(load_problem({"model": SMALL_GPT, "framework": "megatron", "cluster": {"gpu": "h100", "num_gpus": 8},
                                      "training": {"seq_len": 1024, "global_batch_size": 32}}),
                        Plan(tp=1, pp=4, dp=2, micro_batch_size=4), "megatron").text
    assert "--no-create-attention-mask-in-dataloader" in flags


def test_qk_layernorm_keeps_the_normalized_query_and_key():
    """--qk-layernorm: per layer the normalized q and k in bf16 plus two fp32 statistics per (token, head):
    TP 4 of 8 heads and 8 KV heads, head dim 64, 4,096 tokens: (2 x 64 + 8) x 4,096 x (2 + 2) = 2,228,224 B,
    twelve layers of one micro-batch in flight at PP 1."""
    case = BY_NAME["gpt3_mcore_te_tp4_pp1_resume_torch_dist_qk_layernorm_test_mode"]
    prob, _, with_norm = _functional(case)
    assert prob.model.qk_layernorm
    problem, plan = problem_and_plan(case["args"], 8, "h100")
    problem["model"]["qk_layernorm"] = False
    without = evaluate(load_problem(problem), Plan(**plan))
    assert (with_norm.stages[0].memory_gib["activations"] - without.stages[0].memory_gib["activations"]) * GIB == \
        pytest.approx(12 * 2_228_224)
    assert _last_peak_bytes(with_norm) == pytest.approx(case["measured_peak_bytes"], rel=0.035)


def test_interleaved_in_flight_chunks_follow_megatrons_order():
    """Megatron's interleaved 1F1B on PP 4 x VPP 2 with 4 micro-batches: the last rank runs
    (4 - 3 - 1) x 2 + (2 - 1) x 4 = 4 warm-up forwards, all of its first chunk, then one forward of its
    second chunk before each backward of it: (4, 0) and (4, 1) in flight. Rank 0's 10 warm-up forwards
    exceed the 8 it runs: all of them. With --account-for-embedding/loss-in-pipeline-split (6 layers: the
    last rank's first chunk one layer, its second the loss alone) the peak is 4 layers' activations, where
    an even share of the rank's chunks would say 2.5 (measured: -12.9% -> within 1%)."""
    assert interleaved_windows(4, 2, 3, 4) == ((4, 0), (4, 1))
    assert interleaved_windows(4, 2, 0, 4) == ((4, 4),)
    case = BY_NAME["gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split"]
    _, plan, est = _functional(case)
    assert plan.stage_layers == [0, 1, 1, 1, 1, 1, 1, 0] and plan.vpp == 2
    last = next(s for s in est.stages if s.has_lm_head)
    assert interleaved_windows(4, 2, 1, 4) == ((4, 4),)  # rank 1: 8 forwards of one layer each in flight
    layer_act = est.stages[1].memory_gib["activations"] / 8
    assert 4 * layer_act <= last.memory_gib["activations"] <= 4.1 * layer_act  # 4 layers and the head's input
    assert _last_peak_bytes(est) == pytest.approx(case["measured_peak_bytes"], rel=0.01)


def _windows_every_step(pp: int, vpp: int, rank: int, microbatches: int) -> tuple[tuple[int, ...], ...]:
    """`interleaved_windows` stepping through every step of the schedule (no period shortcut)."""
    total = microbatches * vpp
    warm = min(total, (pp - rank - 1) * 2 + (vpp - 1) * pp)
    counts = [0] * vpp
    for k in range(warm):
        counts[(k % (pp * vpp)) // pp] += 1
    seen = {tuple(counts)}
    for j in range(total - warm):
        counts[((warm + j) % (pp * vpp)) // pp] += 1
        seen.add(tuple(counts))
        counts[vpp - 1 - (j % (pp * vpp)) // pp] -= 1
    return tuple(sorted(seen))


def test_interleaved_windows_one_period_is_every_step():
    """`interleaved_windows` simulates one period (pp x vpp steps) of the steady state: the same
    distinct in-flight vectors as stepping through every micro-batch, for every rank of pipelines
    from 2 to 16 stages, 2 to 8 chunks and 1 to 200 micro-batches (the 405B plans' 4,096 took
    seconds per configuration stepped through)."""
    import random

    rng = random.Random(30)
    for _ in range(300):
        pp, vpp = rng.choice([2, 3, 4, 8, 16]), rng.randint(2, 8)
        m = rng.choice([1, 2, pp, 2 * pp + 1, rng.randint(1, 200)])
        rank = rng.randrange(pp)
        assert interleaved_windows(pp, vpp, rank, m) == _windows_every_step(pp, vpp, rank, m), (pp, vpp, rank, m)

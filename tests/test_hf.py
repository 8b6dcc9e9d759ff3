"""Golden tests of `autoshard.hf`: real Hugging Face config.json files -> ModelSpec.

The files under tests/data/hf/ reproduce the official config.json files (fields and
values as listed in ECOSYSTEM.md section 2). Parameter counts are computed from the
ModelSpec by `param_count` below and compared with the published totals.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard.errors import InputError
from autoshard.hf import model_from_hf_config, read_hf_config, rope_parameters
from autoshard.spec import ModelSpec

DATA = Path(__file__).parent / "data" / "hf"


def load(name: str) -> ModelSpec:
    return model_from_hf_config(DATA / f"{name}.json")


def param_count(m: ModelSpec, *, qkv_bias: bool = False, qk_norm: bool = False) -> int:
    """Total parameters of a Llama/Qwen/Mixtral/DeepSeek-style decoder (RMSNorm, no other biases)."""
    h, heads = m.hidden_size, m.num_attention_heads
    if m.is_mla:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = h * heads * qk if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        kv += m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        attn = q + kv + heads * m.v_head_dim * h
    else:
        d, kv_heads = m.head_size, m.kv_heads
        attn = 2 * h * heads * d + 2 * h * kv_heads * d
        attn += (heads + 2 * kv_heads) * d if qkv_bias else 0
        attn += 2 * d if qk_norm else 0
    mats = 3 if m.gated else 2
    dense = mats * h * m.intermediate_size
    moe = (m.num_experts + m.num_shared_experts) * mats * h * m.expert_ffn + h * m.num_experts
    layers = sum(attn + 2 * h + (dense if kind == "dense" else moe) for kind in m.layer_kinds())
    return layers + m.vocab_size * h * (1 if m.tie_word_embeddings else 2) + h


def active_param_count(m: ModelSpec, **kw) -> int:
    """Parameters touched per token: routed experts counted top-k times instead of num_experts."""
    if not m.is_moe:
        return param_count(m, **kw)
    mats = 3 if m.gated else 2
    idle = (m.num_experts - m.num_experts_per_tok) * mats * m.hidden_size * m.expert_ffn
    return param_count(m, **kw) - m.num_moe_layers * idle


# ---- golden files -----------------------------------------------------------------------------

def test_llama3_8b():
    m = load("Meta-Llama-3-8B")
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size) == (32, 4096, 14336)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (32, 8, 128)
    assert m.vocab_size == 128256 and m.tie_word_embeddings is False
    assert m.hidden_act == "silu" and m.gated and not m.dropout
    assert not m.is_moe and not m.is_mla
    assert m.name == "Meta-Llama-3-8B"
    assert m.source == f"hf config.json: {DATA / 'Meta-Llama-3-8B.json'}"
    # embed + head + 32 x (4096*4096*2 + 4096*1024*2 + 3*4096*14336 + 2*4096) + final norm
    assert param_count(m) == 8_030_261_248


def test_llama3_70b():
    m = load("Meta-Llama-3-70B")
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size) == (80, 8192, 28672)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (64, 8, 128)
    assert m.vocab_size == 128256 and not m.tie_word_embeddings
    assert param_count(m) == 70_553_706_496
    assert param_count(m) == pytest.approx(70.55e9, rel=1e-3)


def test_llama31_405b_rope_scaling_llama3():
    path = DATA / "Llama-3.1-405B-Instruct.json"
    m = model_from_hf_config(path)
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size) == (126, 16384, 53248)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (128, 8, 128)
    assert m.vocab_size == 128256 and not m.tie_word_embeddings
    assert param_count(m) == pytest.approx(405.85e9, rel=1e-3)
    rope = rope_parameters(path)
    assert rope == {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192, "rope_type": "llama3", "rope_theta": 500000.0}
    assert "note" not in (m.source or "")


def test_llama31_405b_early_copy_with_16_kv_heads_is_read_and_flagged():
    cfg = read_hf_config(DATA / "Llama-3.1-405B-Instruct.json") | {"num_key_value_heads": 16}
    m = model_from_hf_config(cfg)
    assert m.num_key_value_heads == 16  # the file is read as written ...
    assert "8 KV heads" in m.source  # ... and the known pitfall is stated


def test_transformers_v5_rope_parameters_and_dtype_spelling():
    cfg = read_hf_config(DATA / "Llama-3.1-405B-Instruct.json")
    scaling = cfg.pop("rope_scaling")
    cfg["rope_parameters"] = {**scaling, "rope_theta": cfg.pop("rope_theta")}
    cfg["dtype"] = cfg.pop("torch_dtype")
    assert model_from_hf_config(cfg) == model_from_hf_config(DATA / "Llama-3.1-405B-Instruct.json").model_copy(
        update={"source": "hf config.json: custom", "name": "custom"})
    assert rope_parameters(cfg)["rope_type"] == "llama3"
    assert rope_parameters(cfg)["rope_theta"] == 500000.0


def test_mixtral_8x7b_every_layer_moe_expert_ffn_is_intermediate_size():
    m = load("Mixtral-8x7B-v0.1")
    assert (m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads) == (32, 4096, 32, 8)
    assert m.head_dim == 128 and m.vocab_size == 32000 and not m.tie_word_embeddings
    assert (m.num_experts, m.num_experts_per_tok) == (8, 2)
    assert m.moe_intermediate_size == 14336 and m.expert_ffn == 14336
    assert m.num_shared_experts == 0 and m.first_k_dense_replace == 0
    assert m.layer_kinds() == ["moe"] * 32
    assert param_count(m) == 46_702_792_704
    assert active_param_count(m) == pytest.approx(12.9e9, rel=5e-3)


def test_deepseek_v3_moe_and_mla():
    m = load("DeepSeek-V3")
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size) == (61, 7168, 18432)
    assert (m.num_attention_heads, m.num_key_value_heads) == (128, 128)
    assert m.vocab_size == 129280 and not m.tie_word_embeddings
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (256, 8, 2048)
    assert (m.num_shared_experts, m.first_k_dense_replace) == (1, 3)
    assert m.layer_kinds() == ["dense"] * 3 + ["moe"] * 58
    assert (m.q_lora_rank, m.kv_lora_rank) == (1536, 512)
    assert (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (128, 64, 128)
    assert m.is_mla and m.head_dim is None and m.head_size == 192
    # DeepSeek README_WEIGHTS: 671B main-model parameters (MTP module excluded), 37B activated.
    # (The helper leaves out the 58 x 256 router score-correction biases.)
    assert param_count(m) == pytest.approx(671e9, rel=2e-3)
    assert active_param_count(m) == pytest.approx(37e9, rel=2e-2)
    assert rope_parameters(DATA / "DeepSeek-V3.json")["rope_type"] == "yarn"


def test_deepseek_v3_written_by_transformers_with_head_dim_keeps_mla_head_size():
    cfg = read_hf_config(DATA / "DeepSeek-V3.json") | {"head_dim": 64}
    m = model_from_hf_config(cfg)
    assert m.head_dim is None and m.head_size == 192


def test_deepseek_v2_lite_without_q_lora():
    cfg = read_hf_config(DATA / "DeepSeek-V3.json") | {
        "model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "first_k_dense_replace": 1,
        "q_lora_rank": None, "vocab_size": 102400, "n_group": 1, "topk_group": 1}
    m = model_from_hf_config(cfg)
    assert m.q_lora_rank is None and m.kv_lora_rank == 512
    assert (m.num_experts, m.num_shared_experts, m.first_k_dense_replace) == (64, 2, 1)
    assert param_count(m) == pytest.approx(15.7e9, rel=1e-2)  # DeepSeek-V2-Lite: 15.7B total


def test_qwen3_30b_a3b():
    m = load("Qwen3-30B-A3B")
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size) == (48, 2048, 6144)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (32, 4, 128)
    assert m.vocab_size == 151936 and not m.tie_word_embeddings
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (128, 8, 768)
    assert (m.num_shared_experts, m.first_k_dense_replace) == (0, 0)
    # Qwen3 model card: 30.5B total, 3.3B activated.
    assert param_count(m, qk_norm=True) == pytest.approx(30.5e9, rel=5e-3)
    assert active_param_count(m, qk_norm=True) == pytest.approx(3.3e9, rel=2e-2)


def test_qwen3_head_dim_is_explicit_not_hidden_over_heads():
    cfg = read_hf_config(DATA / "Qwen3-30B-A3B.json")
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64
    assert model_from_hf_config(cfg).head_dim == 128


def test_qwen2_7b():
    m = load("Qwen2-7B")
    assert (m.num_hidden_layers, m.hidden_size, m.intermediate_size) == (28, 3584, 18944)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (28, 4, 128)
    assert m.vocab_size == 152064 and m.tie_word_embeddings is False
    assert not m.dropout  # attention_dropout 0.0
    assert param_count(m, qkv_bias=True) == 7_615_616_512


def test_qwen2_moe_shared_expert_from_width():
    m = load("Qwen1.5-MoE-A2.7B")
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (60, 4, 1408)
    assert m.num_shared_experts == 4  # 5632 / 1408
    assert m.intermediate_size == 5632 and m.first_k_dense_replace == 0
    assert "note" not in m.source
    assert param_count(m, qkv_bias=True) == pytest.approx(14.3e9, rel=5e-3)


def test_qwen_moe_leading_mlp_only_layers_map_to_first_k_dense_replace():
    cfg = read_hf_config(DATA / "Qwen3-30B-A3B.json") | {"mlp_only_layers": [0, 1]}
    m = model_from_hf_config(cfg)
    assert m.first_k_dense_replace == 2 and "note" not in m.source


def test_qwen_moe_interleaved_dense_layers_are_approximated_and_noted():
    cfg = read_hf_config(DATA / "Qwen3-30B-A3B.json") | {"mlp_only_layers": [5, 40]}
    m = model_from_hf_config(cfg)
    assert m.first_k_dense_replace == 2
    assert "approximated as the first 2" in m.source
    m = model_from_hf_config(read_hf_config(DATA / "Qwen3-30B-A3B.json") | {"decoder_sparse_step": 2})
    assert m.first_k_dense_replace == 24 and m.num_moe_layers == 24 and "note" in m.source


def test_shared_expert_width_not_a_multiple_is_read_exactly():
    cfg = read_hf_config(DATA / "Qwen1.5-MoE-A2.7B.json") | {"shared_expert_intermediate_size": 2000}
    m = model_from_hf_config(cfg)
    assert (m.num_shared_experts, m.shared_expert_intermediate_size, m.shared_ffn) == (1, 2000, 2000)
    assert "note" not in m.source
    # Nemotron-H spelling (NemotronHConfig.moe_shared_expert_intermediate_size), with a count of 1
    cfg = read_hf_config(DATA / "Qwen1.5-MoE-A2.7B.json") | {"shared_expert_intermediate_size": None,
                                                               "moe_shared_expert_intermediate_size": 3712,
                                                               "n_shared_experts": 1}
    assert model_from_hf_config(cfg).shared_ffn == 3712


def test_deepseek_v3_mtp_depth_is_read():
    assert load("DeepSeek-V3").num_nextn_predict_layers == 1  # config.json num_nextn_predict_layers
    assert load("Qwen3-30B-A3B").num_nextn_predict_layers == 0


def test_gpt2_style_fields():
    m = load("gpt2")
    assert (m.num_hidden_layers, m.hidden_size, m.num_attention_heads) == (12, 768, 12)
    assert m.intermediate_size == 4 * 768  # n_inner absent
    assert m.num_key_value_heads == 12 and m.head_dim == 64
    assert m.vocab_size == 50257 and m.tie_word_embeddings is True  # GPT-2 ties by default
    assert m.hidden_act == "gelu_new" and not m.gated
    assert m.dropout is True  # resid_pdrop / attn_pdrop 0.1
    # GPT2Model.wpe = nn.Embedding(n_positions, n_embd): 1,024 x 768 = 786,432 learned position parameters
    assert m.learned_position_embeddings == 1024
    assert load("Meta-Llama-3-8B").learned_position_embeddings == 0  # rotary: max_position_embeddings is no table


def test_opt_position_table_has_its_offset_of_two():
    cfg = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768, "ffn_dim": 3072,
           "num_attention_heads": 12, "num_hidden_layers": 12, "vocab_size": 50272, "max_position_embeddings": 2048,
           "activation_function": "relu", "word_embed_proj_dim": 768}
    assert model_from_hf_config(cfg).learned_position_embeddings == 2050  # OPTLearnedPositionalEmbedding(2048 + 2)


def test_gpt_neox_style():
    cfg = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_act": "gelu",
           "hidden_size": 6144, "intermediate_size": 24576, "num_attention_heads": 64, "num_hidden_layers": 44,
           "vocab_size": 50432, "tie_word_embeddings": False, "hidden_dropout": 0.0, "attention_dropout": 0.0,
           "rotary_pct": 0.25, "use_parallel_residual": True, "_name_or_path": "EleutherAI/gpt-neox-20b"}
    m = model_from_hf_config(cfg)
    assert m.name == "EleutherAI/gpt-neox-20b" and m.hidden_act == "gelu" and not m.dropout
    assert m.num_key_value_heads == 64 and m.head_dim == 96


def test_nulls_mean_defaults_and_text_config_is_used():
    text = read_hf_config(DATA / "Meta-Llama-3-8B.json") | {"num_key_value_heads": None, "head_dim": None}
    wrapper = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
               "_name_or_path": "llava-hf/llava-v1.6-llama3-8b", "text_config": text,
               "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024}}
    m = model_from_hf_config(wrapper)
    assert m.name == "llava-hf/llava-v1.6-llama3-8b"
    assert m.num_key_value_heads == 32 and m.head_dim == 128  # MHA, hidden / heads
    assert m.hidden_size == 4096


def test_tie_default_per_family_and_wrapper_level_flag():
    cfg = read_hf_config(DATA / "Meta-Llama-3-8B.json")
    del cfg["tie_word_embeddings"]
    assert model_from_hf_config(cfg).tie_word_embeddings is False  # LlamaConfig default
    wrapper = {"model_type": "gemma3", "tie_word_embeddings": True, "text_config": cfg}
    assert model_from_hf_config(wrapper).tie_word_embeddings is True


def test_name_from_folder_and_folder_path(tmp_path):
    folder = tmp_path / "My-Model"
    folder.mkdir()
    (folder / "config.json").write_text((DATA / "Qwen2-7B.json").read_text())
    for arg in (folder, folder / "config.json", str(folder)):
        m = model_from_hf_config(arg)
        assert m.name == "My-Model" and m.source == f"hf config.json: {folder / 'config.json'}"


def test_local_name_or_path_is_shortened():
    cfg = read_hf_config(DATA / "Qwen2-7B.json") | {"_name_or_path": "/data/ckpt/qwen2-7b-sft/"}
    assert model_from_hf_config(cfg).name == "qwen2-7b-sft"


@pytest.mark.parametrize("act, expected", [("silu", "silu"), ("swish", "silu"), ("gelu", "gelu"),
                                           ("gelu_new", "gelu_new"), ("gelu_pytorch_tanh", "gelu_pytorch_tanh"),
                                           ("relu", "relu"), ("relu2", "relu2"), ("swiglu", "swiglu")])
def test_activation_mapping(act, expected):
    cfg = read_hf_config(DATA / "Qwen2-7B.json") | {"hidden_act": act}
    assert model_from_hf_config(cfg).hidden_act == expected


def test_problem_with_hf_config_loads():
    from autoshard.loader import load_problem

    problem = load_problem({"model": {"hf_config": str(DATA / "Meta-Llama-3-8B.json")},
                            "training": {"seq_len": 4096, "global_batch_size": 64},
                            "cluster": {"gpu": "h100", "num_gpus": 8}})
    assert problem.model == load("Meta-Llama-3-8B")
    assert problem.model.source.startswith("hf config.json: ")


def test_problem_hf_config_overrides_and_error_attribution(tmp_path):
    from autoshard.loader import load_problem

    base = {"training": {"seq_len": 4096, "global_batch_size": 64}, "cluster": {"gpu": "h100", "num_gpus": 8}}
    problem = load_problem(base | {"model": {"hf_config": str(DATA / "Qwen2-7B.json"), "vocab_size": 152000}})
    assert problem.model.vocab_size == 152000
    missing = tmp_path / "nope" / "config.json"
    with pytest.raises(InputError) as exc:
        load_problem(base | {"model": {"hf_config": str(missing)}})
    assert str(missing) in str(exc.value)


# ---- errors -----------------------------------------------------------------------------------

def one_line_error(arg) -> str:
    with pytest.raises(InputError) as exc:
        model_from_hf_config(arg)
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_bert_is_rejected():
    text = one_line_error(DATA / "bert-base-uncased.json")
    assert "bert-base-uncased.json" in text and "model_type" in text
    assert "not a decoder-only language model (model_type 'bert')" in text


def test_t5_is_rejected():
    text = one_line_error(DATA / "t5-base.json")
    assert "t5-base.json" in text and "model_type" in text
    assert "not a decoder-only language model (model_type 't5')" in text


def test_encoder_decoder_flag_and_classification_heads_are_rejected():
    cfg = read_hf_config(DATA / "Meta-Llama-3-8B.json")
    assert "is_encoder_decoder" in one_line_error(cfg | {"is_encoder_decoder": True})
    text = one_line_error(cfg | {"architectures": ["LlamaForSequenceClassification"]})
    assert "architectures" in text and "LlamaForSequenceClassification" in text
    assert "model_type 'whisper'" in one_line_error({"model_type": "whisper", "d_model": 1280})


def test_missing_hidden_size(tmp_path):
    cfg = read_hf_config(DATA / "Meta-Llama-3-8B.json")
    del cfg["hidden_size"]
    path = tmp_path / "broken-config.json"
    path.write_text(json.dumps(cfg))
    text = one_line_error(path)
    assert text.startswith(f"{path}: hidden_size: required field is missing")


def test_missing_field_inside_text_config_names_the_nested_path():
    text = read_hf_config(DATA / "Meta-Llama-3-8B.json")
    del text["vocab_size"]
    assert "text_config.vocab_size: required field is missing" in one_line_error({"text_config": text})


def test_invalid_json_names_file_and_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 4096,\n  "num_hidden_layers": 32\n  "vocab_size": 1\n}\n')
    text = one_line_error(path)
    assert str(path) in text and "line 4" in text


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "latin1-config.json"
    path.write_bytes('{"model_type": "llama", "name": "caf\u00e9"}'.encode("latin-1"))
    text = one_line_error(path)
    assert "latin1-config.json" in text and "not UTF-8" in text


def test_missing_file_not_an_object_and_wrong_type(tmp_path):
    assert "no such file" in one_line_error(tmp_path / "absent.json")
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    assert "list.json" in one_line_error(path) and "JSON object" in one_line_error(path)
    assert "model.hf_config" in one_line_error(42)


@pytest.mark.parametrize("key, value, fragment", [
    ("hidden_size", 0, "hidden_size: must be a positive integer, got 0"),
    ("num_hidden_layers", -3, "num_hidden_layers: must be a positive integer, got -3"),
    ("intermediate_size", "big", "intermediate_size: must be an integer"),
    ("num_key_value_heads", 5, "num_key_value_heads: must divide num_attention_heads (32), got 5"),
    ("hidden_act", "mish", "hidden_act: unknown activation 'mish'"),
    ("tie_word_embeddings", "no", "tie_word_embeddings: must be true or false"),
])
def test_bad_values_name_the_field(tmp_path, key, value, fragment):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(read_hf_config(DATA / "Meta-Llama-3-8B.json") | {key: value}))
    text = one_line_error(path)
    assert text.startswith(f"{path}: ") and fragment in text


def test_gpt2_spelling_is_named_in_errors():
    gpt2 = read_hf_config(DATA / "gpt2.json")
    assert "n_layer: must be a positive integer, got 0" in one_line_error(gpt2 | {"n_layer": 0})
    text = one_line_error(read_hf_config(DATA / "gpt2.json") | {"n_head": 7})
    assert "head_dim: missing, and hidden_size (768) is not divisible by num_attention_heads (7)" in text


def test_moe_errors():
    cfg = read_hf_config(DATA / "Mixtral-8x7B-v0.1.json")
    assert "num_experts_per_tok: must be at most the number of experts (8), got 9" in one_line_error(
        cfg | {"num_experts_per_tok": 9})
    del cfg["num_experts_per_tok"]
    assert "num_experts_per_tok: required for a mixture-of-experts config (num_local_experts = 8)" in \
        one_line_error(cfg)
    qwen = read_hf_config(DATA / "Qwen3-30B-A3B.json")
    assert "mlp_only_layers: layer index 48 outside 0..47" in one_line_error(qwen | {"mlp_only_layers": [48]})
    dsv3 = read_hf_config(DATA / "DeepSeek-V3.json")
    del dsv3["v_head_dim"]
    assert "v_head_dim: required for multi-head latent attention" in one_line_error(dsv3)


def test_sliding_window_layers_from_the_config():
    # gpt-oss: layer_types alternate; Gemma 3: one global layer in 6; Gemma 2: alternating; Mistral:
    # every layer; Qwen2/3 write a window but use_sliding_window false.
    from autoshard.hf import model_from_hf_config

    base = {"num_hidden_layers": 12, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 32000,
            "intermediate_size": 8192, "sliding_window": 1024}
    assert model_from_hf_config({**base, "model_type": "gpt_oss",
                                 "layer_types": ["sliding_attention", "full_attention"] * 6}).sliding_window_layers == 0.5
    assert model_from_hf_config({**base, "model_type": "gemma3_text", "sliding_window_pattern": 6}).sliding_window_layers \
        == pytest.approx(5 / 6)
    assert model_from_hf_config({**base, "model_type": "gemma2"}).sliding_window_layers == 0.5
    mistral = model_from_hf_config({**base, "model_type": "mistral"})
    assert (mistral.sliding_window, mistral.sliding_window_layers) == (1024, 1.0)
    # gpt-oss experts carry biases (GptOssExperts gate_up_proj_bias / down_proj_bias); Mistral's none.
    assert model_from_hf_config({**base, "model_type": "gpt_oss"}).expert_bias and not mistral.expert_bias
    assert model_from_hf_config({**base, "model_type": "qwen2", "use_sliding_window": False}).sliding_window is None
    assert model_from_hf_config({**base, "model_type": "llama", "sliding_window": None}).sliding_window is None
    with pytest.raises(Exception, match="sliding_window"):
        model_from_hf_config({**base, "model_type": "mistral", "sliding_window": "wide"})

"""Read a Hugging Face `config.json` into a `ModelSpec`.

Families: Llama (1/2/3/3.1, `rope_scaling` or `rope_parameters`), Mistral, Qwen2,
Qwen3 (explicit `head_dim`), Mixtral (`num_local_experts`, every layer MoE, expert
FFN = `intermediate_size`), Qwen2-MoE / Qwen3-MoE (`num_experts`,
`moe_intermediate_size`, `decoder_sparse_step`, `mlp_only_layers`,
`shared_expert_intermediate_size`, read exactly where it is no multiple of the expert
width), DeepSeek-V2/V3 (`n_routed_experts`, `n_shared_experts`, `first_k_dense_replace`,
`moe_layer_freq`, MLA dims, `num_nextn_predict_layers` MTP depths) and
GPT-2 / GPT-J / GPT-NeoX style (`n_layer`, `n_embd`, `n_head`, `n_inner`).
Multimodal wrappers are read through their `text_config`.

Field spellings are data (`ALIASES`); per-family defaults are data
(`TIED_BY_DEFAULT`, `FFN_4X_BY_DEFAULT`). Every problem is one `InputError`
line naming the file and the config field. Where the config cannot be expressed
exactly (interleaved dense/MoE layers) the approximation is stated in `ModelSpec.source`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .errors import InputError
from .fileio import read_json_file
from .spec import ModelSpec

MAX_CONFIG_BYTES = 16 * 2**20

# ModelSpec field -> config.json spellings, first found wins (a null counts as absent).
ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "head_dim": ("head_dim", "attention_head_dim"),
    # NemotronH states its MLP's activation apart (mlp_hidden_act relu2) from the Mamba mixer's
    "hidden_act": ("mlp_hidden_act", "hidden_act", "activation_function", "hidden_activation"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_top_k"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "num_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "first_k_dense_replace": ("first_k_dense_replace",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    # multi-token prediction depths (DeepSeek-V3 config.json; Megatron-Bridge writes mtp_num_layers)
    "num_nextn_predict_layers": ("num_nextn_predict_layers", "mtp_num_layers"),
    # hybrid Mamba2 / attention (NemotronHConfig: mamba_n_groups is written n_groups in config.json)
    "mamba_num_heads": ("mamba_num_heads",),
    "mamba_head_dim": ("mamba_head_dim",),
    "ssm_state_size": ("ssm_state_size", "mamba_state_dim"),
    "mamba_n_groups": ("n_groups", "mamba_n_groups"),
    "conv_kernel": ("conv_kernel", "mamba_d_conv"),
}
MAMBA_FIELDS = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "mamba_n_groups", "conv_kernel")
REQUIRED = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
MAY_BE_ZERO = frozenset({"num_experts", "num_experts_per_tok", "num_shared_experts", "first_k_dense_replace",
                         "num_nextn_predict_layers"})
# The shared experts' total width: Qwen2/3-MoE, and Nemotron-H / Nemotron 3 (NemotronH config).
SHARED_WIDTH_KEYS = ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")

# HF activation name -> ModelSpec.hidden_act.
ACTIVATIONS: dict[str, str] = {
    "silu": "silu", "swish": "silu", "swiglu": "swiglu",
    "gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_new", "gelu_fast": "gelu_new",
    "gelu_pytorch_tanh": "gelu_pytorch_tanh", "relu": "relu", "relu2": "relu2", "relu_squared": "relu2",
}
# Families whose MLP is gated although the activation is a GELU (GeGLU): priced as gated.
GATED_GELU_TYPES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
# Families whose config class ties the LM head to the embeddings unless told otherwise.
TIED_BY_DEFAULT = frozenset({"gpt2", "openai-gpt", "gpt_bigcode", "gpt_neo", "opt", "bloom", "falcon",
                             "gemma", "gemma2", "gemma3", "gemma3_text"})
# Families whose model adds a learned absolute position table beside the token embedding, and the rows
# it has beyond the config's count (transformers: GPT2Model, OpenAIGPTModel, GPTBigCodeModel and
# GPTNeoModel `wpe`/`positions_embed` = nn.Embedding(max_position_embeddings, hidden); OPT's
# OPTLearnedPositionalEmbedding(max_position_embeddings + 2), "OPT is set up so that if padding_idx is
# specified then offset the embedding ids by 2"). The count is config n_positions or max_position_embeddings.
LEARNED_POSITION_OFFSETS = {"gpt2": 0, "openai-gpt": 0, "gpt_bigcode": 0, "gpt_neo": 0, "opt": 2}
POSITION_KEYS = ("n_positions", "max_position_embeddings")
# Families whose missing / null FFN width means 4 x hidden.
FFN_4X_BY_DEFAULT = frozenset({"gpt2", "openai-gpt", "gpt_bigcode", "gptj", "gpt_neo", "codegen"})
DROPOUT_KEYS = ("resid_pdrop", "attn_pdrop", "embd_pdrop", "hidden_dropout", "attention_dropout",
                "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout")
# Multimodal wrappers keep the language model under one of these keys.
NESTED_KEYS = ("text_config", "llm_config", "language_config")

NOT_DECODER_TYPES = frozenset({
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2",
    "modernbert", "camembert", "mpnet", "t5", "mt5", "umt5", "longt5", "switch_transformers", "bart",
    "mbart", "pegasus", "marian", "led", "encoder-decoder", "whisper", "wav2vec2", "hubert",
    "speech_to_text", "vit", "deit", "beit", "swin", "convnext", "dinov2", "clip", "clip_text_model",
    "clip_vision_model", "siglip", "siglip_text_model", "siglip_vision_model", "sam", "detr",
})
NOT_DECODER_ARCHS = ("ForSequenceClassification", "ForTokenClassification", "ForMaskedLM",
                     "ForQuestionAnswering", "ForMultipleChoice", "ForNextSentencePrediction",
                     "ForImageClassification", "ForSeq2SeqLM", "ForSpeechSeq2Seq", "ForCTC",
                     "ForAudioClassification", "EncoderDecoderModel", "ForObjectDetection",
                     "ForSemanticSegmentation")


class _Reader:
    """A config dict plus where it came from, for one-line errors naming file and field."""

    def __init__(self, cfg: Mapping[str, Any], source: str | None, prefix: str = ""):
        self.cfg, self.source, self.prefix = cfg, source, prefix
        self.origin: dict[str, str] = {}  # ModelSpec field -> config key it was read from

    def error(self, message: str, key: str | None) -> InputError:
        return InputError(message, source=self.source, field=(self.prefix + key) if key else None)

    def raw(self, field: str) -> tuple[str | None, Any]:
        """(key, value) of the first non-null spelling of a ModelSpec field."""
        for key in ALIASES.get(field, (field,)):
            if self.cfg.get(key) is not None:
                self.origin[field] = key
                return key, self.cfg[key]
        return None, None

    def integer(self, field: str, *, required: bool = False) -> int | None:
        """A positive (or, for counts that may be zero, non-negative) integer field."""
        key, value = self.raw(field)
        if key is None:
            if required:
                others = [k for k in ALIASES.get(field, ()) if k != field]
                also = f" (also accepted: {', '.join(others)})" if others else ""
                raise self.error(f"required field is missing{also}", field)
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"must be an integer, got {value!r}", key)
        low = 0 if field in MAY_BE_ZERO else 1
        if value < low:
            raise self.error(f"must be {'>= 0' if low == 0 else 'a positive integer'}, got {value}", key)
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"must be true or false, got {value!r}", key)
        return value


# ---- reading ----------------------------------------------------------------------------

def read_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a config.json (or a model folder holding one) into a dict, or raise InputError."""
    p = Path(path)
    if p.is_dir() and (p / "config.json").is_file():
        p = p / "config.json"
    src = str(p)
    if not p.exists():
        raise InputError("no such file (expected a Hugging Face config.json)", source=src)
    if p.is_dir():
        raise InputError("is a directory without a config.json", source=src)
    # The bounded reader: regular files only (a FIFO or /dev/zero is refused before a read), the size
    # checked before reading; the strict parser: duplicate keys and nesting past MAX_DEPTH refused.
    data = read_json_file(p, MAX_CONFIG_BYTES, what="config.json")
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object of config fields, got a {type(data).__name__}", source=src)
    return data


def _language_part(cfg: Mapping[str, Any], src: str | None) -> tuple[Mapping[str, Any], str]:
    """The decoder's fields: a wrapper's `text_config` (or similar) if present, with its field prefix."""
    for key in NESTED_KEYS:
        sub = cfg.get(key)
        if sub is None:
            continue
        if not isinstance(sub, Mapping):
            raise InputError(f"must be an object of config fields, got {type(sub).__name__}", source=src, field=key)
        return sub, key + "."
    return cfg, ""


def _check_decoder_only(cfg: Mapping[str, Any], src: str | None, prefix: str = "") -> None:
    """Raise unless the config describes a decoder-only language model."""
    def reject(why: str, key: str) -> InputError:
        return InputError(f"not a decoder-only language model ({why})", source=src, field=prefix + key)

    mtype = cfg.get("model_type")
    if isinstance(mtype, str) and mtype.lower() in NOT_DECODER_TYPES:
        raise reject(f"model_type {mtype!r}", "model_type")
    if cfg.get("is_encoder_decoder") is True:
        raise reject("is_encoder_decoder is true", "is_encoder_decoder")
    archs = cfg.get("architectures")
    for arch in archs if isinstance(archs, list) else []:
        if isinstance(arch, str) and any(tag in arch for tag in NOT_DECODER_ARCHS):
            raise reject(f"architectures {arch!r}", "architectures")


# ---- field groups -------------------------------------------------------------------------

def _learned_positions(r: _Reader, model_type: str) -> int | None:
    """Rows of the learned position table of a family that has one (LEARNED_POSITION_OFFSETS); None where
    the config states no count."""
    key = next((k for k in POSITION_KEYS if r.cfg.get(k) is not None), None)
    if key is None:
        return None
    value = r.cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise r.error(f"must be a positive integer, got {value!r}", key)
    return value + LEARNED_POSITION_OFFSETS[model_type]


def _activation(r: _Reader, model_type: str) -> tuple[str, list[str]]:
    key, value = r.raw("hidden_act")
    if key is None:
        return "silu", []
    act = ACTIVATIONS.get(str(value).lower()) if isinstance(value, str) else None
    if act is None:
        raise r.error(f"unknown activation {value!r} (valid: {', '.join(sorted(ACTIVATIONS))})", key)
    if model_type in GATED_GELU_TYPES and act.startswith("gelu"):
        return "swiglu", [f"gated {value} MLP (GeGLU) priced as swiglu"]
    return act, []


def _attention(r: _Reader, hidden: int, heads: int) -> dict[str, Any]:
    """Heads, KV heads, head_dim and the MLA dims."""
    out: dict[str, Any] = {f: r.integer(f) for f in MLA_FIELDS}
    kv = r.integer("num_key_value_heads")
    if kv is None and r.cfg.get("multi_query") is True:  # GPT-BigCode / Falcon-7B
        kv = 1
    out["num_key_value_heads"] = kv or heads
    head_dim = r.integer("head_dim")
    if out["kv_lora_rank"] is not None:
        head_dim = None  # MLA: qk = nope + rope, v = v_head_dim (transformers may write head_dim = rope)
    elif head_dim is None:
        if hidden % heads:
            raise r.error(f"missing, and hidden_size ({hidden}) is not divisible by "
                          f"num_attention_heads ({heads})", "head_dim")
        head_dim = hidden // heads
    out["head_dim"] = head_dim
    return out


def _sliding_window(r: _Reader, layers: int, model_type: str) -> dict[str, Any]:
    """sliding_window and the share of layers using it: `layer_types` (transformers >= 4.53: gpt-oss,
    Gemma 3, Qwen3-Next), else `sliding_window_pattern` (Gemma 3: one global layer in N), Gemma 2's
    alternation, else every layer (Mistral); none where `use_sliding_window` is false (Qwen2/3)."""
    cfg = r.cfg
    types = _layer_types(r, layers)
    window = cfg.get("sliding_window")
    if window is None or cfg.get("use_sliding_window") is False:
        return {}
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise r.error(f"must be a positive integer or null, got {window!r}", "sliding_window")
    if types:
        n = sum(1 for t in types if str(t) == "sliding_attention")
        return {"sliding_window": window, "sliding_window_layers": n / len(types)} if n else {}
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 1:
        return {"sliding_window": window, "sliding_window_layers": (pattern - 1) / pattern}
    if model_type == "gemma2":  # local and global layers alternate (modeling_gemma2: layer_idx % 2 == 0)
        return {"sliding_window": window, "sliding_window_layers": 0.5}
    return {"sliding_window": window}


# Layer types the cost model prices (transformers' configuration_utils.ALLOWED_LAYER_TYPES also has
# chunked_attention, linear_attention and others: attention of another cost, refused rather than
# priced as full attention).
PRICED_LAYER_TYPES = ("full_attention", "sliding_attention")
TRANSFORMERS_LAYER_TYPES = ("chunked_attention", "linear_attention")
# chunked_attention is priced where the config states its chunk (Llama 4 attention_chunk_size: _chunked_attention)
CHUNKED_LAYER_TYPE = "chunked_attention"


def _layer_types(r: _Reader, layers: int) -> list[str]:
    """`layer_types` checked as transformers' layer_type_validation does, and more strictly: a list
    of one known string per layer (num_hidden_layers of them); [] when absent."""
    types = r.cfg.get("layer_types")
    if types is None:
        return []
    if not isinstance(types, list):
        raise r.error(f"must be a list of one layer type per layer, got a {type(types).__name__} "
                      f"({str(types)[:40]!r})", "layer_types")
    if len(types) != layers:
        raise r.error(f"has {len(types)} entries for num_hidden_layers ({layers}): give one layer type per layer",
                      "layer_types")
    priced = PRICED_LAYER_TYPES + ((CHUNKED_LAYER_TYPE,) if r.cfg.get("attention_chunk_size") is not None else ())
    for i, t in enumerate(types):
        if t in priced:
            continue
        why = "is an attention autoshard does not price" if t in TRANSFORMERS_LAYER_TYPES else "is not a layer type"
        raise r.error(f"{t!r} {why} (valid: {', '.join(priced)})", f"layer_types.{i}")
    return types


def _chunked_attention(r: _Reader, layers: int) -> dict[str, Any]:
    """Llama 4's chunked attention: `attention_chunk_size` on the RoPE layers, global attention on the
    NoPE layers (`no_rope_layers`: 1 = RoPE, 0 = NoPE, per layer; missing: transformers' Llama4TextConfig
    rule, every `no_rope_layer_interval`-th layer NoPE, 4 by default)."""
    chunk = _positive_opt(r, "attention_chunk_size")
    if chunk is None:
        return {}
    types = r.cfg.get("layer_types")
    if isinstance(types, list) and CHUNKED_LAYER_TYPE in types:  # transformers' layer_types (checked by _layer_types)
        n = types.count(CHUNKED_LAYER_TYPE)
        return {"attention_chunk_size": chunk, "chunked_attention_layers": n / len(types)}
    flags = r.cfg.get("no_rope_layers")
    if flags is None:
        every = _positive_opt(r, "no_rope_layer_interval") or 4
        flags = [int((i + 1) % every != 0) for i in range(layers)]
    if not isinstance(flags, list) or len(flags) < layers or any(f not in (0, 1) or isinstance(f, bool)
                                                                 for f in flags[:layers]):
        raise r.error(f"must be a list of 0 (NoPE) / 1 (RoPE) per layer, {layers} at least", "no_rope_layers")
    n = sum(flags[:layers])
    return {"attention_chunk_size": chunk, "chunked_attention_layers": n / layers} if n else {}


def _int_list(r: _Reader, key: str, layers: int) -> list[int]:
    value = r.cfg.get(key) or []
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise r.error(f"must be a list of layer indices, got {value!r}", key)
    bad = [i for i in value if not 0 <= i < layers]
    if bad:
        raise r.error(f"layer index {bad[0]} outside 0..{layers - 1}", key)
    return value


def _moe_layer_mask(r: _Reader, layers: int) -> list[bool]:
    """Which layers are MoE, by the DeepSeek (first_k_dense_replace, moe_layer_freq) and
    Qwen-MoE (decoder_sparse_step, mlp_only_layers) rules; Mixtral: every layer."""
    first_k = r.integer("first_k_dense_replace") or 0
    freq = _positive_opt(r, "moe_layer_freq") or 1
    step = _positive_opt(r, "decoder_sparse_step") or 1
    dense_only = set(_int_list(r, "mlp_only_layers", layers))
    return [i >= first_k and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
            for i in range(layers)]


def _positive_opt(r: _Reader, key: str) -> int | None:
    value = r.cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise r.error(f"must be a positive integer, got {value!r}", key)
    return value


def _moe(r: _Reader, layers: int, ffn: int) -> tuple[dict[str, Any], list[str]]:
    """Expert count, top-k, expert FFN, shared experts and first_k_dense_replace."""
    experts = r.integer("num_experts") or 0
    if not experts:
        return {}, []
    top_k = r.integer("num_experts_per_tok")
    if not top_k:
        raise r.error(f"required for a mixture-of-experts config ({r.origin['num_experts']} = {experts})",
                      "num_experts_per_tok")
    expert_ffn = r.integer("moe_intermediate_size") or ffn  # Mixtral: intermediate_size is per expert
    out = {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": expert_ffn}
    notes: list[str] = []
    shared, width = _shared_experts(r, expert_ffn)
    out["num_shared_experts"] = shared
    if width is not None:
        out["shared_expert_intermediate_size"] = width
    notes += _group_limited_routing(r)
    mask = _moe_layer_mask(r, layers)
    dense = mask.count(False)
    out["first_k_dense_replace"] = dense
    if mask != [False] * dense + [True] * (layers - dense):
        idx = [i for i, m in enumerate(mask) if not m]
        notes.append(f"{dense} dense layers at {idx[:8]}{'...' if len(idx) > 8 else ''} "
                     f"approximated as the first {dense}")
    return out, notes


def _group_limited_routing(r: _Reader) -> list[str]:
    """DeepSeek's `n_group` / `topk_group` (Megatron --moe-router-num-groups / --moe-router-group-topk):
    the experts form n_group equal groups and a token's experts lie in its topk_group best groups. What
    a group is on the hardware depends on where the plan places the experts: Megatron-LM's
    --moe-router-num-groups help (megatron/training/arguments.py) names n_group = the EP size (device-limited routing, DeepSeek-V2) and n_group = the nodes of the EP group
    (node-limited, DeepSeek-V3), and the config says neither. So the config sets no
    `moe_max_nodes_per_token` (the priced bound, in nodes); a note says the routing is limited."""
    groups, top = r.cfg.get("n_group"), r.cfg.get("topk_group")
    if not isinstance(groups, int) or not isinstance(top, int) or isinstance(groups, bool) or isinstance(top, bool):
        return []
    if not 0 < top < groups:
        return []
    return [f"group-limited routing (n_group {groups}, topk_group {top}) not priced: its groups are devices or "
            "nodes as the plan places the experts; where a group is a node, set model.moe_max_nodes_per_token"]


def _shared_experts(r: _Reader, expert_ffn: int) -> tuple[int, int | None]:
    """(num_shared_experts, shared_expert_intermediate_size or None): DeepSeek's `n_shared_experts`
    (each of the expert width, unless a total width is also given), or the shared MLP's total width
    (Qwen2-MoE `shared_expert_intermediate_size`, Nemotron-H `moe_shared_expert_intermediate_size`): a
    multiple of the expert width as that many experts, any other width as one expert of that width."""
    count = r.integer("num_shared_experts")
    key = next((k for k in SHARED_WIDTH_KEYS if r.cfg.get(k) is not None), None)
    width = r.cfg.get(key) if key else None
    if width is None:
        return count or 0, None
    if isinstance(width, bool) or not isinstance(width, int) or width < 0:
        raise r.error(f"must be a non-negative integer, got {width!r}", key)
    if width == 0 or count == 0:
        return 0, None
    if count is None and width % expert_ffn == 0:
        return width // expert_ffn, None
    if count is not None and width == count * expert_ffn:
        return count, None
    return count or 1, width


def _hybrid(r: _Reader, layers: int) -> dict[str, Any]:
    """A hybrid Mamba2 / attention model's block pattern (`hybrid_override_pattern`: M Mamba2, *
    attention, - MLP, E MoE; NemotronH) and its Mamba2 dimensions; {} without a pattern."""
    pattern = r.cfg.get("hybrid_override_pattern")
    if pattern is None:
        return {}
    if not isinstance(pattern, str) or not pattern or set(pattern) - set("M*-E"):
        raise r.error(f"must be a string of M (Mamba2), * (attention), - (MLP), E (MoE), got {pattern!r}",
                      "hybrid_override_pattern")
    if len(pattern) != layers:
        raise r.error(f"has {len(pattern)} blocks but num_hidden_layers is {layers}", "hybrid_override_pattern")
    out: dict[str, Any] = {"hybrid_override_pattern": pattern}
    out.update({f: v for f in MAMBA_FIELDS if (v := r.integer(f)) is not None})
    return out


def _dropout(cfg: Mapping[str, Any]) -> bool:
    return any(isinstance(cfg.get(k), (int, float)) and not isinstance(cfg.get(k), bool) and cfg[k] > 0
               for k in DROPOUT_KEYS)


def _name(cfg: Mapping[str, Any], outer: Mapping[str, Any], path: Path | None) -> str:
    """`_name_or_path` (a local path shortened to its last part), else the file's stem or folder."""
    for c in (outer, cfg):
        value = c.get("_name_or_path")
        if isinstance(value, str) and value.strip():
            value = value.strip().rstrip("/\\")
            local = value.startswith(("/", ".", "~")) or "\\" in value or value.count("/") > 1
            return Path(value).name if local else value
    if path is None:
        return "custom"
    return path.parent.name if path.stem == "config" and path.parent.name else path.stem


def _notes_for_known_pitfalls(spec: dict[str, Any]) -> list[str]:
    if (spec["num_hidden_layers"], spec["hidden_size"], spec["num_key_value_heads"]) == (126, 16384, 16):
        return ["Llama-3.1-405B has 8 KV heads; early copies of its config.json say 16"]
    return []


# ---- entry point ----------------------------------------------------------------------------

def model_from_hf_config(path_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> ModelSpec:
    """A `ModelSpec` from a Hugging Face config.json path (or model folder) or a parsed dict.

    Raises `InputError` (one line naming the file and the field) for anything that is
    not a readable decoder-only language model config.
    """
    if isinstance(path_or_dict, Mapping):
        outer, path, src = path_or_dict, None, None
    elif isinstance(path_or_dict, (str, os.PathLike)):
        outer = read_hf_config(path_or_dict)
        path = Path(path_or_dict)
        path = path / "config.json" if path.is_dir() else path
        src = str(path)
    else:
        raise InputError(f"must be a path to a config.json or a mapping, got {type(path_or_dict).__name__}",
                         field="model.hf_config")
    _check_decoder_only(outer, src)
    cfg, prefix = _language_part(outer, src)
    if prefix:
        _check_decoder_only(cfg, src, prefix)
    return _build(_Reader(cfg, src, prefix), outer, path)


def _build(r: _Reader, outer: Mapping[str, Any], path: Path | None) -> ModelSpec:
    cfg = r.cfg
    mtype = str(cfg.get("model_type") or outer.get("model_type") or "").lower()
    spec: dict[str, Any] = {f: r.integer(f, required=True) for f in REQUIRED}
    hidden, layers = spec["hidden_size"], spec["num_hidden_layers"]
    ffn = r.integer("intermediate_size", required=mtype not in FFN_4X_BY_DEFAULT)
    spec["intermediate_size"] = ffn or 4 * hidden
    spec.update(_attention(r, hidden, spec["num_attention_heads"]))
    spec.update(_sliding_window(r, layers, mtype))
    spec.update(_chunked_attention(r, layers))
    if mtype == "gpt_oss":  # GptOssExperts: gate_up_proj_bias and down_proj_bias on every expert
        spec["expert_bias"] = True
    spec["hidden_act"], notes = _activation(r, mtype)
    moe, moe_notes = _moe(r, layers, spec["intermediate_size"])
    hybrid = _hybrid(r, layers)
    if hybrid and moe:  # the pattern places the MoE blocks (E); no leading dense layers
        moe["first_k_dense_replace"] = 0
        moe_notes = [n for n in moe_notes if "dense layers at" not in n]
    spec.update(moe)
    spec.update(hybrid)
    notes += moe_notes + _notes_for_known_pitfalls(spec)
    tie_default = mtype in TIED_BY_DEFAULT
    spec["tie_word_embeddings"] = r.flag("tie_word_embeddings", _outer_flag(outer, r, tie_default))
    spec["num_nextn_predict_layers"] = r.integer("num_nextn_predict_layers") or 0
    if mtype in LEARNED_POSITION_OFFSETS:
        spec["learned_position_embeddings"] = _learned_positions(r, mtype)
    spec["model_type"] = mtype or None  # the family, for the exports' facts (never the model's name)
    theta = rope_parameters(outer).get("rope_theta")
    if isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0:
        spec["rope_theta"] = float(theta)
    spec["dropout"] = _dropout(cfg)
    spec["name"] = _name(cfg, outer, path)
    where = str(path) if path is not None else spec["name"]
    spec["source"] = f"hf config.json: {where}" + "".join(f"; note: {n}" for n in notes)
    _check_consistency(r, spec)
    try:
        return ModelSpec(**{k: v for k, v in spec.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        field = str(err["loc"][0]) if err["loc"] else next((f for f in ALIASES if f in msg), None)
        raise r.error(msg, r.origin.get(field, field) if field else None) from None


def _check_consistency(r: _Reader, spec: dict[str, Any]) -> None:
    """Cross-field checks, reported against the config key that has to change."""
    heads, kv = spec["num_attention_heads"], spec["num_key_value_heads"]
    if heads % kv:
        raise r.error(f"must divide num_attention_heads ({heads}), got {kv}",
                      r.origin.get("num_key_value_heads", "num_key_value_heads"))
    experts, top_k = spec.get("num_experts", 0), spec.get("num_experts_per_tok", 0)
    if experts and top_k > experts:
        raise r.error(f"must be at most the number of experts ({experts}), got {top_k}",
                      r.origin["num_experts_per_tok"])
    given = [f for f in MLA_FIELDS[1:] if spec.get(f) is not None]
    if given and len(given) < len(MLA_FIELDS) - 1:
        missing = next(f for f in MLA_FIELDS[1:] if spec.get(f) is None)
        raise r.error(f"required for multi-head latent attention (given: {', '.join(given)})", missing)


def _outer_flag(outer: Mapping[str, Any], r: _Reader, default: bool) -> bool:
    """A wrapper's top-level `tie_word_embeddings` applies when its text_config has none."""
    if outer is r.cfg or outer.get("tie_word_embeddings") is None:
        return default
    return _Reader(outer, r.source).flag("tie_word_embeddings", default)


def rope_parameters(path_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """RoPE settings as one dict (`rope_theta`, `rope_type`, scaling keys) from either the
    transformers v5 `rope_parameters` or the legacy `rope_theta` + `rope_scaling` spelling."""
    outer = path_or_dict if isinstance(path_or_dict, Mapping) else read_hf_config(path_or_dict)
    cfg, _ = _language_part(outer, None)
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping):
        out = dict(params)
    else:
        out = dict(cfg.get("rope_scaling") or {})
        if cfg.get("rope_theta") is not None:
            out["rope_theta"] = cfg["rope_theta"]
    if "type" in out and "rope_type" not in out:
        out["rope_type"] = out.pop("type")
    out.setdefault("rope_type", "default")
    return out

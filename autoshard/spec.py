"""The three inputs and the plan: what (model, training), where (cluster), how (plan).

Every schema rejects unknown fields and names its units. A `Problem` is what
`load_problem` returns; a `Plan` is what `evaluate` prices and `solve` returns.
Model fields are spelled as in Hugging Face config.json.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import AfterValidator, BaseModel, Discriminator, Tag, ConfigDict, Field, ValidationInfo, field_validator, model_validator

# Training precisions as run (autoshard/data/precisions.yaml): 16-bit, FP8 recipes (`fp8` is the
# frameworks' default recipe, delayed scaling), MXFP8 and NVFP4. Which GPU runs which: gpus.yaml.
Precision = Literal["bf16", "fp16", "fp8", "fp8-delayed", "fp8-current", "fp8-rowwise", "fp8-blockwise", "mxfp8",
                    "nvfp4"]
Schedule = Literal["gpipe", "1f1b", "interleaved", "zero_bubble", "dualpipe", "dualpipev"]
Framework = Literal["megatron", "torchtitan", "automodel", "deepspeed", "maxtext", "deepseek"]
# allgather: Megatron's MoEAllGatherTokenDispatcher (--moe-token-dispatcher-type allgather), every rank
# gathers the hidden states of its TP x EP group instead of an all-to-all of the routed copies.
Dispatcher = Literal["alltoall", "deepep", "hybridep", "allgather"]
# Per-layer CUDA graph capture regions (Megatron --cuda-graph-impl transformer_engine | local with
# --cuda-graph-scope / --cuda-graph-modules: megatron/core/transformer/enums.py CudaGraphModule at
# d98e8a64dd); `layer` is the whole transformer layer (Megatron's empty module list, formerly "full").
GraphScope = Literal["layer", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]
GRAPH_SCOPES: tuple[str, ...] = ("layer", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
# Megatron-Core's --recompute-modules (recompute_granularity selective): each re-runs part of a layer's
# forward in its backward to drop the activations that part keeps. `selective` is core_attn alone.
# `mlp_up` is no Megatron module: the dense MLP's input projection(s) (fc1; gate and up) and activation
# re-run, fc2 not, which is what a JAX remat policy that saves neither re-runs, since no backward needs
# fc2's output and XLA removes its recomputation (MaxText 'mlpwi' / 'mlpwi_0' / 'mlpwi_1' at 'remat';
# Praxis SAVE_QKV_OUT_PROJ); Megatron's `mlp` re-runs the whole MLP forward (CheckpointWithoutOutput).
RECOMPUTE_MODULES = ("core_attn", "mlp", "mlp_up", "moe", "moe_act", "layernorm", "mla_up_proj", "shared_experts")


def canonical_recompute(value: str) -> str:
    """`none`, `selective`, `full`, or Megatron recompute modules joined by `+` (`layernorm+moe_act`),
    in RECOMPUTE_MODULES order; `core_attn` alone is `selective`."""
    text = value.strip().lower()
    if text in ("none", "selective", "full", "offload"):  # offload: activations to host memory
        return text
    mods = [m.strip() for m in text.replace(",", "+").split("+") if m.strip()]
    bad = [m for m in mods if m not in RECOMPUTE_MODULES]
    if bad or not mods:
        raise ValueError(f"unknown recompute {value!r}: use none, selective, full, offload, or modules joined by '+' "
                         f"from {', '.join(RECOMPUTE_MODULES)}")
    mods = sorted(set(mods), key=RECOMPUTE_MODULES.index)
    return "selective" if mods == ["core_attn"] else "+".join(mods)


Recompute = Annotated[str, AfterValidator(canonical_recompute)]
# One mode for every layer, or one per layer (the member is picked by the input's shape, so an error
# names the layer: `recompute.3`).
RecomputeChoice = Annotated[
    Union[Annotated[Recompute, Tag("str")], Annotated[list[Recompute], Tag("list[str]")]],
    Discriminator(lambda v: "list[str]" if isinstance(v, list) else "str")]
Optimizer = Literal["adam", "adamw", "sgd"]
# Module classes of a transformer layer whose linear GEMMs a low-precision recipe may keep in BF16
# (`TrainingSpec.bf16_modules`); the router and the output layer stay 16-bit in every recipe.
ModuleClass = Literal["attention", "dense_mlp", "routed_experts", "shared_experts", "mamba"]
MODULE_CLASSES: tuple[str, ...] = ("attention", "dense_mlp", "routed_experts", "shared_experts", "mamba")
# Hybrid models (Nemotron-H, Nemotron 3; HF / Megatron hybrid_override_pattern): one block per character,
# M a Mamba2 mixer, * an attention block, - a dense MLP block, E an MoE block (each with its norm).
HYBRID_KINDS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe_mlp"}
HiddenAct = Literal["silu", "swiglu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "relu2"]

SCHEDULES: tuple[Schedule, ...] = ("1f1b", "interleaved", "zero_bubble", "gpipe", "dualpipe", "dualpipev")
# Schedules `evaluate` prices but the solver does not plan: two stages per rank (DualPipe's mirror,
# DualPipeV's V), a layout its CP-SAT stage model and bounds do not have
UNPLANNABLE_SCHEDULES: tuple[Schedule, ...] = ("dualpipe", "dualpipev")
RECOMPUTES: tuple[str, ...] = ("none", "selective", "full")  # the modes searched by default


def mode_order(modes: list[str]) -> list[str]:
    """The distinct modes of a per-layer list: none, selective, full first, then modules as they come."""
    return [m for m in RECOMPUTES if m in modes] + [m for m in dict.fromkeys(modes) if m not in RECOMPUTES]
DEFAULT_GAP_LIMIT = 1e-3  # relative gap under which a solve counts as OPTIMAL (0.1%, far below the model's error)
# The solver's budget in deterministic work units (CP-SAT deterministic time plus counted Python work,
# about a second of one core each: `solver.search`), and the wall-clock safety net, sized far above
# what that budget takes on a loaded 2-core machine so that it never decides an answer (docs/solver.md).
DEFAULT_WORK_LIMIT = 100.0  # (40 units of CP-SAT time alone before Python work counted: DeepSeek-V3 on 256 GPUs spends ~29 in Python)
DEFAULT_TIME_LIMIT_S = 600.0
MESH_AXES: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_PLACEMENT = "tp-cp-ep-dp-pp"
GATED_ACTS = frozenset({"silu", "swiglu"})

# Absurdity guards: far beyond any real model or cluster, small enough to catch typos.
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20
MAX_GPUS = 1 << 20
MAX_SEQ = 1 << 24

Count = Annotated[int, Field(ge=1)]
# A parallel degree (tp, pp, dp, cp, ep, etp): at least 1 and at most MAX_GPUS, the largest cluster a
# problem may declare (a larger degree could never divide its GPUs); the library refuses
# `Plan(tp=2**70)` as the command line does, rather than pricing a number no integer model holds.
Degree = Annotated[int, Field(ge=1, le=MAX_GPUS)]
# Virtual stages per pipeline rank: each holds at least one layer, so at most MAX_LAYERS.
VirtualStages = Annotated[int, Field(ge=1, le=MAX_LAYERS)]
# Sequences per micro-batch: at most the largest global batch (TrainingSpec.global_batch_size).
MAX_GLOBAL_BATCH = 1 << 24
MicroBatch = Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH)]

# The range policy of every efficiency factor (a GPU's `efficiency` in gpus.yaml and in a calibrated
# catalog overlay: `matmul.<dtype>`, `hbm`, `scaleup`, `scaleout`; a topology level's `efficiency`):
# an achieved fraction of a peak, so finite and in [EFFICIENCY_FLOOR, 1]. The floor, 1e-3, is 100x
# below the lowest figure any measurement gives (NCCL over a congested fabric, ~0.1) and keeps every
# time the solver turns into integers sane: a 1e-300 factor would make a 300-digit step time, or
# overflow CP-SAT's 64-bit integers. NaN, infinity, 0, negatives and values above 1 are bad input.
EFFICIENCY_FLOOR = 1e-3
EfficiencyFactor = Annotated[float, Field(ge=EFFICIENCY_FLOOR, le=1.0, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads `true` as 1: `num_gpus: true` would plan for one GPU.
        if (isinstance(v, bool) or (isinstance(v, list) and any(isinstance(x, bool) for x in v))) \
                and not _takes_bool(cls, info.field_name):
            raise ValueError(f"expected a number, not true/false (got {v!r})")
        return v


@functools.cache
def _takes_bool(cls: type[BaseModel], field: str | None) -> bool:
    """Whether a field may hold true/false: it accepts bool, or is not a number at all."""
    def kinds(ann: Any) -> set[str]:
        if ann is bool:
            return {"bool"}
        if ann in (int, float) or (isinstance(ann, int) and not isinstance(ann, bool)):
            return {"number"}  # int, float, or a Literal of ints
        return set().union(*(kinds(a) for a in get_args(ann))) if get_args(ann) else set()
    info = cls.model_fields.get(field or "")
    found = kinds(info.annotation) if info is not None else {"bool"}
    return "bool" in found or "number" not in found


class ModelSpec(Strict):
    """A decoder-only transformer, fields named as in Hugging Face config.json."""

    name: str = Field(default="custom", description=(
        "Label of the model in reports (a preset's name when `model:` names one)."))
    model_type: str | None = Field(default=None, description=(
        "config.json's model_type (llama, mixtral, qwen3_moe, deepseek_v3, ...): the architecture family, "
        "which gives the exports the facts a shape does not carry (norms, router, QK norm); never read from "
        "the model's name. None: unknown (the exports say what they assume)."))
    rope_theta: Annotated[float, Field(gt=0)] | None = Field(default=None, description=(
        "Rotary base (config.json rope_theta, or rope_parameters.rope_theta); None: unknown or no RoPE."))
    num_hidden_layers: Annotated[int, Field(ge=1, le=MAX_LAYERS)] = Field(description="Transformer layers (blocks).")
    hidden_size: Annotated[int, Field(ge=1, le=MAX_WIDTH)] = Field(description=(
        "Model width: the residual stream's size."))
    intermediate_size: Annotated[int, Field(ge=1, le=8 * MAX_WIDTH)] = Field(description=(
        "Width of a dense layer's MLP (of each expert's too when `moe_intermediate_size` is not given)."))
    num_attention_heads: Annotated[int, Field(ge=1, le=65536)] = Field(description="Query heads per layer.")
    num_key_value_heads: Annotated[int, Field(ge=1, le=65536)] | None = Field(default=None, description=(
        "Key/value heads per layer (grouped-query attention); None: as many as the query heads."))
    vocab_size: Annotated[int, Field(ge=1, le=1 << 24)] = Field(description=(
        "Vocabulary size: the embedding's and the output layer's rows."))
    head_dim: Annotated[int, Field(ge=1, le=65536)] | None = Field(default=None, description=(
        "Size of one attention head; None: hidden_size / num_attention_heads."))
    tie_word_embeddings: bool = Field(default=False, description=(
        "The output layer shares the input embedding's weights."))
    # A learned absolute position-embedding table beside the token embedding (GPT-2/3 `wpe`, OPT, GPT-Neo;
    # Megatron-LM's default --position-embedding-type learned_absolute, a torch.nn.Embedding of
    # --max-position-embeddings rows, not split over TP: models/common/embeddings/
    # language_model_embedding.py, d98e8a64dd): its weights, gradients and optimizer states on the first
    # pipeline stage. 0: none (rotary, ALiBi, NoPE).
    learned_position_embeddings: Annotated[int, Field(ge=0, le=MAX_SEQ)] = Field(default=0, description=(
        "Rows of a learned absolute position-embedding table (GPT-2/3 and OPT style; Megatron "
        "--position-embedding-type learned_absolute with --max-position-embeddings rows): rows x hidden_size "
        "parameters on the first stage, replicated over TP. 0: none (rotary, ALiBi)."))
    hidden_act: HiddenAct = Field(default="silu", description=(
        "MLP activation; `silu` and `swiglu` are gated (three matrices), the others two."))
    # Mixture of experts (num_experts = 0: dense).
    num_experts: Annotated[int, Field(ge=0, le=65536)] = Field(default=0, description=(
        "Routed experts per MoE layer; 0: a dense model."))
    num_experts_per_tok: Annotated[int, Field(ge=0, le=65536)] = Field(default=0, description=(
        "Experts each token is routed to (top-k)."))
    moe_intermediate_size: Annotated[int, Field(ge=1, le=8 * MAX_WIDTH)] | None = Field(default=None, description=(
        "Width of one expert's MLP; None: intermediate_size."))
    num_shared_experts: Annotated[int, Field(ge=0, le=1024)] = Field(default=0, description=(
        "Experts every token passes through besides its routed ones (DeepSeek)."))
    shared_expert_intermediate_size: Annotated[int, Field(ge=1, le=8 * MAX_WIDTH)] | None = Field(
        default=None, description=(
            "Total width of the shared experts' MLP (HF Qwen2-MoE `shared_expert_intermediate_size`, Megatron "
            "--moe-shared-expert-intermediate-size), where it differs from num_shared_experts x the expert "
            "width; with num_shared_experts 0 it is one shared expert. None: num_shared_experts x "
            "moe_intermediate_size."))
    first_k_dense_replace: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(default=0, description=(
        "Leading layers that are dense in an MoE model (DeepSeek-V3: 3)."))
    # Multi-head latent attention (DeepSeek-V2/V3); all None = standard attention.
    q_lora_rank: Annotated[int, Field(ge=1)] | None = Field(default=None, description=(
        "Multi-head latent attention (DeepSeek-V2/V3): rank of the compressed query; None: queries "
        "uncompressed."))
    kv_lora_rank: Annotated[int, Field(ge=1)] | None = Field(default=None, description=(
        "Multi-head latent attention: rank of the compressed key/value latent; all MLA fields None: standard "
        "attention."))
    qk_nope_head_dim: Annotated[int, Field(ge=1)] | None = Field(default=None, description=(
        "Multi-head latent attention: query/key head dimension without rotary embedding."))
    qk_rope_head_dim: Annotated[int, Field(ge=1)] | None = Field(default=None, description=(
        "Multi-head latent attention: query/key head dimension carrying the rotary embedding."))
    v_head_dim: Annotated[int, Field(ge=1)] | None = Field(default=None, description=(
        "Multi-head latent attention: value head dimension."))
    # Node-limited routing (DeepSeek-V3 report sec. 2.1.2 and 3.2.2): the router first picks at most M
    # nodes per token (by the sum of the highest K/M affinities of the experts each node holds), then the
    # top-k experts among them, so a token's dispatch crosses the scale-out network to at most M nodes.
    # DeepSeek-V3: M = 4 (config.json topk_group 4 of n_group 8, the 8 groups being the 8 nodes of EP64).
    # The one node-limited-routing field the cost model prices. A config.json's n_group / topk_group do
    # not set it: their groups are devices (DeepSeek-V2) or nodes (DeepSeek-V3) as the run places the
    # experts, which the config does not say (hf._group_limited_routing notes them instead).
    moe_max_nodes_per_token: Annotated[int, Field(ge=1, le=65536)] | None = Field(default=None, description=(
        "Node-limited routing (DeepSeek-V3 report sec. 2.1.2): each token's routed experts lie on at most "
        "this many nodes (scale-up domains), which bounds the scale-out bytes of its hierarchical (DeepEP, "
        "HybridEP) dispatch (DeepSeek-V3 preset: 4). Not read from a config.json, whose n_group / "
        "topk_group groups may be devices rather than nodes; None: experts chosen anywhere."))
    # Multi-token prediction (DeepSeek-V3 report sec. 2.2, depth D = 1 in sec. 4.2): D sequential modules
    # after the last layer, each a transformer block of the last layer's kind and a 2h -> h projection,
    # sharing the embedding and the output head with the main model on the same pipeline rank (sec. 3.2.3).
    num_nextn_predict_layers: Annotated[int, Field(ge=0, le=16)] = Field(default=0, description=(
        "Multi-token prediction modules trained beside the model (DeepSeek-V3: 1; HF config "
        "num_nextn_predict_layers): each one more block of the last layer's kind, a 2h -> h projection and "
        "a second pass through the shared output head, priced on the rank holding the head."))
    # GPT-2/3 style hidden and attention dropout (stores masks; Llama-family models have none).
    dropout: bool = Field(default=False, description=(
        "GPT-2/3 style hidden and attention dropout, which stores masks (Llama-family models have none)."))
    # Sliding-window attention (Mistral, Gemma 2/3, gpt-oss): each query attends its last
    # `sliding_window` keys on the share `sliding_window_layers` of the layers (HF layer_types: gpt-oss
    # alternates, 0.5; Gemma 3 five in six); None = full causal attention everywhere.
    sliding_window: Annotated[int, Field(ge=1)] | None = Field(default=None, description=(
        "Sliding-window attention (Mistral, Gemma 2/3, gpt-oss): each query attends its last `sliding_window`"
        " keys; None: full causal attention everywhere."))
    sliding_window_layers: Annotated[float, Field(gt=0.0, le=1.0)] = Field(default=1.0, description=(
        "Share of the layers that use the sliding window (gpt-oss alternates: 0.5; Gemma 3 five in six)."))
    # Chunked attention (Llama 4: attention_chunk_size 8192 on its RoPE layers, global attention on its
    # NoPE layers, HF no_rope_layers): a query attends causally within its chunk of the sequence.
    attention_chunk_size: Annotated[int, Field(ge=1)] | None = Field(default=None, description=(
        "Chunked attention (Llama 4 attention_chunk_size, 8192): a query attends causally within its chunk "
        "of this many tokens, on the share `chunked_attention_layers` of the layers; None: none."))
    chunked_attention_layers: Annotated[float, Field(gt=0.0, le=1.0)] = Field(default=1.0, description=(
        "Share of the layers with chunked attention (Llama 4: its RoPE layers, 3 in 4; the NoPE layers of HF "
        "no_rope_layers attend globally)."))
    # A norm over each head's query and key before attention (Megatron --qk-layernorm: TE LayerNorm of
    # the head dimension on q and k; OLMo 2, Qwen3): the normalized q and k are new tensors that
    # attention saves beside the norms' saved inputs (cost.layers._activation_bytes).
    qk_layernorm: bool = Field(default=False, description=(
        "A norm over each head's query and key before attention (Megatron --qk-layernorm; OLMo 2, Qwen3): "
        "the normalized q and k are kept beside the raw ones for the backward."))
    # Experts with biases (gpt-oss): the fc2 bias is scaled by the router probability per routed
    # token, outside the grouped GEMM where the framework does not fuse it (cost.layers._mlp_cost).
    expert_bias: bool = Field(default=False, description=(
        "Experts with biases (gpt-oss): the fc2 bias is scaled by the router probability per routed token, "
        "outside the grouped GEMM where the framework does not fuse it."))
    # Hybrid Mamba2 / attention models (Nemotron-H, Nemotron 3; NemotronHConfig field names).
    hybrid_override_pattern: str | None = Field(default=None, description=(
        "Hybrid model's blocks, one character each (HF / Megatron hybrid_override_pattern, e.g. Nemotron-H "
        "`M-M-M*-...`): M a Mamba2 mixer, * attention, - a dense MLP, E an MoE MLP; its length is "
        "num_hidden_layers. None: every layer is attention + MLP."))
    mamba_num_heads: Annotated[int, Field(ge=1, le=65536)] | None = Field(default=None, description=(
        "Mamba2 heads (Megatron --mamba-num-heads); None: 2 x hidden_size / mamba_head_dim."))
    mamba_head_dim: Annotated[int, Field(ge=1, le=65536)] = Field(default=64, description=(
        "Mamba2 head dimension P (Megatron --mamba-head-dim)."))
    ssm_state_size: Annotated[int, Field(ge=1, le=65536)] = Field(default=128, description=(
        "Mamba2 state dimension N (Megatron --mamba-state-dim)."))
    mamba_n_groups: Annotated[int, Field(ge=1, le=65536)] = Field(default=8, description=(
        "Mamba2 groups sharing B and C (HF n_groups, Megatron --mamba-num-groups)."))
    conv_kernel: Annotated[int, Field(ge=1, le=1024)] = Field(default=4, description=(
        "Mamba2 causal convolution width."))
    source: str | None = Field(default=None, description=(
        "Where the shape came from (a preset's citation, or the config.json read)."))

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        kv = self.num_key_value_heads
        if kv is not None and self.num_attention_heads % kv:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({kv})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads and not self.is_mla:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads}); give head_dim explicitly"
            )
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok must be in 1..num_experts ({self.num_experts}), "
                    f"got {self.num_experts_per_tok}"
                )
            if self.first_k_dense_replace > self.num_hidden_layers:
                raise ValueError("first_k_dense_replace exceeds num_hidden_layers")
        elif self.num_experts_per_tok or self.num_shared_experts or self.shared_expert_intermediate_size:
            raise ValueError("num_experts_per_tok / num_shared_experts / shared_expert_intermediate_size need "
                             "num_experts > 0")
        pattern = self.hybrid_override_pattern
        if pattern is not None:
            bad = sorted(set(pattern) - set(HYBRID_KINDS))
            if bad:
                raise ValueError(f"hybrid_override_pattern has {bad[0]!r}: use M (Mamba2), * (attention), "
                                 "- (MLP), E (MoE)")
            if len(pattern) != self.num_hidden_layers:
                raise ValueError(f"hybrid_override_pattern has {len(pattern)} blocks, num_hidden_layers is "
                                 f"{self.num_hidden_layers}")
            if ("E" in pattern) != self.is_moe:
                raise ValueError("hybrid_override_pattern has MoE blocks (E) exactly when num_experts > 0")
            if self.is_mla:
                raise ValueError("hybrid_override_pattern with multi-head latent attention is not modelled")
        if self.num_mamba_layers and self.mamba_heads % self.mamba_n_groups:
            raise ValueError(f"mamba_n_groups ({self.mamba_n_groups}) must divide the Mamba2 heads "
                             f"({self.mamba_heads})")
        if self.sliding_window and self.attention_chunk_size \
                and self.sliding_window_layers + self.chunked_attention_layers > 1.0 + 1e-9:
            raise ValueError("sliding_window_layers + chunked_attention_layers exceed 1 (they are shares of "
                             "distinct layers)")
        mla = [self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim]
        if any(v is not None for v in mla) and not all(v is not None for v in mla):
            raise ValueError(
                "multi-head latent attention needs all of kv_lora_rank, qk_nope_head_dim, "
                "qk_rope_head_dim, v_head_dim"
            )
        return self

    # ---- derived shape facts -------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    def attention_key_share(self, seq: int, document_tokens: int | None = None) -> float:
        """Keys a query attends on average, relative to full causal attention over `seq` tokens (1
        without a sliding window, chunks or documents), a mean over the layers: a window of W keys sums
        W(W+1)/2 + (seq - W) W over the queries against seq(seq+1)/2 on the share of layers that use it;
        chunked attention sums C(C+1)/2 per chunk of C on its share; packed documents of D tokens
        (`TrainingSpec.mean_document_tokens`, per-document masks) sum D(D+1)/2 per document on every
        layer (Megatron training.py counts core attention by sum(L_i^2)). Chunks and documents together
        are priced as segments of the shorter (exact where one divides the other)."""
        doc = document_tokens if document_tokens and document_tokens < seq else None
        w, c = self.sliding_window, self.attention_chunk_size
        if doc is None and (not c or c >= seq):
            if not w or w >= seq:
                return 1.0
            windowed = (w * (w + 1) / 2 + (seq - w) * w) / (seq * (seq + 1) / 2)
            return self.sliding_window_layers * windowed + (1.0 - self.sliding_window_layers)
        base = seq * (seq + 1) / 2
        seg = doc or seq
        plain = _segment_keys(seq, seg, None) / base
        share = plain
        if w and w < seg:
            share += self.sliding_window_layers * (_segment_keys(seq, seg, w) / base - plain)
        if c and c < seg:
            share += self.chunked_attention_layers * (_segment_keys(seq, c, None) / base - plain)
        return share

    @property
    def head_size(self) -> int:
        if self.head_dim:
            return self.head_dim
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim  # type: ignore[operator]
        return self.hidden_size // self.num_attention_heads

    @property
    def gated(self) -> bool:
        return self.hidden_act in GATED_ACTS

    @property
    def expert_ffn(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def shared_ffn(self) -> int:
        """Total width of an MoE layer's shared-expert MLP (0 without shared experts)."""
        if self.shared_expert_intermediate_size is not None:
            return self.shared_expert_intermediate_size
        return self.num_shared_experts * self.expert_ffn

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense MLP (a hybrid model's `-` blocks)."""
        if self.hybrid_override_pattern is not None:
            return self.hybrid_override_pattern.count("-")
        return self.first_k_dense_replace if self.is_moe else self.num_hidden_layers

    @property
    def num_moe_layers(self) -> int:
        """Layers with an MoE MLP (a hybrid model's `E` blocks)."""
        if self.hybrid_override_pattern is not None:
            return self.hybrid_override_pattern.count("E")
        return self.num_hidden_layers - self.num_dense_layers

    @property
    def num_attention_layers(self) -> int:
        """Layers with attention: every layer, or a hybrid model's `*` blocks."""
        if self.hybrid_override_pattern is not None:
            return self.hybrid_override_pattern.count("*")
        return self.num_hidden_layers

    @property
    def num_mamba_layers(self) -> int:
        return (self.hybrid_override_pattern or "").count("M")

    @property
    def mamba_heads(self) -> int:
        """Mamba2 heads: `mamba_num_heads`, else Megatron's hidden_size x expand (2) // head_dim."""
        return self.mamba_num_heads or max(1, 2 * self.hidden_size // self.mamba_head_dim)

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    def layer_kinds(self) -> list[str]:
        """The kind of every layer, first to last: `dense` or `moe` (attention + MLP), or a hybrid model's
        blocks (`mamba`, `attention`, `mlp`, `moe_mlp`: spec.HYBRID_KINDS)."""
        if self.hybrid_override_pattern is not None:
            return [HYBRID_KINDS[c] for c in self.hybrid_override_pattern]
        return ["dense"] * self.num_dense_layers + ["moe"] * self.num_moe_layers


def _causal_keys(n: int, window: int | None) -> float:
    """Keys summed over the n queries of one causal segment, each attending at most `window` keys."""
    if not window or window >= n:
        return n * (n + 1) / 2
    return window * (window + 1) / 2 + (n - window) * window


def _segment_keys(seq: int, segment: int, window: int | None) -> float:
    """Keys summed over `seq` queries cut into causal segments of `segment` tokens (documents, chunks)."""
    full, rest = divmod(seq, segment)
    return full * _causal_keys(segment, window) + (_causal_keys(rest, window) if rest else 0.0)


class TrainingSpec(Strict):
    seq_len: Annotated[int, Field(ge=1, le=MAX_SEQ)] = Field(description="Tokens per sequence.")
    global_batch_size: Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH)] = Field(description=(
        "Sequences per optimizer step (not tokens)."))
    precision: Precision = Field(default="bf16", description=(
        "Training precision recipe as run: bf16, fp16, fp8 (the frameworks' default, delayed scaling), "
        "fp8-delayed, fp8-current, fp8-rowwise, fp8-blockwise, mxfp8, nvfp4. Which GPU runs which: `autoshard"
        " catalog`. Default: bf16, or fp16 on a GPU without bf16."))
    optimizer: Optimizer = Field(default="adam", description=(
        "Optimizer: adam / adamw keep two fp32 moments per parameter, sgd none."))
    flash_attention: bool = Field(default=True, description=(
        "Fused attention (FlashAttention / cuDNN); false materializes the score matrix (see "
        "`softmax_fusion`)."))
    # Fine-tuning: `lora` freezes the base weights (bf16) and trains rank-`lora_rank` adapters on every
    # linear layer (Hu et al. 2021); `qlora` also stores the frozen base in 4-bit NF4 with double
    # quantization, 4.127 bits per parameter (Dettmers et al. 2023, §3), dequantized for each GEMM.
    finetune: Literal["full", "lora", "qlora"] = Field(default="full", description=(
        "`full` trains every weight; `lora` freezes the base (bf16) and trains rank-`lora_rank` adapters on "
        "every linear layer (Hu et al. 2021); `qlora` also stores the frozen base in 4-bit NF4 with double "
        "quantization, 4.127 bits per parameter (Dettmers et al. 2023), dequantized for each GEMM."))
    lora_rank: Annotated[int, Field(ge=1, le=65536)] = Field(default=16, description=(
        "Rank of the LoRA / QLoRA adapters."))
    # MoE routing imbalance: tokens on the busiest expert-parallel rank over the mean (1 = balanced, as
    # Megatron-Bridge benchmarks force; 1.2-1.5 is common without load balancing). Redundant experts
    # (DeepSeek's EPLB) replicate hot experts: one per EP rank removes the imbalance.
    moe_load_imbalance: Annotated[float, Field(ge=1.0, le=64.0)] = Field(default=1.0, description=(
        "Tokens on the busiest expert-parallel rank over the mean (1 = balanced, as benchmarks force; 1.2-1.5"
        " is common without load balancing); slows the busiest rank's experts and all-to-all."))
    moe_redundant_experts: Annotated[int, Field(ge=0, le=65536)] = Field(default=0, description=(
        "Redundant copies of hot experts (DeepSeek's EPLB): one per EP rank removes the imbalance, at the "
        "cost of the copies' weights."))
    # The experts a router picks for each token, as the run routes them. `spread`: a token's k experts lie
    # anywhere among the E (a learned router, or Megatron's --moe-router-force-load-balancing, which
    # routes on random logits: router.py apply_random_logits), so its copies reach several EP ranks and
    # nodes. `contiguous`: token i gets the k consecutive experts (i k + j) mod E, the same on every rank:
    # NeMo AutoModel's fake_balanced_gate (FakeBalancedGate.forward, nemo_automodel/components/moe/
    # layers.py: indices = arange(T k).view(-1, k) % E), which every MoE row of its performance summary
    # runs ("Fake balanced gate is enabled to simulate ideal expert routing"). Both are balanced; they
    # differ in how many EP ranks and nodes a token's copies reach, which DeepEP / HybridEP send a
    # token to once each (cost.moe.contiguous_shares).
    moe_routing: Literal["spread", "contiguous"] = Field(default="spread", description=(
        "Where a token's k routed experts lie: `spread` (anywhere: a learned router, or Megatron's "
        "--moe-router-force-load-balancing random logits) or `contiguous` (token i gets experts "
        "(i k + j) mod E: NeMo AutoModel's fake_balanced_gate), which reach one or two EP ranks of one node "
        "per token and so cut what a deduplicating dispatcher (DeepEP, HybridEP) sends."))
    # Token dropping (GShard / Switch capacity): each expert takes at most capacity_factor x its mean
    # share of a micro-batch's routed tokens and is padded up to that capacity (Megatron
    # --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity, Megatron-Bridge
    # apply_moe_token_drop: 1.0). Every expert then computes the same padded count, whatever the
    # routing imbalance, and the token counts are known on the host without a device-to-host sync.
    # None = dropless.
    moe_capacity_factor: Annotated[float, Field(gt=0.0, le=64.0)] | None = Field(default=None, description=(
        "Token dropping (GShard / Switch capacity): each expert takes at most this factor x its mean share of"
        " a micro-batch's routed tokens and is padded up to it (Megatron --moe-expert-capacity-factor with "
        "--moe-pad-expert-input-to-capacity); the token counts are then known on the host without a sync. "
        "None: dropless."))
    # Gradient buffers and the data-parallel reduction in fp32 or bf16; None = the framework's default
    # (Megatron-LM: fp32 main grads for bf16 training; --grad-reduce-in-bf16 and Megatron-Bridge's
    # performance recipes: bf16, half the bytes held and reduced; torchtitan: its reduce dtype).
    main_grads: Literal["fp32", "bf16"] | None = Field(default=None, description=(
        "Gradient buffers and the data-parallel reduction in fp32 or bf16 (Megatron --grad-reduce-in-bf16, as"
        " Megatron-Bridge's performance recipes run: half the bytes held and reduced); None: the framework's "
        "default (Megatron-LM: fp32 main grads)."))
    # FP8 primary weights (Megatron --fp8-param-gather, TE fp8_model_init; every FP8 recipe of
    # Megatron-Bridge's performance summary): the recipe's low-precision copies are the model's weights
    # (no bf16 copy), the ZeRO / FSDP parameter all-gathers move them, the optimizer keeps fp32 main
    # weights. NVFP4 likewise (--fp4-param-gather, bf16_with_nvfp4_mixed). Needs a low-precision recipe
    # and a framework that runs it.
    fp8_params: bool = Field(default=False, description=(
        "FP8 primary weights (Megatron --fp8-param-gather; NVFP4: --fp4-param-gather): the recipe's low-"
        "precision copies are the model's weights and the parameter all-gathers move them. Needs a low-"
        "precision recipe and a framework that runs it."))
    # CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the GPU, so each layer's kernel launches
    # are paid on the critical path once per micro-batch (a workaround for NCCL hangs; BigScience
    # trained BLOOM's benchmarks so). Costs cost.BLOCKING_LAYER_HOST_S per layer and micro-batch.
    launch_blocking: bool = Field(default=False, description=(
        "CUDA_LAUNCH_BLOCKING=1 (a workaround for NCCL hangs, used for BLOOM's benchmarks): every layer's "
        "kernel launches are paid on the critical path once per micro-batch, about 6 ms per layer."))
    # Materialized attention (flash_attention false): Megatron's FusedScaleMaskSoftmax runs its fused
    # scale + mask + softmax kernel only for the shapes its is_kernel_available() accepts and falls
    # back to PyTorch's fp32 softmax otherwise (cost.unfused_softmax_reason). "megatron": the check of
    # Megatron-LM since 2021-08-13 (heads per GPU x micro-batch a multiple of 4, keys 17-4096);
    # "bigscience-2022": the check of bigscience-workshop/Megatron-DeepSpeed from 2021-10-21 to
    # 2022-03-06 (BLOOM's benchmarks), which sized its batches per block from the heads per GPU
    # instead of the key length; "off": --no-masked-softmax-fusion.
    softmax_fusion: Literal["megatron", "bigscience-2022", "off"] = Field(default="megatron", description=(
        "Without FlashAttention, which fused scale + mask + softmax kernel check applies: `megatron` (heads "
        "per GPU x micro-batch a multiple of 4, keys up to 4096), `bigscience-2022` (the Megatron-DeepSpeed "
        "of BLOOM's benchmarks, whose check sized its blocks by the heads per GPU) or `off` (--no-masked-"
        "softmax-fusion); shapes the check refuses run PyTorch's fp32 softmax."))
    # The run's total training tokens (e.g. 15e12). With it `evaluate`, `solve` and the reports give the
    # training FLOP budget (Estimate.flop_budget): model FLOPs per token x tokens under the named
    # convention (6 N + causal attention), the plain 6 N T, hardware FLOPs with recompute, the steps
    # and the compute time without failures. None: the per-token and per-step figures only.
    tokens: Annotated[float, Field(ge=1, le=1e16)] | None = Field(default=None, description=(
        "Total training tokens of the run (e.g. 15e12; at most 1e16): sets the FLOP budget's totals "
        "(6 N + causal attention per token, the plain 6 N T beside it, hardware FLOPs with recompute)."))

    # Megatron-LM's loss and output-layer knobs, priced in the last stage's working memory
    # (cost.layers._head_cost). --cross-entropy-loss-fusion runs the vocab-parallel cross entropy
    # through torch.compile (megatron/core/fusions/fused_cross_entropy.py, jit_fuser): the in-place
    # subtract / exp / divide on the fp32 logits are functionalized into a new fp32 buffer copied back,
    # so the loss holds bf16 logits + fp32 logits + one more fp32 copy at its peak (10 bytes per logit
    # instead of 6). --defer-embedding-wgrad-compute (tensor_parallel/layers.py
    # LinearWithGradAccumulationAndAsyncCommunication.backward) keeps the output layer's bf16 gradient
    # and input of the first --wgrad-deferral-limit micro-batches (0: all of them) until the step's end,
    # where schedules.finish_embedding_wgrad_compute computes the weight gradient.
    # Megatron-LM's data loader builds a [micro-batch, 1, seq, seq] bool causal mask per micro-batch
    # unless --no-create-attention-mask-in-dataloader (core/datasets/gpt_dataset.py
    # _get_ltor_masks_and_position_ids, GPTDatasetConfig.create_attention_mask = True; every TP rank
    # of the first and last pipeline stages receives it: training/utils.py get_batch_on_this_tp_rank).
    # Priced as two micro-batches' masks on the ranks that load data (cost.step BATCH_MASKS); off by
    # default: exports then write --no-create-attention-mask-in-dataloader.
    attention_mask_in_batch: bool = Field(default=False, description=(
        "The data loader's [micro-batch, 1, seq, seq] bool causal mask on the ranks that load data (Megatron-"
        "LM's default; --no-create-attention-mask-in-dataloader turns it off, as exports write when false): "
        "two micro-batches' masks in the first and last stages' working memory. Megatron only."))
    cross_entropy_fusion: bool = Field(default=False, description=(
        "Megatron --cross-entropy-loss-fusion: the torch.compile'd vocab-parallel cross entropy, which holds "
        "one more fp32 copy of the logits at the loss (10 bytes per logit instead of 6). Megatron only."))
    defer_embedding_wgrad: bool = Field(default=False, description=(
        "Megatron --defer-embedding-wgrad-compute: the output layer's weight gradient computed once at the "
        "step's end, its bf16 logit gradients and inputs kept until then (see wgrad_deferral_limit). "
        "Megatron only."))
    wgrad_deferral_limit: Annotated[int, Field(ge=0, le=MAX_GLOBAL_BATCH)] = Field(default=0, description=(
        "Megatron --wgrad-deferral-limit: with defer_embedding_wgrad, the micro-batches whose output-layer "
        "gradients are kept (the later ones compute theirs at once); 0: all of them (Megatron's default)."))
    # Megatron-LM's --gradient-accumulation-fusion (on by default in arguments.py; megatron-core's own
    # ModelParallelConfig defaults it off): weight gradients accumulate straight into the fp32 main_grad,
    # and Transformer Engine hands autograd a cached dummy gradient per distinct weight shape, kept for
    # the whole run (frameworks.yaml dummy_wgrads; cost.layers.dummy_wgrad_bytes).
    gradient_accumulation_fusion: bool = Field(default=True, description=(
        "Megatron --gradient-accumulation-fusion (its launcher's default; --no-gradient-accumulation-fusion "
        "turns it off, as exports write when false): with Transformer Engine one cached 16-bit dummy weight "
        "gradient per distinct weight shape is held for the whole run. Megatron only."))

    # Per-module precision under a low-precision recipe (e.g. MXFP8 routed experts with BF16
    # attention): the module classes whose linear GEMMs stay in BF16 (rate, no quantization, no
    # low-precision weight copy, bf16 saved inputs); and Megatron's --first-last-layers-bf16 with
    # --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16 (TransformerConfig, fp8_utils
    # is_first_last_bf16_layer): whole transformer blocks kept in BF16. The router and output layer
    # are 16-bit in every recipe already.
    bf16_modules: tuple[ModuleClass, ...] = Field(default=(), description=(
        "Module classes whose linear GEMMs stay in BF16 under a low-precision recipe (attention, dense_mlp, "
        "routed_experts, shared_experts; e.g. [attention] for MXFP8 experts with BF16 attention): priced at "
        "the BF16 rate, without quantization or low-precision weight copies. The router and the output "
        "layer are 16-bit in every recipe."))
    bf16_layers_at_start: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(default=0, description=(
        "Leading transformer layers kept wholly in BF16 under a low-precision recipe (Megatron "
        "--first-last-layers-bf16 --num-layers-at-start-in-bf16 N); priced as that share of the layers."))
    bf16_layers_at_end: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = Field(default=0, description=(
        "Trailing transformer layers kept wholly in BF16 under a low-precision recipe (Megatron "
        "--num-layers-at-end-in-bf16 N); priced as that share of the layers."))

    # Packed sequences with per-document attention masks (TE THD format / cu_seqlens, Megatron
    # packed_seq_params, torchtitan block_causal): attention runs within each document, so its FLOPs
    # scale with the sum of squared document lengths, not seq^2.
    mean_document_tokens: Annotated[int, Field(ge=1, le=MAX_SEQ)] | None = Field(default=None, description=(
        "Packed sequences with per-document attention masks (TE THD format, cu_seqlens): the documents' "
        "mean length in tokens; attention is priced within documents of this length (sum of squared "
        "lengths, the least for that mean). None: one causal sequence of seq_len."))

    @field_validator("bf16_modules")
    @classmethod
    def _modules(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(m for m in MODULE_CLASSES if m in v)  # canonical order, no repeats

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size


class TopologyLevel(Strict):
    """One level of the network hierarchy, innermost first.

    `size` is the number of GPUs in one domain of this level (8 for a DGX node,
    256 for a SuperPod scalable unit...). `bandwidth_gb_per_s` is the
    unidirectional egress per GPU into this level, in GB/s (1e9 bytes/s); at least
    MIN_LINK_GB_PER_S (0.01 GB/s = 80 Mb/s, slower than any network a model is trained over:
    below it step times overflow the solver's integer units).
    """

    name: str = Field(description="Label of the level (nvlink, leaf, spine...).")
    size: Annotated[int, Field(ge=1, le=MAX_GPUS)] = Field(description=(
        "GPUs in one domain of this level (8 for a DGX node's NVLink, 256 for a leaf / scalable unit, the "
        "cluster for the top level)."))
    bandwidth_gb_per_s: Annotated[float, Field(ge=0.01, le=1e6)] = Field(description=(  # MIN_LINK_GB_PER_S
        "Unidirectional egress per GPU into this level, in GB/s (1e9 bytes/s): the NVLink rate, or the NIC "
        "rate per GPU (400 Gb/s = 50 GB/s). At least 0.01."))
    latency_us: Annotated[float, Field(ge=0, le=1e6)] = Field(default=5.0, description=(
        "Latency per algorithm step of a collective that crosses this level, in microseconds."))
    sharp: bool = Field(default=False, description=(
        "In-network reduction (NVLS on NVLink, SHARP on InfiniBand): an all-reduce sends and receives the "
        "buffer once."))
    oversubscription: Annotated[float, Field(ge=1.0, le=64.0)] = Field(default=1.0, description=(
        "Taper of this level's uplinks: 2 means half the bandwidth per GPU when every GPU sends across it at "
        "once (a 2:1 fat tree). Applies to the traffic that crosses this level only, that is between domains "
        "of the level below."))
    efficiency: EfficiencyFactor | None = Field(default=None, description=(
        "Achievable share of the link rate; None: the GPU's catalog efficiency for scale-up (innermost level)"
        " or scale-out."))
    segment_unit_gpus: Annotated[int, Field(ge=1, le=MAX_GPUS)] | None = Field(default=None, description=(
        "GPUs of one scheduling unit (a node, a compute tray) inside a domain of this level, where a job "
        "larger than one domain is placed in equal segments (Slurm topology/block `--segment`): each domain "
        "then holds the largest multiple of this many GPUs that divides the job and fits in the domain "
        "(256 GPUs on 72-GPU NVL72 racks of 4-GPU trays: 4 racks of 64). None: the job's ranks fill every "
        "domain in turn."))
    source: str | None = Field(default=None, description="Where the figures come from.")


class ClusterSpec(Strict):
    gpu: str = Field(description=(
        "GPU type: a catalog id or alias (`autoshard catalog`), e.g. h100-sxm, b200, gb200, mi300x."))
    num_gpus: Annotated[int, Field(ge=1, le=MAX_GPUS)] = Field(description="GPUs in the job.")
    topology: str | list[TopologyLevel] | None = Field(default=None, description=(
        "A topology preset (`autoshard catalog`) or explicit levels, innermost first (see docs/clusters.md); "
        "None: the GPU's default preset."))
    catalog: str | None = Field(default=None, description=(
        "A calibrated catalog overlay (`autoshard calibrate -o`), relative to the problem file's folder."))
    power_cap_w: float | None = Field(default=None, gt=0, description=(
        "A board power limit per GPU, in W (e.g. `nvidia-smi -pl 500`), where the cluster runs its GPUs below "
        "the catalog's tdp_w: GEMMs are priced at the sustained clock (limit / rated power) ** (1/3) "
        "(autoshard/data/matmul.yaml); None: the catalog's limit."))


IntChoice = int | list[int]


class SearchSpec(Strict):
    """Restrictions of the plan space: a value fixes a knob, a list allows only those values."""

    tp: IntChoice | None = Field(default=None, description=(
        "Tensor-parallel degrees the solver may use (a value fixes it, a list restricts it)."))
    pp: IntChoice | None = Field(default=None, description="Pipeline-parallel degrees.")
    dp: IntChoice | None = Field(default=None, description="Data-parallel degrees.")
    cp: IntChoice | None = Field(default=None, description="Context-parallel degrees.")
    ep: IntChoice | None = Field(default=None, description="Expert-parallel degrees.")
    etp: IntChoice | None = Field(default=None, description="Expert tensor-parallel degrees (MoE parallel folding).")
    vpp: IntChoice | None = Field(default=None, description="Virtual pipeline stages per rank (interleaved schedules).")
    micro_batch_size: IntChoice | None = Field(default=None, description="Micro-batch sizes, in sequences.")
    sequence_parallel: bool | list[bool] | None = Field(default=None, description=(
        "Sequence parallelism on or off (with tp > 1)."))
    zero_stage: IntChoice | None = Field(default=None, description="ZeRO stages (0-3).")
    schedule: Schedule | list[Schedule] | None = Field(default=None, description="Pipeline schedules.")
    recompute: RecomputeChoice | None = Field(default=None, description=(
        "Activation recompute: one mode for every layer (none, selective, full, offload, or Megatron "
        "recompute modules joined by `+`), or a list with one mode per layer."))
    placement: str | list[str] | None = Field(default=None, description=(
        "Rank orders of the mesh axes, innermost first (e.g. tp-cp-ep-dp-pp)."))
    # Expert dispatchers the solver may plan with (default: the framework's; it takes the hierarchical
    # one where the framework runs it: never slower, as it moves no more bytes). [alltoall] where
    # DeepEP / HybridEP are not installed.
    moe_dispatcher: Dispatcher | list[Dispatcher] | None = Field(default=None, description=(
        "Expert dispatchers the solver may plan with (default: the framework's, the hierarchical one where it"
        " runs it); [alltoall] where DeepEP / HybridEP are not installed."))
    # CPU optimizer offload (Plan.optimizer_offload): None (default) plans it where the framework runs it
    # (frameworks.yaml optimizer_offload_zero_stages) and no plan fits without it; false never; true
    # only with it; [false, true] both, the faster kept.
    optimizer_offload: bool | list[bool] | None = Field(default=None, description=(
        "CPU optimizer offload: None (default) plans it where the framework runs it and no plan fits "
        "without it; false never; true only with it; [false, true] both, the faster kept."))
    # Hierarchical sharding (Plan.dp_replicate): the replicas of the ZeRO-sharded state the solver
    # plans with; one value (default 1: shard over all data-parallel ranks). Plans whose dp it does not
    # divide, or whose framework has no such switch, are left out.
    dp_replicate: Count | None = Field(default=None, description=(
        "Replicas of the ZeRO-sharded state the solver plans with (Plan.dp_replicate: HSDP, Megatron "
        "--num-distributed-optimizer-instances, DeepSpeed MiCS); default 1, sharded over all data-parallel ranks."))
    # FSDP reshard_after_forward the solver plans with (Plan.reshard_after_forward); default: the
    # framework's own policy (torchtitan "default": never with pipeline parallelism, else always).
    reshard_after_forward: Literal["always", "never"] | Annotated[int, Field(ge=2)] | None = Field(
        default=None, description=(
            "ZeRO-3 / FSDP reshard_after_forward the solver plans with (always, never, or a group size N: "
            "Plan.reshard_after_forward); default: the framework's own policy."))
    uniform_stages: bool = Field(default=False, description=(
        "Force an even layer split across pipeline stages (for launchers without uneven pipeline stages)."))
    # Recompute lists the solver may plan: what the framework's launcher runs ("framework": Megatron
    # one mode everywhere or full on the first K layers of every virtual stage; the others one mode
    # everywhere), or any mode per layer ("per_layer": for a stack that takes a list).
    recompute_layout: Literal["framework", "per_layer"] = Field(default="framework", description=(
        "`framework`: the recompute lists the framework's launcher runs (Megatron one mode everywhere or full"
        " on the first K layers of every virtual stage; the others one mode everywhere); `per_layer`: any "
        "mode per layer, for a stack that takes a list."))
    # Rank orders (placements) the solver may plan where `placement` is not given: the ones the
    # framework's launcher sets ("framework": Megatron tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with
    # --use-tp-pp-dp-mapping; torchtitan, AutoModel and DeepSpeed their fixed mesh), or every order of
    # the mesh axes ("any": ranks mapped by hand, e.g. a host file ordered to match).
    placement_layout: Literal["framework", "any"] = Field(default="framework", description=(
        "`framework`: the rank orders the framework's launcher sets (Megatron tp-cp-ep-dp-pp or tp-cp-ep-pp-"
        "dp; torchtitan, AutoModel and DeepSpeed their fixed mesh); `any`: every order of the mesh axes "
        "(ranks mapped by hand)."))
    max_candidates: Annotated[int, Field(ge=1)] | None = Field(default=None, description=(
        "Cap on the configurations the solver enumerates."))
    # HBM (GiB per GPU) the plan must leave free, on top of the 2 GiB reserve (`--headroom`):
    # a margin for fragmentation, a larger batch later, or a model the estimate underprices.
    # Left unset, `evaluate` keeps none and the solver (solve, batch, whatif) keeps 5% of the GPU's
    # HBM (4.0 GiB on an 80 GiB GPU): two standard deviations (2 x 2.29 GiB) of the memory model's
    # error against the 21 measured nvidia-smi peaks of BLOOM's logbook (validation ablations_dev.json,
    # A100 80GB), 5.7% of 80 GiB rounded down (solver.search.DEFAULT_HEADROOM_FRACTION, docs/solver.md).
    # Set 0 (`--headroom 0`) for plans at the edge.
    headroom_gib: Annotated[float, Field(ge=0, le=1024)] = Field(default=0.0, description=(
        "HBM (GiB per GPU) the plan must leave free on top of the 2 GiB reserve (`--headroom`). Unset: evaluate "
        "keeps none; the solver keeps 5% of HBM, two standard deviations of the memory model's error against the "
        "21 measured peaks of BLOOM's logbook (docs/solver.md); 0 for plans at the edge."))

    @field_validator("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch_size")
    @classmethod
    def _positive(cls, v: IntChoice | None) -> IntChoice | None:
        for x in [v] if isinstance(v, int) else (v or []):
            if x < 1:
                raise ValueError(f"degrees must be >= 1, got {x}")
            if x > MAX_GPUS:
                raise ValueError(f"degrees must be at most {MAX_GPUS:,} (the largest cluster), got {x}")
        if isinstance(v, list) and not v:
            raise ValueError("an empty list allows nothing")
        return v

    @field_validator("zero_stage")
    @classmethod
    def _zero(cls, v: IntChoice | None) -> IntChoice | None:
        for x in [v] if isinstance(v, int) else (v or []):
            if x not in (0, 1, 2, 3):
                raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {x}")
        return v

    @field_validator("placement")
    @classmethod
    def _placement(cls, v: str | list[str] | None) -> str | list[str] | None:
        for p in [v] if isinstance(v, str) else (v or []):
            parse_placement(p)
        return v

    def allowed(self, knob: str, default: Sequence[Any]) -> list[Any]:
        """The values of `knob` the search may use: the restriction, else `default`."""
        v = getattr(self, knob)
        if v is None:
            return list(default)
        return list(v) if isinstance(v, list) else [v]


@functools.lru_cache(maxsize=256)
def parse_placement(text: str) -> tuple[str, ...]:
    """`tp-cp-ep-dp-pp` -> ('tp','cp','ep','dp','pp'); axes left out go outermost in default order."""
    axes = tuple(a.strip().lower() for a in text.replace(",", "-").split("-") if a.strip())
    bad = [a for a in axes if a not in MESH_AXES]
    if bad:
        raise ValueError(f"unknown mesh axis {bad[0]!r} in placement {text!r}; axes are {', '.join(MESH_AXES)}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"placement {text!r} repeats an axis")
    return axes + tuple(a for a in MESH_AXES if a not in axes)


class Plan(Strict):
    """How to parallelize: degrees, memory knobs, schedule and the per-layer choices.

    `dp` may be left out (derived from the world size). `recompute` is one mode for
    every layer or a list with one mode per layer. `stage_layers` gives the number of
    transformer layers of each virtual pipeline stage in order (length pp * vpp;
    default: as even as possible). `placement` orders the mesh axes from innermost
    (consecutive ranks, inside the NVLink domain) to outermost. Expert parallelism
    is carved out of data parallelism: the `dp` axis of the placement is dp / ep.
    """

    tp: Degree = Field(default=1, description="Tensor-parallel degree.")
    pp: Degree = Field(default=1, description="Pipeline-parallel degree (stages).")
    dp: Degree | None = Field(default=None, description="Data-parallel degree; None: derived from the world size.")
    cp: Degree = Field(default=1, description="Context-parallel degree.")
    ep: Degree = Field(default=1, description=(
        "Expert-parallel degree, carved out of data parallelism (and TP/CP ranks with folding)."))
    vpp: VirtualStages = Field(default=1, description="Virtual pipeline stages per rank (interleaved schedule).")
    sequence_parallel: bool | None = Field(default=None, description="Sequence parallelism; None: on whenever tp > 1.")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=1, description=(
        "ZeRO stage: 0 none, 1 optimizer states sharded (Megatron's distributed optimizer), 2 also gradients,"
        " 3 also weights (FSDP)."))
    micro_batch_size: MicroBatch = Field(default=1, description="Sequences per micro-batch.")
    schedule: Schedule = Field(default="1f1b", description=(
        "Pipeline schedule: gpipe, 1f1b, interleaved, zero_bubble (ZB-H1), dualpipe (DeepSeek's bidirectional "
        "DualPipe: two model copies, one stage of each direction per rank) or dualpipev."))
    recompute: RecomputeChoice = Field(default="none", description=(
        "Activation recompute: none, selective, full, offload (activations to host memory), Megatron "
        "recompute modules joined by `+` (e.g. moe_act+layernorm), or a list with one mode per layer."))
    stage_layers: list[Annotated[int, Field(ge=0, le=MAX_LAYERS)]] | None = Field(default=None, max_length=MAX_LAYERS, description=(
        "Transformer layers of each virtual pipeline stage in order (length pp x vpp; uneven allowed); None: "
        "as even as possible."))
    placement: str = Field(default=DEFAULT_PLACEMENT, description=(
        "Mesh axes from innermost (consecutive ranks, inside the NVLink domain) to outermost."))
    # MoE parallel folding (Megatron-Core): experts are laid out over the same ranks of a pipeline
    # stage as etp x ep x edp, independently of attention's tp x cp x dp; None = etp equals tp.
    etp: Degree | None = Field(default=None, description=(
        "Expert tensor-parallel degree (Megatron-Core MoE parallel folding: experts laid out as etp x ep x "
        "edp over the ranks of a pipeline stage); None: equals tp."))
    # Overlaps a framework can run; None = what the framework profile does by default where the
    # plan allows it (see autoshard/data/frameworks.yaml).
    tp_comm_overlap: bool | None = Field(default=None, description=(
        "TP collectives pipelined with the GEMMs (TE userbuffers / torchtitan AsyncTP); None: what the "
        "framework runs where the plan allows it."))
    ep_overlap: bool | None = Field(default=None, description=(
        "Expert all-to-all hidden under the other micro-batch's compute (Megatron --overlap-moe-expert-"
        "parallel-comm); None: where the framework runs it and it is faster as priced."))
    # Data-parallel overlap (Megatron --overlap-grad-reduce / --overlap-param-gather, FSDP prefetch):
    # gradient buckets reduce under the last backward, updated parameters gather under the next
    # forward. Production recipes run both; off, the whole transfer is exposed (evaluated, not searched).
    # A framework whose engine does not run one exposes it anyway (DeepSpeed: cost.dp_overlaps).
    overlap_grad_reduce: bool = Field(default=True, description=(
        "Gradient reduction under the last backward (Megatron --overlap-grad-reduce, FSDP); off, the whole "
        "transfer is exposed (evaluated, not searched)."))
    overlap_param_gather: bool = Field(default=True, description=(
        "Parameter all-gather under the next forward (Megatron --overlap-param-gather, FSDP prefetch); "
        "evaluated, not searched."))
    # FSDP / ZeRO-3 reshard_after_forward: what a layer's gathered (bf16) weights do between its
    # forward and its backward. "always": freed, gathered again for the backward (FSDP2 True, DeepSpeed
    # ZeRO-3); "never": kept, one all-gather per layer fewer, the rank's whole gathered weights held
    # (FSDP2 False; torchtitan parallelism.fsdp_reshard_after_forward "never"); N: resharded to a
    # secondary shard over N data-parallel ranks (FSDP2 reshard_after_forward=N, DeepSpeed ZeRO++ hpZ
    # zero_hpz_partition_size N): the backward's all-gather runs inside that group (one node's NVLink
    # for N <= GPUs per node) for 1/N of the gathered weights held. None: the framework's policy
    # (frameworks.yaml reshard_after_forward; torchtitan "default" = never with pp > 1).
    reshard_after_forward: Literal["always", "never"] | Annotated[int, Field(ge=2)] | None = Field(
        default=None, description=(
            "ZeRO-3 / FSDP: gathered weights between forward and backward: always (freed, gathered again), never"
            " (kept: one all-gather per layer fewer, the rank's gathered weights held) or N (a secondary shard"
            " over N ranks, the backward all-gather inside it: FSDP2 int, DeepSpeed hpZ); None: the framework's"
            " policy (torchtitan: never with pp > 1, else always)."))
    # Hierarchical sharding: ZeRO states sharded over dp x cp / dp_replicate ranks (a group of
    # consecutive data-parallel ranks) and replicated over dp_replicate such groups: torchtitan HSDP
    # (data_parallel_replicate_degree x data_parallel_shard_degree), Megatron
    # --num-distributed-optimizer-instances (ZeRO-1), DeepSpeed MiCS (mics_shard_size, ZeRO-3).
    # Gradients reduce-scatter inside the group and all-reduce their shard across the replicas.
    dp_replicate: Count = Field(default=1, description=(
        "Replicas of the ZeRO-sharded state (hierarchical sharding): states sharded over dp x cp / "
        "dp_replicate ranks, gradients reduce-scattered there and all-reduced across replicas (torchtitan "
        "HSDP data_parallel_replicate_degree, Megatron --num-distributed-optimizer-instances, DeepSpeed MiCS)."))
    # Gradient accumulation around the pipeline schedule: the step's micro-batches run as this many
    # schedules one after another, each filling and draining the pipeline. Megatron-LM runs every
    # micro-batch of a step in one schedule (forward_backward_func over num_microbatches: 1). NeMo
    # AutoModel calls schedule.step once per accumulation step on a local batch of local_batch_size /
    # pp_microbatch_size micro-batches (nemo_automodel/recipes/llm/train_ft.py _run_train_optim_step:
    # `for i, batch in enumerate(batches): self._forward_backward_step(...)` -> schedule.step, with
    # pp_batch_size = step_scheduler.local_batch_size), so its GA column is the rounds. Evaluated, not
    # searched.
    pipeline_rounds: Count = Field(default=1, description=(
        "Pipeline schedules the step's micro-batches run in, one after another, each filling and draining "
        "the pipeline (gradient accumulation around the schedule: NeMo AutoModel's grad_acc_steps with "
        "pp > 1); 1: one schedule for all micro-batches (Megatron). Evaluated, not searched."))
    # Optimizer states (fp32 master weights and moments) in host memory, stepped by the CPU
    # (Megatron --optimizer-cpu-offload, DeepSpeed ZeRO-Offload); evaluated, not searched.
    optimizer_offload: bool = Field(default=False, description=(
        "Optimizer states in host memory, stepped by the CPU (Megatron --optimizer-cpu-offload, DeepSpeed "
        "ZeRO-Offload); evaluated, not searched."))
    # How context parallelism exchanges K/V (Megatron --cp-comm-type): p2p ring overlapped with
    # attention (default), allgather of K/V before attention, a2a (DeepSpeed-Ulysses: heads scattered
    # across the CP group by all-to-all), a2a+p2p (hierarchical: a2a among the CP ranks of one NVLink
    # domain, the p2p ring across domains; --hierarchical-context-parallel-sizes); evaluated, not searched.
    cp_comm_type: Literal["p2p", "allgather", "a2a", "a2a+p2p"] = Field(default="p2p", description=(
        "How context parallelism exchanges K/V (Megatron --cp-comm-type): p2p ring overlapped with attention,"
        " allgather, a2a (Ulysses) or a2a+p2p (hierarchical); evaluated, not searched."))
    # Full-iteration CUDA graphs (Megatron --cuda-graph-impl full_iteration): the training step is
    # captured once and replayed, so host-side launch and synchronization costs (dropless MoE's
    # per-expert host work, recompute modules' Python wrappers) vanish; MoE then needs a sync-free
    # dispatcher (HybridEP with paged stashing). Evaluated, not searched.
    cuda_graphs: bool = Field(default=False, description=(
        "Full-iteration CUDA graphs (Megatron --cuda-graph-impl full_iteration): no host launch and sync "
        "costs; evaluated, not searched."))
    # Per-layer (scoped) CUDA graphs (Megatron --cuda-graph-impl transformer_engine with
    # --cuda-graph-scope, megatron/core/transformer/cuda_graphs.py / TE make_graphed_callables): each
    # layer's captured regions replay as graphs (forward and backward), their launches leave the host;
    # the rest (a dropless MoE's dispatch, experts and combine) stays eager. Evaluated, not searched.
    cuda_graph_scope: list[GraphScope] = Field(default_factory=list, description=(
        "Per-layer CUDA graphs (Megatron --cuda-graph-impl transformer_engine --cuda-graph-scope ...): the "
        "regions of every layer captured: layer (the whole layer), attn, mlp (dense MLP), moe (a drop-and-pad "
        "MoE block), moe_router, moe_preprocess (with moe_router), mamba; [] = none. Their host launch time "
        "is replaced by one graph replay each; the rest stays eager. Evaluated, not searched."))
    # Expert token dispatch (Megatron --moe-token-dispatcher-type alltoall, or flex with
    # --moe-flex-dispatcher-backend deepep | hybridep): the hierarchical kernels send a token once per
    # remote node (or NVLink domain) and fan it out over NVLink there; None = the framework's default.
    moe_dispatcher: Dispatcher | None = Field(default=None, description=(
        "Expert token dispatch: alltoall, Megatron's flex dispatcher with the deepep / hybridep kernels (a"
        " token sent once per remote node, and inside one NVLink domain once per GPU hosting any of its"
        " experts), or allgather (--moe-token-dispatcher-type allgather: each rank "
        "gathers every token of its EP group, and reduce-scatters the outputs); None: the framework's default."))

    @field_validator("placement")
    @classmethod
    def _placement(cls, v: str) -> str:
        return "-".join(parse_placement(v))

    @field_validator("cuda_graph_scope")
    @classmethod
    def _graph_scope(cls, v: list[str]) -> list[str]:
        """In canonical order, once each; Megatron's rules (transformer_config.py __post_init__ at
        d98e8a64dd): moe and moe_router exclusive, moe_preprocess only with moe_router; `layer` alone."""
        scope = [s for s in GRAPH_SCOPES if s in v]
        if "layer" in scope and len(scope) > 1:
            raise ValueError("'layer' (the whole layer) cannot be combined with other scopes")
        if "moe" in scope and "moe_router" in scope:
            raise ValueError("cuda_graph_scope must not contain both moe and moe_router")
        if "moe_preprocess" in scope and "moe_router" not in scope:
            raise ValueError("moe_preprocess is captured only together with moe_router")
        return scope

    @property
    def sp(self) -> bool:
        return self.tp > 1 if self.sequence_parallel is None else (self.sequence_parallel and self.tp > 1)

    @property
    def axes(self) -> tuple[str, ...]:
        return parse_placement(self.placement)

    def recompute_per_layer(self, num_layers: int) -> list[Recompute]:
        if isinstance(self.recompute, str):
            return [self.recompute] * num_layers
        return list(self.recompute)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    def world(self, dp: int | None = None) -> int:
        return self.tp * self.pp * self.cp * (dp if dp is not None else (self.dp or 1))

    def short(self) -> str:
        """A compact one-line description, e.g. `tp8 sp pp4 dp20 zero1 mbs1 1f1b`."""
        cp = f"cp{self.cp}" + (f"({self.cp_comm_type})" if self.cp > 1 and self.cp_comm_type != "p2p" else "")
        parts = [f"tp{self.tp}" + (" sp" if self.sp else ""), cp, f"ep{self.ep}",
                 f"etp{self.etp}" if self.etp is not None and self.etp != self.tp else "",
                 self.moe_dispatcher if self.moe_dispatcher and self.moe_dispatcher != "alltoall" else "",
                 f"pp{self.pp}" + (f"x{self.vpp}" if self.vpp > 1 else ""), f"dp{self.dp}",
                 f"zero{self.zero_stage}", f"mbs{self.micro_batch_size}", self.schedule]
        if self.optimizer_offload:
            parts.insert(parts.index(f"zero{self.zero_stage}") + 1, "optimizer-offload")
        if self.dp_replicate > 1:
            parts.insert(parts.index(f"zero{self.zero_stage}") + 1, f"replicate{self.dp_replicate}")
        if self.reshard_after_forward is not None and self.zero_stage == 3:
            parts.insert(parts.index(f"zero{self.zero_stage}") + 1, f"reshard-{self.reshard_after_forward}")
        if self.cuda_graphs:
            parts.append("cuda-graphs")
        if self.cuda_graph_scope:
            parts.append("graphs=" + "+".join(self.cuda_graph_scope))
        if self.pipeline_rounds > 1 and self.pp > 1:
            parts.insert(parts.index(self.schedule) + 1, f"rounds{self.pipeline_rounds}")
        rc = self.recompute
        if isinstance(rc, str):
            parts.append(f"recompute={rc}")
        else:
            counts = {m: rc.count(m) for m in mode_order(rc) if rc.count(m)}
            parts.append("recompute=" + ",".join(f"{m}:{n}" for m, n in counts.items()))
        return " ".join(p for p in parts if p and p not in ("cp1", "ep1"))


class Problem(Strict):
    """Model + training setup + cluster (+ optional search restrictions), as explicit data.

    `autoshard.load_problem` builds one from a file or a dict: it resolves a model preset name,
    `{preset: name, ...overrides}` or `{hf_config: path}` to explicit fields and picks the GPU's
    default precision where none is named (both read the catalog). `Problem(...)` itself takes the
    explicit fields only (a `ModelSpec`, or a dict of its fields).
    """

    name: str | None = Field(default=None, description="Label of the problem in reports and output file names.")
    description: str | None = Field(default=None, description="Free text shown at the top of the report.")
    model: ModelSpec = Field(description=(
        "A preset name (`autoshard catalog`), Hugging Face config.json fields, {hf_config: "
        "path/to/config.json}, or {preset: name, ...overrides}."))
    training: TrainingSpec = Field(description=(
        "Sequence length, batch, precision and the training settings that change the price."))
    cluster: ClusterSpec = Field(description="GPU type, count and network topology.")
    search: SearchSpec = Field(default=SearchSpec(), description=(
        "Optional restrictions of the plan space: a value fixes a knob, a list allows only those values."))
    framework: Framework = Field(default="megatron", description=(
        "The framework whose launcher runs the plan: megatron, torchtitan, automodel (NeMo AutoModel), "
        "deepspeed, maxtext or deepseek (DeepSeek-V3's own stack: DualPipe, ZeRO-1, node-limited DeepEP dispatch); "
        "the solver plans only what it runs (autoshard/data/frameworks.yaml)."))

    @model_validator(mode="after")
    def _bf16_layers(self) -> "Problem":
        t, layers = self.training, self.model.num_hidden_layers
        if t.bf16_layers_at_start + t.bf16_layers_at_end > layers:
            raise ValueError(f"training.bf16_layers_at_start + bf16_layers_at_end ({t.bf16_layers_at_start} + "
                             f"{t.bf16_layers_at_end}) exceed the model's {layers} layers")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.training.tokens_per_step


class ProblemParts:
    """`model` and `training` of the `problem` an object carries (cost.Context, export's _Ctx)."""

    problem: Problem

    @property
    def model(self) -> ModelSpec:
        return self.problem.model

    @property
    def training(self) -> TrainingSpec:
        return self.problem.training


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))

"""The shape of a model: what its checkpoint (config.json or GGUF metadata) says about its
layers, heads, experts and attention windows (read by models/loader.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from radixserve.recurrent_params import (  # noqa: F401  (LINEAR, FULL: the families' names)
    FULL, LINEAR, MLP_ONLY, LinearAttnParams, RecurrentLayout)


@dataclass(frozen=True)
class MoeConfig:
    """The sparse mixture-of-experts blocks of a decoder (Qwen2-MoE, Qwen3-MoE, Mixtral): each
    token's MLP is the weighted sum of ``top_k`` of ``num_experts`` SwiGLU experts of width
    ``intermediate_size``, picked by a linear router (softmax over all experts, top-k, the k
    weights renormalized to sum 1 when ``norm_topk_prob``), plus, where
    ``shared_expert_size`` > 0 (Qwen2-MoE), a shared SwiGLU expert of that width every token
    runs, scaled by sigmoid of a one-output linear gate (ungated where not
    ``shared_expert_gate``: Nemotron-H). ``dense_layers``: the layers that keep a dense MLP of
    the model's ``intermediate_size`` (``mlp_only_layers`` and ``decoder_sparse_step``).

    The DeepSeek-V3-style routers (Nemotron-H, LFM2-MoE, GLM-4.x) score each expert alone
    (``scoring`` "sigmoid"), pick by the scores plus a learned per-expert bias where
    ``expert_bias`` (the router's ``e_score_correction_bias``; selection only), within the
    ``topk_groups`` best of ``num_groups`` groups (a group ranked by its two best), weight by
    the unbiased scores (renormalized with ``norm_eps`` added to the sum) times
    ``routed_scaling``. ``expert_activation`` "relu2": experts (and the shared one) are
    ``down(relu(up(x)) ** 2)``, no gate.

    gpt-oss: ``scoring`` "softmax_topk" (a softmax over the k largest logits only), the router
    and the experts' linears with biases (``linear_bias``), ``expert_activation`` "swiglu_oai":
    ``down((clamp(up, -l, l) + 1) * g * sigmoid(alpha * g))``, g = ``min(gate, l)``, l
    ``swiglu_limit``, alpha ``swiglu_alpha``."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool = True
    dense_layers: tuple[int, ...] = ()
    shared_expert_size: int = 0
    scoring: str = "softmax"  # or "sigmoid"
    expert_bias: bool = False
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling: float = 1.0
    norm_eps: float = 0.0
    expert_activation: str = "silu"  # or "relu2", "swiglu_oai"
    shared_expert_gate: bool = True
    linear_bias: bool = False
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid", "softmax_topk"):
            raise ValueError(f"unsupported MoE scoring {self.scoring!r}; supported: "
                             "['softmax', 'sigmoid', 'softmax_topk']")
        if self.expert_activation not in ("silu", "relu2", "swiglu_oai"):
            raise ValueError(f"unsupported expert activation {self.expert_activation!r}; "
                             "supported: ['silu', 'relu2', 'swiglu_oai']")
        if (self.num_groups < 1 or self.num_experts % self.num_groups
                or not 1 <= self.topk_groups <= self.num_groups):
            raise ValueError(f"MoE groups: {self.num_experts} experts in {self.num_groups} "
                             f"groups, {self.topk_groups} kept: the groups must divide the "
                             "experts and keep 1..all of them")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"experts per token must be in 1..{self.num_experts} (the number "
                             f"of experts), got {self.top_k}")

    def is_sparse(self, layer_idx: int) -> bool:
        return layer_idx not in self.dense_layers


@dataclass(frozen=True)
class MRopeParams:
    """Multimodal rope (Qwen2-VL and later): each rotary frequency turns by one of a token's
    three positions (time, height, width), ``sections`` frequencies each (they sum to
    rotary_dim / 2): in order (Qwen2-VL, Qwen2.5-VL: t t .. h h .. w w ..) or, where
    ``interleaved`` (Qwen3-VL, Qwen3.5), t h w t h w .. while each stream's count lasts, t
    after. A text token's three positions are equal: plain rope; an image's rows differ
    (core/images.py places them)."""

    sections: tuple[int, ...]
    interleaved: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder, read from config.json or GGUF metadata."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    moe: MoeConfig | None = None  # None: every layer has a dense MLP
    rotary_dim: int | None = None  # rope on the first dims of each head only; None: all
    sliding_window: int | None = None  # keys a windowed layer attends to (its last ones)
    # the layers the window applies to (Gemma's sliding layers, Qwen2's from
    # max_window_layers on); None: every layer (Mistral, Phi-3)
    sliding_layers: tuple[bool, ...] | None = None
    gemma: GemmaParams | None = None  # Gemma 2 / 3 specifics
    # a hybrid's recurrent layers (recurrent_params.py: Gated DeltaNet, Mamba2, short conv)
    linear_attn: RecurrentLayout | None = None
    attn_output_gate: bool = False  # attention output times sigmoid(gate), gate from q_proj
    granite: GraniteParams | None = None  # Granite's multipliers, shared MLP, NoPE
    layer_rope: LayerRope | None = None  # layers whose rope differs (SmolLM3, OLMo 3)
    # per layer: the layer whose KV it attends over (itself: its own); Gemma 4's shared-KV
    # layers name an earlier one and have no pool layer. None: every layer its own
    kv_source: tuple[int, ...] | None = None
    # per layer (KV heads, head dim) where layers differ (Gemma 4's global layers); None: all
    # (num_kv_heads, head_dim). The pool's rows are the widest layer's (``kv_view``)
    kv_shapes: tuple[tuple[int, int], ...] | None = None
    gemma4: Gemma4Params | None = None  # Gemma 4 specifics (models/gemma4_config.py)
    # multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash): the pool then holds one
    # latent row per token, num_kv_heads 1 of head_dim kv_lora_rank + rope dims (models/mla.py)
    mla: MlaParams | None = None
    # multi-token-prediction layers that run (``--speculative mtp``; Qwen3.5 / 3.6, Qwen3-Next):
    # numbered after the decoder's, each attending over a KV layer of its own beside the pool's
    # (runner/mtp_runner.py); 0: the checkpoint's MTP block, if any, is not loaded
    num_mtp_layers: int = 0
    mrope: MRopeParams | None = None  # Qwen VL's multimodal rope (None: positions are 1-D)

    def layer_window(self, layer_idx: int) -> int | None:
        """The sliding window of layer ``layer_idx``, None for full attention."""
        if self.sliding_layers is not None and not self.sliding_layers[layer_idx]:
            return None
        return self.sliding_window

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that attend over the KV cache (a hybrid model's ``FULL`` ones); the KV
        pool has a layer for each, in this order."""
        layers = (range(self.num_layers) if self.linear_attn is None
                  else self.linear_attn.full_layers)
        if self.kv_source is not None:  # shared-KV layers read their source's
            return tuple(i for i in layers if self.kv_source[i] == i)
        return tuple(layers)

    def kv_view(self) -> ModelConfig:
        """This shape as the KV pool sees it: its attention layers only, each row as wide as
        the widest layer's (``kv_shapes``)."""
        if self.linear_attn is None and self.kv_source is None and self.kv_shapes is None:
            return self
        layers = self.attention_layers
        kv_heads, head_dim = (self.num_kv_heads, self.head_dim)
        if self.kv_shapes is not None:
            kv_heads, head_dim = max((self.kv_shapes[i] for i in layers),
                                     key=lambda s: s[0] * s[1])
        return replace(self, num_layers=len(layers), linear_attn=None, kv_source=None,
                       kv_shapes=None, num_kv_heads=kv_heads, head_dim=head_dim)

    @property
    def widest_head_dim(self) -> int:
        """The largest head dim of any layer (the native attention takes up to 256)."""
        return max(d for _, d in self.kv_shapes) if self.kv_shapes else self.head_dim

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class MlaParams:
    """Multi-head latent attention's shape (models/mla.py): queries through a rank
    ``q_lora_rank`` bottleneck (None: one ``q_proj``), keys and values from one cached latent
    of ``kv_lora_rank`` plus a shared rope key of ``qk_rope_head_dim``; each head's key is
    ``qk_nope_head_dim`` + rope dims, its value ``v_head_dim``. ``rope_interleave``: the rope
    dims rotate adjacent pairs (DeepSeek's layout); ``softmax_scale``: the scores' scale
    (YaRN's mscale folded in)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool
    softmax_scale: float


@dataclass(frozen=True)
class Gemma4Params:
    """What Gemma 4 adds to the shape (models/gemma4_config.py says what each is).
    ``per_layer_dim``: width of each layer's per-layer input (0: none);
    ``double_wide_layers``: the layers whose MLP is twice ``intermediate_size`` wide;
    ``k_eq_v_layers``: the layers whose values are their key projection; ``num_experts`` > 0
    (26B-A4B): every layer adds ``top_k_experts`` routed GeGLU experts of
    ``moe_intermediate_size`` beside its dense MLP (models/gemma4_moe.py); the last two say
    how image rows run (models/gemma4.py)."""

    rope_local_theta: float
    global_rope_theta: float
    global_rope_fraction: float  # proportional rope: the rotated share of each head
    global_rope_factor: float
    final_logit_softcapping: float | None
    per_layer_dim: int
    per_layer_vocab: int
    double_wide_layers: tuple[int, ...] = ()
    k_eq_v_layers: tuple[int, ...] = ()
    num_experts: int = 0
    top_k_experts: int = 0
    moe_intermediate_size: int = 0
    pad_token_id: int = 0  # image rows read the per-layer table at the pad token's row
    # the sliding layers attend within an image both ways (``use_bidirectional_attention``
    # "vision": the larger releases); the global layers stay causal
    vision_bidirectional: bool = False

    def global_rope_scaling(self, head_dim: int) -> dict:
        """The global layers' rope as layers/rope_scaling.py's ``freq_factors`` kind: the
        rotated pairs divided by ``factor``, the others by inf (frequency 0)."""
        rotated = int(self.global_rope_fraction * head_dim // 2)
        factors = [self.global_rope_factor] * rotated + [float("inf")] * (head_dim // 2 - rotated)
        return {"rope_type": "freq_factors", "factors": factors}


@dataclass(frozen=True)
class GemmaParams:
    """What Gemma 2 / 3 add to the Llama shape (models/gemma.py): the sliding layers' rope base
    (the global layers keep ``rope_theta`` and ``rope_scaling``; which layers slide is
    ``ModelConfig.sliding_layers``), the query scale's ``query_pre_attn_scalar ** -0.5``, and
    the tanh soft-caps (None: off)."""

    rope_local_theta: float = 10000.0
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None


@dataclass(frozen=True)
class LayerRope:
    """Layers whose rope is not the model's ``rope_theta`` / ``rope_scaling`` (models/layer_rope.py
    builds each layer's): ``no_rope``, the layers that apply none (SmolLM3's NoPE layers);
    ``sliding_theta``, the base of a plain rope (no scaling) on the sliding-window layers
    (OLMo 3), None where they share the full layers' rope."""

    no_rope: tuple[int, ...] = ()
    sliding_theta: float | None = None


@dataclass(frozen=True)
class GraniteParams:
    """What IBM Granite adds to the Llama shape (models/granite.py, granite_config.py): the
    embeddings times ``embedding_multiplier``, the attention scale ``attention_multiplier``
    (not 1 / sqrt(head_dim)), each block's output times ``residual_multiplier`` before the
    residual add, the logits divided by ``logits_scaling``; the width of the ungated shared
    MLP every token runs (0: none; a dense Granite 4.0-H model's only MLP); whether attention
    rotates q and k (False: no position embedding, Granite 4.0-H)."""

    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    shared_intermediate_size: int = 0
    rope: bool = True

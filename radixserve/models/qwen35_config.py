"""Qwen3.5 text shapes (``Qwen3_5ForCausalLM``, model_type ``qwen3_5_text``, llama.cpp's
``qwen35``; the MoE ``Qwen3_5MoeForCausalLM``, ``qwen3_5_moe_text``, llama.cpp's ``qwen35moe``)
from a Hugging Face config.json or GGUF metadata, and the checkpoint names of a Hugging Face
folder's text weights (a GGUF file's are in qwen35_gguf.py).

A Qwen3.5 decoder mixes two token mixers: ``linear_attention`` layers (Gated DeltaNet) and
``full_attention`` ones (q_proj gives the query and a sigmoid output gate per head, q/k RMS
norms, rope on the first ``partial_rotary_factor`` of each head). Where config.json has no
``layer_types``, transformers derives them from ``full_attention_interval`` (default 4: three
linear layers, then a full one), as llama.cpp does for a file without
``qwen35.attention.recurrent_layers``.

The MoE models (Qwen3.5-35B-A3B, 122B-A10B) differ in the MLP alone: every layer's is a sparse
MoE block (transformers' ``Qwen3_5MoeSparseMoeBlock``: softmax router, top-k renormalized, a
shared expert scaled by a sigmoid gate; layers/moe.py), with no dense ``intermediate_size``.

The released checkpoints are ``Qwen3_5ForConditionalGeneration`` /
``Qwen3_5MoeForConditionalGeneration`` folders (a vision tower beside the language model, an MTP
block): their ``text_config`` is read and only the text model runs.
"""

from __future__ import annotations

from radixserve.model_config import (
    FULL,
    LINEAR,
    LinearAttnParams,
    ModelConfig,
    MoeConfig,
    MRopeParams,
)
from radixserve.models.moe import moe_from_gguf

QWEN35_ARCHITECTURE = "Qwen3_5ForCausalLM"  # what runs, whichever folder it came from
QWEN35_MOE_ARCHITECTURE = "Qwen3_5MoeForCausalLM"
_CONDITIONAL = {"Qwen3_5ForConditionalGeneration": QWEN35_ARCHITECTURE,
                "Qwen3_5MoeForConditionalGeneration": QWEN35_MOE_ARCHITECTURE}
_TEXT_DEFAULTS = {  # transformers' Qwen3_5TextConfig defaults, for fields a file omits
    "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "partial_rotary_factor": 0.25,
    "full_attention_interval": 4,
    # Qwen3_5MoeTextConfig's (35B-A3B's)
    "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512}
# transformers' and llama.cpp's mrope_section where a config has none (time, height, width)
_DEFAULT_MROPE_SECTION = (11, 11, 10)
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads")


# every name a Qwen3.5 checkpoint has: dense or MoE, text model or ConditionalGeneration folder
QWEN35_ARCHITECTURES = (QWEN35_ARCHITECTURE, QWEN35_MOE_ARCHITECTURE, *_CONDITIONAL)


def is_qwen35(architecture: str) -> bool:
    return architecture in QWEN35_ARCHITECTURES


def qwen35_hf_config(cfg: dict, arch: str) -> ModelConfig:
    """The ModelConfig of a ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` config.json, or
    of the text model of a ConditionalGeneration one. ValueError for what radixserve does not
    run: an activation other than silu, rope scaling, unknown or miscounted layer types."""
    text = _text_config(cfg, arch)
    runs = _CONDITIONAL.get(arch, arch)
    required = _REQUIRED + (() if runs == QWEN35_MOE_ARCHITECTURE else ("intermediate_size",))
    missing = [k for k in required if k not in text]
    if missing:
        raise ValueError(f"Qwen3.5 config.json lacks {missing}")

    def get(key):
        return text.get(key, _TEXT_DEFAULTS.get(key))

    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported Qwen3.5 activation {act!r}; supported: ['silu']")
    num_layers = text["num_hidden_layers"]
    layer_types = text.get("layer_types") or default_layer_types(
        num_layers, get("full_attention_interval"))
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    # NOTE: mrope sections (``mrope_section``, ``mrope_interleaved``) are fine: for text the
    # three position streams (time, height, width) are the same token index, so interleaved
    # mRoPE rotates every frequency by that index: plain RoPE over the rotary dims; image rows
    # take their grid positions (ModelConfig.mrope; transformers interleaves whatever
    # ``mrope_interleaved`` says)
    if rope_type != "default":
        raise ValueError(f"unsupported Qwen3.5 rope type {rope_type!r}; supported: ['default']")
    head_dim = get("head_dim")
    partial = rope.get("partial_rotary_factor", get("partial_rotary_factor"))
    heads = text["num_attention_heads"]
    moe = _hf_moe(get) if runs == QWEN35_MOE_ARCHITECTURE else None
    return ModelConfig(
        architecture=runs,
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=text["num_key_value_heads"] or heads,
        head_dim=head_dim,
        intermediate_size=text.get("intermediate_size") or moe.intermediate_size,
        rms_norm_eps=get("rms_norm_eps"),
        rope_theta=float(rope.get("rope_theta") or text.get("rope_theta") or 10000.0),
        max_position_embeddings=get("max_position_embeddings"),
        tie_word_embeddings=_tied(cfg, text, arch),
        attention_bias=text.get("attention_bias", False),
        qk_norm=True,
        rotary_dim=None if partial == 1.0 else int(head_dim * partial),
        linear_attn=_linear_params(layer_types, num_layers, get),
        attn_output_gate=True,
        moe=moe,
        mrope=qwen35_mrope(rope.get("mrope_section") or _DEFAULT_MROPE_SECTION),
    )


def qwen35_mrope(sections) -> MRopeParams:
    """Qwen3.5's interleaved mRoPE over ``sections`` (config.json's ``mrope_section``, a GGUF's
    ``rope.dimension_sections``), trailing zero sections dropped: both files give one value."""
    sections = [int(s) for s in sections]
    while sections and sections[-1] == 0:
        sections.pop()
    return MRopeParams(tuple(sections), interleaved=True)


def _hf_moe(get) -> MoeConfig:
    """transformers' Qwen3.5-MoE block: every layer sparse, the top-k weights always
    renormalized (its router divides by their sum; the config has no ``norm_topk_prob``), a
    shared expert in each."""
    return MoeConfig(get("num_experts"), get("num_experts_per_tok"),
                     get("moe_intermediate_size"), norm_topk_prob=True,
                     shared_expert_size=get("shared_expert_intermediate_size"))


def _text_config(cfg: dict, arch: str) -> dict:
    if arch not in _CONDITIONAL:
        return cfg
    text = cfg.get("text_config") or {}
    if not text:
        raise ValueError(f"a {arch} config.json needs a text_config object")
    return text


def _tied(cfg: dict, text: dict, arch: str) -> bool:
    """transformers ties the head to the embedding as the loaded class's config says: the top
    level's for ConditionalGeneration (the text config's where the top level is silent)."""
    if arch in _CONDITIONAL and "tie_word_embeddings" in cfg:
        return bool(cfg["tie_word_embeddings"])
    return bool(text.get("tie_word_embeddings", False))


def default_layer_types(num_layers: int, interval: int) -> list[str]:
    """transformers' and llama.cpp's pattern: layer i is full attention when (i + 1) is a
    multiple of ``interval``, linear otherwise."""
    if not interval or interval < 1:
        raise ValueError(f"full_attention_interval must be >= 1, got {interval!r}")
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]


def _linear_params(layer_types, num_layers: int, get) -> LinearAttnParams:
    if len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    return LinearAttnParams(
        layer_types=tuple(layer_types),
        num_key_heads=get("linear_num_key_heads"),
        num_value_heads=get("linear_num_value_heads"),
        key_head_dim=get("linear_key_head_dim"),
        value_head_dim=get("linear_value_head_dim"),
        conv_kernel=get("linear_conv_kernel_dim"),
    )


def qwen35_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``qwen35`` / ``qwen35moe`` GGUF file (the keys llama.cpp's converter
    writes; a MoE file's ``expert_*`` keys and router tensors: models/moe.py's
    ``moe_from_gguf``); ``field(reader, key, default)`` reads one metadata value. The MTP block
    a file may carry (``nextn_predict_layers`` blocks after the decoder's) is not part of it."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    names = {t.name for t in reader.tensors}
    num_mtp = get("nextn_predict_layers", 0)
    num_layers = get("block_count") - num_mtp
    if num_mtp and "blk.0.attn_norm.weight" not in names:
        raise ValueError("this qwen35 GGUF file holds only an MTP draft block (no decoder "
                         "layers); load the full model's file")
    recurrent = get("attention.recurrent_layers")
    layer_types = ([LINEAR if r else FULL for r in recurrent[:num_layers]] if recurrent
                   else default_layer_types(num_layers, get("full_attention_interval", 4)))
    kind = get("rope.scaling.type", "none")
    if kind != "none":
        raise ValueError(f"unsupported qwen35 rope scaling {kind!r}; supported: none")
    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    rotary = get("rope.dimension_count", head_dim)
    num_v_heads = get("ssm.time_step_rank")
    first_full = layer_types.index(FULL) if FULL in layer_types else 0
    moe = moe_from_gguf(lambda key, default=None: field(reader, key, default), gguf_arch, names,
                        num_layers)
    if moe is None and arch == QWEN35_MOE_ARCHITECTURE:
        raise ValueError(f"this {gguf_arch} GGUF file has no experts "
                         f"({gguf_arch}.expert_count is missing or 0)")
    return ModelConfig(
        architecture=arch,
        vocab_size=get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=get("attention.head_count_kv", heads),
        head_dim=head_dim,
        intermediate_size=get("feed_forward_length") or get("expert_feed_forward_length"),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=get("context_length", 32768),
        tie_word_embeddings="output.weight" not in names,
        attention_bias=f"blk.{first_full}.attn_q.bias" in names,
        qk_norm=True,
        rotary_dim=rotary if rotary < head_dim else None,
        linear_attn=LinearAttnParams(
            layer_types=tuple(layer_types),
            num_key_heads=get("ssm.group_count"),
            num_value_heads=num_v_heads,
            key_head_dim=get("ssm.state_size"),
            value_head_dim=get("ssm.inner_size") // num_v_heads,
            conv_kernel=get("ssm.conv_kernel"),
        ),
        attn_output_gate=True,
        moe=moe,
        mrope=(qwen35_mrope(get("rope.dimension_sections", _DEFAULT_MROPE_SECTION))
               if gguf_arch in ("qwen35", "qwen35moe") else None),
    )


def qwen35_hf_name(name: str) -> str | None:
    """A Qwen3.5 folder's tensor name → the text model's, without ``model.``
    (``layers.0.linear_attn.A_log``, ``lm_head.weight``): a ConditionalGeneration folder's
    ``model.language_model.`` prefix removed; None for its vision tower (``model.visual.*``).
    The MTP block's (``mtp.*``) are kept: the model drops them unless the block runs."""
    if name.startswith("model.visual."):
        return None
    return name.removeprefix("model.").removeprefix("language_model.")


def qwen35_hf_weights(weights):
    """``qwen35_hf_name`` over (name, tensor) pairs, the skipped ones left out."""
    for name, tensor in weights:
        hf_name = qwen35_hf_name(name)
        if hf_name is not None:
            yield hf_name, tensor

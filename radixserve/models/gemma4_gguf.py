"""llama.cpp's ``gemma4`` GGUF files (what Ollama and llama.cpp users run): their metadata as a
ModelConfig and their tensor names as models/gemma4.py names them.

What the converter (``Gemma4Model`` in convert_hf_to_gguf.py) writes, and how it reads back:

- norms as stored in the checkpoint (``norm_shift`` 0: Gemma 4's RMSNorm multiplies by w, not
  Gemma 3's 1 + w), no Q/K row permutation, so every value loads as it is;
- ``attention.key_length`` / ``key_length_swa``: the global and sliding layers' head dims;
  ``head_count_kv`` per layer where the global layers have their own KV head count;
- ``attention.sliding_window_pattern``: one bool a layer (True: sliding);
- ``attention.shared_kv_layers``: the last layers that attend over an earlier layer's KV;
- ``feed_forward_length`` per layer where the shared-KV layers' MLPs are double wide;
- ``embedding_length_per_layer_input``: the per-layer input width (0: none); the table
  ``per_layer_token_embd`` [per-layer vocab, layers x width];
- ``rope.freq_base`` / ``freq_base_swa``: the global and sliding rope bases; the global
  layers' proportional rope as the ``rope_freqs`` tensor: 1 on the rotated frequency pairs,
  1e30 on the others (so the rotated share is the count of small factors);
- values taken from the key projection (``attention_k_eq_v``): no ``attn_v`` on the global
  layers;
- the router's ``scale`` as ``ffn_gate_inp.scale``, ``per_expert_scale`` as
  ``ffn_down_exps.scale``, the layer scalar as ``layer_output_scale.weight``.
"""

from __future__ import annotations

import numpy as np

from radixserve.model_config import Gemma4Params, ModelConfig
from radixserve.models.gemma4_config import kv_sources
from radixserve.models.moe import EXPERT

_BLOCK = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj", "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection", "post_norm": "post_per_layer_input_norm",
    "ffn_gate_inp": "router.proj", "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
    "post_ffw_norm_1": "post_feedforward_layernorm_1",
    "post_ffw_norm_2": "post_feedforward_layernorm_2",
}
# (GGUF base, suffix) → the whole HF name after ``layers.N.`` (parameters without ``.weight``)
_BLOCK_EXACT = {
    ("layer_output_scale", "weight"): "layer_scalar",
    ("ffn_gate_inp", "scale"): "router.scale",
    ("ffn_down_exps", "scale"): "router.per_expert_scale",
    # 3-D [n_expert, rows, cols]: one matrix per expert (``EXPERT``: its index), as stored
    ("ffn_gate_up_exps", "weight"): f"experts.{EXPERT}.gate_up_proj.weight",
    ("ffn_down_exps", "weight"): f"experts.{EXPERT}.down_proj.weight",
}
_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head",
        "per_layer_token_embd": "embed_tokens_per_layer",
        "per_layer_model_proj": "per_layer_model_projection",
        "per_layer_proj_norm": "per_layer_projection_norm"}
# the vision / audio towers' and projectors' tensors (llama.cpp's mmproj names), which files
# bundling them carry beside the text model: not run here
_TOWERS = ("v", "a", "mm")
_UNROTATED = 1e29  # rope_freqs above this: a pair that does not rotate (the converter's 1e30)


def gemma4_gguf_name(gguf_name: str) -> str | None:
    """A ``gemma4`` file's tensor name → models/gemma4.py's (None: ``rope_freqs``, read into
    the config, and the towers' tensors; a 3-D expert tensor's holds ``EXPERT``, which the
    loaders fill per expert: moe.py's ``expand_experts`` / ``split_expert_weights``).
    ValueError for a tensor this model does not have."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4:
        layer, base, suffix = parts[1:]
        if (base, suffix) in _BLOCK_EXACT:
            return f"layers.{layer}.{_BLOCK_EXACT[base, suffix]}"
        if base in _BLOCK:
            return f"layers.{layer}.{_BLOCK[base]}.{suffix}"
    elif parts[0] == "rope_freqs" or parts[0] in _TOWERS:
        return None
    elif parts[0] in _TOP and len(parts) == 2:
        return f"{_TOP[parts[0]]}.{parts[1]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a Gemma 4 model")


def gemma4_gguf_config(reader, field, gguf_arch: str, arch: str) -> ModelConfig:
    """The ModelConfig of a ``gemma4`` file (``field(reader, key, default)`` reads one key).
    ValueError where the file says something this model does not run."""
    def get(key, default=None):
        return field(reader, f"{gguf_arch}.{key}", default)

    tensors = {t.name: t for t in reader.tensors}
    num_layers = get("block_count")
    sliding = _per_layer(get("attention.sliding_window_pattern"), num_layers, "sliding pattern")
    if sliding is None:
        raise ValueError("a Gemma 4 GGUF file needs gemma4.attention.sliding_window_pattern")
    sliding = [bool(s) for s in sliding]
    sliding[-1] = False  # as transformers forces it
    layer_types = ["sliding_attention" if s else "full_attention" for s in sliding]
    sources = kv_sources(layer_types, get("attention.shared_kv_layers", 0))
    shared = tuple(i for i, s in enumerate(sources) if s != i)
    heads = get("attention.head_count")
    kv_heads = _per_layer(get("attention.head_count_kv", 1), num_layers, "head_count_kv")
    global_dim = get("attention.key_length")
    head_dim = get("attention.key_length_swa", global_dim)
    shapes = tuple((kv_heads[i], head_dim if s else global_dim) for i, s in enumerate(sliding))
    for layer, (n, _) in enumerate(shapes):
        if heads % n:
            raise ValueError(f"Gemma 4 layer {layer}: {heads} query heads over {n} KV heads")
    ffn = _per_layer(get("feed_forward_length"), num_layers, "feed_forward_length")
    wide = _double_wide(ffn, shared)
    fraction, factor = _global_rope(tensors.get("rope_freqs.weight"), global_dim)
    per_layer_dim = get("embedding_length_per_layer_input", 0)
    table = tensors.get("per_layer_token_embd.weight")
    if per_layer_dim and table is None:
        raise ValueError("a Gemma 4 GGUF file with per-layer inputs needs per_layer_token_embd")
    num_experts = get("expert_count", 0)
    top_k = get("expert_used_count", 0)
    if num_experts and not 1 <= top_k <= num_experts:
        raise ValueError(f"Gemma 4 MoE: expert_used_count must be in 1..{num_experts}, "
                         f"got {top_k}")
    vocab = get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return ModelConfig(
        architecture=arch, vocab_size=vocab,
        hidden_size=get("embedding_length"), num_layers=num_layers, num_heads=heads,
        num_kv_heads=kv_heads[sliding.index(True)] if any(sliding) else kv_heads[0],
        head_dim=head_dim, intermediate_size=ffn[0],
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=get("context_length", 131072),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors, qk_norm=True,
        sliding_window=get("attention.sliding_window", 512),
        sliding_layers=tuple(sliding), kv_source=sources if shared else None, kv_shapes=shapes,
        gemma4=Gemma4Params(
            rope_local_theta=float(get("rope.freq_base_swa", 10000.0)),
            global_rope_theta=float(get("rope.freq_base", 1e6)),
            global_rope_fraction=fraction, global_rope_factor=factor,
            final_logit_softcapping=get("final_logit_softcapping"),
            per_layer_dim=per_layer_dim,
            per_layer_vocab=int(table.shape[1]) if per_layer_dim else vocab,
            double_wide_layers=wide,
            k_eq_v_layers=tuple(i for i, s in enumerate(sliding) if not s and sources[i] == i
                                and f"blk.{i}.attn_v.weight" not in tensors),
            num_experts=num_experts, top_k_experts=top_k if num_experts else 0,
            moe_intermediate_size=get("expert_feed_forward_length", 0) if num_experts else 0,
            pad_token_id=_padding_id(reader),
            # NOTE: a GGUF does not carry use_bidirectional_attention: the releases with
            # per-layer inputs (E2B, E4B) have it off, the others "vision" (llama.cpp's mtmd
            # tells them apart by width, E2B 1536 and E4B 2560 causal)
            vision_bidirectional=not per_layer_dim),
    )


def _per_layer(value, num_layers: int, what: str) -> list | None:
    """A key written as one value or one a layer → one a layer (None stays None)."""
    if value is None:
        return None
    values = list(value) if isinstance(value, (list, tuple)) else [value] * num_layers
    if len(values) != num_layers:
        raise ValueError(f"Gemma 4 {what} has {len(values)} entries for {num_layers} layers")
    return values


def _double_wide(ffn: list[int], shared: tuple[int, ...]) -> tuple[int, ...]:
    """The layers whose MLP is twice the first layer's width (only shared-KV ones may be)."""
    wide = tuple(i for i, n in enumerate(ffn) if n == 2 * ffn[0] and i in shared)
    if any(n != ffn[0] for i, n in enumerate(ffn) if i not in wide):
        raise ValueError(f"unsupported Gemma 4 feed_forward_length {ffn}: one width, doubled "
                         "only on the shared-KV layers")
    return wide


def _global_rope(rope_freqs, head_dim: int) -> tuple[float, float]:
    """(rotated share of a global head, the rotated pairs' divisor) from ``rope_freqs``: the
    converter's proportional rope (absent: every pair rotates, undivided)."""
    if rope_freqs is None:
        return 1.0, 1.0
    factors = np.asarray(rope_freqs.data, dtype=np.float32).reshape(-1)
    if factors.size != head_dim // 2:
        raise ValueError(f"Gemma 4 rope_freqs has {factors.size} entries for global heads of "
                         f"{head_dim}")
    rotated = factors < _UNROTATED
    num_rotated = int(rotated.sum())
    if not rotated[:num_rotated].all() or len(set(factors[rotated].tolist())) > 1:
        raise ValueError("unsupported Gemma 4 rope_freqs: expected one factor on the first "
                         "pairs and 1e30 (no rotation) on the rest")
    factor = float(factors[0]) if num_rotated else 1.0
    return 2 * num_rotated / head_dim, factor


def _padding_id(reader) -> int:
    field = reader.fields.get("tokenizer.ggml.padding_token_id")
    return 0 if field is None else int(field.contents())

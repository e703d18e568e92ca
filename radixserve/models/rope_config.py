"""The rope fields of a ModelConfig (``rope_theta``, ``rope_scaling``, ``rotary_dim``), read
from a config.json (transformers v4 ``rope_scaling`` or v5 ``rope_parameters``) or from the
GGUF keys and tensors llama.cpp's converter writes. Unknown scaling types fail here, at load,
naming the supported ones (layers/rope_scaling.py)."""

from __future__ import annotations

from radixserve.layers.rope_scaling import normalize_rope_scaling

# transformers' Phi3Config renames the older names of longrope and always has an original
# length (4096 when config.json has none)
_PHI3_ALIASES = {"su": "longrope", "yarn": "longrope"}
_PHI3_ORIGINAL_DEFAULT = 4096


def hf_rope_fields(cfg: dict, arch: str) -> dict:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    max_positions = cfg.get("max_position_embeddings", 2048)
    original = cfg.get("original_max_position_embeddings")
    is_phi3 = arch == "Phi3ForCausalLM"
    if is_phi3 and original is None:
        original = _PHI3_ORIGINAL_DEFAULT
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    partial = (cfg.get("partial_rotary_factor") or params.get("partial_rotary_factor")
               or scaling.get("partial_rotary_factor") or 1.0)
    return {
        "rope_theta": cfg.get("rope_theta") or params.get("rope_theta", 10000.0),
        "rope_scaling": normalize_rope_scaling(scaling, max_positions, original,
                                               _PHI3_ALIASES if is_phi3 else None),
        "rotary_dim": None if partial == 1.0 else int(head_dim * partial),
    }


def gguf_rope_fields(field, tensors: dict, arch: str, head_dim: int,
                     max_positions: int) -> dict:
    """``field(key, default)`` reads a GGUF key; ``tensors``: name → tensor of the file.
    llama3 scaling travels as ``rope_freqs.weight`` divisors, longrope (Phi-3) as
    ``rope_factors_long`` / ``rope_factors_short`` with ``rope.scaling.attn_factor``, linear
    and yarn as ``rope.scaling.*`` keys."""
    dims = field(f"{arch}.rope.dimension_count", head_dim)
    original = field(f"{arch}.rope.scaling.original_context_length")
    kind = field(f"{arch}.rope.scaling.type", "none")
    scaling: dict | None = None
    if "rope_freqs.weight" in tensors:
        scaling = {"rope_type": "freq_factors", "factors": _floats(tensors["rope_freqs.weight"])}
    elif "rope_factors_long.weight" in tensors or kind == "longrope":
        scaling = {"rope_type": "longrope",
                   "long_factor": _floats(tensors["rope_factors_long.weight"]),
                   "short_factor": _floats(tensors["rope_factors_short.weight"]),
                   "attention_factor": field(f"{arch}.rope.scaling.attn_factor")}
    elif kind == "linear":
        scaling = {"rope_type": "linear", "factor": field(f"{arch}.rope.scaling.factor")}
    elif kind == "yarn":
        scaling = _gguf_yarn(field, arch)
    elif kind != "none":
        raise ValueError(f"unsupported GGUF rope scaling type {kind!r}; supported: "
                         "none, linear, yarn, longrope (and llama3 as rope_freqs.weight)")
    return {
        "rope_theta": field(f"{arch}.rope.freq_base", 10000.0),
        "rope_scaling": normalize_rope_scaling(scaling, max_positions, original),
        "rotary_dim": dims if dims < head_dim else None,
    }


def _gguf_yarn(field, arch: str) -> dict:
    """llama.cpp's yarn keys under transformers' names. The attention factor is transformers'
    default from ``factor`` (0.1 ln(factor) + 1, which ggml's yarn also applies);
    ``yarn_attn_factor`` / ``yarn_log_multiplier`` (DeepSeek's extra scales) are not read."""
    key = f"{arch}.rope.scaling."
    scaling = {"rope_type": "yarn", "factor": field(key + "factor"),
               "beta_fast": field(key + "yarn_beta_fast"),
               "beta_slow": field(key + "yarn_beta_slow")}
    return {k: v for k, v in scaling.items() if v is not None}


def _floats(tensor) -> list[float]:
    return [float(x) for x in tensor.data]

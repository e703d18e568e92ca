"""The ModelConfig fields every Llama-shaped decoder states the same way, from a config.json or
from the GGUF keys llama.cpp's converter writes (``{arch}.block_count``, ...): what the
families of their own (models/families.py) read before their differences."""

from __future__ import annotations


def hf_decoder_fields(cfg: dict) -> dict:
    """vocab, widths, layers, heads, eps, positions and tied head of a config.json.
    ValueError for an activation other than SiLU or biases the Llama layers do not have."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported activation {act!r}; supported: ['silu']")
    if cfg.get("mlp_bias"):
        raise ValueError("MLP biases (mlp_bias) are not supported")
    heads = cfg["num_attention_heads"]
    return {
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "num_layers": cfg["num_hidden_layers"],
        "num_heads": heads,
        "num_kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "intermediate_size": cfg["intermediate_size"],
        "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": cfg.get("max_position_embeddings", 2048),
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
    }


def gguf_decoder_fields(reader, get) -> dict:
    """The same fields of a GGUF file; ``get(key, default)`` reads ``{arch}.key``. The head is
    tied where the file has no ``output.weight``."""
    hidden, heads = get("embedding_length"), get("attention.head_count")
    vocab = get("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_layers": get("block_count"),
        "num_heads": heads,
        "num_kv_heads": get("attention.head_count_kv", heads),
        "head_dim": get("attention.key_length", hidden // heads),
        "intermediate_size": get("feed_forward_length"),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "max_position_embeddings": get("context_length", 2048),
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors),
    }

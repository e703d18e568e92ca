"""Weights in: GGUF files (via ``gguf``) and Hugging Face safetensors folders.

``ModelSource`` (models/source.py) says where a model is; ``load_model_config`` reads its
shape; ``load_model``
builds the module and fills it. Tensors are mapped to Hugging Face names; llama.cpp's
Q/K row permutation (Llama GGUF files only) is undone here.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator

import torch
from tqdm import tqdm

from radixserve.config import ModelConfig
from radixserve.models.gguf_quant import dequantize
from radixserve.models.gguf_stored import load_stored
from radixserve.models.half_stored import load_half_stored
from radixserve.models.quantization import quantize_linears_
from radixserve.models.registry import GGUF_ARCHITECTURES, get_model_class
from radixserve.models.source import ModelSource


def open_gguf(path: str):
    """A ``gguf.GGUFReader``; ValueError if the file is not a readable GGUF."""
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # the reader raises assorted errors on bad files
        raise ValueError(f"{path} is not a valid GGUF file (corrupt or truncated?): {exc}") from exc


def load_model_config(source: ModelSource, reader=None) -> ModelConfig:
    if source.kind == "gguf":
        return _gguf_config(reader or open_gguf(source.path))
    with open(os.path.join(source.path, "config.json")) as f:
        return _hf_config(json.load(f))


def load_model(source: ModelSource, config: ModelConfig, device: torch.device,
               dtype: torch.dtype, reader=None, show_progress: bool = True,
               quantization: str = "none") -> torch.nn.Module:
    """The model with its weights loaded; ``quantization``: a resolved name, "none", "int8",
    "gguf" or "16bit-stored" (see models/quantization.py; "gguf": the file's matrices as
    stored, "16bit-stored": a float16 / bfloat16 folder's linear weights in 16 bits; no float
    copy of those matrices either way)."""
    cls = get_model_class(config.architecture)
    with torch.device("meta"):
        model = cls(config)
    if quantization == "gguf":
        unpermute = config.architecture in _PERMUTED_ARCHITECTURES
        load_stored(model, reader or open_gguf(source.path), config, device, hf_name,
                    unpermute_rows if unpermute else None, show_progress)
        return model.eval()
    if quantization == "16bit-stored":
        return load_half_stored(model, source.path, device, show_progress).eval()
    model = model.to_empty(device=device).to(dtype)
    model.rotary.reset_tables(device)
    if source.kind == "gguf":
        reader = reader or open_gguf(source.path)
        weights, total = _gguf_weights(reader, config), len(reader.tensors)
    else:
        weights, total = _safetensors_weights(source.path), None
    bar = tqdm(weights, total=total, desc=f"loading {source.name}", unit="tensor",
               disable=not show_progress, leave=False)
    with torch.no_grad():
        model.load_weights((name, t.to(device=device, dtype=dtype)) for name, t in bar)
    if quantization == "int8":
        quantize_linears_(model)
    return model.eval()


# -- Hugging Face folders -------------------------------------------------------------------

def _hf_config(cfg: dict) -> ModelConfig:
    archs = cfg.get("architectures") or ["?"]
    arch = archs[0]
    get_model_class(arch)  # ValueError naming the supported ones
    rope = cfg.get("rope_parameters") or {}
    rope_scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default")
                                               != "default" else None)
    heads = cfg["num_attention_heads"]
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta") or rope.get("rope_theta", 10000.0),
        rope_scaling=rope_scaling,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        attention_bias=arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False),
        qk_norm=arch == "Qwen3ForCausalLM",
    )


def _safetensors_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


# -- GGUF -----------------------------------------------------------------------------------

def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _gguf_config(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; "
                         f"supported: {sorted(GGUF_ARCHITECTURES)}")
    names = {t.name for t in reader.tensors}
    hidden = _field(reader, f"{arch}.embedding_length")
    heads = _field(reader, f"{arch}.attention.head_count")
    vocab = _field(reader, f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    rope_scaling = None
    if "rope_freqs.weight" in names:
        factors = next(t for t in reader.tensors if t.name == "rope_freqs.weight").data
        rope_scaling = {"rope_type": "freq_factors", "factors": [float(x) for x in factors]}
    elif _field(reader, f"{arch}.rope.scaling.type") == "linear":
        rope_scaling = {"rope_type": "linear",
                        "factor": _field(reader, f"{arch}.rope.scaling.factor")}
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=_field(reader, f"{arch}.block_count"),
        num_heads=heads,
        num_kv_heads=_field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=_field(reader, f"{arch}.attention.key_length", hidden // heads),
        intermediate_size=_field(reader, f"{arch}.feed_forward_length"),
        rms_norm_eps=_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=_field(reader, f"{arch}.rope.freq_base", 10000.0),
        rope_scaling=rope_scaling,
        max_position_embeddings=_field(reader, f"{arch}.context_length", 2048),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
    )


_GGUF_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """llama.cpp tensor name → HF name (without the ``model.`` prefix); None to skip."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        layer, base, suffix = parts[1], parts[2], parts[3]
        if base not in _GGUF_NAMES:
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
        return f"layers.{layer}.{_GGUF_NAMES[base]}.{suffix}"
    if parts[0] == "rope_freqs":
        return None
    if parts[0] not in _GGUF_TOP:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"{_GGUF_TOP[parts[0]]}.{parts[1]}"


_PERMUTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")  # llama.cpp permutes Q/K


def _gguf_weights(reader, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named float tensors, Q/K rows unpermuted."""
    unpermute = config.architecture in _PERMUTED_ARCHITECTURES
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))
        weight = dequantize(tensor.data, tensor.tensor_type, shape)
        heads = (config.num_heads if name.endswith("q_proj.weight") else
                 config.num_kv_heads if name.endswith("k_proj.weight") else None)
        if unpermute and heads is not None:
            weight = _unpermute(weight, heads)
        yield name, weight


def unpermute_rows(rows: int, num_heads: int) -> torch.Tensor:
    """The row order (an index) that ``_unpermute`` applies to a Q/K matrix of ``rows`` rows."""
    return _unpermute(torch.arange(rows)[:, None], num_heads)[:, 0]


def _unpermute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``reshape(h, 2, d/2, in).swapaxes(1, 2)`` on Q/K rows."""
    rows, cols = w.shape
    return w.reshape(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)

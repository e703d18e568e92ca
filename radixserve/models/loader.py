"""Weights in: GGUF files (via ``gguf``) and Hugging Face safetensors folders.

``ModelSource`` (models/source.py) says where a model is; ``load_model_config`` reads its
shape; ``load_model``
builds the module and fills it. Tensors are mapped to Hugging Face names; llama.cpp's
Q/K row permutation (Llama GGUF files only) is undone here; matrices a checkpoint stores
fused (Phi-3's ``qkv_proj`` / ``attn_qkv``, ``gate_up_proj`` / ``ffn_up``) load as they are.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator

import torch
from tqdm import tqdm

from radixserve.config import DTYPES, DeviceConfig
from radixserve.models.tp_shard import TensorShard
from radixserve.layers.block_linear import REPACK, Repack
from radixserve.layers.gguf_quant import dequantize
from radixserve.models.gguf_stored import load_stored
from radixserve.models.moe import (GGUF_EXPERT_NAMES, moe_from_gguf, moe_from_hf,
                                   split_expert_weights)
from radixserve.models.half_stored import load_half_stored
from radixserve.models.families import family_of
from radixserve.model_config import ModelConfig
from radixserve.gguf_reader import open_gguf
from radixserve.models.quantization import quantize_linears_
from radixserve.models.registry import GGUF_ARCHITECTURES, get_model_class
from radixserve.models.rope_config import gguf_rope_fields, hf_rope_fields
from radixserve.models.source import ModelSource
from radixserve.models.window_config import hf_window_fields


_TORCH_DTYPES = {name: getattr(torch, name) for name in DTYPES}


def device_and_dtype(config: DeviceConfig) -> tuple[torch.device, torch.dtype]:
    """The torch device and the model's element type that ``config`` names (its dtype, else
    bfloat16 on CUDA and float32 elsewhere); ValueError for a dtype not in ``DTYPES``."""
    name = config.dtype or ("bfloat16" if config.device.startswith("cuda") else "float32")
    if name not in _TORCH_DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; supported: {sorted(_TORCH_DTYPES)}")
    return torch.device(config.device), _TORCH_DTYPES[name]


def load_model_config(source: ModelSource, reader=None) -> ModelConfig:
    if source.kind == "gguf":
        return _gguf_config(reader or open_gguf(source.path))
    with open(os.path.join(source.path, "config.json")) as f:
        return _hf_config(json.load(f))


def load_model(source: ModelSource, config: ModelConfig, device: torch.device,
               dtype: torch.dtype, reader=None, show_progress: bool = True,
               quantization: str = "none",
               shard: TensorShard = TensorShard(), packs: Repack = REPACK) -> torch.nn.Module:
    """The model with its weights loaded; ``quantization``: a resolved name, "none", "int8",
    "gguf" or "16bit-stored" (see models/quantization.py; "gguf": the file's matrices as
    stored, "16bit-stored": a float16 / bfloat16 folder's linear weights in 16 bits; no float
    copy of those matrices either way). ``shard``: the tensor-parallel rank's share to build
    and load (models/tp_shard.py; the default keeps the whole model); its ``config`` is
    then the rank's shape. ``packs``: where a GGUF's packed matrices come from ("gguf":
    models/packed_cache.py)."""
    cls = get_model_class(config.architecture)
    with torch.device("meta"):
        model = cls(shard.local_config(config))
    if quantization == "gguf":
        unpermute = config.architecture in _PERMUTED_ARCHITECTURES
        reader = reader or open_gguf(source.path)
        layout = _gguf_layout(config)
        load_stored(model, reader, config, device, _gguf_namer(config, reader),
                    unpermute_rows if unpermute else None, show_progress, shard, layout,
                    packs)
        return shard.wrap_row_parallel_(model.eval())
    if quantization == "16bit-stored":
        family = family_of(config.architecture)
        model = load_half_stored(model, source.path, device, show_progress, shard,
                                 family and family.hf_name)
        return shard.wrap_row_parallel_(model.eval())
    model = model.to_empty(device=device).to(dtype)
    model.rotary.reset_tables(device)
    if source.kind == "gguf":
        reader = reader or open_gguf(source.path)
        weights, total = _gguf_weights(reader, config), len(reader.tensors)
    else:
        family = family_of(config.architecture)
        weights, total = _safetensors_weights(source.path, family and family.hf_name), None
        if family is not None:
            weights = family.hf_weights(weights)
    bar = tqdm(weights, total=total, desc=f"loading {source.name}", unit="tensor",
               disable=not show_progress, leave=False, delay=1.0)
    with torch.no_grad():
        model.load_weights((name, shard.take(name, t).to(device=device, dtype=dtype))
                           for name, t in bar)
    if quantization == "int8":
        quantize_linears_(model)
    return shard.wrap_row_parallel_(model.eval())


# -- Hugging Face folders -------------------------------------------------------------------

def _hf_config(cfg: dict) -> ModelConfig:
    archs = cfg.get("architectures") or ["?"]
    arch = archs[0]
    if (family := family_of(arch)) is not None:
        return family.hf_config(cfg, arch)
    get_model_class(arch)  # ValueError naming the supported ones
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
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        attention_bias=(arch == "Qwen2ForCausalLM" or cfg.get("attention_bias", False)
                        or arch == "Qwen2MoeForCausalLM" and cfg.get("qkv_bias", True)),
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        moe=moe_from_hf(arch, cfg, cfg["num_hidden_layers"]),
        **hf_window_fields(cfg, arch),
        **hf_rope_fields(cfg, arch),
    )


def _safetensors_weights(path: str, rename=None) -> Iterator[tuple[str, torch.Tensor]]:
    """The folder's tensors as stored; those ``rename`` (a family's ``hf_name``) maps to None
    (a vision tower's) are left unread."""
    from safetensors import safe_open

    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                if rename is None or rename(name) is not None:
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
    family = family_of(GGUF_ARCHITECTURES[arch])
    if family is not None and family.gguf_config is not None:
        return family.gguf_config(reader, _field, arch, GGUF_ARCHITECTURES[arch])
    tensors = {t.name: t for t in reader.tensors}
    names = set(tensors)
    hidden = _field(reader, f"{arch}.embedding_length")
    heads = _field(reader, f"{arch}.attention.head_count")
    vocab = _field(reader, f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    head_dim = _field(reader, f"{arch}.attention.key_length", hidden // heads)
    max_positions = _field(reader, f"{arch}.context_length", 2048)
    num_layers = _field(reader, f"{arch}.block_count")
    moe = moe_from_gguf(lambda key, default=None: _field(reader, key, default), arch, names,
                        num_layers)
    return ModelConfig(
        architecture=("MixtralForCausalLM" if arch == "llama" and moe is not None
                      else GGUF_ARCHITECTURES[arch]),
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=_field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        intermediate_size=(_field(reader, f"{arch}.feed_forward_length")
                           or _field(reader, f"{arch}.expert_feed_forward_length")),
        rms_norm_eps=_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=max_positions,
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        moe=moe,
        sliding_window=_field(reader, f"{arch}.attention.sliding_window") or None,
        **gguf_rope_fields(lambda key, default=None: _field(reader, key, default), tensors,
                           arch, head_dim, max_positions),
    )


_GGUF_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_NAMES.update(GGUF_EXPERT_NAMES)  # router, 3-D expert tensors (models/moe.py)
_GGUF_TOP = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


_GGUF_FUSED_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
_GGUF_ROPE_TENSORS = ("rope_freqs", "rope_factors_long", "rope_factors_short")  # in the config


def gguf_name_map(reader):
    """The ``hf_name`` for this file: where no ``ffn_gate`` exists (Phi-3), ``ffn_up``
    holds gate and up stacked, as ``attn_qkv`` holds q, k and v."""
    if any(".ffn_gate." in t.name for t in reader.tensors):
        return hf_name
    return lambda gguf_name: hf_name(gguf_name, _GGUF_FUSED_NAMES)


def hf_name(gguf_name: str, fused: dict[str, str] | None = None) -> str | None:
    """llama.cpp tensor name → HF name (without the ``model.`` prefix); None to skip.
    ``fused``: GGUF names of matrices stored fused → the fused layer's HF name."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        layer, base, suffix = parts[1], parts[2], parts[3]
        names = {**_GGUF_NAMES, "attn_qkv": "self_attn.qkv_proj", **(fused or {})}
        if base not in names:
            raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
        return f"layers.{layer}.{names[base]}.{suffix}"
    if parts[0] in _GGUF_ROPE_TENSORS:
        return None
    if parts[0] not in _GGUF_TOP:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"{_GGUF_TOP[parts[0]]}.{parts[1]}"


# llama.cpp permutes the Q/K rows of these
_PERMUTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM",
                           "SmolLM3ForCausalLM", "Mistral3ForConditionalGeneration",
                           "Ministral3ForCausalLM")


def _gguf_namer(config: ModelConfig, reader):
    """The GGUF → HF tensor name mapping of ``config``'s architecture and this file."""
    family = family_of(config.architecture)
    if (layout := _gguf_layout(config)) is not None:
        return layout.hf_name
    if family is not None and family.gguf_name is not None:
        return family.gguf_name
    return gguf_name_map(reader)


def _gguf_layout(config: ModelConfig):
    """The family's GGUF layout object for ``config`` (models/families.py), or None."""
    family = family_of(config.architecture)
    if family is None or family.gguf_layout is None:
        return None
    return family.gguf_layout(config)


def _gguf_weights(reader, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named float tensors, Q/K rows unpermuted."""
    if (layout := _gguf_layout(config)) is not None:
        yield from layout.weights(reader)
        return
    unpermute = config.architecture in _PERMUTED_ARCHITECTURES
    to_hf = _gguf_namer(config, reader)
    for tensor in reader.tensors:
        name = to_hf(tensor.name)
        if name is None:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))
        weight = dequantize(tensor.data, tensor.tensor_type, shape)
        heads = (config.num_heads if name.endswith("q_proj.weight") else
                 config.num_kv_heads if name.endswith("k_proj.weight") else None)
        if unpermute and heads is not None:
            weight = _unpermute(weight, heads)
        yield from split_expert_weights(name, weight)


def unpermute_rows(rows: int, num_heads: int) -> torch.Tensor:
    """The row order (an index) that ``_unpermute`` applies to a Q/K matrix of ``rows`` rows."""
    return _unpermute(torch.arange(rows)[:, None], num_heads)[:, 0]


def _unpermute(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``reshape(h, 2, d/2, in).swapaxes(1, 2)`` on Q/K rows."""
    rows, cols = w.shape
    return w.reshape(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)

"""A ``gemma4`` GGUF file of a tiny Gemma 4 folder (tests/tiny_gemma4.py), as llama.cpp's
``convert_hf_to_gguf.py`` (``Gemma4Model``) writes it: :func:`gemma4_hf_to_gguf`.

What the converter does and this writer repeats: norms stored as they are (Gemma 4's norm
multiplies by w: no ``+ 1``); ``layer_scalar`` and the fused experts get a ``.weight`` suffix;
the router's ``scale`` becomes ``ffn_gate_inp.scale`` and ``per_expert_scale``
``ffn_down_exps.scale``; a ``rope_freqs`` tensor (1 on the global layers' rotated frequency
pairs, 1e30 on the others); per-layer head dims, KV head counts, MLP widths and the sliding
pattern as metadata. Matrices take ``ftype``; 1-D tensors, norms and the router stay F32; a
matrix whose rows do not split into Q8_0 blocks falls back to F16 (the converter's QuantError
path). The vocabulary (``tokenizer.ggml.model = gemma4``) needs a byte-fallback tokenizer.json,
as the converter does: :func:`save_byte_fallback_tokenizer` gives a tiny folder one.

benchmarks/check_tiny_gemma4_converter.py compares it with the real converter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tiny_models import _FILE_TYPES, _load_state_dict

_FULL = "full_attention"
_PAIRS = ("th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of",
          "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le",
          "ve", "co", "me", "de", "hi", "ri")  # the tiny byte-fallback tokenizer's merges


def _gguf_name(names, name: str) -> str:
    """The converter's name for a checkpoint tensor (``Gemma4Model.filter_tensors`` and
    ``modify_tensors`` first)."""
    layer = name.split(".layers.")[1].split(".")[0] if ".layers." in name else None
    if name.endswith("router.scale"):
        return f"blk.{layer}.ffn_gate_inp.scale"
    if name.endswith("router.per_expert_scale"):
        return f"blk.{layer}.ffn_down_exps.scale"
    if name.endswith("layer_scalar") or (".experts." in name and not name.endswith(".weight")):
        name += ".weight"
    gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
    if gguf_name is None:
        raise KeyError(f"no GGUF name for tensor {name!r}")
    return gguf_name


def _qtype(name: str, w: np.ndarray, ftype: str) -> str:
    """The converter's choice before quantizing (see the module docstring)."""
    if (w.ndim <= 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name
            or not name.endswith(".weight") or ftype == "F32"):
        return "F32"
    if ftype == "Q8_0" and w.shape[-1] % 32:
        return "F16"  # gguf.QuantError: the converter falls back
    return ftype


def _add_tensor(writer, name: str, w: np.ndarray, qtype: str) -> None:
    import gguf

    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype == "F32":
        writer.add_tensor(name, w)
    elif qtype == "F16":
        writer.add_tensor(name, w.astype(np.float16))
    else:
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(name, gguf.quants.quantize(w, kind), raw_dtype=kind)


def _global(text: dict, key: str, per_layer_key: str):
    """A global layers' value as the converter finds it: ``key``, else the first full layer's
    ``per_layer_config`` entry (transformers 5 saves it there), else None."""
    if text.get(key) is not None:
        return text[key]
    for i, over in (text.get("per_layer_config") or {}).items():
        if text["layer_types"][int(i)] == _FULL and per_layer_key in over:
            return over[per_layer_key]
    return None


def _rope_freqs(text: dict) -> np.ndarray:
    full = text["rope_parameters"][_FULL]
    head_dim = _global(text, "global_head_dim", "head_dim")
    rotated = int(head_dim * full["partial_rotary_factor"] / 2)
    return np.array([1.0] * rotated + [1e30] * (head_dim // 2 - rotated), dtype=np.float32)


def _add_hparams(writer, text: dict, ftype: str) -> None:
    """The keys TextModel, Gemma3Model and Gemma4Model write (final values)."""
    import gguf

    n = text["num_hidden_layers"]
    sliding = [t != _FULL for t in text["layer_types"]]
    shared = text.get("num_kv_shared_layers") or 0
    rope = text["rope_parameters"]
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(n)
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    ff = text["intermediate_size"]
    writer.add_feed_forward_length(
        [ff if i < n - shared else 2 * ff for i in range(n)]
        if text.get("use_double_wide_mlp") else ff)
    writer.add_head_count(text["num_attention_heads"])
    kv = text["num_key_value_heads"]
    global_kv = _global(text, "num_global_key_value_heads", "num_key_value_heads")
    global_dim = _global(text, "global_head_dim", "head_dim")
    writer.add_head_count_kv([kv if s else global_kv for s in sliding] if global_kv else kv)
    writer.add_rope_freq_base(rope[_FULL]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    if text.get("enable_moe_block"):
        writer.add_expert_count(text["num_experts"])
        writer.add_expert_used_count(text["top_k_experts"])
        writer.add_expert_feed_forward_length(text["moe_intermediate_size"])
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPES[ftype]]))
    writer.add_key_length(global_dim)
    writer.add_value_length(global_dim)
    writer.add_key_length_swa(text["head_dim"])
    writer.add_value_length_swa(text["head_dim"])
    if text.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(text["final_logit_softcapping"])
    writer.add_sliding_window(text["sliding_window"])
    writer.add_shared_kv_layers(shared)
    writer.add_embedding_length_per_layer_input(text.get("hidden_size_per_layer_input") or 0)
    writer.add_sliding_window_pattern(sliding)
    writer.add_rope_dimension_count(global_dim)
    swa_rope = rope["sliding_attention"].get("partial_rotary_factor", 1.0)
    writer.add_rope_dimension_count_swa(int(text["head_dim"] * swa_rope))


def save_byte_fallback_tokenizer(hf_dir: str | Path) -> Path:
    """Replace the folder's tokenizer.json with a SentencePiece-style one (BPE with byte
    fallback, ``▁`` for spaces), as Gemma's are and as the converter's vocabulary reader
    (gguf's ``LlamaHfVocab``) needs: the 256 byte pieces, letters, digits and a few merges,
    the folder's added tokens kept at their ids, the same vocabulary size. Returns ``hf_dir``."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    hf_dir = Path(hf_dir)
    old = json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8"))
    num_base = len(old["model"]["vocab"])
    pieces = [f"<0x{b:02X}>" for b in range(256)] + ["▁"]
    pieces += [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += [chr(c) for c in range(ord("A"), ord("Z") + 1)] + list("0123456789")
    merges = [("▁", chr(c)) for c in range(ord("a"), ord("z") + 1)]
    merges += [(p[0], p[1]) for p in _PAIRS]
    pieces += ["".join(m) for m in merges]
    if len(pieces) < num_base:
        raise ValueError(f"{len(pieces)} pieces for a base vocabulary of {num_base}")
    pieces, merges = pieces[:num_base], merges[:num_base - (len(pieces) - len(merges))]
    tok = Tokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, merges, byte_fallback=True,
                               unk_token=None, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    data = json.loads(tok.to_str())
    data["added_tokens"] = old["added_tokens"]
    (hf_dir / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False),
                                           encoding="utf-8")
    return hf_dir


def _add_vocab(writer, hf_dir: Path) -> None:
    """``tokenizer.ggml.*`` as the converter's ``Gemma4Model.set_vocab`` writes them, with
    gguf's own readers (``LlamaHfVocab``: a byte-fallback tokenizer.json, see
    :func:`save_byte_fallback_tokenizer`; ``SpecialVocab``)."""
    import gguf

    vocab = gguf.LlamaHfVocab(hf_dir)
    tokens, scores, types = zip(*vocab.all_tokens())
    writer.add_tokenizer_model("gemma4")
    writer.add_token_list(list(tokens))
    writer.add_token_scores(list(scores))
    writer.add_token_types([int(t) for t in types])
    gguf.SpecialVocab(hf_dir, load_merges=True).add_to_gguf(writer)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(True)


def gemma4_hf_to_gguf(hf_dir: str | Path, out_path: str | Path, ftype: str = "F32") -> Path:
    """Convert a folder of tiny_gemma4.py's ``make_gemma4_hf_model`` into a ``gemma4`` GGUF
    file; ``ftype`` F32, F16 or Q8_0 for the matrices. Returns ``out_path``."""
    import gguf

    if ftype not in ("F32", "F16", "Q8_0"):
        raise ValueError(f"ftype {ftype!r} not in ('F32', 'F16', 'Q8_0')")
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") or config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, text["num_hidden_layers"])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), "gemma4")
    _add_hparams(writer, text, ftype)
    _add_vocab(writer, hf_dir)
    writer.add_tensor("rope_freqs.weight", _rope_freqs(text))
    for name, w in _load_state_dict(hf_dir).items():
        gguf_name = _gguf_name(names, name)
        _add_tensor(writer, gguf_name, w, _qtype(gguf_name, w, ftype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path

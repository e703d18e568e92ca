"""Write a random-weight GGUF file of a real model's shape, for speed and memory benchmarks at
the sizes users run (no such file ships on PyPI, and nothing may be downloaded).

Shapes (layers, widths, heads, vocabulary, tied or separate head, biases, rope) are the
published configs' (``SHAPES``). Recipes type the tensors as llama.cpp's quantizer does:

* ``q4_k_m``: Q6_K for the output head (the embedding when tied), for ``attn_v`` and
  ``ffn_down`` on the layers llama.cpp's ``use_more_bits`` picks; Q4_K elsewhere;
* ``q4_0``: Q4_0, with a Q6_K head; ``q8_0``: Q8_0 everywhere; ``q6_k``: Q6_K everywhere;
* a matrix whose rows are not a multiple of 256 falls back as llama.cpp does (Q4_K -> Q5_0,
  Q6_K -> Q8_0).

Blocks are written directly as random bytes with their f16 scales set to a range that gives
weights of standard deviation ~0.02 (no float weights are made or quantized), tensor by
tensor straight to the file, so an 8B file takes about a minute and memory for one tensor. The tokenizer is the
embedded SmolLM2's (byte-level BPE), padded with unused tokens to the shape's vocabulary size, so
the embedding and head have their real size. The text is noise: use the files for speed and
memory (``--eos-mode ignore_eos``), not quality.

    .venv/bin/python benchmarks/make_gguf.py --shape llama-3.2-3b --recipe q4_k_m --out /tmp/3b.gguf
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from radixserve.models.default import default_model_path  # noqa: E402

_LLAMA3_ROPE = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
SHAPES = {
    # Qwen2.5-0.5B's shape with the embedded 49,152-token vocabulary (the earlier benchmark file)
    "qwen2-0.5b": dict(arch="qwen2", layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64,
                       ffn=4864, vocab=0, tied=True, qkv_bias=True, rope_theta=1e6,
                       context=32768),
    "llama-3.2-1b": dict(arch="llama", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64,
                         ffn=8192, vocab=128256, tied=True, rope_theta=5e5, context=131072,
                         rope_scaling=_LLAMA3_ROPE),
    "llama-3.2-3b": dict(arch="llama", layers=28, hidden=3072, heads=24, kv_heads=8, head_dim=128,
                         ffn=8192, vocab=128256, tied=True, rope_theta=5e5, context=131072,
                         rope_scaling=_LLAMA3_ROPE),
    "llama-3.1-8b": dict(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                         ffn=14336, vocab=128256, tied=False, rope_theta=5e5, context=131072,
                         rope_scaling=dict(_LLAMA3_ROPE, factor=8.0)),
    "qwen2.5-7b": dict(arch="qwen2", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
                       ffn=18944, vocab=152064, tied=False, qkv_bias=True, rope_theta=1e6,
                       context=32768),
    "gemma-3-4b": dict(arch="gemma3", layers=34, hidden=2560, heads=8, kv_heads=4, head_dim=256,
                       ffn=10240, vocab=262208, tied=True, rope_theta=1e6, context=131072,
                       sliding_window=1024),
    # Qwen2.5-VL-3B-Instruct's text model: Qwen2 with mRoPE sections (llama.cpp's arch qwen2vl)
    "qwen2.5-vl-3b": dict(arch="qwen2vl", layers=36, hidden=2048, heads=16, kv_heads=2,
                          head_dim=128, ffn=11008, vocab=151936, tied=True, qkv_bias=True,
                          rope_theta=1e6, context=128000, mrope_sections=[16, 24, 24, 0]),
}
RECIPES = ("q4_k_m", "q4_0", "q8_0", "q6_k")
_T = gguf.GGMLQuantizationType
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0", "Q5_K": "Q5_0"}
_FILE_TYPE = {"q4_k_m": "MOSTLY_Q4_K_M", "q4_0": "MOSTLY_Q4_0", "q8_0": "MOSTLY_Q8_0",
              "q6_k": "MOSTLY_Q6_K"}
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                   "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                   "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.padding_token_id", "tokenizer.chat_template")
_UNUSED = 5  # llama.cpp's token type for a vocabulary slot no text produces

# Per block type: (byte offset of each f16 scale field, its base value, relative spread) so that
# random codes give weights of std ~0.02 and mean ~0 (K-quants: dmin ~ d * the mean code).
_SCALES = {
    "Q4_0": ((0, 4e-3),), "Q5_0": ((0, 2e-3),), "Q8_0": ((0, 2.7e-4),),
    "Q4_K": ((0, 1e-4), (2, 7.5e-4)), "Q5_K": ((0, 7e-5), (2, 1.1e-3)),
    "Q6_K": ((208, 1.5e-5),),
    "Q2_K": ((80, 1e-3), (82, 1e-3)), "Q3_K": ((108, 1e-3),), "IQ4_NL": ((0, 2e-4),),
    "IQ4_XS": ((0, 1e-5),), "TQ1_0": ((52, 2e-2),), "TQ2_0": ((64, 2e-2),),
    "IQ2_XXS": ((0, 1e-3),), "IQ2_XS": ((0, 1e-3),), "IQ2_S": ((0, 1e-3),),
    "IQ3_XXS": ((0, 1e-3),), "IQ3_S": ((0, 1e-3),), "IQ1_S": ((0, 1e-3),),
    "MXFP4": (), "IQ1_M": (),  # their scales: random_blocks
}
_SIGNED_SCALES_Q6_K = slice(192, 208)  # Q6_K's int8 sub-block scales: random signed bytes


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth, and every third in between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(recipe: str, name: str, layer: int, layers: int, cols: int) -> str:
    """The block type llama.cpp's quantizer gives tensor `name` under `recipe`."""
    head = name == "output.weight"
    if recipe == "q4_k_m":
        wide = ("attn_v" in name or "ffn_down" in name) and more_bits(layer, layers)
        kind = "Q6_K" if head or wide else "Q4_K"
    elif recipe == "q4_0":
        kind = "Q6_K" if head else "Q4_0"
    else:
        kind = recipe.upper()
    return _FALLBACK[kind] if kind in _FALLBACK and cols % 256 else kind


def random_blocks(rng: np.random.Generator, kind: str, rows: int, cols: int) -> np.ndarray:
    """Valid random blocks of `kind` for a rows x cols matrix: uint8 [rows, bytes per row]."""
    block, size = gguf.GGML_QUANT_SIZES[_T[kind]]
    n = cols // block
    data = rng.integers(0, 256, size=(rows, n, size), dtype=np.uint8)
    for offset, base in _SCALES[kind]:
        scale = (base * rng.uniform(0.5, 1.5, size=(rows, n))).astype(np.float16)
        data[:, :, offset:offset + 2] = scale.view(np.uint8).reshape(rows, n, 2)
    if kind == "MXFP4":  # the e8m0 exponent: 2^-9 .. 2^-4 halved
        data[:, :, 0] = rng.integers(118, 124, size=(rows, n))
    if kind == "IQ1_M":  # its f16 d in the top nibbles of its four uint16 scales
        d = (1e-3 * rng.uniform(0.5, 1.5, size=(rows, n))).astype(np.float16).view(np.uint16)
        sc = data[:, :, 48:56].copy().view(np.uint16) & 0x0FFF
        for i in range(4):
            sc[:, :, i] |= ((d >> (4 * i)) & 0xF) << 12
        data[:, :, 48:56] = sc.view(np.uint8)
    return data.reshape(rows, n * size)


def copy_tokenizer(writer: gguf.GGUFWriter, vocab: int = 0) -> int:
    """The embedded model's tokenizer fields, padded with unused tokens to `vocab` entries (0:
    as it is); returns the vocabulary size."""
    reader = gguf.GGUFReader(default_model_path())
    tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    pad = max(vocab - len(tokens), 0)
    tokens += [f"<|rs_unused_{i}|>" for i in range(pad)]
    types += [_UNUSED] * pad
    for key in _TOKENIZER_KEYS:
        field = reader.fields.get(key)
        if field is None:
            continue
        value = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}.get(
            key, field.contents())
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, field.types[0])
    return len(tokens)


def _hparams(writer: gguf.GGUFWriter, shape: str, s: dict, recipe: str, vocab: int) -> None:
    writer.add_name(f"random {shape}")
    writer.add_file_type(int(gguf.LlamaFileType[_FILE_TYPE[recipe]]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_key_length(s["head_dim"])
    writer.add_value_length(s["head_dim"])
    writer.add_rope_dimension_count(s["head_dim"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(1e-6 if s["arch"] != "llama" else 1e-5)
    writer.add_vocab_size(vocab)
    if s.get("sliding_window"):
        writer.add_sliding_window(s["sliding_window"])
    if s.get("mrope_sections"):
        writer.add_rope_dimension_sections(s["mrope_sections"])


def _tensors(s: dict, vocab: int) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape as rows x cols or (n,), layer) in llama.cpp's order."""
    hidden, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    out: list[tuple[str, tuple[int, ...], int]] = [("token_embd.weight", (vocab, hidden), 0)]
    if s.get("rope_scaling"):
        out.append(("rope_freqs.weight", (s["head_dim"] // 2,), 0))
    gemma = s["arch"] == "gemma3"
    for i in range(s["layers"]):
        p = f"blk.{i}"
        out.append((f"{p}.attn_norm.weight", (hidden,), i))
        for part, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            out.append((f"{p}.{part}.weight", (rows, hidden), i))
            if s.get("qkv_bias"):
                out.append((f"{p}.{part}.bias", (rows,), i))
        if gemma:
            out += [(f"{p}.attn_q_norm.weight", (s["head_dim"],), i),
                    (f"{p}.attn_k_norm.weight", (s["head_dim"],), i)]
        out.append((f"{p}.attn_output.weight", (hidden, q), i))
        if gemma:
            out.append((f"{p}.post_attention_norm.weight", (hidden,), i))
        out.append((f"{p}.ffn_norm.weight", (hidden,), i))
        out += [(f"{p}.ffn_gate.weight", (s["ffn"], hidden), i),
                (f"{p}.ffn_up.weight", (s["ffn"], hidden), i),
                (f"{p}.ffn_down.weight", (hidden, s["ffn"]), i)]
        if gemma:
            out.append((f"{p}.post_ffw_norm.weight", (hidden,), i))
    out.append(("output_norm.weight", (hidden,), 0))
    if not s["tied"]:
        out.append(("output.weight", (vocab, hidden), 0))
    return out


def _vector(rng: np.random.Generator, name: str, n: int, s: dict) -> np.ndarray:
    if name == "rope_freqs.weight":
        from tiny_models import llama3_rope_factors
        return llama3_rope_factors(s["rope_theta"], s["head_dim"], s["rope_scaling"])
    if name.endswith(".bias"):
        return (0.02 * rng.standard_normal(n)).astype(np.float32)
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def write(shape: str, out: Path, recipe: str = "q4_k_m", seed: int = 0) -> Path:
    """Write the file; returns its path."""
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), s["arch"])
    vocab = copy_tokenizer(writer, s["vocab"])
    _hparams(writer, shape, s, recipe, vocab)
    plan = []
    for name, dims, layer in _tensors(s, vocab):
        if len(dims) == 1:
            writer.add_tensor_info(name, dims, np.dtype(np.float32), 4 * dims[0])
            plan.append((name, dims, None))
            continue
        rows, cols = dims
        # a tied embedding is the head: llama.cpp types it as the output
        as_name = "output.weight" if name == "token_embd.weight" and (
            s["tied"] or recipe == "q4_0") else name
        kind = tensor_type(recipe, as_name, layer, s["layers"], cols)
        block, size = gguf.GGML_QUANT_SIZES[_T[kind]]
        writer.add_tensor_info(name, (rows, cols // block * size), np.dtype(np.uint8),
                               rows * cols // block * size,
                               raw_dtype=_T[kind])
        plan.append((name, dims, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims, kind in plan:
        if kind is None:
            writer.write_tensor_data(_vector(rng, name, dims[0], s))
        else:
            writer.write_tensor_data(random_blocks(rng, kind, *dims))
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen2-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--recipe", default="q4_k_m", choices=RECIPES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    start = time.perf_counter()
    path = write(args.shape, Path(args.out), args.recipe, args.seed)
    print(f"{path}: {args.shape} {args.recipe}, {path.stat().st_size / 1e9:.2f} GB "
          f"in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

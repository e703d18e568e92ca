"""Write a random-weight GGUF of a real model's shape, quantized as llama.cpp's Q4_K_M recipe
types it, for benchmarks of a second architecture (no such file ships on PyPI).

``qwen2-0.5b`` is Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV heads of 64, FFN
4864, q/k/v biases, tied embeddings) with the embedded SmolLM2 tokenizer (49,152 tokens instead
of 151,936, so the head is a third of Qwen's). Q4_K_M: Q6_K for attn_v and ffn_down on the
layers llama.cpp's ``use_more_bits`` picks, Q4_K elsewhere; matrices whose rows are not a
multiple of 256 (hidden 896) fall back as llama.cpp does (Q4_K -> Q5_0, Q6_K -> Q8_0). The
weights are random, so the text is noise: use it for speed and memory (``--eos-mode
ignore_eos``), not quality.

    .venv/bin/python benchmarks/make_gguf.py --out /tmp/qwen2-0.5b-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kquants import quantize  # noqa: E402  (the tests' K-quant quantizer)

from radixserve.models.default import default_model_path  # noqa: E402

SHAPES = {"qwen2-0.5b": dict(layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64,
                             ffn=4864, rope_theta=1e6, context=32768)}
_T = gguf.GGMLQuantizationType
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                   "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                   "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.padding_token_id", "tokenizer.chat_template")


def q4_k_m_type(name: str, layer: int, layers: int, cols: int) -> str:
    more_bits = layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2
    kind = "Q6_K" if ("attn_v" in name or "ffn_down" in name) and more_bits else "Q4_K"
    return _FALLBACK[kind] if cols % 256 else kind


def _copy_tokenizer(writer: gguf.GGUFWriter, reader: gguf.GGUFReader) -> int:
    """The embedded model's tokenizer fields; returns its vocabulary size."""
    for key in _TOKENIZER_KEYS:
        field = reader.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kind)
    return len(reader.fields["tokenizer.ggml.tokens"].contents())


def write(shape: str, out: Path, seed: int = 0) -> Path:
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    reader = gguf.GGUFReader(default_model_path())
    writer = gguf.GGUFWriter(str(out), "qwen2")
    vocab = _copy_tokenizer(writer, reader)
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    hidden, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]

    def matrix(name: str, rows: int, cols: int, layer: int = 0, kind: str | None = None):
        w = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)
        kind = kind or q4_k_m_type(name, layer, s["layers"], cols)
        writer.add_tensor(name, quantize(w, _T[kind]), raw_dtype=_T[kind])

    def vector(name: str, n: int, mean: float, std: float):
        writer.add_tensor(name, (mean + std * rng.standard_normal(n)).astype(np.float32))

    matrix("token_embd.weight", vocab, hidden, kind=_FALLBACK["Q6_K"] if hidden % 256 else "Q6_K")
    vector("output_norm.weight", hidden, 1.0, 0.1)
    for i in range(s["layers"]):
        p = f"blk.{i}"
        vector(f"{p}.attn_norm.weight", hidden, 1.0, 0.1)
        vector(f"{p}.ffn_norm.weight", hidden, 1.0, 0.1)
        for part, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            matrix(f"{p}.{part}.weight", rows, hidden, i)
            vector(f"{p}.{part}.bias", rows, 0.0, 0.02)
        matrix(f"{p}.attn_output.weight", hidden, q, i)
        matrix(f"{p}.ffn_gate.weight", s["ffn"], hidden, i)
        matrix(f"{p}.ffn_up.weight", s["ffn"], hidden, i)
        matrix(f"{p}.ffn_down.weight", hidden, s["ffn"], i)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen2-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    path = write(args.shape, Path(args.out))
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

"""Write a random-weight Qwen3.5 hybrid GGUF (llama.cpp's qwen35) of a real model's shape.

Gated DeltaNet layers, three of every four, beside gated full-attention ones: for speed and
memory benchmarks beside llama-server (no such file ships on PyPI, and nothing may be
downloaded).

Shapes (``SHAPES``) are the published config.json files' as far as known here: no copy of them
is installed, so the figures are those public repositories quote (THUDM/slime
``scripts/models/qwen3.5-0.8B.sh`` and ``qwen3.5-4B.sh`` for layers, widths, heads, FFN,
vocabulary, rope base 1e7 and partial rotary 0.25; copies of the two config.json files in other
repositories for the linear-attention heads, ``tie_word_embeddings: true`` and mRoPE sections
[11, 11, 10]); llama.cpp's qwen35 loader names the same two (24 layers of 1024: 0.8B, 32 of
2560: 4B):

* ``qwen3.5-0.8b``: hidden 1024, 24 layers, 8 q / 2 kv heads of 256, FFN 3584, linear
  attention 16 key / 16 value heads of 128;
* ``qwen3.5-4b``: hidden 2560, 32 layers, 16 q / 4 kv heads of 256, FFN 9216, linear attention
  16 key / 32 value heads of 128;
* both: every 4th layer full attention, rope on 64 of 256 dims, conv kernel 4, vocabulary
  248,320, tied embeddings.

Tensors are named, shaped and stored as llama.cpp's convert_hf_to_gguf.py writes them (see
tests/tiny_hybrid.py) and typed as its quantizer does (``recipe``, make_gguf.py's rules): the
fused DeltaNet ``attn_qkv`` counts as an ``attn_v`` (llama.cpp's ``category_is_attn_v``), so
q4_k_m gives it Q6_K on the ``use_more_bits`` layers; ``ssm_alpha`` / ``ssm_beta`` ([value
heads, hidden]) are quantized like any matrix (their rows are hidden-sized, so Q4_K fits);
``ssm_conv1d``, norms, ``ssm_a`` and ``ssm_dt.bias`` stay F32. Matrices are random blocks
(make_gguf.py's ``random_blocks``, weights of std ~0.02), written tensor by tensor. The small
float tensors keep the recurrence sane: norms 1 + N(0, 0.1) (the 1 + w ones stored as the
multiplier), A = -exp(A_log) with exp(A_log) uniform in [0.05, 1], dt bias N(0, 0.5), conv taps
N(0, 0.25), so a step keeps most of the state and no activation blows up over 32 layers.

The tokenizer is the embedded SmolLM2's padded with unused tokens to 248,320 (make_gguf.py's
``copy_tokenizer``). The embedding rows of the padding are zero: llama.cpp decodes an unused
token to no text, so a random head that samples them would stream empty chunks; with zero rows
(logit 0, below the best real token's) every sampled token is a real one and a chat's answers
are text, as a real model's are. The matmul still spans the whole vocabulary.

    .venv/bin/python benchmarks/make_hybrid_gguf.py --shape qwen3.5-4b --out /tmp/q35-4b.gguf

``--mtp`` adds the one-layer multi-token-prediction block the releases carry (as the
converter writes it: ``blk.{layers}.nextn.*`` and a full-attention layer), for
``--speculative mtp``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf import RECIPES, copy_tokenizer, random_blocks, tensor_type

from radixserve.gguf_reader import open_gguf
from radixserve.models.default import default_model_path


@dataclass(frozen=True, slots=True)
class HybridShape:
    """A Qwen3.5 text decoder's shape: ``layers`` layers, every ``interval``-th one full
    attention (``heads`` / ``kv_heads`` of ``head_dim``, rope on ``rotary`` of its dims), the
    others Gated DeltaNet (``key_heads`` / ``value_heads`` of ``state_dim``: llama.cpp keeps one
    size for both). ``vocab`` 0: the embedded tokenizer's own size."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    key_heads: int
    value_heads: int
    vocab: int
    head_dim: int = 256
    rotary: int = 64
    state_dim: int = 128
    conv_kernel: int = 4
    interval: int = 4
    mrope_sections: tuple[int, ...] = (11, 11, 10)
    tied: bool = True
    rope_theta: float = 1e7
    context: int = 262144
    mtp: int = 0  # multi-token-prediction layers after the decoder's (llama.cpp's nextn)

    def is_linear(self, layer: int) -> bool:
        return (layer + 1) % self.interval != 0


SHAPES = {
    "qwen3.5-0.8b": HybridShape(layers=24, hidden=1024, heads=8, kv_heads=2, ffn=3584,
                                key_heads=16, value_heads=16, vocab=248320),
    "qwen3.5-4b": HybridShape(layers=32, hidden=2560, heads=16, kv_heads=4, ffn=9216,
                              key_heads=16, value_heads=32, vocab=248320),
}
_EPS = 1e-6


def _hparams(writer: gguf.GGUFWriter, name: str, s: HybridShape, recipe: str,
             vocab: int) -> None:
    """The keys convert_hf_to_gguf.py writes for ``qwen35`` (tests/tiny_hybrid.py)."""
    writer.add_name(f"random {name}")
    writer.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{recipe.upper()}"]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(s.layers + s.mtp)
    if s.mtp:
        writer.add_nextn_predict_layers(s.mtp)
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.hidden)
    writer.add_feed_forward_length(s.ffn)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_rope_dimension_sections((list(s.mrope_sections) + [0] * 4)[:4])
    writer.add_rope_freq_base(s.rope_theta)
    writer.add_layer_norm_rms_eps(_EPS)
    writer.add_key_length(s.head_dim)
    writer.add_value_length(s.head_dim)
    writer.add_ssm_conv_kernel(s.conv_kernel)
    writer.add_ssm_state_size(s.state_dim)
    writer.add_ssm_group_count(s.key_heads)
    writer.add_ssm_time_step_rank(s.value_heads)
    writer.add_ssm_inner_size(s.state_dim * s.value_heads)
    writer.add_array(f"{writer.arch}.attention.recurrent_layers",
                     [i < s.layers and s.is_linear(i) for i in range(s.layers + s.mtp)])
    writer.add_full_attention_interval(s.interval)
    writer.add_rope_dimension_count(s.rotary)
    writer.add_vocab_size(vocab)


def tensors(s: HybridShape, vocab: int) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape as rows x cols or (n,), layer) of every tensor, in llama.cpp's order."""
    hidden, ffn = s.hidden, s.ffn
    key, value = s.key_heads * s.state_dim, s.value_heads * s.state_dim
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    out: list[tuple[str, tuple[int, ...], int]] = [("token_embd.weight", (vocab, hidden), 0)]
    for i in range(s.layers + s.mtp):
        p = f"blk.{i}"
        layer = [("attn_norm.weight", (hidden,))]
        if i >= s.layers:  # an MTP block: a full-attention layer after its own projection
            layer += [("nextn.eh_proj.weight", (hidden, 2 * hidden)),
                      ("nextn.enorm.weight", (hidden,)), ("nextn.hnorm.weight", (hidden,)),
                      ("nextn.shared_head_norm.weight", (hidden,))]
        if i < s.layers and s.is_linear(i):
            layer += [("attn_qkv.weight", (2 * key + value, hidden)),
                      ("attn_gate.weight", (value, hidden)),
                      ("ssm_conv1d.weight", (2 * key + value, s.conv_kernel)),
                      ("ssm_dt.bias", (s.value_heads,)), ("ssm_a", (s.value_heads,)),
                      ("ssm_beta.weight", (s.value_heads, hidden)),
                      ("ssm_alpha.weight", (s.value_heads, hidden)),
                      ("ssm_norm.weight", (s.state_dim,)),
                      ("ssm_out.weight", (hidden, value))]
        else:  # attn_q holds each head's query and its output gate
            layer += [("attn_q.weight", (2 * q, hidden)), ("attn_k.weight", (kv, hidden)),
                      ("attn_v.weight", (kv, hidden)), ("attn_output.weight", (hidden, q)),
                      ("attn_q_norm.weight", (s.head_dim,)),
                      ("attn_k_norm.weight", (s.head_dim,))]
        layer += [("post_attention_norm.weight", (hidden,)), ("ffn_gate.weight", (ffn, hidden)),
                  ("ffn_up.weight", (ffn, hidden)), ("ffn_down.weight", (hidden, ffn))]
        out += [(f"{p}.{name}", dims, i) for name, dims in layer]
    out.append(("output_norm.weight", (hidden,), 0))
    if not s.tied:
        out.append(("output.weight", (vocab, hidden), 0))
    return out


def block_type(recipe: str, name: str, layer: int, s: HybridShape, cols: int) -> str | None:
    """The block type llama.cpp's quantizer gives matrix ``name``; None: it stays F32."""
    if "ssm_conv1d" in name:
        return None
    if name == "token_embd.weight" and (s.tied or recipe == "q4_0"):
        name = "output.weight"  # a tied embedding is the head: typed as the output
    # llama.cpp counts the fused DeltaNet qkv among the attn_v tensors (one per layer)
    return tensor_type(recipe, name.replace("attn_qkv", "attn_v"), layer, s.layers + s.mtp,
                       cols)


def float_values(rng: np.random.Generator, name: str, dims: tuple[int, ...]) -> np.ndarray:
    """The F32 tensor ``name`` (see the module docstring for the ranges)."""
    if name.endswith("ssm_a"):  # stored A = -exp(A_log), with exp(A_log) in [0.05, 1]
        return -rng.uniform(0.05, 1.0, dims).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return (0.5 * rng.standard_normal(dims)).astype(np.float32)
    if "ssm_conv1d" in name:
        return (0.25 * rng.standard_normal(dims)).astype(np.float32)
    return (1.0 + 0.1 * rng.standard_normal(dims)).astype(np.float32)  # a norm's multiplier


@functools.cache
def num_real_tokens() -> int:
    """The embedded tokenizer's own vocabulary size: the rows past it are padding."""
    return len(open_gguf(default_model_path()).fields["tokenizer.ggml.tokens"].data)


def write(shape: HybridShape, out: Path, recipe: str = "q4_k_m", seed: int = 0,
          name: str = "qwen3.5") -> Path:
    """Write the file; returns its path. ValueError for an unknown recipe."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), "qwen35")
    vocab = copy_tokenizer(writer, shape.vocab)
    _hparams(writer, name, shape, recipe, vocab)
    plan = []
    for tname, dims, layer in tensors(shape, vocab):
        kind = block_type(recipe, tname, layer, shape, dims[-1]) if len(dims) == 2 else None
        if kind is None:
            writer.add_tensor_info(tname, dims, np.dtype(np.float32), 4 * int(np.prod(dims)))
        else:
            rows, cols = dims
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
            writer.add_tensor_info(tname, (rows, cols // block * size), np.dtype(np.uint8),
                                   rows * cols // block * size,
                                   raw_dtype=gguf.GGMLQuantizationType[kind])
        plan.append((tname, dims, kind))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    real = num_real_tokens()
    for tname, dims, kind in plan:
        if kind is None:
            writer.write_tensor_data(float_values(rng, tname, dims))
            continue
        data = random_blocks(rng, kind, *dims)
        if tname in ("token_embd.weight", "output.weight"):
            data[real:] = 0  # all-zero blocks: zero rows for the padded vocabulary
        writer.write_tensor_data(data)
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3.5-4b", choices=sorted(SHAPES))
    parser.add_argument("--recipe", default="q4_k_m", choices=RECIPES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mtp", action="store_true",
                        help="add a one-layer MTP block (nextn tensors), as the releases carry")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    start = time.perf_counter()
    shape = replace(SHAPES[args.shape], mtp=1) if args.mtp else SHAPES[args.shape]
    path = write(shape, Path(args.out), args.recipe, args.seed, args.shape)
    print(f"{path}: {args.shape} {args.recipe}, {path.stat().st_size / 1e9:.2f} GB "
          f"in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

"""Write a random-weight Qwen3-MoE-style GGUF (``qwen3moe``) for MoE benchmarks: 4 layers,
hidden 512, 8 heads / 4 KV heads of 64 with q/k norms, 16 experts of width 512, top-2,
the embedded SmolLM2 tokenizer (49,152 tokens; an untied head). Matrices and experts in one
block type (Q4_0 or Q8_0), the router F32 (llama.cpp never quantizes it). ``--arch qwen2moe``:
Qwen2-MoE's layout instead (q/k/v bias, no q/k norms, a shared expert of width 1024 with its
[hidden] F32 gate, top-k weights not renormalized). The weights are random, so the text is
noise: use it for speed (``ignore_eos``), not quality. Never commit the file.

    .venv/bin/python benchmarks/make_moe_gguf.py --type Q4_0 --out /tmp/moe-q4_0.gguf
    .venv/bin/python benchmarks/make_moe_gguf.py --arch qwen2moe --out /tmp/moe2-q4_0.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_gguf import copy_tokenizer  # noqa: E402


SHAPE = dict(layers=4, hidden=512, heads=8, kv_heads=4, head_dim=64, experts=16, top_k=2,
             expert_ffn=512, shared_ffn=1024, rope_theta=1e6, context=4096)


def write(out: Path, qtype: str, seed: int = 0, arch: str = "qwen3moe") -> Path:
    s, kind = SHAPE, gguf.GGMLQuantizationType[qtype]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    vocab = copy_tokenizer(writer)
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["expert_ffn"])
    writer.add_expert_feed_forward_length(s["expert_ffn"])
    writer.add_expert_count(s["experts"])
    writer.add_expert_used_count(s["top_k"])
    if arch == "qwen2moe":
        writer.add_expert_shared_feed_forward_length(s["shared_ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_key_length(s["head_dim"])
    writer.add_value_length(s["head_dim"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(1e-6)
    hidden, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    e, ffn = s["experts"], s["expert_ffn"]

    def tensor(name: str, *shape: int, std: float = 0.02, quantized: bool = True):
        w = rng.standard_normal(shape, dtype=np.float32) * std
        if quantized:
            writer.add_tensor(name, gguf.quants.quantize(w, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, w)

    def vector(name: str, n: int):
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    tensor("token_embd.weight", vocab, hidden)
    vector("output_norm.weight", hidden)
    tensor("output.weight", vocab, hidden)
    for i in range(s["layers"]):
        p = f"blk.{i}"
        vector(f"{p}.attn_norm.weight", hidden)
        vector(f"{p}.ffn_norm.weight", hidden)
        tensor(f"{p}.attn_q.weight", q, hidden)
        tensor(f"{p}.attn_k.weight", kv, hidden)
        tensor(f"{p}.attn_v.weight", kv, hidden)
        if arch == "qwen3moe":
            vector(f"{p}.attn_q_norm.weight", s["head_dim"])
            vector(f"{p}.attn_k_norm.weight", s["head_dim"])
        else:  # q/k/v bias
            for name, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                tensor(f"{p}.{name}.bias", n, quantized=False)
        tensor(f"{p}.attn_output.weight", hidden, q)
        tensor(f"{p}.ffn_gate_inp.weight", e, hidden, std=0.05, quantized=False)
        tensor(f"{p}.ffn_gate_exps.weight", e, ffn, hidden)
        tensor(f"{p}.ffn_up_exps.weight", e, ffn, hidden)
        tensor(f"{p}.ffn_down_exps.weight", e, hidden, ffn)
        if arch == "qwen2moe":
            shared = s["shared_ffn"]
            tensor(f"{p}.ffn_gate_inp_shexp.weight", hidden, std=0.05, quantized=False)
            tensor(f"{p}.ffn_gate_shexp.weight", shared, hidden)
            tensor(f"{p}.ffn_up_shexp.weight", shared, hidden)
            tensor(f"{p}.ffn_down_shexp.weight", hidden, shared)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--type", default="Q4_0", choices=["Q4_0", "Q8_0"])
    parser.add_argument("--arch", default="qwen3moe", choices=["qwen3moe", "qwen2moe"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    path = write(Path(args.out), args.type, arch=args.arch)
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

"""Tiny random Gemma 4 text models, made with transformers' own ``Gemma4ForCausalLM`` and saved
with the tiny tokenizer of tiny_models.py (:func:`make_gemma4_hf_model`). ``KINDS``:

* ``e2b``: the E2B / E4B layout: per-layer inputs (8 dims a layer), 6 layers alternating
  sliding (window 8, heads of 16) and global (heads of 32, proportional rope on a quarter), the
  last two sharing the KV of layers 2 and 3, double-wide MLPs there, a final logit soft-cap;
* ``31b``: the 12B / 31B layout: no per-layer inputs, no shared KV, global layers with one KV
  head whose values are the key projection (``attention_k_eq_v``);
* ``26b``: the 26B-A4B layout: ``31b``'s attention, 2 of 4 routed experts beside each dense
  MLP.

Norms are drawn around 1 (Gemma 4 multiplies by w), layer scalars around 1.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_models import EOS_TOKEN, PAD_TOKEN, _randomize_, save_tokenizer

KINDS = ("e2b", "31b", "26b")
_S, _F = "sliding_attention", "full_attention"
_COMMON = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
           "num_hidden_layers": 6, "layer_types": [_S, _F] * 3, "sliding_window": 8,
           "max_position_embeddings": 256, "final_logit_softcapping": 30.0,
           "rms_norm_eps": 1e-6}
DEFAULTS = {
    "e2b": {"hidden_size_per_layer_input": 8, "num_kv_shared_layers": 2,
            "use_double_wide_mlp": True},
    # (the larger releases' sliding layers see a whole image: text alone stays causal)
    "31b": {"hidden_size_per_layer_input": 0, "attention_k_eq_v": True,
            "num_global_key_value_heads": 1, "tie_word_embeddings": False,
            "use_bidirectional_attention": "vision"},
    "26b": {"hidden_size_per_layer_input": 0, "attention_k_eq_v": True,
            "use_bidirectional_attention": "vision",
            "num_global_key_value_heads": 1, "enable_moe_block": True, "num_experts": 4,
            "top_k_experts": 2, "moe_intermediate_size": 32},
}


def text_config_fields(kind: str) -> dict:
    """The Gemma4TextConfig fields of ``kind`` (vocabulary and special tokens aside)."""
    return {**_COMMON, **DEFAULTS[kind]}


def make_gemma4_hf_model(kind: str, out_dir: str | Path, seed: int = 0, **overrides) -> Path:
    """Build tiny random ``kind`` (``KINDS``) and save it, with the tiny tokenizer, to
    ``out_dir``; ``overrides``: Gemma4TextConfig fields. Returns ``out_dir``."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig, GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(out_dir)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    fields = {**text_config_fields(kind), **overrides}
    vocab = len(tokenizer)
    config = Gemma4TextConfig(vocab_size=vocab, vocab_size_per_layer_input=vocab,
                              eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None,
                              **fields)
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(config).to(torch.float32)
    _randomize_(model, seed, norm_mean=1.0)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.layer_scalar.copy_(0.75 + 0.5 * torch.rand(1, generator=gen))
            if getattr(layer, "router", None) is not None:  # "norm"-less names: N(0, 0.1)
                layer.router.scale.copy_(1 + 0.1 * torch.randn(64, generator=gen))
                layer.router.per_expert_scale.copy_(1 + 0.1 * torch.rand(4, generator=gen))
    model.eval()
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=pad_id)
    model.save_pretrained(str(out_dir))
    return out_dir

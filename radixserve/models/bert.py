"""A BERT-style cross-encoder in plain torch: BertForSequenceClassification and
XLMRobertaForSequenceClassification (one label), weights from a safetensors folder.

    embeddings: word[ids] + position[pos] + token_type[types] -> LayerNorm
    each layer (post-norm):  x = LN(x + Wo · attn(x))     bidirectional: every token sees
                             x = LN(x + W2 · act(W1 x))   every real token of its pair
    head: out_proj(tanh(dense(x[:, 0])))    BERT's pooler + classifier, XLM-R's
                                             classifier.dense + out_proj: the same maths

The batch is padded (``[B, L]``) and padded keys are masked out of SDPA, so a pair's logit
does not depend on what it is batched with (beyond float noise). No KV cache: a pair is one
whole forward (runner/encoder_runner.py).
"""

from __future__ import annotations

import glob
import os

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.layers.embedding import empty_embedding
from radixserve.models.cross_encoder_config import EncoderConfig

_ACT = {"gelu": F.gelu, "relu": F.relu,
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class _Layer(nn.Module):
    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        h = c.hidden_size
        self.num_heads = c.num_heads
        self.qkv = nn.Linear(h, 3 * h)  # query, key, value stacked at load
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.up = nn.Linear(h, c.intermediate_size)
        self.down = nn.Linear(c.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.act = _ACT[c.hidden_act]

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``x`` [B, L, hidden]; ``key_mask`` [B, 1, 1, L], True where a key is a real token."""
        b, n, h = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)  # not causal
        x = self.attn_norm(x + self.attn_out(a.transpose(1, 2).reshape(b, n, h)))
        return self.ffn_norm(x + self.down(self.act(self.up(x))))


class CrossEncoder(nn.Module):
    """``forward(input_ids, token_type_ids, lengths)`` -> the classifier's logits [B, 1]."""

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.config = c
        h = c.hidden_size
        self.word = empty_embedding(c.vocab_size, h)
        self.position = empty_embedding(c.max_position_embeddings, h)
        self.token_type = empty_embedding(c.type_vocab_size, h)
        self.norm = nn.LayerNorm(h, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_layers))
        self.dense = nn.Linear(h, h)
        self.out_proj = nn.Linear(h, 1)

    def positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        """BERT: 0, 1, 2...; RoBERTa: as HF counts them, ``pad + 1`` on, skipping pad ids (a
        padded row's tail gets ``pad``, an unused position)."""
        c = self.config
        if c.position_offset == 0:
            return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        real = input_ids.ne(c.pad_token_id).int()
        return torch.cumsum(real, dim=1) * real + c.pad_token_id

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        """``input_ids``, ``token_type_ids`` [B, L] (rows padded after ``lengths[i]`` tokens
        with the pad id); the logits [B, 1] in float32."""
        x = (self.word(input_ids) + self.position(self.positions(input_ids))
             + self.token_type(token_type_ids))
        x = self.norm(x)
        real = torch.arange(input_ids.shape[1], device=x.device)[None, :] < lengths[:, None]
        key_mask = real[:, None, None, :]
        for layer in self.layers:
            x = layer(x, key_mask)
        return self.out_proj(torch.tanh(self.dense(x[:, 0]))).float()


def load_cross_encoder(path: str, config: EncoderConfig, device: torch.device,
                       dtype: torch.dtype) -> CrossEncoder:
    """The model with the folder's weights (HF names mapped to ours, q/k/v stacked);
    ValueError naming what is missing or left over."""
    from safetensors import safe_open

    weights: dict[str, torch.Tensor] = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                ours = _our_name(name, config.prefix)
                if ours is not None:
                    weights[ours] = f.get_tensor(name)
    for i in range(config.num_layers):
        for kind in ("weight", "bias"):
            parts = [weights.pop(f"layers.{i}.{p}.{kind}", None) for p in ("q", "k", "v")]
            if all(p is not None for p in parts):
                weights[f"layers.{i}.qkv.{kind}"] = torch.cat(parts)
    with torch.device("meta"):
        model = CrossEncoder(config)
    expected = set(model.state_dict())
    missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or extra:
        raise ValueError(f"{config.architecture} weights in {path} do not fit: missing "
                         f"{missing[:6]}, unexpected {extra[:6]}")
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, assign=True)
    return model.to(device).eval()


_LAYER = {"attention.self.query": "q", "attention.self.key": "k", "attention.self.value": "v",
          "attention.output.dense": "attn_out", "attention.output.LayerNorm": "attn_norm",
          "intermediate.dense": "up", "output.dense": "down", "output.LayerNorm": "ffn_norm"}
_TOP = {"embeddings.word_embeddings": "word", "embeddings.position_embeddings": "position",
        "embeddings.token_type_embeddings": "token_type", "embeddings.LayerNorm": "norm",
        "pooler.dense": "dense"}
_HEAD = {"classifier.dense": "dense", "classifier.out_proj": "out_proj",
         "classifier": "out_proj"}  # XLM-R's head; BERT's classifier after its pooler


def _our_name(name: str, prefix: str) -> str | None:
    """Our parameter name for a checkpoint tensor; None for buffers we derive (position
    ids). Old checkpoints' LayerNorm ``gamma``/``beta`` are ``weight``/``bias``."""
    module, _, kind = name.rpartition(".")
    kind = {"gamma": "weight", "beta": "bias"}.get(kind, kind)
    if kind not in ("weight", "bias"):
        return None
    if module in _HEAD:
        return f"{_HEAD[module]}.{kind}"
    module = module.removeprefix(f"{prefix}.")
    if module in _TOP:
        return f"{_TOP[module]}.{kind}"
    if module.startswith("encoder.layer."):
        i, _, rest = module.removeprefix("encoder.layer.").partition(".")
        if rest in _LAYER:
            return f"layers.{i}.{_LAYER[rest]}.{kind}"
    return name  # reported as unexpected

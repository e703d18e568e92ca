"""BERT-style cross-encoders: which folders hold one, and their shape (torch-free: the API
process reads it to pick ``--task rerank`` and the pair length).

A cross-encoder is a bidirectional encoder with a one-label sequence-classification head,
scoring a (query, document) pair read as one input: HF ``BertForSequenceClassification``
(the cross-encoder/ms-marco-MiniLM family) and ``XLMRobertaForSequenceClassification``
(BAAI/bge-reranker-base, -large), given as a safetensors folder. models/bert.py runs it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

# architecture -> the checkpoint's backbone prefix
CROSS_ENCODER_ARCHITECTURES = {"BertForSequenceClassification": "bert",
                               "XLMRobertaForSequenceClassification": "roberta"}
_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass(frozen=True)
class EncoderConfig:
    """The shape of a cross-encoder, from its config.json. ``position_offset``: the first
    position id a token gets (RoBERTa counts from ``pad_token_id + 1``, BERT from 0), so a
    pair holds at most ``max_len`` tokens, special tokens included."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    pad_token_id: int
    position_offset: int

    @property
    def prefix(self) -> str:
        return CROSS_ENCODER_ARCHITECTURES[self.architecture]

    @property
    def max_len(self) -> int:
        return self.max_position_embeddings - self.position_offset

    @property
    def uses_token_types(self) -> bool:
        """BERT tells the two texts apart by token type (0, then 1 from the second text on);
        XLM-R has one type and separates them with ``</s></s>`` only."""
        return self.type_vocab_size > 1


def cross_encoder_config(source) -> EncoderConfig | None:
    """The cross-encoder shape of ``source`` (a `ModelSource`); None when it is not one (a
    GGUF file, or another architecture). ValueError for a cross-encoder this engine cannot
    score with: more than one label, relative position embeddings, an unknown activation."""
    if source.kind != "hf":
        return None
    with open(os.path.join(source.path, "config.json")) as f:
        cfg = json.load(f)
    arch = next((a for a in cfg.get("architectures") or ()
                 if a in CROSS_ENCODER_ARCHITECTURES), None)
    if arch is None:
        return None
    num_labels = len(cfg.get("id2label") or {}) or cfg.get("num_labels", 2)
    if num_labels != 1:
        raise ValueError(f"{arch} with {num_labels} labels is a classifier, not a reranker: "
                         f"a cross-encoder scores with one label")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{arch}: position_embedding_type "
                         f"{cfg['position_embedding_type']!r} is not supported (absolute only)")
    if cfg.get("hidden_act", "gelu") not in _ACTIVATIONS:
        raise ValueError(f"{arch}: hidden_act {cfg['hidden_act']!r} is not supported; "
                         f"supported: {', '.join(_ACTIVATIONS)}")
    pad = cfg.get("pad_token_id", 0)
    return EncoderConfig(
        architecture=arch, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"], hidden_act=cfg.get("hidden_act", "gelu"),
        layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
        max_position_embeddings=cfg.get("max_position_embeddings", 512),
        type_vocab_size=cfg.get("type_vocab_size", 2), pad_token_id=pad,
        position_offset=pad + 1 if arch.startswith("XLMRoberta") else 0)

"""A BERT-style cross-encoder served as a reranker (BertForSequenceClassification,
XLMRobertaForSequenceClassification with one label; models/cross_encoder_config.py), scored
as sentence-transformers' ``CrossEncoder`` scores it:

- the pair is the tokenizer's own pair encoding from the folder's tokenizer.json:
  ``[CLS] query [SEP] document [SEP]`` with token types 0 then 1 (BERT),
  ``<s> query </s></s> document </s>`` with one type (XLM-R);
- a pair longer than the model reads is cut as ``CrossEncoder`` cuts it (tokenizers'
  ``longest_first``: a token at a time from the longer text, so a long document is cut
  first and the query only once it is the longer one) to ``max_len`` tokens: the least of the
  model's positions, tokenizer_config.json's ``model_max_length`` and ``--max-model-len``;
- the score is sigmoid(logit) of the classifier's one logit, CrossEncoder's default
  activation for one label (vLLM's /rerank and /score return the same).

A text so long that cutting it is not worth tokenizing it (over `MAX_CHARS_PER_TOKEN`
characters per token the model reads) is refused instead (400).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from tokenizers import Tokenizer as HFTokenizer

from radixserve.models.cross_encoder_config import EncoderConfig, cross_encoder_config
from radixserve.pooling_params import PoolingParams

MAX_CHARS_PER_TOKEN = 64


@dataclass(frozen=True)
class CrossEncoderReranker:
    """The pair tokenizer (truncating to ``max_len``) of a served cross-encoder."""

    backend: HFTokenizer
    max_len: int
    uses_token_types: bool

    @classmethod
    def for_folder(cls, path: str, encoder: EncoderConfig,
                   max_model_len: int) -> CrossEncoderReranker:
        """The reranker of the folder at ``path``, its pairs cut to the least of the model's
        positions, the tokenizer's ``model_max_length`` and ``max_model_len`` (the engine's
        context length)."""
        backend = HFTokenizer.from_file(os.path.join(path, "tokenizer.json"))
        config_path = os.path.join(path, "tokenizer_config.json")
        limit = min(encoder.max_len, max_model_len)
        if os.path.isfile(config_path):
            with open(config_path) as f:
                own = json.load(f).get("model_max_length")
            if isinstance(own, int) and 0 < own < limit:  # HF's "no limit" is 1e30
                limit = own
        backend.no_padding()
        backend.enable_truncation(limit, strategy="longest_first")
        return cls(backend, limit, encoder.uses_token_types)

    @property
    def max_chars(self) -> int:
        return MAX_CHARS_PER_TOKEN * self.max_len

    def encode_pairs(self, pairs: list[tuple[str, str]]) -> list[tuple[list[int], int | None]]:
        """Each pair's ids (cut to ``max_len``) and where its second text's tokens start
        (None for a model without token types)."""
        out = []
        for enc in self.backend.encode_batch(pairs, add_special_tokens=True):
            start = enc.type_ids.index(1) if 1 in enc.type_ids else None
            out.append((enc.ids, start if self.uses_token_types else None))
        return out

    @staticmethod
    def pooling(second_segment_start: int | None) -> PoolingParams:
        return PoolingParams(pooling="classify", second_segment_start=second_segment_start)

    @staticmethod
    def relevance(logits: list[float]) -> float:
        """sigmoid(logit), without overflow."""
        x = logits[0]
        if x >= 0:
            return 1.0 / (1.0 + math.exp(-x))
        e = math.exp(x)
        return e / (1.0 + e)


def resolve_task(source, task: str) -> str:
    """The task a model is served for: ``auto`` is ``rerank`` for a cross-encoder folder.
    ValueError for a cross-encoder asked to embed, or one the engine cannot score with."""
    if cross_encoder_config(source) is None:
        return task
    if task == "embed":
        raise ValueError(f"{source.name} is a cross-encoder: it serves /v1/rerank and "
                         f"/v1/score (--task rerank), not embeddings")
    return "rerank"


def cross_encoder_reranker(path: str | None, max_model_len: int
                           ) -> CrossEncoderReranker | None:
    """The reranker of the model at ``path`` when it is a cross-encoder folder, else None."""
    from radixserve.models.source import ModelSource

    source = ModelSource.resolve(path)
    encoder = cross_encoder_config(source)
    return (None if encoder is None
            else CrossEncoderReranker.for_folder(source.path, encoder, max_model_len))

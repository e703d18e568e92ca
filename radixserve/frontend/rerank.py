"""A causal LM served as a reranker (``serve --task rerank``), scored as Qwen3-Reranker is.

Each (query, document) pair becomes one prompt: a system turn asking whether the Document
meets the Query and the Instruct, answered only "yes" or "no"; a user turn

    <Instruct>: {instruction}
    <Query>: {query}
    <Document>: {document}

and the assistant turn opened with an empty think block. The relevance score is the model's
probability of answering "yes" rather than "no" at the prompt's last position:

    score = exp(l_yes) / (exp(l_yes) + exp(l_no)) = sigmoid(l_yes - l_no)

with l_yes, l_no the raw logits (equally: the log-probabilities, whose shared normaliser
cancels) of the "yes" and "no" tokens. The engine returns those two logits for a prefill-only
request (`PoolingParams.logit_token_ids`): one prefill per pair, and pairs sharing a query
reuse its cached prefix.

The template's fixed parts are tokenized once, the pair's text alone per request, as
Qwen3-Reranker's reference code does; no BOS/EOS is added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from radixserve.tokenizer.tokenizer import Tokenizer

PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the "
          "Query and the Instruct provided. Note that the answer can only be \"yes\" or "
          "\"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = ("Given a web search query, retrieve relevant passages that answer the "
                       "query")


@dataclass(frozen=True)
class Reranker:
    """The token ids a reranker prompt is built from and scored with."""

    prefix_ids: list[int]
    suffix_ids: list[int]
    yes_id: int
    no_id: int

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> Reranker:
        """ValueError when the vocabulary has no single "yes" or "no" token."""
        return cls(tokenizer.encode(PREFIX, add_special_tokens=False),
                   tokenizer.encode(SUFFIX, add_special_tokens=False),
                   _single_token(tokenizer, "yes"), _single_token(tokenizer, "no"))

    @property
    def num_template_tokens(self) -> int:
        return len(self.prefix_ids) + len(self.suffix_ids)

    def prompt_ids(self, body_ids: list[int]) -> list[int]:
        """The whole prompt around the ids of `pair_text`."""
        return self.prefix_ids + body_ids + self.suffix_ids


def pair_text(query: str, document: str, instruction: str | None = None) -> str:
    """The user turn's text for one pair (tokenized without special tokens)."""
    return (f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n"
            f"<Document>: {document}")


def relevance(yes_logit: float, no_logit: float) -> float:
    """P("yes") of the two-way softmax: sigmoid(l_yes - l_no), computed without overflow."""
    d = yes_logit - no_logit
    if d >= 0:
        return 1.0 / (1.0 + math.exp(-d))
    e = math.exp(d)
    return e / (1.0 + e)


def _single_token(tokenizer: Tokenizer, word: str) -> int:
    token_id = tokenizer.backend.token_to_id(word)
    if token_id is not None:
        return token_id
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"the vocabulary has no single {word!r} token (it encodes as {ids}); "
                         f"a reranker answers with one")
    return ids[0]

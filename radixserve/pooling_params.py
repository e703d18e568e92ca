"""PoolingParams: how an embedding request pools its hidden states (the engine's side).

A request carrying PoolingParams is prefill-only: its prompt is fed through the model like any
other (same scheduler, same token budget, chunked when long) and, instead of sampling, it
returns the final-norm hidden states of its tokens pooled into one vector:

- ``last``: the last prompt token's hidden state (Qwen3-Embedding, most decoder embedders);
- ``mean``: the mean over every prompt token's hidden state.

With ``logit_token_ids`` (last pooling only) the request returns, instead of the hidden state,
the model's raw logits of those tokens at the last position: a causal-LM reranker's "yes" and
"no" (`radixserve.frontend.rerank`), one prefill that may reuse a cached prefix.

With ``classify`` pooling (a cross-encoder engine only: engine/encoder_build.py) the request is a
(query, document) pair read whole by a bidirectional encoder, and returns its classifier's
logits; ``second_segment_start`` is where the document's tokens start (token type 1 from
there on, for the models that use token types).

The engine returns the raw pooled vector; normalisation and ``dimensions`` truncation are the
frontend's (`radixserve.frontend.pooling`).
"""

from __future__ import annotations

import msgspec

POOLING_TYPES = ("last", "mean")  # what embeddings may use
_ENGINE_POOLING = (*POOLING_TYPES, "classify")


class PoolingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    pooling: str = "last"
    logit_token_ids: list[int] | None = None
    second_segment_start: int | None = None

    def __post_init__(self) -> None:
        if self.pooling not in _ENGINE_POOLING:
            raise ValueError(f"PoolingParams.pooling must be one of "
                             f"{', '.join(_ENGINE_POOLING)}, got {self.pooling!r}")
        if self.second_segment_start is not None and (
                self.pooling != "classify" or not isinstance(self.second_segment_start, int)
                or self.second_segment_start < 1):
            raise ValueError("PoolingParams.second_segment_start must be a position >= 1 and "
                             "needs classify pooling")
        if self.logit_token_ids is not None:
            ids = self.logit_token_ids
            if self.pooling != "last":
                raise ValueError("PoolingParams.logit_token_ids needs last pooling")
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                  for t in ids):
                raise ValueError("PoolingParams.logit_token_ids must be a non-empty list of "
                                 f"token ids, got {ids!r}")

    @property
    def needs_every_token(self) -> bool:
        """Mean pooling reads every prompt token's hidden state, so a prefix-cache hit (whose
        tokens are not fed again) cannot be used: such a request computes its whole prompt."""
        return self.pooling == "mean"

"""PoolingParams: how an embedding request pools its hidden states (the engine's side).

A request carrying PoolingParams is prefill-only: its prompt is fed through the model like any
other (same scheduler, same token budget, chunked when long) and, instead of sampling, it
returns the final-norm hidden states of its tokens pooled into one vector:

- ``last``: the last prompt token's hidden state (Qwen3-Embedding, most decoder embedders);
- ``mean``: the mean over every prompt token's hidden state.

With ``logit_token_ids`` (last pooling only) the request returns, instead of the hidden state,
the model's raw logits of those tokens at the last position: a causal-LM reranker's "yes" and
"no" (`radixserve.frontend.rerank`), one prefill that may reuse a cached prefix.

The engine returns the raw pooled vector; normalisation and ``dimensions`` truncation are the
frontend's (`radixserve.frontend.pooling`).
"""

from __future__ import annotations

import msgspec

POOLING_TYPES = ("last", "mean")


class PoolingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    pooling: str = "last"
    logit_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_TYPES:
            raise ValueError(f"PoolingParams.pooling must be one of {', '.join(POOLING_TYPES)}, "
                             f"got {self.pooling!r}")
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

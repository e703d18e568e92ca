"""OpenAI's ``POST /v1/embeddings`` models (see `protocol` for the conventions)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from radixserve.frontend.http.protocol_base import OpenAIRequest, OpenAIResponse
from radixserve.frontend.openai.protocol import check_text_or_tokens, truncate_count


class EmbeddingRequest(OpenAIRequest):
    """``input``: a string, a list of strings, a list of token ids, or a list of token-id
    lists (each one embedding). ``dimensions``: keep the first N values (then re-normalised),
    for models trained for it (Matryoshka)."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None  # accepted and ignored
    priority: int = 0
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)
    # vLLM's: each input keeps its last N tokens (-1: the context), not a 400
    truncate_prompt_tokens: int | None = Field(None, ge=-1)

    _truncate_not_0 = field_validator("truncate_prompt_tokens")(truncate_count)

    @field_validator("input", mode="before")
    @classmethod
    def _check_input(cls, value):
        return check_text_or_tokens(value, "input")

    def inputs(self) -> tuple[list[str] | None, list[list[int]] | None]:
        """(texts to tokenize, token-id lists): exactly one is set."""
        value = self.input
        if isinstance(value, str):
            return [value], None
        if all(isinstance(p, str) for p in value):
            return list(value), None
        if all(isinstance(p, int) for p in value):
            return None, [list(value)]
        return None, [list(p) for p in value]


class EmbeddingData(OpenAIResponse):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(OpenAIResponse):
    prompt_tokens: int = 0
    total_tokens: int = 0


class EmbeddingResponse(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage

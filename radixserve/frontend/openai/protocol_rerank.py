"""Rerank and score models: ``POST /v1/rerank`` (Cohere's and Jina's shape, as vLLM and
llama-server answer it) and vLLM's ``POST /v1/score`` (see `protocol` for the conventions).

``instruction`` (both) is ours: the reranker prompt's ``<Instruct>`` line (`frontend.rerank`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from radixserve.frontend.http.protocol_base import OpenAIRequest, OpenAIResponse


class RerankDocumentIn(OpenAIRequest):
    text: str


class RerankRequest(OpenAIRequest):
    """``top_n``: how many of the best documents to return (0 or absent: all);
    ``return_documents``: each result carries its document's text (the default, as vLLM)."""

    model: str | None = None
    query: str
    documents: list[str | RerankDocumentIn]
    top_n: int | None = Field(None, ge=0)
    return_documents: bool = True
    instruction: str | None = None
    priority: int = 0
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)

    def document_texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankDocument(OpenAIResponse):
    text: str


class RerankResult(OpenAIResponse):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(OpenAIResponse):
    total_tokens: int


class RerankResponse(OpenAIResponse):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


class ScoreRequest(OpenAIRequest):
    """Pairs ``text_1[i]`` with ``text_2[i]``; a single ``text_1`` (a string or a one-item
    list) is paired with every ``text_2`` (1:1, 1:N or N:N, as vLLM)."""

    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    instruction: str | None = None
    priority: int = 0
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)


class ScoreData(OpenAIResponse):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreUsage(OpenAIResponse):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(OpenAIResponse):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage

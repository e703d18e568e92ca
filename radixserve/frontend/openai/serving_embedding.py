"""Embeddings: ``POST /v1/embeddings`` (and Ollama's ``/api/embed``, which shares `embed`).

Each input becomes one prefill-only engine request (`AsyncLLM.embed`); they are sent together,
so the scheduler batches them with whatever else runs. The engine's raw pooled vector is cut to
``dimensions`` and L2-normalised here (`pooling.finish_vector`).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from radixserve.frontend.async_llm import NO_TICKET, QueueTicket
from radixserve.frontend.pooling import finish_vector, to_base64
from radixserve.pooling_params import PoolingParams
from radixserve.frontend.openai.protocol import random_id
from radixserve.frontend.openai.protocol_embedding import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.truncation import (Truncation, keep_last, log_truncation, prompt_limit,
                                            say_truncated)


class EmbeddingServer:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    def check_served(self, param: str = "model") -> PoolingParams:
        """The pooling to use; 400 saying why when this server does not serve embeddings."""
        setup = self.ctx.embedding
        if setup.pooling is None:
            raise OpenAIError(setup.refusal, param=param, code="embeddings_not_supported")
        return PoolingParams(pooling=setup.pooling)

    async def tokenize(self, texts: list[str] | None, ids: list[list[int]] | None,
                       param: str = "input") -> list[list[int]]:
        """Each input's token ids (texts encoded with the tokenizer's special tokens, e.g.
        the end-of-text token a last-token embedder pools on); 400 naming ``param`` for an
        empty, too long or out-of-vocabulary input."""
        ctx = self.ctx
        if texts is not None:
            for text in texts:
                ctx.prep.check_length(len(text), param)
            ids = await ctx.prep.encode_batch(texts)
        vocab = ctx.tokenizer.vocab_size
        for one in ids:
            if not one:
                raise OpenAIError("an input is empty", param=param)
            if len(one) > ctx.max_model_len:
                raise OpenAIError(
                    f"This model's maximum context length is {ctx.max_model_len} tokens. "
                    f"However, an input has {len(one)} tokens. Please reduce its length.",
                    param=param, code="context_length_exceeded")
            if max(one) >= vocab:
                raise OpenAIError(f"token ids must be in [0, {vocab})", param=param)
        return ids

    async def token_inputs(self, body: EmbeddingRequest, headers: list) -> list[list[int]]:
        """Each input's ids, cut to ``truncate_prompt_tokens`` when the request sets it."""
        ctx = self.ctx
        limit = prompt_limit(body.truncate_prompt_tokens, ctx.max_model_len, 0)
        if limit is None:
            return await self.tokenize(*body.inputs())
        texts, ids = body.inputs()
        if texts is not None:
            ids = await ctx.prep.encode_batch(texts)
        kept = [keep_last(one, limit, ctx.tokenizer.bos_prefix) for one in ids]
        cut = Truncation.total([one_cut for _, one_cut in kept])
        log_truncation("embeddings", cut, sum(len(one) for one, _ in kept))
        say_truncated(headers, cut)
        return await self.tokenize(None, [one for one, _ in kept])  # the remaining checks

    async def embed(self, ids: list[list[int]], pooling: PoolingParams,
                    dimensions: int | None, priority: int = 0, arrival: float | None = None,
                    ticket: QueueTicket = NO_TICKET) -> list[np.ndarray]:
        """One normalised vector per input, computed together (the engine batches them)."""
        base = random_id("embd-")
        outs = await asyncio.gather(*(
            self.ctx.engine.embed(one, pooling, f"{base}-{i}", priority, arrival, ticket)
            for i, one in enumerate(ids)))
        size = len(outs[0].pooled)
        if dimensions is not None and dimensions > size:
            raise OpenAIError(f"dimensions must be <= {size} (the model's embedding size), "
                              f"got {dimensions}", param="dimensions")
        return [finish_vector(out.pooled, dimensions) for out in outs]

    async def openai(self, body: EmbeddingRequest, admit,
                     headers: list | None = None) -> EmbeddingResponse:
        """``POST /v1/embeddings``; ``admit(num_seqs, num_tokens, timeout)`` reserves room
        in the server's queue and returns the request's ticket. With
        ``truncate_prompt_tokens`` each input keeps its last tokens; the header saying so
        goes in ``headers``."""
        arrival = time.time()
        self.ctx.check_model(body.model)
        pooling = self.check_served()
        ids = await self.token_inputs(body, headers if headers is not None else [])
        self.ctx.check_alive()
        ticket = admit(len(ids), sum(map(len, ids)), body.timeout)
        vectors = await self.embed(ids, pooling, body.dimensions, body.priority, arrival,
                                   ticket)
        encode = to_base64 if body.encoding_format == "base64" else np.ndarray.tolist
        num_tokens = sum(map(len, ids))
        return EmbeddingResponse(
            data=[EmbeddingData(index=i, embedding=encode(v)) for i, v in enumerate(vectors)],
            model=self.ctx.model_name,
            usage=EmbeddingUsage(prompt_tokens=num_tokens, total_tokens=num_tokens))

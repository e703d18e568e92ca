"""Rerank and score: ``POST /v1/rerank`` (and ``/rerank``) and ``POST /v1/score`` (and
``/score``), served when the model runs as a reranker (``--task rerank``, `frontend.rerank`).

Each (query, document) pair is one prefill-only engine request returning the "yes" and "no"
logits at its last position; they are sent together, so the scheduler batches them (and the
pairs after the first reuse the cached prompt prefix up to the document). A BERT-style
cross-encoder (`frontend.cross_encoder`) sends each pair's own encoding instead and gets its
classifier logit back, scored as sigmoid(logit).
"""

from __future__ import annotations

import asyncio
import time

from radixserve.frontend.async_llm import NO_TICKET, QueueTicket
from radixserve.frontend.cross_encoder import CrossEncoderReranker
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.protocol import random_id, unix_now
from radixserve.frontend.openai.protocol_rerank import (RerankDocument, RerankRequest,
                                                        RerankResponse, RerankResult,
                                                        RerankUsage, ScoreData, ScoreRequest,
                                                        ScoreResponse, ScoreUsage)
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.rerank import Reranker, pair_text, relevance
from radixserve.pooling_params import PoolingParams


class RerankServer:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    def check_served(self) -> Reranker | CrossEncoderReranker:
        """The reranker; 400 naming ``model`` when the server does not serve the model as one."""
        if self.ctx.reranker is None:
            raise OpenAIError(f"{self.ctx.model_name} is not served as a reranker; start the "
                              f"server with --task rerank to score (query, document) pairs "
                              f"with it", param="model", code="rerank_not_supported")
        return self.ctx.reranker

    async def tokenize(self, reranker: Reranker, pairs: list[tuple[str, str]],
                       instruction: str | None, param: str) -> list[list[int]]:
        """Each pair's whole prompt; 400 naming ``param`` for a pair over the context
        length."""
        ctx = self.ctx
        texts = [pair_text(q, d, instruction) for q, d in pairs]
        for text in texts:
            ctx.prep.check_length(len(text) + reranker.num_template_tokens, param)
        bodies = await ctx.prep.run(ctx.tokenizer.encode_batch, texts, False)
        prompts = [reranker.prompt_ids(body) for body in bodies]
        for i, ids in enumerate(prompts):
            if len(ids) > ctx.max_model_len:
                raise OpenAIError(
                    f"This model's maximum context length is {ctx.max_model_len} tokens. "
                    f"However, the reranker prompt of pair {i} (the query with document {i}) "
                    f"has {len(ids)} tokens. Please reduce its length.", param=param,
                    code="context_length_exceeded")
        return prompts

    async def encode_pairs(self, encoder: CrossEncoderReranker, pairs: list[tuple[str, str]],
                           instruction: str | None, param: str
                           ) -> tuple[list[list[int]], list[PoolingParams]]:
        """A cross-encoder's pairs (cut to its length) and their pooling; 400 for an
        instruction (it has no prompt to put one in) or a text too long to be worth cutting."""
        if instruction is not None:
            raise OpenAIError("instruction is for causal-LM rerankers; this cross-encoder "
                              "scores the pair as it is", param="instruction")
        for i, (q, d) in enumerate(pairs):
            if len(q) + len(d) > encoder.max_chars:
                raise OpenAIError(
                    f"pair {i} has {len(q) + len(d)} characters; this cross-encoder reads "
                    f"{encoder.max_len} tokens of a pair (longer ones are cut) and refuses "
                    f"texts over {encoder.max_chars} characters", param=param,
                    code="context_length_exceeded")
        encoded = await self.ctx.prep.run(encoder.encode_pairs, pairs)
        return [ids for ids, _ in encoded], [encoder.pooling(s) for _, s in encoded]

    async def score(self, reranker: Reranker | CrossEncoderReranker, prompts: list[list[int]],
                    poolings: list[PoolingParams], priority: int, arrival: float,
                    ticket: QueueTicket = NO_TICKET) -> list[float]:
        """Each prompt's score, computed together (the engine batches them): P("yes"), or a
        cross-encoder's sigmoid(logit)."""
        base = random_id("rerank-")
        outs = await asyncio.gather(*(
            self.ctx.engine.embed(ids, pooling, f"{base}-{i}", priority, arrival, ticket)
            for i, (ids, pooling) in enumerate(zip(prompts, poolings))))
        if isinstance(reranker, CrossEncoderReranker):
            return [reranker.relevance(out.pooled) for out in outs]
        return [relevance(*out.pooled) for out in outs]

    async def _run(self, body, pairs: list[tuple[str, str]], param: str, admit
                   ) -> tuple[list[float], int]:
        """(each pair's score, the prompts' token count)."""
        arrival = time.time()
        self.ctx.check_model(body.model)
        reranker = self.check_served()
        if isinstance(reranker, CrossEncoderReranker):
            prompts, poolings = await self.encode_pairs(reranker, pairs, body.instruction,
                                                        param)
        else:
            prompts = await self.tokenize(reranker, pairs, body.instruction, param)
            poolings = [PoolingParams(logit_token_ids=[reranker.yes_id, reranker.no_id])]
            poolings *= len(prompts)
        self.ctx.check_alive()
        num_tokens = sum(map(len, prompts))
        ticket = admit(len(prompts), num_tokens, body.timeout)
        scores = await self.score(reranker, prompts, poolings, body.priority, arrival, ticket)
        return scores, num_tokens

    async def rerank(self, body: RerankRequest, admit) -> RerankResponse:
        """``POST /v1/rerank``: the documents by relevance to the query, best first (ties in
        document order); ``admit(num_seqs, num_tokens, timeout)`` as for embeddings."""
        docs = body.document_texts()
        if not docs:
            raise OpenAIError("documents is empty: give at least one document",
                              param="documents")
        scores, num_tokens = await self._run(body, [(body.query, d) for d in docs],
                                             "documents", admit)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])[:body.top_n or None]
        results = [RerankResult(index=i, relevance_score=scores[i],
                                document=RerankDocument(text=docs[i])
                                if body.return_documents else None) for i in order]
        return RerankResponse(id=random_id("rerank-"), model=self.ctx.model_name,
                              results=results, usage=RerankUsage(total_tokens=num_tokens))

    async def score_pairs(self, body: ScoreRequest, admit) -> ScoreResponse:
        """``POST /v1/score``: one score per pair, in pair order."""
        pairs = score_pairs(body.text_1, body.text_2)
        scores, num_tokens = await self._run(body, pairs, "text_2", admit)
        return ScoreResponse(
            id=random_id("score-"), created=unix_now(), model=self.ctx.model_name,
            data=[ScoreData(index=i, score=s) for i, s in enumerate(scores)],
            usage=ScoreUsage(prompt_tokens=num_tokens, total_tokens=num_tokens))


def score_pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    """vLLM's pairing: 1:1, 1:N (the one text_1 with each text_2) or N:N (zipped); 400
    otherwise."""
    first = [text_1] if isinstance(text_1, str) else text_1
    second = [text_2] if isinstance(text_2, str) else text_2
    if not first or not second:
        raise OpenAIError("text_1 and text_2 must each hold at least one text",
                          param="text_1" if not first else "text_2")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise OpenAIError(f"text_1 has {len(first)} texts and text_2 {len(second)}: give one "
                          f"text_1 (paired with each text_2) or as many as text_2 (1:1, 1:N "
                          f"or N:N)", param="text_2")
    return list(zip(first, second))

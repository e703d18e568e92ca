"""The OpenAI API's entries in the route table, and their handlers: parse the body with the
route's pydantic model, check and admit it, run the serving_*.py handler, answer with the
whole JSON body or the stream (see `http.router` for what a handler may answer).

    POST /v1/completions, /v1/chat/completions    generation, SSE when streamed
    POST /v1/chat/completions/render, /v1/completions/render   the prompt alone (no engine)
    POST /v1/embeddings    POST /v1/rerank, /rerank, /v1/score, /score (--task rerank)
    GET /v1/models    POST /tokenize, /detokenize    GET /tokenizer_info
"""

from __future__ import annotations

import dataclasses
import time
from urllib.parse import unquote

import msgspec

from radixserve.frontend.http.admission import AdmissionGate, Ticket
from radixserve.frontend.http.asgi_io import until_disconnect
from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.http.errors import send_error
from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.http.router import OPENAI, Call, Route
from radixserve.frontend.http.worker_routes import rendered_prompt
from radixserve.frontend.media.chat import check_takes_images
from radixserve.frontend.openai.protocol import (CompletionRequest, CompletionResponse, ModelCard,
                                                 ModelList)
from radixserve.frontend.openai.protocol_chat import (ChatCompletionRequest,
                                                      ChatCompletionResponse, DetokenizeRequest,
                                                      DetokenizeResponse, RenderList,
                                                      RenderResponse, TokenizeRequest,
                                                      TokenizeResponse)
from radixserve.frontend.openai.protocol_embedding import EmbeddingRequest, EmbeddingResponse
from radixserve.frontend.openai.protocol_rerank import (RerankRequest, RerankResponse,
                                                        ScoreRequest, ScoreResponse)
from radixserve.frontend.openai.response_size import encode_body
from radixserve.frontend.openai.serving import ServingContext
from radixserve.frontend.openai.chat_render import render_messages
from radixserve.frontend.openai.serving_chat import ChatServer, chat_prompt_ids
from radixserve.frontend.openai.serving_completion import CompletionServer, request_size
from radixserve.frontend.openai.serving_embedding import EmbeddingServer
from radixserve.frontend.openai.serving_rerank import RerankServer
from radixserve.frontend.truncation import say_truncated


def _anthropic(call: Call) -> bool:
    return any(k == b"anthropic-version" for k, _ in call.scope.get("headers", ()))


def _anthropic_card(name: str) -> dict:
    """Anthropic's ModelInfo for the served model."""
    return {"type": "model", "id": name, "display_name": name,
            "created_at": "1970-01-01T00:00:00Z"}


class OpenAIRoutes:
    """The OpenAI endpoints over one `ServingContext` and admission gate. The generation
    handlers are public: the Ollama routes run them on translated requests."""

    def __init__(self, ctx: ServingContext, gate: AdmissionGate) -> None:
        self.ctx, self.gate = ctx, gate
        self.completions, self.chat = CompletionServer(ctx), ChatServer(ctx)
        self.embeddings = EmbeddingServer(ctx)
        self.reranker = RerankServer(ctx)
        self.wire = dataclasses.replace(OPENAI, send_error=self.send_error)

    def routes(self) -> list[Route]:
        w = self.wire
        return [
            Route("POST", "/v1/completions", self.completion, w, "Completions",
                  CompletionRequest, CompletionResponse, can_stream=True),
            Route("POST", "/v1/chat/completions", self.chat_completion, w, "Chat completions",
                  ChatCompletionRequest, ChatCompletionResponse, can_stream=True),
            Route("POST", "/v1/chat/completions/render", self.render, w,
                  "The chat template and tokenization alone", ChatCompletionRequest,
                  RenderResponse),
            Route("POST", "/v1/completions/render", self.render_completion, w,
                  "The completion's prompts tokenized alone (a list of render answers, one "
                  "per prompt)", CompletionRequest, RenderList),
            Route("POST", "/v1/embeddings", self.embed, w, "Embeddings", EmbeddingRequest,
                  EmbeddingResponse),
            *(Route("POST", path, self.rerank, w, "Documents ordered by relevance to a query "
                    "(--task rerank)", RerankRequest, RerankResponse)
              for path in ("/v1/rerank", "/rerank")),
            *(Route("POST", path, self.score, w, "Relevance scores of text pairs (--task "
                    "rerank)", ScoreRequest, ScoreResponse) for path in ("/v1/score", "/score")),
            Route("GET", "/v1/models", self.models, OPENAI, "The served model",
                  response=ModelList),
            Route("GET", "/v1/models/{model}", self.model, OPENAI,
                  "One model by id (404 for another id)", response=ModelCard),
            # ids with a slash ("org/name"): the SDKs put them in the path unescaped
            Route("GET", "/v1/models/", self.model, OPENAI, is_prefix=True, in_schema=False),
            Route("POST", "/tokenize", self.tokenize, OPENAI, "Tokenize a prompt or messages",
                  TokenizeRequest, TokenizeResponse),
            Route("POST", "/detokenize", self.detokenize, OPENAI, "Token ids back to text",
                  DetokenizeRequest, DetokenizeResponse),
            Route("GET", "/tokenizer_info", self.tokenizer_info, OPENAI,
                  "The tokenizer's configuration (vLLM's route; lm-eval's remote tokenizer)"),
        ]

    async def send_error(self, send, exc: Exception) -> None:
        """The OpenAI error answer, a context-length refusal counted as an admission
        rejection."""
        if isinstance(exc, OpenAIError) and exc.code == "context_length_exceeded":
            self.gate.metrics.on_reject("context_length")
        await send_error(send, exc)

    async def completion(self, call: Call):
        arrival = time.time()
        body = parse_body(CompletionRequest, call.body)
        self.gate.precheck(*request_size(self.ctx, body))  # before tokenizing
        prompts, params, cut = await self.completions.prepare(body)
        say_truncated(call.headers, cut)
        await self.ctx.check_structured(structured_param(body), params)
        size = self.completions.response_bytes(body, prompts, params,
                                               self.ctx.max_response_bytes, bool(body.stream))
        self.ctx.check_alive()
        ticket = self.gate.admit(len(prompts) * params[0].n, sum(len(ids) for _, ids in prompts),
                                 body.timeout)
        call.admitted.append(ticket)
        if body.stream:
            return self.completions.stream(body, prompts, params, arrival, ticket, cut)
        work = self.completions.full(body, prompts, params, arrival, ticket, cut)
        return await encode_body(await until_disconnect(call.receive, work), size)

    async def chat_completion(self, call: Call):
        arrival = time.time()
        body = parse_body(ChatCompletionRequest, call.body)
        check_takes_images(self.ctx.images is not None, body.messages)
        self.gate.precheck(body.n or 1, 0)
        ids, params, parsers = await self.chat.prepare(body)
        say_truncated(call.headers, parsers.truncation)
        await self.ctx.check_structured(structured_param(body), [params])
        size = self.chat.response_bytes(params, self.ctx.max_response_bytes, bool(body.stream))
        self.ctx.check_alive()
        ticket = self.gate.admit(params.n, len(ids), body.timeout)
        call.admitted.append(ticket)
        if body.stream:
            return self.chat.stream(body, ids, params, parsers, arrival, ticket)
        work = self.chat.full(body, ids, params, parsers, arrival, ticket)
        return await encode_body(await until_disconnect(call.receive, work), size)

    async def embed(self, call: Call):
        body = parse_body(EmbeddingRequest, call.body)
        work = self.embeddings.openai(body, self.admitter(call.admitted), call.headers)
        return (await until_disconnect(call.receive, work)).model_dump_json().encode()

    async def rerank(self, call: Call):
        body = parse_body(RerankRequest, call.body)
        work = self.reranker.rerank(body, self.admitter(call.admitted))
        return (await until_disconnect(call.receive, work)).model_dump_json().encode()

    async def score(self, call: Call):
        body = parse_body(ScoreRequest, call.body)
        work = self.reranker.score_pairs(body, self.admitter(call.admitted))
        return (await until_disconnect(call.receive, work)).model_dump_json().encode()

    def admitter(self, admitted: list[Ticket]):
        """``admit(num_seqs, num_tokens, timeout)`` through the gate, the ticket kept in
        ``admitted`` (released when the response ends)."""
        def admit(num_seqs: int, num_tokens: int, timeout: float | None):
            ticket = self.gate.admit(num_seqs, num_tokens, timeout)
            admitted.append(ticket)
            return ticket

        return admit

    async def render(self, call: Call):
        """The chat template and tokenization alone (no engine), cut as the request asks."""
        body = parse_body(ChatCompletionRequest, call.body)
        self.ctx.check_model(body.model)
        check_takes_images(self.ctx.images is not None, body.messages)
        text, ids, cut, _ = await chat_prompt_ids(self.ctx, body)
        say_truncated(call.headers, cut)
        return msgspec.json.encode(rendered_prompt(self.ctx.model_name, text, ids))

    async def render_completion(self, call: Call):
        """The completion's prompts tokenized alone (no engine): one entry per prompt."""
        body = parse_body(CompletionRequest, call.body)
        prompts, _, _ = await self.completions.prepare(body)
        return msgspec.json.encode([rendered_prompt(self.ctx.model_name, text, ids)
                                    for text, ids in prompts])

    async def models(self, call: Call):
        if _anthropic(call):
            card = _anthropic_card(self.ctx.model_name)
            return msgspec.json.encode({"data": [card], "has_more": False,
                                        "first_id": card["id"], "last_id": card["id"]})
        ctx = self.ctx
        adapters = [ModelCard(id=name, root=path, parent=ctx.model_name,
                              max_model_len=ctx.max_model_len)
                    for name, path in sorted(ctx.loras.items())]  # as vLLM lists them
        return ModelList(data=[ModelCard(id=ctx.model_name, max_model_len=ctx.max_model_len,
                                         capabilities=capabilities(ctx)),
                               *adapters]).model_dump_json().encode()

    async def model(self, call: Call):
        """``GET /v1/models/{id}``: the served model's card (Anthropic's shape when the
        request carries ``anthropic-version``, as the anthropic SDK's does), 404 otherwise."""
        name = unquote(call.scope["path"][len("/v1/models/"):])
        self.ctx.check_model(name)  # 404 (OpenAI's shape, which the anthropic SDK reads too)
        if _anthropic(call):
            return msgspec.json.encode(_anthropic_card(name))
        return ModelCard(id=name, max_model_len=self.ctx.max_model_len,
                         capabilities=capabilities(self.ctx)).model_dump_json().encode()

    async def tokenize(self, call: Call):
        body = parse_body(TokenizeRequest, call.body)
        self.ctx.check_model(body.model)
        check_takes_images(self.ctx.images is not None, body.messages or ())
        return await self.ctx.prep.run(_tokenize, self.ctx, body)  # grows with the input

    async def tokenizer_info(self, call: Call):
        return msgspec.json.encode(tokenizer_info(self.ctx))

    async def detokenize(self, call: Call):
        body = parse_body(DetokenizeRequest, call.body)
        self.ctx.check_model(body.model)
        return await self.ctx.prep.run(_detokenize, self.ctx, body)


def capabilities(ctx: ServingContext) -> list[str]:
    """What the served model does, as Ollama names it (its /api/show; /v1/models too)."""
    found = ["completion"]
    for name, has in (("tools", ctx.tool_parser is not None),
                      ("thinking", ctx.reasoning_parser is not None),
                      ("embedding", ctx.embedding.pooling is not None),
                      ("insert", ctx.tokenizer.fim is not None),
                      ("vision", ctx.images is not None)):
        if has:
            found.append(name)
    return found


def structured_param(body) -> str:
    """The request field a structured-output error is about."""
    if getattr(body, "response_format", None) is not None:
        return "response_format"
    if getattr(body, "structured_outputs", None) is not None:
        return "structured_outputs"
    return "tool_choice"


def tokenizer_info(ctx: ServingContext) -> dict:
    """vLLM's ``/tokenizer_info``: the fields of a transformers tokenizer's config (special
    tokens as text, None where the model has none; whether encoding adds BOS / EOS; the
    added tokens; the chat template) and ``tokenizer_class``."""
    tokenizer = ctx.tokenizer
    named = {name: tokenizer.special_tokens.get(name)
             for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
    empty = tokenizer.encode("")
    added = {str(i): {"content": t.content, "single_word": t.single_word, "lstrip": t.lstrip,
                      "rstrip": t.rstrip, "normalized": t.normalized, "special": t.special}
             for i, t in sorted(tokenizer.backend.get_added_tokens_decoder().items())}
    info = {"tokenizer_class": "PreTrainedTokenizerFast", **named,
            "add_bos_token": bool(tokenizer.bos_prefix),
            "add_eos_token": tokenizer.eos_token_id is not None
            and empty[-1:] == [tokenizer.eos_token_id],
            "model_max_length": ctx.max_model_len, "added_tokens_decoder": added}
    if tokenizer.chat_template:
        info["chat_template"] = tokenizer.chat_template
    return info


# serialized on the worker thread too (a million token ids take seconds)
def _tokenize(ctx: ServingContext, body: TokenizeRequest) -> bytes:
    text = render_messages(ctx, body) if body.messages is not None else body.prompt
    # encode_batch releases the GIL while it runs (encode does not)
    ids = ctx.tokenizer.encode_batch([text], body.effective_add_special_tokens)[0]
    strs = ctx.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=ctx.max_model_len, tokens=ids,
                            token_strs=strs).model_dump_json().encode()


def _detokenize(ctx: ServingContext, body: DetokenizeRequest) -> bytes:
    if body.tokens and max(body.tokens) >= ctx.tokenizer.vocab_size:
        raise OpenAIError("token ids are out of the vocabulary", param="tokens")
    return DetokenizeResponse(prompt=ctx.tokenizer.decode(
        body.tokens, skip_special_tokens=False)).model_dump_json().encode()

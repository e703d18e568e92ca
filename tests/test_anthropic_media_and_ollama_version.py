"""Two client-facing answers: an Anthropic ``document`` block is refused in plain words (an
``image`` block parses: a text-only model refuses it when served, tests/server/
test_image_routes_text_only.py), and Ollama's ``/api/version`` reports the Ollama API version
the routes follow."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from radixserve.frontend.anthropic.protocol import MessagesRequest
from radixserve.frontend.anthropic.serving import anthropic_error_response
from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.ollama.routes import OLLAMA_API_VERSION, OllamaRoutes

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}


def _refusal(content) -> tuple[int, dict]:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    with pytest.raises(Exception) as caught:
        parse_body(MessagesRequest, json.dumps(body).encode())
    return anthropic_error_response(caught.value)


DOCUMENT = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                          "data": "x"}}


@pytest.mark.parametrize("content", [
    [DOCUMENT],
    [{"type": "text", "text": "Summarize"}, DOCUMENT],
    [{"type": "tool_result", "tool_use_id": "t1", "content": [DOCUMENT]}],
])
def test_anthropic_document_blocks_get_a_plain_refusal(content) -> None:
    status, body = _refusal(content)
    assert status == 400
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": (
        "messages.0: document content is not supported by this server (text and image "
        "blocks are)")}}


@pytest.mark.parametrize("content", [
    [{"type": "text", "text": "What is in this picture?"}, IMAGE],
    [IMAGE],
    [{"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}],
])
def test_anthropic_image_blocks_parse(content) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}
    chat = parse_body(MessagesRequest, json.dumps(body).encode()).to_chat()
    assert [p.image_url.url for p in chat.messages[-1].images()] == [
        "data:image/png;base64,iVBO"]


def test_other_unknown_blocks_are_still_refused_by_name() -> None:
    status, body = _refusal([{"type": "video"}])
    assert status == 400 and "'video'" in body["error"]["message"]


def test_text_blocks_still_pass() -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert parse_body(MessagesRequest, json.dumps(body).encode()).messages[0].content[0].text


def test_ollama_version_is_the_ollama_api_version() -> None:
    answer = msgspec.json.decode(asyncio.run(OllamaRoutes._version(None, None)))
    assert answer == {"version": OLLAMA_API_VERSION}
    numbers = tuple(int(part) for part in OLLAMA_API_VERSION.split("."))
    # clients gate tools, thinking and logprobs on a release at least this recent
    assert len(numbers) == 3 and numbers >= (0, 12, 11)

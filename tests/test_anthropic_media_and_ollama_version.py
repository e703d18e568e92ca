"""Two client-facing answers: an Anthropic ``image`` (or ``document``) block is refused in
plain words, and Ollama's ``/api/version`` reports the Ollama API version the routes follow."""

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


@pytest.mark.parametrize("content, kind", [
    ([{"type": "text", "text": "What is in this picture?"}, IMAGE], "image"),
    ([IMAGE], "image"),
    ([{"type": "tool_result", "tool_use_id": "t1", "content": [IMAGE]}], "image"),
    ([{"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                      "data": "x"}}], "document"),
])
def test_anthropic_media_blocks_get_a_plain_refusal(content, kind: str) -> None:
    status, body = _refusal(content)
    assert status == 400
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": (
        f"messages.0: {kind} content is not supported by this server: the served model "
        "takes text only")}}


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

"""Images in each API's request shape become the chat request's ``image_url`` parts, in order:
OpenAI chat itself, Responses ``input_image``, Anthropic ``image`` blocks, Ollama ``images``;
and what each refuses at parse time (other part types, images outside user messages)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from radixserve.frontend.anthropic.protocol import MessagesRequest
from radixserve.frontend.http.body_reader import parse_body
from radixserve.frontend.media.chat import TEXT_ONLY, check_takes_images, image_urls
from radixserve.frontend.media.errors import MediaError
from radixserve.frontend.ollama.protocol import OllamaChatRequest, OllamaGenerateRequest
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest, ChatMessage
from radixserve.frontend.openai.routes import capabilities
from radixserve.frontend.responses.protocol import ResponsesRequest
from radixserve.frontend.responses.serving import chat_messages, chat_request, stored_items

PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5"
           "ErkJggg==")
PNG_URI = f"data:image/png;base64,{PNG_B64}"
JPEG_B64 = "/9j/4AAQSkZJRgABAQAAAQABAAD"


def chat(messages: list[dict]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": messages})


def test_chat_parts_text_and_images():
    message = ChatMessage.model_validate({"role": "user", "content": [
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": PNG_URI, "detail": "low"}},
        {"type": "text", "text": "with"},
        {"type": "image_url", "image_url": "https://example.com/b.png"}]})  # vLLM's bare URL
    assert message.text() == "Compare\nwith"
    assert [(p.image_url.url, p.image_url.detail) for p in message.images()] == [
        (PNG_URI, "low"), ("https://example.com/b.png", None)]
    assert ChatMessage(role="user", content="plain").images() == []


@pytest.mark.parametrize("message, says", [
    ({"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]},
     "unsupported content part type 'input_audio'"),
    ({"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]},
     "unsupported content part type 'video_url'"),
    ({"role": "user", "content": [{"type": "file", "file": {}}]},
     "unsupported content part type 'file'"),
    ({"role": "system", "content": [{"type": "image_url", "image_url": {"url": PNG_URI}}]},
     "images are only accepted in user messages, not in system messages"),
    ({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": PNG_URI}}]},
     "not in assistant messages"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]},
     "at least 1 character"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_URI,
                                                                      "detail": "max"}}]},
     "'auto', 'low' or 'high'"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_URI,
                                                                      "x": 1}}]},
     "Extra inputs are not permitted"),
])
def test_chat_part_refusals(message, says):
    with pytest.raises(ValidationError, match=says):
        chat([message])


def test_image_urls_and_the_text_only_check():
    request = chat([{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "a"}},
        {"type": "text", "text": "t"}, {"type": "image_url", "image_url": {"url": "b"}}]}])
    assert image_urls(request.messages) == [("messages[1].content[0]", "a"),
                                            ("messages[1].content[2]", "b")]
    check_takes_images(True, request.messages)
    with pytest.raises(MediaError, match=TEXT_ONLY) as caught:
        check_takes_images(False, request.messages, "input")
    assert caught.value.param == "input"
    check_takes_images(False, chat([{"role": "user", "content": "no images"}]).messages)


# ----------------------------------------------------------------------------- Responses


def _responses_chat(body: dict) -> ChatCompletionRequest:
    request = ResponsesRequest.model_validate(body)
    return chat_request(request, chat_messages(request.instructions,
                                               stored_items(request.input_items())))


def test_responses_input_image_becomes_an_image_part():
    request = _responses_chat({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is it?"},
        {"type": "input_image", "image_url": PNG_URI, "detail": "high"},
        {"type": "input_image", "image_url": "https://example.com/x.jpg"}]}],
        "instructions": "Be brief."})
    system, user = request.messages
    assert system.content == "Be brief." and user.text() == "What is it?"
    assert [(p.image_url.url, p.image_url.detail) for p in user.images()] == [
        (PNG_URI, "high"), ("https://example.com/x.jpg", None)]


def test_responses_text_only_input_is_unchanged():
    request = _responses_chat({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}]})
    assert request.messages[0].content == "a\nb"


@pytest.mark.parametrize("part, says", [
    ({"type": "input_image", "file_id": "file-1"}, "file_id is not supported"),
    ({"type": "input_file", "file_data": "x"}, "unsupported content part type 'input_file'"),
    ({"type": "input_audio"}, "unsupported content part type 'input_audio'"),
    ({"type": "input_image"}, "image_url"),
])
def test_responses_part_refusals(part, says):
    with pytest.raises(ValidationError, match=says):
        ResponsesRequest.model_validate({"input": [{"role": "user", "content": [part]}]})


def test_responses_images_only_from_the_user():
    with pytest.raises(ValidationError, match="not in developer messages"):
        ResponsesRequest.model_validate({"input": [{"role": "developer", "content": [
            {"type": "input_image", "image_url": PNG_URI}]}]})


# ----------------------------------------------------------------------------- Anthropic


def _anthropic(content, role: str = "user") -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": role, "content": content}]}
    return parse_body(MessagesRequest, json.dumps(body).encode())


def test_anthropic_image_blocks_become_image_parts():
    request = _anthropic([
        {"type": "text", "text": "Compare"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                     "data": JPEG_B64}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"},
         "cache_control": {"type": "ephemeral"}}]).to_chat()
    [user] = request.messages
    assert user.text() == "Compare"
    assert [p.image_url.url for p in user.images()] == [
        f"data:image/jpeg;base64,{JPEG_B64}", "https://example.com/a.png"]
    assert [p.type for p in user.content] == ["text", "image_url", "image_url"]


def test_anthropic_tool_result_images_open_the_next_user_message():
    request = _anthropic([
        {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "the screenshot"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG_B64}}]},
        {"type": "text", "text": "What does it show?"}]).to_chat()
    tool, user = request.messages
    assert (tool.role, tool.content, tool.tool_call_id) == ("tool", "the screenshot", "t1")
    assert [p.type for p in user.content] == ["image_url", "text"]
    assert user.images()[0].image_url.url == PNG_URI and user.text() == "What does it show?"


def test_anthropic_tool_result_image_alone():
    request = _anthropic([{"type": "tool_result", "tool_use_id": "t1", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": PNG_B64}}]}]).to_chat()
    tool, user = request.messages
    assert tool.content == "" and [p.type for p in user.content] == ["image_url"]


@pytest.mark.parametrize("block, says", [
    ({"type": "image", "source": {"type": "base64", "media_type": "image/tiff", "data": "x"}},
     "image/jpeg"),
    ({"type": "image", "source": {"type": "file", "file_id": "f"}},
     "image source type 'file' is not supported"),
    ({"type": "image", "source": {"type": "url"}}, "url"),
])
def test_anthropic_image_refusals(block, says):
    with pytest.raises(ValidationError, match=says):
        _anthropic([block])


def test_anthropic_images_only_from_the_user():
    with pytest.raises(ValidationError, match="assistant messages may not hold image blocks"):
        _anthropic([{"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}],
                   role="assistant")


# ----------------------------------------------------------------------------- Ollama


def test_ollama_chat_images_become_image_parts():
    body = OllamaChatRequest.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "What is this?", "images": [PNG_B64, JPEG_B64]}]})
    [user] = chat(body.to_openai()["messages"]).messages
    assert [p.image_url.url for p in user.images()] == [
        PNG_URI, f"data:image/jpeg;base64,{JPEG_B64}"]
    assert user.text() == "What is this?" and user.content[-1].type == "text"


def test_ollama_generate_images_go_with_the_prompt():
    body = OllamaGenerateRequest.model_validate({"model": "m", "prompt": "Describe",
                                                 "system": "Be brief.", "images": [PNG_B64]})
    system, user = chat(body.to_openai_chat()["messages"]).messages
    assert system.content == "Be brief." and user.text() == "Describe"
    assert [p.image_url.url for p in user.images()] == [PNG_URI]


@pytest.mark.parametrize("extra, says", [
    ({"raw": True}, "images cannot be combined with raw"),
    ({"suffix": "end"}, "images cannot be combined with suffix"),
    ({"context": [1, 2]}, "images cannot be combined with context"),
    ({"images": [1]}, "string"),
])
def test_ollama_generate_image_refusals(extra, says):
    with pytest.raises(ValidationError, match=says):
        OllamaGenerateRequest.model_validate({"model": "m", "prompt": "p",
                                              "images": [PNG_B64], **extra})


def test_ollama_images_only_from_the_user():
    with pytest.raises(ValidationError, match="not in assistant messages"):
        OllamaChatRequest.model_validate({"model": "m", "messages": [
            {"role": "assistant", "content": "x", "images": [PNG_B64]}]})


# ----------------------------------------------------------------------------- capabilities


class _Ctx:
    """The fields `capabilities` reads (a `ServingContext`'s)."""

    def __init__(self, images=None, tool_parser=None) -> None:
        self.images, self.tool_parser, self.reasoning_parser = images, tool_parser, None
        self.embedding = type("E", (), {"pooling": None})()
        self.tokenizer = type("T", (), {"fim": None})()


def test_capabilities_name_vision_only_with_an_image_processor():
    assert capabilities(_Ctx()) == ["completion"]
    assert capabilities(_Ctx(images=object(), tool_parser=object())) == [
        "completion", "tools", "vision"]

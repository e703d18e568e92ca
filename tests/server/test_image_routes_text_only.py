"""Images sent to a real ``radixserve serve`` of a text-only model (the embedded one, behind
the mock engine: no answer's text matters here): every route answers 400 in its own error
shape, saying the model takes text only, and goes on serving; malformed image parts are 400s
in each shape too; /v1/models and Ollama's /api/show do not claim vision."""

from __future__ import annotations

import httpx
import pytest
from server_proc import ServerProc

PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5"
           "ErkJggg==")
PNG_URI = f"data:image/png;base64,{PNG_B64}"
TEXT_ONLY = "the served model takes text only"
CHAT_IMAGE = {"messages": [{"role": "user", "content": [
    {"type": "text", "text": "What is this?"},
    {"type": "image_url", "image_url": {"url": PNG_URI}}]}], "max_tokens": 2}
ANTHROPIC_IMAGE = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                 "data": PNG_B64}},
    {"type": "text", "text": "What is this?"}]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("media")
    s = ServerProc("--mock-engine", "--allowed-media-path", str(folder),
                   "--max-images-per-request", "2", "--media-fetch-timeout", "3")
    yield s
    assert s.stop() == 0


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def _openai_400(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


def _anthropic_400(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


def _ollama_400(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error"}
    return r.json()["error"]


def _still_serves(server) -> None:
    r = _post(server, "/v1/chat/completions",
              {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", CHAT_IMAGE),
    ("/v1/chat/completions", {**CHAT_IMAGE, "stream": True}),
    ("/v1/chat/completions/render", CHAT_IMAGE),
    ("/tokenize", {"messages": CHAT_IMAGE["messages"]}),
])
def test_openai_routes(server, path, body):
    error = _openai_400(_post(server, path, body))
    assert TEXT_ONLY in error["message"] and error["param"] == "messages"
    _still_serves(server)


def test_responses(server):
    body = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": PNG_URI}]}], "max_output_tokens": 2}
    error = _openai_400(_post(server, "/v1/responses", body))
    assert TEXT_ONLY in error["message"] and error["param"] == "input"
    _still_serves(server)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic(server, path):
    body = {**ANTHROPIC_IMAGE, "model": _served(server)}
    if path.endswith("count_tokens"):
        body.pop("max_tokens")
    assert TEXT_ONLY in _anthropic_400(_post(server, path, body))
    tool_result = {**body, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}]}
    assert TEXT_ONLY in _anthropic_400(_post(server, path, tool_result))
    _still_serves(server)


@pytest.mark.parametrize("path, body", [
    ("/api/chat", {"model": "MODEL", "messages": [
        {"role": "user", "content": "What is this?", "images": [PNG_B64]}]}),
    ("/api/chat", {"model": "MODEL", "stream": False, "messages": [
        {"role": "user", "content": "What is this?", "images": [PNG_B64]}]}),
    ("/api/generate", {"model": "MODEL", "prompt": "Describe", "images": [PNG_B64]}),
])
def test_ollama(server, path, body):
    assert _ollama_400(_post(server, path, {**body, "model": _ollama_name(server)})) == \
        f"images are not supported: {TEXT_ONLY}"
    _still_serves(server)


def _served(server) -> str:
    return httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]


def _ollama_name(server) -> str:
    return httpx.get(f"{server.url}/api/tags").json()["models"][0]["name"]


def test_ollama_generate_raw_with_images(server):
    body = {"model": _ollama_name(server), "prompt": "x", "raw": True, "images": [PNG_B64]}
    message = _ollama_400(_post(server, "/api/generate", body))
    assert "images cannot be combined with raw" in message
    assert "chat template" in message


@pytest.mark.parametrize("content, says", [
    ([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
     "unsupported content part type 'input_audio'"),
    ([{"type": "image_url", "image_url": {"url": PNG_URI, "detail": "ultra"}}], "detail"),
    ([{"type": "image_url"}], "image_url"),
])
def test_malformed_chat_parts(server, content, says):
    error = _openai_400(_post(server, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": content}]}))
    assert says in error["message"] and error["param"].startswith("messages.0.content")


def test_images_outside_user_messages(server):
    body = {"messages": [{"role": "system", "content": [
        {"type": "image_url", "image_url": {"url": PNG_URI}}]},
        {"role": "user", "content": "hi"}]}
    error = _openai_400(_post(server, "/v1/chat/completions", body))
    assert "only accepted in user messages, not in system messages" in error["message"]
    anthropic = {**ANTHROPIC_IMAGE, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ANTHROPIC_IMAGE["messages"][0]["content"]}]}
    assert "may not hold image blocks" in _anthropic_400(_post(server, "/v1/messages",
                                                               anthropic))
    ollama = {"model": _ollama_name(server), "messages": [
        {"role": "assistant", "content": "x", "images": [PNG_B64]}]}
    assert "only accepted in user messages" in _ollama_400(_post(server, "/api/chat", ollama))


def test_capabilities_without_vision(server):
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert "completion" in models[0]["capabilities"]
    assert "vision" not in models[0]["capabilities"]
    one = httpx.get(f"{server.url}/v1/models/{models[0]['id']}").json()
    assert one["capabilities"] == models[0]["capabilities"]
    show = httpx.post(f"{server.url}/api/show", json={"model": _ollama_name(server)}).json()
    assert "completion" in show["capabilities"] and "vision" not in show["capabilities"]


def test_serve_help_lists_the_media_flags():
    import subprocess
    import sys

    text = subprocess.run([sys.executable, "-m", "radixserve", "serve", "--help"],
                          capture_output=True, text=True, check=True).stdout
    for flag in ("--allowed-media-path", "--allow-remote-media", "--max-image-bytes",
                 "--max-image-pixels", "--media-fetch-timeout", "--max-images-per-request"):
        assert flag in text

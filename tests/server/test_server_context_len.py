"""The server on a tiny model whose window (512) is larger than its KV pool (64 tokens):
/v1/models reports the chosen context, requests without max_tokens are served, and what
cannot fit gets a 400 naming the numbers in the route's error shape."""

from __future__ import annotations

import httpx
import pytest
from server_proc import ServerProc
from tiny_models import make_hf_model

BLOCKS, BLOCK = 16, 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = make_hf_model("llama", tmp_path_factory.mktemp("ctx") / "m", seed=3)
    s = ServerProc("--model", str(path), "--num-kv-blocks", str(BLOCKS),
                   "--block-size", str(BLOCK), timeout=180)
    yield s
    s.stop()


def _error(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text
    return r.json()["error"]


def test_server_reports_and_serves_the_chosen_length(server):
    (card,) = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert card["max_model_len"] == 64
    url = f"{server.url}/v1/completions"
    # max_tokens null (completions default to OpenAI's 16 when it is absent): the rest
    r = httpx.post(url, json={"prompt": [5] * 20, "max_tokens": None, "temperature": 0,
                              "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 44
    chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "temperature": 0,
                            "ignore_eos": True})
    assert chat.status_code == 200, chat.text
    usage = chat.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 64


def test_server_refuses_what_cannot_fit_naming_the_numbers(server):
    url = f"{server.url}/v1/completions"
    error = _error(httpx.post(url, json={"prompt": [5] * 64}))
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    assert "maximum context length is 64 tokens" in error["message"]
    assert "64 in the prompt" in error["message"]
    error = _error(httpx.post(url, json={"prompt": [5] * 20, "max_tokens": 45}))
    assert error["param"] == "max_tokens" and "20 in the prompt, 45 in the completion" in \
        error["message"]
    long_chat = {"messages": [{"role": "user", "content": "word " * 80}]}
    error = _error(httpx.post(f"{server.url}/v1/chat/completions", json=long_chat))
    assert error["param"] == "messages" and "maximum context length is 64" in error["message"]

"""The next turn's prefix prefilled after a reasoning answer (frontend/next_turn.py), end to end.

Two real servers on a tiny random model whose tokenizer carries Qwen3's chat template (which
drops an answer's reasoning from the history once a new user message follows), one with the
warm-up on (the default) and one with ``--no-warm-next-turn``. Turn 1's output is fixed by a
regex (reasoning, then a long answer); the test waits for the warm-up to end by polling its
/metrics counter. Turn 2 (the answer sent back without reasoning, then a new question) must
find the answer cached with the warm-up, not without, and its greedy answer must be the same
tokens on both servers.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
from server_proc import ServerProc
from tiny_models import make_hf_model

TEMPLATE = (Path(__file__).parents[1] / "chat_templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
REASONING = "I think we should look at the time and find a way to help them. " * 2
ANSWER = "The good way is to keep the time and help the people in the world. " * 4
OUTPUT = f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory) -> Path:
    path = make_hf_model("qwen2", tmp_path_factory.mktemp("qwen3") / "m", seed=3)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return path


def _server(model: Path, *extra: str) -> ServerProc:
    return ServerProc("--model", str(model), "--num-kv-blocks", "256", "--reasoning-parser",
                      "qwen3", *extra, timeout=120)


@pytest.fixture(scope="module")
def warm(qwen3_model):
    s = _server(qwen3_model)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def cold(qwen3_model):
    s = _server(qwen3_model, "--no-warm-next-turn")
    yield s
    assert s.stop() == 0


def _counter(server: ServerProc, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.search(rf"^radixserve:{name}(?:_total)?{{[^}}]*}} (\S+)$", text, re.MULTILINE)
    assert found, f"no {name} in /metrics"
    return float(found.group(1))


def _turn1(server: ServerProc, messages: list[dict], stream: bool) -> dict:
    """Turn 1, its output forced to OUTPUT; the assistant message as the client keeps it."""
    body = {"model": "m", "messages": messages, "max_tokens": 300, "stream": stream,
            "structured_outputs": {"regex": re.escape(OUTPUT), "after_reasoning": False}}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    if not stream:
        message = r.json()["choices"][0]["message"]
    else:
        message = {"reasoning_content": "", "content": ""}
        for line in r.text.splitlines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    for key in message:
                        message[key] += choice["delta"].get(key) or ""
    assert message["reasoning_content"].strip() == REASONING.strip()
    assert message["content"].strip() == ANSWER.strip()
    return {"role": "assistant", "content": message["content"]}


def _turn2(server: ServerProc, messages: list[dict]) -> tuple[dict, list[str]]:
    """Turn 2, greedy: (its usage, its tokens)."""
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": messages, "max_tokens": 12, "temperature": 0,
        "logprobs": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return r.json()["usage"], [t["token"] for t in choice["logprobs"]["content"]]


def _wait_for(server: ServerProc, name: str, above: float, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while (value := _counter(server, name)) <= above:
        assert time.monotonic() < deadline, f"{name} stayed at {value}"
        time.sleep(0.1)
    return value


@pytest.mark.parametrize("stream", [False, True])
def test_turn2_finds_the_answer_cached(warm, cold, stream):
    ask = [{"role": "system", "content": f"You help people (streamed: {stream})."},
           {"role": "user", "content": "How do I help the people?"}]
    results = {}
    for name, server in (("warm", warm), ("cold", cold)):
        before = _counter(server, "next_turn_warmup_tokens")
        answer = _turn1(server, ask, stream)
        if name == "warm":
            prefilled = _wait_for(server, "next_turn_warmup_tokens", before) - before
            assert prefilled >= 40  # the answer, re-rendered without its reasoning
        results[name] = _turn2(server, [*ask, answer, {"role": "user", "content": "And then?"}])
    (warm_usage, warm_tokens), (cold_usage, cold_tokens) = results["warm"], results["cold"]
    assert warm_usage["prompt_tokens"] == cold_usage["prompt_tokens"]
    num_prompt = warm_usage["prompt_tokens"]
    warm_cached = warm_usage["prompt_tokens_details"]["cached_tokens"]
    cold_cached = cold_usage["prompt_tokens_details"]["cached_tokens"]
    # cold: the hit ends where the answer starts; warm: only the new question is left
    # (block-aligned: up to a block of 16 less)
    assert num_prompt - cold_cached > 60
    assert num_prompt - warm_cached < 16 + 16
    assert warm_tokens == cold_tokens  # the warm-up changes what is cached, not the answer
    assert _counter(cold, "next_turn_warmups") == 0  # --no-warm-next-turn


def test_no_warmup_without_reasoning(warm):
    """An answer without reasoning: the cache already holds what the next turn sends."""
    before = _counter(warm, "next_turn_warmups")
    r = httpx.post(f"{warm.url}/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": "Say it plainly."}],
        "max_tokens": 100, "structured_outputs": {"regex": re.escape(ANSWER),
                                                  "after_reasoning": False}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"].get("reasoning_content") is None
    time.sleep(1.0)  # what a warm-up would take at most on the tiny model
    assert _counter(warm, "next_turn_warmups") == before

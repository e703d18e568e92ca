"""A response's size bounded before admission, and large whole bodies built and encoded off
the event loop (issue 62 item 8: a 20 kB ``echo`` + ``prompt_logprobs: 20`` + ``logprobs:
20`` + ``n: 16`` request on a 4,000-token prompt answered 126.6 MB and held /health 6.5 s).
The refusals come before the engine, so the mock engine serves them."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from server_proc import ServerProc

from radixserve.frontend.openai import response_size
from radixserve.frontend.openai.protocol import (CompletionLogprobs, CompletionResponse,
                                                 CompletionResponseChoice, PromptLogprob)

PROMPT_IDS = [1000 + i % 5000 for i in range(4000)]  # exactly 4,000 prompt tokens


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--mock-engine", "--max-response-mb", "16")
    yield s
    assert s.stop() == 0


def _refused(r: httpx.Response, param: str) -> str:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "response_too_large", error
    return error["message"]


def test_the_issues_request_is_refused_naming_its_factors(server):
    start = time.monotonic()
    r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": PROMPT_IDS, "echo": True, "prompt_logprobs": 20, "logprobs": 20, "n": 16,
        "max_tokens": 16})
    message = _refused(r, "prompt_logprobs")
    assert time.monotonic() - start < 10  # refused before any work, not after the engine's
    for part in ("n 16", "prompt tokens 4,000", "(prompt_logprobs + 1) 21",
                 "tokens (echoed + max_tokens) 4,016", "(logprobs + 1) 21",
                 "limit of 16 MB", "--max-response-mb"):
        assert part in message, message
    # 16 x 4,000 x 21 x 64 bytes = 82 MB for prompt_logprobs alone
    assert "= 82.0 MB" in message, message


def test_chat_logprobs_times_n_times_max_tokens_is_refused(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 20,
        "n": 16, "max_tokens": 2000})
    message = _refused(r, "top_logprobs")
    assert "n 16 x max_tokens 2,000 x (top_logprobs + 1) 21" in message, message
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 20,
        "n": 16, "max_tokens": 2000, "stream": True})
    _refused(r, "top_logprobs")  # streamed answers are bounded alike


def test_a_stream_without_logprobs_is_not_bounded_by_its_text():
    """A stream sends its text as it is made: only what logprobs multiply counts there (an
    endless mock stream that the drain must cut asks for 90M tokens: tests/server/
    test_server_faults.py); a whole answer holds its text, so it counts."""
    limit = 16 * response_size.MB
    streamed = response_size.completion_terms(1, 10, 90_000_000, False, None, None, stream=True)
    assert response_size.check_response_size(streamed, limit) == 0
    assert response_size.check_response_size(
        response_size.chat_terms(1, 90_000_000, None, stream=True), limit) == 0
    with pytest.raises(Exception, match="response_too_large|max-response-mb"):
        response_size.check_response_size(
            response_size.completion_terms(1, 10, 90_000_000, False, None, None), limit)
    with pytest.raises(Exception, match="max-response-mb"):  # logprobs still count streamed
        response_size.check_response_size(response_size.completion_terms(
            1, 10, 1_000_000, False, 20, None, stream=True), limit)


def test_answers_within_the_limit_are_served(server):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 20,
        "n": 2, "max_tokens": 64})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "prompt": PROMPT_IDS, "n": 16, "max_tokens": 16})
    assert r.status_code == 200, r.text


def _big_response(num_positions: int = 20_000) -> CompletionResponse:
    """One choice scored over ``num_positions`` tokens as a model scores them: 20
    alternatives a position, full-precision logprobs, token ids of a 49k vocabulary."""
    lp = [-(t + 0.1234567890123456) for t in range(21)]
    top = {str(40_000 + t): PromptLogprob(logprob=lp[t], rank=t, decoded_token=" the")
           for t in range(1, 21)}
    logprobs = CompletionLogprobs(
        tokens=[" the"] * num_positions, token_logprobs=[lp[0]] * num_positions,
        top_logprobs=[{f" t{t}": lp[t] for t in range(20)}] * num_positions,
        text_offset=list(range(num_positions)))
    choice = CompletionResponseChoice(index=0, text="x", logprobs=logprobs,
                                      prompt_logprobs=[None] + [top] * num_positions)
    return CompletionResponse(model="m", choices=[choice])


def test_a_large_body_is_encoded_off_the_loop_and_the_loop_keeps_running():
    response = _big_response()
    start = time.monotonic()
    expected = response.model_dump_json().encode()
    inline_s = time.monotonic() - start
    assert len(expected) > 20 * 2**20

    async def encode_while_ticking():
        loop_thread, gaps = threading.get_ident(), []
        encoder_threads = []
        dump = CompletionResponse.model_dump_json

        def spy(self, *a, **kw):
            encoder_threads.append(threading.get_ident())
            return dump(self, *a, **kw)

        async def tick():
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.005)
                gaps.append(time.monotonic() - last)
                last = time.monotonic()

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0.02)
        CompletionResponse.model_dump_json = spy
        try:
            body = await response_size.encode_body(response, len(expected))
        finally:
            CompletionResponse.model_dump_json = dump
            ticker.cancel()
        return body, encoder_threads, loop_thread, max(gaps)

    # the loop went on ticking while it was encoded (inline it would stall for inline_s). In
    # the suite's one process another test's leftover thread (a grammar backend's tokenizer
    # build holds the GIL ~1 s) can stall any loop once, so one clean run of three proves it
    gaps = []
    for _ in range(3):
        body, threads, loop_thread, max_gap = asyncio.run(encode_while_ticking())
        assert body == expected
        assert threads and loop_thread not in threads  # encoded on a worker thread
        gaps.append(max_gap)
        if max_gap < max(0.5 * inline_s, 0.2):
            break
    assert min(gaps) < max(0.5 * inline_s, 0.2), (gaps, inline_s)


def test_a_small_body_is_encoded_inline():
    small = CompletionResponse(model="m", choices=[CompletionResponseChoice(index=0, text="x")])
    assert asyncio.run(response_size.encode_body(small, 100)) == small.model_dump_json().encode()


def test_the_estimate_does_not_exceed_what_is_written():
    """The entry sizes are lower bounds: a refusal never hits an answer that would fit."""
    response = _big_response(2000)
    written = len(response.model_dump_json())
    estimate = sum(t.num_bytes for t in response_size.completion_terms(
        1, 2000, 0, True, 19, 20))
    assert estimate <= written, (estimate, written)

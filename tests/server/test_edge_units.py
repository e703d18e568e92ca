"""Edge pieces without a server: pending entries freed when registration fails, exceptions
in a stream becoming an error event and [DONE], the 415 rule, derived seeds staying 64-bit."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from radixserve.frontend.async_llm import AsyncLLM
from radixserve.frontend.core_client import EngineCoreClient
from radixserve.messages import AddRequest, EngineCoreRequest
from radixserve.frontend.output_buffer import OutputBuffer
from radixserve.sampling_params import SamplingParams
from radixserve.frontend.http.content_type import unsupported_media_type
from radixserve.frontend.http.asgi_io import SSE_HEADERS, send_stream
from radixserve.frontend.http.errors import sse_error_chunk


class _Tokenizer:
    eos_token_ids = {0}

    def detokenizer(self, prompt_token_ids, skip_special_tokens=True):
        return None


class _Client(EngineCoreClient):
    """The real client's bookkeeping; sends go nowhere; the ``fail_at``-th add raises."""

    def __init__(self, tmp_path, fail_at: int | None = None) -> None:
        super().__init__(f"ipc://{tmp_path}/in", f"ipc://{tmp_path}/out")
        self.fail_at, self.num_adds, self.aborted = fail_at, 0, []

    async def add_request(self, request, queue) -> None:
        self.num_adds += 1
        await super().add_request(request, queue)
        if self.num_adds == self.fail_at:
            raise RuntimeError("injected failure while adding")

    async def abort(self, request_ids) -> None:
        self.aborted += request_ids
        await super().abort(request_ids)

    async def _send(self, data: bytes) -> None:
        pass


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_a_failed_registration_leaves_no_pending_entry(tmp_path, fail_at):
    client = _Client(tmp_path, fail_at)
    engine = AsyncLLM(client, _Tokenizer(), max_model_len=100)

    async def main():
        steps = engine.generate([1, 2, 3], SamplingParams(n=3, seed=7), "req")
        with pytest.raises(RuntimeError, match="injected"):
            async for _ in steps:
                pass

    asyncio.run(main())
    client.close_sockets()
    assert client.queues == {}
    assert sorted(client.aborted) == [f"req-{i}" for i in range(fail_at)]


def test_an_unencodable_request_is_not_registered(tmp_path):
    client = _Client(tmp_path)
    request = EngineCoreRequest(request_id="r", prompt_token_ids=[1],
                                sampling_params=SamplingParams(), priority=2**64)
    with pytest.raises(OverflowError):
        asyncio.run(client.add_request(request, OutputBuffer()))
    client.close_sockets()
    assert client.queues == {}


def test_derived_seeds_stay_64_bit():
    for seed in (2**63 - 1, -(2**63), 12345):
        params = SamplingParams(n=4, seed=seed)
        for i in range(4):
            derived = params.for_sample(i).seed
            assert -(2**63) <= derived < 2**63
            # the sampler reads seeds modulo 2**64: the same samples as the unwrapped seed
            assert (derived - (seed * 1_000_003 + i)) % 2**64 == 0
            msgspec.msgpack.encode(AddRequest(EngineCoreRequest(
                request_id="r", prompt_token_ids=[1], sampling_params=params.for_sample(i))))


def test_an_exception_inside_a_stream_ends_it_with_an_error_event_and_done():
    closed = []

    async def chunks():
        try:
            yield 'data: {"n": 1}\n\n'
            raise RuntimeError("a bug")
        finally:
            closed.append(True)

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():  # a client that stays
        await asyncio.Event().wait()

    done = b"data: [DONE]\n\n"
    asyncio.run(send_stream(chunks(), receive, send, SSE_HEADERS, sse_error_chunk, done, done))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    assert events[0] == '{"n": 1}' and events[-1] == "[DONE]" and len(events) == 3
    error = json.loads(events[1])["error"]
    assert error["type"] == "internal_error" and "RuntimeError: a bug" in error["message"]
    assert sent[-1]["more_body"] is False and closed == [True]


def test_a_client_leaving_mid_stream_closes_the_chunks_and_sends_nothing_more():
    closed, sent = [], []
    left = asyncio.Event()

    async def chunks():
        try:
            yield "data: 1\n\n"
            left.set()
            await asyncio.Event().wait()  # the engine still working when the client goes
            yield "data: never\n\n"
        finally:
            closed.append(True)

    async def send(message):
        sent.append(message)

    async def receive():
        await left.wait()
        return {"type": "http.disconnect"}

    asyncio.run(send_stream(chunks(), receive, send, SSE_HEADERS, sse_error_chunk, b"", None))
    assert closed == [True]
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]


@pytest.mark.parametrize(("method", "content_type", "refused"), [
    ("POST", b"application/json", False),
    ("POST", b"application/json; charset=utf-8", False),
    ("POST", b"Application/JSON;charset=UTF-8", False),
    ("POST", b'application/json; charset="utf8"', False),
    ("POST", None, True),
    ("POST", b"text/plain", True),
    ("POST", b"text/plain; charset=utf-8", True),
    ("POST", b"application/x-www-form-urlencoded", True),
    ("POST", b"multipart/form-data; boundary=x", True),
    ("POST", b"application/json; charset=latin-1", True),
    ("POST", b"application/jsonx", True),
    ("POST", b"", True),
    ("GET", None, False),
    ("GET", b"text/plain", False),
])
def test_post_bodies_must_be_declared_json(method, content_type, refused):
    headers = {} if content_type is None else {b"content-type": content_type}
    error = unsupported_media_type(method, headers)
    assert (error is not None) == refused
    if refused:
        assert error.status == 415 and "application/json" in error.message

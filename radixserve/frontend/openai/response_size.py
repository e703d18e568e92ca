"""A generation response's size, bounded before the request is admitted, and a large whole
body built and encoded off the event loop (issue 62 item 8).

Logprobs multiply: ``echo`` + ``prompt_logprobs: 20`` + ``logprobs: 20`` + ``n: 16`` on a
4,000-token prompt asks for 16 x 4,000 x 42 JSON entries, a 126 MB answer to a 20 kB request.
`check_response_size` estimates the answer from what the request asks for (prompt tokens,
``max_tokens``, ``n``, the logprobs counts) at the bytes an entry takes in our JSON and
refuses it with a 400 naming the factors and their product beyond ``--max-response-mb``.
Entry sizes are those of SmolLM2 responses, rounded down: the estimate refuses what would
surely be too big, never what fits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from radixserve.frontend.http.protocol_base import OpenAIError

MB = 2**20
DEFAULT_MAX_RESPONSE_MB = 32
LARGE_BODY_BYTES = 256 * 1024  # a whole body estimated above this is built on a worker thread

# JSON bytes per entry. NOTE: lower bounds of what we write, so no answer that fits is refused
TEXT_BYTES = 4  # a token's text
PROMPT_LOGPROB_BYTES = 64  # '"1234":{"logprob":-1.2345678,"rank":3,"decoded_token":" the"},'
COMPLETION_TOP_BYTES = 24  # '" the":-1.2345678,' in a completions top_logprobs entry
COMPLETION_TOKEN_BYTES = 32  # a token's tokens, token_logprobs and text_offset entries
CHAT_TOP_BYTES = 56  # '{"token":" the","logprob":-1.2345678,"bytes":[32,116,104,101]},'

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SizeTerm:
    """One part of a response: the product of ``factors`` ((name, value) pairs) entries of
    ``entry_bytes`` each; ``param`` is the request field a refusal names for it."""

    param: str
    factors: tuple[tuple[str, int], ...]
    entry_bytes: int

    @property
    def num_bytes(self) -> int:
        total = self.entry_bytes
        for _, value in self.factors:
            total *= value
        return total

    def describe(self) -> str:
        product = " x ".join(f"{name} {value:,}" for name, value in self.factors)
        return f"{product} x ~{self.entry_bytes} bytes = {self.num_bytes / MB:,.1f} MB"


def completion_terms(n: int, num_prompt_tokens: int, max_tokens: int, echo: bool,
                     logprobs: int | None, prompt_logprobs: int | None,
                     stream: bool = False) -> list[SizeTerm]:
    """A /v1/completions response's parts; ``num_prompt_tokens`` over all its prompts.
    ``stream``: the text is sent as it is made and held nowhere, so only what logprobs
    multiply counts (a long generation is the context's to bound, not this check's)."""
    echoed = num_prompt_tokens if echo else 0
    terms = [] if stream else [SizeTerm("max_tokens", (
        ("n", n), ("tokens (echoed + max_tokens)", echoed + max_tokens)), TEXT_BYTES)]
    if logprobs is not None:
        terms.append(SizeTerm("logprobs", (
            ("n", n), ("tokens (echoed + max_tokens)", echoed + max_tokens),
            ("(logprobs + 1)", logprobs + 1)), COMPLETION_TOP_BYTES))
        terms.append(SizeTerm("logprobs", (
            ("n", n), ("tokens (echoed + max_tokens)", echoed + max_tokens)),
            COMPLETION_TOKEN_BYTES))
    if prompt_logprobs is not None:
        terms.append(SizeTerm("prompt_logprobs", (
            ("n", n), ("prompt tokens", num_prompt_tokens),
            ("(prompt_logprobs + 1)", prompt_logprobs + 1)), PROMPT_LOGPROB_BYTES))
    return terms


def chat_terms(n: int, max_tokens: int, top_logprobs: int | None,
               stream: bool = False) -> list[SizeTerm]:
    """A /v1/chat/completions response's parts (``top_logprobs`` None: no logprobs;
    ``stream`` as `completion_terms`)."""
    terms = [] if stream else [SizeTerm("max_tokens", (("n", n), ("max_tokens", max_tokens)),
                                        TEXT_BYTES)]
    if top_logprobs is not None:
        terms.append(SizeTerm("top_logprobs", (
            ("n", n), ("max_tokens", max_tokens), ("(top_logprobs + 1)", top_logprobs + 1)),
            CHAT_TOP_BYTES))
    return terms


def check_response_size(terms: list[SizeTerm], limit_bytes: int | None) -> int:
    """The response's estimated bytes; 400 naming the largest part's parameter, each
    part's factors and their product when it exceeds ``limit_bytes`` (None: no limit)."""
    total = sum(t.num_bytes for t in terms)
    if limit_bytes is None or total <= limit_bytes:
        return total
    parts = sorted((t for t in terms if t.num_bytes), key=lambda t: -t.num_bytes)
    raise OpenAIError(
        f"This request's response could reach about {total / MB:,.0f} MB ("
        + "; ".join(f"{t.param}: {t.describe()}" for t in parts)
        + f"), more than this server's limit of {limit_bytes / MB:,.0f} MB "
        "(--max-response-mb). Lower n, the logprobs counts, max_tokens or the prompt.",
        param=parts[0].param, code="response_too_large")


async def off_loop_if_large(num_bytes: int, work: Callable[[], T]) -> T:
    """``work()``, on a worker thread when a body of ``num_bytes`` is large (its Python
    steps let the event loop run meanwhile), else inline (a thread hop costs more)."""
    if num_bytes > LARGE_BODY_BYTES:
        return await asyncio.to_thread(work)
    return work()


async def encode_body(response, num_bytes: int) -> bytes:
    """``response``'s JSON (`OpenAIResponse.model_dump_json`), encoded on a worker thread
    when large: its serializer calls back into Python for every response model it dumps,
    so the event loop gets the interpreter between them."""
    return await off_loop_if_large(num_bytes, lambda: response.model_dump_json().encode())

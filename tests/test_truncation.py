"""frontend/truncation.py on its own: the limit a request asks for, which messages go together,
the middle of a chat cut until it fits (renders counted), and a raw prompt's left cut."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.truncation import (Truncation, droppable_units, fit_chat, keep_last,
                                            prompt_limit, say_truncated)


def _msgs(*roles: str) -> list[SimpleNamespace]:
    """Messages by role; "call" is an assistant message with tool calls."""
    return [SimpleNamespace(role="assistant" if r == "call" else r,
                            tool_calls=[{}] if r == "call" else None) for r in roles]


def test_prompt_limit_reads_the_request():
    assert prompt_limit(None, 100, 10) is None  # not asked: no truncation
    assert prompt_limit(40, 100, 10) == 40
    assert prompt_limit(100, 100, None) == 100
    assert prompt_limit(-1, 100, 10) == 90  # the context less the completion
    assert prompt_limit(-1, 100, None) == 99  # the least a completion needs: one token
    assert prompt_limit(-1, 100, 0) == 100  # embeddings: no completion
    with pytest.raises(OpenAIError, match=r"\(101\) is greater .* \(100 tokens\)") as exc:
        prompt_limit(101, 100, 10)
    assert exc.value.param == "truncate_prompt_tokens"
    with pytest.raises(OpenAIError, match="leaves no room") as exc:
        prompt_limit(-1, 100, 100)
    assert exc.value.param == "max_tokens" and exc.value.code == "context_length_exceeded"


def test_units_are_whole_turns_then_calls_with_their_results():
    m = _msgs("system", "user", "assistant", "user", "call", "tool", "tool", "assistant",
              "user", "call", "tool", "call", "tool")
    # turns before the last user message (8); after it, a call with its results; the last
    # unit (11, 12) and the last user message stay, as does the system message
    assert droppable_units(m) == [[1, 2], [3, 4, 5, 6, 7], [9, 10]]


def test_units_keep_system_messages_anywhere_and_orphans_with_their_neighbours():
    m = _msgs("developer", "assistant", "user", "system", "assistant", "user", "tool",
              "assistant")
    # the leading assistant is a unit of its own; the mid-history system message stays; an
    # orphaned tool result right after the last user message is a unit, the answer stays
    assert droppable_units(m) == [[1], [2, 4], [6]]
    assert droppable_units(_msgs("system", "user")) == []
    assert droppable_units(_msgs("call", "tool", "call", "tool")) == [[0, 1]]  # no user


class _Renderer:
    """Renders kept messages as one token per message plus one per 'tools' (always sent)."""

    def __init__(self, sizes: list[int], num_tool_tokens: int = 3) -> None:
        self.sizes, self.num_tool_tokens, self.calls = sizes, num_tool_tokens, []

    def __call__(self, kept: list[int]) -> tuple[str, list[int]]:
        self.calls.append(list(kept))
        ids = [7] * self.num_tool_tokens + [i for i in kept for _ in range(self.sizes[i])]
        return ",".join(map(str, kept)), ids


def test_fit_chat_keeps_what_fits_dropping_the_oldest_units_first():
    m = _msgs("system", "user", "assistant", "user", "call", "tool", "assistant", "user")
    render = _Renderer([5, 10, 10, 10, 4, 4, 10, 5])  # 3 + 58 tokens in all
    text, ids, cut = fit_chat(m, render, limit=35, max_model_len=64)
    # units [1, 2] and [3, 4, 5, 6]: dropping the first leaves 3 + 38 > 35, both: 13
    assert text == "0,7" and len(ids) == 13
    assert cut == Truncation(num_dropped_tokens=61 - 13, num_dropped_messages=6)
    assert render.calls[0] == list(range(8))  # the whole chat first
    assert len(render.calls) <= 4  # the whole, the least, then bisection


def test_fit_chat_stops_as_soon_as_it_fits():
    m = _msgs("system", *["user", "assistant"] * 8, "user")
    render = _Renderer([4] + [2] * 16 + [4])  # 3 + 40 tokens
    text, ids, cut = fit_chat(m, render, limit=40, max_model_len=64)
    assert len(ids) == 39 and cut.num_dropped_messages == 2  # one turn was enough
    assert text.startswith("0,3,4,")  # the system message, then the second turn on
    _, same, none = fit_chat(m, _Renderer([4] + [2] * 16 + [4]), limit=43, max_model_len=64)
    assert none is None and len(same) == 43  # it fits: nothing is cut, one render


def test_fit_chat_refuses_with_the_counts_when_even_the_minimum_does_not_fit():
    m = _msgs("system", "user", "assistant", "user")
    with pytest.raises(OpenAIError) as exc:
        fit_chat(m, _Renderer([30, 5, 5, 30]), limit=50, max_model_len=64)
    error = exc.value
    assert error.status == 400 and error.code == "context_length_exceeded"
    assert error.param == "messages"
    assert "maximum context length is 64 tokens" in error.message
    assert "may use 50" in error.message and "has 73 tokens" in error.message
    assert "still 63 with only the system messages" in error.message


def test_keep_last_cuts_the_start_and_keeps_the_bos():
    assert keep_last([1, 2, 3], 3, [1]) == ([1, 2, 3], None)
    assert keep_last([1, 2, 3, 4, 5], 3, [1]) == ([1, 4, 5], Truncation(2))
    assert keep_last([2, 3, 4, 5], 3, [1]) == ([3, 4, 5], Truncation(1))  # no BOS in front
    assert keep_last([2, 3, 4, 5], 2, []) == ([4, 5], Truncation(2))


def test_total_and_header():
    assert Truncation.total([None, None]) is None
    assert Truncation.total([Truncation(3), None, Truncation(4, 1)]) == Truncation(7, 1)
    headers: list = []
    say_truncated(headers, None)
    say_truncated(headers, Truncation(12, 2))
    assert headers == [(b"x-radixserve-truncated", b"12")]


def test_embedding_inputs_keep_their_last_tokens(tmp_path, caplog):
    from radixserve.frontend.http.prompt_prep import PromptPrep
    from radixserve.frontend.openai.protocol_embedding import EmbeddingRequest
    from radixserve.frontend.openai.serving_embedding import EmbeddingServer
    from radixserve.tokenizer.tokenizer import Tokenizer
    from tiny_models import save_tokenizer

    save_tokenizer(tmp_path)
    tokenizer = Tokenizer.from_hf_dir(tmp_path)
    ctx = SimpleNamespace(tokenizer=tokenizer, max_model_len=16,
                          prep=PromptPrep(tokenizer, 16))
    server = EmbeddingServer(ctx)
    long_ids = list(range(10, 40))
    body = EmbeddingRequest(input=[long_ids, [3, 4]], truncate_prompt_tokens=-1)
    headers: list = []
    with caplog.at_level("INFO", "radixserve.frontend.truncation"):
        ids = asyncio.run(server.token_inputs(body, headers))
    assert ids == [long_ids[-16:], [3, 4]] and headers == [(b"x-radixserve-truncated", b"14")]
    assert "embeddings: prompt truncated to 18 tokens: 14 tokens dropped" in caplog.text
    body = EmbeddingRequest(input="x" * 400, truncate_prompt_tokens=5)
    (one,) = asyncio.run(server.token_inputs(body, []))
    assert len(one) == 5
    with pytest.raises(OpenAIError, match="maximum context length is 16"):
        asyncio.run(server.token_inputs(EmbeddingRequest(input=long_ids), []))
    ctx.prep.close()

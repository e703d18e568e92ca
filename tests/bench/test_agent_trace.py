"""benchmarks/agent_trace.py (issue 59's benchmark): the system prompt sized in the model's
tokens with its tool schemas, the reading of a stream whose answer is text, a tool call or
nothing, the history an agent keeps (tool calls paired with results, cut-off arguments
replaced), and the report's ratios and verdicts against the targets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import agent_trace as at
import agent_trace_client as client
import agent_trace_prompt as prompt
import agent_trace_report as rep

from radixserve.models.default import default_model_path
from radixserve.tokenizer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(default_model_path())


def _rendered(tok: Tokenizer, system: str, tools: list[dict]) -> int:
    text = tok.apply_chat_template([{"role": "system", "content": system}], False, tools=tools)
    return len(tok.encode(text, add_special_tokens=False))


def test_tool_schemas_are_openai_functions_with_unique_names():
    tools = prompt.tool_schemas(40)
    names = [t["function"]["name"] for t in tools]
    assert len(tools) == 40 and len(set(names)) == 40
    assert names[:2] == ["read_file", "write_file"] and "list_issue" in names
    for t in tools:
        assert t["type"] == "function"
        params = t["function"]["parameters"]
        assert params["type"] == "object"
        assert set(params["required"]) <= set(params["properties"])
    with pytest.raises(ValueError, match="at most 56 tools"):
        prompt.tool_schemas(57)


@pytest.mark.parametrize("num_tokens,num_tools", [(1000, 5), (3000, 12)])
def test_system_prompt_reaches_the_asked_size_in_the_models_tokens(tok, num_tokens, num_tools):
    tools = prompt.tool_schemas(num_tools)
    system = prompt.system_prompt(tok, num_tokens, tools, seed=0)
    size = _rendered(tok, system, tools)
    assert num_tokens <= size + 2 < num_tokens + 200  # one section over at most
    assert system == prompt.system_prompt(tok, num_tokens, tools, seed=0)  # deterministic
    assert system != prompt.system_prompt(tok, num_tokens, tools, seed=1)


def _event(delta: dict | None = None, finish: str | None = None, **top) -> dict:
    return {"choices": [{"delta": delta or {}, "finish_reason": finish}], **top}


def test_reply_times_the_first_text_tool_call_or_finish():
    text = client.AgentReply()
    text.read(_event({"role": "assistant", "content": None}), 0.1)  # role chunk: no token
    text.read(_event({"content": "Look"}), 0.4)
    text.read(_event(finish="length"), 0.9)
    assert (text.ttft_s, text.text) == (0.4, "Look")

    call = client.AgentReply()
    call.read(_event({"tool_calls": [{"index": 0, "id": "c", "function": {
        "name": "read_file", "arguments": '{"pa'}}]}), 0.5)
    call.read(_event({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a"}'}}]}),
              0.6)
    call.read(_event(finish="tool_calls", usage={"prompt_tokens": 90, "completion_tokens": 9,
                                                 "prompt_tokens_details": {"cached_tokens": 64}}),
              0.7)
    assert call.ttft_s == 0.5
    assert call.calls == {0: {"name": "read_file", "arguments": '{"path": "a"}'}}
    figures = call.figures()
    assert figures["is_tool_call"] and "calls" not in figures
    assert (figures["prompt_tokens"], figures["cached_tokens"]) == (90, 64)

    empty = client.AgentReply()  # EOS first: the finish chunk's time
    empty.read(_event(finish="stop", timings={"cache_n": 12}), 0.3)
    assert (empty.ttft_s, empty.cached_tokens) == (0.3, 12)


def test_history_pairs_every_tool_call_with_a_result():
    trace = at.Trace(prompt.tool_schemas(3), "sys", 3, 8, [{"role": "system", "content": "sys"}])
    body = trace.body("m", 1)
    assert body["model"] == "m" and body["tools"] == trace.tools and body["stream"]
    assert body["messages"][-1] == {"role": "user", "content": prompt.user_message(1)}
    cut = client.AgentReply()
    cut.read(_event({"tool_calls": [{"index": 0, "function": {"name": "grep_search",
                                                              "arguments": '{"pat'}}]}), 0.2)
    trace.keep(1, cut)  # odd turn: the model's call only, its arguments cut off
    assert trace.history[-2]["tool_calls"][0]["function"] == {"name": "grep_search",
                                                              "arguments": "{}"}
    assert trace.history[-1]["role"] == "tool"
    assert trace.history[-1]["tool_call_id"] == trace.history[-2]["tool_calls"][0]["id"]
    trace.body("m", 2)
    answer = client.AgentReply()
    answer.read(_event({"content": "Check the config."}), 0.2)
    trace.keep(2, answer)  # even turn: the client's own call and its result
    assistant, result = trace.history[-2:]
    assert assistant["content"] == "Check the config."
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_002"]
    assert result["tool_call_id"] == "call_002" and "except Exception" in result["content"]


def _fig(ttft: float, prompt_tokens: int = 1000, cached: int = 0) -> dict:
    return {"ttft_s": ttft, "prompt_tokens": prompt_tokens, "cached_tokens": cached,
            "is_tool_call": False}


def _runs(rs_prompt: int = 1000) -> dict:
    rs = {"ready_s": 3.0, "warmup_ttft_s": None, "turns": [_fig(6.0, rs_prompt), _fig(0.4),
                                                          _fig(1.2)],
          "restart": {"ready_s": 3.5, "warmup_ttft_s": 0.5, "turn": _fig(1.0, cached=990)},
          "reload": {"ready_s": 0.5, "first": _fig(9.0), "load_s": 4.0,
                     "turn": _fig(2.0, cached=990)}}
    ls = {"ready_s": 1.0, "warmup_ttft_s": None, "turns": [_fig(12.0), _fig(2.0), _fig(2.0)],
          "restart": {"ready_s": 1.0, "warmup_ttft_s": None, "turn": _fig(13.0)}}
    return {rep.RS: rs, rep.LS: ls}


def test_report_gives_each_target_its_ratio_and_verdict():
    text = rep.report(_runs(), 3)
    assert "| turn 1 <= 0.6x llama-server | TTFT 6.00 s / 12.00 s | 0.50x | met |" in text
    # turns 2-3: 0.2x and 0.6x -> median 0.4x, worst 0.6x
    assert "median of 2 turns (worst 0.60x; 1 of 2 met) | 0.40x | met |" in text
    assert "| turn 4 after a restart <= 0.25x turn 1 | TTFT 1.00 s / 6.00 s | 0.17x | met |" \
        in text
    assert "| turn 4 after unload + load <= 0.25x turn 1 | TTFT 2.00 s / 6.00 s | 0.33x | " \
        "NOT met |" in text
    assert "| 4 after a restart (ready in 3.5 s, warm-up 0.50 s) | 1.00 | 1000 | 990 | text " \
        "| 0.08x |" in text
    assert "| 4 after unload + load (4.0 s) | 2.00 | 1000 | 990 | text | - |" in text
    assert "its turn 4 after a restart took 13.00 s, 1.08x its turn 1" in text
    assert "WARNING" not in text
    assert "WARNING: turn 1's prompt is 1400 tokens" in rep.report(_runs(1400), 3)


def test_report_of_radixserve_alone_has_only_its_own_targets():
    runs = _runs()
    del runs[rep.LS]
    text = rep.report(runs, 3)
    assert "TTFT / llama-server's" not in text and "turn 1 <= 0.6x" not in text
    assert "turn 4 after a restart <= 0.25x turn 1" in text


def test_warmup_takes_one_tool_and_no_part_of_the_trace(tok):
    tools = prompt.tool_schemas(40)
    body = client.with_model(client.warmup_body(tools), "m")
    assert body["model"] == "m" and body["tools"] == tools[:1] and body["max_tokens"] == 1
    assert client.with_model(client.warmup_body(tools), None).keys() == body.keys() - {"model"}
    system = prompt.system_prompt(tok, 1000, tools[:5], seed=0)
    trace = tok.encode(tok.apply_chat_template([{"role": "system", "content": system}], False,
                                               tools=tools[:5]), add_special_tokens=False)
    warm = tok.encode(tok.apply_chat_template(body["messages"], True, tools=body["tools"]),
                      add_special_tokens=False)
    shared = next(i for i, (a, b) in enumerate(zip(trace, warm)) if a != b)
    assert shared < 16  # less than one KV page (block size 16)

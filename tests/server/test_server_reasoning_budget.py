"""Reasoning budgets through the routes (frontend/reasoning_budget.py → core/reasoning_budget.py).

A real ``radixserve serve`` on a tiny random model whose tokenizer carries Qwen3.5's chat
template (the prompt opens ``<think>``), started with ``--reasoning-parser auto``, a default
``--reasoning-budget 3``, a budget message and ``--reasoning-effort-budgets low=2``. The random
model's text is held to a regex from its first token (``after_reasoning: false``) that lets
the forced end of thinking in, so the reasoning and the answer are known; the logprobs show
where the forced tokens (logprob 0) begin: after exactly the budget's generated tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from server_proc import ServerProc
from tiny_models import make_hf_model
from tokenizers import Tokenizer as HFTokenizer

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.parsers import get_reasoning_parser
from radixserve.frontend.reasoning_budget import BudgetPolicy, parse_effort_budgets
from radixserve.llm import LLM
from radixserve.sampling_params import SamplingParams

QWEN35 = (Path(__file__).parents[1] / "chat_templates" / "Qwen3.5-4B.jinja").read_text()
MESSAGE = " Time is up."
FREE = r"[a-zA-Z .]*</think>Done\."  # any reasoning, closed by the model or by the engine
FIXED = r"Plan\.</think>Done\."  # a reasoning of 4 tokens ("P" "l" "an" ".")
ASK = [{"role": "user", "content": "Hi?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = make_hf_model("qwen2", tmp_path_factory.mktemp("qwen35") / "m", seed=2)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": QWEN35}))
    return path


@pytest.fixture(scope="module")
def server(model):
    s = ServerProc("--model", str(model), "--num-kv-blocks", "64", "--reasoning-parser", "auto",
                   "--reasoning-budget", "3", "--reasoning-budget-message", MESSAGE,
                   "--reasoning-effort-budgets", "low=2", timeout=120)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def num_forced(model) -> int:
    tok = HFTokenizer.from_file(str(model / "tokenizer.json"))
    return sum(len(tok.encode(t, add_special_tokens=False).ids) for t in (MESSAGE, "</think>"))


def chat(server, regex: str | None = FREE, **fields) -> dict:
    body = {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 60, **fields}
    if regex is not None:
        body["structured_outputs"] = {"regex": regex, "after_reasoning": False}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def forced_at(choice: dict, num_forced: int) -> int:
    """Where the forced tokens begin in the output: after the last generated token."""
    entries = choice["logprobs"]["content"]
    text = "".join(e["token"] for e in entries)
    assert text.count(MESSAGE + "</think>") == 1, text
    start = next(i for i in range(len(entries))
                 if "".join(e["token"] for e in entries[i:]).startswith(MESSAGE + "</think>"))
    assert [e["logprob"] for e in entries[start:start + num_forced]] == [0.0] * num_forced
    return start


@pytest.mark.parametrize("budget", [0, 1, 5])
def test_the_reasoning_has_exactly_the_budget(server, num_forced, budget):
    choice = chat(server, thinking_token_budget=budget, logprobs=True)
    assert forced_at(choice, num_forced) == budget
    entries = choice["logprobs"]["content"]
    thought = "".join(e["token"] for e in entries[:budget]) + MESSAGE
    assert choice["message"]["reasoning_content"] == thought.strip()
    assert choice["message"]["content"] == "Done."


def test_the_server_default_and_the_effort_table(server, num_forced):
    assert forced_at(chat(server, logprobs=True), num_forced) == 3  # --reasoning-budget 3
    low = chat(server, reasoning_effort="low", logprobs=True)
    assert forced_at(low, num_forced) == 2  # --reasoning-effort-budgets low=2
    other = chat(server, reasoning_effort="medium", logprobs=True)
    assert forced_at(other, num_forced) == 3  # not in the table: the default
    asked = chat(server, reasoning_effort="low", thinking_token_budget=4, logprobs=True)
    assert forced_at(asked, num_forced) == 4  # the request's own budget first


@pytest.mark.parametrize("budget", [5, 50])
def test_a_budget_larger_than_the_reasoning_changes_nothing(server, budget):
    unlimited = chat(server, FIXED, thinking_token_budget=-1)
    assert chat(server, FIXED, thinking_token_budget=budget) == unlimited
    assert unlimited["message"]["reasoning_content"] == "Plan."
    assert unlimited["message"]["content"] == "Done."


def test_a_closed_block_has_no_budget(server):
    off = chat(server, FIXED, thinking_token_budget=0,
               chat_template_kwargs={"enable_thinking": False})
    assert off["message"].get("reasoning_content") is None
    assert off["message"]["content"] == "Plan.</think>Done."


def test_streamed_like_whole(server):
    body = {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 60, "stream": True,
            "thinking_token_budget": 2,
            "structured_outputs": {"regex": FREE, "after_reasoning": False}}
    reasoning, content = [], []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    reasoning.append(choice["delta"].get("reasoning_content") or "")
                    content.append(choice["delta"].get("content") or "")
    whole = chat(server, thinking_token_budget=2)["message"]
    assert ("".join(reasoning), "".join(content)) == (whole["reasoning_content"], "Done.")
    assert whole["reasoning_content"].endswith(MESSAGE.strip())


@pytest.mark.parametrize("value", [-2, 1.5, "x", True])
def test_bad_budgets_are_refused(server, value):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": ASK, "max_tokens": 2, "thinking_token_budget": value})
    assert r.status_code == 400, r.text
    assert "thinking_token_budget" in r.text


def test_anthropic_budget_tokens_and_ollama_levels(server):
    r = httpx.post(f"{server.url}/v1/messages", timeout=60, json={
        "model": "m", "max_tokens": 30, "messages": ASK, "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 1}})
    assert r.status_code == 200, r.text
    blocks = r.json()["content"]
    assert blocks[0]["type"] == "thinking", blocks
    assert blocks[0]["thinking"].endswith(MESSAGE.strip())
    thoughts = {}
    for think in (True, "low"):  # the server's default (3), Ollama's low (1024)
        r = httpx.post(f"{server.url}/api/chat", timeout=60, json={
            "model": "m", "messages": ASK, "stream": False, "think": think,
            "options": {"num_predict": 30, "temperature": 0}})
        assert r.status_code == 200, r.text
        thoughts[think] = r.json()["message"].get("thinking") or ""
    assert thoughts[True].endswith(MESSAGE.strip())
    assert MESSAGE.strip() not in thoughts["low"] and thoughts["low"]


# ------------------------------------------------------------------ in process


class _Tok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def test_policy_precedence_and_tags():
    policy = BudgetPolicy(7, "!", {"low": 2, "high": -1})
    assert [policy.budget_for(a, e) for a, e in [(5, "low"), (None, "low"), (None, "high"),
                                                  (None, "x"), (None, None), (-1, "low")]] == [
        5, 2, None, 7, 7, None]
    think = get_reasoning_parser("think")
    params = policy.apply(SamplingParams(), None, None, think, "q<think>\n", _Tok())
    tags = params.thinking_tags
    assert params.thinking_token_budget == 7 and tags.forced_token_ids == [ord("!")] + [
        ord(c) for c in "</think>"]
    assert tags.start_token_ids == [ord(c) for c in "<think>"] and not tags.starts_in_reasoning
    closed = SamplingParams()
    assert policy.apply(closed, 3, None, think, "q<think></think>\n", _Tok()) is closed
    assert BudgetPolicy().apply(closed, None, None, think, "q", _Tok()) is closed  # no limit


def test_a_budget_without_reasoning_parser_is_refused():
    with pytest.raises(OpenAIError, match="--reasoning-parser"):
        BudgetPolicy().apply(SamplingParams(), 5, None, None, "q", _Tok())
    params = SamplingParams()
    assert BudgetPolicy(3).apply(params, None, "low", None, "q", _Tok()) is params
    assert BudgetPolicy().apply(params, -1, None, None, "q", _Tok()) is params


def test_effort_budgets_flag():
    assert parse_effort_budgets("default") == {"low": 1024, "medium": 4096, "high": 16384}
    assert parse_effort_budgets("low=5, high=-1") == {"low": 5, "high": -1}
    for bad in ("low", "low=x", "=3", "low=-2"):
        with pytest.raises(ValueError):
            parse_effort_budgets(bad)


def test_harmony_has_no_budget():
    harmony = get_reasoning_parser("harmony")
    with pytest.raises(OpenAIError, match="no start and end tags"):
        BudgetPolicy().apply(SamplingParams(), 5, None, harmony, "q", _Tok())
    params = SamplingParams()
    assert BudgetPolicy(3).apply(params, None, None, harmony, "q", _Tok()) is params


def test_offline_llm_applies_the_budget_with_its_parser(model):
    llm = LLM(str(model), num_kv_blocks=32, block_size=4, show_progress=False,
              reasoning_parser="auto")
    end = llm.tokenizer.encode("</think>", add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=12, thinking_token_budget=2)
    budgeted = llm.chat(ASK, params)[0].outputs[0]
    free = llm.chat(ASK, params.clone(thinking_token_budget=None))[0].outputs[0]
    assert budgeted.token_ids[:2] == free.token_ids[:2]
    assert budgeted.token_ids[2:2 + len(end)] == end != free.token_ids[2:2 + len(end)]
    closed = llm.chat(ASK, params, chat_template_kwargs={"enable_thinking": False})
    assert closed[0].outputs[0].token_ids[2:2 + len(end)] != end  # thinking off: no budget

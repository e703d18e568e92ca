"""Reasoning parsed per request from the rendered prompt, and ``--reasoning-parser auto``.

A real ``radixserve serve`` on a tiny random model whose tokenizer carries Qwen3.5's chat
template, started with ``--reasoning-parser auto``: the template opens ``<think>`` in the prompt
when thinking is on and closes an empty block when ``enable_thinking`` is false, so one server
must read the same output as reasoning then answer in the first case and as all answer in the
second, whole and streamed. The random model's output is fixed by a regex constraint from the
first token (``after_reasoning: false``). Beside it, in process: ``LLM`` with ``auto``, the
start-up resolution (auto, a name, none; logged once) and reasoning tags that are special
tokens (Mistral's ``[THINK]``) decoded as text for the parser.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
from server_proc import ServerProc
from tiny_models import _tokenizer_json, make_hf_model
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from radixserve.frontend.parsers import ReasoningParser, get_reasoning_parser
from radixserve.frontend.parsers.detect import reasoning_parser_for
from radixserve.llm import LLM
from radixserve.sampling_params import SamplingParams
from radixserve.serve import _reasoning_parser
from radixserve.structured.params import StructuredOutputsParams
from radixserve.tokenizer.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parents[1] / "chat_templates"
QWEN35 = (TEMPLATES / "Qwen3.5-4B.jinja").read_text()
MINISTRAL = (TEMPLATES / "mistralai-Ministral-3-14B-Reasoning-2512.jinja").read_text()
OUTPUT = "Plan.</think>Done."  # what every request below makes the model write
ASK = [{"role": "user", "content": "Hi?"}]


@pytest.fixture(scope="module")
def qwen35_model(tmp_path_factory) -> Path:
    """A tiny random model folder whose tokenizer carries Qwen3.5's chat template."""
    path = make_hf_model("qwen2", tmp_path_factory.mktemp("qwen35") / "m", seed=2)
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "chat_template": QWEN35}))
    return path


@pytest.fixture(scope="module")
def server(qwen35_model):
    s = ServerProc("--model", str(qwen35_model), "--num-kv-blocks", "64",
                   "--reasoning-parser", "auto", timeout=120)
    # printed before the server answers /version, so it is already there to read
    s.startup_line = next(line for line in s.proc.stdout if "radixserve: serving" in line)
    yield s
    assert s.stop() == 0


def _body(thinking: bool | None, stream: bool) -> dict:
    body = {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 40,
            "stream": stream, "structured_outputs": {
                "regex": OUTPUT.replace(".", r"\."), "after_reasoning": False}}
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    return body


def _whole(server, thinking: bool | None) -> tuple[str | None, str | None]:
    r = httpx.post(f"{server.url}/v1/chat/completions", json=_body(thinking, False), timeout=60)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    return message.get("reasoning_content"), message["content"]


def _streamed(server, thinking: bool | None) -> tuple[str | None, str | None]:
    reasoning, content = [], []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions",
                      json=_body(thinking, True), timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                reasoning.append(delta.get("reasoning_content") or "")
                content.append(delta.get("content") or "")
    return "".join(reasoning) or None, "".join(content) or None


@pytest.mark.parametrize("read", [_whole, _streamed])
@pytest.mark.parametrize(("thinking", "expected"), [
    (None, ("Plan.", "Done.")),  # the template's default: thinking on, <think> opened
    (True, ("Plan.", "Done.")),
    (False, (None, OUTPUT)),  # <think>\n\n</think> closed in the prompt: all answer
])
def test_the_rendered_prompt_decides_per_request(server, read, thinking, expected):
    assert read(server, thinking) == expected


def test_auto_is_resolved_once_at_start(server):
    """The template's parser, named at start; thinking on and off alternate on it, nothing
    of one request staying behind for the next."""
    assert "reasoning: think; tool calls: qwen3_coder)" in server.startup_line
    assert _whole(server, False) == (None, OUTPUT)
    assert _whole(server, True) == ("Plan.", "Done.")
    assert _streamed(server, False) == (None, OUTPUT)


# ------------------------------------------------------------------ in process


def test_offline_llm_resolves_auto_and_reads_each_prompt(qwen35_model):
    """``LLM(reasoning_parser="auto")``: the template's parser; a constraint waits for its end
    tag where the prompt opened the block, not where it closed it."""
    llm = LLM(str(qwen35_model), num_kv_blocks=32, block_size=4, show_progress=False,
              reasoning_parser="auto")
    assert llm.reasoning_parser == get_reasoning_parser("think")
    sent = []
    add_request = llm.engine.add_request
    llm.engine.add_request = lambda req: (sent.append(req), add_request(req))[1]
    params = SamplingParams(max_tokens=2, structured_outputs=StructuredOutputsParams(
        regex="[0-9]+"))
    llm.chat(ASK, params)
    llm.chat(ASK, params, chat_template_kwargs={"enable_thinking": False})
    on, off = (r.sampling_params.structured_outputs.reasoning_end_token_ids for r in sent)
    assert on == llm.tokenizer.encode("</think>", add_special_tokens=False) != []
    assert off == []
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        LLM(str(qwen35_model), reasoning_parser="nope")


def tokenizer(chat_template: str | None, specials: tuple[str, ...] = ()) -> Tokenizer:
    """The tiny test vocabulary, with `specials` added as special tokens."""
    backend = HFTokenizer.from_str(_tokenizer_json())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    eos = backend.token_to_id("<|im_end|>")
    return Tokenizer(backend, eos_token_id=eos, chat_template=chat_template)


def decoded(tok: Tokenizer, text: str) -> str:
    detok = tok.detokenizer([])
    return detok.step(tok.encode(text, add_special_tokens=False)) + detok.flush()


def test_resolution(caplog: pytest.LogCaptureFixture) -> None:
    qwen = tokenizer(QWEN35)
    with caplog.at_level(logging.INFO, logger="radixserve.serve"):
        name, parser = _reasoning_parser("auto", qwen)
    assert (name, parser) == ("think", get_reasoning_parser("think"))
    assert [r.getMessage() for r in caplog.records] == [
        "reasoning parser: think (from the chat template)"]
    assert reasoning_parser_for("deepseek_r1", qwen)[:2] == (
        "deepseek_r1", get_reasoning_parser("deepseek_r1"))  # a name overrides the template
    assert reasoning_parser_for(None, qwen) == (None, None, "no --reasoning-parser")
    plain = tokenizer("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert reasoning_parser_for("auto", plain)[:2] == (None, None)
    assert reasoning_parser_for("auto", tokenizer(None))[:2] == (None, None)
    with pytest.raises(ValueError, match="supported: deepseek_r1"):
        reasoning_parser_for("nope", qwen)


def test_tags_that_are_special_tokens_reach_the_parser() -> None:
    tok = tokenizer(MINISTRAL, ("[THINK]", "[/THINK]"))
    text = "[THINK]Simple.[/THINK]Hello!<|im_end|>"
    assert decoded(tok, text) == "Simple.Hello!"  # skipped as special tokens
    name, parser, why = reasoning_parser_for("auto", tok)
    assert (name, parser) == ("mistral", ReasoningParser("[THINK]", "[/THINK]"))
    assert why == "from the chat template; special tokens decoded as text: [THINK] [/THINK]"
    output = decoded(tok, text)
    assert output == "[THINK]Simple.[/THINK]Hello!"  # EOS still skipped
    assert parser.extract(output) == ("Simple.", "Hello!")
    assert reasoning_parser_for("think", tokenizer(QWEN35))[2] == "set by --reasoning-parser"


def test_anthropic_and_ollama_switches_are_read_per_request(server):
    """Anthropic's ``thinking`` and Ollama's ``think`` set ``enable_thinking``; the free random
    output (no end tag in it) is all reasoning where the prompt opened the block, all answer
    where it closed it."""
    for thinking, kinds in (("enabled", ["thinking"]), ("disabled", ["text"])):
        r = httpx.post(f"{server.url}/v1/messages", timeout=60, json={
            "model": "m", "max_tokens": 6, "messages": ASK, "temperature": 0,
            "thinking": {"type": thinking}})
        assert r.status_code == 200, r.text
        assert [block["type"] for block in r.json()["content"]] == kinds, r.json()
    for think in (True, False):
        r = httpx.post(f"{server.url}/api/chat", timeout=60, json={
            "model": "m", "messages": ASK, "stream": False, "think": think,
            "options": {"num_predict": 6, "temperature": 0}})
        assert r.status_code == 200, r.text
        message = r.json()["message"]
        assert bool(message.get("thinking")) == think and bool(message["content"]) != think

"""An earlier tool call's arguments reach the chat template as an object, on all four APIs.

OpenAI chat and Responses send the arguments as a JSON string, Anthropic (``tool_use.input``)
and Ollama as an object; each request is converted as its route converts it and rendered by
`render_messages`, with the public templates in tests/chat_templates/. The prompt must hold the
template's own object form (``"arguments": {"city": "Paris"}``), never the string quoted again
(``"arguments": "{\\"city\\": \\"Paris\\"}"``), which the model would then copy
(tests/recorded/ shows Qwen2.5-Coder doing so).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel

from radixserve.frontend.anthropic.protocol import MessagesRequest
from radixserve.frontend.ollama.protocol import OllamaChatRequest
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest
from radixserve.frontend.openai.chat_render import render_messages
from radixserve.frontend.responses.protocol import ResponsesRequest
from radixserve.frontend.responses.serving import chat_messages, chat_request, stored_items
from radixserve.tokenizer.chat_template import render_chat_template
from radixserve.tokenizer.tokenizer import Tokenizer

TEMPLATES = Path(__file__).parent / "chat_templates"
CALL_ID = "abcDEF123"  # Mistral's templates take 9 letters and digits only
ARGS = {"city": "Paris"}
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "description": "City"}},
          "required": ["city"]}
QUESTION = "Weather in Paris?"


def _openai() -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({
        "model": "m", "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city", "parameters": PARAMS}}],
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": CALL_ID, "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
            {"role": "tool", "tool_call_id": CALL_ID, "content": "22 C"}]})


def _responses() -> ChatCompletionRequest:
    body = ResponsesRequest.model_validate({
        "model": "m", "tools": [{"type": "function", "name": "get_weather",
                                 "description": "Weather of a city", "parameters": PARAMS}],
        "input": [
            {"role": "user", "content": QUESTION},
            {"type": "function_call", "call_id": CALL_ID, "name": "get_weather",
             "arguments": json.dumps(ARGS)},
            {"type": "function_call_output", "call_id": CALL_ID, "output": "22 C"}]})
    items = stored_items(body.input_items())
    return chat_request(body, chat_messages(body.instructions, items))


def _anthropic() -> ChatCompletionRequest:
    return MessagesRequest.model_validate({
        "model": "m", "max_tokens": 16, "tools": [{
            "name": "get_weather", "description": "Weather of a city", "input_schema": PARAMS}],
        "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": CALL_ID, "name": "get_weather", "input": ARGS}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": CALL_ID, "content": "22 C"}]}]}).to_chat()


def _ollama(with_result: bool = True) -> ChatCompletionRequest:
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": CALL_ID, "function": {"name": "get_weather", "arguments": ARGS}}]}]
    if with_result:
        messages.append({"role": "tool", "tool_name": "get_weather", "content": "22 C"})
    body = OllamaChatRequest.model_validate({
        "model": "m", "messages": messages, "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city", "parameters": PARAMS}}]})
    return ChatCompletionRequest.model_validate(body.to_openai())


APIS = {"openai": _openai, "responses": _responses, "anthropic": _anthropic, "ollama": _ollama}
# template file -> the object form its calls take (Llama 3 names the arguments "parameters")
EXPECTED = {
    "qwen2_5": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "hermes3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3_1": '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
    "llama3_2": '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
    "mistral_nemo": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
                    f'"id": "{CALL_ID}"}}]</s>',
}


def _context(template: str) -> SimpleNamespace:
    vocab = {"<s>": 0, "</s>": 1, "[UNK]": 2}
    backend = HFTokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer = Tokenizer(backend, bos_token_id=0, eos_token_id=1, chat_template=template)
    return SimpleNamespace(tokenizer=tokenizer)  # all `render_messages` reads


@pytest.mark.parametrize("api", sorted(APIS))
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_history_arguments_render_as_the_templates_object(name: str, api: str) -> None:
    ctx = _context((TEMPLATES / f"{name}.jinja").read_text())
    # NOTE: Ollama's tool messages carry no call id, and Mistral's template demands one on a
    # result: that pair renders the call alone
    body = _ollama(False) if (api, name) == ("ollama", "mistral_nemo") else APIS[api]()
    text = render_messages(ctx, body)
    assert EXPECTED[name] in text, text
    assert '\\"city\\"' not in text and '"{' not in text  # nothing quoted twice
    assert "22 C" in text or (api, name) == ("ollama", "mistral_nemo")


SCHEMA_ONLY = ("{% for m in messages %}{% for c in m.tool_calls or [] %}"
               "{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}")
TEXT_TEMPLATE = (  # DeepSeek V3's way: the arguments concatenated as text
    "{% for m in messages %}{% for c in m.tool_calls or [] %}"
    "{{ 'call ' + c.function.name + '\\n```json\\n' + c.function.arguments + '\\n```' }}"
    "|{{ c.function.arguments }}{% endfor %}{% endfor %}{{ tools | length }}")


def _history(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "f", "arguments": arguments}}]}]


def test_a_template_that_treats_arguments_as_text_gets_the_clients_text() -> None:
    sent = '{"city":"Paris","n":1}'
    text = render_chat_template(TEXT_TEMPLATE, _history(sent), tools=[{"type": "function"}])
    assert text == f"call f\n```json\n{sent}\n```|{sent}1"
    assert render_chat_template(SCHEMA_ONLY, _history(sent)) == '{"city": "Paris", "n": 1}'


@pytest.mark.parametrize("sent, rendered", [
    ("{not json", '"{not json"'),  # kept as the string, as vLLM keeps it
    ("[1, 2]", '"[1, 2]"'),  # JSON, but not an object: kept too
    ("", "{}"),  # no arguments
    ('{"q": "caf\\u00e9 \\"x\\""}', '{"q": "café \\"x\\""}'),
])
def test_arguments_that_are_not_an_object(sent: str, rendered: str) -> None:
    assert render_chat_template(SCHEMA_ONLY, _history(sent)) == rendered


def test_the_callers_messages_are_not_changed() -> None:
    messages = _history('{"a": 1}')
    render_chat_template(SCHEMA_ONLY, messages)
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'


def test_an_argument_named_like_an_attribute_reads_as_the_argument() -> None:
    template = ("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                "{{ c.function.arguments.text }}{% endfor %}{% endfor %}")
    assert render_chat_template(template, _history('{"text": "hello"}')) == "hello"


def test_a_tool_call_without_content_renders_on_templates_that_read_it():
    """OpenAI clients send an assistant tool call with ``content: null``; Qwen3's template reads
    every assistant message's content as text (``'</think>' in message.content``) and fails on
    a missing one, so such a message renders with empty content (llama.cpp does the same); a
    template that handles the missing key renders as before."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "content": "ok", "tool_call_id": "c1"}]
    empty = [history[0], {**history[1], "content": ""}, history[2]]
    qwen3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    out = render_chat_template(qwen3, history, add_generation_prompt=True)
    assert out == render_chat_template(qwen3, empty, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>' in out
    lenient = ("{% for m in messages %}[{{ m.content is defined }}"
               "{% for c in m.tool_calls or [] %} {{ c.function.name }}{% endfor %}]{% endfor %}")
    assert render_chat_template(lenient, history) == "[True][False f][True]"

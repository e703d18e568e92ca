"""Tool-call format detection from chat templates (parsers/detect.py) and its use at start-up."""

from __future__ import annotations

import logging

import pytest
from tiny_models import _tokenizer_json
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from radixserve.frontend.parsers import TOOL_PARSERS
from radixserve.frontend.parsers.detect import detect_tool_format, resolve_tool_format
from radixserve.serve import _tool_parser
from radixserve.tokenizer.tokenizer import Tokenizer

# Short excerpts written for these tests, in the style of each family's template.
TOOLS_HEADER = "{%- if tools %}{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}{%- endif %}"
TEMPLATES = {
    "hermes": TOOLS_HEADER + (
        "Return a json object with function name and arguments within <tool_call></tool_call> "
        "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
        "\n</tool_call>{%- for tool_call in message.tool_calls %}...{%- endfor %}"),
    "qwen3_coder": TOOLS_HEADER + (
        "If you choose to call a function ONLY reply in the following format:\n<tool_call>\n"
        "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
        "</parameter>\n</function>\n</tool_call>"),
    "mistral": (
        "{%- if tools is not none %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]"
        "{%- endif %}{%- if message.tool_calls %}{{- '[TOOL_CALLS] [' }}...{%- endif %}"),
    "llama3_json": TOOLS_HEADER + (
        "Given the following functions, please respond with a JSON for a function call with "
        "its proper arguments that best answers the given prompt.\n\nRespond in the format "
        "{\"name\": function name, \"parameters\": dictionary of argument name and its value}."
        "{%- if builtin_tools %}{{- '<|python_tag|>' }}{%- endif %}"),
    "pythonic": TOOLS_HEADER + (
        "If you decide to invoke any of the function(s), you MUST put it in the format of "
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), "
        "func_name2(params)]"),
    "phi4_mini": TOOLS_HEADER + (
        "To call functions, answer functools[{\"name\": ..., \"arguments\": {...}}]"),
    "deepseek_v3": TOOLS_HEADER + (
        "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
        "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json\\n' + "
        "tool['function']['arguments'] + '\\n```<｜tool▁call▁end｜>'}}"),
}
PLAIN = "{% for message in messages %}<|{{ message.role }}|>{{ message.content }}{% endfor %}"


@pytest.mark.parametrize(("expected", "template"), sorted(TEMPLATES.items()))
def test_each_family(expected: str, template: str) -> None:
    assert detect_tool_format(template) == expected
    assert expected in TOOL_PARSERS


def test_variants() -> None:
    llama32 = TOOLS_HEADER + 'Respond as {"name": function name, "parameters": dictionary of ...}'
    assert detect_tool_format(llama32) == "llama3_json"
    phi4_official = "{% if 'tools' in message %}<|tool|>{{ message['tools'] }}<|/tool|>{% endif %}"
    assert detect_tool_format(phi4_official) == "phi4_mini"
    mistral_v11 = TOOLS_HEADER + "{{- '[TOOL_CALLS]' + tool.function.name + '[ARGS]' }}"
    assert detect_tool_format(mistral_v11) == "mistral"


def test_generic_format_for_templates_without_tools() -> None:
    assert detect_tool_format(PLAIN) == "hermes"
    assert detect_tool_format(None) == "hermes"
    assert detect_tool_format("") == "hermes"
    # markers without reading `tools`: the definitions go in as the generic (Hermes) prompt
    assert detect_tool_format(PLAIN + "[TOOL_CALLS]") == "hermes"
    assert detect_tool_format(TOOLS_HEADER + PLAIN) == "hermes"  # reads tools, names no format


def test_resolve() -> None:
    assert resolve_tool_format("auto", TEMPLATES["mistral"]) == (
        "mistral", "from the chat template")
    assert resolve_tool_format("pythonic", TEMPLATES["mistral"])[0] == "pythonic"
    name, why = resolve_tool_format("auto", PLAIN)
    assert name == "hermes" and "does not render tools" in why


def tokenizer(chat_template: str) -> Tokenizer:
    """The tiny test vocabulary with Mistral's control tokens added as special tokens."""
    backend = HFTokenizer.from_str(_tokenizer_json())
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("[TOOL_CALLS]", "[ARGS]")])
    eos = backend.token_to_id("<|im_end|>")
    return Tokenizer(backend, eos_token_id=eos, chat_template=chat_template)


def decoded(tok: Tokenizer, text: str) -> str:
    detok = tok.detokenizer([])
    return detok.step(tok.encode(text, add_special_tokens=False)) + detok.flush()


def test_server_logs_the_choice_once(caplog: pytest.LogCaptureFixture) -> None:
    tok = tokenizer(TEMPLATES["llama3_json"])
    with caplog.at_level(logging.INFO, logger="radixserve.serve"):
        name, parser = _tool_parser("auto", tok)
    assert name == "llama3_json"
    assert parser.extract('{"name": "f", "parameters": {}}')[1][0].name == "f"
    assert [r.getMessage() for r in caplog.records] == [
        "tool-call format: llama3_json (from the chat template)"]
    assert _tool_parser("hermes", tok)[0] == "hermes"


def test_markers_that_are_special_tokens_reach_the_parser(
        caplog: pytest.LogCaptureFixture) -> None:
    tok = tokenizer(TEMPLATES["mistral"])
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}<|im_end|>'
    assert decoded(tok, text) == 'get_weather{"city": "Paris"}'  # skipped as special tokens
    with caplog.at_level(logging.INFO, logger="radixserve.serve"):
        name, parser = _tool_parser("auto", tok)
    assert name == "mistral"
    assert caplog.records[-1].getMessage() == (
        "special tokens decoded as text for the tool-call parser: [TOOL_CALLS] [ARGS]")
    output = decoded(tok, text)
    assert output == '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'  # EOS still skipped
    _, [call] = parser.extract(output)
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')

"""Rendering Hugging Face chat templates (Jinja2) the way `transformers` does.

The environment mirrors `transformers.utils.chat_template_utils`: a sandboxed, immutable Jinja2
environment with `trim_blocks`/`lstrip_blocks`, loop controls, a `{% generation %}` block that
renders its body unchanged, and the helpers templates on the Hub rely on (`raise_exception`,
`strftime_now`, and a `tojson` filter that does not HTML-escape). An earlier tool call's
arguments reach the template parsed (`ToolArguments`), as `transformers` documents them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.filters
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from radixserve.tokenizer.tool_prompt import adapt_tools

__all__ = ["ChatTemplateError", "RawArguments", "ToolArguments", "compile_chat_template",
           "parse_arguments", "render_chat_template"]

ChatTemplateError = jinja2.exceptions.TemplateError


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body as-is.

    Templates mark assistant output with it so `transformers` can build masks; rendering text only
    needs the tag to parse.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    """Lets a template reject its input: `{{ raise_exception('...') }}`."""
    raise ChatTemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """`json.dumps` with `transformers`' defaults (no ASCII or HTML escaping)."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    """The current local time, formatted with `strftime`."""
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters["items"] = _items
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile `source` once; later calls with the same text return the cached template.

    Raises `jinja2.TemplateSyntaxError` if the template does not parse.
    """
    return _environment().from_string(source)


class ToolArguments(dict):
    """An earlier tool call's arguments, parsed from the JSON text a client sends (OpenAI chat
    and Responses send a string; Anthropic's and Ollama's objects arrive here as their JSON).

    Templates are written for an object (Qwen2.5, Llama 3.x, Mistral: ``arguments | tojson``):
    given the string they quote it again (``"arguments": "{\\"city\\": ...}"``) and the model
    then writes its own calls that way. So this is the object (a dict: ``tojson``, ``items``,
    ``is mapping``), which still reads as the client's text where a template treats it as text
    (``'...' + arguments``, ``{{ arguments }}``, as DeepSeek V3's templates do).
    """

    # NOTE: private, so that ``arguments.text`` in a template still reads a "text" argument
    __slots__ = ("_text",)

    def __init__(self, value: Mapping[str, Any], text: str) -> None:
        super().__init__(value)
        self._text = text

    def __str__(self) -> str:
        return self._text

    def __add__(self, other: object) -> str:
        return self._text + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other: object) -> str:
        return other + self._text if isinstance(other, str) else NotImplemented


class RawArguments(str):
    """An earlier call's arguments text that is not a JSON object (a client replaying a
    malformed call): the text itself to a template, with no arguments to iterate.

    Templates that write each argument (Qwen3.5, Qwen3-Coder, Nemotron 3: ``arguments|items``;
    GLM-4.7, LFM2.5: ``arguments.items()``) fail on text, as Qwen3.5's released template does
    in llama.cpp where arguments arrive as the OpenAI string (ggml-org/llama.cpp#19905). Valid
    arguments reach them as `ToolArguments`; malformed ones render as a call without arguments."""

    __slots__ = ()

    def items(self) -> Iterator[tuple[str, Any]]:
        return iter(())


def _items(value: Any) -> Iterator[tuple[Any, Any]]:
    """Jinja's ``items`` filter, which also takes `RawArguments` (no pairs)."""
    return value.items() if isinstance(value, RawArguments) else jinja2.filters.do_items(value)


def parse_arguments(text: str) -> ToolArguments | RawArguments:
    """A call's arguments text as `ToolArguments`; an empty text is ``{}``. Text that is not a
    JSON object is kept as it is (`RawArguments`: a template renders it; as vLLM, rendering
    does not fail)."""
    if not text.strip():
        return ToolArguments({}, "{}")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return RawArguments(text)
    return ToolArguments(value, text) if isinstance(value, dict) else RawArguments(text)


def _parsed_calls(calls: Any) -> Any:
    """``tool_calls`` with each string ``function.arguments`` parsed (`parse_arguments`)."""
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        return calls
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
            call = {**call, "function": {**fn, "arguments": parse_arguments(fn["arguments"])}}
        out.append(call)
    return out


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain dicts without `None`-valued keys, as `transformers` passes them to templates, with
    the arguments of earlier tool calls parsed (`ToolArguments`).

    APIs such as OpenAI's send `content=None` or `tool_calls=None`; templates handle a missing
    key but often render a literal "None".
    """
    normalized = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be mappings, got {type(message).__name__}")
        message = {key: value for key, value in message.items() if value is not None}
        if "tool_calls" in message:
            message["tool_calls"] = _parsed_calls(message["tool_calls"])
        normalized.append(message)
    return normalized


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = False,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """Render a conversation with the chat template `source`.

    The template sees `messages`, `tools`, `documents`, `add_generation_prompt`, the named special
    tokens (`bos_token`, `eos_token`, ...) and any extra `kwargs`, which take precedence over the
    special tokens. The result equals `transformers`' `apply_chat_template(..., tokenize=False)`,
    except where the template cannot render tools, tool calls or tool results: those go in as
    text in the generic format (`tool_prompt.adapt_tools`); and a call's arguments given as a
    JSON string reach the template as the object (`ToolArguments`), as vLLM passes them.
    Tools must be JSON schemas (mappings), else `TypeError`; `ChatTemplateError` is raised when
    the template calls `raise_exception`.
    """
    if tools is not None and not all(isinstance(tool, Mapping) for tool in tools):
        raise TypeError("tools must be JSON-schema mappings")
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be mappings, got {type(message).__name__}")
    messages, tools = adapt_tools(source, messages, tools)
    context = {**(special_tokens or {}), **kwargs}
    template = compile_chat_template(source)
    normalized = _normalize_messages(messages)
    docs = None if documents is None else [dict(doc) for doc in documents]
    try:
        return template.render(messages=normalized, tools=tools, documents=docs,
                               add_generation_prompt=add_generation_prompt, **context)
    except (jinja2.UndefinedError, TypeError):
        # a template that reads every message's content as text (Qwen3's: `'</think>' in
        # message.content`) fails on a tool-call message without one, which OpenAI clients
        # send (content null): render those with empty content, as llama.cpp does for
        # templates that need it; any other failure is the template's own
        filled = _with_empty_content(normalized)
        if filled is None:
            raise
        return template.render(messages=filled, tools=tools, documents=docs,
                               add_generation_prompt=add_generation_prompt, **context)


def _with_empty_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``messages`` with ``content: ""`` where an assistant message has none; None when
    every message has content (nothing to fill)."""
    if all("content" in m for m in messages):
        return None
    return [m if "content" in m or m.get("role") != "assistant" else {**m, "content": ""}
            for m in messages]

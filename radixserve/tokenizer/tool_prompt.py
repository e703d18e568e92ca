"""Tool calling through chat templates that know nothing of tools: the generic format.

A template that never reads ``tools`` drops the definitions (the model never sees them), one
that never reads ``tool_calls`` drops an assistant's calls from the history, and one with no
``tool`` role may refuse tool results. For such a template the conversation is rewritten
before rendering, so that an agent's loop works on any model (as llama-server's generic format
does, in its own words):

* the tool definitions go into the system message (one is added first when there is none),
  with the instruction to call a tool as ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>``: the Hermes format, which the default tool-call parser reads
  (frontend/parsers/tool_calls.py);
* an assistant message's calls are written into its content in that format, or in the format
  the template shows where that one has a writer here (`template_formats`): LFM2's
  ``<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>``, after the text, as
  LFM2.5's own template writes it. A call whose arguments are not a JSON object is written
  without arguments there (a Python call list has no place for the text);
* tool results become a user message of ``<tool_response>`` blocks (consecutive results in
  one message, so templates that demand alternating roles accept them), in a conversation
  that calls tools (tools given, or calls in it); otherwise the template renders them as it
  does (as `transformers` would). A template that renders ``tool_calls``, or one that shows the
  LFM2 format, is trusted with the tool role, even where it does not name it (LFM2's templates
  render every role alike, and its models are trained on the tool role).

A template that reads each of these renders the conversation as given (a ``content`` of
None then reaches it as an absent key, as in `transformers`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from radixserve.tokenizer.template_formats import reads_tools, template_tool_format

__all__ = ["adapt_tools"]

_TOOL_ROLE = re.compile(r"""['"](tool|ipython)['"]""")

INSTRUCTIONS = (
    "You may call one or more functions to assist with the user query. The functions are "
    "given as JSON schemas within <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, answer with a JSON object holding its name and arguments within "
    "<tool_call></tool_call> tags, one block per call:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>\n'
    "Each result comes back within <tool_response></tool_response> tags.")


def adapt_tools(source: str, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] | None
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the template ``source``: as given where it reads them, else in
    the generic format (the module's rules)."""
    out = [dict(m) for m in messages]
    calling = bool(tools) or any(m.get("tool_calls") for m in out)
    if tools and not reads_tools(source):
        out = _with_definitions(out, tools)
        tools = None
    writer = None  # None: the template writes the calls itself
    if calling and "tool_calls" not in source:
        writer = _WRITERS.get(template_tool_format(source)[0], _hermes_calls)
    if writer is not None:
        for m in out:
            if m.get("role") == "assistant" and m.get("tool_calls"):
                m["content"] = writer(m.get("content") or "", m.pop("tool_calls"))
    if writer is _hermes_calls and not _TOOL_ROLE.search(source):
        out = _results_as_user(out)
    return out, None if tools is None else [dict(t) for t in tools]


def _with_definitions(messages: list[dict], tools: Sequence[Mapping[str, Any]]) -> list[dict]:
    text = INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False)
                                               for t in tools))
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        head = first.get("content") or ""
        if not isinstance(head, str):  # parts: keep them, add the text as one more
            return [{**first, "content": [*head, {"type": "text", "text": text}]},
                    *messages[1:]]
        return [{**first, "content": f"{head}\n\n{text}" if head else text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _arguments(fn: Mapping[str, Any]) -> Any:
    """A call's arguments: parsed when they are a JSON string, else as the client sent them."""
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            pass  # kept as the string the client sent
    return args


def _hermes_calls(content: str, calls: Sequence[Mapping[str, Any]]) -> str:
    blocks = []
    for call in calls:
        fn = call.get("function") or {}
        args = _arguments(fn)
        blocks.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args},
                                                   ensure_ascii=False) + "\n</tool_call>")
    return "\n".join([content, *blocks] if content else blocks)


def _lfm2_calls(content: str, calls: Sequence[Mapping[str, Any]]) -> str:
    """LFM2's call list: each argument as JSON, which `parsers/lfm2.py` reads back."""
    written = []
    for call in calls:
        fn = call.get("function") or {}
        args = _arguments(fn)
        pairs = args.items() if isinstance(args, Mapping) else ()
        written.append(f"{fn.get('name')}(" + ", ".join(
            f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in pairs) + ")")
    return f"{content}<|tool_call_start|>[{', '.join(written)}]<|tool_call_end|>"


_WRITERS: dict[str, Callable[[str, Sequence[Mapping[str, Any]]], str]] = {
    "lfm2": _lfm2_calls}
"""Format name (`template_formats`) -> the writer of an assistant's earlier calls in it, for
templates that show the format but cannot write calls; any other format: `_hermes_calls`."""


def _results_as_user(messages: list[dict]) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if m.get("role") != "tool":
            out.append(m)
            continue
        content = m.get("content") or ""
        if not isinstance(content, str):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        block = f"<tool_response>\n{content}\n</tool_response>"
        if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
            out[-1]["content"] += "\n" + block
        else:
            out.append({"role": "user", "content": block, "_tool_results": True})
    for m in out:
        m.pop("_tool_results", None)
    return out

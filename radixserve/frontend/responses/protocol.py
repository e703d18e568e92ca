"""OpenAI Responses API request models (``POST /v1/responses``) and their mapping to a chat
request, so generation runs the chat endpoint's path (template, SamplingParams, parsers).

A request's conversation is: the ``instructions`` (a system message, not carried over by
``previous_response_id``, as OpenAI documents), then the stored chain's items (each earlier
response's input and output), then this request's ``input``. Input items map to chat messages:
a message to a message (text parts joined), consecutive ``function_call`` items to one assistant
message's ``tool_calls``, a ``function_call_output`` to a ``tool`` message; reasoning items are
accepted and left out of the prompt (chat templates drop earlier turns' reasoning too).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (Discriminator, Field, Tag, ValidationError, field_validator,
                      model_validator)

from radixserve.frontend.http.protocol_base import OpenAIRequest
from radixserve.frontend.openai.protocol import random_id
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest

MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512

# ----------------------------------------------------------------------------- input items


class TextPart(OpenAIRequest):
    """``input_text`` (user, system, developer) or ``output_text`` (assistant, echoed back)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # echoed output_text fields
    logprobs: list[Any] | None = None


class MessageItem(OpenAIRequest):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value):
        for part in value if isinstance(value, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("input_text", "output_text"):
                raise ValueError(f"only text content is supported (input_text, output_text), "
                                 f"got a {kind!r} content part")
        return value

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class FunctionCallItem(OpenAIRequest):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(OpenAIRequest):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "\n".join(part.text for part in self.output)


class ReasoningItem(OpenAIRequest):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: str | None = None


_ITEM_TAGS = {"message": "MessageItem", "function_call": "FunctionCallItem",
              "function_call_output": "FunctionCallOutputItem", "reasoning": "ReasoningItem"}


def _item_kind(value) -> str | None:
    """The item's model: by ``type``; an easy message ({"role", "content"}) has none. Tags are
    class names, which error locations leave out (``input.0.content``, not ``...message...``)."""
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(
        value, "type", None)
    return _ITEM_TAGS.get(kind)


InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")]
    | Annotated[ReasoningItem, Tag("ReasoningItem")],
    Discriminator(_item_kind, custom_error_type="invalid_item",
                  custom_error_message="an input item's type is one of message, function_call, "
                                       "function_call_output, reasoning"),
]

# ----------------------------------------------------------------------------- request


class FunctionTool(OpenAIRequest):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(OpenAIRequest):
    type: Literal["function"]
    name: str


class TextFormat(OpenAIRequest):
    """``{"type": "text" | "json_object"}`` or ``{"type": "json_schema", "name", "schema"}``."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("text.format of type 'json_schema' needs a 'schema'")
        return self


class TextConfig(OpenAIRequest):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, no effect


class ReasoningConfig(OpenAIRequest):
    effort: str | None = None  # passed to the chat template as reasoning_effort
    summary: str | None = None  # accepted; the reasoning item carries the full text


class ResponsesRequest(OpenAIRequest):
    """``POST /v1/responses``; unknown fields are errors naming them. ``top_k``, ``seed``,
    ``ignore_eos`` and ``priority`` are vLLM-style extensions."""

    model: str | None = None
    input: Annotated[Annotated[str, Tag("str")] | Annotated[list[InputItem], Tag("list")],
                     Discriminator(lambda v: "str" if isinstance(v, str) else "list")]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = True
    stream: bool | None = False
    previous_response_id: str | None = None
    truncation: Literal["disabled"] | None = None
    include: list[str] | None = None  # accepted; nothing extra to include
    background: Literal[False] | None = None
    user: str | None = None  # accepted and ignored, as the next four
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    top_logprobs: Literal[0] | None = None
    top_k: int | None = None
    seed: int | None = None
    ignore_eos: bool = False
    priority: int = 0

    @field_validator("input")
    @classmethod
    def _input_not_empty(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("input must be a string or a non-empty list of items")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value):
        if value is None:
            return value
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"metadata has at most {MAX_METADATA_PAIRS} pairs, got {len(value)}")
        for key, text in value.items():
            if len(key) > MAX_METADATA_KEY or len(text) > MAX_METADATA_VALUE:
                raise ValueError(f"metadata keys are at most {MAX_METADATA_KEY} characters and "
                                 f"values at most {MAX_METADATA_VALUE}")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice_in_tools(cls, value, info):
        names = [tool.name for tool in info.data.get("tools") or ()]
        if value == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        if isinstance(value, FunctionChoice) and value.name not in names:
            raise ValueError(f"tool_choice names {value.name!r}, which is not in tools")
        return value

    def input_items(self) -> list:
        """The input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def format(self) -> TextFormat:
        return (self.text and self.text.format) or TextFormat(type="text")


# ----------------------------------------------------------------------------- to chat


def stored_items(items: list) -> list[dict]:
    """Input items as stored and listed by ``input_items``: dicts with an id and a status."""
    out = []
    for item in items:
        d = item.model_dump(exclude_none=True, by_alias=True)
        if isinstance(item, MessageItem):
            d["content"] = ([{"type": "input_text" if item.role != "assistant" else
                              "output_text", "text": item.content}]
                            if isinstance(item.content, str) else d["content"])
            prefix = "msg_"
        else:
            prefix = {"function_call": "fc_", "function_call_output": "fco_",
                      "reasoning": "rs_"}[item.type]
        d.setdefault("id", random_id(prefix))
        d.setdefault("status", "completed")
        out.append(d)
    return out


def chat_messages(instructions: str | None, items: list[dict]) -> list[dict]:
    """Chat messages of a conversation given as stored item dicts (see the module docstring)."""
    messages: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _text(item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                # "" not None: templates without tool support index message.content
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text(item["output"])})
    return messages


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content)


def chat_request(body: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat request that generates this response (never streamed: the caller streams)."""
    fmt = body.format()
    fields: dict[str, Any] = {
        "model": body.model, "messages": messages, "max_completion_tokens":
        body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "top_k": body.top_k, "seed": body.seed, "ignore_eos": body.ignore_eos,
        "priority": body.priority, "parallel_tool_calls": body.parallel_tool_calls,
        "reasoning_effort": body.reasoning and body.reasoning.effort,
    }
    if body.tools:
        fields["tools"] = [{"type": "function", "function": t.model_dump(
            exclude_none=True, exclude={"type"})} for t in body.tools]
    if isinstance(body.tool_choice, FunctionChoice):
        fields["tool_choice"] = {"type": "function", "function": {"name": body.tool_choice.name}}
    elif body.tool_choice is not None:
        fields["tool_choice"] = body.tool_choice
    if fmt.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif fmt.type == "json_schema":
        fields["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name, "description": fmt.description, "schema": fmt.schema_,
            "strict": fmt.strict}}
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # e.g. a tool message without its call: the input is bad
        from radixserve.frontend.http.protocol_base import OpenAIError

        first = exc.errors()[0]
        raise OpenAIError(f"the conversation is not valid: {first['msg']}",
                          param="input") from None


def format_param(body: ResponsesRequest) -> str:
    """The field a structured-output error is about."""
    return "text.format" if body.format().type != "text" else "tool_choice"

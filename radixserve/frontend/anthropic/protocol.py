"""Anthropic Messages API request models (``POST /v1/messages``, ``/v1/messages/count_tokens``)
and their mapping onto a `ChatCompletionRequest`, so a Messages request runs through the chat
pipeline (template, tool-call and reasoning parsers, structured output) unchanged.

Requests forbid unknown top-level fields, as the OpenAI models do (an unsupported parameter is
refused by name); content blocks and tools ignore fields they do not use (``cache_control``:
the prefix cache is automatic; ``citations``, ``caller``...), so a client may send back the
blocks it received as they are. Content blocks are ``text``, ``image`` (user messages and
tool results; a ``base64`` or ``url`` source), ``tool_use``, ``tool_result``, ``thinking`` and
``redacted_thinking``; a ``document`` block is refused in plain words, any other block type by
name. An image to a model that takes text only is refused when the request is served.

How a conversation becomes chat messages:

* ``system`` (a string or text blocks) is one system message;
* a user message's ``tool_result`` blocks become ``tool`` messages (``tool_call_id`` set), in
  order, followed by a user message with its text and image blocks, if any, as chat parts
  (``image_url``: a base64 source as a data URI); chat takes images in user messages only, so a
  tool result's images open that user message;
* an assistant message's text, ``tool_use`` blocks (``tool_calls`` with ``input`` as JSON
  arguments) and ``thinking`` (``reasoning_content``) become one assistant message.

``tool_choice``: ``auto`` → ``"auto"``, ``any`` → ``"required"``, ``tool`` → the named
function, ``none`` → ``"none"``; ``disable_parallel_tool_use`` → ``parallel_tool_calls=False``.
``thinking`` sets the template's ``enable_thinking``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from radixserve.frontend.media.chat import data_uri
from radixserve.frontend.openai.protocol_chat import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    Tool,
    ToolCall,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Block(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class Base64Source(_Block):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class URLSource(_Block):
    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(_Block):
    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]

    @model_validator(mode="before")
    @classmethod
    def _known_source(cls, data: Any) -> Any:
        kind = data.get("source", {}).get("type") if isinstance(data, dict) else None
        if isinstance(kind, str) and kind not in ("base64", "url"):
            raise ValueError(f"image source type {kind!r} is not supported (base64, url)")
        return data

    def chat_part(self) -> dict:
        """The chat request's ``image_url`` part for this image."""
        source = self.source
        url = (data_uri(source.data, source.media_type) if source.type == "base64"
               else source.url)
        return {"type": "image_url", "image_url": {"url": url}}


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] | None \
        = None
    is_error: bool | None = None

    def text(self) -> str:
        """The result's text as one string; an error result is marked as such for the model.
        Its images are `images`."""
        if isinstance(self.content, list):
            text = "\n".join(block.text for block in self.content if block.type == "text")
        else:
            text = self.content or ""
        return f"Error: {text}" if self.is_error else text

    def images(self) -> list[ImageBlock]:
        return [b for b in self.content if b.type == "image"] \
            if isinstance(self.content, list) else []


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]


def _has_documents(content: Any) -> bool:
    """Whether raw ``content`` holds a document block, tool results' included."""
    return any(isinstance(block, dict) and (
        block.get("type") == "document"
        or block.get("type") == "tool_result" and _has_documents(block.get("content")))
        for block in (content if isinstance(content, list) else ()))


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    @model_validator(mode="before")
    @classmethod
    def _no_documents(cls, data: Any) -> Any:
        # NOTE: before validation: else the content union reports every block type it expected
        if isinstance(data, dict) and _has_documents(data.get("content")):
            raise ValueError("document content is not supported by this server (text and "
                             "image blocks are)")
        return data

    @model_validator(mode="after")
    def _blocks_fit_role(self) -> Message:
        allowed = ({"text", "image", "tool_result"} if self.role == "user"
                   else {"text", "tool_use", "thinking", "redacted_thinking"})
        for block in self.content if isinstance(self.content, list) else ():
            if block.type not in allowed:
                raise ValueError(f"{self.role} messages may not hold {block.type} blocks "
                                 f"(allowed: {', '.join(sorted(allowed))})")
        return self

    def chat_messages(self) -> list[ChatMessage]:
        """This message as chat messages (see the module docstring)."""
        if isinstance(self.content, str):
            return [ChatMessage(role=self.role, content=self.content)]
        texts = [b.text for b in self.content if b.type == "text"]
        if self.role == "user":
            results = [b for b in self.content if b.type == "tool_result"]
            out = [ChatMessage(role="tool", content=b.text(), tool_call_id=b.tool_use_id)
                   for b in results]
            images = [image for b in results for image in b.images()]
            parts = [b.chat_part() if b.type == "image" else {"type": "text", "text": b.text}
                     for b in self.content if b.type in ("text", "image")]
            if images or any(part["type"] == "image_url" for part in parts):
                out.append(ChatMessage(role="user", content=[
                    *(image.chat_part() for image in images), *parts]))
            elif texts or not out:
                out.append(ChatMessage(role="user", content="\n".join(texts)))
            return out
        calls = [ToolCall(id=b.id, function=FunctionCall(
                     name=b.name, arguments=json.dumps(b.input, ensure_ascii=False)))
                 for b in self.content if b.type == "tool_use"]
        thinking = "".join(b.thinking for b in self.content if b.type == "thinking")
        # NOTE: content "" (not None) without text: simple templates concatenate it
        return [ChatMessage(role="assistant", content="\n".join(texts),
                            tool_calls=calls or None, reasoning_content=thinking or None)]


class ToolDefinition(_Block):
    """A client tool; Anthropic's server tools (web search, bash...) are not served here."""

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_iff_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice needs a 'name' exactly when its type is 'tool'")
        return self


class ThinkingConfig(_Strict):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(None, ge=1)


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Strict):
    """``format`` constrains the text to a JSON schema (the structured-output path);
    ``effort`` goes to the chat template as ``reasoning_effort``."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(_Strict):
    user_id: str | None = None


class CountTokensRequest(_Strict):
    """``POST /v1/messages/count_tokens``: the prompt part of a Messages request."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None  # accepted: the prefix cache is automatic

    @model_validator(mode="after")
    def _choice_names_a_tool(self):
        choice, names = self.tool_choice, [t.name for t in self.tools or ()]
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise ValueError(f"tool_choice of type '{choice.type}' needs tools")
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not in tools")
        return self

    def to_chat(self) -> ChatCompletionRequest:
        """The equivalent chat request."""
        messages: list[ChatMessage] = []
        if self.system:
            system = (self.system if isinstance(self.system, str)
                      else "\n".join(b.text for b in self.system))
            messages.append(ChatMessage(role="system", content=system))
        for m in self.messages:
            messages += m.chat_messages()
        tools = [Tool(function=FunctionDefinition(name=t.name, description=t.description,
                                                  parameters=t.input_schema))
                 for t in self.tools] if self.tools else None
        choice = self.tool_choice
        kwargs = ({"enable_thinking": self.thinking.type == "enabled"}
                  if self.thinking is not None else None)
        output = self.output_config or OutputConfig()
        response_format = None
        if output.format is not None:
            response_format = {"type": "json_schema",
                               "json_schema": {"name": "output", "schema": output.format.schema_}}
        return ChatCompletionRequest(
            model=self.model, messages=messages, tools=tools,
            tool_choice=_chat_tool_choice(choice) if tools else None,
            parallel_tool_calls=not (choice and choice.disable_parallel_tool_use),
            chat_template_kwargs=kwargs, reasoning_effort=output.effort,
            thinking_token_budget=(self.thinking.budget_tokens if self.thinking is not None
                                   and self.thinking.type == "enabled" else None),
            response_format=response_format, **self._sampling())

    def _sampling(self) -> dict[str, Any]:
        """The chat request's sampling fields (none for counting tokens)."""
        return {}


def _chat_tool_choice(choice: ToolChoice | None):
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "tool":
        return NamedToolChoice(function=NamedFunction(name=choice.name))
    return {"any": "required", "none": "none"}[choice.type]


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # accepted, one tier here
    ignore_eos: bool = False  # radixserve's extension (as vLLM's on chat): for benchmarks
    # llama-server's option: prompt progress in `ping` events while streaming (serving.py)
    return_progress: StrictBool = False

    def _sampling(self) -> dict[str, Any]:
        return dict(max_tokens=self.max_tokens, stop=list(self.stop_sequences or []),
                    temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                    user=self.metadata.user_id if self.metadata else None, stream=self.stream,
                    ignore_eos=self.ignore_eos, return_progress=self.return_progress)


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorBody(BaseModel):
    """Anthropic's error body (`serving.anthropic_error_body`), as /openapi.json describes it."""

    type: Literal["error"]
    error: AnthropicErrorDetail

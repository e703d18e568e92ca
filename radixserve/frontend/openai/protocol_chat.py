"""OpenAI chat-completion and vLLM tokenize/detokenize models (see `protocol` for conventions)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (ConfigDict, Field, NonNegativeInt, RootModel, ValidationInfo,
                      field_validator, model_validator)

from radixserve.frontend.http.protocol_base import OpenAIRequest, OpenAIResponse
from radixserve.frontend.openai.protocol import (MAX_OPENAI_LOGPROBS, SamplingRequest, UsageInfo,
                                                 or_default, random_id, unix_now)

# ----------------------------------------------------------------------------- messages and tools


class TextContentPart(OpenAIRequest):
    type: Literal["text"]
    text: str


class ImageURL(OpenAIRequest):
    """Where an image is: a ``data:image/...;base64,`` URI, or a ``file://`` / http(s) URL
    where the server allows them (frontend/media/policy.py). ``detail`` is accepted; the
    model's processor decides the resolution."""

    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class ImageContentPart(OpenAIRequest):
    type: Literal["image_url"]
    image_url: ImageURL

    @field_validator("image_url", mode="before")
    @classmethod
    def _bare_url(cls, value):
        return {"url": value} if isinstance(value, str) else value  # vLLM takes a bare URL


ContentPart = Annotated[TextContentPart | ImageContentPart, Field(discriminator="type")]
CONTENT_PART_TYPES = ("text", "image_url")


class FunctionCall(OpenAIRequest):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(OpenAIRequest):
    """A tool call of an assistant message (in requests and responses)."""

    id: str = Field(default_factory=lambda: random_id("chatcmpl-tool-"))
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIRequest):
    """One message; content is a string or a list of text and (user messages only) image
    parts; other part types are rejected by name."""

    # NOTE: _check_role's rule, for /openapi.json: content and no tool_calls unless assistant
    model_config = ConfigDict(json_schema_extra={
        "if": {"properties": {"role": {"const": "assistant"}}},
        "else": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}},
                                                         "tool_calls": {"type": "null"}}}})
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant only
    tool_call_id: str | None = None  # tool messages: the call this answers
    reasoning_content: str | None = None  # assistant, echoed back by clients

    @field_validator("content", mode="before")
    @classmethod
    def _known_parts(cls, value):
        # NOTE: before validation: else the union reports every part type it expected
        for part in value if isinstance(value, list) else ():
            kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
            if kind not in CONTENT_PART_TYPES:
                raise ValueError(f"unsupported content part type {kind!r} (supported: text, "
                                 "image_url)")
            if kind == "text" and isinstance(part, dict) and not isinstance(part.get("text"),
                                                                             str):
                raise ValueError("a text content part needs a 'text' string")
        return value

    @model_validator(mode="after")
    def _check_role(self) -> ChatMessage:
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"only assistant messages may have tool_calls, not {self.role}")
        if self.content is None and self.role != "assistant":
            raise ValueError(f"{self.role} messages must have content")
        if self.role != "user" and self.images():
            raise ValueError(f"images are only accepted in user messages, not in "
                             f"{self.role} messages")
        return self

    def text(self) -> str | None:
        """The content as one string: text parts joined by newlines (as vLLM does); image
        parts are left out (`images`)."""
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content if part.type == "text")
        return self.content

    def images(self) -> list[ImageContentPart]:
        """The image parts, in order."""
        if isinstance(self.content, list):
            return [part for part in self.content if part.type == "image_url"]
        return []


class FunctionDefinition(OpenAIRequest):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON schema
    strict: bool | None = None


class Tool(OpenAIRequest):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIRequest):
    name: str


class NamedToolChoice(OpenAIRequest):
    type: Literal["function"] = "function"
    function: NamedFunction


# ----------------------------------------------------------------------------- requests


@classmethod
def _continue_or_generate(cls, value, info: ValidationInfo):
    """``continue_final_message`` validator of the requests that render a chat template."""
    if value and info.data.get("add_generation_prompt"):
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    return value


# `_continue_or_generate` for /openapi.json: add_generation_prompt (default true) false
_CONTINUE_RULE = {"if": {"required": ["continue_final_message"],
                         "properties": {"continue_final_message": {"const": True}}},
                  "then": {"required": ["add_generation_prompt"],
                           "properties": {"add_generation_prompt": {"const": False}}}}


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` wins over ``max_tokens``."""

    model_config = ConfigDict(json_schema_extra=_CONTINUE_RULE)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # deprecated by OpenAI; None: the server's default
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_OPENAI_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None  # passed through to the chat template
    # the most reasoning tokens (vLLM's name; -1: no limit): frontend/reasoning_budget.py
    thinking_token_budget: int | None = Field(None, ge=-1)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_needs_tools(cls, value, info: ValidationInfo):
        names = [tool.function.name for tool in info.data.get("tools") or ()]
        if value == "required" and not names:
            raise ValueError("tool_choice 'required' needs tools")
        if isinstance(value, NamedToolChoice) and value.function.name not in names:
            raise ValueError(f"tool_choice names {value.function.name!r}, which is not in tools")
        return value

    _not_both = field_validator("continue_final_message")(_continue_or_generate)

    def requested_max_tokens(self) -> int | None:
        return or_default(self.max_completion_tokens, self.max_tokens)

    def requested_logprobs(self) -> tuple[int | None, str]:
        return (or_default(self.top_logprobs, 0) if self.logprobs else None), "top_logprobs"


class TokenizeRequest(OpenAIRequest):
    """``POST /tokenize``: either ``prompt`` or chat ``messages`` (rendered with the template).

    ``add_special_tokens`` defaults to true for a prompt and false for messages (the template
    adds them), as in vLLM; see `effective_add_special_tokens`.
    """

    # NOTE: _one_form's rule, for /openapi.json
    model_config = ConfigDict(json_schema_extra={**_CONTINUE_RULE, "oneOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]})
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool | None = False

    _not_both = field_validator("continue_final_message")(_continue_or_generate)

    @model_validator(mode="after")
    def _one_form(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt or messages must be given")
        return self

    @property
    def effective_add_special_tokens(self) -> bool:
        return or_default(self.add_special_tokens, self.messages is None)


class DetokenizeRequest(OpenAIRequest):
    """``POST /detokenize``."""

    model: str | None = None
    tokens: list[NonNegativeInt]


# ----------------------------------------------------------------------------- responses


class ChatCompletionMessage(OpenAIResponse):
    _keep_none = frozenset({"content"})
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatTopLogprob(OpenAIResponse):
    _keep_none = frozenset({"bytes"})
    token: str
    logprob: float
    bytes: list[int] | None = None  # UTF-8 bytes of the token


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogprobs(OpenAIResponse):
    _keep_none = frozenset({"content"})
    content: list[ChatTokenLogprob] | None = None


class ChatCompletionChoice(OpenAIResponse):
    _keep_none = frozenset({"logprobs", "finish_reason", "stop_reason"})
    index: int
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM extension


class ChatCompletionResponse(OpenAIResponse):
    id: str = Field(default_factory=lambda: random_id("chatcmpl-"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=unix_now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo | None = None


class DeltaFunctionCall(OpenAIResponse):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(OpenAIResponse):
    """A piece of a streamed tool call; ``id``/``type``/``name`` come in its first piece."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(OpenAIResponse):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionStreamChoice(OpenAIResponse):
    _keep_none = frozenset({"logprobs", "finish_reason"})
    index: int
    delta: DeltaMessage = Field(default_factory=DeltaMessage)
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(OpenAIResponse):
    """A ``chat.completion.chunk``; ``usage`` only in the final usage chunk (else omitted)."""

    id: str = Field(default_factory=lambda: random_id("chatcmpl-"))
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=unix_now)
    model: str
    choices: list[ChatCompletionStreamChoice] = Field(default_factory=list)
    usage: UsageInfo | None = None


class TokenizeResponse(OpenAIResponse):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(OpenAIResponse):
    prompt: str


class RenderResponse(OpenAIResponse):
    """``POST /v1/chat/completions/render``: the rendered template and its token ids (also
    as vLLM's ``token_ids``, which routers read; ``/v1/completions/render``: a list of
    these, one per prompt)."""

    model: str
    token_ids: list[int]
    prompt: str
    prompt_token_ids: list[int]
    count: int


class RenderList(RootModel[list[RenderResponse]]):
    """``POST /v1/completions/render``: one `RenderResponse` per prompt."""

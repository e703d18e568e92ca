"""OpenAI Responses API request models: ``POST /v1/responses`` (its mapping to a chat request
is `serving.chat_request`) and the query of the stored responses' input items."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, Discriminator, Field, Tag, field_validator,
                      model_validator)

from radixserve.frontend.http.protocol_base import OpenAIRequest

MAX_LIST_LIMIT = 100  # input items per page

MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512

# ----------------------------------------------------------------------------- input items


class TextPart(OpenAIRequest):
    """``input_text`` (user, system, developer) or ``output_text`` (assistant, echoed back)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # echoed output_text fields
    logprobs: list[Any] | None = None


class ImagePart(OpenAIRequest):
    """``input_image``: ``image_url`` a data URI, or a URL the server may read
    (frontend/media/policy.py); uploaded files (``file_id``) are not served here."""

    type: Literal["input_image"]
    image_url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_file_id(cls, data):
        if isinstance(data, dict) and "file_id" in data:
            raise ValueError("input_image file_id is not supported (no Files API here): "
                             "send image_url, a data: URI")
        return data


_PART_TYPES = ("input_text", "output_text", "input_image")


class MessageItem(OpenAIRequest):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]]
    id: str | None = None
    status: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _known_parts(cls, value):
        for part in value if isinstance(value, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _PART_TYPES:
                raise ValueError(f"unsupported content part type {kind!r} (supported: "
                                 f"{', '.join(_PART_TYPES)})")
        return value

    @model_validator(mode="after")
    def _images_from_user(self):
        if self.role != "user" and isinstance(self.content, list) and any(
                part.type == "input_image" for part in self.content):
            raise ValueError(f"input_image is only accepted in user messages, not in "
                             f"{self.role} messages")
        return self

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content if part.type != "input_image")


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
    return _ITEM_TAGS.get(kind) if isinstance(kind, str) else None  # {"type": {}}: no tag


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


def _false_only(value):
    """``background`` is false or absent: a Literal[False] alone would take 0 too."""
    if value is not False:
        raise ValueError("background responses are not supported: background must be false")
    return value


class ResponsesRequest(OpenAIRequest):
    """``POST /v1/responses``; unknown fields are errors naming them. ``top_k``, ``seed``,
    ``ignore_eos`` and ``priority`` are vLLM-style extensions."""

    model: str | None = None
    input: Annotated[Annotated[str, Tag("str")]
                     | Annotated[list[InputItem], Field(min_length=1), Tag("list")],
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
    # "auto": the oldest turns go when the input does not fit (frontend/truncation.py)
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None  # accepted; nothing extra to include
    background: Annotated[Literal[False], BeforeValidator(_false_only)] | None = None
    user: str | None = None  # accepted and ignored, as the next four
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=0)] | None = None  # a Literal[0] takes false
    top_k: int | None = None
    seed: int | None = None
    ignore_eos: bool = False
    priority: int = 0
    return_progress: bool = False  # llama-server's: streamed prompt progress (serving.py)

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


class InputItemsQuery(BaseModel):
    """The query of ``GET /v1/responses/{id}/input_items``: OpenAI's list, newest first by
    default, ``after`` an item id."""

    limit: int = Field(20, ge=1, le=MAX_LIST_LIMIT)
    order: Literal["asc", "desc"] = "desc"
    after: str | None = None

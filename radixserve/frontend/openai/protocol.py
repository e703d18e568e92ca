"""OpenAI API models as vLLM serves them: completions, models, errors, and their helpers.

Chat completions and tokenize/detokenize live in `protocol_chat`; their names are also importable
from here (lazily, since `protocol_chat` builds on this module).

Requests forbid unknown fields, are parsed strictly and refuse non-finite floats (see
`protocol_base`); integers that reach the engine unchecked by `SamplingParams` (``seed``,
``priority``, ``top_k``) are bounded to 64 bits here. Other range checks on
sampling values are left to `SamplingParams` (one source of truth); `to_sampling_params` lets
its ``ValueError("SamplingParams.<field> ...")`` propagate and `value_error_body` turns that into
an OpenAI error naming the parameter.

Responses drop ``None``-valued fields when dumped, except those OpenAI always sends as ``null``
(each model's ``_keep_none``, e.g. ``finish_reason`` and ``logprobs`` of a choice). Serialise
them with plain ``model_dump()`` / ``model_dump_json()``; ``exclude_none=True`` would also drop
the kept nulls.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import (BaseModel, Field, SerializerFunctionWrapHandler, ValidationInfo,
                      field_validator, model_serializer)

from radixserve.sampling_params import SamplingParams
from radixserve.frontend.http.protocol_base import INT64_MAX, Int64, OpenAIRequest
from radixserve.frontend.openai.protocol_router import RouterFields
from radixserve.frontend.openai.protocol_structured import (
    ResponseFormat,
    StructuredOutputsRequest,
    structured_params,
)

MAX_OPENAI_LOGPROBS = 20  # the API's own cap on logprobs / top_logprobs


def random_id(prefix: str = "") -> str:
    """``prefix`` followed by 32 random hex characters, e.g. ``random_id("cmpl-")``."""
    return f"{prefix}{uuid.uuid4().hex}"


def _now() -> int:
    return int(time.time())


def _or(value, default):
    return default if value is None else value


# ----------------------------------------------------------------------------- errors


class ParamError(ValueError):
    """A bad request parameter found after parsing; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: int | str | None = None) -> dict:
    """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def value_error_body(exc: ValueError) -> dict:
    """Error body for a ``ValueError`` from `to_sampling_params` (a `ParamError` or one raised
    by `SamplingParams`, whose ``"SamplingParams.<field> "`` prefix becomes ``param``)."""
    message, param = str(exc), getattr(exc, "param", None)
    if match := re.match(r"SamplingParams\.(\w+) ", message):
        param, message = match[1], message.removeprefix("SamplingParams.")
    return error_body(message, param=param)


# Path segments pydantic adds for union members and dict keys ("str", "list[int]",
# "NamedToolChoice", "[key]"); request field names are lower-case identifiers without brackets.
_UNION_TAG = re.compile(r"\[|^[A-Z]|^(str|int|float|bool|list|dict|none)$")


def _param(error: dict) -> str | None:
    if error["type"] == "json_invalid":
        return None
    loc = list(error["loc"])
    if loc[:1] == ["body"]:  # FastAPI's RequestValidationError prefixes the body's location
        loc = loc[1:]
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and _UNION_TAG.search(p)))


def _describe(param: str | None, errors: list[dict]) -> str:
    kind = errors[0]["type"]
    if kind == "extra_forbidden":
        return f"Unsupported parameter: '{param}'"
    if kind == "missing":
        return f"Missing required parameter: '{param}'" if param else "Missing request body"
    if kind == "json_invalid":
        return f"Invalid JSON in request body: {errors[0].get('ctx', {}).get('error', '')}".strip()
    msgs = dict.fromkeys(re.sub(r"^(Value error|Assertion failed), ", "", e["msg"])
                         for e in errors)
    text = " or ".join(msgs)
    if all(e["type"] == "value_error" for e in errors):
        return text  # our own messages already name the parameter
    return f"Invalid value for '{param}': {text}" if param else f"Invalid request body: {text}"


def validation_error_body(exc) -> dict:
    """OpenAI error body for a ``pydantic.ValidationError`` or FastAPI ``RequestValidationError``.

    ``param`` is the first offending field path (``"temperature"``, ``"messages.0.role"``);
    the message describes every offending field, union alternatives joined by "or".
    """
    groups: dict[str | None, list[dict]] = {}
    for error in exc.errors():
        groups.setdefault(_param(error) or None, []).append(error)
    message = "; ".join(_describe(param, errors) for param, errors in groups.items())
    return error_body(message or "Invalid request", param=next(iter(groups), None))


# ----------------------------------------------------------------------------- bases


class OpenAIResponse(BaseModel):
    """Base of response models: ``None`` fields are omitted when dumped, except ``_keep_none``."""

    _keep_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler):
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k in self._keep_none}


class StreamOptions(OpenAIRequest):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class SamplingRequest(RouterFields, OpenAIRequest):
    """Fields shared by completion and chat requests, and their mapping to `SamplingParams`.

    OpenAI's optional parameters accept ``null`` (meaning the default); vLLM's extensions follow.
    ``response_format`` / ``structured_outputs`` become ``SamplingParams.structured_outputs``.
    """

    model: str | None = None  # None: the served model
    n: int | None = 1
    temperature: float | None = None  # None: 1.0, as in OpenAI
    top_p: float | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias
    user: str | None = None  # accepted and ignored
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    # vLLM extensions
    top_k: int | None = Field(None, ge=-1, le=INT64_MAX)  # -1 or 0: disabled
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: Int64 = 0  # scheduling priority (lower first); not part of SamplingParams
    # seconds the request may wait for its first token (capped by --request-timeout)
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options can only be set when stream is true")
        return value

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens  # type: ignore[attr-defined]

    def requested_logprobs(self) -> tuple[int | None, str]:
        """(SamplingParams.logprobs, the request parameter that set it)."""
        raise NotImplementedError

    def to_sampling_params(self, default_max_tokens: int,
                           max_logprobs: int = MAX_OPENAI_LOGPROBS) -> SamplingParams:
        """The request's `SamplingParams`; ``max_tokens`` None becomes ``default_max_tokens``.

        Raises `ParamError` (a ``ValueError``) for bad ``logit_bias`` keys or too many logprobs,
        and lets `SamplingParams`' own ``ValueError`` propagate (see `value_error_body`).
        """
        logprobs, logprobs_param = self.requested_logprobs()
        if logprobs is not None and logprobs > max_logprobs:
            raise ParamError(logprobs_param,
                             f"{logprobs_param} must be <= {max_logprobs}, got {logprobs}")
        max_tokens = self.requested_max_tokens()
        return SamplingParams(
            n=_or(self.n, 1), temperature=_or(self.temperature, 1.0), top_p=_or(self.top_p, 1.0),
            top_k=_or(self.top_k, -1), min_p=_or(self.min_p, 0.0),
            presence_penalty=_or(self.presence_penalty, 0.0),
            frequency_penalty=_or(self.frequency_penalty, 0.0),
            repetition_penalty=_or(self.repetition_penalty, 1.0), seed=self.seed,
            max_tokens=_or(max_tokens, default_max_tokens), min_tokens=self.min_tokens,
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos, logprobs=logprobs, logit_bias=self._logit_bias(),
            skip_special_tokens=self.skip_special_tokens,
            structured_outputs=structured_params(self.response_format, self.structured_outputs),
        )

    def _logit_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        for key in self.logit_bias:
            if not re.fullmatch(r"\s*\d+\s*", key):
                raise ParamError("logit_bias", f"logit_bias keys must be token ids (non-negative "
                                               f"integers as strings), got {key!r}")
        return {int(key): bias for key, bias in self.logit_bias.items()}


# ----------------------------------------------------------------------------- completions


def _is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_text_or_tokens(value, field: str):
    """``value`` if it is a prompt-shaped input: a string, a non-empty list of strings, a
    non-empty list of token ids, or a list of non-empty token id lists; else ValueError."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and (
            all(isinstance(p, str) for p in value) or all(_is_token(t) for t in value)
            or all(isinstance(p, list) and p and all(_is_token(t) for t in p) for p in value)):
        return value
    raise ValueError(f"{field} must be a string, a non-empty list of strings, a non-empty "
                     "list of token ids, or a list of non-empty token id lists")


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(None, ge=0, le=MAX_OPENAI_LOGPROBS)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt(cls, value):
        return check_text_or_tokens(value, "prompt")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value):
        if value is not None:
            raise ValueError("suffix is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value, info: ValidationInfo):
        if value is not None and value != _or(info.data.get("n"), 1):
            raise ValueError("best_of is only supported when equal to n")
        return value

    def requested_logprobs(self) -> tuple[int | None, str]:
        return self.logprobs, "logprobs"


class PromptTokensDetails(OpenAIResponse):
    cached_tokens: int = 0


class UsageInfo(OpenAIResponse):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(OpenAIResponse):
    """Legacy logprobs: parallel lists, one entry per token (``None`` where unknown)."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIResponse):
    """A choice of a completion response or stream chunk (``finish_reason`` null until done)."""

    _keep_none = frozenset({"logprobs", "finish_reason", "stop_reason"})
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM: the stop string or token id that matched


class CompletionResponse(OpenAIResponse):
    id: str = Field(default_factory=lambda: random_id("cmpl-"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class CompletionStreamResponse(CompletionResponse):
    """A ``text_completion`` stream chunk; ``usage`` only in the final usage chunk."""


# ----------------------------------------------------------------------------- models


class ModelCard(OpenAIResponse):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "radixserve"
    max_model_len: int | None = None


class ModelList(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


class ErrorInfo(OpenAIResponse):
    _keep_none = frozenset({"param", "code"})
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(OpenAIResponse):
    error: ErrorInfo


def __getattr__(name: str):
    """Re-export the chat and tokenize models of `protocol_chat` (imported on first use)."""
    if not name.startswith("__"):
        from radixserve.frontend.openai import protocol_chat
        if hasattr(protocol_chat, name):
            return getattr(protocol_chat, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""OpenAI API models as vLLM serves them: completions, models, and their helpers.

Chat completions and tokenize/detokenize live in `protocol_chat`, embeddings in
`protocol_embedding`; the error bodies every API shares in `http.protocol_base`.

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

from pydantic import Field, ValidationInfo, field_validator

from radixserve.sampling_params import SamplingParams
from radixserve.frontend.http.protocol_base import (INT64_MAX, Int64, OpenAIRequest,
                                                    OpenAIResponse, ParamError)
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


def unix_now() -> int:
    """The current time in whole seconds (a response's ``created``)."""
    return int(time.time())


def or_default(value, default):
    """``value``, or ``default`` where it is None (a request field left unset)."""
    return default if value is None else value


@classmethod
def truncate_count(cls, value):
    """``truncate_prompt_tokens``' validator: a count of tokens to keep, or -1."""
    if value == 0:
        raise ValueError("truncate_prompt_tokens must be >= 1 (the most prompt tokens to "
                         "keep) or -1 (what the context leaves), got 0")
    return value


# ----------------------------------------------------------------------------- bases


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
    lora: str | None = None  # a loaded LoRA adapter's name (also: model NAME or BASE:NAME)
    # seconds the request may wait for its first token (capped by --request-timeout)
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)
    # llama-server's: a stream sends `prompt_progress` chunks while the prompt prefills
    return_progress: bool = False
    # cut a prompt longer than this many tokens (-1: what the context leaves), not a 400:
    # frontend/truncation.py
    truncate_prompt_tokens: int | None = Field(None, ge=-1)

    _truncate_not_0 = field_validator("truncate_prompt_tokens")(truncate_count)

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options can only be set when stream is true")
        return value

    scores_prompts: ClassVar[bool] = False
    """Whether ``max_tokens`` may be 0: score the prompt, generate nothing."""

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
        if max_tokens == 0 and not self.scores_prompts:
            raise ParamError("max_tokens", "max_tokens must be at least 1, got 0")
        return SamplingParams(
            n=or_default(self.n, 1), temperature=or_default(self.temperature, 1.0), top_p=or_default(self.top_p, 1.0),
            top_k=or_default(self.top_k, -1), min_p=or_default(self.min_p, 0.0),
            presence_penalty=or_default(self.presence_penalty, 0.0),
            frequency_penalty=or_default(self.frequency_penalty, 0.0),
            repetition_penalty=or_default(self.repetition_penalty, 1.0), seed=self.seed,
            max_tokens=or_default(max_tokens, default_max_tokens), min_tokens=self.min_tokens,
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos, logprobs=logprobs, logit_bias=self._logit_bias(),
            skip_special_tokens=self.skip_special_tokens,
            structured_outputs=structured_params(self.response_format, self.structured_outputs),
            return_progress=bool(self.stream) and self.return_progress,
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
    """``POST /v1/completions``. ``echo`` with ``logprobs`` scores the prompt too (its tokens
    lead the logprobs, the first with None), as does vLLM's ``prompt_logprobs`` (returned in
    the choice's ``prompt_logprobs``); ``max_tokens`` 0 then scores the prompt alone.
    ``suffix``: the completion fills in the middle between the prompt and it (FIM models)."""

    scores_prompts: ClassVar[bool] = True
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(None, ge=0, le=MAX_OPENAI_LOGPROBS)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_OPENAI_LOGPROBS)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt(cls, value):
        return check_text_or_tokens(value, "prompt")

    @field_validator("suffix")
    @classmethod
    def _suffix_fills_in(cls, value, info: ValidationInfo):
        """``suffix``: fill in the middle between each text prompt and it (serving_completion);
        token-id prompts and ``echo`` (of which prompt: the code or the FIM tokens?) are
        refused."""
        if value is None:
            return value
        if info.data.get("echo"):
            raise ValueError("suffix cannot be combined with echo")
        prompt = info.data.get("prompt")
        if isinstance(prompt, list) and not all(isinstance(p, str) for p in prompt):
            raise ValueError("suffix needs text prompts (the code before the cursor), "
                             "not token ids")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value, info: ValidationInfo):
        if value is not None and value != or_default(info.data.get("n"), 1):
            raise ValueError("best_of is only supported when equal to n")
        return value

    def requested_logprobs(self) -> tuple[int | None, str]:
        return self.logprobs, "logprobs"

    def to_sampling_params(self, default_max_tokens: int,
                           max_logprobs: int = MAX_OPENAI_LOGPROBS) -> SamplingParams:
        params = super().to_sampling_params(default_max_tokens, max_logprobs)
        wanted = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None)
                  if k is not None]
        return params.clone(prompt_logprobs=max(wanted)) if wanted else params


class PromptLogprob(OpenAIResponse):
    """vLLM's entry of ``prompt_logprobs``: one candidate token at one prompt position."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class PromptTokensDetails(OpenAIResponse):
    cached_tokens: int = 0
    # what truncation cut (frontend/truncation.py); absent when nothing was cut
    truncated_tokens: int | None = None
    dropped_messages: int | None = None
    image_tokens: int | None = None  # the prompt's image tokens (a vision model); absent: none


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
    # vLLM: per prompt token {token id: candidate} (None first); only when asked for
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class CompletionResponse(OpenAIResponse):
    id: str = Field(default_factory=lambda: random_id("cmpl-"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=unix_now)
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class CompletionStreamResponse(CompletionResponse):
    """A ``text_completion`` stream chunk; ``usage`` only in the final usage chunk."""


# ----------------------------------------------------------------------------- models


class ModelCard(OpenAIResponse):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=unix_now)
    owned_by: str = "radixserve"
    max_model_len: int | None = None
    root: str | None = None  # a LoRA adapter's path (vLLM's)
    parent: str | None = None  # a LoRA adapter's base model (vLLM's)
    # what the model does: completion, vision (images in), tools, thinking, embedding, insert
    capabilities: list[str] | None = None


class ModelList(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)

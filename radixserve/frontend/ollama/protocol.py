"""Ollama's API request models, and their mapping onto the OpenAI requests the server already
runs (so /api/chat and /api/generate take the chat / completion pipeline: same template,
tokenizer, parsers, structured output and engine).

``options`` map to sampling parameters: temperature, top_p, top_k, min_p, seed, stop,
num_predict (max tokens; -1 or -2: until the context is full), repeat_penalty,
presence_penalty, frequency_penalty (and ``ignore_eos``, this server's extension). Options that choose how a model is loaded or run (num_ctx,
num_batch, num_gpu, num_thread, use_mmap, ...) do not change what is generated and are
accepted and ignored, as is ``keep_alive`` (the model stays loaded while the server runs).
Options that would change the output in a way this engine does not implement (mirostat,
tfs_z, typical_p, repeat_last_n other than the whole context when a repeat_penalty is set)
are refused by name. Unset sampling options take the server's defaults (those of
/v1/chat/completions), not Ollama's Modelfile defaults.

``images`` (base64, on a user message of /api/chat, or with /api/generate's prompt) become the
chat request's ``image_url`` parts (data URIs), before the message's text; /api/generate takes
them only through the chat template (not with ``raw``, ``suffix`` or ``context``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixserve.frontend.http.protocol_base import REQUEST_CONFIG, ParamError
from radixserve.frontend.media.chat import data_uri

_MAPPED = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
           "seed": "seed", "stop": "stop", "repeat_penalty": "repetition_penalty",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
           "ignore_eos": "ignore_eos"}  # ignore_eos: our extension, as on the OpenAI routes
_NO_EFFECT = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv",
              "logits_all", "vocab_only", "use_mmap", "use_mlock", "embedding_only",
              "num_thread", "num_keep", "numa", "penalize_newline"}
_NEUTRAL = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}  # refused unless this value


class OllamaRequest(BaseModel):
    """Read as strictly as Ollama's own JSON decoding: unknown fields, a string for a boolean
    (``"stream": "yes"``) or a number, and non-finite numbers (``NaN``, ``Infinity``, ``1e309``)
    are 400s, never coerced or turned into defaults."""

    model_config = REQUEST_CONFIG


class OllamaFunctionCall(OllamaRequest):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class OllamaToolCall(OllamaRequest):
    function: OllamaFunctionCall
    id: str | None = None
    type: str | None = None


class OllamaMessage(OllamaRequest):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = None  # base64, without a data: prefix
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None

    @model_validator(mode="after")
    def _images_from_user(self):
        if self.images and self.role != "user":
            raise ValueError(f"images are only accepted in user messages, not in "
                             f"{self.role} messages")
        return self

    def to_openai(self) -> dict:
        msg: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.images:  # images first, then the text, as Ollama's templates place them
            msg["content"] = [*image_parts(self.images), {"type": "text", "text": msg["content"]}]
        if self.tool_calls:
            msg["tool_calls"] = [{"id": c.id or f"call_{i}", "type": "function", "function": {
                "name": c.function.name, "arguments": json.dumps(c.function.arguments)}}
                for i, c in enumerate(self.tool_calls)]
            msg["content"] = self.content or None
        if self.thinking:
            msg["reasoning_content"] = self.thinking
        if self.role == "tool" and self.tool_name:
            msg["name"] = self.tool_name
        return msg


class _Generating(OllamaRequest):
    model: str = Field(min_length=1)
    stream: bool | None = True  # Ollama streams unless told not to
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    # true: a prompt longer than the context loses its oldest turns (its start, raw), as
    # Ollama does; else it is an error (frontend/truncation.py)
    truncate: bool | None = None
    # radixserve's (llama-server's option): streamed, a line with `prompt_progress` (and empty
    # content) after each chunk of the prompt; off by default, as Ollama clients do not know it
    return_progress: bool = False

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        if value:
            raise ValueError("logprobs are not supported on the Ollama API; use "
                             "/v1/chat/completions with logprobs")
        return value

    def openai_fields(self) -> dict:
        """The sampling and format fields of the equivalent OpenAI request."""
        fields = sampling_fields(self.options or {})
        # streamed even for stream: false (serving.collect joins it): the first token's time
        # gives prompt_eval_duration and eval_duration
        fields["stream"] = True
        fields["stream_options"] = {"include_usage": True}
        if self.truncate:
            fields["truncate_prompt_tokens"] = -1  # what the context leaves
        if self.return_progress and self.stream is not False:
            fields["return_progress"] = True
        if self.format == "json":
            fields["response_format"] = {"type": "json_object"}
        elif isinstance(self.format, dict):
            fields["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "format", "schema": self.format}}
        return fields

    def template_kwargs(self) -> dict | None:
        if self.think is None:
            return None
        if isinstance(self.think, str):
            return {"enable_thinking": True, "reasoning_effort": self.think}
        return {"enable_thinking": self.think}


class OllamaTool(OllamaRequest):
    type: Literal["function"] = "function"
    function: dict[str, Any]


class OllamaChatRequest(_Generating):
    """``POST /api/chat``."""

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[OllamaTool] | None = None

    def to_openai(self) -> dict:
        body = {"messages": [m.to_openai() for m in self.messages], **self.openai_fields()}
        if self.tools:
            body["tools"] = [t.model_dump() for t in self.tools]
        if (kwargs := self.template_kwargs()) is not None:
            body["chat_template_kwargs"] = kwargs
        return body


class OllamaGenerateRequest(_Generating):
    """``POST /api/generate``: ``prompt`` (and ``system``) through the chat template, or as
    is with ``raw``; after ``context`` (the ids an earlier answer returned) when given. With
    ``suffix`` the answer fills in the middle between ``prompt`` and it (a FIM model's
    tokens around them, whether ``raw`` or not; Ollama's templates do the same), which
    ``system``, ``context`` and ``think`` cannot join."""

    prompt: str | None = None
    system: str | None = None
    raw: bool | None = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[str] | None = None  # base64, without a data: prefix; go with the prompt

    @field_validator("template")
    @classmethod
    def _unsupported(cls, value, info):
        if value:
            raise ValueError("template is not supported; the model's own chat template is used "
                             "(or raw: true)")
        return value

    @model_validator(mode="after")
    def _images_in_template(self):
        if self.images:
            given = [name for name in ("raw", "suffix", "context")
                     if getattr(self, name) not in (None, False, [])]
            if given:
                raise ValueError(f"images cannot be combined with {', '.join(given)}: images "
                                 "go into the chat template with the prompt")
        return self

    @model_validator(mode="after")
    def _suffix_alone(self):
        if self.suffix is not None:
            joined = [name for name in ("system", "context", "think")
                      if getattr(self, name) not in (None, "", [], False)]
            if joined:
                raise ValueError(f"suffix (fill in the middle) cannot be combined with "
                                 f"{', '.join(joined)}")
        return self

    def to_openai_chat(self) -> dict:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": self.prompt or ""})
        if self.images:
            messages[-1]["content"] = [*image_parts(self.images),
                                       {"type": "text", "text": self.prompt or ""}]
        body = {"messages": messages, **self.openai_fields()}
        if (kwargs := self.template_kwargs()) is not None:
            body["chat_template_kwargs"] = kwargs
        return body

    @field_validator("context")
    @classmethod
    def _token_ids(cls, value):
        if value and min(value) < 0:
            raise ValueError("context must hold token ids (non-negative integers)")
        return value

    def to_openai_completion(self, prompt_ids: list[int] | None = None) -> dict:
        """The completion request of ``raw`` or ``suffix``, or of ``prompt_ids`` (the context
        and the prompt, as tokens) when given."""
        fields = self.openai_fields()
        fields.setdefault("max_tokens", None)  # a completion's own default is 16 tokens
        if self.suffix is not None:
            fields["suffix"] = self.suffix
        return {"prompt": prompt_ids if prompt_ids else self.prompt or "", **fields}


class OllamaEmbedRequest(OllamaRequest):
    """``POST /api/embed`` (``input``) and the older ``POST /api/embeddings`` (``prompt``)."""

    model: str = Field(min_length=1)
    input: str | list[str] | None = None
    prompt: str | None = None
    truncate: bool | None = True
    options: dict[str, Any] | None = None
    keep_alive: float | str | None = None
    dimensions: int | None = Field(None, ge=1)

    def texts(self) -> list[str]:
        value = self.input if self.input is not None else self.prompt
        if value is None or value == []:
            raise ParamError("input", "input must be a string or a non-empty list of strings")
        return [value] if isinstance(value, str) else list(value)


class OllamaShowRequest(OllamaRequest):
    # NOTE: model or name must be a non-empty string (the route checks it, naming model)
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": [key], "properties": {key: {"type": "string", "minLength": 1}}}
        for key in ("model", "name")]})
    model: str | None = None
    name: str | None = None  # older clients
    verbose: bool | None = None


def image_parts(images: list[str]) -> list[dict]:
    """Ollama's base64 images as chat ``image_url`` parts (data URIs)."""
    return [{"type": "image_url", "image_url": {"url": data_uri(b64)}} for b64 in images]


def sampling_fields(options: dict[str, Any]) -> dict:
    """Ollama ``options`` as OpenAI chat-request fields; ParamError naming a refused one."""
    fields: dict[str, Any] = {}
    for key, value in options.items():
        _check_finite(f"options.{key}", value)
        if key in _MAPPED:
            fields[_MAPPED[key]] = value
        elif key == "num_predict":
            if not isinstance(value, int) or isinstance(value, bool) or value == 0 \
                    or value < -2:
                raise ParamError("options.num_predict", "options.num_predict must be a "
                                 f"positive integer, or -1 / -2 (no limit), got {value!r}")
            fields["max_tokens"] = value if value > 0 else None
        elif key in _NEUTRAL:
            if value != _NEUTRAL[key]:
                raise ParamError(f"options.{key}", f"options.{key} is not supported (only "
                                 f"{_NEUTRAL[key]}, which turns it off)")
        elif key == "repeat_last_n":
            if value != -1 and options.get("repeat_penalty", 1.0) != 1.0:
                raise ParamError("options.repeat_last_n", "options.repeat_last_n: the "
                                 "repeat penalty covers the whole context here (-1); other "
                                 "windows are not supported")
        elif key not in _NO_EFFECT:
            supported = sorted([*_MAPPED, "num_predict", "repeat_last_n", *_NEUTRAL,
                                *_NO_EFFECT])
            raise ParamError(f"options.{key}", f"unknown option {key!r}; supported: "
                             f"{', '.join(supported)}")
    return fields


def _check_finite(name: str, value: Any) -> None:
    """ParamError if ``value`` holds a NaN or infinite number (JSON has none; Python's reader
    turns ``NaN``, ``Infinity`` and ``1e309`` into them, and they would reach the engine as
    nulls, that is as defaults)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamError(name, f"{name} must be a finite number, got {value!r}")
    if isinstance(value, list):
        for item in value:
            _check_finite(name, item)


class OllamaErrorBody(BaseModel):
    """Ollama's error body (`routes.send_ollama_error`), as /openapi.json describes it."""

    error: str

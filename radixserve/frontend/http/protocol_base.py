"""What every API's models share: how strictly a request body is read, the integer ranges that
cross into the engine, how a response drops its nulls, and the OpenAI error body (the shape
every route answers in unless its API has its own: `OpenAIError`, `error_body`).

Requests are parsed strictly (pydantic's ``strict`` mode): no string-to-number coercion
(``"max_tokens": "10"`` is an error, not 10), no ``0``/``1`` for booleans, no ``10.0`` for an
integer; an integer is accepted where a float is expected. Floats must be finite: ``NaN`` and
``Infinity`` (which pydantic's JSON reader otherwise accepts) are refused for every float field.
Unknown fields are errors, so an unsupported parameter is rejected by name.

Integers that travel to the engine process as msgpack (which holds at most 64 bits) and into
its int64 tensors are range-checked here, so an oversized ``seed`` is a 400 naming the field
rather than an ``OverflowError`` after the request was registered.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""Any signed 64-bit integer (``seed``, ``priority``)."""

REQUEST_CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class OpenAIRequest(BaseModel):
    """Base of request models: unknown fields are errors, types are strict, floats finite."""

    model_config = REQUEST_CONFIG


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

class OpenAIResponse(BaseModel):
    """Base of response models: ``None`` fields are omitted when dumped, except ``_keep_none``."""

    _keep_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler):
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k in self._keep_none}

class ErrorInfo(OpenAIResponse):
    _keep_none = frozenset({"param", "code"})
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(OpenAIResponse):
    error: ErrorInfo


class OpenAIError(Exception):
    """An error answered with an OpenAI error body (or the route's own API's shape) and
    ``status``."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = (
            message, status, type, param, code)


class ClientDisconnected(Exception):
    """The client left before its answer was sent (nobody reads an answer to it)."""

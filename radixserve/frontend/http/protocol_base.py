"""What every request model shares: how strictly a request body is read, and the integer
ranges that cross into the engine.

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

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
"""Any signed 64-bit integer (``seed``, ``priority``)."""

REQUEST_CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class OpenAIRequest(BaseModel):
    """Base of request models: unknown fields are errors, types are strict, floats finite."""

    model_config = REQUEST_CONFIG

"""Request fields that constrain the output: OpenAI's ``response_format`` and vLLM's
``structured_outputs`` extension, mapped to `StructuredOutputsParams`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from radixserve.frontend.http.protocol_base import OpenAIRequest
from radixserve.structured.params import StructuredOutputsParams


class JsonSchemaFormat(OpenAIRequest):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIRequest):
    """``{"type": "text"}``, ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs a 'json_schema'")
        return self


class StructuredOutputsRequest(OpenAIRequest):
    """vLLM's ``structured_outputs``: exactly one of json / regex / choice / grammar /
    json_object; ``after_reasoning`` (our extension) lets a reasoning section come first."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    after_reasoning: bool | None = None
    strict: bool | None = None  # as response_format's; None: the server's --structured-strict


def structured_params(response_format: ResponseFormat | None,
                      structured: StructuredOutputsRequest | None
                      ) -> StructuredOutputsParams | None:
    """The constraint a request asks for (None: unconstrained); ParamError naming the field."""
    from radixserve.frontend.http.protocol_base import ParamError
    if response_format is not None and response_format.type != "text":
        if structured is not None:
            raise ParamError("structured_outputs", "give either response_format or "
                                                   "structured_outputs, not both")
        fmt = response_format.json_schema
        if fmt is None or fmt.schema_ is None:  # json_object, or a json_schema without a schema
            return StructuredOutputsParams(json_object=True)
        return StructuredOutputsParams(json=fmt.schema_, strict=fmt.strict)
    if structured is None:
        return None
    try:
        return StructuredOutputsParams(
            json=structured.json_, regex=structured.regex, choice=structured.choice,
            grammar=structured.grammar, json_object=bool(structured.json_object),
            after_reasoning=structured.after_reasoning, strict=structured.strict)
    except ValueError as exc:
        raise ParamError("structured_outputs", str(exc)) from None

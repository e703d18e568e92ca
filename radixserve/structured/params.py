"""What a request asks its output to match: one of a JSON schema, a regex, a choice or a grammar.

`StructuredOutputsParams` is vLLM's offline/extension shape (``structured_outputs`` in a request
body, ``SamplingParams(structured_outputs=...)`` offline). It reduces to a `GrammarSpec`, the
hashable (kind, text) key that compiled grammars are cached by.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from radixserve.structured.schema_rewrite import enforceable_schema
from radixserve.structured.strict_schema import strict_schema

GrammarKind = Literal["json", "regex", "choice", "grammar"]

_ANY_JSON_OBJECT = '{"type": "object"}'


class GrammarSpec(msgspec.Struct, frozen=True, array_like=True):
    """A constraint in canonical text form: ``json`` (a schema as JSON text), ``regex``,
    ``choice`` (a JSON list of strings) or ``grammar`` (Lark or GBNF)."""

    kind: GrammarKind
    text: str


class StructuredOutputsParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Exactly one of ``json`` (a JSON schema, as a dict or JSON text), ``regex``, ``choice``
    (a list of strings), ``grammar`` (Lark or llama.cpp GBNF) or ``json_object=True`` (any JSON
    object).

    ``after_reasoning``: for models that think first, leave the reasoning section free and start
    the constraint after it ends (None: on; either way only where a reasoning parser names the
    end tag: ``--reasoning-parser``, ``LLM(reasoning_parser=)``). ``reasoning_end_token_ids``
    is that end tag as token ids, filled in by the frontend (`gate_on_reasoning`); the
    constraint starts after the first output position where they appear.

    ``strict`` (JSON schemas only): close the schema's objects and fix its whitespace
    (`strict_schema`), so the answer cannot grow forever; False takes the schema as written
    (open objects, whitespace bounded to 16 characters per gap). None means True, the
    library's default; a server replaces None by its ``--structured-strict`` first.
    """

    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    after_reasoning: bool | None = None
    strict: bool | None = None
    reasoning_end_token_ids: list[int] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar")
                 if getattr(self, name) is not None] + ["json_object"] * bool(self.json_object)
        if len(given) != 1:
            raise ValueError("structured outputs need exactly one of json, regex, choice, "
                             f"grammar or json_object; got {given or 'none'}")
        if self.json is not None and not isinstance(self.json, str | dict):
            raise ValueError("structured outputs 'json' must be a JSON schema (an object or "
                             "its JSON text)")
        if self.choice is not None and (not self.choice or not all(
                isinstance(c, str) for c in self.choice)):
            raise ValueError("structured outputs 'choice' must be a non-empty list of strings")
        if self.strict is not None and not isinstance(self.strict, bool):
            raise ValueError("structured outputs 'strict' must be true or false")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured outputs {name!r} must be a non-empty string")

    def spec(self) -> GrammarSpec:
        """The canonical (kind, text) of the constraint; ValueError on a non-JSON schema text."""
        if self.json_object:
            return GrammarSpec("json", _ANY_JSON_OBJECT)
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
            if not isinstance(schema, dict | bool):
                raise ValueError("the JSON schema must be a JSON object")
            schema = enforceable_schema(schema)
            if schema is False:
                raise ValueError("the JSON schema accepts no value (it is false, or negates "
                                 "everything: not {})")
            if self.strict is not False:
                schema = strict_schema(schema)
            # NOTE: key order kept: it is the order the properties are generated in.
            return GrammarSpec("json", json.dumps(schema, separators=(",", ":")))
        if self.regex is not None:
            return GrammarSpec("regex", self.regex)
        if self.choice is not None:
            return GrammarSpec("choice", json.dumps(self.choice))
        return GrammarSpec("grammar", self.grammar or "")

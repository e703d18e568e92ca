"""Strict JSON schemas: objects closed where the schema leaves them open, whitespace fixed.

A plain JSON schema lets an object hold any property it does not mention
(``additionalProperties`` defaults to true) and puts any amount of whitespace between tokens.
A small model takes both: it adds one more key after another, or pads, until max_tokens cuts
the answer as invalid JSON. Strict mode (OpenAI's ``strict: true``, and radixserve's default,
see ``--structured-strict``) closes them, as OpenAI, xgrammar, llama.cpp and vLLM's guidance
backend do:

* every object schema that lists ``properties`` (or ``patternProperties``) and says nothing
  about ``additionalProperties`` / ``unevaluatedProperties`` gets ``additionalProperties:
  false``, recursively (properties, items, ``$defs``, ``anyOf`` / ``oneOf`` branches, ...);
* an object that lists no properties at all (``{"type": "object"}``) stays free-form: closing
  it would leave only ``{}``; nor is one whose properties are all ``false`` (it only says what
  is absent);
* a closed object's required names and the properties its ``allOf`` branches define are added
  to its ``properties`` (as ``{}``), so closing never makes a schema unsatisfiable;
* the direct branches of an ``allOf`` are not closed (each would forbid the others'
  properties); the schema holding the ``allOf`` is, if it lists properties itself;
* whitespace is the one canonical form ``{"a": 1, "b": [1, 2]}`` (llguidance's
  ``whitespace_flexible: false`` with ``", "`` and ``": "`` separators), unless the schema's own
  ``x-guidance`` options say otherwise.

Required properties are left as the schema says (OpenAI's strict mode also demands that all
are required; we do not refuse schemas that do not).
"""

from __future__ import annotations

from typing import Any

# llguidance's JSON compile options for a strict schema (read from the schema's "x-guidance").
STRICT_JSON_OPTIONS = {"whitespace_flexible": False, "whitespace_pattern": None,
                       "item_separator": ", ", "key_separator": ": "}

# keywords whose value is one subschema / a list of them / a name -> subschema map
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else",
        "additionalProperties", "unevaluatedItems", "unevaluatedProperties", "propertyNames")
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def strict_schema(schema: dict[str, Any] | bool) -> dict[str, Any] | bool:
    """A copy of ``schema`` with its objects closed and llguidance's strict whitespace options
    under ``x-guidance`` (the schema's own options win). Does not mutate ``schema``."""
    if not isinstance(schema, dict):
        return schema
    closed = _close(schema)
    closed["x-guidance"] = {**STRICT_JSON_OPTIONS, **schema.get("x-guidance", {})}
    return closed


def _close(schema: Any, in_all_of: bool = False) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = _close(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [_close(s) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: _close(s) for name, s in out[key].items()}
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_close(s, in_all_of=True) for s in out["allOf"]]
    properties = out.get("properties")
    # a schema whose properties are all `false` only says what is absent (the rewrites of
    # structured/schema_rewrite.py): closing it would forbid every property
    lists_properties = (isinstance(properties, dict) and any(
        s is not False for s in properties.values())) or isinstance(
        out.get("patternProperties"), dict)
    if (lists_properties and not in_all_of and "additionalProperties" not in out
            and "unevaluatedProperties" not in out):
        out["additionalProperties"] = False
        _list_named_properties(out)
    return out


def _list_named_properties(out: dict) -> None:
    """A closed object must still allow what it and its combinator branches require or
    define: such names are added to its ``properties`` as ``{}`` (the branches constrain
    them), else closing would make the schema unsatisfiable."""
    names = _named(out, top=True)
    properties = out["properties"] = dict(out.get("properties") or {})
    patterns = out.get("patternProperties") or {}
    for name in names:
        if name not in properties and not patterns:
            properties[name] = {}


def _named(schema: Any, top: bool = False) -> list[str]:
    """The property names ``schema`` requires or defines, through its combinators (allOf /
    anyOf / oneOf, at any depth), not inside its properties' own schemas."""
    if not isinstance(schema, dict):
        return []
    names = [n for n in schema.get("required", []) if isinstance(n, str)]
    if not top:
        names += list(schema.get("properties", {}) or {})
    for key in ("allOf", "anyOf", "oneOf"):
        for branch in schema.get(key, []) if isinstance(schema.get(key), list) else []:
            names += _named(branch)
    return names

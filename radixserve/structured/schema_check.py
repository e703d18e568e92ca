"""Whether a JSON value satisfies a JSON schema: the checks a function's parameters schema
asks, for reading a model's free-form answer (frontend/parsers/lenient_json.py).

Generation enforces schemas with llguidance, but its matcher reads a value as a grammar
generates it (properties in the schema's order), and a model writing freely orders keys as it
likes; so values are checked here, by the JSON Schema rules (draft 2020-12 and the older
``definitions`` / list ``items``):

* ``type`` (one or a list; ``integer`` is a number without a fraction; booleans are not
  numbers), ``enum``, ``const``, OpenAPI's ``nullable``;
* objects: ``properties``, ``required``, ``additionalProperties``, ``min/maxProperties``;
* arrays: ``items``, ``prefixItems``, ``min/maxItems``;
* strings: ``min/maxLength``, ``pattern``; numbers: ``minimum``, ``maximum`` and their
  ``exclusive`` forms;
* ``anyOf``, ``oneOf`` (read as ``anyOf``), ``allOf``, ``not``, local ``$ref``s
  (``#/$defs/...``, ``#/definitions/...``, ``#``); ``true`` and ``false`` schemas.

Any other keyword (``format``, ``uniqueItems``...) is not checked: this decides whether an
answer is meant as a call, not whether the call is perfect, and an unreadable keyword must not
turn a call into text.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["satisfies"]

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
}


def satisfies(value: Any, schema: Any) -> bool:
    """Whether `value` (as ``json.loads`` gives it) satisfies `schema` (module docstring)."""
    return _Checker(schema).check(value, schema)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``1 == 1.0``, but ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b and (isinstance(a, str) == isinstance(b, str))


class _Checker:
    def __init__(self, root: Any) -> None:
        self.root = root

    def check(self, value: Any, schema: Any) -> bool:
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            return True  # not a schema: nothing it could ask
        if "$ref" in schema and not self.check(value, self._resolve(schema["$ref"])):
            return False
        if value is None and schema.get("nullable") is True:
            return True
        return all(check(self, value, schema) for check in _KEYWORD_CHECKS)

    def _resolve(self, ref: Any) -> Any:
        """The schema a local ``$ref`` points to; an unreadable one asks nothing."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return True
        node = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return True
            node = node[part]
        return node


def _type(c: _Checker, value: Any, schema: dict) -> bool:
    kinds = schema.get("type")
    if kinds is None:
        return True
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return any(_TYPES.get(kind, lambda v: True)(value) for kind in kinds)


def _choices(c: _Checker, value: Any, schema: dict) -> bool:
    if "const" in schema and not _same(value, schema["const"]):
        return False
    enum = schema.get("enum")
    return not isinstance(enum, list) or any(_same(value, option) for option in enum)


def _combined(c: _Checker, value: Any, schema: dict) -> bool:
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and not any(c.check(value, s) for s in options):
            return False
    every = schema.get("allOf")
    if isinstance(every, list) and not all(c.check(value, s) for s in every):
        return False
    return "not" not in schema or not c.check(value, schema["not"])


def _object(c: _Checker, value: Any, schema: dict) -> bool:
    if not isinstance(value, dict):
        return True
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    if isinstance(required, list) and any(key not in value for key in required):
        return False
    if not _count_within(len(value), schema, "minProperties", "maxProperties"):
        return False
    extra = schema.get("additionalProperties", True)
    return all(c.check(item, properties.get(key, extra))
               for key, item in value.items())


def _array(c: _Checker, value: Any, schema: dict) -> bool:
    if not isinstance(value, list):
        return True
    if not _count_within(len(value), schema, "minItems", "maxItems"):
        return False
    prefix = schema.get("prefixItems")
    items = schema.get("items", True)
    if isinstance(items, list):  # the older tuple form
        prefix, items = items, schema.get("additionalItems", True)
    prefix = prefix if isinstance(prefix, list) else []
    return all(c.check(item, prefix[i] if i < len(prefix) else items)
               for i, item in enumerate(value))


def _string(c: _Checker, value: Any, schema: dict) -> bool:
    if not isinstance(value, str):
        return True
    if not _count_within(len(value), schema, "minLength", "maxLength"):
        return False
    pattern = schema.get("pattern")
    if not isinstance(pattern, str):
        return True
    try:
        return re.search(pattern, value) is not None
    except re.error:
        return True  # a pattern Python cannot read asks nothing here


def _number(c: _Checker, value: Any, schema: dict) -> bool:
    if not _TYPES["number"](value):
        return True
    bounds = [("minimum", lambda v, b: v >= b), ("maximum", lambda v, b: v <= b),
              ("exclusiveMinimum", lambda v, b: v > b), ("exclusiveMaximum", lambda v, b: v < b)]
    return all(op(value, schema[key]) for key, op in bounds
               if _TYPES["number"](schema.get(key)))


def _count_within(count: int, schema: dict, low: str, high: str) -> bool:
    least, most = schema.get(low), schema.get(high)
    return ((not isinstance(least, int) or count >= least)
            and (not isinstance(most, int) or count <= most))


_KEYWORD_CHECKS = (_type, _choices, _combined, _object, _array, _string, _number)

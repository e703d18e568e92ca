"""JSON Schema keywords llguidance's compiler lacks, rewritten into ones it has.

Every rewrite is sound: an answer valid under the rewritten schema is valid under the schema as
written. Most are exact; where exactness cannot be had in a grammar the rewrite narrows the
schema (stated below) rather than dropping a constraint, and what cannot be rewritten is left
for the compiler to refuse by name (a 400), never answered unconstrained.

* ``format``: the formats llguidance checks stay; a standard one it lacks becomes a narrower one
  it has (``idn-email`` -> ``email``, ``idn-hostname`` -> ``hostname``, ``uri-reference`` /
  ``iri`` / ``iri-reference`` / ``uri-template`` -> ``uri``) or a pattern of plain characters
  (``regex``, ``json-pointer``, ``relative-json-pointer``); any other name (``color``,
  ``int32``, a project's own) is dropped: an unknown format is an annotation, not an assertion
  (JSON Schema 2019-09 and later).
* ``dependencies`` / ``dependentRequired`` / ``dependentSchemas`` (exact): "if ``a`` is present
  then ..." becomes ``anyOf: [{a absent}, {a present and ...}]``, where "absent" is
  ``properties: {a: false}``.
* ``not`` (exact) where it negates presence or types: ``not: {}`` is ``false``; ``not:
  {required: [a, b]}`` is "a or b absent"; ``not`` of an ``anyOf`` / ``allOf`` of such;
  ``not: {type: [...]}`` is the other types. Other ``not`` forms stay (and are refused).
* ``if`` / ``then`` / ``else``: without ``then`` and ``else`` it constrains nothing and goes;
  otherwise it becomes ``anyOf: [{if and then}, {not-if and else}]`` where ``not-if`` has an
  exact form above, else (narrower) ``allOf: [if, then]``.
* ``$ref`` beside other keywords (exact): in drafts 3-7 they are ignored, and go; in later
  drafts annotations go and constraints join the ``$ref`` in an ``allOf``.
* a local ``$ref`` in an ``allOf`` is replaced by what it names, and ``allOf`` branches whose
  keywords the schema lacks are merged into it (exact; llguidance cannot intersect a
  reference inside a cycle).
* ``uniqueItems: true`` (narrower): a grammar cannot compare items, so such an array holds at
  most one item (always unique), where ``minItems`` allows it; otherwise it stays (refused).
"""

from __future__ import annotations

import functools
import re
from typing import Any

_FORMATS = {"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6",
            "uri", "uuid", "unknown"}
_NARROWER_FORMAT = {"idn-email": "email", "idn-hostname": "hostname", "uri-reference": "uri",
                    "iri": "uri", "iri-reference": "uri", "uri-template": "uri"}
_FORMAT_PATTERN = {"regex": r"^[A-Za-z0-9 _-]*$",
                   "json-pointer": r"^(/[A-Za-z0-9_.-]*)*$",
                   "relative-json-pointer": r"^(0|[1-9][0-9]{0,8})(#|(/[A-Za-z0-9_.-]*)*)$"}
_TYPES = ("null", "boolean", "object", "array", "number", "string")
_ANNOTATIONS = {"description", "$comment", "title", "examples"}
_IN_PLACE = {"$id", "id", "definitions", "$defs"}  # stay beside a $ref ($schema goes)
_OLD_DRAFT = re.compile(r"draft-0[3-7]\b")

# keywords whose value is one subschema / a list of them / a name -> subschema map
_ONE = ("items", "additionalItems", "contains", "additionalProperties", "unevaluatedItems",
        "unevaluatedProperties", "propertyNames", "then", "else", "if", "not")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def enforceable_schema(schema: Any) -> Any:
    """A copy of ``schema`` with the module's rewrites applied everywhere (``$defs`` too).
    Does not mutate ``schema``."""
    old_draft = isinstance(schema, dict) and bool(_OLD_DRAFT.search(str(schema.get("$schema"))))
    out = _rewrite(schema, old_draft)
    return _inline_all_of_refs(out, out) if isinstance(out, dict) else out


def _inline_all_of_refs(node: Any, root: dict) -> Any:
    """A local ``$ref`` that is a branch of an ``allOf`` replaced by the schema it names, one
    level deep (exact): llguidance cannot intersect a reference that is part of a cycle."""
    if isinstance(node, list):
        return [_inline_all_of_refs(n, root) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _inline_all_of_refs(v, root) for k, v in node.items()}
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_resolve(b, root) for b in out["allOf"]]
        _merge_all_of(out)
    for key in ("anyOf", "oneOf"):
        if isinstance(out.get(key), list) and "type" in out:
            _drop_implied_type(out, key, root)
    return out


def _types(schema: Any) -> set[str] | None:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, str):
        return {kind}
    return set(kind) if isinstance(kind, list) else None


def _drop_implied_type(out: dict, key: str, root: dict) -> None:
    """``type`` beside an ``anyOf`` / ``oneOf`` whose every branch already has a type within
    it goes (exact), so the compiler has no reference to intersect it with."""
    allowed = _types(out)
    if allowed is None or "integer" in allowed and "number" not in allowed:
        return
    allowed = allowed | ({"integer"} if "number" in allowed else set())
    for branch in out[key]:
        kinds = _types(_resolve(branch, root))
        if kinds is None or not kinds <= allowed:
            return
    del out["type"]


_OPEN_ENDED = {"additionalProperties", "unevaluatedProperties", "additionalItems",
               "unevaluatedItems", "$ref"}


def _merge_all_of(out: dict) -> None:
    """``allOf`` branches whose keywords the schema does not already have merged into it
    (exact where no keyword reads another's: none of ``additionalProperties`` and the like on
    either side), so the compiler has nothing to intersect."""
    if _OPEN_ENDED & set(out):
        return
    kept = []
    for branch in out["allOf"]:
        if (isinstance(branch, dict) and not _OPEN_ENDED & set(branch)
                and all(k not in out or out[k] == v for k, v in branch.items())):
            out.update(branch)
        else:
            kept.append(branch)
    if kept:
        out["allOf"] = kept
    else:
        del out["allOf"]


def _resolve(branch: Any, root: dict) -> Any:
    if not (isinstance(branch, dict) and set(branch) == {"$ref"}
            and isinstance(branch["$ref"], str) and branch["$ref"].startswith("#/")):
        return branch
    target: Any = root
    for part in branch["$ref"][2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            return branch
        target = target[part]
    if isinstance(target, dict) and set(target) == {"$ref"}:
        return branch  # a reference to a reference: left to the compiler
    return target


def _rewrite(schema: Any, old_draft: bool) -> Any:
    if not isinstance(schema, dict):
        return schema
    enforceable_schema = functools.partial(_rewrite, old_draft=old_draft)
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = enforceable_schema(out[key])
    for key in (*_LIST, "items"):  # items: a list in drafts 4-7's tuple form
        if isinstance(out.get(key), list):
            out[key] = [enforceable_schema(s) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: enforceable_schema(s) for name, s in out[key].items()}
    if isinstance(out.get("dependencies"), dict):
        out["dependencies"] = {k: enforceable_schema(v) for k, v in out["dependencies"].items()}
    _ref_siblings(out, old_draft)
    _format(out)
    _dependencies(out)
    _if_then_else(out)
    _unique_items(out)
    if "not" in out:
        negated = negation(out["not"])
        if negated is False:
            return False
        if negated is not None:
            del out["not"]
            _add_all_of(out, negated)
    return out


def negation(schema: Any) -> dict | bool | None:
    """A schema exactly equal to ``not schema`` in the forms the module names, else None."""
    if schema is True or schema == {}:
        return False
    if schema is False:
        return {}
    if not isinstance(schema, dict):
        return None
    keys = set(schema) - _ANNOTATIONS
    if keys == {"required"} and isinstance(schema["required"], list) and schema["required"]:
        names = schema["required"]
        absent = [{"properties": {n: False}} for n in names]
        return absent[0] if len(absent) == 1 else {"anyOf": absent}
    if keys == {"anyOf"} and isinstance(schema["anyOf"], list):  # none of them
        parts = [negation(s) for s in schema["anyOf"]]
        return None if any(p is None for p in parts) else _all_of(parts)
    if keys == {"allOf"} and isinstance(schema["allOf"], list):  # not every one of them
        parts = [negation(s) for s in schema["allOf"]]
        return None if any(p is None for p in parts) else {"anyOf": parts}
    if keys == {"type"}:
        listed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if "integer" in listed and "number" not in listed:
            return None  # "a number that is not an integer" has no grammar form here
        others = [t for t in _TYPES if t not in listed]
        return {"type": others} if others else False
    return None


def _all_of(parts: list) -> dict | bool:
    if any(p is False for p in parts):
        return False
    parts = [p for p in parts if p is not True and p != {}]
    return parts[0] if len(parts) == 1 else {"allOf": parts} if parts else {}


def _add_all_of(out: dict, schema: Any) -> None:
    if schema == {} or schema is True:
        return
    out["allOf"] = [*out.get("allOf", []), schema]


def _ref_siblings(out: dict, old_draft: bool) -> None:
    """``$ref`` beside other keywords (llguidance refuses that on a recursive reference): in
    drafts 3-7 a ``$ref``'s siblings are ignored, so they go; in later drafts annotations go
    and constraints become ``allOf: [{"$ref"}, {the rest}]``. Both exact."""
    if "$ref" not in out or len(out) == 1:
        return
    kept = {k: v for k, v in out.items() if k in _IN_PLACE}  # what a pointer may address
    rest = {} if old_draft else {k: v for k, v in out.items() if k != "$ref" and k not in
                                 _ANNOTATIONS and k not in _IN_PLACE and k != "$schema"}
    ref = out["$ref"]
    out.clear()
    out.update(kept)
    if rest:
        out["allOf"] = [{"$ref": ref}, rest]
    else:
        out["$ref"] = ref


def _format(out: dict) -> None:
    fmt = out.get("format")
    if not isinstance(fmt, str) or fmt in _FORMATS:
        return
    if fmt in _NARROWER_FORMAT:
        out["format"] = _NARROWER_FORMAT[fmt]
    elif fmt in _FORMAT_PATTERN and "pattern" not in out:
        del out["format"]
        out["pattern"] = _FORMAT_PATTERN[fmt]
    else:
        del out["format"]


def _dependencies(out: dict) -> None:
    """dependencies / dependentRequired / dependentSchemas as anyOf pairs (exact)."""
    rules = []
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        value = out.get(key)
        if not isinstance(value, dict):
            continue
        for name, then in value.items():
            if isinstance(then, list):
                present = {"required": [name, *then]}
            elif isinstance(then, dict | bool):
                present = _all_of([{"required": [name]}, then])
            else:
                continue
            rules.append({"anyOf": [{"properties": {name: False}}, present]})
        del out[key]
    for rule in rules:
        _add_all_of(out, rule)


def _if_then_else(out: dict) -> None:
    if "if" not in out:
        return
    condition, then, other = out.pop("if"), out.pop("then", None), out.pop("else", None)
    if then is None and other is None:
        return
    taken = _all_of([condition, then if then is not None else {}])
    negated = negation(condition)
    if negated is None:
        _add_all_of(out, taken)  # narrower: the "if" branch only
        return
    otherwise = _all_of([negated, other if other is not None else {}])
    _add_all_of(out, {"anyOf": [taken, otherwise]})


def _unique_items(out: dict) -> None:
    if out.get("uniqueItems") is not True:
        return
    if isinstance(out.get("maxItems"), int) and out["maxItems"] <= 1:
        del out["uniqueItems"]
    elif not isinstance(out.get("minItems"), int) or out["minItems"] <= 1:
        del out["uniqueItems"]
        out["maxItems"] = 1

"""Do structured answers finish as valid JSON? (issue 17, row K): prints figures, asserts nothing.

Twelve ordinary JSON schemas, written as users write them (no ``additionalProperties``, not
every property required), each asked once greedy and once sampled (temperature 1, seed 1) of the
embedded SmolLM2 model within ``--max-tokens``, as one offline batch per mode:

* ``strict=False``: the schema as written (open objects, whitespace bounded per gap), which is
  what every request got before ``strict`` was honoured;
* ``strict=True``: objects closed and whitespace fixed (radixserve/structured/strict_schema.py;
  the server's default, ``--structured-strict true``).

An answer is valid when it finished on its own ("stop", not cut at max_tokens), parses, and
validates against the schema as written (jsonschema, draft 2020-12).

Usage: .venv/bin/python benchmarks/structured_validity.py [--max-tokens 200] [--show]
"""

from __future__ import annotations

import argparse
import json
import time

import jsonschema

from radixserve import LLM, SamplingParams, StructuredOutputsParams

_NAME = {"type": "string"}
_INT = {"type": "integer"}
SCHEMAS: list[tuple[str, str, dict]] = [
    ("person", "Describe a person as JSON with a name and an age.",
     {"type": "object", "properties": {"name": _NAME, "age": _INT}, "required": ["name", "age"]}),
    ("book", "Give me a book as JSON: title, author and year.",
     {"type": "object", "properties": {"title": _NAME, "author": _NAME, "year": _INT}}),
    ("weather", "Report the weather in Paris as JSON.",
     {"type": "object", "properties": {"city": _NAME, "temperature_c": {"type": "number"},
                                       "condition": {"enum": ["sunny", "cloudy", "rain"]}},
      "required": ["city", "temperature_c", "condition"]}),
    ("address", "Give me a postal address as JSON.",
     {"type": "object", "properties": {"street": _NAME, "city": _NAME, "zip": _NAME,
                                       "country": _NAME}, "required": ["street", "city"]}),
    ("product", "Describe a product in a shop as JSON with its name, price and tags.",
     {"type": "object", "properties": {"name": _NAME, "price": {"type": "number"},
                                       "tags": {"type": "array", "items": _NAME}},
      "required": ["name", "price"]}),
    ("user", "Give me a user account as JSON: username, email, active flag.",
     {"type": "object", "properties": {"username": _NAME, "email": _NAME,
                                       "active": {"type": "boolean"}},
      "required": ["username", "email", "active"]}),
    ("order", "Give me an order as JSON with an id and a list of items with quantities.",
     {"type": "object", "properties": {"id": _INT, "items": {"type": "array", "items": {
         "type": "object", "properties": {"name": _NAME, "quantity": _INT},
         "required": ["name", "quantity"]}}}, "required": ["id", "items"]}),
    ("event", "Describe a meeting as JSON with a title, a date and attendees.",
     {"type": "object", "properties": {"title": _NAME, "date": _NAME,
                                       "attendees": {"type": "array", "items": _NAME}},
      "required": ["title", "date"]}),
    ("company", "Describe a company as JSON with its name and headquarters.",
     {"type": "object", "properties": {"name": _NAME, "headquarters": {
         "type": "object", "properties": {"city": _NAME, "country": _NAME}}},
      "required": ["name", "headquarters"]}),
    ("movie", "Give me a movie as JSON: title, year, rating out of 10.",
     {"type": "object", "properties": {"title": _NAME, "year": _INT,
                                       "rating": {"type": "number"}},
      "required": ["title", "year", "rating"]}),
    ("recipe", "Give me a recipe as JSON with a name and its ingredients.",
     {"type": "object", "properties": {"name": _NAME, "ingredients": {
         "type": "array", "items": _NAME}}, "required": ["name", "ingredients"]}),
    ("task", "Give me a to-do task as JSON with a title, a priority and a done flag.",
     {"type": "object", "properties": {"title": _NAME, "priority": {
         "enum": ["low", "medium", "high"]}, "done": {"type": "boolean"}},
      "required": ["title", "priority", "done"]}),
]
MODES = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=1.0, seed=1)}


def is_valid(output, schema: dict) -> bool:
    if output.finish_reason != "stop":
        return False
    try:
        jsonschema.validate(json.loads(output.text), schema,
                            cls=jsonschema.Draft202012Validator)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def run(llm: LLM, strict: bool, max_tokens: int, show: bool) -> dict[str, int]:
    conversations, params, rows = [], [], []
    for mode, kwargs in MODES.items():
        for name, prompt, schema in SCHEMAS:
            conversations.append([{"role": "user", "content": prompt}])
            params.append(SamplingParams(max_tokens=max_tokens, **kwargs,
                                         structured_outputs=StructuredOutputsParams(
                                             json=schema, strict=strict)))
            rows.append((mode, name, schema))
    t0 = time.perf_counter()
    outs = llm.chat(conversations, params)
    elapsed = time.perf_counter() - t0
    valid = {mode: 0 for mode in MODES}
    num_tokens = 0
    for (mode, name, schema), out in zip(rows, outs):
        output = out.outputs[0]
        num_tokens += len(output.token_ids)
        ok = is_valid(output, schema)
        valid[mode] += ok
        if show:
            print(f"  strict={strict} {mode:7} {name:8} {'ok ' if ok else 'BAD'} "
                  f"{len(output.token_ids):4} tok {output.finish_reason:6} {output.text[:90]!r}")
    print(f"strict={str(strict):5}: valid greedy {valid['greedy']}/{len(SCHEMAS)}, sampled "
          f"{valid['sampled']}/{len(SCHEMAS)}, total {sum(valid.values())}/{len(rows)}; "
          f"{num_tokens} output tokens in {elapsed:.1f} s")
    return valid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--show", action="store_true", help="print every answer")
    args = parser.parse_args()
    llm = LLM(show_progress=False)
    for strict in (False, True):
        run(llm, strict, args.max_tokens, args.show)


if __name__ == "__main__":
    main()

"""Structured output on the embedded model through the offline API, checked exactly.

Every constrained output must parse and be in its language (JSON schema validated with
jsonschema and a format checker, regexes with ``re.fullmatch``, grammars with a small
recursive-descent checker) and finish with "stop". The work is batched: each module fixture
runs one ``llm.chat`` / ``llm.generate`` call and the tests check its rows.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import uuid

import jsonschema
import pytest

from radixserve import SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.slow  # loads the embedded model


def _params(temperature: float = 0.0, max_tokens: int = 200, seed: int | None = None,
            **constraint) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed,
                          structured_outputs=StructuredOutputsParams(**constraint))


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# -- format checking -----------------------------------------------------------------------

# Draft 2020-12's checker (email, date, uuid, ipv4, ...), plus the formats jsonschema checks
# only with optional packages that are not installed (date-time, time, hostname).
FORMATS = jsonschema.FormatChecker(())
FORMATS.checkers.update(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
_RFC3339_TIME = (r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?"
                 r"([Zz]|[+-][0-9]{2}:[0-9]{2})")


@FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value) -> bool:
    if not isinstance(value, str):
        return True
    date, sep, time = value.partition(value[10:11])
    if sep not in ("T", "t", " ") or not re.fullmatch(_RFC3339_TIME, time):
        return False
    datetime.date.fromisoformat(date)
    datetime.datetime.fromisoformat(value.replace("z", "Z"))
    return True


@FORMATS.checks("time", raises=ValueError)
def _is_time(value) -> bool:
    return not isinstance(value, str) or bool(re.fullmatch(_RFC3339_TIME, value))


@FORMATS.checks("hostname")
def _is_hostname(value) -> bool:
    label = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    return not isinstance(value, str) or (
        len(value) <= 253 and bool(re.fullmatch(rf"{label}(\.{label})*", value)))


def _formats_in(schema) -> set[str]:
    if isinstance(schema, dict):
        found = {schema["format"]} if isinstance(schema.get("format"), str) else set()
        return found.union(*(_formats_in(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_formats_in(v) for v in schema))
    return set()


def assert_valid_json(output, schema) -> object:
    """The output finished on its own, parses, and validates (formats included)."""
    assert output.finish_reason == "stop", (output.finish_reason, output.text)
    value = json.loads(output.text)
    schema = json.loads(schema) if isinstance(schema, str) else schema
    unchecked = _formats_in(schema) - set(FORMATS.checkers)
    assert not unchecked, f"no checker for formats {unchecked}"
    jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator,
                        format_checker=FORMATS)
    return value


# -- the JSON schemas, easiest first ------------------------------------------------------

NAME = {"type": "string", "minLength": 1, "maxLength": 20}
SHORT = {"type": "string", "maxLength": 30}


def _obj(properties: dict, required: list[str] | None = None, **extra) -> dict:
    """A closed object schema (no other properties: an open one lets the model add keys
    forever); all properties required unless ``required`` says otherwise."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required,
            "additionalProperties": False, **extra}


def _int(lo: int, hi: int, **extra) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi, **extra}


def _str(**extra) -> dict:
    return {"type": "string", **extra}


SCHEMAS: list[tuple[str, str, dict | str]] = [
    ("flat", "Give me a JSON object describing a person with a name and an age.",
     _obj({"name": NAME, "age": _int(0, 120)})),
    ("boolean", "Give me a JSON object saying whether a user account is active and verified.",
     _obj({"active": {"type": "boolean"}, "verified": {"type": "boolean"}})),
    ("optional", "Give me a JSON object for a book with a title and maybe a subtitle.",
     _obj({"title": NAME, "subtitle": SHORT}, required=["title"])),
    ("null", "Give me a JSON object for a search that found no result.",
     _obj({"query": NAME, "result": {"type": "null"}})),
    ("nullable", "Give me a JSON object with a nickname that may be null.",
     _obj({"nickname": {"type": ["string", "null"], "maxLength": 15}})),
    ("integer_range", "Give me a JSON object with a dice roll and a month number.",
     _obj({"roll": _int(1, 6), "month": _int(1, 12)})),
    ("exclusive", "Give me a JSON object with a product price and a discount percentage.",
     _obj({"price": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
           "discount": {"type": "integer", "minimum": 0, "exclusiveMaximum": 100}})),
    ("negative", ("Give me a JSON object with the lowest and highest temperature in Oslo in "
                  "January, in Celsius."),
     _obj({"low": _int(-50, 50), "high": _int(-50, 50)})),
    ("enum", "Give me a JSON object with a traffic light color and a size.",
     _obj({"color": {"enum": ["red", "yellow", "green"]},
           "size": _str(enum=["small", "medium", "large"])})),
    ("const", "Give me a JSON object for an API response of version 1.0.",
     _obj({"version": {"const": "1.0"}, "code": {"const": 200}, "message": SHORT})),
    ("min_max_length", "Give me a JSON object with a username and a PIN code.",
     _obj({"username": _str(minLength=3, maxLength=8), "pin": _str(pattern="^[0-9]{4}$")})),
    ("pattern", "Give me a JSON object for a flight with its code like ABC-1234.",
     _obj({"code": _str(pattern="^[A-Z]{3}-[0-9]{4}$"),
           "gate": _str(pattern="^[A-F][0-9]{1,2}$")})),
    ("email", "Give me a JSON object for a contact with a name and an email address.",
     _obj({"name": NAME, "email": _str(format="email", maxLength=40)})),
    ("date", "Give me a JSON object for an event with a title and its date.",
     _obj({"title": NAME, "date": _str(format="date")})),
    ("uuid", "Give me a JSON object for an order with an id (a UUID) and a quantity.",
     _obj({"id": _str(format="uuid"), "quantity": _int(1, 99)})),
    ("date_time", "Give me a JSON object for a log entry with a timestamp and a level.",
     _obj({"timestamp": _str(format="date-time"), "level": {"enum": ["debug", "info", "error"]}})),
    ("ipv4_time", ("Give me a JSON object for a server with its IP address, host name and "
                   "daily backup time."),
     _obj({"ip": _str(format="ipv4"), "host": _str(format="hostname", maxLength=30),
           "backup": _str(format="time")})),
    ("nested", "Give me a JSON object for a person with a name and a home address.",
     _obj({"name": NAME, "address": _obj({"street": SHORT, "city": NAME,
                                          "zip": _str(pattern="^[0-9]{5}$")})})),
    ("deep", "Give me a JSON object for a company with its headquarters location.",
     _obj({"company": _obj({"name": NAME, "hq": _obj({"city": NAME, "geo": _obj({
         "lat": {"type": "number", "minimum": -90, "maximum": 90},
         "lon": {"type": "number", "minimum": -180, "maximum": 180}})})})})),
    ("string_array", "Give me a JSON object with a list of two to four fruits.",
     _obj({"fruits": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 4}})),
    ("exact_array", "Give me a JSON object with exactly three lottery numbers.",
     _obj({"numbers": {"type": "array", "items": _int(1, 49), "minItems": 3, "maxItems": 3}})),
    ("enum_array", "Give me a JSON object listing the days a shop is open.",
     _obj({"days": {"type": "array", "minItems": 1, "maxItems": 7, "items": {
         "enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]}}})),
    ("matrix", "Give me a JSON object with a 2x2 matrix of small integers.",
     _obj({"matrix": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
         "type": "array", "minItems": 2, "maxItems": 2, "items": _int(-9, 9)}}})),
    ("object_array", "Give me a JSON object with a shopping list of items and quantities.",
     _obj({"items": {"type": "array", "minItems": 1, "maxItems": 3,
                     "items": _obj({"item": NAME, "qty": _int(1, 20)})}})),
    ("top_array", "Give me a JSON array of two or three colors with their hex codes.",
     {"type": "array", "minItems": 2, "maxItems": 3,
      "items": _obj({"name": NAME, "hex": _str(pattern="^#[0-9a-f]{6}$")})}),
    ("top_integer", "How many legs does a spider have? Answer with a JSON number.",
     _int(0, 100)),
    ("top_enum", "Is the sky blue? Answer with a JSON string: yes or no.",
     _str(enum=["yes", "no"])),
    ("any_of", "Give me a JSON object with an id that is a number or a short code.",
     _obj({"id": {"anyOf": [_int(0, 9999), _str(pattern="^[a-z]{2}[0-9]{2}$")]}})),
    ("one_of", "Give me a JSON object describing a shape: a circle or a square.",
     _obj({"shape": {"oneOf": [_obj({"kind": {"const": "circle"}, "radius": _int(1, 100)}),
                               _obj({"kind": {"const": "square"}, "side": _int(1, 100)})]}})),
    ("all_of", "Give me a JSON object for an employee with an id and a department.",
     _obj({"id": _int(1, 999), "department": NAME}, required=[],
          allOf=[{"required": ["id"]}, {"required": ["department"]}])),
    ("ref_defs", ("Give me a JSON object for a shipment with a sender and a receiver, each "
                  "with a name and a city."),
     {"$defs": {"party": _obj({"name": NAME, "city": NAME})},
      **_obj({"sender": {"$ref": "#/$defs/party"}, "receiver": {"$ref": "#/$defs/party"}})}),
    ("ref_chain", ("Give me a JSON object for a small tree with a root, one or two branches, "
                   "and one or two leaves on each branch."),
     {"$defs": {"leaf": _obj({"name": NAME}),
                "branch": _obj({"name": NAME, "leaves": {
                    "type": "array", "minItems": 1, "maxItems": 2,
                    "items": {"$ref": "#/$defs/leaf"}}})},
      **_obj({"name": NAME, "branches": {"type": "array", "minItems": 1, "maxItems": 2,
                                         "items": {"$ref": "#/$defs/branch"}}})}),
    # truly recursive: the root needs one node, whose "next" may be another node or null
    # (a recursive tree with free depth makes the greedy model nest until max_tokens)
    ("recursive", ("Give me a JSON linked list holding the values 1, 2 and 3; the last node's "
                   "next is null."),
     {"$defs": {"node": _obj({"value": _int(0, 99), "next": {
         "anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}})},
      **_obj({"value": _int(0, 99), "next": {"$ref": "#/$defs/node"}})}),
    ("multiple_of", "Give me a JSON object with a number of minutes that is a multiple of 15.",
     _obj({"minutes": _int(0, 120, multipleOf=15)})),
    ("as_text", "Give me a JSON object for a city with its name and its population.",
     json.dumps(_obj({"city": NAME, "population": _int(0, 50_000_000)}))),
    ("wide", "Give me a JSON object for a laptop in a shop's inventory.",
     _obj({"sku": _str(pattern="^[A-Z]{2}[0-9]{4}$"), "brand": NAME, "model": NAME,
           "ram_gb": {"enum": [8, 16, 32, 64]},
           "price": {"type": "number", "minimum": 100, "maximum": 5000},
           "in_stock": {"type": "boolean"},
           "tags": {"type": "array", "items": _str(maxLength=12), "maxItems": 3},
           "released": _str(format="date")})),
]
SCHEMA_IDS = [name for name, _, _ in SCHEMAS]


@pytest.fixture(scope="module")
def greedy_json(embedded_llm):
    """All the schemas, greedy, as one batch: name -> CompletionOutput."""
    params = [_params(max_tokens=250, json=schema) for _, _, schema in SCHEMAS]
    outs = embedded_llm.chat([_user(prompt) for _, prompt, _ in SCHEMAS], params)
    return {name: out.outputs[0] for (name, _, _), out in zip(SCHEMAS, outs)}


@pytest.mark.parametrize("name", SCHEMA_IDS)
def test_json_schema_greedy(embedded_llm, greedy_json, name):
    schema = {n: s for n, _, s in SCHEMAS}[name]
    output = greedy_json[name]
    assert_valid_json(output, schema)
    # fast-forwarded tokens are real output tokens: the text is exactly their decoding
    assert output.text == embedded_llm.get_tokenizer().decode(output.token_ids)


def test_json_schema_specifics(greedy_json):
    """What jsonschema does not check on its own."""
    assert re.fullmatch(r"[^@\s]+@[^@\s]+", json.loads(greedy_json["email"].text)["email"])
    assert uuid.UUID(json.loads(greedy_json["uuid"].text)["id"])
    ipaddress.IPv4Address(json.loads(greedy_json["ipv4_time"].text)["ip"])
    shape = json.loads(greedy_json["one_of"].text)["shape"]
    assert set(shape) in ({"kind", "radius"}, {"kind", "side"})


# -- sampled constrained rows mixed with unconstrained ones -------------------------------

SAMPLED_SCHEMAS = ["flat", "enum", "nested", "string_array", "object_array", "one_of",
                   "ref_defs", "date", "uuid", "pattern", "ref_chain"]
SEEDS = [1, 2, 3]
FREE_PROMPTS = ["Write a haiku about the sea.", "What is the capital of France?",
                "Count from one to five.", "Name three colors."]
FREE_PARAMS = [SamplingParams(temperature=0.0, max_tokens=24),
               SamplingParams(temperature=0.0, max_tokens=24),
               SamplingParams(temperature=1.0, seed=7, max_tokens=24),
               SamplingParams(temperature=0.0, max_tokens=24)]


@pytest.fixture(scope="module")
def mixed_batch(embedded_llm):
    """Constrained rows (temperature 1, three seeds per schema) interleaved with unconstrained
    ones in one batch; returns (constrained [(name, seed, output)], unconstrained outputs)."""
    by_name = {name: (prompt, schema) for name, prompt, schema in SCHEMAS}
    rows = []  # (conversation, params, tag)
    free = iter(range(len(FREE_PROMPTS)))
    for k, (name, seed) in enumerate((n, s) for n in SAMPLED_SCHEMAS for s in SEEDS):
        prompt, schema = by_name[name]
        rows.append((_user(prompt), _params(1.0, 250, seed, json=schema), (name, seed)))
        if k % 8 == 3 and (i := next(free, None)) is not None:
            rows.append((_user(FREE_PROMPTS[i]), FREE_PARAMS[i], i))
    rows += [(_user(FREE_PROMPTS[i]), FREE_PARAMS[i], i) for i in free]
    outs = embedded_llm.chat([r[0] for r in rows], [r[1] for r in rows])
    constrained = [(*tag, out.outputs[0]) for (_, _, tag), out in zip(rows, outs)
                   if isinstance(tag, tuple)]
    unconstrained = {tag: out.outputs[0] for (_, _, tag), out in zip(rows, outs)
                     if isinstance(tag, int)}
    return constrained, [unconstrained[i] for i in range(len(FREE_PROMPTS))]


def test_sampled_json_validates(mixed_batch):
    by_name = {name: schema for name, _, schema in SCHEMAS}
    constrained, _ = mixed_batch
    assert len(constrained) == len(SAMPLED_SCHEMAS) * len(SEEDS)
    for name, seed, output in constrained:
        try:
            assert_valid_json(output, by_name[name])
        except Exception as exc:
            raise AssertionError(f"{name} seed {seed}: {output.text!r}") from exc
    # the seeds matter: sampling is not collapsed onto one output per schema
    texts = {}
    for name, _, output in constrained:
        texts.setdefault(name, set()).add(output.text)
    assert sum(len(t) > 1 for t in texts.values()) >= len(SAMPLED_SCHEMAS) // 2, texts


def test_mask_does_not_leak_onto_unconstrained_rows(embedded_llm, mixed_batch):
    _, mixed = mixed_batch
    alone = embedded_llm.chat([_user(p) for p in FREE_PROMPTS], FREE_PARAMS)
    assert [o.token_ids for o in mixed] == [r.outputs[0].token_ids for r in alone]
    # they are free text, not JSON
    assert not any(o.text.lstrip().startswith(("{", "[")) for o in mixed)


def test_seeded_constrained_row_is_batch_independent(embedded_llm, mixed_batch):
    constrained, _ = mixed_batch
    name, seed, in_batch = next(row for row in constrained if row[:2] == ("nested", 2))
    prompt, schema = {n: (p, s) for n, p, s in SCHEMAS}[name]
    alone = embedded_llm.chat(_user(prompt), _params(1.0, 250, seed, json=schema))[0]
    assert alone.outputs[0].token_ids == in_batch.token_ids


# -- regex --------------------------------------------------------------------------------

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
REGEXES = [
    ("date", "What is the date of the moon landing? Answer as YYYY-MM-DD.",
     r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
    ("email", "Give me an example email address.",
     r"[a-z0-9._]{1,20}@[a-z0-9]{1,15}\.(com|org|net)"),
    ("phone", "Give me a US phone number.", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("ipv4", "Give me the IP address of a home router.", rf"{_OCTET}(\.{_OCTET}){{3}}"),
    ("words", "List some fruits, separated by spaces.",
     r"(apple|banana|cherry|mango)( (apple|banana|cherry|mango)){0,4}"),
    ("fixed", "Say the magic words.", r"open sesame, please open the door"),
]


@pytest.fixture(scope="module")
def regex_outputs(embedded_llm):
    """(name, seed or None, output) for every regex greedy and at temperature 1 (3 seeds)."""
    rows = [(name, prompt, pattern, None) for name, prompt, pattern in REGEXES]
    rows += [(name, prompt, pattern, seed) for name, prompt, pattern in REGEXES
             for seed in SEEDS]
    params = [_params(0.0 if seed is None else 1.0, 60, seed, regex=pattern)
              for _, _, pattern, seed in rows]
    outs = embedded_llm.chat([_user(prompt) for _, prompt, _, _ in rows], params)
    return [(name, seed, out.outputs[0]) for (name, _, _, seed), out in zip(rows, outs)]


def test_regex_outputs_fullmatch(regex_outputs):
    patterns = {name: pattern for name, _, pattern in REGEXES}
    for name, seed, output in regex_outputs:
        assert output.finish_reason == "stop", (name, seed, output.text)
        assert re.fullmatch(patterns[name], output.text), (name, seed, output.text)
        if name == "ipv4":
            ipaddress.IPv4Address(output.text)
    assert {o.text for n, _, o in regex_outputs if n == "fixed"} == {
        "open sesame, please open the door"}


def test_fast_forward_skips_forwards_for_forced_tokens(embedded_llm, monkeypatch):
    """A regex that allows one text: after its first token the rest is forced and appended
    without a forward each."""
    runner = embedded_llm.engine.runner
    calls = []
    execute = runner.execute

    def counting(*args, **kwargs):
        calls.append(1)
        return execute(*args, **kwargs)

    monkeypatch.setattr(runner, "execute", counting)
    text = "the quick brown fox jumps over the lazy dog again and again"
    out = embedded_llm.chat(_user("Say something."), _params(regex=re.escape(text)))[0]
    output = out.outputs[0]
    assert output.text == text and output.finish_reason == "stop"
    assert len(output.token_ids) >= 10
    assert len(calls) <= 3 < len(output.token_ids)


# -- choice -------------------------------------------------------------------------------

CHOICES = [
    ("Is this review positive or negative: 'I loved it, best film of the year!'",
     ["positive", "negative", "neutral"]),
    ("Do you like pizza?", ["yes", "yes, definitely", "no", "not really"]),
    ("Pick a programming language.", ["Python", "Rust", "C++", "JavaScript", "Go"]),
]


def test_choice_is_exactly_one_option(embedded_llm):
    rows = [(prompt, choices, None) for prompt, choices in CHOICES]
    rows += [(prompt, choices, seed) for prompt, choices in CHOICES for seed in SEEDS]
    params = [_params(0.0 if seed is None else 1.0, 30, seed, choice=choices)
              for _, choices, seed in rows]
    outs = embedded_llm.chat([_user(prompt) for prompt, _, _ in rows], params)
    for (prompt, choices, seed), out in zip(rows, outs):
        output = out.outputs[0]
        assert output.finish_reason == "stop", (prompt, seed, output.text)
        assert output.text in choices, (prompt, seed, output.text)
    assert outs[0].outputs[0].text == "positive"


# -- grammars -----------------------------------------------------------------------------

LARK_ARITH = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: NUMBER | "(" expr ")"
NUMBER: /[0-9]{1,3}/
"""

GBNF_ARITH = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9] | [0-9] [0-9] | [0-9] [0-9] [0-9]
"""

# A GBNF command language with spaces, words and an optional part.
GBNF_COMMAND = r"""
root ::= verb " " object (" " place)?
verb ::= "open" | "close" | "lock"
object ::= "the " ("door" | "window" | "box")
place ::= "in the " ("kitchen" | "garage")
"""


class _Arith:
    """Recursive-descent recognizer of LARK_ARITH / GBNF_ARITH (no whitespace)."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def accepts(self) -> bool:
        try:
            self.expr()
        except SyntaxError:
            return False
        return self.pos == len(self.text)

    def peek(self) -> str:
        return self.text[self.pos:self.pos + 1]

    def expr(self) -> None:
        self.term()
        while self.peek() in ("+", "-"):
            self.pos += 1
            self.term()

    def term(self) -> None:
        self.factor()
        while self.peek() in ("*", "/"):
            self.pos += 1
            self.factor()

    def factor(self) -> None:
        if self.peek() == "(":
            self.pos += 1
            self.expr()
            if self.peek() != ")":
                raise SyntaxError(self.pos)
            self.pos += 1
            return
        digits = re.match(r"[0-9]{1,3}", self.text[self.pos:])
        if digits is None:
            raise SyntaxError(self.pos)
        self.pos += digits.end()


def test_arith_checker_itself():
    for good in ["1", "12+3", "(1+2)*3", "((7))", "1-2-3/4*567", "(1)+(2*(3-4))"]:
        assert _Arith(good).accepts(), good
    for bad in ["", "1+", "(1+2", "1++2", "1234", "1 + 2", "()", "1)", "a"]:
        assert not _Arith(bad).accepts(), bad


def test_grammars(embedded_llm):
    prompts = [("Write a short arithmetic expression using numbers, +, -, * and /, like "
                "(3+4)*2. Only the expression."),
               "What is 12 times 7? Write it as an expression.",
               "Write a command for a smart home."]
    rows = [(prompts[0], LARK_ARITH, None), (prompts[1], LARK_ARITH, None),
            (prompts[0], GBNF_ARITH, None), (prompts[1], GBNF_ARITH, None),
            (prompts[2], GBNF_COMMAND, None)]
    rows += [(prompts[0], g, seed) for g in (LARK_ARITH, GBNF_ARITH) for seed in SEEDS]
    rows += [(prompts[2], GBNF_COMMAND, seed) for seed in SEEDS]
    params = [_params(0.0 if seed is None else 1.0, 80, seed, grammar=g) for _, g, seed in rows]
    outs = embedded_llm.chat([_user(prompt) for prompt, _, _ in rows], params)
    command = re.compile(r"(open|close|lock) the (door|window|box)( in the (kitchen|garage))?")
    for (prompt, grammar, seed), out in zip(rows, outs):
        output = out.outputs[0]
        assert output.finish_reason == "stop", (grammar, seed, output.text)
        if grammar is GBNF_COMMAND:
            assert command.fullmatch(output.text), (seed, output.text)
        else:
            assert _Arith(output.text).accepts(), (grammar, seed, output.text)


def test_json_object(embedded_llm):
    # (any object is allowed, so only prompts that lead this model to a small one: asked for
    # "a JSON object describing a cat" it nests keys until max_tokens)
    prompts = ['Give me a JSON object with the key "ok" set to true.',
               "Give me a JSON object with a person's name and age.",
               "Describe the weather today as JSON."]
    rows = [(p, None) for p in prompts] + [(prompts[0], seed) for seed in SEEDS]
    params = [_params(0.0 if seed is None else 1.0, 200, seed, json_object=True)
              for _, seed in rows]
    outs = embedded_llm.chat([_user(p) for p, _ in rows], params)
    for (prompt, seed), out in zip(rows, outs):
        output = out.outputs[0]
        assert output.finish_reason == "stop", (prompt, seed, output.text)
        assert isinstance(json.loads(output.text), dict), (prompt, seed, output.text)
    assert json.loads(outs[0].outputs[0].text) == {"ok": True}


# -- determinism, batch invariance and the compile cache ---------------------------------

def test_greedy_constrained_alone_batched_and_cached(embedded_llm, monkeypatch):
    manager = embedded_llm.engine.structured
    compiled = []
    compile_ = manager.backend.compile

    def counting(spec):
        compiled.append(spec)
        return compile_(spec)

    monkeypatch.setattr(manager.backend, "compile", counting)
    # a schema no other test uses, so its first request compiles it
    schema = _obj({"planet": NAME, "moons": _int(0, 200), "rings": {"type": "boolean"}})
    conv = _user("Give me a JSON object about a planet of the solar system.")
    params = _params(json=schema)
    first = embedded_llm.chat(conv, params)[0].outputs[0]
    assert_valid_json(first, schema)
    assert len(compiled) == 1
    by_name = {n: (p, s) for n, p, s in SCHEMAS}
    others = [(_user(by_name[n][0]), _params(1.0, 100, seed, json=by_name[n][1]))
              for n, seed in zip(SAMPLED_SCHEMAS[:6], range(10, 99))]
    others.insert(3, (_user("Tell me a joke."), SamplingParams(temperature=1.0, max_tokens=30)))
    batch = [c for c, _ in others[:2]] + [conv] + [c for c, _ in others[2:]]
    batch_params = [p for _, p in others[:2]] + [params] + [p for _, p in others[2:]]
    in_batch = embedded_llm.chat(batch, batch_params)[2].outputs[0]
    again = embedded_llm.chat(conv, params)[0].outputs[0]
    assert first.token_ids == in_batch.token_ids == again.token_ids
    assert first.text == in_batch.text == again.text
    assert params.structured_outputs.spec() not in compiled[1:]  # compiled once, then cached


# -- special tokens -----------------------------------------------------------------------

def test_free_strings_never_hold_special_tokens(embedded_llm):
    tok = embedded_llm.get_tokenizer()
    named = [tok.encode(t, add_special_tokens=False)
             for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")]
    assert all(len(ids) == 1 for ids in named), named
    special = {ids[0] for ids in named} | tok.all_special_ids
    schema = _obj({"transcript": _str(maxLength=200), "speaker": _str(maxLength=40)})
    prompts = [("Give me a JSON object with the transcript of a chat between a user and an "
                "assistant, with the chat markers <|im_start|> and <|im_end|> in it."),
               "Give me a JSON object whose transcript is the text <|endoftext|> repeated.",
               "Give me a JSON object with a conversation transcript."]
    # 240 characters of emoji can take ~700 tokens
    params = [_params(max_tokens=250, json=schema)] * 3 + [
        _params(1.0, 800, seed, json=schema) for seed in SEEDS]
    outs = embedded_llm.chat([_user(p) for p in prompts + prompts[:1] * 3], params)
    for out in outs:
        output = out.outputs[0]
        body = output.token_ids
        if body and body[-1] in tok.eos_token_ids:  # the grammar may end on eos
            body = body[:-1]
        assert not special & set(body), (output.token_ids, output.text)
        assert_valid_json(output, schema)


# -- invalid specs ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference(embedded_llm):
    schema = SCHEMAS[0][2]
    params = _params(json=schema)
    return params, embedded_llm.chat(_user(SCHEMAS[0][1]), params)[0].outputs[0].token_ids


@pytest.mark.parametrize("constraint, match", [
    ({"json": {"type": "objectx"}}, r"Invalid type: objectx"),
    ({"json": {"type": "object", "properties": {"a": {"type": "strin"}}}}, r"strin"),
    ({"regex": "[0-9"}, r"invalid regex.*unclosed character class"),
    ({"regex": "(ab"}, r"invalid regex"),
    ({"json": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True,
               "minItems": 2}}, r"Unimplemented keys: \[\"uniqueItems\"\]"),
    ({"json": {"type": "array", "contains": {"type": "integer"}}}, r"contains"),
    ({"json": {"not": {"type": "integer"}}}, r"Unimplemented keys: \[\"not\"\]"),
    ({"json": {"type": "string", "not": {"pattern": "^a"}}}, r"Unimplemented keys: \[\"not\"\]"),
    ({"json": {"$ref": "#/$defs/missing"}}, r"missing"),
    ({"json": {"allOf": [_obj({"a": NAME}), _obj({"b": NAME})]}}, r"Unsatisfiable schema"),
    ({"json": "{not json"}, r"not valid JSON"),
    ({"json": "[1, 2]"}, r"must be a JSON object"),
    ({"grammar": 'start: expr\nexpr: ( "a"'}, r"invalid grammar.*Expected token"),
    ({"grammar": "start: foo\n"}, r"unknown name.*foo"),
    ({"grammar": 'root ::= ( "a" '}, r"invalid grammar.*GBNF"),
    ({"grammar": 'root ::= "a" undefined-rule'}, r"invalid grammar.*undefined"),
])
def test_invalid_spec_raises_and_llm_keeps_working(embedded_llm, reference, constraint, match):
    params, expected = reference
    bad = _params(**constraint)
    match = "(?s)" + match  # (llguidance's messages span lines)
    with pytest.raises(ValueError, match=match):
        embedded_llm.chat(_user("Give me JSON."), bad)
    # in a batch with valid requests: nothing at all is queued
    with pytest.raises(ValueError, match=match):
        embedded_llm.generate(["Hello", "Give me JSON."], [params, bad])
    assert not embedded_llm.engine.has_unfinished_requests()
    assert embedded_llm.chat(_user(SCHEMAS[0][1]), params)[0].outputs[0].token_ids == expected


@pytest.mark.parametrize("kinds", [
    {"json": {"type": "object"}, "regex": "a"},
    {"choice": ["a"], "grammar": 'root ::= "a"'},
    {"regex": "a", "json_object": True},
    {},
    {"json_object": False},
])
def test_params_need_exactly_one_kind(kinds):
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams(**kinds)


@pytest.mark.parametrize("constraint, match", [
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", 1]}, "non-empty list of strings"),
    ({"regex": ""}, "non-empty string"),
    ({"grammar": ""}, "non-empty string"),
])
def test_params_reject_empty_specs(constraint, match):
    with pytest.raises(ValueError, match=match):
        StructuredOutputsParams(**constraint)


# -- max_tokens ---------------------------------------------------------------------------

def test_max_tokens_cuts_a_constrained_output(embedded_llm):
    schema = {"type": "array", "minItems": 50, "maxItems": 60,
              "items": {"type": "integer", "minimum": 0, "maximum": 9}}
    outs = embedded_llm.chat(
        [_user("Give me a JSON array of fifty digits.")] * 2,
        [_params(max_tokens=10, json=schema), _params(1.0, 10, 5, json=schema)])
    for out in outs:
        output = out.outputs[0]
        assert output.finish_reason == "length", output.text
        assert len(output.token_ids) == 10  # fast-forward never runs past max_tokens
        assert output.text.lstrip().startswith("[")
    # a fully forced output is cut at max_tokens too
    text = "the quick brown fox jumps over the lazy dog again and again"
    output = embedded_llm.chat(_user("Say something."),
                               _params(max_tokens=4, regex=re.escape(text)))[0].outputs[0]
    assert output.finish_reason == "length" and len(output.token_ids) == 4
    assert text.startswith(output.text)

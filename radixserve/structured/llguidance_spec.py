"""llguidance's view of a `GrammarSpec` without the tokenizer or torch: the grammar text and
the cheap validity check. The API process imports only this (not the engine-side backend,
which needs torch for its bitmasks)."""

from __future__ import annotations

import json

import llguidance

from radixserve.structured.backend import GrammarError
from radixserve.structured.params import GrammarSpec

_FORMATS = {"regex": "regex", "grammar": "grammar"}


# JSON whitespace between tokens is bounded: with free whitespace a model can pad forever (a
# greedy loop of newlines) and never close the object. A schema's own "x-guidance" wins.
# oneOf is compiled as anyOf (llguidance's approximation: a grammar cannot check that exactly
# one branch matches; real schemas' branches are nearly always disjoint).
_JSON_DEFAULTS = {"whitespace_pattern": r"[\n\t ]{0,16}", "coerce_one_of": True}


def grammar_text(spec: GrammarSpec) -> str:
    """llguidance's grammar for a spec; GrammarError if it cannot even be converted."""
    try:
        if spec.kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(spec.text,
                                                                 defaults=_JSON_DEFAULTS)
        if spec.kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(choice_lark(json.loads(spec.text)))
        return llguidance.grammar_from(_FORMATS[spec.kind], spec.text)
    except (ValueError, json.JSONDecodeError) as exc:
        raise GrammarError(f"invalid {spec.kind}: {exc}") from None


def choice_lark(choices: list[str]) -> str:
    """One terminal matching any of ``choices``: the lexer's automaton takes 50,000 strings in
    a fraction of a second, where one grammar rule per string (llguidance's own "choice")
    makes a parser row per alternative, beyond its 2,000-item limit from 2,000 choices on."""
    options = [c for c in dict.fromkeys(choices) if c]  # a terminal cannot be empty
    if not options:
        return 'start: ""'
    empty = ' | ""' if "" in choices else ""
    return f"start: CHOICE{empty}\nCHOICE: " + " | ".join(json.dumps(c) for c in options)


def validate_spec(spec: GrammarSpec) -> None:
    """GrammarError naming the problem if llguidance cannot take the spec (no tokenizer
    needed: syntax, schema keywords, regexes, grammar size)."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar_text(spec))
    if is_error:
        raise GrammarError(f"invalid {spec.kind}: {messages[0].strip()}")

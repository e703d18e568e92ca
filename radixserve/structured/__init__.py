"""Structured output: constraints (JSON schema, regex, choice, grammar) as token masks."""

from radixserve.structured.params import GrammarSpec, StructuredOutputsParams

__all__ = ["GrammarSpec", "StructuredOutputsParams"]

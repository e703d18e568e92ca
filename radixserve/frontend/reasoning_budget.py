"""A request's reasoning budget, decided in the API process and enforced by the engine.

Which budget a chat request gets (`BudgetPolicy.budget_for`), first that applies:

1. its own: ``thinking_token_budget`` (OpenAI chat extra param, vLLM's name; -1: no limit),
   Anthropic's ``thinking.budget_tokens``, Ollama's ``think: "low"|"medium"|"high"``
   (`THINK_LEVEL_BUDGETS`);
2. its ``reasoning_effort`` (chat, Responses ``reasoning.effort``, Anthropic
   ``output_config.effort``), only on a server started with ``--reasoning-effort-budgets``;
3. the server's ``--reasoning-budget`` (-1, the default: no limit).

`BudgetPolicy.apply` turns it into ``SamplingParams.thinking_token_budget`` plus the tags as
token ids (``thinking_tags``): the engine (core/reasoning_budget.py) then writes
``--reasoning-budget-message`` and the reasoning parser's end tag once the reasoning has that
many tokens. A prompt that already closed the block (thinking off) gets no budget.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.parsers.reasoning import ReasoningParser
from radixserve.sampling_params import SamplingParams, ThinkingTags
from radixserve.tokenizer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# Ollama's think levels, and the documented table for --reasoning-effort-budgets default
THINK_LEVEL_BUDGETS = {"low": 1024, "medium": 4096, "high": 16384}


def can_budget(parser) -> bool:
    """Whether the server's reasoning parser lets a budget apply: one that reads a block
    between a start and an end tag (`ReasoningParser`; not harmony's channels, nor none)."""
    return isinstance(parser, ReasoningParser)


def parse_effort_budgets(text: str) -> dict[str, int]:
    """``--reasoning-effort-budgets``: ``default`` (`THINK_LEVEL_BUDGETS`) or comma-separated
    ``EFFORT=TOKENS`` pairs (``low=512,high=8192``; -1: no limit). ValueError otherwise."""
    if text.strip() == "default":
        return dict(THINK_LEVEL_BUDGETS)
    budgets = {}
    for pair in text.split(","):
        name, eq, value = pair.strip().partition("=")
        if not eq or not name.strip() or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"expected 'default' or EFFORT=TOKENS pairs (low=1024,high=8192), "
                             f"got {pair.strip()!r}")
        budgets[name.strip()] = check_budget(int(value), "--reasoning-effort-budgets")
    return budgets


def check_budget(value: int, name: str) -> int:
    """``value`` if it is a budget (>= 0, or -1 for no limit); ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError(f"{name} must be an integer >= 0, or -1 for no limit, got {value!r}")
    return value


@dataclass(frozen=True)
class BudgetPolicy:
    """The server's reasoning-budget settings: ``default`` (``--reasoning-budget``; None or
    -1: no limit, 0: no thinking), ``message`` (``--reasoning-budget-message``: written before
    the end tag) and ``effort_budgets`` (``--reasoning-effort-budgets``: effort → tokens;
    empty: ``reasoning_effort`` only reaches the chat template)."""

    default: int | None = None
    message: str = ""
    effort_budgets: Mapping[str, int] = field(default_factory=dict)

    def budget_for(self, asked: int | None, effort: str | None) -> int | None:
        """The request's budget in tokens, None for no limit: ``asked`` (-1: no limit), else
        ``effort``'s in the table, else the server's default."""
        if asked is None and effort is not None:
            asked = self.effort_budgets.get(effort)
        if asked is None:
            asked = self.default
        return None if asked is None or asked < 0 else asked

    def apply(self, params: SamplingParams, asked: int | None, effort: str | None,
              parser: ReasoningParser | None, prompt: str,
              tokenizer: Tokenizer) -> SamplingParams:
        """``params`` with the request's budget and tags (a copy), or ``params`` itself when
        there is no limit, no tag-based reasoning parser, or ``prompt`` closed the block. An
        explicit ``asked`` budget without one is a 400 (``thinking_token_budget``). NOTE:
        harmony (gpt-oss) writes channels, not a block between two tags: no budget there."""
        if not can_budget(parser):
            if asked is not None and asked >= 0:
                why = ("start the server with --reasoning-parser" if parser is None else
                       "this model's reasoning format has no start and end tags")
                raise OpenAIError(f"a reasoning budget needs the reasoning tags: {why}",
                                  param="thinking_token_budget")
            return params
        budget = self.budget_for(asked, effort)
        if budget is None or prompt.rstrip().endswith(parser.end_tag):
            return params
        return params.clone(thinking_token_budget=budget,
                            thinking_tags=self.tags(parser, tokenizer))

    def tags(self, parser: ReasoningParser, tokenizer: Tokenizer) -> ThinkingTags:
        """``parser``'s tags as token ids, with the forced end: the message, then the end tag."""
        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False) if text else []

        end = encode(parser.end_tag)
        return ThinkingTags(start_token_ids=encode(parser.start_tag), end_token_ids=end,
                            forced_token_ids=encode(self.message) + end,
                            starts_in_reasoning=parser.starts_in_reasoning)


def add_reasoning_budget_args(parser: argparse.ArgumentParser) -> None:
    """``--reasoning-budget``, ``--reasoning-budget-message``, ``--reasoning-effort-budgets``."""
    parser.add_argument("--reasoning-budget", type=_budget_arg, default=-1, metavar="N",
                        help="the most tokens a request may think before the engine writes "
                             "the reasoning parser's end tag (-1, the default: no limit; 0: no "
                             "thinking). Requests override it (thinking_token_budget, "
                             "Anthropic thinking.budget_tokens, Ollama think levels); needs "
                             "--reasoning-parser")
    parser.add_argument("--reasoning-budget-message", default="", metavar="TEXT",
                        help="text the engine writes before the end tag when a budget runs "
                             "out (e.g. ' Time is up, answering now.')")
    parser.add_argument("--reasoning-effort-budgets", type=_effort_arg, default=None,
                        metavar="SPEC",
                        help="give reasoning_effort a budget (when a request names none): "
                             "'default' (low=1024,medium=4096,high=16384) or EFFORT=TOKENS "
                             "pairs; off by default (reasoning_effort then only reaches the "
                             "chat template)")


def budget_policy(args: argparse.Namespace, parser: ReasoningParser | None) -> BudgetPolicy:
    """The server's `BudgetPolicy` from its flags; a warning when they cannot apply (no
    reasoning parser)."""
    policy = BudgetPolicy(None if args.reasoning_budget < 0 else args.reasoning_budget,
                          args.reasoning_budget_message, args.reasoning_effort_budgets or {})
    if not can_budget(parser) and (policy.default is not None or policy.effort_budgets):
        logger.warning("--reasoning-budget and --reasoning-effort-budgets need a reasoning "
                       "parser with start and end tags (--reasoning-parser; not harmony): "
                       "requests think without a limit")
    return policy


def _budget_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = text  # not an integer: check_budget says what it takes
    try:
        return check_budget(value, "--reasoning-budget")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _effort_arg(text: str) -> dict[str, int]:
    try:
        return parse_effort_budgets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

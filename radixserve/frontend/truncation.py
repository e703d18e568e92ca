"""Truncation only when asked: fit a prompt longer than its limit by cutting what matters least.

Without a request's truncation field a prompt that does not fit stays a 400 with the counts
(`ServingContext.sampling_params`). With it (vLLM's ``truncate_prompt_tokens``, Ollama's
``truncate``, the Responses API's ``truncation: "auto"``) the prompt is cut to the limit that
`prompt_limit` draws from the request:

* a chat (`fit_chat`) loses the MIDDLE of its history: system/developer messages and the
  tools stay, the last user message and the newest turn stay, and the oldest other messages
  go first, whole. Before the last user message they go a turn at a time (a user message and
  every answer up to the next one: strict templates want user/assistant to alternate); after
  it, one tool call at a time (an assistant message with the results of its calls: never an
  orphaned result). The template is rendered again until the prompt fits;
* a raw text or token prompt (`keep_last`) keeps its last tokens, as vLLM's left truncation
  does, and its BOS when the tokenizer puts one in front.

What was cut is a `Truncation`: the routes say so in ``usage.prompt_tokens_details`` (OpenAI)
and in the ``X-Radixserve-Truncated`` header (every route, streams too), and it is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radixserve.frontend.http.protocol_base import OpenAIError
from radixserve.frontend.openai.protocol import PromptTokensDetails

logger = logging.getLogger(__name__)

HEADER = b"x-radixserve-truncated"  # its value: the number of prompt tokens dropped
_KEPT_ROLES = ("system", "developer")


@dataclass(frozen=True, slots=True)
class Truncation:
    """What truncation cut from one request's prompt(s): ``num_dropped_tokens`` tokens (of
    the prompt as sent), in ``num_dropped_messages`` whole messages (0 for a raw prompt)."""

    num_dropped_tokens: int
    num_dropped_messages: int = 0

    def header(self) -> tuple[bytes, bytes]:
        return HEADER, str(self.num_dropped_tokens).encode()

    @staticmethod
    def total(parts: Sequence[Truncation | None]) -> Truncation | None:
        """The sum of several prompts' truncations (a completions prompt list); None when
        none was cut."""
        cut = [p for p in parts if p is not None]
        if not cut:
            return None
        return Truncation(sum(p.num_dropped_tokens for p in cut),
                          sum(p.num_dropped_messages for p in cut))


def prompt_limit(asked: int | None, max_model_len: int, max_tokens: int | None,
                 param: str = "truncate_prompt_tokens") -> int | None:
    """The most tokens a prompt may keep, or None: no truncation asked (``asked`` None).

    ``asked`` >= 1 is the limit itself (400 beyond the context, as in vLLM); -1 means what the
    context leaves after the completion: ``max_model_len`` less ``max_tokens`` (None: less
    one token, the least a completion needs). A completion that leaves no room is a 400
    naming ``max_tokens``. The protocol models refuse 0 and values below -1.
    """
    if asked is None:
        return None
    if asked > max_model_len:
        raise OpenAIError(f"{param} ({asked}) is greater than this model's maximum context "
                          f"length ({max_model_len} tokens)", param=param)
    if asked >= 1:
        return asked
    room = max_model_len - (max_tokens if max_tokens is not None else 1)
    if room < 1:
        raise OpenAIError(f"This model's maximum context length is {max_model_len} tokens, "
                          f"and max_tokens ({max_tokens}) leaves no room for a prompt.",
                          param="max_tokens", code="context_length_exceeded")
    return room


def keep_last(ids: list[int], limit: int, bos_prefix: list[int]
              ) -> tuple[list[int], Truncation | None]:
    """``ids`` cut to their last ``limit`` tokens (the BOS in ``bos_prefix`` kept in front
    when ``ids`` start with it), and what was cut (None: they fit). Pure."""
    if len(ids) <= limit:
        return ids, None
    head = bos_prefix if bos_prefix and ids[:len(bos_prefix)] == bos_prefix else []
    kept = head + ids[len(ids) - (limit - len(head)):]
    return kept, Truncation(len(ids) - len(kept))


def droppable_units(messages: Sequence) -> list[list[int]]:
    """The indices of ``messages`` (objects with ``role`` and ``tool_calls``) that truncation
    may drop, grouped into the units it drops whole, oldest first. Never in a unit: the
    system/developer messages, the last user message, and the last unit after it (the
    newest turn's latest step). Pure."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    last_user = users[-1] if users else -1
    units: list[list[int]] = []
    for i, m in enumerate(messages):
        if m.role in _KEPT_ROLES or i == last_user:
            continue
        if not units or _starts_unit(m, i, last_user):
            units.append([i])
        else:
            units[-1].append(i)
    # a unit spanning the last user message would drop what comes after it with what before
    units = [part for unit in units for part in _split_at(unit, last_user)]
    if units and units[-1][0] > last_user:
        units.pop()  # the newest step stays: what the model answers next
    return units


def _starts_unit(m, i: int, last_user: int) -> bool:
    if i < last_user:
        return m.role == "user"  # whole turns before the last user message
    return m.role != "tool"  # after it: a call with its results, or one message


def _split_at(unit: list[int], last_user: int) -> list[list[int]]:
    before = [i for i in unit if i < last_user]
    after = [i for i in unit if i > last_user]
    return [part for part in (before, after) if part]


def fit_chat(messages: Sequence, render: Callable[[list[int]], tuple[str, list[int]]],
             limit: int, max_model_len: int) -> tuple[str, list[int], Truncation | None]:
    """(prompt text, ids, what was cut) of the chat ``messages`` rendered with as few of the
    oldest `droppable_units` left out as makes it fit ``limit`` tokens; ``render(kept)``
    renders the messages at the indices ``kept`` (with the request's tools). Rendering is
    assumed to shrink as units go, so the fewest are found by bisection (a few renders,
    not one per unit). 400 with the counts when even dropping every unit does not fit."""
    everything = list(range(len(messages)))
    text, ids = render(everything)
    if len(ids) <= limit:
        return text, ids, None
    units = droppable_units(messages)

    def without(num_units: int) -> tuple[str, list[int]]:
        dropped = {i for unit in units[:num_units] for i in unit}
        return render([i for i in everything if i not in dropped])

    low, high = 0, len(units)  # NOTE: dropping `high` units fits, dropping `low` does not
    best = without(high)
    if len(best[1]) > limit:
        raise OpenAIError(
            f"This model's maximum context length is {max_model_len} tokens and this request "
            f"may use {limit} for its prompt. However, its prompt has {len(ids)} tokens, and "
            f"still {len(best[1])} with only the system messages, the tools and the last turn "
            f"kept. Please reduce the length of the messages.", param="messages",
            code="context_length_exceeded")
    while high - low > 1:
        mid = (low + high) // 2
        tried = without(mid)
        if len(tried[1]) <= limit:
            high, best = mid, tried
        else:
            low = mid
    cut = Truncation(len(ids) - len(best[1]), sum(len(unit) for unit in units[:high]))
    return best[0], best[1], cut


def truncated_details(cached: int, cut: Truncation | None) -> PromptTokensDetails:
    """``usage.prompt_tokens_details`` of the OpenAI routes: the cached tokens, and what
    truncation cut (absent when nothing was)."""
    if cut is None:
        return PromptTokensDetails(cached_tokens=cached)
    return PromptTokensDetails(cached_tokens=cached, truncated_tokens=cut.num_dropped_tokens,
                               dropped_messages=cut.num_dropped_messages)


def say_truncated(headers: list[tuple[bytes, bytes]], cut: Truncation | None) -> None:
    """Add the ``X-Radixserve-Truncated`` header to an answer's ``headers`` (a router
    `Call`'s), when truncation cut its prompt."""
    if cut is not None:
        headers.append(cut.header())


def log_truncation(route: str, cut: Truncation | None, num_prompt_tokens: int) -> None:
    """The INFO line of one truncated request (nothing when none was cut)."""
    if cut is not None:
        logger.info("%s: prompt truncated to %d tokens: %d tokens dropped (%d messages)",
                    route, num_prompt_tokens, cut.num_dropped_tokens, cut.num_dropped_messages)

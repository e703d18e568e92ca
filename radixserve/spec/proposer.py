"""The proposer interface and the drafts it returns (spec/factory.py picks one by name).

A proposer drafts the tokens a request will probably generate next, from plain token ids (no
model, no torch). The ``draft`` proposer (spec/draft_model.py) is the one fed from the runner:
its tokens come from a draft model the runner ran after the previous step, and it keeps
that model's KV block tables. The scheduler asks it once per decode step for at most ``k``
tokens and tells it when a request finishes, so a proposer that learns from outputs can
index them.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class Draft(NamedTuple):
    """Drafted tokens and their evidence: ``match``, how many of the context's last tokens
    the place they were copied from matched (0: no such evidence, as for a draft model), and
    ``source``, where that place is: OWN_CONTEXT or OTHER_OUTPUTS."""

    tokens: list[int]
    match: int = 0
    source: int = 0


OWN_CONTEXT, OTHER_OUTPUTS = 0, 1


NO_DRAFT = Draft([], 0)


class Proposer(Protocol):
    name: str
    gives_evidence: bool  # its drafts carry a match length (the policy's table reads it)
    # Every drafted token is a point mass (q(d) = 1): the proposer is deterministic.

    def propose(self, request_id: str, token_ids: list[int], num_prompt: int,
                k: int) -> Draft:
        """Up to ``k`` tokens likely to follow ``token_ids`` (prompt + output so far, the
        first ``num_prompt`` of them the prompt); NO_DRAFT when it has no guess."""
        ...

    def on_finished(self, request_id: str, token_ids: list[int], num_prompt: int) -> None:
        """The request is done (or aborted); forget its state, learn from its output."""
        ...


"""The proposer interface, its null object, and the factory that picks one by name.

A proposer drafts the tokens a request will probably generate next, from plain token ids (no
model, no torch). The ``draft`` proposer (spec/draft_model.py) is the one fed from the runner:
its tokens come from a draft model the runner ran after the previous step, and it keeps
that model's KV block tables. The scheduler asks it once per decode step for at most ``k``
tokens and tells it when a request finishes, so a proposer that learns from outputs can
index them.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from radixserve.config import PROPOSERS


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


class NoProposer:
    """Null object: speculation off; never drafts."""

    name = "off"
    enabled = False
    gives_evidence = False

    def propose(self, request_id: str, token_ids: list[int], num_prompt: int,
                k: int) -> Draft:
        return NO_DRAFT

    def on_finished(self, request_id: str, token_ids: list[int], num_prompt: int) -> None:
        pass


NO_PROPOSER = NoProposer()


def make_proposer(name: str, max_ngram: int = 4, min_ngram: int = 1,
                  acceptance=None) -> Proposer | NoProposer:
    """The proposer called ``name`` (one of PROPOSERS). ``auto`` is ``suffix``: it covers the
    prompt lookup of ``ngram`` and adds what earlier requests generated. ``acceptance``: the
    policy's AcceptanceTable, by which ``suffix`` picks between its two sources."""
    from radixserve.spec.ngram import NgramProposer
    from radixserve.spec.suffix import SuffixProposer

    if name == "off":
        return NO_PROPOSER
    if name == "ngram":
        return NgramProposer(max_ngram, min_ngram)
    if name in ("suffix", "auto"):
        return SuffixProposer(acceptance=acceptance)
    if name == "draft":
        raise ValueError("the draft-model proposer needs its KV pool: build it with "
                         "spec.drafter.make_spec")
    raise ValueError(f"unknown speculative method {name!r}; supported: {', '.join(PROPOSERS)}")

"""Which speculation a `SpeculativeConfig` picks: `make_spec` for the scheduler's hooks and
`make_proposer` for a token proposer by name.

The factories sit apart from what they build: the proposers import proposer.py's `Draft`,
and draft_model.py subclasses drafter.py's `SpecDecoding`, so a factory in either module
would close an import cycle (tests/test_layout.py). Implementations are imported when picked.
"""

from __future__ import annotations

from radixserve.config import PROPOSERS
from radixserve.core.spec_hooks import NO_SPEC, SpecHooks
from radixserve.spec.drafter import SpecDecoding
from radixserve.spec.policy import SpecPolicy
from radixserve.spec.proposer import Proposer


def make_proposer(name: str, max_ngram: int = 4, min_ngram: int = 1,
                  acceptance=None) -> Proposer:
    """The token proposer called ``name`` (one of PROPOSERS but ``off``, ``draft``, ``mtp``).
    ``auto`` is ``suffix``: it covers the prompt lookup of ``ngram`` and adds what earlier
    requests generated. ``acceptance``: the policy's AcceptanceTable, by which ``suffix``
    picks between its two sources. ValueError for any other name."""
    if name == "ngram":
        from radixserve.spec.ngram import NgramProposer

        return NgramProposer(max_ngram, min_ngram)
    if name in ("suffix", "auto"):
        from radixserve.spec.suffix import SuffixProposer

        return SuffixProposer(acceptance=acceptance)
    if name == "off":
        raise ValueError("speculation off has no proposer: make_spec gives NO_SPEC")
    if name in ("draft", "mtp"):
        raise ValueError(f"the {name} proposer runs a model after each step: build it with "
                         "make_spec")
    raise ValueError(f"unknown speculative method {name!r}; supported: {', '.join(PROPOSERS)}")


def make_spec(config, num_draft_blocks: int = 0, block_size: int = 16) -> SpecHooks:
    """From a SpeculativeConfig; ``draft`` takes the draft model's KV pool size in blocks
    (the runner holds the pool itself, engine/draft_setup.py); ``mtp`` drafts with the
    model's MTP block (engine/mtp_setup.py)."""
    if config.method == "off":
        return NO_SPEC
    if config.method == "draft":
        from radixserve.spec.draft_model import make_draft_spec

        return make_draft_spec(config, num_draft_blocks, block_size)
    if config.method == "mtp":
        from radixserve.spec.mtp import make_mtp_spec

        return make_mtp_spec(config)
    policy = SpecPolicy(config.num_speculative_tokens, config.adaptive)
    return SpecDecoding(make_proposer(config.method, acceptance=policy.table), policy)

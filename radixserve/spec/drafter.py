"""The scheduler's side of speculative decoding: drafts as lookahead tokens of a step, and
the bookkeeping of what verification kept (plain Python, no torch).

After a step's decodes, prefill chunks and admissions are scheduled, each decoding request
may feed up to k drafted tokens after its last one, out of the budget left (drafts never
displace real work, and a draft whose KV slots cannot be had without eviction of running work
is dropped, never a cause of preemption). A constrained request drafts only the prefix its
grammar accepts. The verified result is applied by the scheduler (core/scheduler.py):
accepted tokens become computed, rejected ones never do, so the radix cache never indexes them,
and the blocks past the request's tokens are returned.
"""

from __future__ import annotations

import logging
import time

from radixserve.core.sched_output import DraftResult, ScheduledSeq
from radixserve.spec.policy import SpecPolicy, SpecState, evidence_key
from radixserve.spec.proposer import NO_DRAFT, Proposer

logger = logging.getLogger(__name__)


class SpecDecoding:
    """Speculation on (core/spec_hooks.py's `SpecHooks`): a proposer drafts, the policy sizes
    each draft; each request carries a `SpecState`."""

    enabled = True

    def __init__(self, proposer: Proposer, policy: SpecPolicy) -> None:
        self.proposer = proposer
        self.policy = policy
        self.num_drafts = 0  # verified drafts (steps of requests that drafted)
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * policy.k_max  # drafts whose token i was accepted
        self.drafted_per_pos = [0] * policy.k_max  # drafts that had a token i
        self._overhead = 0.0  # seconds spent drafting and recording since the last step
        self._decodes_only = False  # the step being run holds decodes (and drafts) only
        logger.info("speculative decoding: %s proposer, up to %d tokens per step%s",
                    proposer.name, policy.k_max, " (adaptive)" if policy.adaptive else "")

    def new_state(self) -> SpecState:
        return SpecState()

    def add_drafts(self, seqs: list[ScheduledSeq], requests: dict, budget: int, kv,
                   max_model_len: int) -> int:
        """Extend the decoding ``seqs`` with drafts, within ``budget`` tokens; return how many
        tokens were added. Its time counts in the step's cost (observe_step)."""
        start = time.perf_counter()
        try:
            return self._add_drafts(seqs, requests, budget, kv, max_model_len)
        finally:
            self._overhead += time.perf_counter() - start

    def _add_drafts(self, seqs: list[ScheduledSeq], requests: dict, budget: int, kv,
                    max_model_len: int) -> int:
        """Propose for every decoding request that may draft, then let the policy cut each
        proposal to the length that pays (by its evidence and the step's cost) and keep what
        the budget and the KV pool allow. Nothing is proposed in a step where even the best
        drafts its requests may expect would not pay (a large batch; sampling at a high
        temperature): proposing for 16 streams costs about 1.5% of their step."""
        if budget <= 0:
            return 0
        decodes = [(s, requests[s.request_id]) for s in seqs if s.sample and s.num_tokens == 1]
        self._decodes_only = len(decodes) == len(seqs)
        if not decodes:
            return 0
        policy = self.policy
        num_tokens = sum(s.num_tokens for s in seqs)
        num_rows = sum(1 for s in seqs if s.sample)
        best = 0.95  # the most a draft may expect: the table's, where drafts have evidence
        if self.proposer.gives_evidence:
            kinds = {r.sampling_params.temperature > 0 for _, r in decodes}
            best = max(policy.table.best(sampled) for sampled in kinds)
        if not policy.may_draft(len(decodes), num_tokens, num_rows, best):
            for _, request in decodes:
                request.spec.idle(policy.prior.alpha)
            return 0
        cands, keys = [], []
        for seq, request in decodes:
            room = min(request.max_tokens - request.num_output_tokens,
                       max_model_len - request.num_tokens) - 1  # the bonus token needs room
            k = request.budget.cap_draft(min(policy.k_max, room, budget), 1)
            draft = NO_DRAFT
            if k > 0 and request.grammar.can_draft:
                draft = self.proposer.propose(request.request_id, request.all_token_ids,
                                              request.num_prompt_tokens, k)
            tokens = request.grammar.draftable(draft.tokens) if draft.tokens else []
            if not tokens:
                request.spec.idle(policy.prior.alpha)
                continue
            cands.append((seq, request, tokens))
            keys.append(evidence_key(draft.match, request.sampling_params.temperature > 0,
                                     draft.source))
        lens = policy.draft_lens([r.spec for _, r, _ in cands], num_tokens, num_rows, 0.0,
                                 keys, [len(t) for _, _, t in cands])
        added = 0
        for (seq, request, tokens), key, k in zip(cands, keys, lens):
            k = min(k, budget - added)
            if k <= 0:
                request.spec.idle(policy.prior.alpha)
                continue
            if not kv.allocate_slots(request, 1 + k) or not kv.add_draft(request, seq.state, k):
                continue
            seq.token_ids.extend(tokens[:k])
            seq.num_draft = k
            request.spec.key = key
            added += k
        return added

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """The runner took ``seconds`` for a step of ``num_tokens``; the cost model sees that
        plus the drafting and recording time around it (what speculation adds on the
        scheduler's side: proposing, slot allocation, verification bookkeeping), for steps of
        decodes and drafts only: a prefill chunk's tokens cost differently (no logits, long
        attention), and their cost per token would stand for the drafts' before any draft
        was measured."""
        if self._decodes_only:
            self.policy.cost.observe(num_tokens, seconds + self._overhead)
        self._overhead = 0.0
        self._decodes_only = False

    def record(self, request, result: DraftResult) -> None:
        start = time.perf_counter()
        request.spec.record(result.num_drafted, result.num_accepted)
        self.policy.record(result.num_drafted, result.num_accepted, request.spec.key)
        self.num_drafts += 1
        self.num_draft_tokens += result.num_drafted
        self.num_accepted_tokens += result.num_accepted
        for i in range(result.num_accepted):
            self.accepted_per_pos[i] += 1
        for i in range(result.num_drafted):
            self.drafted_per_pos[i] += 1
        self._overhead += time.perf_counter() - start

    def on_finished(self, request) -> None:
        self.proposer.on_finished(request.request_id, request.all_token_ids,
                                  request.num_prompt_tokens)

    def on_preempted(self, request) -> None:
        """The request's KV was dropped (token proposers keep no KV: nothing to do)."""

    def after_step(self, result, requests: dict) -> None:
        """The step's ModelRunnerOutput, after the scheduler applied it to ``requests`` (the
        live ones). Token proposers learn nothing from it."""

    def check_integrity(self, requests: dict) -> None:
        pass


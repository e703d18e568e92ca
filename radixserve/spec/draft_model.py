"""``draft``: a smaller model with the target's tokenizer drafts greedily. This is the
scheduler's side (plain Python); the model runs in runner/draft_runner.py.

The draft model has its own paged KV pool. This module owns that pool's block ids (a
`BlockPool`) and, per request, the draft block table and how far its KV is valid. Each step,
every sampling sequence that may draft next gets a `DraftWork`: after the target's tokens are
sampled, the runner feeds the draft model the tokens it has not seen (catch-up) and proposes
the next ``k`` tokens greedily. They ride back in ``ModelRunnerOutput.proposals`` and are the
draft of the next step (cut to the policy's length, filtered by the grammar, verified like
any draft). Drafts are greedy: the proposal distribution ``q`` is a point mass, so the
verification rule of runner/spec_verify.py is exact under sampling too.

The draft KV is kept in step with the target's:
- prefix-cache hits: the draft pool has no prefix cache. A request's first DraftWork starts
  from 0 confirmed tokens and the runner's catch-up prefill computes its whole prefix.
- rejection: the KV of a proposal is valid only as far as the proposal matched the tokens
  verification emitted (``DraftWork.spec_token_ids``); the catch-up overwrites the rest,
  and the blocks past the written KV are returned after each step.
- preemption, finish, abort: the request's draft blocks are freed (recomputed on resume).
The draft pool never preempts anything: a request whose draft blocks cannot be had does not
draft that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.sched_output import DraftWork, Proposal, ScheduledSeq
from radixserve.spec.drafter import SpecDecoding
from radixserve.spec.policy import SpecPolicy
from radixserve.spec.proposer import NO_DRAFT, Draft

_COST_RATE = 0.1  # moving-average step of a draft decode forward's measured seconds


@dataclass(slots=True)
class _DraftSeq:
    block_ids: list[int] = field(default_factory=list)
    num_confirmed: int = 0  # the request's first tokens whose draft KV is valid
    proposal: list[int] = field(default_factory=list)  # follows them; KV of all but the last


class DraftModelProposer:
    """The draft pool's block tables and the latest proposal per request."""

    name = "draft"
    gives_evidence = False  # no match length: each request goes by its own acceptance

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self._seqs: dict[str, _DraftSeq] = {}

    def propose(self, request_id: str, token_ids: list[int], num_prompt: int,
                k: int) -> Draft:
        """The proposal the draft model made after the last step, if it still follows
        ``token_ids`` (not when forced tokens were appended since). No match evidence: the
        policy goes by the request's own acceptance."""
        seq = self._seqs.get(request_id)
        if seq is None or seq.num_confirmed != len(token_ids) or not seq.proposal or k <= 0:
            return NO_DRAFT
        return Draft(seq.proposal[:k], 0)

    def on_finished(self, request_id: str, token_ids: list[int], num_prompt: int) -> None:
        self.free(request_id)

    def free(self, request_id: str) -> None:
        """Return the request's draft blocks (finish, abort, preemption)."""
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self.pool.free(seq.block_ids)

    def plan(self, seq: ScheduledSeq, max_num_tokens: int, k: int) -> bool:
        """Give ``seq`` draft work: propose ``k`` tokens after this step, when the request
        holds at most ``max_num_tokens`` tokens. Grows the draft block table to the KV that
        writes (all but the last proposed token); False, changing nothing, if the pool is
        short."""
        state = self._seqs.get(seq.request_id) or _DraftSeq()
        need = self._blocks_for(max_num_tokens + k - 1) - len(state.block_ids)
        if need > self.pool.num_free_blocks:
            return False
        if need > 0:
            state.block_ids.extend(self.pool.allocate(need))
        self._seqs[seq.request_id] = state
        seq.draft_work = DraftWork(state.block_ids, state.num_confirmed, state.proposal[:-1], k)
        return True

    def take(self, request_id: str, proposal: Proposal) -> None:
        """Record what the runner proposed (for a live request) and return the draft blocks
        past the KV it wrote."""
        seq = self._seqs.get(request_id)
        if seq is None:  # finished in this very step
            return
        seq.num_confirmed = proposal.num_confirmed
        seq.proposal = list(proposal.token_ids)
        keep = self._blocks_for(seq.num_confirmed + len(seq.proposal) - 1)
        if len(seq.block_ids) > keep:
            self.pool.free(seq.block_ids[keep:])
            del seq.block_ids[keep:]

    def num_blocks_of(self, request_id: str) -> int:
        seq = self._seqs.get(request_id)
        return 0 if seq is None else len(seq.block_ids)

    def check_integrity(self, live_ids) -> None:
        """Every used draft block belongs to exactly one live request's table."""
        self.pool.check_integrity()
        owned = [b for seq in self._seqs.values() for b in seq.block_ids]
        assert len(owned) == len(set(owned)), "a draft block is in two tables"
        assert all(self.pool.ref_counts[b] == 1 for b in owned), "a draft block's ref count"
        assert len(owned) == self.pool.num_blocks - self.pool.num_free_blocks, \
            "a draft block is used by no table (leaked)"
        assert set(self._seqs) <= set(live_ids), "draft KV kept for a finished request"

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-max(num_tokens, 0) // self.block_size)


class DraftModelSpec(SpecDecoding):
    """SpecDecoding whose proposer is a draft model: besides adding drafts, each step plans
    the draft model's work for the next one and takes its proposals back."""

    proposer: DraftModelProposer

    def __init__(self, proposer: DraftModelProposer, policy: SpecPolicy) -> None:
        super().__init__(proposer, policy)
        self.forward_s = 0.0  # a draft forward's seconds (moving average; 0: not yet measured)

    def add_drafts(self, seqs: list[ScheduledSeq], requests: dict, budget: int, kv,
                   max_model_len: int) -> int:
        added = super().add_drafts(seqs, requests, budget, kv, max_model_len)
        self._plan(seqs, requests, max_model_len)
        return added

    def _plan(self, seqs: list[ScheduledSeq], requests: dict, max_model_len: int) -> None:
        """Draft work for every sampling sequence whose request may draft next step, as long
        as the policy would draft for it in a step like this one."""
        sampling = [(s, requests[s.request_id]) for s in seqs if s.sample]
        if not sampling:
            return
        num_tokens = sum(s.num_tokens for s in seqs)
        lens = self.policy.draft_lens([r.spec for _, r in sampling], num_tokens,
                                      len(sampling), self.forward_s)
        for (seq, request), k in zip(sampling, lens):
            most = request.num_tokens + seq.num_draft + 1  # every draft accepted, + bonus
            room = min(request.max_tokens - (request.num_output_tokens + seq.num_draft + 1),
                       max_model_len - most) - 1  # the next bonus token needs room
            k = request.budget.cap_draft(min(k, room), seq.num_draft + 2)
            if k > 0 and request.grammar.can_draft:
                self.proposer.plan(seq, most, k)

    def on_preempted(self, request) -> None:
        self.proposer.free(request.request_id)

    def after_step(self, result, requests: dict) -> None:
        for rid, proposal in result.proposals.items():
            if rid in requests:
                self.proposer.take(rid, proposal)
        if result.draft_forward_s > 0:
            self.forward_s += (result.draft_forward_s - self.forward_s) * (
                1.0 if self.forward_s == 0.0 else _COST_RATE)

    def check_integrity(self, requests: dict) -> None:
        self.proposer.check_integrity(requests)


def make_draft_spec(config, num_blocks: int, block_size: int) -> DraftModelSpec:
    """From a SpeculativeConfig with ``method`` "draft" and the draft pool's size."""
    proposer = DraftModelProposer(BlockPool(num_blocks), block_size)
    return DraftModelSpec(proposer, SpecPolicy(config.num_speculative_tokens, config.adaptive))

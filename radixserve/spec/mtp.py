"""``mtp``: the model's own multi-token-prediction block drafts (Qwen3.5 / 3.6, Qwen3-Next).
This is the scheduler's side (plain Python); the block runs in runner/mtp_runner.py.

The MTP block is one more decoder layer fed the target's final hidden state at each position
and the token after it; its KV sits in a layer of its own indexed by the target's block ids,
so it follows the target's blocks: prefix-cache hits, preemption, finish and abort need
nothing here. Each step every sequence gets an `MtpWork` (the block keeps its KV complete
over prompt chunks too), and the sampling ones whose request may draft next ask for ``k``
proposals. They ride back in ``ModelRunnerOutput.proposals`` and are the draft of the next
step (cut to the policy's length, filtered by the grammar, verified like any draft; greedy,
so a point mass ``q`` and exact verification, runner/spec_verify.py).
"""

from __future__ import annotations

from radixserve.core.sched_output import MtpWork, Proposal, ScheduledSeq
from radixserve.spec.draft_model import DraftModelSpec
from radixserve.spec.policy import SpecPolicy
from radixserve.spec.proposer import NO_DRAFT, Draft


class MtpProposer:
    """The latest proposal per request (no KV of its own)."""

    name = "mtp"
    gives_evidence = False  # no match length: each request goes by its own acceptance

    def __init__(self) -> None:
        self._proposals: dict[str, Proposal] = {}

    def propose(self, request_id: str, token_ids: list[int], num_prompt: int,
                k: int) -> Draft:
        """The proposal the MTP block made after the last step, if it still follows
        ``token_ids`` (not when forced tokens were appended since)."""
        proposal = self._proposals.get(request_id)
        if proposal is None or proposal.num_confirmed != len(token_ids) or k <= 0:
            return NO_DRAFT
        return Draft(proposal.token_ids[:k], 0)

    def on_finished(self, request_id: str, token_ids: list[int], num_prompt: int) -> None:
        self.free(request_id)

    def free(self, request_id: str) -> None:
        self._proposals.pop(request_id, None)

    def plan(self, seq: ScheduledSeq, max_num_tokens: int, k: int) -> bool:
        """Ask for ``k`` proposals after this step (``seq`` already has its `MtpWork`)."""
        seq.mtp = MtpWork(seq.mtp.next_token_id if seq.mtp else None, k)
        return True

    def take(self, request_id: str, proposal: Proposal) -> None:
        self._proposals[request_id] = proposal

    def check_integrity(self, live_ids) -> None:
        assert set(self._proposals) <= set(live_ids), "a proposal kept for a finished request"


class MtpSpec(DraftModelSpec):
    """`DraftModelSpec`'s policy and bookkeeping with the MTP block as the drafter: every
    scheduled sequence gets its `MtpWork`, the sampling ones their proposal count."""

    proposer: MtpProposer

    def _plan(self, seqs: list[ScheduledSeq], requests: dict, max_model_len: int) -> None:
        for seq in seqs:
            request = requests[seq.request_id]
            if request.pooling is not None:
                continue
            end = seq.start_pos + seq.num_tokens  # the token after a prompt chunk, if known
            after = request.all_token_ids[end] if end < request.num_tokens else None
            seq.mtp = MtpWork(None if seq.sample else after, 0)
        super()._plan(seqs, requests, max_model_len)


def make_mtp_spec(config) -> MtpSpec:
    """From a SpeculativeConfig with ``method`` "mtp"."""
    return MtpSpec(MtpProposer(), SpecPolicy(config.num_speculative_tokens, config.adaptive))

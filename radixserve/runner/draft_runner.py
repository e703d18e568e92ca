"""The draft model's forwards, run by the target's runner right after it sampled a step.

A draft model is a second `ModelRunner` (the same runner code) over its own paged KV pool;
the block tables come from the scheduler (spec/draft_model.py) in each sequence's
`DraftWork`. For the sequences that have draft work, batched over them:

1. catch-up: feed the tokens whose draft KV is not valid, up to the request's last token
   (this step's emitted tokens included; a whole prompt on the first call, in chunks of at
   most ``max_chunk`` tokens per sequence and forward), and take the greedy token after it;
2. ``num_propose - 1`` single-token greedy forwards, each feeding the token proposed last.

The proposals are greedy (a point mass q, so verification stays exact under sampling).
"""

from __future__ import annotations

import time

import torch

from radixserve.core.sched_output import ModelRunnerOutput, Proposal, ScheduledSeq


class NoDraftRunner:
    """Null object: no draft model."""

    def propose(self, seqs: list[ScheduledSeq], out: ModelRunnerOutput) -> None:
        pass


NO_DRAFT_RUNNER = NoDraftRunner()


class DraftRunner:
    def __init__(self, runner, name: str, max_chunk: int = 2048) -> None:
        """``runner``: a ModelRunner of the draft model over its own KV pool."""
        self.runner = runner
        self.name = name
        self.max_chunk = max_chunk

    @torch.inference_mode()
    def propose(self, seqs: list[ScheduledSeq], out: ModelRunnerOutput) -> None:
        """Fill ``out.proposals`` (and the draft's timing) for the sampling ``seqs`` that have
        draft work; ``out``: this step's results for them, whose emitted tokens the draft
        model reads."""
        start = time.perf_counter()
        emitted = {rid: [t] for rid, t in zip(out.request_ids, out.token_ids)}
        for rid, draft in (out.drafts or {}).items():
            emitted[rid] += draft.token_ids
        work = [(s, s.prompt_token_ids + s.output_token_ids + emitted[s.request_id])
                for s in seqs if s.draft_work is not None]
        if not work:
            return
        proposed, num_forwards = self._catch_up(work)
        for j in range(1, max(s.draft_work.num_propose for s, _ in work)):
            active = [(s, tokens) for s, tokens in work if s.draft_work.num_propose > j]
            steps = [ScheduledSeq(s.request_id, [proposed[s.request_id][-1]],
                                  len(tokens) + j - 1, s.draft_work.block_ids, True)
                     for s, tokens in active]
            for s, t in zip(steps, self._greedy(steps)):
                proposed[s.request_id].append(t)
            num_forwards += 1
        out.proposals = {s.request_id: Proposal(proposed[s.request_id], len(tokens))
                         for s, tokens in work}
        out.draft_seconds = time.perf_counter() - start
        out.num_draft_forwards = num_forwards

    def _catch_up(self, work: list[tuple[ScheduledSeq, list[int]]]
                  ) -> tuple[dict[str, list[int]], int]:
        """Feed each sequence's tokens from its first invalid draft KV position on; the greedy
        token after its last one, by request, and the number of forwards it took."""
        todo = []  # (seq, tokens, next position to feed)
        for seq, tokens in work:
            w = seq.draft_work
            valid = w.num_confirmed + _common_prefix_len(w.spec_token_ids,
                                                         tokens[w.num_confirmed:])
            todo.append((seq, tokens, min(valid, len(tokens) - 1)))  # the last one's logits
        first: dict[str, list[int]] = {}
        num_forwards = 0
        while todo:
            chunks = []
            for seq, tokens, pos in todo:
                end = min(len(tokens), pos + self.max_chunk)
                chunks.append(ScheduledSeq(seq.request_id, tokens[pos:end], pos,
                                           seq.draft_work.block_ids, True))
            for chunk, t in zip(chunks, self._greedy(chunks)):
                first[chunk.request_id] = [t]
            num_forwards += 1
            todo = [(seq, tokens, c.context_len) for (seq, tokens, _), c in zip(todo, chunks)
                    if c.context_len < len(tokens)]
        return first, num_forwards

    def _greedy(self, seqs: list[ScheduledSeq]) -> list[int]:
        return self.runner.last_logits(seqs).argmax(dim=-1).tolist()


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

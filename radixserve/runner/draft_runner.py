"""The draft model's forwards, run by the target's runner right after it sampled a step.

A draft model is a second `ModelRunner` (the same runner code) over its own paged KV pool;
the block tables come from the scheduler (spec/draft_model.py) in each sequence's
`DraftWork`. For the sequences that have draft work, batched over them:

1. catch-up: feed the tokens whose draft KV is not valid, up to the request's last token
   (this step's emitted tokens included; a whole prompt on the first call), in forwards of
   at most ``max_chunk`` tokens in all, and take the greedy token after it;
2. ``num_propose - 1`` single-token greedy forwards, each feeding the token proposed last.

The proposals are greedy (a point mass q, so verification stays exact under sampling).
"""

from __future__ import annotations

import time

import torch

from typing import NamedTuple

from radixserve.core.sched_output import ModelRunnerOutput, Proposal, ScheduledSeq


class TargetStep(NamedTuple):
    """The step the target just ran, as a drafter sees it: ``seqs`` in packed order,
    ``hidden`` their final hidden states row by row, ``sampling`` those that sampled."""

    seqs: list[ScheduledSeq]
    hidden: torch.Tensor
    sampling: list[ScheduledSeq]


class NoDraftRunner:
    """Null object: no drafter runs after the target's steps."""

    def propose(self, step: TargetStep, out: ModelRunnerOutput) -> None:
        pass


NO_DRAFT_RUNNER = NoDraftRunner()


class _Work:
    """One sequence's draft work: the request's tokens from ``base`` (its confirmed draft KV)
    on, this step's emitted tokens included, without copying the whole context."""

    __slots__ = ("seq", "rid", "base", "tail", "num_tokens")

    def __init__(self, seq: ScheduledSeq, emitted: list[int]) -> None:
        prompt, output = seq.prompt_token_ids, seq.output_token_ids
        self.seq, self.rid = seq, seq.request_id
        self.base = base = seq.draft_work.num_confirmed
        self.num_tokens = len(prompt) + len(output) + len(emitted)
        if base >= len(prompt):
            self.tail = output[base - len(prompt):] + emitted
        else:
            self.tail = prompt[base:] + output + emitted


class DraftRunner:
    def __init__(self, runner, name: str, max_chunk: int = 2048) -> None:
        """``runner``: a ModelRunner of the draft model over its own KV pool."""
        self.runner = runner
        self.name = name
        self.max_chunk = max_chunk
        self._decode_s: list[float] = []  # this step's decode-like forwards, seconds each

    @torch.inference_mode()
    def propose(self, step: TargetStep, out: ModelRunnerOutput) -> None:
        """Fill ``out.proposals`` (and the draft's timing) for the step's sampling sequences
        that have draft work; ``out``: this step's results for them, whose emitted tokens the
        draft model reads."""
        start = time.perf_counter()
        self._decode_s = []
        emitted = emitted_tokens(out)
        work = [_Work(s, emitted[s.request_id]) for s in step.sampling
                if s.draft_work is not None]
        if not work:
            return
        proposed, num_forwards = self._catch_up(work)
        for j in range(1, max(w.seq.draft_work.num_propose for w in work)):
            steps = [ScheduledSeq(w.rid, [proposed[w.rid][-1]], w.num_tokens + j - 1,
                                  w.seq.draft_work.block_ids, True)
                     for w in work if w.seq.draft_work.num_propose > j]
            for s, t in zip(steps, self._greedy(steps)):
                proposed[s.request_id].append(t)
            num_forwards += 1
        out.proposals = {w.rid: Proposal(proposed[w.rid], w.num_tokens) for w in work}
        out.draft_seconds = time.perf_counter() - start
        out.num_draft_forwards = num_forwards
        if self._decode_s:
            out.draft_forward_s = sum(self._decode_s) / len(self._decode_s)

    def _catch_up(self, work: list[_Work]) -> tuple[dict[str, list[int]], int]:
        """Feed each sequence's tokens from its first invalid draft KV position on (at least
        its last token, whose logits give the first proposal); the greedy token after its
        last one, by request, and the number of forwards it took."""
        todo = []  # (work, next position to feed)
        for w in work:
            valid = w.base + _common_prefix_len(w.seq.draft_work.spec_token_ids, w.tail)
            todo.append((w, min(valid, w.num_tokens - 1)))
        first: dict[str, list[int]] = {}
        num_forwards = 0
        while todo:  # forwards of at most max_chunk tokens (at least one sequence each)
            budget, chunks, fed, waiting = self.max_chunk, [], [], []
            for w, pos in todo:
                if budget <= 0:
                    waiting.append((w, pos))
                    continue
                n = min(w.num_tokens - pos, budget)
                chunks.append(ScheduledSeq(w.rid, w.tail[pos - w.base:pos - w.base + n], pos,
                                           w.seq.draft_work.block_ids, True))
                fed.append(w)
                budget -= n
            for chunk, t in zip(chunks, self._greedy(chunks)):
                first[chunk.request_id] = [t]
            num_forwards += 1
            todo = [(w, c.context_len) for w, c in zip(fed, chunks)
                    if c.context_len < w.num_tokens] + waiting
        return first, num_forwards

    def _greedy(self, seqs: list[ScheduledSeq]) -> list[int]:
        """The greedy token after each sequence; times the forwards that feed at most 2
        tokens a sequence (what one more draft position costs, unlike a catch-up prefill)."""
        start = time.perf_counter()
        tokens = self.runner.last_logits(seqs).argmax(dim=-1).tolist()
        if max(s.num_tokens for s in seqs) <= 2:
            self._decode_s.append(time.perf_counter() - start)
        return tokens


def emitted_tokens(out: ModelRunnerOutput) -> dict[str, list[int]]:
    """The tokens each sampling sequence of the step emitted, by request: its sampled one,
    then (after a verified draft) the others verification kept."""
    emitted = {rid: [t] for rid, t in zip(out.request_ids, out.token_ids)}
    for rid, draft in (out.drafts or {}).items():
        emitted[rid] += draft.token_ids
    return emitted


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

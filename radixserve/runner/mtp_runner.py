"""The MTP block's forwards (``--speculative mtp``), run by the target's runner right after a
step (spec/mtp.py is the scheduler's side).

The block (models/qwen35.py: ``MtpBlock``) predicts the token after next from the final
hidden state at a position and the token that follows it. Its attention has a KV layer of
its own, indexed by the target's block ids (so it follows the target's blocks through prefix
hits, preemption and frees), plus a few scratch pages past the pool's for proposals that run
beyond a sequence's blocks. Per step, batched over the sequences with an `MtpWork`:

1. catch-up: at every position the step fed and kept (a verified draft's rejected tail
   excepted), the target's hidden state and the token after it (the next fed one, the
   prompt's next token after a chunk, or the token the step emitted), writing the block's KV
   there; its output at the last kept position gives the first proposal;
2. ``num_propose - 1`` single-token forwards, each feeding the token proposed last and the
   block's own hidden state from the position before (their KV is scratch: the next step's
   catch-up rewrites those positions with the target's hidden states).

Proposals are greedy (a point mass q, so verification stays exact under sampling). A cached
block's last position keeps the KV its writer computed from that writer's next token; a
request that shares the block but continues differently drafts from it as is (drafts only:
the output never depends on it).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from radixserve.config import MAX_SPECULATIVE_TOKENS
from radixserve.core.sched_output import ModelRunnerOutput, Proposal, ScheduledSeq
from radixserve.layers.forward_context import ForwardContext, forward_context
from radixserve.runner.draft_runner import TargetStep, emitted_tokens
from radixserve.runner.kv_cache import allocate_kv_cache


class _Feed:
    """One sequence's catch-up: its ``tokens`` (the ones after each kept position) from
    ``start``, over the target's hidden rows ``row ...``."""

    __slots__ = ("seq", "tokens", "row", "start")

    def __init__(self, seq: ScheduledSeq, tokens: list[int], row: int) -> None:
        self.seq, self.tokens, self.row, self.start = seq, tokens, row, seq.start_pos


class MtpRunner:
    def __init__(self, runner, num_blocks: int, max_num_seqs: int) -> None:
        """``runner``: the target's ModelRunner (one KV group) over a pool of ``num_blocks``
        blocks; its model runs an MTP block. ``max_num_seqs``: the most sequences a step
        proposes for (each gets scratch pages of its own)."""
        model, cfg = runner.model, runner.model.config
        if cfg.num_mtp_layers < 1 or len(runner.groups.groups) != 1:
            raise ValueError("the MTP drafter needs a model with an MTP block and one KV group")
        self.runner, self.model = runner, model
        self.name = "mtp"
        self.block_size = bs = runner.block_size
        self.first_scratch = num_blocks
        self.scratch_per_seq = -(-MAX_SPECULATIVE_TOKENS // bs) + 1
        view = replace(cfg.kv_view(), num_layers=cfg.num_mtp_layers)
        caches = allocate_kv_cache(view, num_blocks + max_num_seqs * self.scratch_per_seq, bs,
                                   runner.kv_caches[0][0].dtype, runner.device)
        self.kv_caches = list(runner.kv_caches) + caches  # the block's layers after the pool's
        self._decode_s: list[float] = []

    @torch.inference_mode()
    def propose(self, step: TargetStep, out: ModelRunnerOutput) -> None:
        """Write the block's KV for the step's kept positions and fill ``out.proposals`` (and
        the drafting's timing) for the sampling sequences that asked for proposals."""
        begin = time.perf_counter()
        self._decode_s = []
        feeds = self._feeds(step, emitted_tokens(out))
        if not feeds:
            return
        seqs = [ScheduledSeq(f.seq.request_id, f.tokens, f.start, f.seq.block_ids, True)
                for f in feeds]
        rows = torch.from_numpy(np.concatenate(
            [np.arange(f.row, f.row + len(f.tokens)) for f in feeds]))
        last = self._forward(seqs, step.hidden.index_select(0, rows.to(step.hidden.device)))
        asking = [i for i, f in enumerate(feeds) if f.seq.sample and f.seq.mtp.num_propose > 0]
        if not asking:
            return
        hidden = last[asking]  # row n: the n-th proposer's latest output
        proposed: list[list[int]] = [[] for _ in asking]
        self._greedy(hidden, proposed)
        num_forwards = 1
        for j in range(1, max(feeds[i].seq.mtp.num_propose for i in asking)):
            live = [n for n, i in enumerate(asking) if feeds[i].seq.mtp.num_propose > j]
            seqs = [self._scratch_seq(feeds[asking[n]], n, proposed[n][-1], j) for n in live]
            index = torch.tensor(live, device=hidden.device)
            rows = self._forward(seqs, hidden.index_select(0, index), step=j)
            self._greedy(rows, [proposed[n] for n in live])
            hidden = hidden.index_copy(0, index, rows)
            num_forwards += 1
        out.proposals = {feeds[i].seq.request_id: Proposal(
            proposed[n], feeds[i].start + len(feeds[i].tokens) + 1)
            for n, i in enumerate(asking)}
        out.draft_seconds = time.perf_counter() - begin
        out.num_draft_forwards = num_forwards
        if self._decode_s:
            out.draft_forward_s = sum(self._decode_s) / len(self._decode_s)

    def _feeds(self, step: TargetStep, emitted: dict[str, list[int]]) -> list[_Feed]:
        """The catch-up of each sequence with an `MtpWork`, its hidden rows located."""
        feeds, row = [], 0
        for s in step.seqs:
            if s.mtp is not None:
                if s.sample:  # kept: the fed tokens but a draft's rejected tail
                    e = emitted[s.request_id]
                    kept = s.num_tokens - s.num_draft + len(e) - 1
                    tokens = s.token_ids[1:kept] + [e[-1]]
                elif s.mtp.next_token_id is not None:
                    tokens = s.token_ids[1:] + [s.mtp.next_token_id]
                else:  # a chunk that ends a prompt without sampling: no token after it
                    tokens = s.token_ids[1:]
                if tokens:
                    feeds.append(_Feed(s, tokens, row))
            row += s.num_tokens
        return feeds

    def _scratch_seq(self, feed: _Feed, index: int, token: int, j: int) -> ScheduledSeq:
        """The ``j``-th proposal's forward of ``feed``'s sequence (the ``index``-th that
        proposes), its block table grown into its own scratch pages where the position is
        past its blocks."""
        pos = feed.start + len(feed.tokens) + j - 1
        table = feed.seq.block_ids
        missing = pos // self.block_size + 1 - len(table)
        if missing > 0:
            first = self.first_scratch + index * self.scratch_per_seq
            table = table + list(range(first, first + missing))
        return ScheduledSeq(feed.seq.request_id, [token], pos, table, True)

    def _forward(self, seqs: list[ScheduledSeq], hidden: torch.Tensor,
                 step: int = 0) -> torch.Tensor:
        """The block over ``seqs`` (``hidden``: their rows, in order); its output at each
        one's last position, in the given order."""
        start = time.perf_counter()
        order, _, (input_ids, positions, metas, last) = self.runner.pack(seqs)
        if order != sorted(order):
            hidden = _packed_rows(hidden, seqs, order)
        ctx = ForwardContext(metas[0], self.kv_caches, self.runner.backend,
                             [metas[0]] * len(self.kv_caches))
        with forward_context(ctx):
            out = self.model.mtp_hidden(input_ids, hidden, positions, step)
        result = torch.empty((len(seqs), out.shape[-1]), dtype=out.dtype, device=out.device)
        result[torch.tensor(order, device=out.device)] = out[last]
        if max(s.num_tokens for s in seqs) <= 2:
            self._decode_s.append(time.perf_counter() - start)
        return result

    def _greedy(self, hidden: torch.Tensor, into: list[list[int]]) -> None:
        """Append each row's greedy token to its list of ``into``."""
        for proposal, t in zip(into, self.model.compute_logits(hidden).argmax(dim=-1).tolist()):
            proposal.append(t)


def _packed_rows(hidden: torch.Tensor, seqs: list[ScheduledSeq], order: list[int]):
    """``hidden`` (rows of ``seqs`` in the given order) in packed ``order``."""
    offsets = np.cumsum([0] + [s.num_tokens for s in seqs])
    index = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in order])
    return hidden.index_select(0, torch.from_numpy(index).to(hidden.device))

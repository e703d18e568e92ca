"""The runners of a tensor-parallel engine: rank 0's, which broadcasts each forward's input
before running its own share, and the loop of the other ranks, which run the same forward on
theirs.

One message per step (an int64 array), the runner's input and nothing else:

    [num_seqs, then per seq (num_tokens, start_pos, num_blocks, sample, num_draft),
     then every seq's token ids, then every seq's block ids]        num_seqs -1: stop

Every rank packs the seqs in the same order (the runner's stable sort), so row i of each
all-reduce is the same token on every rank; only rank 0 computes logits and samples.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from radixserve.core.sched_output import ModelRunnerOutput, ScheduledSeq, SchedulerOutput

_FIELDS = 5
STOP = np.array([-1], np.int64)


def encode_step(seqs: list[ScheduledSeq]) -> np.ndarray:
    n = len(seqs)
    head = np.fromiter(chain.from_iterable(
        (s.num_tokens, s.start_pos, len(s.block_ids), s.sample, s.num_draft) for s in seqs),
        np.int64, n * _FIELDS)
    tokens = np.fromiter(chain.from_iterable(s.token_ids for s in seqs), np.int64)
    blocks = np.fromiter(chain.from_iterable(s.block_ids for s in seqs), np.int64)
    return np.concatenate((np.array([n], np.int64), head, tokens, blocks))


def decode_step(message: np.ndarray) -> list[ScheduledSeq] | None:
    """The seqs of a step message; None for the stop message."""
    n = int(message[0])
    if n < 0:
        return None
    head = message[1:1 + n * _FIELDS].reshape(n, _FIELDS).tolist()
    rest = message[1 + n * _FIELDS:].tolist()
    num_tokens = sum(h[0] for h in head)
    tokens, blocks = rest[:num_tokens], rest[num_tokens:]
    seqs, t, b = [], 0, 0
    for num, start, num_blocks, sample, num_draft in head:
        seqs.append(ScheduledSeq("", tokens[t:t + num], start, blocks[b:b + num_blocks],
                                 bool(sample), num_draft=num_draft))
        t, b = t + num, b + num_blocks
    return seqs


class TensorParallelRunner:
    """Rank 0's runner: ``execute`` and ``all_logits`` as `ModelRunner`'s, each forward's input
    sent to the other ranks first. Other attributes are the local runner's (its model is rank
    0's shard). ``close()`` stops the other ranks."""

    def __init__(self, runner, group) -> None:
        self.runner = runner
        self.group = group

    def execute(self, sched: SchedulerOutput, grammar=None) -> ModelRunnerOutput:
        self.group.comm.send_step(encode_step(sched.seqs))
        return self.runner.execute(sched, grammar)

    def all_logits(self, seqs: list[ScheduledSeq]):
        self.group.comm.send_step(encode_step(seqs))
        return self.runner.all_logits(seqs)

    def close(self) -> None:
        self.group.close()

    def add_lora(self, lora_id: int, path: str) -> None:
        """Refused: the other ranks' shards and the step message carry no adapter."""
        raise ValueError("LoRA adapters are not supported with tensor parallel")

    def __getattr__(self, name: str):
        return getattr(self.runner, name)


def serve_steps(runner, comm) -> None:
    """Ranks > 0: run each step rank 0 sends (the forward only) until the stop message."""
    while (seqs := decode_step(comm.recv_step())) is not None:
        runner.forward_only(seqs)

"""EncoderRunner: a step's cross-encoder pairs → one padded bidirectional forward → their
classifier logits (the `ModelRunner` of a cross-encoder engine: engine/encoder_build.py).

Every scheduled sequence is a whole pair (the scheduler runs without chunked prefill) with
``classify`` pooling; there is no KV cache, so the block ids are ignored. The batch::

    row i:  [ ids of pair i ............ | pad ... ]   L = the step's longest pair
    types:  [ 0 ... 0 | 1 ... 1 (from second_segment_start) | 0 ... ]

Padded keys are masked, so a pair's logit is its own whatever it is batched with.
"""

from __future__ import annotations

import numpy as np
import torch

from radixserve.core.sched_output import (GrammarBitmask, ModelRunnerOutput, ScheduledSeq,
                                          SchedulerOutput)
from radixserve.models.bert import CrossEncoder


class EncoderRunner:
    def __init__(self, model: CrossEncoder, device: torch.device) -> None:
        self.model = model
        self.device = device

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput,
                grammar: GrammarBitmask | None = None) -> ModelRunnerOutput:
        """The logits of every pair of the step, as ``pooled`` (nothing is sampled)."""
        seqs = sched.seqs
        logits = self.model(*self._inputs(seqs)).tolist()
        return ModelRunnerOutput([], [], [], [],
                                 pooled={s.request_id: row for s, row in zip(seqs, logits)})

    def _inputs(self, seqs: list[ScheduledSeq]) -> tuple[torch.Tensor, ...]:
        """(input ids, token types, lengths), built in numpy and moved once each."""
        lengths = np.fromiter((s.num_tokens for s in seqs), np.int64, len(seqs))
        ids = np.full((len(seqs), int(lengths.max())), self.model.config.pad_token_id, np.int64)
        types = np.zeros_like(ids)
        for i, s in enumerate(seqs):
            assert s.start_pos == 0 and s.is_last_chunk and s.pooling is not None, \
                "an encoder step holds whole pairs"
            ids[i, :s.num_tokens] = s.token_ids
            if s.pooling.second_segment_start is not None:
                types[i, s.pooling.second_segment_start:s.num_tokens] = 1
        return tuple(torch.from_numpy(a).to(self.device) for a in (ids, types, lengths))

"""Pooling an embedding request's hidden states over the packed batch (see `PoolingParams`).

The model's output is the final-norm hidden state of every fed token, packed in batch order:

    hidden: [ seq 0 tokens | seq 1 tokens | seq 2 tokens ... ]   [num_tokens, hidden]
              ^cu[0]-q[0]    ^cu[1]-q[1]

Last pooling picks row ``cu[i] - 1`` of each sequence whose prompt ends in this step; mean
pooling sums each pooling sequence's rows (in float32, one ``index_add_`` over the batch: a
row's contribution does not depend on its neighbours, so a vector is the same batched or alone).
"""

from __future__ import annotations

import torch

from radixserve.core.sched_output import ScheduledSeq


def pool_hidden(seqs: list[ScheduledSeq], hidden: torch.Tensor) -> dict[str, list[float]]:
    """{request id: pooled vector} for the embedding sequences of the step (``seqs`` in the
    packed order of ``hidden``); empty when there are none (the common case, no work)."""
    last_rows, last_ids = [], []
    mean_rows, mean_segments, mean_ids = [], [], []
    end = 0
    for seq in seqs:
        start, end = end, end + seq.num_tokens
        if seq.pooling is None:
            continue
        if seq.pooling.pooling == "mean":
            mean_rows.extend(range(start, end))
            mean_segments.extend([len(mean_ids)] * seq.num_tokens)
            mean_ids.append(seq.request_id)
        elif seq.is_last_chunk:
            last_rows.append(end - 1)
            last_ids.append(seq.request_id)
    out: dict[str, list[float]] = {}
    if last_ids:
        rows = torch.tensor(last_rows, device=hidden.device)
        out.update(zip(last_ids, hidden[rows].float().tolist()))
    if mean_ids:
        rows = torch.tensor(mean_rows, device=hidden.device)
        segments = torch.tensor(mean_segments, device=hidden.device)
        sums = torch.zeros(len(mean_ids), hidden.shape[-1], dtype=torch.float32,
                           device=hidden.device)
        sums.index_add_(0, segments, hidden[rows].float())
        out.update(zip(mean_ids, sums.tolist()))
    return out

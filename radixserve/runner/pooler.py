"""Pooling an embedding request's hidden states over the packed batch (see `PoolingParams`).

The model's output is the final-norm hidden state of every fed token, packed in batch order:

    hidden: [ seq 0 tokens | seq 1 tokens | seq 2 tokens ... ]   [num_tokens, hidden]
              ^cu[0]-q[0]    ^cu[1]-q[1]

Last pooling picks row ``cu[i] - 1`` of each sequence whose prompt ends in this step; mean
pooling sums each pooling sequence's rows (in float32, one ``index_add_`` over the batch: a
row's contribution does not depend on its neighbours, so a vector is the same batched or alone).

A last-pooled sequence with ``logit_token_ids`` gets, instead of its hidden state, the raw
logits of those tokens there: its row goes through the model's output layer in tiles of
`TILE` rows, as prompt logprobs do (runner/prompt_logprobs.py), so the values do not depend
on what else the step holds.
"""

from __future__ import annotations

import torch

from collections.abc import Callable

from radixserve.core.sched_output import ScheduledSeq
from radixserve.runner.prompt_logprobs import TILE


def pool_hidden(seqs: list[ScheduledSeq], hidden: torch.Tensor,
                compute_logits: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> dict[str, list[float]]:
    """{request id: pooled vector} for the embedding sequences of the step (``seqs`` in the
    packed order of ``hidden``); empty when there are none (the common case, no work).
    ``compute_logits`` (the model's output layer) serves sequences with ``logit_token_ids``."""
    last_rows, last_ids = [], []
    logit_rows, logit_ids, logit_tokens = [], [], []
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
        elif seq.is_last_chunk and seq.pooling.logit_token_ids is not None:
            logit_rows.append(end - 1)
            logit_ids.append(seq.request_id)
            logit_tokens.append(seq.pooling.logit_token_ids)
        elif seq.is_last_chunk:
            last_rows.append(end - 1)
            last_ids.append(seq.request_id)
    out: dict[str, list[float]] = {}
    if logit_ids:
        assert compute_logits is not None, "logit_token_ids need the model's output layer"
        out.update(zip(logit_ids, _token_logits(hidden, logit_rows, logit_tokens,
                                                compute_logits)))
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


def _token_logits(hidden: torch.Tensor, rows: list[int], tokens: list[list[int]],
                  compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> list[list[float]]:
    """Row ``rows[i]``'s logits of ``tokens[i]``, each row's logits computed in a tile of
    exactly `TILE` rows (the last padded with zeros)."""
    picked = hidden[torch.tensor(rows, device=hidden.device)]
    pad = -len(rows) % TILE
    if pad:
        picked = torch.cat([picked, picked.new_zeros(pad, picked.shape[1])])
    logits = torch.cat([compute_logits(tile).float() for tile in picked.split(TILE)])
    return [logits[i, ids].tolist() for i, ids in enumerate(tokens)]

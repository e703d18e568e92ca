"""Prompt logprobs from the step's hidden states: the rows each chunk was asked for
(`PromptLogprobsWork`, core/prompt_logprobs.py), through the model's logits, in the same
forward as the step (no second pass).

Batch invariance: the logits of the scored rows are computed in tiles of exactly ``TILE`` rows
(the last one padded with zero rows), so every row goes through the same matrix shape whatever
else the step holds and wherever the row sits in its tile; a float matmul's result for a row
can depend on the number of rows it is computed with (a one-row product takes another kernel),
never on the other rows' values at a fixed shape. The log-softmax is per row. A prompt token's
logprob is then the same alone, batched or chunked, as far as the hidden state is.
"""

from __future__ import annotations

import torch

from radixserve.core.sched_output import ScheduledSeq

TILE = 32
"""Rows per logits product. Each tile reads the output matrix once: long prompts want it
large, and a short prompt's padding wants it small."""


def prompt_logprobs(model: torch.nn.Module, seqs: list[ScheduledSeq], hidden: torch.Tensor
                    ) -> dict[str, tuple[list[float], list[list[tuple[int, float]]]]]:
    """{request id: (logprobs, top alternatives)} of the step's scored prompt tokens (``seqs``
    in the packed order of ``hidden``); empty when no chunk scores any (no work)."""
    rows: list[int] = []
    targets: list[int] = []
    owners: list[tuple[str, int, int]] = []  # (request id, number of tokens, num_top)
    end = 0
    for seq in seqs:
        start, end = end, end + seq.num_tokens
        work = seq.prompt_logprobs
        if work is None:
            continue
        first = start + work.first_row
        rows.extend(range(first, first + len(work.targets)))
        targets.extend(work.targets)
        owners.append((seq.request_id, len(work.targets), work.num_top))
    if not owners:
        return {}
    scored = hidden[torch.tensor(rows, device=hidden.device)]
    pad = -len(rows) % TILE
    if pad:
        scored = torch.cat([scored, scored.new_zeros(pad, scored.shape[1])])
    num_top = max(1, max(k for _, _, k in owners))
    values, top_values, top_ids = [], [], []
    target_ids = torch.tensor(targets, device=hidden.device)
    for i, tile in enumerate(scored.split(TILE)):
        logprobs = torch.log_softmax(model.compute_logits(tile).float(), dim=-1)
        tile_targets = target_ids[i * TILE:(i + 1) * TILE]
        n = tile_targets.numel()
        values.append(logprobs[:n].gather(1, tile_targets.unsqueeze(1)).squeeze(1))
        best = logprobs[:n].topk(num_top, dim=-1)
        top_values.append(best.values)
        top_ids.append(best.indices)
    lps = torch.cat(values).tolist()
    top_lp, top_id = torch.cat(top_values).tolist(), torch.cat(top_ids).tolist()
    out = {}
    offset = 0
    for rid, count, k in owners:
        span = range(offset, offset + count)
        out[rid] = ([lps[j] for j in span],
                    [list(zip(top_id[j][:k], top_lp[j][:k])) for j in span])
        offset += count
    return out

"""Verification of speculative drafts from the logits of one batched forward.

A sequence that fed ``k`` draft tokens ``d`` has logits at its last ``k + 1`` positions; row
``i`` of those predicts the token after ``d[:i]``. Each row is sampled exactly as a plain decode
step would be at that point (penalties, min_tokens, grammar mask over output + ``d[:i]``, and
the uniform of (seed, step ``len(output) + i``)), giving ``t[i]``; the emitted tokens are the
longest prefix of ``d`` with ``t[i] == d[i]``, then the first ``t`` after it (the correction,
or the bonus token when all ``k`` matched).

- Greedy: ``t`` is the target's argmax, so the output is token for token greedy decoding's.
- Sampling: this is the standard accept / reject rule. With ``p`` the target's distribution
  at a row and ``q`` the proposer's, the rule accepts ``d[i]`` with probability
  ``min(1, p(d[i]) / q(d[i]))`` and otherwise emits a draw of the residual
  ``max(p - q, 0)`` renormalised. The proposers here are deterministic: ``q`` is one-hot at
  ``d[i]``, so the acceptance probability is ``p(d[i])`` and the residual is ``p`` without
  ``d[i]``, renormalised. Drawing ``t ~ p`` and accepting iff ``t == d[i]`` realises exactly
  that: P(accept) = ``p(d[i])``, and ``t`` given ``t != d[i]`` has the residual distribution.
  The draw uses the step's own uniform, so a seeded request emits the very tokens it would
  emit without speculation: its output depends neither on the drafts nor on its batch.
"""

from __future__ import annotations

import torch

from radixserve.core.sched_output import DraftResult, ModelRunnerOutput, ScheduledSeq
from radixserve.runner.sampler import Sampler, SamplingBatch


def verify_drafts(sampler: Sampler, seqs: list[ScheduledSeq], logits: torch.Tensor,
                  grammar_mask: tuple[torch.Tensor, torch.Tensor] | None,
                  device: torch.device) -> ModelRunnerOutput:
    """``logits``: the rows of ``seqs`` in order, ``num_draft + 1`` per sequence;
    ``grammar_mask``: (row indexes into those rows, bitmask)."""
    first, params, seeds, outputs, prompts, stops = [], [], [], [], [], []
    for s in seqs:
        first.append(len(params))
        draft = s.draft_token_ids
        for i in range(s.num_draft + 1):
            params.append(s.sampling_params)
            seeds.append(s.seed)
            outputs.append(s.output_token_ids + draft[:i] if i else s.output_token_ids)
            prompts.append(s.prompt_token_ids)
            stops.append(s.stop_token_ids)
    batch = SamplingBatch.build(params=params, seeds=seeds, output_token_ids=outputs,
                                prompt_token_ids=prompts, stop_token_ids=stops,
                                vocab_size=logits.shape[-1], device=device,
                                grammar_mask=grammar_mask)
    out = sampler(logits, batch)
    sampled = out.token_ids.tolist()
    emitted: list[list[int]] = []  # per seq: the tokens it emits, and their rows
    rows_of: list[list[int]] = []
    for j, s in enumerate(seqs):
        f, draft = first[j], s.draft_token_ids
        n_acc = 0  # t ~ p at each row (argmax if greedy); accept d[i] iff t[i] == d[i]
        while n_acc < s.num_draft and sampled[f + n_acc] == draft[n_acc]:
            n_acc += 1
        emitted.append(draft[:n_acc] + [sampled[f + n_acc]])
        rows_of.append(list(range(f, f + n_acc + 1)))

    # the emitted tokens are the rows' samples: their logprobs are the sampler's
    lp = top = None
    if out.logprobs is not None:
        lp = out.logprobs.tolist()
        top = (out.top_logprobs[0].tolist(), out.top_logprobs[1].tolist())

    def logprob(s: ScheduledSeq, r: int):
        n = s.sampling_params.logprobs
        if n is None or lp is None:
            return None, None
        return lp[r], list(zip(top[0][r][:n], top[1][r][:n]))

    ids, firsts, lps, tops, drafts = [], [], [], [], {}
    for j, s in enumerate(seqs):
        pairs = [logprob(s, r) for r in rows_of[j]]
        ids.append(s.request_id)
        firsts.append(emitted[j][0])
        lps.append(pairs[0][0])
        tops.append(pairs[0][1])
        if s.num_draft:
            drafts[s.request_id] = DraftResult(
                s.num_draft, len(emitted[j]) - 1, emitted[j][1:],
                [p[0] for p in pairs[1:]], [p[1] for p in pairs[1:]])
    return ModelRunnerOutput(ids, firsts, lps, tops, drafts)


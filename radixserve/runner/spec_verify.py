"""Verification of speculative drafts from the logits of one batched forward.

A sequence that fed ``k`` draft tokens ``d`` has logits at its last ``k + 1`` positions; row
``i`` of those predicts the token after ``d[:i]``. Each row is sampled as a plain decode step
would be at that point (penalties, min_tokens, grammar mask over output + ``d[:i]``, seed and
step ``len(output) + i``), then:

- greedy: accept the longest prefix of ``d`` equal to the rows' argmax, emit the argmax after
  it (a correction, or the bonus token when all ``k`` matched): token for token what greedy
  decoding without a draft emits;
- sampling: the standard rule. With ``p`` the target's distribution at a row and ``q`` the
  proposer's, accept ``d[i]`` with probability ``min(1, p(d[i]) / q(d[i]))``; at the first
  rejection emit a token of the residual ``max(p - q, 0)`` renormalised and stop; when all are
  accepted emit the last row's regular sample. The emitted tokens are distributed as the
  target's. The proposers here are deterministic, so ``q`` is one-hot at ``d[i]``.

Both uniforms per row (accept test, residual draw) are functions of the request's seed and the
row's step only, so a seeded request's output does not depend on its batch.
"""

from __future__ import annotations

import torch

from radixserve.core.sched_output import DraftResult, ModelRunnerOutput, ScheduledSeq
from radixserve.runner.sampler import (
    Sampler,
    SamplingBatch,
    _inverse_cdf,
    _uniform,
    target_probs,
)

_ACCEPT_STREAM = 0x5DEECE66D  # xored into the seed: the accept test's own random stream


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
    greedy = (batch.temperature == 0).tolist()

    emitted: list[list[int]] = []  # per seq: row indexes and tokens
    rows_of: list[list[int]] = []
    sampling = [j for j, s in enumerate(seqs) if s.num_draft and not greedy[first[j]]]
    accepted_sampling = _accept_sampled(logits, batch, seqs, first, sampling)
    for j, s in enumerate(seqs):
        f, draft = first[j], s.draft_token_ids
        if j in accepted_sampling:
            n_acc, last = accepted_sampling[j]
            if last is None:  # all accepted: the last row's regular sample is the bonus token
                last = sampled[f + n_acc]
        else:  # greedy (or no draft): the rows' argmax / regular sample
            n_acc = 0
            while n_acc < s.num_draft and sampled[f + n_acc] == draft[n_acc]:
                n_acc += 1
            last = sampled[f + n_acc]
        emitted.append(draft[:n_acc] + [last])
        rows_of.append(list(range(f, f + n_acc + 1)))

    lp_rows = top_rows = None
    if out.logprobs is not None:
        raw = torch.log_softmax(logits.float(), dim=-1)
        flat_rows = [r for rows in rows_of for r in rows]
        flat_toks = [t for toks in emitted for t in toks]
        lp_rows = dict(zip(flat_rows, raw[flat_rows, flat_toks].tolist()))
        top_ids, top_lp = out.top_logprobs[0].tolist(), out.top_logprobs[1].tolist()
        top_rows = (top_ids, top_lp)

    def logprob(s: ScheduledSeq, r: int):
        n = s.sampling_params.logprobs
        if n is None or lp_rows is None:
            return None, None
        return lp_rows[r], list(zip(top_rows[0][r][:n], top_rows[1][r][:n]))

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


def _accept_sampled(logits: torch.Tensor, batch: SamplingBatch, seqs: list[ScheduledSeq],
                    first: list[int], which: list[int]) -> dict[int, tuple[int, int | None]]:
    """For the sampled (non-greedy) sequences ``which``: {seq index: (accepted drafts, the
    residual token emitted after them, or None when all were accepted)} by the accept /
    residual rule."""
    if not which:
        return {}
    p = target_probs(logits, batch)  # [rows, V]: the target's distribution per row
    u_residual = _uniform(batch.seeds, batch.steps)  # the plain sample's uniform at each row
    u_accept = _uniform(batch.seeds ^ _ACCEPT_STREAM, batch.steps)
    draft_rows = [first[j] + i for j in which for i in range(seqs[j].num_draft)]
    draft_toks = [t for j in which for t in seqs[j].draft_token_ids]
    rows_t = torch.tensor(draft_rows, device=logits.device)
    toks_t = torch.tensor(draft_toks, device=logits.device)
    p_d = p[rows_t, toks_t].double()
    q_d = torch.ones_like(p_d)  # q: one-hot at the drafted token (a deterministic proposer)
    accept = (u_accept[rows_t] < torch.clamp(p_d / q_d, max=1.0)).tolist()

    result: dict[int, tuple[int, int | None]] = {}
    rejected_rows, rejected_seq = [], []
    k0 = 0
    for j in which:
        k = seqs[j].num_draft
        n_acc = 0
        while n_acc < k and accept[k0 + n_acc]:
            n_acc += 1
        k0 += k
        if n_acc == k:
            result[j] = (k, None)
        else:
            rejected_rows.append(first[j] + n_acc)
            rejected_seq.append((j, n_acc))
    if rejected_rows:
        rows = torch.tensor(rejected_rows, device=logits.device)
        q = torch.zeros_like(p[rows])
        q[torch.arange(len(rejected_rows)), torch.tensor(
            [seqs[j].draft_token_ids[n] for j, n in rejected_seq])] = 1.0
        residual = torch.clamp(p[rows] - q, min=0.0)  # max(p - q, 0); _inverse_cdf normalises
        tokens = _inverse_cdf(residual, u_residual[rows]).tolist()
        for (j, n_acc), token in zip(rejected_seq, tokens):
            result[j] = (n_acc, token)
    return result


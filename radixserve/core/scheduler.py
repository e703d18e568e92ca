"""Scheduler: token accounting over a token budget; continuous batching with chunked prefill.

There are no prefill/decode phases. Every request has ``num_computed_tokens`` chasing
``num_tokens``; each step hands out at most ``max_num_batched_tokens`` tokens, running requests
first (decodes before unfinished prefill chunks), then waiting requests in queue order. A prompt
longer than the remaining budget is split into chunks across steps.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time

from radixserve.core import pooled
from radixserve.core.images import fit_chunk, overlapping, rope_shift
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.prompt_progress import progress_outputs
from radixserve.core.reports import EngineCoreOutput, SchedulerStats
from radixserve.core.request import Request, RequestStatus
from radixserve.core.sched_config import SchedulerConfig
from radixserve.core.sched_output import ModelRunnerOutput, ScheduledSeq, SchedulerOutput
from radixserve.core.spec_hooks import NO_SPEC, SpecHooks
from radixserve.core.stop import check_stop


def _next_page(request: Request, computed: int, page: int) -> tuple | None:
    """The prompt page a request computes next, given ``computed`` tokens already in KV:
    ``(its LoRA adapter, start, its tokens)``, or None when less than a full page of prompt
    is left."""
    start = computed - computed % page
    if request.num_prompt_tokens - start < page:
        return None
    return (request.lora_id, start, *request.prompt_token_ids[start:start + page])


logger = logging.getLogger(__name__)

_LPM_MAX_WAITING = 256  # beyond this, matching every waiting request costs more than it saves


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, max_model_len: int,
                 spec: SpecHooks = NO_SPEC) -> None:
        """``spec``: speculative decoding (drafts added after each step's real work)."""
        self.config = config
        self.spec = spec
        self.kv = kv
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._order = itertools.count()
        self._queue_keys: dict[str, tuple] = {}
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add_request(self, request: Request) -> None:
        """Queue a request. ValueError if it could never fit in the KV pool."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        longest = min(request.num_prompt_tokens + request.max_tokens, self.max_model_len)
        need = self.kv.units_held(longest, self.config.max_num_batched_tokens)
        if need > self.kv.num_usable_blocks:
            raise ValueError(
                f"request needs up to {need} KV blocks ({longest} tokens) but the pool holds "
                f"{self.kv.num_usable_blocks}; raise the KV cache memory budget")
        request.spec = self.spec.new_state()
        self.requests[request.request_id] = request
        self._queue_keys[request.request_id] = (request.priority, request.arrival_time,
                                                next(self._order))
        self._enqueue(request)

    def abort_requests(self, request_ids: list[str], reason: str = "abort") -> list[Request]:
        """Finish the given requests wherever they are, freeing their blocks."""
        aborted = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            if request.status is RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            self._finish(request, reason)
            aborted.append(request)
        return aborted

    def fail_requests(self, request_ids: list[str]) -> list[Request]:
        """Finish the given requests with reason "error" (a fault while running them),
        freeing their blocks; the KV of a failed step was never marked computed or cached."""
        return self.abort_requests(request_ids, "error")

    def preempt_running(self) -> list[str]:
        """Preempt every running request (recompute-style: its KV freed, its computed prefix
        left to the prefix cache, which it no longer locks), e.g. so the prefix cache can be
        reset; they resume from the waiting queue. Returns their ids."""
        preempted = [r.request_id for r in self.running]
        for request in list(self.running):
            self._preempt(request)
        return preempted

    def schedule(self) -> SchedulerOutput:
        if self.config.policy == "lpm" and 1 < len(self.waiting) <= _LPM_MAX_WAITING:
            self._order_by_prefix_match()
        budget = self.config.max_num_batched_tokens
        seqs: list[ScheduledSeq] = []
        scheduled: set[str] = set()
        preempted: list[str] = []

        # Running requests: decodes (1 new token) before unfinished prefill chunks.
        for request in sorted(self.running, key=lambda r: r.num_new_tokens > 1):
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = self._chunk(request, budget)
            if num_new == 0:
                continue  # an image that must go whole waits for a step with room
            while not self.kv.allocate_slots(request, num_new):
                victim = self._pick_victim(scheduled)
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                continue
            seqs.append(self._scheduled_seq(request, num_new))
            scheduled.add(request.request_id)
            budget -= num_new

        # Waiting requests, in queue order, while blocks, budget and seats last. A request whose
        # next uncached page is being prefilled by another one right now (the n samples of one
        # request, the same new system prompt) waits, then reuses that KV through the prefix
        # cache instead of computing the same pages in the same step (in-batch prefix sharing).
        # Requests whose shared part is already cached go ahead together.
        page = self.kv.block_size
        share = self.kv.prefix_cache.reuses_prefixes
        prefilling = ({_next_page(r, r.num_computed_tokens, page) for r in self.running}
                      if share else set())
        prefilling.discard(None)
        i = 0
        while (i < len(self.waiting) and budget > 0 and not preempted
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting[i]
            key = None
            reads_cache = request.reads_prefix_cache
            if share and not request.block_ids and reads_cache:
                cached = self.kv.cached_len(request)
                key = _next_page(request, cached, page)
            if (key is not None and key in prefilling) or not request.grammar.is_ready:
                i += 1  # (a constrained request waits for its grammar's compile)
                continue
            if not request.block_ids and reads_cache:
                cached = self.kv.match_and_lock(request)
                request.num_computed_tokens = cached
                if request.num_preemptions == 0:
                    request.num_cached_tokens = cached
            num_new = self._chunk(request, budget)
            is_whole = self.config.chunked_prefill or num_new == request.num_new_tokens
            if not num_new or not is_whole or not self.kv.allocate_slots(request, num_new):
                self.kv.free(request)
                request.num_computed_tokens = 0
                break
            self.waiting.pop(i)
            if key is not None:
                prefilling.add(key)  # it computes pages that others may reuse
            if request.queue_time is None:
                request.queue_time = max(0.0, time.time() - request.arrival_time)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            seqs.append(self._scheduled_seq(request, num_new))
            budget -= num_new

        # no drafts in a step that preempted (memory is short), but a drafter that runs
        # after every step (a draft model, the MTP block) still plans its work
        budget -= self.spec.add_drafts(seqs, self.requests, 0 if preempted else budget,
                                       self.kv, self.max_model_len)
        num_batched = self.config.max_num_batched_tokens - budget
        return SchedulerOutput(seqs, num_batched, preempted)

    def update_from_output(self, sched: SchedulerOutput,
                           result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Advance computed tokens, append sampled tokens, finish stopped requests."""
        block_size = self.kv.block_size
        drafts = result.drafts or {}
        computed_before = {}
        progressed = []  # requests that asked for prompt progress and ran a prompt chunk
        for seq in sched.seqs:
            request = self.requests[seq.request_id]
            if seq.num_draft:  # advanced by what verification kept, below
                computed_before[seq.request_id] = request.num_computed_tokens
                continue
            request.num_computed_tokens += seq.num_tokens
            if seq.num_tokens > 1 or request.num_computed_tokens % block_size == 0:
                self.kv.cache_computed(request)  # a prefill chunk done or a block filled
            if (request.sampling_params.return_progress
                    and seq.start_pos < request.num_prompt_tokens):
                progressed.append(request)
        for rid, (lps, tops) in result.prompt_logprobs.items():
            self.requests[rid].prompt_logprobs.add(lps, tops)
        outputs = progress_outputs(progressed, time.time()) if progressed else []
        outputs += self._scored_outputs(sched)  # before any request below finishes
        outputs += self._pooled_outputs(result.pooled)
        for i, rid in enumerate(result.request_ids):
            request = self.requests[rid]
            num_before = request.num_output_tokens
            tokens, logprobs, tops = [result.token_ids[i]], [result.logprobs[i]], [
                result.top_logprobs[i]]
            draft = drafts.get(rid)
            if forced := request.budget.take_forced(request.output_token_ids):
                # NOTE: the reasoning budget is spent: the end of thinking replaces the sampled
                # token (not fed yet: the KV is unchanged); `cap_draft` kept drafts away
                assert draft is None, "a draft past the reasoning budget"
                tokens, logprobs = forced, [None if logprobs[0] is None else 0.0] * len(forced)
                tops = [None] * len(forced)
            if draft is not None:
                tokens += draft.token_ids
                logprobs += draft.logprobs
                tops += draft.top_logprobs
            reason, error = self._advance(request, tokens)
            if draft is not None:
                self._apply_draft(request, computed_before[rid], draft)
            n_new = request.num_output_tokens - num_before
            lps = None if logprobs[0] is None else logprobs[:min(n_new, len(tokens))]
            out = EngineCoreOutput(
                rid, request.output_token_ids[num_before:], reason, lps,
                None if lps is None else [t or [] for t in tops[:len(lps)]],
                request.num_cached_tokens,
                request.queue_time if num_before == 0 else None, error)
            if num_before == 0 and request.prompt_logprobs is not None:
                out.prompt_logprobs = request.prompt_logprobs.logprobs
                out.prompt_top_logprobs = request.prompt_logprobs.top_logprobs
            outputs.append(out)
            if reason is not None:
                self.running.remove(request)
                self._finish(request, reason)
        self.spec.after_step(result, self.requests)  # a draft model's next proposals
        return outputs

    def _apply_draft(self, request: Request, computed: int, draft) -> None:
        """After a verified draft: the fed last token and the accepted drafts are computed (at
        most the request's tokens, if it stopped inside the draft); the rejected drafts' KV
        is garbage that nothing indexes, and the blocks past the request's tokens go back."""
        request.num_computed_tokens = min(computed + 1 + draft.num_accepted, request.num_tokens)
        self.kv.draft_applied(request, draft.num_drafted, draft.num_accepted)
        self.kv.trim(request)
        if request.num_computed_tokens // self.kv.block_size > computed // self.kv.block_size:
            self.kv.cache_computed(request)  # the draft filled a block
        self.spec.record(request, draft)

    def _pooled_outputs(self, vectors: dict[str, list[float]]) -> list[EngineCoreOutput]:
        """Finish the embedding requests whose prompt this step completed, each with its
        pooled vector (finish reason "stop", no tokens); their KV goes to the prefix cache."""
        outputs = []
        for rid, vector in vectors.items():
            request = self.requests[rid]
            final = pooled.add_chunk(request, vector)
            if final is None:
                continue
            outputs.append(EngineCoreOutput(rid, [], "stop", None, None,
                                            request.num_cached_tokens, request.queue_time,
                                            None, final))
            self.running.remove(request)
            self._finish(request, "stop")
        return outputs

    def _scored_outputs(self, sched: SchedulerOutput) -> list[EngineCoreOutput]:
        """Finish the ``max_tokens`` 0 requests whose prompt this step completed (reason
        "length", no tokens), each with its prompt logprobs."""
        outputs = []
        for seq in sched.seqs:
            # a prefill-only chunk that ends the prompt, not an embedding's (the seq's own
            # fields: no lookup for the decodes and sampling chunks of every step)
            if seq.sample or not seq.is_last_chunk or seq.pooling is not None:
                continue
            request = self.requests[seq.request_id]
            scored = request.prompt_logprobs
            outputs.append(EngineCoreOutput(
                request.request_id, [], "length", num_cached_tokens=request.num_cached_tokens,
                queue_time=request.queue_time,
                prompt_logprobs=None if scored is None else scored.logprobs,
                prompt_top_logprobs=None if scored is None else scored.top_logprobs))
            self.running.remove(request)
            self._finish(request, "length")
        return outputs

    def _advance(self, request: Request, token_ids: list[int]) -> tuple[str | None, str | None]:
        """Append the sampled token(s) (a verified draft gives several) and what the grammar
        forces after them; (finish reason, error). NOTE: a grammar that raises fails its own
        request only (reason "error")."""
        try:
            for token_id in token_ids:
                reason, error = self._append(request, token_id)
                if reason is not None:
                    return reason, error
            if request.sampling_params.logprobs is None:
                return self._fast_forward(request)
            return None, None
        except Exception as exc:  # noqa: BLE001 - one request's grammar, not the engine
            logger.error("request %s: its grammar failed", request.request_id, exc_info=exc)
            return "error", (f"the request's structured output grammar failed: "
                             f"{type(exc).__name__}: {exc}")

    def _append(self, request: Request, token_id: int) -> tuple[str | None, str | None]:
        """Append one token; (finish reason, error). A grammar that has terminated ends the
        request ("stop") whether or not an eos token was sampled."""
        request.append_token(token_id)
        request.budget.observe(request.output_token_ids)
        if (error := request.grammar.accept(token_id, request.output_token_ids)) is not None:
            return "error", error  # mid-output: vLLM's FINISHED_ERROR (a 500), not a refusal
        if request.grammar.is_terminated:
            return "stop", None
        return check_stop(request, self.max_model_len), None

    def _fast_forward(self, request: Request) -> tuple[str | None, str | None]:
        """Append the tokens the grammar forces next (no forward per token: the next step
        feeds them as one chunk), within max_tokens and the context window."""
        forced = request.grammar.forced_tokens()
        if not forced:
            return None, None
        room = min(request.max_tokens - request.num_output_tokens,
                   self.max_model_len - request.num_tokens)
        for token_id in forced[:room]:
            reason, error = self._append(request, token_id)
            if reason is not None:
                return reason, error
        return None, None

    def stats(self) -> SchedulerStats:
        spec = self.spec
        return SchedulerStats(len(self.running), len(self.waiting), self.kv.usage,
                              self.kv.block_pool.num_blocks, self.kv.num_query_tokens,
                              self.kv.num_hit_tokens, self.num_preemptions, spec.num_drafts,
                              spec.num_draft_tokens, spec.num_accepted_tokens,
                              list(spec.accepted_per_pos), list(spec.drafted_per_pos))

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        self.spec.check_integrity(self.requests)  # a draft model's KV pool
        assert len(self.requests) == len(self.running) + len(self.waiting)
        for request in self.running:
            assert request.status is RequestStatus.RUNNING
            self.kv.check_request(request)

    # -- internals -------------------------------------------------------------------------

    def _chunk(self, request: Request, budget: int) -> int:
        """The request's next tokens this step, within ``budget``: a prefill chunk of a model
        that attends bidirectionally within images ends outside every image (0: wait)."""
        num_new = min(request.num_new_tokens, budget)
        if not request.images or not self.config.whole_images or num_new <= 1:
            return num_new
        return fit_chunk(request.images, request.num_computed_tokens, num_new, budget)

    def _scheduled_seq(self, request: Request, num_new: int) -> ScheduledSeq:
        start = request.num_computed_tokens
        is_last = start + num_new == request.num_tokens
        sample = is_last and not request.is_prefill_only
        seq = ScheduledSeq(request.request_id, request.all_token_ids[start:start + num_new],
                           start, request.block_ids, sample, pooling=request.pooling,
                           is_last_chunk=is_last, window_block_ids=request.window_block_ids,
                           lora_id=request.lora_id,
                           state=self.kv.state_plan(request, num_new))
        if request.images:
            if start < request.num_prompt_tokens:
                seq.images = overlapping(request.images, start, start + num_new)
            seq.rope_shift = rope_shift(request.images, start)
        if request.prompt_logprobs is not None:
            seq.prompt_logprobs = request.prompt_logprobs.work(request.prompt_token_ids, start,
                                                               num_new)
        if sample:
            seq.sampling_params = request.sampling_params
            seq.seed = request.seed
            seq.prompt_token_ids = request.prompt_token_ids
            seq.output_token_ids = request.output_token_ids
            seq.stop_token_ids = request.stop_token_ids
        return seq

    def _pick_victim(self, scheduled: set[str]) -> Request:
        """Lowest priority (largest value), then latest arrival, among not-yet-scheduled."""
        candidates = [r for r in self.running if r.request_id not in scheduled]
        return max(candidates, key=lambda r: self._queue_keys[r.request_id])

    def _preempt(self, request: Request) -> None:
        """Recompute-style preemption: drop the KV, go back to waiting, resume later."""
        self.running.remove(request)
        self.kv.free(request)
        self.spec.on_preempted(request)  # a draft model's KV goes too
        request.num_computed_tokens = 0
        pooled.restart(request)
        request.num_preemptions += 1
        self.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self._enqueue(request)

    def _order_by_prefix_match(self) -> None:
        """SGLang's cache-aware order: within a priority, the longest cached prefix first
        (ties by arrival), so requests that reuse the cache run while it still holds them."""
        matched = {r.request_id: self.kv.cached_len(r)
                   for r in self.waiting}
        keys = self._queue_keys
        self.waiting.sort(key=lambda r: (keys[r.request_id][0], -matched[r.request_id],
                                         keys[r.request_id][1:]))

    def _enqueue(self, request: Request) -> None:
        key = self._queue_keys.__getitem__
        bisect.insort(self.waiting, request, key=lambda r: key(r.request_id))

    def _finish(self, request: Request, reason: str) -> None:
        self.spec.on_finished(request)
        if request.block_ids:
            self.kv.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        del self._queue_keys[request.request_id]

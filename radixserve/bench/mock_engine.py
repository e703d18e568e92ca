"""MockEngine: EngineCore's interface with no model, to measure the frontend alone.

Prefill is instant; each step emits one random token per running request until its
``max_tokens`` (EOS is never sampled). It speaks the same ZMQ protocol through core_proc.
Steps run back to back, or at most one per ``step_time`` seconds to stand in for a model's
decode step (``radixserve serve --mock-engine --mock-step-ms 20``), the wait slept in slices of
at most ``LAYER_S`` with ``layer_done()`` between them, as a model's layers call it. At most ``max_num_seqs``
requests run; the others wait in arrival order (``--mock-max-seqs``), so queueing and
admission control can be measured without a model.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict

from radixserve.core.reports import EngineCoreOutput, EngineState, RequestInfo, SchedulerStats
from radixserve.layers.layer_progress import layer_done
from radixserve.messages import EngineCoreOutputs, EngineCoreRequest, EngineStateQuery

LAYER_S = 0.1  # a stand-in layer's time within a step


class _MockKV:
    block_size = 16


class _MockScheduler:
    def __init__(self, engine: MockEngine) -> None:
        self.engine = engine
        self.kv = _MockKV()

    def stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=len(self.engine.running),
                              num_waiting=len(self.engine.waiting), num_kv_blocks=0)


class MockEngine:
    """Per step, per running request: one struct and one random token drawn in a batch —
    the mock's own cost is kept small, since it shares the CPU with the frontend it
    measures."""

    def __init__(self, vocab_size: int, max_model_len: int, max_num_seqs: int = 1024,
                 seed: int = 0, step_time: float = 0.0) -> None:
        self.vocab_size = vocab_size
        self.step_time = step_time
        self._next_step = 0.0
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.running: dict[str, int] = {}  # request id -> the step that gives its last token
        self.waiting: OrderedDict[str, int] = OrderedDict()  # request id -> its tokens to make
        self.scheduler = _MockScheduler(self)
        self._rng = random.Random(seed)
        self._tokens = range(min(1000, vocab_size // 2), vocab_size)
        self._steps = 0
        self._info: dict[str, tuple[int, int, float]] = {}  # id -> (prompt len, priority, arrival)
        self._total: dict[str, int] = {}  # running id -> its output tokens in all

    def state(self, query: EngineStateQuery) -> EngineState:
        """The requests with their progress; no KV pool and no prefix cache."""
        def info(rid: str, status: str, done: int, total: int) -> RequestInfo:
            prompt, priority, arrival = self._info[rid]
            return RequestInfo(rid, status, prompt + done, prompt + done, prompt, total,
                               priority, arrival)

        limit = query.max_requests
        running = [info(rid, "running", self._total[rid] - (last - self._steps),
                        self._total[rid]) for rid, last in list(self.running.items())[:limit]]
        waiting = [info(rid, "waiting", 0, n) for rid, n in list(self.waiting.items())[:limit]]
        return EngineState(running, waiting, len(self.running), len(self.waiting), 0, 0, 0, 0,
                           _MockKV.block_size, [], 0, 0, 0, 0)

    def add_request(self, req: EngineCoreRequest) -> None:
        if req.pooling_params is not None:
            raise ValueError("the mock engine computes no embeddings (it has no model)")
        params = req.sampling_params
        if params.prompt_logprobs is not None or params.max_tokens == 0:
            raise ValueError("the mock engine scores no prompts (it has no model)")
        room = self.max_model_len - len(req.prompt_token_ids)
        if room < 1:
            raise ValueError("the prompt is longer than the context window")
        asked = req.sampling_params.max_tokens
        self.waiting[req.request_id] = room if asked is None else min(asked, room)
        self._info[req.request_id] = (len(req.prompt_token_ids), req.priority,
                                      req.arrival_time or time.time())

    def abort_requests(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.running.pop(rid, None)
            self.waiting.pop(rid, None)
            self._info.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    def step(self) -> EngineCoreOutputs:
        if self.step_time:
            now = time.monotonic()
            while (left := self._next_step - time.monotonic()) > 0:
                time.sleep(min(left, LAYER_S))
                layer_done()
            self._next_step = max(now, self._next_step) + self.step_time
        self._steps = step = self._steps + 1
        queued: dict[str, float] = {}  # scheduled this step -> its queue time (first output)
        while self.waiting and len(self.running) < self.max_num_seqs:
            rid, num_tokens = self.waiting.popitem(last=False)
            self.running[rid] = step - 1 + num_tokens
            self._total[rid] = num_tokens
            queued[rid] = max(0.0, time.time() - self._info[rid][2])
        tokens = self._rng.choices(self._tokens, k=len(self.running))
        outputs = [EngineCoreOutput(rid, [token], "length" if last == step else None,
                                    queue_time=queued.get(rid))
                   for (rid, last), token in zip(self.running.items(), tokens)]
        for out in outputs:
            if out.finish_reason is not None:
                del self.running[out.request_id]
                del self._total[out.request_id]
                del self._info[out.request_id]
        return EngineCoreOutputs(outputs, time.time())

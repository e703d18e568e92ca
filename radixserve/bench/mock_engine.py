"""MockEngine: EngineCore's interface with no model, to measure the frontend alone.

Prefill is instant; each step emits one random token per running request until its
``max_tokens`` (EOS is never sampled). It speaks the same ZMQ protocol through core_proc.
"""

from __future__ import annotations

import random
import time

from radixserve.engine.messages import (
    EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, SchedulerStats)


class _MockKV:
    block_size = 16


class _MockScheduler:
    def __init__(self, engine: MockEngine) -> None:
        self.engine = engine
        self.kv = _MockKV()

    def stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=len(self.engine.running), num_kv_blocks=0)


class MockEngine:
    def __init__(self, vocab_size: int, max_model_len: int, max_num_seqs: int = 1024,
                 seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.running: dict[str, list[int]] = {}  # request id -> [generated, max_tokens]
        self.scheduler = _MockScheduler(self)
        self._rng = random.Random(seed)
        self._low = min(1000, vocab_size // 2)

    def add_request(self, req: EngineCoreRequest) -> None:
        room = self.max_model_len - len(req.prompt_token_ids)
        if room < 1:
            raise ValueError("the prompt is longer than the context window")
        asked = req.sampling_params.max_tokens
        self.running[req.request_id] = [0, room if asked is None else min(asked, room)]

    def abort_requests(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.running.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> EngineCoreOutputs:
        outputs, finished = [], []
        rand = self._rng.randrange
        for rid, state in self.running.items():
            state[0] += 1
            done = state[0] >= state[1]
            outputs.append(EngineCoreOutput(rid, [rand(self._low, self.vocab_size)],
                                            "length" if done else None))
            if done:
                finished.append(rid)
        for rid in finished:
            del self.running[rid]
        return EngineCoreOutputs(outputs, time.time())

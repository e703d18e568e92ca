"""A cross-encoder's engine core (BERT / XLM-R sequence classifiers; models/bert.py).

An encoder is bidirectional and keeps no KV, so it does not run in the paged causal runner.
It reuses everything around it instead: the same `EngineCore` loop, messages and pooling
requests (the HTTP side is the reranker's), the same `Scheduler` with

    - no chunked prefill: a pair is scheduled whole or waits, and the step's token budget
      holds at least one pair of ``max_model_len`` (the model's positions);
    - no prefix cache, and a pool of block ids that no memory stands behind (ids are how the
      scheduler counts; the `EncoderRunner` ignores them), enough for every step's pairs;

and an `EncoderRunner` that runs the step's pairs as one padded forward. Its requests must
be ``classify`` pooling requests; anything else is refused when queued.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from radixserve.config import EngineConfig
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.request import Request
from radixserve.core.scheduler import Scheduler
from radixserve.cpu.threads import apply_engine_threads
from radixserve.engine.engine_core import EngineCore
from radixserve.messages import EngineCoreRequest
from radixserve.models.bert import load_cross_encoder
from radixserve.models.cross_encoder_config import EncoderConfig
from radixserve.models.loader import device_and_dtype
from radixserve.models.source import ModelSource
from radixserve.runner.encoder_runner import EncoderRunner
from radixserve.runner.fault_injection import inject_faults_from_env

logger = logging.getLogger(__name__)


class EncoderEngineCore(EngineCore):
    """An `EngineCore` that takes cross-encoder pairs only (``classify`` pooling)."""

    def add_request(self, req: EngineCoreRequest) -> None:
        """Queue one pair; ValueError (nothing queued) for anything else, or a pair longer
        than the model reads."""
        params = req.pooling_params
        if params is None or params.pooling != "classify":
            raise ValueError("this model is a cross-encoder: it scores (query, document) "
                             "pairs on /v1/rerank and /v1/score, and cannot generate text or "
                             "embed")
        ids = req.prompt_token_ids
        if not ids or len(ids) > self.max_model_len:
            raise ValueError(f"the pair has {len(ids)} tokens; this cross-encoder reads 1 to "
                             f"{self.max_model_len}")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise ValueError(f"input token ids must be in [0, {self.vocab_size})")
        self.scheduler.add_request(Request(
            req.request_id, list(ids), req.sampling_params, frozenset(), 0,
            req.arrival_time or time.time(), req.priority, 0, pooling=params))


def build_encoder_core(config: EngineConfig, source: ModelSource,
                       encoder: EncoderConfig) -> EncoderEngineCore:
    """Load the cross-encoder and build its engine core. ValueError for what an encoder
    cannot do (tensor parallel, a draft model, LoRA adapters)."""
    if config.parallel.tensor_parallel_size > 1:
        raise ValueError("a cross-encoder runs on one rank (no tensor parallel)")
    if config.speculative.draft_model is not None or config.lora.adapters:
        raise ValueError("a cross-encoder takes no draft model and no LoRA adapters")
    threads = apply_engine_threads(config.device.threads)
    device, dtype = device_and_dtype(config.device)
    model = load_cross_encoder(source.path, encoder, device, dtype)
    sched = config.scheduler
    max_len = min(encoder.max_len, sched.max_model_len or encoder.max_len)
    budget = max(sched.max_num_batched_tokens, max_len)
    sched = dataclasses.replace(sched, max_model_len=max_len, max_num_batched_tokens=budget,
                                chunked_prefill=False)
    block_size = config.cache.block_size
    # each pair holds ceil(len / block) ids at most: a step's pairs never run out
    num_blocks = -(-budget // block_size) + sched.max_num_seqs + 1
    pool = BlockPool(num_blocks)
    kv = KVCacheManager(pool, NoPrefixCache(pool), block_size, KVGroups.single(1))
    logger.info("engine: cross-encoder %s (%d layers, hidden %d) on %s, %s, %d threads; "
                "pairs of at most %d tokens, %d tokens a step", encoder.architecture,
                encoder.num_layers, encoder.hidden_size, device, dtype, threads, max_len,
                budget)
    runner = inject_faults_from_env(EncoderRunner(model, device))
    return EncoderEngineCore(Scheduler(sched, kv, max_len), runner, encoder.vocab_size,
                             config.seed, structured=None)

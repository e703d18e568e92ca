"""EngineCore: the scheduler + KV manager + model runner loop, one ``step()`` at a time.

The offline ``LLM`` runs it in-process; the server runs it in its own process behind ZMQ.
It works on token ids only: text (detokenization, stop strings) lives in the frontend.
"""

from __future__ import annotations

import logging
import random
import time
from concurrent import futures
from collections.abc import Callable

import torch

from radixserve.config import EngineConfig
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.request import Request
from radixserve.core.scheduler import Scheduler
from radixserve.cpu.threads import apply_engine_threads
from radixserve.engine.tp.ranks import start_tensor_parallel
from radixserve.engine.context_len import resolve_max_model_len
from radixserve.engine.draft_setup import build_draft_runner, open_draft
from radixserve.core.state_summary import engine_state
from radixserve.messages import (
    EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, EngineState, EngineStateQuery)
from radixserve.tokenizer.tokenizer import Tokenizer, load_tokenizer
from radixserve.models.half_stored import checkpoint_dtype
from radixserve.models.loader import load_model, load_model_config, open_gguf
from radixserve.models.quantization import resolve_quantization
from radixserve.models.source import ModelSource
from radixserve.runner.fault_injection import inject_faults_from_env
from radixserve.runner.kv_cache import (draft_pool_blocks, num_blocks_for_budget,
                                        resolve_kv_dtype)
from radixserve.runner.model_runner import ModelRunner
from radixserve.sampling_params import SamplingParams
from radixserve.spec.drafter import make_spec
from radixserve.structured.llguidance_backend import LLGuidanceBackend
from radixserve.structured.manager import StructuredOutputManager

_COMPILE_WAIT_S = 0.005  # an idle step waits this long for a grammar compile to finish


logger = logging.getLogger(__name__)

class EngineCore:
    def __init__(self, scheduler: Scheduler, runner, vocab_size: int, seed: int = 0,
                 structured: StructuredOutputManager | None = None) -> None:
        """``structured``: None refuses structured-output requests (e.g. a test engine
        built without a tokenizer)."""
        self.scheduler = scheduler
        self.runner = runner
        self.vocab_size = vocab_size
        self.structured = structured
        self._rng = random.Random(seed)

    @classmethod
    def from_config(cls, config: EngineConfig, source: ModelSource,
                    show_progress: bool = True, reader=None,
                    tokenizer: Callable[[], Tokenizer] | None = None, tp=None) -> EngineCore:
        """Load the model and size the KV pool; ``reader``: an open GGUFReader to reuse;
        ``tokenizer`` returns the caller's `Tokenizer` (default: load it from ``source``);
        it is called on the first structured-output request. ``tp``: this process's
        tensor-parallel rank (distributed/tp_group.py; default: rank 0, which starts the
        others when ``config.parallel`` asks for several)."""
        if reader is None and source.kind == "gguf":
            reader = open_gguf(source.path)
        model_config = load_model_config(source, reader)
        tp = tp or start_tensor_parallel(config, source, model_config, reader)
        threads = apply_engine_threads(tp.rank_threads(config.device.threads))  # before the model
        device, dtype = config.device.torch_device, config.device.torch_dtype
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for but CUDA is not available")
        quantization = resolve_quantization(config.device.quantization, device, reader,
                                            checkpoint_dtype(source))
        model = load_model(source, model_config, device, dtype, reader, show_progress,
                           quantization, tp.shard)
        draft = None
        if config.speculative.draft_model is not None:  # its vocabulary checked here
            draft = open_draft(config.speculative.draft_model, source, model_config, reader)
        kv_dtype = resolve_kv_dtype(config.cache.kv_cache_dtype, device, dtype)
        # model.config: this rank's shape (its KV heads); the pool is per rank
        groups = KVGroups.from_windows([model_config.layer_window(i)
                                        for i in range(model_config.num_layers)])
        num_blocks = num_blocks_for_budget(model.config, config.cache, kv_dtype, groups,
                                           draft and draft.config)
        block_size = config.cache.block_size
        runner = ModelRunner(model, model.config, num_blocks, block_size, device, dtype,
                             kv_dtype=kv_dtype, groups=groups)
        if device.type == "cpu":
            logger.info("engine: %s", model.kernel_plan.startup_line(kv_dtype, threads))
        kv = _kv_manager(config, groups, num_blocks)
        held = groups.max_tokens(kv.num_usable_blocks, block_size,
                                 config.scheduler.max_num_batched_tokens)
        max_len = resolve_max_model_len(config.scheduler.max_model_len, model_config,
                                        held // block_size, block_size)
        model.rotary.set_context_len(max_len)  # the rope fixed for this context (rotary.py)
        draft_blocks = draft_pool_blocks(model.config, num_blocks, groups) if draft else 0
        if draft is not None:
            runner.drafter = build_draft_runner(config, draft, draft_blocks, max_len, kv_dtype,
                                                show_progress)
        scheduler = Scheduler(config.scheduler, kv, max_len,
                              make_spec(config.speculative, draft_blocks, block_size))
        backend = LLGuidanceBackend(tokenizer or (lambda: load_tokenizer(source)),
                                    model_config.vocab_size)
        structured = StructuredOutputManager(backend, config.structured.fast_forward,
                                             config.structured.compile_timeout_s)
        runner = inject_faults_from_env(tp.runner(runner))  # faults: tests only
        return cls(scheduler, runner, model_config.vocab_size, config.seed, structured)

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """ValueError if the engine cannot take this prompt with these params."""
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise ValueError("the prompt is empty")
        if num_prompt >= self.max_model_len:
            raise ValueError(f"the prompt has {num_prompt} tokens; the context window is "
                             f"{self.max_model_len} (and at least one token must be generated)")
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= self.vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        params.validate_vocab(self.vocab_size)
        if params.structured_outputs is not None:
            if self.structured is None:
                raise ValueError("this engine does not support structured outputs")
            self.structured.validate(params.structured_outputs)

    def add_request(self, req: EngineCoreRequest) -> None:
        """Queue a request. ValueError (nothing queued) on a prompt the engine cannot take."""
        if req.pooling_params is not None:
            return self._add_pooling_request(req)
        params = req.sampling_params
        self.check_request(req.prompt_token_ids, params)
        num_prompt = len(req.prompt_token_ids)
        room = self.max_model_len - num_prompt
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(req.eos_token_ids)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        request = Request(req.request_id, list(req.prompt_token_ids), params,
                          frozenset(stop_ids), seed, req.arrival_time or time.time(),
                          req.priority, max_tokens)
        if params.structured_outputs is not None:
            request.grammar = self.structured.grammar_for(params.structured_outputs)
        self.scheduler.add_request(request)

    def _add_pooling_request(self, req: EngineCoreRequest) -> None:
        """An embedding request: prefill-only (no token is generated, so the prompt may fill
        the whole context window), pooled instead of sampled."""
        ids = req.prompt_token_ids
        if not ids:
            raise ValueError("the input is empty")
        if len(ids) > self.max_model_len:
            raise ValueError(f"the input has {len(ids)} tokens; the context window is "
                             f"{self.max_model_len}")
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise ValueError(f"input token ids must be in [0, {self.vocab_size})")
        request = Request(req.request_id, list(ids), req.sampling_params, frozenset(), 0,
                          req.arrival_time or time.time(), req.priority, 0,
                          pooling=req.pooling_params)
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def state(self, query: EngineStateQuery) -> EngineState:
        """A bounded summary of the requests, the KV pool and the prefix cache (read-only)."""
        return engine_state(self.scheduler, query)

    def step(self) -> EngineCoreOutputs:
        """One scheduling step. An exception fails the requests it belongs to and the engine
        goes on: a forward or sampling error fails the step's batch, a grammar error its
        request (in the scheduler), anything else every unfinished request. Only an error
        while failing them escapes (the process then dies and the API process replaces it)."""
        try:
            return self._step()
        except Exception as exc:  # noqa: BLE001 - a bug outside the runner: fail everything
            outputs = self._fail(list(self.scheduler.requests), "the engine step", exc)
            return EngineCoreOutputs(outputs, time.time())

    def _step(self) -> EngineCoreOutputs:
        failed = self._fail_broken_grammars()
        sched = self.scheduler.schedule()
        if sched.is_empty:
            if not failed and self.structured is not None:  # maybe all wait for a compile
                self.structured.wait_for_compiles(
                    (r.grammar for r in self.scheduler.waiting), _COMPILE_WAIT_S)
            return EngineCoreOutputs(failed, time.time())
        bitmask = None
        try:
            if self.structured is not None:
                bitmask = self.structured.bitmask(sched, self.scheduler.requests)
            start = time.perf_counter()
            result = self.runner.execute(sched, bitmask)
            self.scheduler.spec.observe_step(  # the target's share (the draft model's apart)
                sched.num_batched_tokens, time.perf_counter() - start - result.draft_seconds)
        except Exception as exc:  # noqa: BLE001 - the batch's fault, not the engine's
            if bitmask is not None:  # its matchers may still be read by the mask thread
                futures.wait([bitmask.bitmask])
            batch = [seq.request_id for seq in sched.seqs]
            return EngineCoreOutputs(failed + self._fail(batch, "the model step", exc),
                                     time.time())
        outputs = self.scheduler.update_from_output(sched, result)
        return EngineCoreOutputs(failed + outputs, time.time())

    def _fail(self, request_ids: list[str], where: str,
              exc: Exception) -> list[EngineCoreOutput]:
        """End ``request_ids`` with finish reason "error" (their KV blocks freed); log why."""
        logger.error("%s failed; failing %d request(s): %s", where, len(request_ids),
                     request_ids[:8], exc_info=exc)
        self.scheduler.fail_requests(request_ids)
        error = f"{where} failed: {type(exc).__name__}: {exc}"
        return [EngineCoreOutput(rid, [], "error", error=error) for rid in request_ids]

    def _fail_broken_grammars(self) -> list[EngineCoreOutput]:
        """Abort waiting requests whose grammar failed to compile (or overran its time)."""
        broken = [(r.request_id, error) for r in self.scheduler.waiting
                  if (error := r.grammar.error) is not None]
        if broken:
            self.scheduler.abort_requests([rid for rid, _ in broken])
        return [EngineCoreOutput(rid, [], "abort", error=error) for rid, error in broken]


def _kv_manager(config: EngineConfig, groups: KVGroups, num_blocks: int) -> KVCacheManager:
    """The scheduler's KV blocks: the pool (with a null block where sliding layers release
    theirs), the prefix cache or its null object, the manager over both."""
    block_size = config.cache.block_size
    pool = BlockPool(num_blocks, with_null_block=groups.has_sliding)
    cache = (RadixCache(pool, block_size, groups) if config.cache.enable_prefix_caching
             else NoPrefixCache(pool))
    if len(groups.groups) > 1 or groups.has_sliding:
        logger.info("KV groups: %s, blocks of %d layers (%d in the pool)",
                    groups.describe(), groups.unit_layers, num_blocks)
    return KVCacheManager(pool, cache, block_size, groups)

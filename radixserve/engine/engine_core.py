"""EngineCore: the scheduler + KV manager + model runner loop, one ``step()`` at a time.

The offline ``LLM`` runs it in-process; the server runs it in its own process behind ZMQ.
It works on token ids only: text (detokenization, stop strings) lives in the frontend.
It is handed its parts built (engine/build.py builds them from the config; tests pass a fake
runner: any object with ``execute(sched, bitmask) -> ModelRunnerOutput``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent import futures

from radixserve.core.images import NO_IMAGES
from radixserve.core.prompt_logprobs import PromptLogprobs
from radixserve.core.request import Request
from radixserve.core.scheduler import Scheduler
from radixserve.core.state_summary import engine_state
from radixserve.core.reports import EngineCoreOutput, EngineState
from radixserve.engine.kv_events import KVEventsOutlet
from radixserve.engine.lora_registry import LoraRegistry
from radixserve.engine.structured_manager import StructuredOutputManager
from radixserve.engine.thread_governor import FixedThreads
from radixserve.messages import EngineCoreOutputs, EngineCoreRequest, EngineStateQuery
from radixserve.sampling_params import SamplingParams

_COMPILE_WAIT_S = 0.005  # an idle step waits this long for a grammar compile to finish

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner, vocab_size: int, seed: int = 0,
                 structured: StructuredOutputManager | None = None,
                 kv_events: KVEventsOutlet | None = None, max_loras: int = 4) -> None:
        """``structured``: None refuses structured-output requests (e.g. a test engine
        built without a tokenizer). ``kv_events``: where the prefix cache's events go after
        each step (default: nowhere). ``max_loras``: LoRA adapters resident at once
        (engine/lora_registry.py)."""
        self.scheduler = scheduler
        self.runner = runner
        self.vocab_size = vocab_size
        self.structured = structured
        self.threads = FixedThreads()  # the server's engine process may set a ThreadGovernor
        self.images = NO_IMAGES  # a vision model's image encoder (engine/vision_setup.py)
        self._warmed = False  # the structured-output warm-up started (`idle`)
        self.idle_work: list[Callable[[], None]] = []  # more of it, each run once (`idle`)
        self._rng = random.Random(seed)
        self.kv_events = kv_events or KVEventsOutlet()
        self.loras = LoraRegistry(runner, max_loras, self._loras_in_use)

    def load_lora(self, name: str, path: str) -> None:
        """Load a LoRA adapter (between steps); ValueError / FileNotFoundError when it does
        not fit the model or the name is taken."""
        self.loras.load(name, path)

    def unload_lora(self, name: str) -> None:
        """Forget a LoRA adapter; `LoraNotFound` (a ValueError) when unknown, ValueError
        while unfinished requests use it."""
        self.loras.unload(name)

    def _loras_in_use(self) -> set[int]:
        return {r.lora_id for r in self.scheduler.requests.values()}

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
        if params.lora_name is not None:
            self.loras.check(params.lora_name)
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
        self.images.check(req.images, num_prompt)
        room = self.max_model_len - num_prompt
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(req.eos_token_ids)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        request = Request(req.request_id, list(req.prompt_token_ids), params,
                          frozenset(stop_ids), seed, req.arrival_time or time.time(),
                          req.priority, max_tokens, images=list(req.images))
        if params.structured_outputs is not None:
            request.grammar = self.structured.grammar_for(params.structured_outputs)
        if params.prompt_logprobs is not None:
            request.prompt_logprobs = PromptLogprobs(num_prompt, params.prompt_logprobs)
        if params.lora_name is not None:
            request.lora_id = self.loras.acquire(params.lora_name)
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
        if req.images:
            raise ValueError("images are not taken by the embedding route")
        if req.pooling_params.pooling == "classify":
            raise ValueError("classify pooling needs a cross-encoder model")
        if max(req.pooling_params.logit_token_ids or [0]) >= self.vocab_size:
            raise ValueError(f"logit_token_ids must be in [0, {self.vocab_size})")
        request = Request(req.request_id, list(ids), req.sampling_params, frozenset(), 0,
                          req.arrival_time or time.time(), req.priority, 0,
                          pooling=req.pooling_params)
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.abort_requests(request_ids)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Drop every cached page (vLLM's ``reset_prefix_cache``); True when done. Refused
        (False) while running requests lock cached pages, unless ``reset_running_requests``
        preempts them first. The KV events (AllBlocksCleared) are published now, not after
        the next step, which may be long in coming on an idle engine."""
        if reset_running_requests:
            self.scheduler.preempt_running()
        done = self.scheduler.kv.prefix_cache.reset()
        self.kv_events.flush()
        return done

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def idle(self) -> None:
        """The engine has had nothing to do for a while: start the work that waits for a
        quiet engine, once: the structured-output warm-up (the grammar backend's view of the
        tokenizer: ~2 CPU s for a 152k vocabulary, on its own thread), which at start-up
        slowed the first requests' prefill (coder 1.5B: a first token in 1.56 s instead of
        0.42 s); then each of ``idle_work`` (the packed weights cache's write: on its own
        thread)."""
        if not self._warmed and self.structured is not None:
            self._warmed = True
            self.structured.warm()
        while self.idle_work:
            self.idle_work.pop(0)()

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
        finally:
            self.kv_events.flush()  # one batch a step; never waits

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
            target = time.perf_counter() - start - result.draft_seconds  # the draft's apart
            self.scheduler.spec.observe_step(sched.num_batched_tokens, target)
            self.threads.observe(sched.num_batched_tokens, target)
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


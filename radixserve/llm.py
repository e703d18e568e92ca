"""The offline API, shaped like vLLM's: ``LLM(model).generate(prompts, SamplingParams(...))``.

Runs the same ``EngineCore`` as the server, in-process.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from radixserve.config import engine_config
from radixserve.engine.build import build_engine_core
from radixserve.messages import EngineCoreRequest
from radixserve.frontend.output_processor import RequestState
from radixserve.tokenizer.tokenizer import Tokenizer, load_tokenizer
from radixserve.models.loader import open_gguf
from radixserve.models.source import ModelSource
from radixserve.outputs import RequestOutput
from radixserve.sampling_params import SamplingParams

Prompt = str | list[int] | dict
REASONING_END_TAG = "</think>"  # where after_reasoning constraints start, offline


class LLM:
    """Load a model (None → the embedded SmolLM2-135M-Instruct) and generate offline.

    ``threads``: torch's CPU threads in this process, which the native kernels share (default:
    the CPUs the process may use, from its affinity mask and cgroup quota).
    ``tensor_parallel_size``: ranks splitting the model (this process is rank 0; the others
    are processes it starts, each pinned to its share of the CPUs; ``close()`` stops them).
    ``speculative``: the speculative decoding method (default ``auto``: drafts only where
    they are measured to pay; ``off``; see `SpeculativeConfig`).
    ``draft_model``: a smaller model with the same vocabulary that drafts for speculative
    decoding (implies ``speculative="draft"``; ValueError with another method).

    Errors in the arguments raise ValueError / FileNotFoundError before anything is queued,
    so the object keeps working after a bad call.
    """

    def __init__(self, model: str | None = None, *, block_size: int = 16,
                 kv_cache_memory_gb: float = 1.0, num_kv_blocks: int | None = None,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, device: str = "cpu",
                 dtype: str | None = None, quantization: str = "auto",
                 threads: int | None = None, kv_cache_dtype: str = "auto", seed: int = 0,
                 enable_prefix_caching: bool = True,
                 scheduling_policy: str = "fcfs", structured_fast_forward: bool = True,
                 speculative: str | None = None, num_speculative_tokens: int = 4,
                 speculative_adaptive: bool = True, tensor_parallel_size: int = 1,
                 tp_all_reduce: str = "auto", draft_model: str | None = None,
                 show_progress: bool = True) -> None:
        self.config = engine_config(
            model, block_size=block_size, kv_cache_memory_gb=kv_cache_memory_gb,
            num_kv_blocks=num_kv_blocks, enable_prefix_caching=enable_prefix_caching,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len, scheduling_policy=scheduling_policy, device=device,
            dtype=dtype, quantization=quantization, threads=threads,
            kv_cache_dtype=kv_cache_dtype, seed=seed,
            structured_fast_forward=structured_fast_forward, speculative=speculative,
            num_speculative_tokens=num_speculative_tokens,
            speculative_adaptive=speculative_adaptive,
            tensor_parallel_size=tensor_parallel_size, tp_all_reduce=tp_all_reduce,
            draft_model=draft_model)
        self.source = ModelSource.resolve(model)
        reader = open_gguf(self.source.path) if self.source.kind == "gguf" else None
        self.engine = build_engine_core(self.config, self.source, show_progress, reader,
                                        lambda: self.tokenizer)
        self.tokenizer = load_tokenizer(self.source, reader)
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop the tensor-parallel ranks this LLM started (nothing to do for one rank)."""
        close = getattr(self.engine.runner, "close", None)
        if close is not None:
            close()

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. Prompts: text, token ids, or
        ``{"prompt": str}`` / ``{"prompt_token_ids": [...]}``."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        items = [self._tokenize(p) for p in prompts]
        return self._run(items, params, priority or [0] * len(items))

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             add_generation_prompt: bool = True, tools: list[dict] | None = None,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them."""
        if not messages:
            raise ValueError("messages is empty")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        texts = [self.tokenizer.apply_chat_template(
            conv, add_generation_prompt=add_generation_prompt, tools=tools,
            **(chat_template_kwargs or {})) for conv in conversations]
        params = _as_params_list(sampling_params, len(texts))
        items = [(t, self.tokenizer.encode_prompt(t)) for t in texts]
        return self._run(items, params, [0] * len(items))

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None,
               chat: bool = False) -> Iterator[str]:
        """Yield text deltas of one request as they are generated (n must be 1)."""
        params = sampling_params or SamplingParams()
        if params.n != 1:
            raise ValueError("stream() supports n=1 only")
        if chat:
            text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
            item = (text, self.tokenizer.encode_prompt(text))
        else:
            item = self._tokenize(prompt)
        rid = f"stream-{next(self._ids)}"
        state = RequestState(0, item[1], params, self.tokenizer)
        self._submit(rid, item[1], params, 0)
        try:
            while not state.finished:
                for out in self.engine.step().outputs:
                    delta = state.process(out)
                    if delta:
                        yield delta
                    if state.finished and out.finish_reason is None:
                        self.engine.abort_requests([rid])
        finally:
            if not state.finished:
                self.engine.abort_requests([rid])

    # -- internals -------------------------------------------------------------------------

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError(f"a prompt must be a string, a list of token ids or a dict, "
                         f"got {type(prompt).__name__}")

    def _submit(self, rid: str, token_ids: list[int], params: SamplingParams,
                priority: int) -> None:
        constraint = params.structured_outputs
        if constraint is not None and constraint.after_reasoning and not \
                constraint.reasoning_end_token_ids:
            constraint.reasoning_end_token_ids = self.tokenizer.encode(
                REASONING_END_TAG, add_special_tokens=False)
        req = EngineCoreRequest(request_id=rid, prompt_token_ids=token_ids,
                                sampling_params=params,
                                eos_token_ids=sorted(self.tokenizer.eos_token_ids),
                                priority=priority)
        self.engine.add_request(req)

    def _run(self, items: list[tuple[str | None, list[int]]], params: list[SamplingParams],
             priority: Sequence[int]) -> list[RequestOutput]:
        for (_, ids), p in zip(items, params):
            self.engine.check_request(ids, p)  # all prompts, before any is queued
        results, states = [], {}
        try:
            for (text, ids), p, prio in zip(items, params, priority):
                result = RequestOutput(f"{next(self._ids)}", text, ids)
                results.append(result)
                for i in range(p.n):
                    child = p.for_sample(i)
                    rid = f"{result.request_id}-{i}"
                    self._submit(rid, ids, child, prio)
                    states[rid] = (result, RequestState(i, ids, child, self.tokenizer))
            while self.engine.has_unfinished_requests():
                for out in self.engine.step().outputs:
                    result, state = states[out.request_id]
                    state.process(out)
                    if state.finished and out.finish_reason is None:
                        self.engine.abort_requests([out.request_id])
        finally:
            pending = [rid for rid, (_, s) in states.items() if not s.finished]
            self.engine.abort_requests(pending)
        for rid, (result, state) in states.items():
            result.outputs.append(state.completion_output())
            result.num_cached_tokens = state.num_cached_tokens
        for result in results:
            result.outputs.sort(key=lambda o: o.index)
            result.finished = True
        return results


def _as_prompt_list(prompts) -> list[Prompt]:
    if isinstance(prompts, str | dict):
        return [prompts]
    if isinstance(prompts, list) and prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]
    if not isinstance(prompts, list | tuple):
        raise ValueError(f"a prompt must be a string, a list of token ids or a dict, "
                         f"got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("no prompts given")
    return list(prompts)


def _as_params_list(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
    return params

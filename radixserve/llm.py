"""The offline API, shaped like vLLM's: ``LLM(model).generate(prompts, SamplingParams(...))``.

Runs the same ``EngineCore`` as the server, in-process.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import msgspec

from radixserve.config import engine_config
from radixserve.engine.build import build_engine_core
from radixserve.frontend.fanout import Fanout, gate_on_reasoning
from radixserve.frontend.parsers import get_reasoning_parser
from radixserve.frontend.parsers.detect import AUTO, reasoning_parser_for
from radixserve.frontend.reasoning_budget import BudgetPolicy
from radixserve.hub import resolve_model
from radixserve.tokenizer.tokenizer import Tokenizer, load_tokenizer
from radixserve.models.loader import open_gguf
from radixserve.models.source import ModelSource
from radixserve.outputs import RequestOutput
from radixserve.sampling_params import SamplingParams

Prompt = str | list[int] | dict


class _Item(NamedTuple):
    """A prompt as the engine takes it: its text (None: given as ids), ids, images."""

    text: str | None
    ids: list[int]
    images: list | tuple = ()


class LLM:
    """Load a model (None → the embedded SmolLM2-135M-Instruct) and generate offline.

    ``model`` (and ``draft_model``): a .gguf file, a Hugging Face folder, or a GGUF on the
    Hugging Face hub as ``hf.co/OWNER/REPO[:QUANT]``, pulled into huggingface_hub's cache on
    first use (HF_HUB_OFFLINE=1: from the cache only; `radixserve.hub.resolve_model`).

    ``kv_cache_memory_gb``: the KV pool's budget, GiB (default None: 40% of the memory
    available after the weights, within what ``max_num_seqs`` x ``max_model_len`` tokens
    use: engine/kv_budget.py; ``RADIXSERVE_KV_CACHE_MEMORY_GB`` fixes the default).
    ``kv_disk_cache``: a folder for the prefix cache's disk tier (default None: off; serve
    has it on), within ``kv_disk_cache_gb`` GiB (radixserve/kvdisk/).
    ``mmproj``: a vision model's image encoder (llama.cpp's mmproj GGUF) for a text GGUF
    (default: a ``*mmproj*.gguf`` beside it, or a folder's own vision tower);
    ``image_max_tokens``: the most tokens an image may take where the model sizes images to
    their content (Qwen VL: larger ones are downscaled; default: the model's own limits).
    ``threads``: torch's CPU threads in this process, which the native kernels share (default:
    the CPUs the process may use, from its affinity mask and cgroup quota).
    ``tensor_parallel_size``: ranks splitting the model (this process is rank 0; the others
    are processes it starts, each pinned to its share of the CPUs; ``close()`` stops them).
    ``speculative``: the speculative decoding method (default ``auto``: drafts only where
    they are measured to pay; ``off``; see `SpeculativeConfig`).
    ``draft_model``: a smaller model with the same vocabulary that drafts for speculative
    decoding (implies ``speculative="draft"``; ValueError with another method).
    ``reasoning_parser``: as ``radixserve serve --reasoning-parser`` (``"auto"``: the one the
    chat template shows; think, qwen3, glm45, deepseek_r1, mistral): structured outputs start
    after its end tag, unless the prompt closed the block; without one they start at the first
    token, whatever ``after_reasoning`` says (`gate_on_reasoning`). The text keeps the
    reasoning, its tags included (those that are special tokens, Mistral's ``[THINK]``, too).
    Its tags also let ``SamplingParams.thinking_token_budget`` apply (ignored without one).

    ``lora_modules``: LoRA adapters to load, name → path (a PEFT folder or a GGUF LoRA file);
    ``max_loras`` of them resident at once (engine/lora_registry.py). A request runs with one
    by ``generate(..., lora=NAME)`` or ``SamplingParams(lora_name=NAME)``; ``load_lora`` /
    ``unload_lora`` change them later.

    Errors in the arguments raise ValueError / FileNotFoundError before anything is queued,
    so the object keeps working after a bad call.
    """

    def __init__(self, model: str | None = None, *, block_size: int = 16,
                 kv_cache_memory_gb: float | None = None, num_kv_blocks: int | None = None,
                 state_cache_memory_gb: float | None = None, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, device: str = "cpu",
                 dtype: str | None = None, quantization: str = "auto",
                 threads: int | None = None, kv_cache_dtype: str = "auto", seed: int = 0,
                 enable_prefix_caching: bool = True,
                 scheduling_policy: str = "fcfs", structured_fast_forward: bool = True,
                 speculative: str | None = None, num_speculative_tokens: int = 4,
                 speculative_adaptive: bool = True, tensor_parallel_size: int = 1,
                 tp_all_reduce: str = "auto", draft_model: str | None = None,
                 kv_events_config: str | dict | None = None,
                 reasoning_parser: str | None = None, show_progress: bool = True,
                 lora_modules: dict[str, str] | None = None, max_loras: int = 4,
                 kv_disk_cache: str | None = None,
                 kv_disk_cache_gb: float | None = None, mmproj: str | None = None,
                 image_max_tokens: int | None = None) -> None:
        if reasoning_parser not in (None, AUTO):
            get_reasoning_parser(reasoning_parser)  # an unknown name fails before the load
        model, draft_model = resolve_model(model), resolve_model(draft_model)
        self.config = engine_config(
            model, block_size=block_size, kv_cache_memory_gb=kv_cache_memory_gb,
            num_kv_blocks=num_kv_blocks, state_cache_memory_gb=state_cache_memory_gb,
            enable_prefix_caching=enable_prefix_caching,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len, scheduling_policy=scheduling_policy, device=device,
            dtype=dtype, quantization=quantization, threads=threads,
            kv_cache_dtype=kv_cache_dtype, seed=seed,
            structured_fast_forward=structured_fast_forward, speculative=speculative,
            num_speculative_tokens=num_speculative_tokens,
            speculative_adaptive=speculative_adaptive,
            tensor_parallel_size=tensor_parallel_size, tp_all_reduce=tp_all_reduce,
            draft_model=draft_model, kv_events_config=kv_events_config,
            lora_modules=lora_modules, max_loras=max_loras, kv_disk_cache=kv_disk_cache,
            kv_disk_cache_gb=kv_disk_cache_gb, mmproj=mmproj)
        self.source = ModelSource.resolve(model)
        reader = open_gguf(self.source.path) if self.source.kind == "gguf" else None
        self.engine = build_engine_core(self.config, self.source, show_progress, reader,
                                        lambda: self.tokenizer)
        self.tokenizer = load_tokenizer(self.source, reader)
        self.engine.idle()  # the structured-output warm-up, in the background
        self.image_processor = self._image_processor(mmproj, image_max_tokens)
        self.reasoning_parser = reasoning_parser_for(reasoning_parser, self.tokenizer)[1]
        self._ids = itertools.count()

    def _image_processor(self, mmproj: str | None, max_tokens: int | None):
        """The model's image preprocessing (radixserve/multimodal/) where the engine loaded an
        image encoder, else None."""
        if getattr(self.engine.images, "encoder", None) is None:
            return None
        from radixserve.models.vision import find_mmproj
        from radixserve.multimodal.select import image_processor_for, with_max_tokens

        path = self.source.path
        if mmproj is None and self.source.kind == "gguf":
            mmproj = find_mmproj(path)
        return with_max_tokens(image_processor_for(path, mmproj, self.tokenizer), max_tokens)

    def close(self) -> None:
        """Stop the tensor-parallel ranks this LLM started (nothing to do for one rank) and
        the KV events publisher; the disk tier (``kv_disk_cache``) saves the cached pages."""
        self.engine.scheduler.kv.close()
        self.engine.kv_events.close()
        close = getattr(self.engine.runner, "close", None)
        if close is not None:
            close()

    def load_lora(self, name: str, path: str) -> None:
        """Load a LoRA adapter as ``name``; ValueError / FileNotFoundError when it does not fit
        the model or the name is taken."""
        self.engine.load_lora(name, path)

    def unload_lora(self, name: str) -> None:
        self.engine.unload_lora(name)

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 priority: Sequence[int] | None = None,
                 lora: str | Sequence[str | None] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. Prompts: text, token ids, or
        ``{"prompt": str}`` / ``{"prompt_token_ids": [...]}``. ``lora``: the loaded LoRA
        adapter every prompt runs with, or one name (None: the base) per prompt."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        if lora is not None:
            names = [lora] * len(prompts) if isinstance(lora, str) else list(lora)
            if len(names) != len(prompts):
                raise ValueError(f"got {len(names)} LoRA names for {len(prompts)} prompts")
            params = [msgspec.structs.replace(p, lora_name=name)
                      for p, name in zip(params, names)]
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
        items = [_Item(t, self.tokenizer.encode_prompt(t)) for t in texts]
        return self._run(items, params, [0] * len(items))

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None,
               chat: bool = False) -> Iterator[str]:
        """Yield text deltas of one request as they are generated (n must be 1)."""
        params = sampling_params or SamplingParams()
        if params.n != 1:
            raise ValueError("stream() supports n=1 only")
        if chat:
            text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
            item = _Item(text, self.tokenizer.encode_prompt(text))
        else:
            item = self._tokenize(prompt)
        fanout = Fanout(f"stream-{next(self._ids)}", item.ids,
                        self._gate(params, item), self.tokenizer, item.images)
        self._submit(fanout, 0)
        try:
            while fanout.unfinished:
                for out in self.engine.step().outputs:
                    delta = self._apply(fanout, out)
                    if delta:
                        yield delta
        finally:
            if fanout.unfinished:
                self.engine.abort_requests(list(fanout.unfinished))

    # -- internals -------------------------------------------------------------------------

    def _tokenize(self, prompt: Prompt) -> _Item:
        if isinstance(prompt, dict):
            if "multi_modal_data" in prompt:
                return self._with_images(prompt)
            if "prompt_token_ids" in prompt:
                return _Item(prompt.get("prompt"), list(prompt["prompt_token_ids"]))
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            return _Item(prompt, self.tokenizer.encode(prompt))
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return _Item(None, list(prompt))
        raise ValueError(f"a prompt must be a string, a list of token ids or a dict, "
                         f"got {type(prompt).__name__}")

    def _with_images(self, prompt: dict) -> _Item:
        """vLLM's ``{"prompt": text, "multi_modal_data": {"image": image or [images]}}``: the
        text holds the model's image placeholder (Gemma 3: ``<start_of_image>``) once per
        PIL image, in order (radixserve/multimodal/prompt.py)."""
        from radixserve.multimodal.prompt import place_images

        data, text = prompt["multi_modal_data"], prompt.get("prompt")
        if not isinstance(data, dict) or set(data) - {"image"} or not isinstance(text, str):
            raise ValueError("multi_modal_data takes {'image': image or [images]} beside a "
                             "'prompt' string")
        if self.image_processor is None:
            raise ValueError("the model takes text only: it has no image encoder (a GGUF "
                             "needs its mmproj file: LLM(..., mmproj=...))")
        images = data.get("image", [])
        images = list(images) if isinstance(images, list | tuple) else [images]
        text, ids, inputs = place_images(text, images, [None] * len(images),
                                         self.image_processor, self.tokenizer.encode_prompt)
        return _Item(text, ids, inputs)

    def _gate(self, params: SamplingParams, item: _Item) -> SamplingParams:
        if self.reasoning_parser is None or (params.structured_outputs is None
                                             and params.thinking_token_budget is None):
            return params  # nothing to gate: spare decoding the prompt
        text, ids = item.text, item.ids
        if text is None:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        parser = self.reasoning_parser.for_prompt(text)
        params = gate_on_reasoning(params, parser, text, self.tokenizer)
        if params.thinking_token_budget is None or params.thinking_tags is not None:
            return params
        # the budget's tags, from the reasoning parser (frontend/reasoning_budget.py)
        return BudgetPolicy().apply(params, params.thinking_token_budget, None, parser, text,
                                    self.tokenizer)

    def _submit(self, fanout: Fanout, priority: int) -> None:
        for req in fanout.requests(sorted(self.tokenizer.eos_token_ids), priority):
            self.engine.add_request(req)

    def _apply(self, fanout: Fanout, out) -> str:
        """Apply one output; abort its sample if a stop string ended it. The text released."""
        step = fanout.apply(out.request_id, [out])
        if step is not None and step[3]:
            self.engine.abort_requests([out.request_id])
        return "" if step is None else step[1]

    def _run(self, items: list[_Item], params: list[SamplingParams],
             priority: Sequence[int]) -> list[RequestOutput]:
        for item, p in zip(items, params):
            self.engine.check_request(item.ids, p)  # all prompts, before any is queued
            self.engine.images.check(item.images, len(item.ids))
        fanouts: list[Fanout] = []
        owner: dict[str, Fanout] = {}
        try:
            for item, p, prio in zip(items, params, priority):
                fanout = Fanout(f"{next(self._ids)}", item.ids, self._gate(p, item),
                                self.tokenizer, item.images)
                fanouts.append(fanout)
                self._submit(fanout, prio)
                owner.update(dict.fromkeys(fanout.states, fanout))
            while self.engine.has_unfinished_requests():
                for out in self.engine.step().outputs:
                    self._apply(owner[out.request_id], out)
        finally:
            self.engine.abort_requests([rid for f in fanouts for rid in f.unfinished])
        return [f.request_output(item.text) for f, item in zip(fanouts, items)]


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

"""Typed messages between the frontend (API process or offline LLM) and the engine core.

msgspec Structs, so a schema error surfaces at decode time when they cross a process boundary.
A request goes in once; outputs come back batched, one ``EngineCoreOutputs`` per step, which
embeds the engine core's own records as they are (core/reports.py: per-request outputs, stats,
the engine state). The output structs are created by the thousand per second and hold only
numbers, strings and lists of them (no reference cycles possible), so the garbage collector
does not track them (``gc=False``).
"""

from __future__ import annotations

import msgspec

from radixserve.core.reports import EngineCoreOutput, EngineState, SchedulerStats
from radixserve.pooling_params import PoolingParams
from radixserve.sampling_params import SamplingParams


class ImageInput(msgspec.Struct, array_like=True):
    """One image of a prompt, preprocessed in the API process (radixserve/multimodal/): its
    placeholder tokens are ``prompt_token_ids[offset:offset + length]`` (the model's image
    token, once per embedding row the vision encoder gives it); ``pixels``: the processor's
    float32 output, C order, of ``shape`` (Gemma 3: ``[3, 896, 896]``); ``key``: 32 bytes
    naming it (sha256 over the processor's name and the pixels): the engine caches the
    encoder's output by it, and the prefix cache tells images apart by it. ``grid``: for a
    model with mRoPE positions (Qwen VL), the image's token grid ``[t, h, w]`` (``t * h * w
    == length``; its rows in that order), which places each row in time, height and width;
    ``[]`` for the others. ``row_breaks`` (Pixtral: Mistral 3): each row of the ``grid``
    ``[1, h, w]`` is ``w`` image tokens and one other token ([IMG_BREAK], [IMG_END] after the
    last), ``length == h * (w + 1)``; the encoder's ``h * w`` rows replace the image tokens."""

    offset: int
    length: int
    key: bytes
    pixels: bytes
    shape: list[int]
    grid: list[int] = []
    row_breaks: bool = False


class EngineCoreRequest(msgspec.Struct, kw_only=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: list[int] = []
    arrival_time: float = 0.0
    priority: int = 0
    pooling_params: PoolingParams | None = None  # set: an embedding (prefill-only) request
    images: list[ImageInput] = []  # in prompt order, spans not overlapping


class LoraReply(msgspec.Struct, array_like=True, gc=False):
    """A `LoraAdapterCall`'s answer: ``error`` None when done, else why not, with the HTTP
    ``status`` it maps to (400, or 404 for an unknown adapter or a missing path)."""

    error: str | None = None
    status: int = 200


class EngineCoreOutputs(msgspec.Struct, array_like=True, gc=False):
    outputs: list[EngineCoreOutput]
    timestamp: float = 0.0
    stats: SchedulerStats | None = None
    state: EngineState | None = None  # only in the answer to an EngineStateQuery
    # the answers to this drain's ResetPrefixCache messages, in order (True: cleared)
    reset_prefix_cache: list[bool] | None = None
    lora_replies: list[LoraReply] | None = None  # answers to this drain's LoraAdapterCalls


# -- frontend → engine-core process -------------------------------------------------------

class AddRequest(msgspec.Struct, tag="add", array_like=True):
    request: EngineCoreRequest


class AbortRequests(msgspec.Struct, tag="abort", array_like=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class EngineStateQuery(msgspec.Struct, tag="state", array_like=True):
    """Ask for an ``EngineState``; answered by the next ``EngineCoreOutputs`` sent (on
    demand only: nothing is summarized per step)."""

    max_requests: int = 64
    max_nodes: int = 48
    max_depth: int = 4


class ResetPrefixCache(msgspec.Struct, tag="reset_prefix_cache", array_like=True):
    """Drop every cached page (vLLM's ``reset_prefix_cache``; KV events: AllBlocksCleared).
    Refused while running requests hold cached pages, unless ``reset_running_requests``
    preempts them first (they resume by recomputing). Answered in the next
    ``EngineCoreOutputs.reset_prefix_cache``."""

    reset_running_requests: bool = False


class LoraAdapterCall(msgspec.Struct, tag="lora", array_like=True):
    """Load the LoRA adapter at ``path`` as ``name`` (engine/lora_registry.py), or unload
    ``name`` when ``path`` is None. Answered in order in ``EngineCoreOutputs.lora_replies``."""

    name: str
    path: str | None = None


EngineInput = (AddRequest | AbortRequests | EngineStateQuery | ResetPrefixCache
               | LoraAdapterCall | Shutdown)


class EngineReady(msgspec.Struct):
    """Sent once by the engine-core process when its model is loaded (or failed to load)."""

    max_model_len: int = 0
    vocab_size: int = 0
    num_kv_blocks: int = 0
    block_size: int = 0
    error: str | None = None
    loras: dict[str, str] = {}  # the LoRA adapters it loaded at start (--lora): name → path
    takes_images: bool = False  # an image encoder is attached (engine/vision_setup.py)

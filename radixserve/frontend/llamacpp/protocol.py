"""llama.cpp server's ``POST /infill`` request, as its editor clients send it (llama.vscode,
llama.vim), and its mapping to `SamplingParams`.

Sampling fields keep llama.cpp's defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
n_predict -1: until the context is full; seed -1: random). What they mean here:

* ``n_indent``: stop at the first line indented less (llama.cpp's rule, `serving`);
* ``t_max_predict_ms``: stop once that long has passed since the first token and a new line
  was written;
* ``samplers``: names checked against llama.cpp's; the chain is this engine's own (penalties,
  top-k, top-p, min-p, temperature), in its order, and llama.cpp's ``infill`` sampler (which
  merges candidates sharing a prefix) is not applied;
* ``t_max_prompt_ms`` (unimplemented in llama.cpp too), ``cache_prompt`` (the prefix cache is
  always on) and ``id_slot`` (no slots here) change nothing;
* ``return_progress`` (with ``stream``): an object with empty content and a
  ``prompt_progress`` after each chunk of the prompt, as llama.cpp sends them;
* ``n_probs`` and per-request ``lora`` ids are refused: use /v1/completions for logprobs and a
  LoRA adapter's name.

Unknown fields are 400s naming them, as on every route of this server.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from radixserve.frontend.http.protocol_base import INT64_MAX, REQUEST_CONFIG
from radixserve.sampling_params import SamplingParams

# llama.cpp's sampler names (common/sampling.cpp), long and short ("dkypmxt") forms
_SAMPLERS = {"dry", "top_k", "typ_p", "typical_p", "top_p", "min_p", "xtc", "temperature",
             "infill", "penalties", "top_n_sigma"}
_SAMPLER_CHARS = set("dkyptmxisen")
_RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: draw one


class InfillChunk(BaseModel):
    """One ``input_extra`` entry: context from another file."""

    model_config = REQUEST_CONFIG
    text: str
    filename: str = "tmp"  # llama.cpp's default name


class InfillRequest(BaseModel):
    """``POST /infill``: fill in between ``input_prefix`` (+ ``prompt``, the start of the
    middle) and ``input_suffix``, with ``input_extra`` files as context."""

    model_config = REQUEST_CONFIG
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillChunk] = Field(default_factory=list)
    prompt: str = ""
    model: str | None = None
    stream: bool = False
    n_predict: int = Field(-1, ge=-1)
    temperature: float = 0.8
    top_k: int = Field(40, ge=-1, le=INT64_MAX)
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = Field(-1, ge=-1, le=INT64_MAX)
    stop: list[str] = Field(default_factory=list)
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False
    n_indent: int = Field(0, ge=0)
    t_max_predict_ms: int = -1
    t_max_prompt_ms: int = -1
    cache_prompt: bool = True
    id_slot: int = -1
    samplers: list[str] | str | None = None
    n_probs: int = 0
    lora: list[dict[str, Any]] | None = None
    return_tokens: bool = False
    response_fields: list[str] | None = None
    return_progress: bool = False  # streamed: prompt_progress objects while it prefills

    @field_validator("samplers")
    @classmethod
    def _known_samplers(cls, value):
        unknown = (set(value) - _SAMPLER_CHARS if isinstance(value, str)
                   else set(value or ()) - _SAMPLERS)
        if unknown:
            raise ValueError(f"unknown samplers {sorted(unknown)}; llama.cpp's are "
                             f"{sorted(_SAMPLERS)}")
        return value

    @field_validator("n_probs")
    @classmethod
    def _no_probs(cls, value):
        if value:
            raise ValueError("n_probs is not supported on /infill; /v1/completions (with "
                             "suffix) returns logprobs")
        return value

    @field_validator("lora")
    @classmethod
    def _no_lora_ids(cls, value):
        if value:
            raise ValueError("per-request LoRA ids are not supported; name a loaded adapter "
                             "as the model of /v1/completions")
        return value

    def to_sampling_params(self) -> SamplingParams:
        """The engine's parameters; SamplingParams' own ValueError for out-of-range values.
        ``max_tokens`` None (n_predict -1): what the context leaves; 0: the prompt is only
        read into the cache (llama.vscode's warm-up call)."""
        seed = None if self.seed in (-1, _RANDOM_SEED) else self.seed
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
            min_p=self.min_p, seed=seed, stop=list(self.stop),
            repetition_penalty=self.repeat_penalty, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, ignore_eos=self.ignore_eos,
            max_tokens=None if self.n_predict < 0 else self.n_predict,
            return_progress=self.stream and self.return_progress)


class InfillErrorInfo(BaseModel):
    code: int
    message: str
    type: str


class InfillError(BaseModel):
    """llama.cpp's error body, as /openapi.json describes it."""

    error: InfillErrorInfo

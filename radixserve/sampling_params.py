"""SamplingParams: how one request samples and when it stops (vLLM's offline API shape).

A msgspec Struct, so the same object crosses the API → engine-core boundary as typed msgpack.
Every field is validated in ``__post_init__``: bad values raise ``ValueError`` naming the field.
"""

from __future__ import annotations

import msgspec

from radixserve.structured.params import StructuredOutputsParams

_MAX_LOGPROBS = 20


class ThinkingTags(msgspec.Struct, frozen=True, kw_only=True):
    """Where a request's reasoning is, as token ids, so the engine can hold it to
    ``SamplingParams.thinking_token_budget`` (core/reasoning_budget.py). Filled in by the
    frontend from its reasoning parser (frontend/reasoning_budget.py).

    ``starts_in_reasoning``: the prompt opened the block, the output begins inside it;
    otherwise it enters the block only if its first tokens are ``start_token_ids``.
    ``end_token_ids``: the end tag (the model closing the block itself ends the count).
    ``forced_token_ids``: what the engine writes once the budget is spent: the budget
    message's tokens, then the end tag's (ending with ``end_token_ids``).
    """

    start_token_ids: list[int]
    end_token_ids: list[int]
    forced_token_ids: list[int]
    starts_in_reasoning: bool = False

    def __post_init__(self) -> None:
        ids = self.start_token_ids + self.end_token_ids + self.forced_token_ids
        _check(all(_is_int(t) and t >= 0 for t in ids), "thinking_tags",
               "token ids must be non-negative integers")
        _check(bool(self.end_token_ids) and bool(self.start_token_ids or
                                                self.starts_in_reasoning), "thinking_tags",
               "need an end tag, and a start tag unless the output starts in reasoning")
        end = self.end_token_ids
        _check(self.forced_token_ids[-len(end):] == end, "thinking_tags",
               "forced_token_ids must end with end_token_ids")


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Per-request sampling and stopping parameters.

    ``temperature == 0`` means greedy. ``top_k`` of 0 or -1 disables top-k. ``seed`` makes the
    request's samples reproducible whatever else is in the batch. ``logprobs`` asks for the
    sampled token's logprob plus the top-N alternatives (N = ``logprobs``, 0 = only the sampled).
    ``prompt_logprobs`` (vLLM's) asks for each prompt token's logprob given the tokens before
    it, plus the top-N alternatives at that position (N = ``prompt_logprobs``), computed in the
    prefill (core/prompt_logprobs.py); ``max_tokens`` 0 then scores the prompt and generates
    nothing (finish reason "length"), as for OpenAI's ``echo`` with ``max_tokens: 0``.
    ``logit_bias`` maps token id → bias added to that token's logit before sampling.
    ``structured_outputs`` constrains the output to a JSON schema, regex, choice or grammar.
    ``lora_name``: the loaded LoRA adapter the request runs with (None: the base model);
    the engine refuses an unknown name.
    ``thinking_token_budget`` (vLLM's): at most this many tokens of reasoning (None: no
    limit; 0: none), then the engine writes ``thinking_tags.forced_token_ids`` (the end of
    thinking) and the answer follows within ``max_tokens``. It applies only with
    ``thinking_tags``, which say where the reasoning is.
    ``return_progress``: the engine reports after each chunk of the prompt how far its prefill
    is (an output with only ``prompt_progress``: core/prompt_progress.py); for streams.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    lora_name: str | None = None
    thinking_token_budget: int | None = None
    thinking_tags: ThinkingTags | None = None
    return_progress: bool = False  # prompt_progress outputs while prefilling (llama-server's)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        _check(_is_int(self.n) and self.n >= 1, "n", f"must be an integer >= 1, got {self.n!r}")
        _check(_is_num(self.temperature) and self.temperature >= 0, "temperature",
               f"must be >= 0, got {self.temperature!r}")
        _check(_is_num(self.top_p) and 0 < self.top_p <= 1, "top_p",
               f"must be in (0, 1], got {self.top_p!r}")
        _check(_is_int(self.top_k) and self.top_k >= -1, "top_k",
               f"must be -1 (disabled), 0 (disabled) or a positive integer, got {self.top_k!r}")
        _check(_is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p",
               f"must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_num(value) and -2 <= value <= 2, name, f"must be in [-2, 2], got {value!r}")
        _check(_is_num(self.repetition_penalty) and self.repetition_penalty > 0,
               "repetition_penalty", f"must be > 0, got {self.repetition_penalty!r}")
        _check(self.seed is None or _is_int(self.seed), "seed",
               f"must be an integer, got {self.seed!r}")
        _check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 0),
               "max_tokens", f"must be an integer >= 0, got {self.max_tokens!r}")
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens",
               f"must be an integer >= 0, got {self.min_tokens!r}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop",
               "must be a list of non-empty strings")
        _check(all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               "must be a list of non-negative token ids")
        _check(self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs
                                         <= _MAX_LOGPROBS),
               "logprobs", f"must be an integer in [0, {_MAX_LOGPROBS}], got {self.logprobs!r}")
        _check(self.prompt_logprobs is None
               or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= _MAX_LOGPROBS),
               "prompt_logprobs",
               f"must be an integer in [0, {_MAX_LOGPROBS}], got {self.prompt_logprobs!r}")
        _check(self.structured_outputs is None
               or isinstance(self.structured_outputs, StructuredOutputsParams),
               "structured_outputs", "must be a StructuredOutputsParams")
        _check(self.thinking_token_budget is None
               or (_is_int(self.thinking_token_budget) and self.thinking_token_budget >= 0),
               "thinking_token_budget",
               f"must be an integer >= 0, got {self.thinking_token_budget!r}")
        _check(self.thinking_tags is None or isinstance(self.thinking_tags, ThinkingTags),
               "thinking_tags", "must be a ThinkingTags")
        _check(isinstance(self.return_progress, bool), "return_progress",
               f"must be a boolean, got {self.return_progress!r}")
        if self.logit_bias:
            for token, bias in self.logit_bias.items():
                _check(_is_int(token) and token >= 0, "logit_bias",
                       f"keys must be token ids (non-negative integers), got {token!r}")
                _check(_is_num(bias) and -100 <= bias <= 100, "logit_bias",
                       f"values must be in [-100, 100], got {bias!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def validate_vocab(self, vocab_size: int) -> None:
        """Raise ValueError if any token id given by the caller is outside the vocabulary."""
        tags = self.thinking_tags
        tag_ids = tags.start_token_ids + tags.forced_token_ids if tags is not None else []
        for token in list(self.logit_bias or {}) + self.stop_token_ids + tag_ids:
            if token >= vocab_size:
                raise ValueError(f"token id {token} is out of the vocabulary (size {vocab_size})")

    def clone(self, **changes) -> SamplingParams:
        return msgspec.structs.replace(self, **changes)

    def for_sample(self, index: int) -> SamplingParams:
        """The ``index``-th of ``n`` samples: n=1 and a distinct, reproducible seed."""
        if self.n == 1:
            return self
        seed = None if self.seed is None else _wrap_int64(self.seed * 1_000_003 + index)
        return self.clone(n=1, seed=seed)


def _wrap_int64(value: int) -> int:
    """``value`` modulo 2**64 as a signed 64-bit integer: a derived seed stays encodable (the
    sampler reads seeds modulo 2**64, so the samples do not change)."""
    return (value + 2**63) % 2**64 - 2**63


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{field} {message}")

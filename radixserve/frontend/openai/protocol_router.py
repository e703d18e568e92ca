"""Request fields a router adds to every request it forwards to a worker.

vllm-router and sglang-router (smg) speak SGLang's request extensions and write them into each
chat or completion body at their defaults (``no_stop_trim: false``, ``separate_reasoning:
true`` ...). They are accepted here at the value that says what radixserve does anyway;
another value is refused naming the field, rather than silently ignored. (``ignore_eos``,
``skip_special_tokens``, ``logprobs``, ``echo`` and ``continue_final_message`` are fields of
our own requests already.)
"""

from __future__ import annotations

from pydantic import BaseModel, field_validator

_MEANING = {
    "no_stop_trim": "stop strings are trimmed from the output; "
                    "use include_stop_str_in_output to keep them",
    "return_hidden_states": "hidden states are not returned",
    "separate_reasoning": "with --reasoning-parser, reasoning goes to reasoning_content",
    "stream_reasoning": "reasoning is streamed as it is generated",
    "include_reasoning": "reasoning is included in the response",
}


class RouterFields(BaseModel):
    no_stop_trim: bool = False
    return_hidden_states: bool = False
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    include_reasoning: bool = True

    @field_validator(*_MEANING)
    @classmethod
    def _only_what_we_do(cls, value: bool, info) -> bool:
        default = cls.model_fields[info.field_name].default
        if value != default:
            raise ValueError(f"'{info.field_name}': only {str(default).lower()} is supported "
                             f"({_MEANING[info.field_name]})")
        return value

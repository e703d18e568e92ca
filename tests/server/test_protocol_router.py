"""The SGLang fields a router writes into every forwarded body: accepted at their defaults,
refused otherwise with a message naming the field and what radixserve does."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from radixserve.frontend.openai.protocol import CompletionRequest
from radixserve.frontend.openai.protocol_chat import ChatCompletionRequest

ROUTER_CHAT = {"logprobs": False, "no_stop_trim": False, "ignore_eos": False,
               "continue_final_message": False, "skip_special_tokens": True,
               "separate_reasoning": True, "stream_reasoning": True,
               "return_hidden_states": False, "include_reasoning": True}


def test_what_vllm_router_adds_is_accepted():
    chat = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "stream": True, **ROUTER_CHAT})
    assert chat.stream is True
    done = CompletionRequest.model_validate(
        {"prompt": "hi", "echo": False, "no_stop_trim": False, "ignore_eos": False,
         "skip_special_tokens": True, "return_hidden_states": False})
    assert done.prompt == "hi"


@pytest.mark.parametrize("field,value", [("no_stop_trim", True),
                                         ("return_hidden_states", True),
                                         ("separate_reasoning", False)])
def test_another_value_is_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=f"'{field}': only {str(not value).lower()} "):
        CompletionRequest.model_validate({"prompt": "hi", field: value})


def test_unknown_fields_are_still_refused():
    with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs"):
        CompletionRequest.model_validate({"prompt": "hi", "no_such_field": 1})

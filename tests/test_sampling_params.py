from __future__ import annotations

import msgspec
import pytest

from radixserve import SamplingParams


@pytest.mark.parametrize("kwargs, field", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 2.0}, "min_p"),
    ({"n": 0}, "n"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"logprobs": 50}, "logprobs"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"logit_bias": {5: 500.0}}, "logit_bias"),
    ({"stop": [""]}, "stop"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"temperature": float("nan")}, "temperature"),
    ({"max_tokens": True}, "max_tokens"),
    ({"return_progress": 1}, "return_progress"),
])
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kwargs)


def test_defaults_and_stop_string_normalised():
    p = SamplingParams(stop="###")
    assert p.stop == ["###"] and p.temperature == 1.0 and p.max_tokens == 16
    assert SamplingParams(temperature=0).is_greedy


def test_round_trips_through_msgpack():
    p = SamplingParams(temperature=0.5, logit_bias={3: -1.0}, stop=["x"], seed=7)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p


def test_validate_vocab():
    with pytest.raises(ValueError, match="vocabulary"):
        SamplingParams(stop_token_ids=[100]).validate_vocab(50)

"""The recurrent-state pool's size: its own budget (--state-cache-memory-gb, else a share of the
available memory), the slots a hybrid model wants for --max-num-seqs requests, at least two,
and a warning when the budget holds fewer than the requests allowed at once."""

from __future__ import annotations

import logging

import pytest
import torch

from radixserve.config import engine_config
from radixserve.engine import build
from radixserve.model_config import FULL, LINEAR, LinearAttnParams, ModelConfig
from radixserve.runner.recurrent_state import bytes_per_slot

LAYOUT = LinearAttnParams(layer_types=(LINEAR, LINEAR, LINEAR, FULL), num_key_heads=2,
                          num_value_heads=4, key_head_dim=32, value_head_dim=32)
MODEL = ModelConfig("Qwen3_5ForCausalLM", 100, 64, 4, 4, 2, 16, 128, linear_attn=LAYOUT)
PER_SLOT = bytes_per_slot(MODEL, torch.float32)


def test_a_slot_holds_every_recurrent_layers_conv_window_and_state():
    conv = 3 * (2 * 2 * 32 + 4 * 32) * 4
    assert PER_SLOT == 3 * (conv + 4 * 32 * 32 * 4)


def test_the_given_budget_bounds_the_slots_and_says_too_few(caplog):
    config = engine_config(state_cache_memory_gb=10 * PER_SLOT / 1024**3, max_num_seqs=8)
    with caplog.at_level(logging.INFO, logger=build.logger.name):
        assert build._state_slots(config, MODEL, torch.float32) == 10
    assert "fewer than the 8 requests" in caplog.text


def test_enough_memory_gives_every_wanted_slot(monkeypatch):
    monkeypatch.setattr(build, "mem_available", lambda: 64 * 1024**3)
    config = engine_config(max_num_seqs=8, speculative="off")
    assert build._state_slots(config, MODEL, torch.float32) == 3 * 8  # live, boundary, snapshot
    config = engine_config(max_num_seqs=8, speculative="off", enable_prefix_caching=False)
    assert build._state_slots(config, MODEL, torch.float32) == 8
    config = engine_config(max_num_seqs=8, speculative="ngram", num_speculative_tokens=3)
    assert build._state_slots(config, MODEL, torch.float32) == 3 * 8 + 3 * 4  # + draft states


def test_never_fewer_than_two_slots():
    config = engine_config(state_cache_memory_gb=1e-9)
    assert build._state_slots(config, MODEL, torch.float32) == 2


def test_a_model_without_recurrent_layers_has_no_slots():
    dense = ModelConfig("LlamaForCausalLM", 100, 64, 4, 4, 2, 16, 128)
    assert build._state_slots(engine_config(), dense, torch.float32) == 0


def test_a_non_positive_budget_is_refused():
    with pytest.raises(ValueError, match="state_cache_memory_gb"):
        engine_config(state_cache_memory_gb=0)

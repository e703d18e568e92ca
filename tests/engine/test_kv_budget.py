"""The KV pool sized to the machine (issue 59 item 2): by default a share of the memory available
after the weights, divided between this machine's engines, capped at what max_num_seqs x
max_model_len use, with a 1 GiB floor where the machine has it; --kv-cache-memory-gb (or
RADIXSERVE_KV_CACHE_MEMORY_GB) overrides; too little memory warns or refuses; the start-up line
and ``radixserve env`` say which."""

from __future__ import annotations

import argparse
import logging

import pytest
import torch

from radixserve.config import engine_config
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.engine import kv_sizing
from radixserve.engine.kv_budget import (ENV, FLOOR_BYTES, GIB, KV_SHARE, auto_budget,
                                         estimate_bytes, given_budget, num_local_engines)
from radixserve.env_report import kv_pool_lines
from radixserve.model_config import ModelConfig
from radixserve.models.source import ModelSource
from radixserve.runner.kv_cache import bytes_per_token

# 4 layers x 2 KV heads x 16 dims x K and V x 2 bytes (float16) = 512 bytes a token
MODEL = ModelConfig("LlamaForCausalLM", 100, 64, 4, 4, 2, 16, 128,
                    max_position_embeddings=4096)
PER_TOKEN = 512
GROUPS = KVGroups.single(MODEL.num_layers)


@pytest.fixture(autouse=True)
def no_fixed_budget(monkeypatch):
    """The suite fixes every pool at 1 GiB (conftest.py); these tests size the default."""
    monkeypatch.delenv(ENV, raising=False)


def test_a_token_is_counted_over_every_layer_with_the_draft():
    assert bytes_per_token(MODEL, 16, torch.float16) == PER_TOKEN
    draft = ModelConfig("LlamaForCausalLM", 100, 64, 2, 4, 2, 16, 128)
    assert bytes_per_token(MODEL, 16, torch.float16, draft) == PER_TOKEN * 1.5


def test_the_default_is_a_share_of_the_available_memory():
    budget = auto_budget(20 * GIB, PER_TOKEN, 10**9)
    assert budget.num_bytes == int(KV_SHARE * 20 * GIB) == 8 * GIB
    assert budget.source == "40% of the 20.00 GiB available after the weights"
    assert budget.available == 20 * GIB


def test_the_default_is_held_to_what_the_requests_can_use():
    budget = auto_budget(20 * GIB, PER_TOKEN, 64 * 4096)
    assert budget.num_bytes == 64 * 4096 * PER_TOKEN  # 128 MiB: under the floor too
    assert "held to the 262144 tokens --max-num-seqs x max_model_len can use" in budget.source


def test_the_1_gib_floor_only_where_it_is_at_most_half_the_memory():
    raised = auto_budget(int(2.2 * GIB), PER_TOKEN, 10**9)  # 40% = 0.88 GiB
    assert raised.num_bytes == FLOOR_BYTES and "raised to the 1.00 GiB floor" in raised.source
    short = auto_budget(int(1.5 * GIB), PER_TOKEN, 10**9)  # 1 GiB would be 2/3 of it
    assert short.num_bytes == int(0.4 * 1.5 * GIB)


def test_engines_on_one_machine_divide_the_share():
    alone = auto_budget(24 * GIB, PER_TOKEN, 10**9)
    two = auto_budget(24 * GIB, PER_TOKEN, 10**9, num_engines=2)
    assert two.num_bytes == alone.num_bytes // 2
    assert "shared by 2 engines" in two.source
    assert num_local_engines(2) == 2
    assert num_local_engines(2, loaded_models=3) == 6
    assert num_local_engines(4, is_remote=True) == 1  # Ray replicas: their own machines


def test_the_flag_then_the_environment_override_the_default(monkeypatch):
    assert given_budget(None) is None
    flag = given_budget(2.5)
    assert (flag.num_bytes, flag.source) == (int(2.5 * GIB), "--kv-cache-memory-gb")
    monkeypatch.setenv(ENV, "0.5")
    env = given_budget(None)
    assert (env.num_bytes, env.source) == (GIB // 2, ENV)
    assert given_budget(3.0).num_bytes == 3 * GIB  # the flag wins
    assert estimate_bytes(None) == GIB // 2
    for bad in ("lots", "0", "-1"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=ENV):
            given_budget(None)
    monkeypatch.delenv(ENV)
    assert estimate_bytes(None) == FLOOR_BYTES  # --models-dir admission counts the floor


def _serve_args(*argv: str) -> argparse.Namespace:
    from radixserve.serve_args import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    return parser.parse_args(list(argv))


def test_the_cli_flag_takes_auto_and_positive_numbers_only(capsys):
    from radixserve.cli_args import engine_kwargs

    assert _serve_args().kv_cache_memory_gb is None
    assert _serve_args("--kv-cache-memory-gb", "auto").kv_cache_memory_gb is None
    assert _serve_args("--kv-cache-memory-gb", "3").kv_cache_memory_gb == 3.0
    for bad in ("0", "-2", "big"):
        with pytest.raises(SystemExit):
            _serve_args("--kv-cache-memory-gb", bad)
    assert "--kv-cache-memory-gb" in capsys.readouterr().err
    kwargs = engine_kwargs(_serve_args("--data-parallel-size", "2"))
    assert kwargs["num_local_engines"] == 2
    assert engine_config(**kwargs).cache.num_local_engines == 2
    many = engine_kwargs(_serve_args("--models-dir", "/x", "--max-loaded-models", "3",
                                     "--data-parallel-size", "2"))
    assert many["num_local_engines"] == 6


def test_the_config_refuses_a_non_positive_budget():
    with pytest.raises(ValueError, match="kv_cache_memory_gb"):
        engine_config(kv_cache_memory_gb=0)
    with pytest.raises(ValueError, match="num_local_engines"):
        engine_config(num_local_engines=0)


def _blocks(monkeypatch, available: int, caplog, **config) -> int:
    monkeypatch.setattr(kv_sizing, "mem_available", lambda: available)
    with caplog.at_level(logging.INFO, logger=kv_sizing.logger.name):
        return kv_sizing.kv_pool_blocks(engine_config(**config), MODEL, MODEL, torch.float16,
                                        GROUPS)


def test_the_engine_sizes_the_pool_from_the_memory_after_the_load(monkeypatch, caplog):
    num = _blocks(monkeypatch, 4 * GIB, caplog, max_num_seqs=1024)
    per_block = 16 * PER_TOKEN
    assert num == int(0.4 * 4 * GIB) // per_block
    assert (f"KV pool: {num} blocks, {num * 16} tokens, 1.60 GiB (40% of the 4.00 GiB "
            "available after the weights); allocated untouched, resident only as blocks fill"
            in caplog.text)


def test_the_engine_pool_is_capped_divided_and_overridden(monkeypatch, caplog):
    capped = _blocks(monkeypatch, 64 * GIB, caplog, max_num_seqs=4, max_model_len=1024)
    assert capped == 4 * 1024 // 16
    shared = _blocks(monkeypatch, 4 * GIB, caplog, max_num_seqs=1024, num_local_engines=4)
    assert shared == int(0.4 * GIB) // (16 * PER_TOKEN)
    given = _blocks(monkeypatch, 64 * GIB, caplog, kv_cache_memory_gb=0.25)
    assert given == GIB // 4 // (16 * PER_TOKEN)
    assert "(--kv-cache-memory-gb)" in caplog.text
    assert _blocks(monkeypatch, 64 * GIB, caplog, num_kv_blocks=7) == 7
    assert "(--num-kv-blocks)" in caplog.text


def test_too_little_memory_warns_then_refuses(monkeypatch, caplog):
    # 40% of 1 MiB holds 819 tokens: fewer than the 4,096-token window
    assert _blocks(monkeypatch, 1 << 20, caplog) == (4 << 20) // 10 // (16 * PER_TOKEN)
    assert "fewer than one 4096-token request: the context is cut to fit" in caplog.text
    with pytest.raises(ValueError, match="holds no block.*free memory.*40% of the"):
        _blocks(monkeypatch, 1000, caplog)


def test_tensor_parallel_ranks_get_one_budget_fixed_before_they_load(monkeypatch, tmp_path):
    weights = tmp_path / "w.gguf"
    weights.write_bytes(b"\0" * (1 << 20))
    # the weights' file is taken off the memory available before they load
    monkeypatch.setattr(kv_sizing, "mem_available", lambda: 4 * GIB + (1 << 20))
    source = ModelSource("gguf", str(weights), "w")
    config = engine_config(tensor_parallel_size=2, max_num_seqs=1024,
                           kv_cache_dtype="float16")
    fixed = kv_sizing.fix_tp_budget(config, source, MODEL)
    assert fixed.cache.kv_cache_memory_gb == pytest.approx(0.4 * 4 / 2)  # per rank
    alone = engine_config(max_num_seqs=1024)
    assert kv_sizing.fix_tp_budget(alone, source, MODEL) is alone
    given = engine_config(tensor_parallel_size=2, kv_cache_memory_gb=1.0)
    assert kv_sizing.fix_tp_budget(given, source, MODEL) is given


def test_env_reports_the_pool_serve_would_size():
    lines = kv_pool_lines(MODEL, torch.float16, weights=GIB, available=11 * GIB)
    cap = 64 * 4096  # serve's --max-num-seqs 64 x the model's window
    assert lines[0] == (f"  KV pool: {cap // 16} blocks, {cap} tokens, 0.12 GiB (40% of the "
                        "10.00 GiB available after the weights; held to the 262144 tokens "
                        "--max-num-seqs x max_model_len can use); allocated untouched, "
                        "resident only as blocks fill")
    assert "memory available now 11.00 GiB, the weights about 1.00 GiB" in lines[1]
    big = ModelConfig("LlamaForCausalLM", 100, 64, 32, 32, 8, 128, 128,
                      max_position_embeddings=131072)  # 128 KiB a token (float16)
    line = kv_pool_lines(big, torch.float16, weights=GIB, available=21 * GIB)[0]
    assert line == ("  KV pool: 4096 blocks, 65536 tokens, 8.00 GiB (40% of the 20.00 GiB "
                    "available after the weights); allocated untouched, resident only as "
                    "blocks fill")


def test_an_llm_without_a_budget_sizes_its_pool_to_the_machine(tiny_hf_dirs, monkeypatch,
                                                                caplog):
    from radixserve import LLM, SamplingParams

    monkeypatch.setattr(kv_sizing, "mem_available", lambda: 3 * GIB)
    with caplog.at_level(logging.INFO, logger=kv_sizing.logger.name):
        llm = LLM(str(tiny_hf_dirs["llama"]), max_num_seqs=2, max_model_len=128,
                  show_progress=False, speculative="off")
    try:  # 2 requests x 128 tokens: 16 blocks, however much memory there is
        assert llm.engine.scheduler.kv.block_pool.num_blocks == 2 * 128 // 16
        assert "held to the 256 tokens" in caplog.text
        out = llm.generate(["hello world"], SamplingParams(max_tokens=4, temperature=0))
        assert len(out[0].outputs[0].token_ids) == 4
    finally:
        llm.close()


def test_tensor_parallel_ranks_size_one_pool_by_default(tiny_hf_dirs, monkeypatch):
    """The default budget through tensor parallel (rank 1 a process of its own, building
    the pool rank 0 fixed for it before it started): the engine builds and generates."""
    from radixserve import LLM, SamplingParams

    llm = LLM(str(tiny_hf_dirs["llama"]), tensor_parallel_size=2, threads=1, max_num_seqs=2,
              max_model_len=128, quantization="none", show_progress=False, speculative="off")
    try:
        assert llm.config.cache.kv_cache_memory_gb is None  # fixed inside the build only
        assert llm.engine.scheduler.kv.block_pool.num_blocks == 2 * 128 // 16
        out = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0))
        assert len(out[0].outputs[0].token_ids) == 4
    finally:
        llm.close()

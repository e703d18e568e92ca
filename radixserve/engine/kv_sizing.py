"""The paged KV pool's size in the engine process (engine/build.py): the budget of
kv_budget.py turned into blocks of this model, logged once at start.

    build_engine_core ─▶ fix_tp_budget (tensor parallel only: before the ranks start)
                      ─▶ load ─▶ kv_pool_blocks (after the load: the memory left is known)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import torch

from radixserve.config import CacheConfig, EngineConfig
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.cpu.memory import mem_available
from radixserve.engine.context_len import model_window
from radixserve.engine.kv_budget import (GIB, KVBudget, auto_budget, estimated_weight_bytes,
                                        given_budget, short_of_one_request, startup_line)
from radixserve.model_config import ModelConfig
from radixserve.models.source import ModelSource
from radixserve.runner.kv_cache import bytes_per_token, num_blocks_for_budget, resolve_kv_dtype

logger = logging.getLogger(__name__)


def kv_pool_blocks(config: EngineConfig, model_config: ModelConfig, kv_model: ModelConfig,
                   kv_dtype: torch.dtype, groups: KVGroups,
                   draft: ModelConfig | None = None) -> int:
    """The pool's blocks (units of ``groups.unit_layers`` layers): ``--num-kv-blocks``, else
    as many as the budget holds, the given one or by default a share of the memory available
    now (after the weights: this runs after the load), `budget_for`. ``model_config``: the
    whole model (its window); ``kv_model``: this rank's KV shape; ``draft``: a draft model
    whose pool the budget also holds. Logs the start-up line, and a WARNING where one request
    of the model's window does not fit (the context is then cut to the pool: context_len.py).
    """
    cache = config.cache
    per_token = bytes_per_token(kv_model, cache.block_size, kv_dtype, draft)
    if cache.num_blocks is not None:
        budget = KVBudget(int(cache.num_blocks * cache.block_size * per_token),
                          "--num-kv-blocks")
    else:
        budget = budget_for(config, model_config, per_token, mem_available)
    num_blocks, line = pool_figures(kv_model, cache, kv_dtype, groups, budget, draft)
    logger.info("%s", line)
    if config.scheduler.max_model_len is None:  # an asked one too long is refused later
        short = short_of_one_request(budget, per_token, model_window(model_config))
        if short is not None:
            logger.warning("%s", short)
    return num_blocks


def pool_figures(kv_model: ModelConfig, cache: CacheConfig, kv_dtype: torch.dtype,
                 groups: KVGroups, budget: KVBudget,
                 draft: ModelConfig | None = None) -> tuple[int, str]:
    """The blocks ``budget`` holds and the start-up line that says so (the engine logs it,
    ``radixserve env`` prints it)."""
    per_token = bytes_per_token(kv_model, cache.block_size, kv_dtype, draft)
    try:
        num_blocks = num_blocks_for_budget(kv_model, cache, kv_dtype, budget.num_bytes, groups,
                                           draft)
    except ValueError as exc:  # say where the budget came from
        raise ValueError(f"{exc} (the budget: {budget.source})") from None
    # tokens of every layer (a sliding layer's pages are released behind its window)
    num_tokens = num_blocks * groups.unit_layers // kv_model.num_layers * cache.block_size
    return num_blocks, startup_line(num_blocks, num_tokens, int(num_tokens * per_token), budget)


def budget_for(config: EngineConfig, model_config: ModelConfig, per_token: float,
               available: Callable[[], int]) -> KVBudget:
    """The given budget (the flag, else ``RADIXSERVE_KV_CACHE_MEMORY_GB``), else the default
    of kv_budget.py on ``available()`` bytes, for ``max_num_seqs`` requests of
    ``max_model_len`` (else the model's window) tokens, at ``per_token`` bytes each."""
    given = given_budget(config.cache.kv_cache_memory_gb)
    if given is not None:
        return given
    max_len = config.scheduler.max_model_len or model_window(model_config)
    return auto_budget(available(), per_token, config.scheduler.max_num_seqs * max_len,
                       config.cache.num_local_engines)


def fix_tp_budget(config: EngineConfig, source: ModelSource, model_config: ModelConfig,
                  reader=None) -> EngineConfig:
    """``config`` with each tensor-parallel rank's budget fixed where none was given. Every
    rank must size the same pool, but they load at once and each would see other free memory
    after its own load; so rank 0 sizes the default before they start, on the memory
    available now less the weights' size estimated from their files, and splits it between
    the ranks (each holds its share of the KV heads). One rank: ``config`` as is."""
    world, cache = config.parallel.tensor_parallel_size, config.cache
    if (world == 1 or cache.num_blocks is not None
            or given_budget(cache.kv_cache_memory_gb) is not None):
        return config
    from radixserve.models.loader import device_and_dtype

    device, dtype = device_and_dtype(config.device)
    kv_dtype = resolve_kv_dtype(cache.kv_cache_dtype, device, dtype,
                                model_config.widest_head_dim)
    per_token = bytes_per_token(model_config.kv_view(), cache.block_size, kv_dtype)
    weights = estimated_weight_bytes(source.kind, source.path,
                                     _is_widened(config, source, reader, dtype))
    budget = budget_for(config, model_config, per_token, lambda: mem_available() - weights)
    logger.info("KV pool: %.2f GiB for %d tensor-parallel ranks, %.2f GiB each (%s; the "
                "weights' %.2f GiB estimated from their files)", budget.num_bytes / GIB, world,
                budget.num_bytes / world / GIB, budget.source, weights / GIB)
    return replace(config, cache=replace(cache, kv_cache_memory_gb=budget.num_bytes / world
                                         / GIB))


def _is_widened(config: EngineConfig, source: ModelSource, reader, dtype: torch.dtype) -> bool:
    """Whether a 16-bit Hugging Face folder loads widened to float32 (quantization none)."""
    from radixserve.models.half_stored import checkpoint_dtype
    from radixserve.models.quantization import resolve_quantization

    stored = checkpoint_dtype(source)
    if stored not in (torch.float16, torch.bfloat16) or dtype != torch.float32:
        return False
    device = torch.device(config.device.device)
    return resolve_quantization(config.device.quantization, device, reader, stored) == "none"

"""The engine's disk tier from its config (engine/build.py calls `make_disk_tier`), or None
with an INFO line saying why it is off for this model."""

from __future__ import annotations

import logging
import os

import torch

from radixserve.config import EngineConfig
from radixserve.kvdisk.args import GIB, default_budget_bytes
from radixserve.kvdisk.fingerprint import ModelIdentity
from radixserve.kvdisk.store import DiskPageStore
from radixserve.kvdisk.tier import KVDiskTier
from radixserve.models.loader import device_and_dtype
from radixserve.runner.kv_pages import KVPages
from radixserve.runner.state_pages import StatePages

logger = logging.getLogger(__name__)

def make_disk_tier(config: EngineConfig, model_path: str, runner, quantization: str,
                   kv_dtype: torch.dtype) -> KVDiskTier | None:
    """The tier ``config.kv_disk`` asks for over ``runner``'s pool, or None: not asked for,
    or this engine keeps no plain full-attention pages (no prefix cache, sliding-window
    groups, tensor parallel: each rank holds a share of each page, a draft model or an MTP
    block: its own KV would miss the restored pages). A hybrid model's recurrent-state
    snapshots are saved beside its pages."""
    disk = config.kv_disk
    if disk.path is None:
        return None
    why = _why_off(config, runner)
    if why is not None:
        logger.info("KV disk cache: off (%s)", why)
        return None
    k = runner.kv_caches[0][0]
    identity = ModelIdentity(
        os.path.abspath(model_path), quantization, str(device_and_dtype(config.device)[1]),
        str(kv_dtype),
        config.cache.block_size, len(runner.kv_caches), k.shape[2], k.shape[3],
        config.parallel.tensor_parallel_size, runner.device.type, _kernel_level(runner))
    os.makedirs(disk.path, exist_ok=True)
    budget = (int(disk.budget_gb * GIB) if disk.budget_gb is not None
              else default_budget_bytes(disk.path))
    store = DiskPageStore(disk.path, identity.fingerprint(), budget)
    pages = KVPages(runner.kv_caches)
    states = StatePages(runner.states) if runner.states is not None else None
    logger.info("KV disk cache: %s (budget %.1f GiB, pages of %d tokens, %.0f KiB each%s)",
                store.folder, budget / GIB, config.cache.block_size, pages.page_bytes / 1024,
                f"; recurrent states of {states.slot_bytes / 2**20:.1f} MiB" if states else "")
    return KVDiskTier(store, pages, config.cache.block_size, states=states)


def _why_off(config: EngineConfig, runner) -> str | None:
    if not config.cache.enable_prefix_caching:
        return "the prefix cache is off"
    if config.parallel.tensor_parallel_size > 1:
        return "tensor parallel: each rank holds a share of each page"
    if config.speculative.draft_model is not None:
        return "a draft model's KV pool is not saved with the target's"
    if config.speculative.method == "mtp":
        return "the MTP block's KV layer is not saved with the target's"
    if len(runner.groups.groups) > 1 or runner.groups.has_sliding:
        return "sliding-window KV groups are not saved to disk yet"
    return None


def _kernel_level(runner) -> str | None:
    """The native kernels' level on the CPU (their rounding may differ between levels)."""
    if runner.device.type != "cpu":
        return None
    from radixserve.kernels import native

    return native.describe().level

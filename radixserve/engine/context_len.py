"""The engine's context length (``max_model_len``): the model's window, capped by what the KV
pool holds.

A request that omits ``max_tokens`` may generate until its sequence fills the context, so the
scheduler reserves (and admits only when the pool can ever hold) ``max_model_len`` tokens for
it. A context longer than the pool would refuse every such request (a 128k Llama 3 on a 1 GiB
pool); so with no ``--max-model-len`` the context is the window capped by the pool's
``num_blocks * block_size`` tokens. An explicit ``--max-model-len`` beyond the window or the
pool is refused at start (as vLLM refuses one its KV cache cannot hold): the number asked for
could never be served.
"""

from __future__ import annotations

import logging

from radixserve.model_config import ModelConfig
from radixserve.layers.rope_scaling import rope_window

logger = logging.getLogger(__name__)


def model_window(model: ModelConfig) -> int:
    """The longest sequence the model computes: its rope window (sliding-window layers are
    masked by every attention backend, so they do not shorten it)."""
    return rope_window(model.max_position_embeddings, model.rope_scaling)


def resolve_max_model_len(asked: int | None, model: ModelConfig, num_blocks: int,
                          block_size: int) -> int:
    """``asked``: ``--max-model-len`` (None: choose). ValueError for an asked length the
    window or the pool cannot hold, naming both numbers. Logs the choice once (INFO)."""
    window = model_window(model)
    pool = num_blocks * block_size
    if asked is not None:
        if asked < 2:
            raise ValueError(f"max_model_len must be >= 2 (a prompt token and a generated "
                             f"one), got {asked}")
        if asked > window:
            raise ValueError(f"max_model_len={asked} exceeds the model's context window "
                             f"({window})")
        if asked > pool:
            raise ValueError(
                f"max_model_len={asked} exceeds what the KV pool holds ({pool} tokens: "
                f"{num_blocks} blocks of {block_size}); raise --kv-cache-memory-gb or lower "
                f"--max-model-len")
        logger.info("context: max_model_len %d (asked; model window %d, KV pool %d tokens)",
                    asked, window, pool)
        return asked
    chosen = min(window, pool)
    logger.info("context: max_model_len %d (model window %d, KV pool holds %d tokens = %d "
                "blocks of %d)", chosen, window, pool, num_blocks, block_size)
    return chosen

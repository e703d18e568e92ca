"""The draft model of ``--speculative draft``: opened beside the target, its vocabulary
checked against the target's, loaded, and run by a `ModelRunner` of its own over its own KV
pool (runner/draft_runner.py).

Memory: the KV budget (``--kv-cache-memory-gb``) holds both pools with the same number of
blocks each, so the draft pool holds as many tokens as the target's (the draft's share of the
budget is its bytes per block over both models'; runner/kv_cache.py). An explicit
``--num-kv-blocks`` is each pool's count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from radixserve.config import EngineConfig
from radixserve.engine.context_len import model_window
from radixserve.tokenizer.tokenizer import load_tokenizer
from radixserve.models.half_stored import checkpoint_dtype
from radixserve.models.loader import (device_and_dtype, load_model, load_model_config,
                                      open_gguf)
from radixserve.model_config import ModelConfig
from radixserve.models.quantization import resolve_quantization
from radixserve.models.source import ModelSource
from radixserve.runner.draft_runner import DraftRunner
from radixserve.runner.kv_cache import bytes_per_block
from radixserve.runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class DraftSource:
    """An opened draft model (its config read, its weights not yet loaded)."""

    source: ModelSource
    config: ModelConfig
    reader: object | None


def open_draft(path: str, target: ModelSource, target_config: ModelConfig,
               target_reader=None) -> DraftSource:
    """Resolve and read the draft model's config and check its vocabulary against the
    target's (ValueError naming both models if it differs)."""
    source = ModelSource.resolve(path)
    reader = open_gguf(source.path) if source.kind == "gguf" else None
    config = load_model_config(source, reader)
    check_draft_vocab(target, target_config, target_reader, source, config, reader)
    return DraftSource(source, config, reader)


def check_draft_vocab(target: ModelSource, target_config: ModelConfig, target_reader,
                      draft: ModelSource, draft_config: ModelConfig, draft_reader) -> None:
    """The draft's token ids must mean the target's: its vocabulary no larger, and each of
    its tokens the target's token of the same id."""
    names = f"the draft model {draft.path} and the target model {target.path}"
    if draft_config.vocab_size > target_config.vocab_size:
        raise ValueError(f"{names} have different vocabularies: the draft's has "
                         f"{draft_config.vocab_size} tokens, the target's "
                         f"{target_config.vocab_size} (a draft model needs the target's "
                         "tokenizer: the same ids, at most as many)")
    target_vocab = load_tokenizer(target, target_reader).backend.get_vocab(True)
    draft_vocab = load_tokenizer(draft, draft_reader).backend.get_vocab(True)
    for token, token_id in sorted(draft_vocab.items(), key=lambda kv: kv[1]):
        if target_vocab.get(token) != token_id:
            raise ValueError(f"{names} have different vocabularies: the draft's token "
                             f"{token_id} is {token!r}, which the target "
                             + ("does not have" if token not in target_vocab
                                else f"numbers {target_vocab[token]}")
                             + " (a draft model needs the target's tokenizer)")


def build_draft_runner(config: EngineConfig, draft: DraftSource, num_blocks: int,
                       max_model_len: int, kv_dtype: torch.dtype,
                       show_progress: bool = True) -> DraftRunner:
    """Load the draft model and its runner over a pool of ``num_blocks`` blocks; logs the
    choice once."""
    device, dtype = device_and_dtype(config.device)
    quantization = resolve_quantization(config.device.quantization, device, draft.reader,
                                        checkpoint_dtype(draft.source))
    model = load_model(draft.source, draft.config, device, dtype, draft.reader,
                       show_progress, quantization)
    window = model_window(draft.config)
    if window < max_model_len:
        logger.warning("draft model %s: its window (%d) is shorter than the context (%d); "
                       "its drafts past it are extrapolated", draft.source.name, window,
                       max_model_len)
    model.rotary.set_context_len(max_model_len)
    block_size = config.cache.block_size
    runner = ModelRunner(model, draft.config, num_blocks, block_size, device, dtype,
                         kv_dtype=kv_dtype)
    pool_gb = num_blocks * bytes_per_block(draft.config, block_size, kv_dtype) / 1024**3
    logger.info("speculative draft model: %s (%s, %d layers, vocab %d, quantization %s, "
                "attention %s); its KV pool: %d blocks of %d, %.3f GiB of the KV budget",
                draft.source.path, draft.config.architecture, draft.config.num_layers,
                draft.config.vocab_size, quantization, runner.backend_name, num_blocks,
                block_size, pool_gb)
    return DraftRunner(runner, draft.source.name)

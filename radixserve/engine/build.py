"""The engine-core process's composition root: the parts of an `EngineCore` from the config.

    build_engine_core(config, source)            rank 0, or the only rank
      model config ─▶ tensor parallel (ranks 1..N-1 started meanwhile: tp/ranks.py) ─▶ threads
      ─▶ this rank's shard of the model ─▶ draft model opened ─▶ KV pool sized from the budget
      ─▶ ModelRunner ─▶ KV manager (block pool + prefix cache) ─▶ context length ─▶ draft
      runner ─▶ scheduler (+ speculation) ─▶ grammar backend ─▶ EngineCore
    build_rank_runner(config, source, group)     a tensor-parallel rank > 0 (tp/worker.py)
      its shard and the ModelRunner over its share of the pool, sized by the same arithmetic as
      rank 0's; nothing else: the scheduler, KV manager, prefix cache and grammar backend are
      rank 0's alone
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from radixserve.config import EngineConfig
from radixserve.model_config import ModelConfig
from radixserve.core.kv.block_pool import BlockPool
from radixserve.core.kv.kv_events import KVEventLog
from radixserve.core.kv.kv_groups import KVGroups
from radixserve.core.kv.kv_manager import KVCacheManager
from radixserve.core.kv.no_cache import NoPrefixCache
from radixserve.core.kv.radix_cache import RadixCache
from radixserve.core.kv.radix_snapshots import Snapshots
from radixserve.core.kv.recurrent_states import RecurrentStates
from radixserve.core.kv.state_pool import StatePool
from radixserve.core.scheduler import Scheduler
from radixserve.cpu.memory import mem_available
from radixserve.cpu.threads import apply_engine_threads
from radixserve.engine.context_len import resolve_max_model_len
from radixserve.engine.draft_setup import build_draft_runner, open_draft
from radixserve.engine.engine_core import EngineCore
from radixserve.engine.vision_setup import attach_image_encoder
from radixserve.engine.kv_events import KVEventsOutlet, make_publisher
from radixserve.engine.kv_sizing import fix_tp_budget, kv_pool_blocks
from radixserve.engine.mtp_setup import mtp_kv_view, with_mtp
from radixserve.engine.structured_manager import StructuredOutputManager
from radixserve.engine.tp.group import TensorParallelGroup
from radixserve.engine.tp.ranks import start_tensor_parallel
from radixserve.kvdisk.setup import make_disk_tier
from radixserve.layers.block_linear import REPACK
from radixserve.models.half_stored import checkpoint_dtype
from radixserve.models.cross_encoder_config import cross_encoder_config
from radixserve.models.packed_cache import packed_store
from radixserve.models.loader import (device_and_dtype, load_model, load_model_config,
                                      open_gguf)
from radixserve.models.quantization import resolve_quantization
from radixserve.models.source import ModelSource
from radixserve.models.tp_shard import TensorShard
from radixserve.runner.fault_injection import inject_faults_from_env
from radixserve.runner.kv_cache import draft_pool_blocks, resolve_kv_dtype
from radixserve.runner.model_runner import ModelRunner
from radixserve.runner.mtp_runner import MtpRunner
from radixserve.runner.recurrent_state import bytes_per_slot
from radixserve.spec.factory import make_spec
from radixserve.structured.llguidance_backend import LLGuidanceBackend
from radixserve.tokenizer.tokenizer import Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

GIB = 1024**3
STATE_SHARE = 0.10  # of the available memory, for recurrent states by default


def build_engine_core(config: EngineConfig, source: ModelSource, show_progress: bool = True,
                      reader=None,
                      tokenizer: Callable[[], Tokenizer] | None = None) -> EngineCore:
    """Load the model and size the KV pool; ``reader``: an open GGUFReader to reuse;
    ``tokenizer`` returns the caller's `Tokenizer` (default: load it from ``source``); it is
    called on the first structured-output request. This process is rank 0: it starts the
    other tensor-parallel ranks when ``config.parallel`` asks for several. A BERT-style
    cross-encoder folder gets its own runner and no KV cache (engine/encoder_build.py)."""
    if (encoder := cross_encoder_config(source)) is not None:
        from radixserve.engine.encoder_build import build_encoder_core

        return build_encoder_core(config, source, encoder)
    if reader is None and source.kind == "gguf":
        reader = open_gguf(source.path)
    model_config = load_model_config(source, reader)
    if model_config.linear_attn is not None and config.speculative.method == "draft":
        # the draft model's runner keeps no recurrent states (the target's verify does)
        raise ValueError(f"speculative decoding with a draft model does not run with "
                         f"{model_config.architecture} (recurrent layers) yet; use "
                         "--speculative ngram, suffix or auto")
    model_config = with_mtp(config, source, model_config, reader)  # --speculative mtp
    config = fix_tp_budget(config, source, model_config, reader)  # the ranks' one pool size
    tp = start_tensor_parallel(config, source, model_config, reader)
    threads = apply_engine_threads(tp.rank_threads(config.device.threads))  # before the model
    model, quantization = _load_shard(config, source, model_config, reader, tp.shard,
                                      show_progress)
    draft = None
    if config.speculative.draft_model is not None:  # its vocabulary checked here
        draft = open_draft(config.speculative.draft_model, source, model_config, reader)
    runner, num_blocks, kv_dtype = _runner(config, model_config, model,
                                           draft.config if draft else mtp_kv_view(model_config))
    device, groups, block_size = runner.device, runner.groups, config.cache.block_size
    if device.type == "cpu":
        logger.info("engine: %s", model.kernel_plan.startup_line(kv_dtype, threads))
    kv_events = _kv_events(config)
    disk = make_disk_tier(config, source.path, runner, quantization, kv_dtype)
    kv = _kv_manager(config, groups, num_blocks, kv_events.sink,
                     runner.states.num_slots if runner.states is not None else 0, disk)
    max_len = _fix_context_len(config, model_config, runner, num_blocks)
    draft_blocks = draft_pool_blocks(model.config, num_blocks, groups) if draft else 0
    config = attach_image_encoder(config, source.path, model, runner,
                                  device_and_dtype(config.device)[1])
    if model_config.num_mtp_layers:
        runner.drafter = MtpRunner(runner, num_blocks, config.scheduler.max_num_seqs)
    if draft is not None:
        runner.drafter = build_draft_runner(config, draft, draft_blocks, max_len, kv_dtype,
                                            show_progress)
    scheduler = Scheduler(config.scheduler, kv, max_len,
                          make_spec(config.speculative, draft_blocks, block_size))
    backend = LLGuidanceBackend(tokenizer or (lambda: load_tokenizer(source, reader)),
                                model_config.vocab_size)
    structured = StructuredOutputManager(backend, config.structured.fast_forward,
                                         config.structured.compile_timeout_s)
    # NOTE: no structured.warm() here: the engine runs it once it is idle (EngineCore.idle),
    # not beside the first requests (their first token waited 1.1 s more for its 1.8 s of CPU)
    engine_runner = inject_faults_from_env(tp.runner(runner))  # faults: tests only
    engine = EngineCore(scheduler, engine_runner, model_config.vocab_size, config.seed,
                        structured, kv_events, config.lora.max_loras)
    engine.images = runner.images
    engine.idle_work.append(model.packs.save_when_idle)  # the packed weights cache's entry
    for name, path in config.lora.adapters:  # --lora NAME=PATH
        engine.load_lora(name, path)
    return engine


def build_rank_runner(config: EngineConfig, source: ModelSource,
                      group: TensorParallelGroup) -> ModelRunner:
    """A tensor-parallel rank > 0 (its threads already applied): its shard of the model and
    the runner over its share of the KV pool, with rank 0's block count and context length
    (the same config, the same arithmetic). No draft model: it runs on one rank only (the
    config refuses one with tensor parallel)."""
    reader = open_gguf(source.path) if source.kind == "gguf" else None
    model_config = load_model_config(source, reader)
    model, _ = _load_shard(config, source, model_config, reader, group.shard, False)
    runner, num_blocks, _ = _runner(config, model_config, model, None)
    _fix_context_len(config, model_config, runner, num_blocks)
    return runner


def _load_shard(config: EngineConfig, source: ModelSource, model_config: ModelConfig, reader,
                shard: TensorShard, show_progress: bool) -> tuple[torch.nn.Module, str]:
    """This rank's share of the model (``shard``; the whole model on one rank) and the
    quantization it was loaded with."""
    device, dtype = device_and_dtype(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but CUDA is not available")
    quantization = resolve_quantization(config.device.quantization, device, reader,
                                        checkpoint_dtype(source))
    packs = (packed_store(source.path) if quantization == "gguf" and not shard.is_split
             else REPACK)
    model = load_model(source, model_config, device, dtype, reader, show_progress,
                       quantization, shard, packs)
    model.packs = packs  # written once the engine is idle (EngineCore.idle)
    if loaded := packs.loaded():
        logger.info("%s", loaded)
    return model, quantization


def _runner(config: EngineConfig, model_config: ModelConfig, model: torch.nn.Module,
            draft: ModelConfig | None) -> tuple[ModelRunner, int, torch.dtype]:
    """The runner over this rank's KV pool, its number of blocks and their dtype: as many as
    the budget holds (beside the ``draft`` model's pool, if any)."""
    device, dtype = device_and_dtype(config.device)
    kv_dtype = resolve_kv_dtype(config.cache.kv_cache_dtype, device, dtype,
                                model_config.widest_head_dim)
    if model_config.mla is not None and kv_dtype == torch.int8:  # refused at start, not at
        # the first request (models/mla_paged.py reads its latent rows widened from 16 bits)
        raise ValueError(f"--kv-cache-dtype int8 is not supported for {model_config.architecture}"
                         " (multi-head latent attention); use auto, float16 or bfloat16")
    # model.config: this rank's shape (its KV heads); the pool is per rank, over the attention
    # layers (a hybrid model's recurrent ones hold states instead: runner/recurrent_state.py)
    groups = KVGroups.from_windows([model_config.layer_window(i)
                                    for i in model_config.attention_layers])
    slots = _state_slots(config, model.config, dtype)  # a budget of their own
    num_blocks = kv_pool_blocks(config, model_config, model.config.kv_view(), kv_dtype, groups,
                                draft)
    runner = ModelRunner(model, model.config, num_blocks, config.cache.block_size, device,
                         dtype, kv_dtype=kv_dtype, groups=groups, num_state_slots=slots)
    return runner, num_blocks, kv_dtype


def _state_slots(config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype) -> int:
    """A hybrid model's recurrent-state slots (0 for others): a live slot per running request,
    with the prefix cache a boundary copy each too and as many again for the cache's
    snapshots, within ``state_cache_memory_gb`` — by default 10% of the memory available now
    (after the weights), at least 1 GiB — and at least two slots (with fewer slots than that
    the scheduler runs fewer requests at once, and the cache keeps fewer snapshots). Separate
    from the KV budget. The pool's pages are touched only as slots are used."""
    per_slot = bytes_per_slot(model_config, dtype)
    if not per_slot:
        return 0
    seqs = config.scheduler.max_num_seqs
    wanted = seqs * (3 if config.cache.enable_prefix_caching else 1)
    if config.speculative.method != "off":  # draft states of the few streams that draft
        wanted += config.speculative.num_speculative_tokens * min(seqs, 4)
    given = config.cache.state_cache_memory_gb
    budget = given * GIB if given is not None else max(GIB, STATE_SHARE * mem_available())
    slots = max(2, min(wanted, int(budget // per_slot)))
    logger.info("recurrent states: %d slots of %.1f MiB, %.2f GiB at most (%s; %s); %d wanted "
                "for %d requests at once", slots, per_slot / 2**20, slots * per_slot / GIB,
                "live, boundary copies and prefix-cache snapshots"
                if config.cache.enable_prefix_caching else "live",
                "--state-cache-memory-gb" if given is not None else
                f"{STATE_SHARE:.0%} of the available memory", wanted, seqs)
    if slots < min(wanted, 2 * seqs):
        logger.warning("recurrent states: %d slots hold fewer than the %d requests "
                       "--max-num-seqs allows at once (with their boundary copies); raise "
                       "--state-cache-memory-gb to run more", slots, seqs)
    return slots


def _fix_context_len(config: EngineConfig, model_config: ModelConfig, runner: ModelRunner,
                     num_blocks: int) -> int:
    """``max_model_len`` (context_len.py: at most what the pool holds), fixed in the model's
    rope (rotary.py)."""
    block_size, groups = config.cache.block_size, runner.groups
    usable = num_blocks - groups.has_sliding  # NOTE: KVCacheManager.num_usable_blocks
    held = groups.max_tokens(usable, block_size, config.scheduler.max_num_batched_tokens)
    max_len = resolve_max_model_len(config.scheduler.max_model_len, model_config,
                                    held // block_size, block_size)
    runner.model.rotary.set_context_len(max_len)
    return max_len


def _kv_events(config: EngineConfig) -> KVEventsOutlet:
    """The prefix cache's events sink and their publisher (engine/kv_events.py): hashed and
    published only when ``--kv-events-config`` enables them and the prefix cache is on."""
    events = config.kv_events
    if not events.is_enabled or not config.cache.enable_prefix_caching:
        if events.is_enabled:
            logger.warning("KV events: the prefix cache is off, no events are published")
        return KVEventsOutlet()
    if "PYTHONHASHSEED" not in os.environ:
        logger.warning("KV events: PYTHONHASHSEED is not set, so block hashes start from a "
                       "random seed (as in vLLM) that no router can reproduce; set it to the "
                       "routers' value")
    return KVEventsOutlet(KVEventLog.from_env(config.cache.block_size),
                          make_publisher(events, config.device.device))


def _kv_manager(config: EngineConfig, groups: KVGroups, num_blocks: int,
                events=None, num_state_slots: int = 0, disk=None) -> KVCacheManager:
    """The scheduler's KV blocks: the pool (with a null block where sliding layers release
    theirs), the prefix cache (reporting to ``events``) or its null object, the manager over
    both; with ``num_state_slots`` (a hybrid model) the recurrent-state pool, whose
    snapshots the prefix cache keeps; with ``disk`` (kvdisk/) the tier under the cache."""
    block_size = config.cache.block_size
    pool = BlockPool(num_blocks, with_null_block=groups.has_sliding)
    caching = config.cache.enable_prefix_caching
    states = StatePool(num_state_slots) if num_state_slots else None
    snapshots = Snapshots(states, disk) if states is not None else None
    cache = (RadixCache(pool, block_size, groups, events, snapshots, disk) if caching
             else NoPrefixCache(pool))
    if states is not None:
        return KVCacheManager(pool, cache, block_size, groups,
                              RecurrentStates(states, cache, block_size, caching), disk)
    if len(groups.groups) > 1 or groups.has_sliding:
        logger.info("KV groups: %s, blocks of %d layers (%d in the pool)",
                    groups.describe(), groups.unit_layers, num_blocks)
    return KVCacheManager(pool, cache, block_size, groups, disk=disk)

"""``--speculative mtp``: the model's own multi-token-prediction block as the drafter.

The model is built with its MTP block (``ModelConfig.num_mtp_layers``) only when this method
is asked for, so a model served otherwise loads none of its weights. The block's KV layer is
sized with the pool (the KV budget holds it: one layer more per block) and its runner
(runner/mtp_runner.py) is the target runner's drafter.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from radixserve.config import EngineConfig
from radixserve.model_config import ModelConfig
from radixserve.models.mtp_source import MTP_ARCHITECTURES, mtp_layers_in

logger = logging.getLogger(__name__)


def with_mtp(config: EngineConfig, source, model_config: ModelConfig,
             reader=None) -> ModelConfig:
    """``model_config`` with its MTP block when ``--speculative mtp`` asks for it (ValueError
    when the checkpoint has none or the setup cannot run it); an INFO line when a checkpoint
    has one that another method leaves unused."""
    method = config.speculative.method
    if method != "mtp" and model_config.architecture not in MTP_ARCHITECTURES:
        return model_config
    num = mtp_layers_in(source, model_config, reader)
    if method != "mtp":
        if num:
            logger.info("this model has a multi-token-prediction block (%d layer%s): "
                        "--speculative mtp drafts with it", num, "s" if num > 1 else "")
        return model_config
    if not num:
        supported = ("this model's checkpoint holds no MTP block (a GGUF converted with "
                     "--no-mtp, or a folder without mtp.* tensors)"
                     if model_config.architecture in MTP_ARCHITECTURES else
                     f"{model_config.architecture} has no MTP block here (supported: "
                     f"{', '.join(MTP_ARCHITECTURES)})")
        raise ValueError(f"--speculative mtp: {supported}; use --speculative ngram, suffix or "
                         "auto")
    if config.parallel.tensor_parallel_size > 1:
        raise ValueError("--speculative mtp does not run with tensor parallelism yet")
    return replace(model_config, num_mtp_layers=num)


def mtp_kv_view(model_config: ModelConfig) -> ModelConfig | None:
    """The MTP block's KV as the pool's sizing sees a draft model's (None: no block)."""
    if not model_config.num_mtp_layers:
        return None
    return replace(model_config.kv_view(), num_layers=model_config.num_mtp_layers)

"""A vision model's image encoder, attached to the runner (engine/build.py calls
`attach_image_encoder`): from a folder's own vision tower or llama.cpp's mmproj GGUF
(``--mmproj``, else the one ``*mmproj*.gguf`` beside a text GGUF; models/vision/load.py).

The engine refuses images (runner/image_embeds.py `NoImages`) where there is no encoder or one
it cannot run with this engine (tensor parallel, a text model that does not take images, widths
that do not match): a WARNING
says why and the text serves; an mmproj given with ``--mmproj`` stops the start instead.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from radixserve.config import EngineConfig
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.runner.image_embeds import ImageEmbeds
from radixserve.runner.mrope_rows import MRopeRows

logger = logging.getLogger(__name__)


def attach_image_encoder(config: EngineConfig, model_path: str, model: torch.nn.Module,
                         runner, dtype: torch.dtype) -> EngineConfig:
    """Load the encoder, if the model has one, onto ``runner.images``; return ``config``
    with the scheduler told to keep images whole where the model attends within them both
    ways (Gemma 3). ValueError where the pair cannot run."""
    from radixserve.models.vision.load import find_mmproj, load_vision_encoder

    mmproj = config.mmproj
    if mmproj is None and model_path.endswith(".gguf"):
        mmproj = find_mmproj(model_path)
    try:
        encoder = load_vision_encoder(model_path, mmproj, runner.device, dtype)
        if encoder is None:
            if config.mmproj is not None:
                raise ValueError(f"{config.mmproj} holds no image encoder radixserve can run")
            return config
        return _attach(config, encoder, mmproj or model_path, model, runner)
    except ValueError as exc:
        if config.mmproj is not None:
            raise  # asked for
        # the mmproj found beside a GGUF, or the folder's own tower: the text still serves
        logger.warning("images are off: %s (%s) cannot be used: %s", mmproj or "the vision tower",
                       model_path, exc)
        return config


def _both_ways(model: torch.nn.Module) -> frozenset[int]:
    """The pool layers that attend within an image both ways: the model's
    ``images_bidirectional`` (True: all of them (Gemma 3); a tuple: those (Gemma 4's sliding
    layers, where the checkpoint says so); False or absent: none)."""
    both = getattr(model, "images_bidirectional", False)
    if both is True:
        return frozenset(range(len(model.config.attention_layers)))
    return frozenset(both or ())


def _mrope_rows(model: torch.nn.Module, max_rows: int) -> MRopeRows | None:
    """The model's mRoPE placement (Qwen VL), None where its positions are 1-D. ValueError
    where mRoPE meets a sliding window (the native attention counts a window back from the
    rope position)."""
    params = model.config.mrope
    if params is None:
        return None
    if model.config.sliding_window is not None:
        raise ValueError("images with mRoPE positions and a sliding window are not supported")
    rotaries = [m for m in model.modules() if isinstance(m, RotaryEmbedding)]
    if not rotaries:
        raise ValueError(f"{type(model).__name__} has mRoPE sections but no rotary tables")
    return MRopeRows(params, rotaries, max_rows)


def _attach(config: EngineConfig, encoder, where: str, model: torch.nn.Module,
            runner) -> EngineConfig:
    name = type(model).__name__
    if not getattr(model, "takes_images", False):
        raise ValueError(f"{name} does not take images yet; the image encoder ({where}) "
                         "cannot be used with it")
    deepstack = getattr(encoder, "deepstack_layers", 0)
    if deepstack and (not getattr(model, "takes_deepstack", False)
                      or deepstack > model.config.num_layers):
        raise ValueError(f"the image encoder ({where}) adds rows to {deepstack} decoder layers' "
                         f"outputs (deepstack), which {name} does not take")
    if config.parallel.tensor_parallel_size > 1:
        raise ValueError("images are not supported with --tensor-parallel-size > 1 yet")
    width = encoder.hidden_size
    if width != model.config.hidden_size:
        raise ValueError(f"the image encoder gives rows of {width}; {name}'s hidden size is "
                         f"{model.config.hidden_size}: the mmproj file is another model's")
    bidirectional = _both_ways(model)
    budget = config.scheduler.max_num_batched_tokens
    rope = _mrope_rows(model, budget)
    runner.images = ImageEmbeds(encoder, runner.device, bidirectional, budget, rope=rope)
    logger.info("images: encoder output cached by image (%d MiB)%s%s",
                runner.images.cache_bytes >> 20,
                "; image tokens attend to their whole image" if bidirectional else "",
                "; image rows placed by mRoPE" if rope is not None else "")
    if not bidirectional:
        return config
    return replace(config, scheduler=replace(config.scheduler, whole_images=True))

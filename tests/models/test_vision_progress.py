"""A vision encoder reports progress after each of its blocks (layers/layer_progress.py), so a
long encode (a 32-block ViT over 4,096 patches takes ~25 s on two cores) is not taken for a
hung engine by the API process's stall watch."""

from __future__ import annotations

import torch
from tiny_gemma3_mmproj import make_gemma3_vision_hf
from tiny_qwen25_vl import make_qwen25_vl_hf

from radixserve.layers import layer_progress
from radixserve.models.vision import load_vision_encoder

CPU = torch.device("cpu")


def beats_while(encode) -> int:
    beats = []
    layer_progress.install(lambda: beats.append(1))
    try:
        encode()
    finally:
        layer_progress.install(None)
    return len(beats)


def test_every_block_is_a_beat(tmp_path):
    qwen = load_vision_encoder(str(make_qwen25_vl_hf(tmp_path / "q")), None, CPU, torch.float32)
    pixels = torch.rand(1, 1, 4, 6, qwen.config.patch_dim)
    assert beats_while(lambda: qwen(pixels)) == qwen.config.num_layers
    gemma = load_vision_encoder(str(make_gemma3_vision_hf(tmp_path / "g")), None, CPU,
                                torch.float32)
    assert beats_while(lambda: gemma(torch.rand(1, *gemma.image_shape))) == \
        gemma.tower.config.num_layers

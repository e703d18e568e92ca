"""mRoPE positions of a step's rows (runner/mrope_rows.py) = transformers' (Qwen2.5-VL's
sectioned and Qwen3.5's interleaved rope), in every chunking and packed beside other rows.

transformers places a prompt's rows with ``get_rope_index`` and turns each frequency by its
stream's position; the engine shifts text rows past images (core/images.py `rope_shift`) and
composes image rows' cos/sin into the rotary's spare rows. Each text row must sit at
transformers' position and every row turn by the same cos/sin.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from radixserve.core.images import overlapping, rope_shift
from radixserve.core.sched_output import ScheduledSeq
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.messages import ImageInput
from radixserve.model_config import MRopeParams
from radixserve.runner.mrope_rows import MRopeRows, frequency_streams

MERGE = 2
# (text tokens before, patch grid (t, H, W)) of each image; then text after and decode tokens
LAYOUT = [(5, (1, 4, 6)), (4, (1, 8, 4)), (1, (1, 2, 2))]
TAIL, DECODE = 3, 4


def _prompt():
    """(token types (1: image), ImageInputs with token grids, patch grids)."""
    types, images, grids = [], [], []
    for text, (t, h, w) in LAYOUT:
        types += [0] * text
        grid = [t, h // MERGE, w // MERGE]
        length = t * grid[1] * grid[2]
        images.append(ImageInput(offset=len(types), length=length, key=bytes(32), pixels=b"",
                                 shape=[], grid=grid))
        types += [1] * length
        grids.append((t, h, w))
    types += [0] * (TAIL + DECODE)
    return types, images, grids


def _transformers_cos(family: str, types, grids):
    """transformers' cos/sin per row [L, rotary_dim] and the rotary's shape."""
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLTextConfig
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m
        config = Qwen2_5_VLTextConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                                      rope_parameters={"rope_type": "default",
                                                       "rope_theta": 10000.0,
                                                       "mrope_section": [2, 3, 3]})
        rotary, model_cls, dim = m.Qwen2_5_VLRotaryEmbedding(config), m.Qwen2_5_VLModel, 16
        params = MRopeParams((2, 3, 3), interleaved=False)
    else:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
        config = Qwen3_5TextConfig(hidden_size=64, num_attention_heads=2, head_dim=64,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                    "partial_rotary_factor": 0.25,
                                                    "mrope_section": [3, 3, 2]})
        rotary, model_cls, dim = m.Qwen3_5TextRotaryEmbedding(config), m.Qwen3_5Model, 16
        params = MRopeParams((3, 3, 2), interleaved=True)
    fake = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(
        spatial_merge_size=MERGE, tokens_per_second=2)))
    fake.get_vision_position_ids = functools.partial(model_cls.get_vision_position_ids, fake)
    ids = torch.zeros(1, len(types), dtype=torch.long)
    position_ids, _ = model_cls.get_rope_index(
        fake, ids, torch.tensor([types]), image_grid_thw=torch.tensor(grids))
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), position_ids)
    return (cos[0], sin[0], dim, config.rope_parameters["rope_theta"], params,
            position_ids[0, 0].numpy())


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"])
@pytest.mark.parametrize("chunk", [64, 7, 3, 1])
def test_rows_turn_as_transformers(family, chunk):
    types, images, grids = _prompt()
    want_cos, want_sin, dim, theta, params, want_pos = _transformers_cos(family, types, grids)
    rotary = RotaryEmbedding(dim, 512, theta, None)
    rotary.set_context_len(128)
    rows = MRopeRows(params, [rotary], max_rows=64)
    num_prompt = len(types) - DECODE
    other = ScheduledSeq("text", [1, 2, 3], 10, [], False)  # packed before: untouched
    start = 0
    while start < len(types):
        end = min(start + chunk, len(types)) if start < num_prompt else start + 1
        seq = ScheduledSeq("vl", [0] * (end - start), start, [], False)
        if start < num_prompt:
            seq.images = overlapping(images, start, end)
        seq.rope_shift = rope_shift(images, start)
        positions = np.concatenate((np.arange(10, 13), np.arange(start, end)))
        out = rows.positions([other, seq], positions)
        assert out[:3].tolist() == [10, 11, 12]
        got = out[3:]
        # (cos/sin of one angle may differ in the last bit between torch's vector and scalar
        # loops; a wrong position or stream differs by far more, sin's low frequencies too)
        torch.testing.assert_close(rotary.cos[got], want_cos[start:end], atol=1e-6, rtol=0)
        torch.testing.assert_close(rotary.sin[got], want_sin[start:end], atol=1e-6, rtol=0)
        text = np.asarray(types[start:end]) == 0
        assert (got[text] == want_pos[start:end][text]).all()
        start = end


def test_text_only_steps_keep_their_positions():
    rotary = RotaryEmbedding(16, 512, 10000.0, None)
    rows = MRopeRows(MRopeParams((2, 3, 3)), [rotary], max_rows=8)
    positions = np.arange(4, 9)
    assert rows.positions([ScheduledSeq("t", [1] * 5, 4, [], False)], positions) is positions


def test_sections_must_cover_the_frequencies():
    with pytest.raises(ValueError, match="do not cover"):
        frequency_streams(MRopeParams((2, 3, 2)), 8)
    assert frequency_streams(MRopeParams((3, 3, 2), interleaved=True), 8).tolist() == \
        [0, 1, 2, 0, 1, 2, 0, 1]
    assert frequency_streams(MRopeParams((2, 3, 3)), 8).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]

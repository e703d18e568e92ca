"""A step's image rows (runner/image_embeds.py `ImageSplice`): the input rows replaced, and
Qwen3-VL's deepstack blocks added to the first layers' outputs, the other rows untouched."""

from __future__ import annotations

import torch

from radixserve.runner.image_embeds import ImageSplice


def test_input_rows_then_one_block_per_deepstack_layer():
    hidden, rows = 4, torch.tensor([1, 3])
    embeds = torch.arange(2 * hidden * 3, dtype=torch.float32).view(2, hidden * 3)
    splice = ImageSplice(rows, embeds, deepstack=2)
    x = splice.apply(torch.zeros(5, hidden))
    assert torch.equal(x[rows], embeds[:, :hidden]) and not x[[0, 2, 4]].any()
    out = torch.ones(5, hidden)
    splice.after_layer(0, out)
    assert torch.equal(out[rows], 1 + embeds[:, hidden:2 * hidden])
    splice.after_layer(1, out)
    assert torch.equal(out[rows], 1 + embeds[:, hidden:2 * hidden] + embeds[:, 2 * hidden:])
    splice.after_layer(2, out)  # past the last deepstack layer: nothing
    assert torch.equal(out[rows], 1 + embeds[:, hidden:2 * hidden] + embeds[:, 2 * hidden:])
    assert torch.equal(out[[0, 2, 4]], torch.ones(3, hidden))

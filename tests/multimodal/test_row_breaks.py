"""Images whose grid rows end with a break token (Pixtral: Mistral 3): the prompt's runs of
image tokens join into one span per image (multimodal/prompt.py), and the engine splices the
encoder's rows over the image tokens only, in grid order, from any chunk of the span
(runner/image_embeds.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from radixserve.multimodal.processor import ImageTiles, ProcessedImage
from radixserve.multimodal.prompt import place_images
from radixserve.runner.image_embeds import _image_rows

IMG, BREAK, END = 7, 8, 9
WORDS = {"[IMG]": IMG, "[IMG_BREAK]": BREAK, "[IMG_END]": END}


class Rows:
    """A processor writing a (rows x cols) grid of [IMG], a break after each row."""

    name, placeholder, image_token_id = "rows", "<image>", IMG

    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols

    def process_tiles(self, image, detail=None) -> ImageTiles:
        p = ProcessedImage.of(self.name, np.zeros((3, 2, 2)), self.rows * self.cols,
                              (1, self.rows, self.cols), row_breaks=True)
        line = "[IMG]" * self.cols
        return ImageTiles((p,), "[IMG_BREAK]".join([line] * self.rows) + "[IMG_END]")


def encode(text: str) -> list[int]:
    ids, i = [], 0
    while i < len(text):
        word = next((w for w in WORDS if text.startswith(w, i)), None)
        ids.append(WORDS[word] if word else 1)
        i += len(word) if word else 1
    return ids


def test_one_span_per_image_with_its_breaks():
    image = Image.new("RGB", (4, 4))
    _, ids, (a, b) = place_images("ab<image>c<image>", [image, image], [None, None],
                                  Rows(2, 3), encode)
    assert (a.offset, a.length, a.grid, a.row_breaks) == (2, 8, [1, 2, 3], True)
    assert ids[a.offset:a.offset + a.length] == [IMG] * 3 + [BREAK] + [IMG] * 3 + [END]
    assert (b.offset, b.length) == (11, 8)


def test_a_row_of_another_width_is_refused():
    bad = Rows(2, 3)
    bad.process_tiles = lambda image, detail=None: ImageTiles(
        (ProcessedImage.of("rows", np.zeros((3, 2, 2)), 6, (1, 2, 3), row_breaks=True),),
        "[IMG][IMG][IMG][IMG_BREAK][IMG][IMG][IMG_END]")
    with pytest.raises(ValueError, match="runs of image tokens"):
        place_images("<image>", [Image.new("RGB", (4, 4))], [None], bad, encode)


@pytest.mark.parametrize("lo,hi", [(10, 18), (10, 13), (13, 16), (14, 18)])
def test_encoder_rows_skip_the_breaks_from_any_chunk(lo, hi):
    class Span:
        offset, length, grid, row_breaks = 10, 8, [1, 2, 3], True

    span, rows = _image_rows(Span, lo, hi)
    every = {10: 0, 11: 1, 12: 2, 14: 3, 15: 4, 16: 5}  # 13 and 17 are breaks
    assert dict(zip(span.tolist(), rows.tolist())) == {p: r for p, r in every.items()
                                                      if lo <= p < hi}

"""mRoPE positions (Qwen2-VL and later) for a step's rows: text shifted past images, image rows
placed on their grid.

A model with mRoPE gives each token three positions (time, height, width) and turns each rotary
frequency by one of them (model_config.py `MRopeParams`). A text token's three are equal: its
index plus the shift the images before it leave (core/images.py `rope_shift`), plain rope at
that position. An image row ``k`` of a ``[t, h, w]`` grid placed from ``base`` (the position
the image starts at) has ``(base + k // (h*w), base + k // w % h, base + k % w)``: its cos/sin
rows are composed from the tables (``sel``: which position each frequency takes) and written to
the rotary's spare rows (layers/rotary.py `write_rows`), and the row's position names its spare
row. The KV slots and the attention's causal limits keep the rows' indices (the metadata is
built before this); only the rope sees these positions.
"""

from __future__ import annotations

import numpy as np
import torch

from radixserve.core.images import rope_advance
from radixserve.core.sched_output import ScheduledSeq
from radixserve.model_config import MRopeParams


def frequency_streams(params: MRopeParams, half: int) -> np.ndarray:
    """Which of (t, h, w) each of the ``half`` rotary frequencies turns by: in order
    (sections of t, then h, then w), or interleaved (t h w t h w .. while each section lasts,
    t after: Qwen3-VL's `apply_interleaved_mrope`). ValueError where the sections do not
    cover the ``half`` frequencies."""
    sections = tuple(params.sections) + (0,) * (3 - len(params.sections))
    if len(sections) != 3 or sum(sections) != half:
        raise ValueError(f"mRoPE sections {list(params.sections)} do not cover the "
                         f"{half} rotary frequencies")
    if not params.interleaved:
        return np.repeat(np.arange(3), sections)
    sel = np.zeros(half, np.int64)
    for stream in (1, 2):
        sel[stream:3 * sections[stream]:3] = stream
    return sel


def image_positions(grid: list[int], base: int) -> np.ndarray:
    """[3, t*h*w] (time, height, width) positions of an image's rows placed from ``base``."""
    t, h, w = grid
    k = np.arange(t * h * w)
    return base + np.stack((k // (h * w), k // w % h, k % w))


class MRopeRows:
    """The mRoPE positions of a model's ``rotaries`` (its RotaryEmbedding modules), with
    ``max_rows`` image rows a step at most (the step's token budget)."""

    def __init__(self, params: MRopeParams, rotaries: list, max_rows: int) -> None:
        self.rotaries = rotaries
        self._streams = []
        for rotary in rotaries:
            half = rotary.rotary_dim // 2
            sel = frequency_streams(params, half)
            self._streams.append(torch.from_numpy(np.concatenate((sel, sel))))
            rotary.reserve_rows(max_rows)

    def positions(self, seqs: list[ScheduledSeq], positions: np.ndarray) -> np.ndarray:
        """The rope positions of the packed rows of ``seqs`` whose indices are
        ``positions``: shifted text rows, image rows naming their composed spare rows."""
        if not any(s.rope_shift or s.images for s in seqs):
            return positions
        out = positions.copy()
        image_rows, image_pos = [], []
        base = 0
        for seq in seqs:
            if seq.rope_shift or seq.images:
                self._place(seq, out[base:base + seq.num_tokens], base, image_rows, image_pos)
            base += seq.num_tokens
        if image_rows:
            rows = np.concatenate(image_rows)
            first = self._compose(np.concatenate(image_pos, axis=1))
            out[rows] = first + np.arange(len(rows))
        return out

    def _place(self, seq: ScheduledSeq, rows: np.ndarray, base: int, image_rows: list,
               image_pos: list) -> None:
        """Shift ``rows`` (the seq's, a view) past its images; collect its image rows (packed
        indices) and their [3, n] positions."""
        start, end = seq.start_pos, seq.start_pos + seq.num_tokens
        shift, cursor = seq.rope_shift, start
        for image in seq.images:  # prompt order; each overlaps this chunk
            lo, hi = image.offset, image.offset + image.length
            rows[cursor - start:max(lo, cursor) - start] += shift  # text before it
            a, b = max(lo, start), min(hi, end)
            image_rows.append(np.arange(a, b) - start + base)
            image_pos.append(image_positions(image.grid, lo + shift)[:, a - lo:b - lo])
            shift += rope_advance(image) - image.length
            cursor = max(cursor, min(hi, end))
        rows[cursor - start:] += shift

    def _compose(self, pos: np.ndarray) -> int:
        """Write the cos/sin of rows at ``pos`` ([3, n]) to every rotary's spare rows; the
        first spare row's index."""
        index = torch.from_numpy(np.ascontiguousarray(pos))
        first = None
        for rotary, streams in zip(self.rotaries, self._streams):
            # row r, column c: the table's row pos[streams[c], r] at column c
            rows = index[streams].T.to(rotary.cos.device)
            first = rotary.write_rows(torch.gather(rotary.cos, 0, rows),
                                      torch.gather(rotary.sin, 0, rows))
        return first

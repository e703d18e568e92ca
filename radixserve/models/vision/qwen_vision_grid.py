"""What a Qwen2.5-VL image's patch grid fixes, computed once per input shape: the rotary angles
of its patches, their window order, and the groups its attention runs over.

Rows arrive in transformers' ``pixel_values`` order: frame, then each ``merge x merge`` block
of patches (a merged token) row-major, the block's patches row-major inside it. Windows are
squares of ``window_tokens`` merged tokens a side, row-major over the frame, those at the right
and bottom edges cut short (transformers' ``get_vision_window_index``)::

    token grid 5 x 3, windows of 2:   [0 0 1 1 2]   window 0: tokens (0,0) (0,1) (1,0) (1,1)
                                      [0 0 1 1 2]   window 2: tokens (0,4) (1,4)
                                      [3 3 4 4 5]   window 3: tokens (2,0) (2,1)

The encoder runs its blocks on rows in window order (each window's tokens consecutive, each
token's ``merge²`` patches consecutive) and puts the merged tokens back in token order.
"""

from __future__ import annotations

import torch


class Groups:
    """A partition of a sequence of ``S`` rows into consecutive groups that attend within
    themselves (windows, or frames). Equal lengths reshape; unequal ones are padded to the
    longest, the padding masked out as keys (its query rows are computed and dropped)."""

    def __init__(self, lengths: list[int], device: torch.device) -> None:
        self.lengths = list(lengths)
        self.num_groups, self.longest = len(lengths), max(lengths)
        self.is_even = len(set(lengths)) == 1
        self.seq_len = sum(lengths)
        if self.is_even:
            self._index = self._keep = self._mask = None
            return
        starts = torch.tensor([0, *lengths[:-1]]).cumsum(0)
        offsets = torch.arange(self.longest)
        valid = offsets[None, :] < torch.tensor(lengths)[:, None]  # [G, L]
        index = (starts[:, None] + offsets[None, :]).clamp(max=self.seq_len - 1)
        self._index = index.reshape(-1).to(device)  # padded slot → source row
        self._keep = valid.reshape(-1).nonzero()[:, 0].to(device)  # row → its padded slot
        self._mask = valid[:, None, None, :].to(device)  # [G, 1, 1, L]: keys that exist

    def split(self, t: torch.Tensor) -> torch.Tensor:
        """[n, S, ...] → [n * G, L, ...]."""
        n, rest = t.shape[0], t.shape[2:]
        if not self.is_even:
            t = t[:, self._index]
        return t.reshape(n * self.num_groups, self.longest, *rest)

    def mask(self, n: int) -> torch.Tensor | None:
        """The keys mask for ``n`` images' groups ([n * G, 1, 1, L]), None when none is padded."""
        return None if self._mask is None else self._mask.repeat(n, 1, 1, 1)

    def join(self, t: torch.Tensor, n: int) -> torch.Tensor:
        """[n * G, L, ...] → [n, S, ...] (`split`'s inverse on the rows that exist)."""
        t = t.reshape(n, self.num_groups * self.longest, *t.shape[2:])
        return t if self.is_even else t[:, self._keep]


class VisionGrid:
    """The fixed tensors of one input shape ``[gt, gh, gw, D]`` (module docstring):
    ``order`` (window-ordered patch rows, an index into the input rows), ``cos`` / ``sin``
    ([S, 1, head_dim], in window order), ``windows`` / ``frames`` (`Groups`), and
    ``token_restore`` (the merged tokens, window order → token order)."""

    Groups = Groups

    def __init__(self, shape: tuple[int, ...], cfg, inv_freq: torch.Tensor,
                 device: torch.device) -> None:
        frames, height, width = shape[:3]
        m, side = cfg.merge_size, cfg.window_tokens
        rows, cols = height // m, width // m  # the merged token grid of a frame
        self.num_patches, self.num_tokens = frames * height * width, frames * rows * cols
        tokens, lengths = [], []
        for t in range(frames):
            for y in range(0, rows, side):
                for x in range(0, cols, side):
                    ys = torch.arange(y, min(y + side, rows))
                    xs = torch.arange(x, min(x + side, cols))
                    tokens.append((t * rows * cols + ys[:, None] * cols + xs[None, :]).reshape(-1))
                    lengths.append(len(ys) * len(xs) * m * m)
        window_tokens = torch.cat(tokens)
        self.token_restore = torch.argsort(window_tokens).to(device)
        self.order = (window_tokens[:, None] * m * m + torch.arange(m * m)).reshape(-1)
        self.windows = Groups(lengths, device)
        self.frames = Groups([height * width] * frames, device)
        angles = self._angles(frames, height, width, m, inv_freq.cpu())[self.order]
        self.cos = angles.cos()[:, None, :].to(device)
        self.sin = angles.sin()[:, None, :].to(device)
        self.order = self.order.to(device)

    @staticmethod
    def _angles(frames: int, height: int, width: int, m: int,
                inv_freq: torch.Tensor) -> torch.Tensor:
        """[S, head_dim] rotary angles of the input rows: (row, column) of each patch, in the
        input's block order, times the frequencies: [h f, w f, h f, w f]."""
        hpos, wpos = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        blocks = (height // m, m, width // m, m)
        hpos = hpos.reshape(blocks).transpose(1, 2).reshape(-1).repeat(frames)
        wpos = wpos.reshape(blocks).transpose(1, 2).reshape(-1).repeat(frames)
        half = torch.cat([hpos[:, None].float() * inv_freq, wpos[:, None].float() * inv_freq],
                         dim=-1)
        return torch.cat([half, half], dim=-1)

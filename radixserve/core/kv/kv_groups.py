"""KV cache groups: the layers that share one block table per request.

A model whose layers all attend the same way has ONE group (Llama, Qwen: full attention;
Mistral: every layer windowed) and everything is as it always was: one table per request, one
pool block per page of ``block_size`` tokens across every layer. A hybrid model (Gemma 2/3:
sliding layers beside global ones) has a group per kind of attention: the full-attention
layers first, then the sliding ones (grouped by window). A sliding group releases the pages
that fell out of its window (their table slots then hold the pool's reserved null block), so
a long sequence holds about ``window / block_size`` pages there instead of all of them.

Memory: ONE shared pool of equal-size units, as vLLM's hybrid manager does, rather than a pool
per group sized from the budget. A unit is one page (``block_size`` tokens) of
``unit_layers = gcd(layers per group)`` layers; a group of ``n`` layers spends
``n / unit_layers`` units per page (its ``units_per_page``), and the pool's per-layer tensors
are ``unit_layers`` "slots" that the groups' layers alias (layer j of a group reads slot
``j % unit_layers`` with unit column ``j // unit_layers`` of its table). Why shared: the split
between groups follows the workload by itself — short sequences (inside the window) need as
many sliding pages as full ones, long ones ~window's worth — where a fixed split per group
either wastes the sliding pool on long-context work or starves short-context work (a split
sized for 32k-token sequences runs ten times fewer 500-token ones than no split at all). A
request never needs more units than before (its sliding pages are a subset of its full ones),
so nothing fits less than it did. Gemma 3 (15 sliding : 3 global layers in the 270M) gets
units of 3 layers: 1 per page in the global group, 5 in the sliding one.

Table layout: a group's table is flat, ``units_per_page`` unit ids per page, page-major
(``table[page * m + column]``); every group's table has the same number of pages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVGroup:
    """``layers``: model layer indices (ascending); ``window``: keys a query at p attends to
    (p - window < j <= p), None for full attention; ``units_per_page``: pool units per page."""

    layers: tuple[int, ...]
    window: int | None
    units_per_page: int

    @property
    def is_sliding(self) -> bool:
        return self.window is not None

    def first_needed_page(self, pos: int, block_size: int) -> int:
        """The first page a query at position ``pos`` (or later) still reads; every earlier
        page can be released. 0 for a full-attention group.

            keys read by a query at pos: pos - window + 1 ... pos
            pages:   [ released ... | first_needed_page ... page of pos ]
        """
        if self.window is None:
            return 0
        return max(0, pos - self.window + 1) // block_size


@dataclass(frozen=True, slots=True)
class KVGroups:
    groups: tuple[KVGroup, ...]
    unit_layers: int  # layers per pool unit (= pool tensor slots)

    @classmethod
    def from_windows(cls, windows: list[int | None]) -> KVGroups:
        """Groups for layers with these windows (None: full attention): full first, then by
        window."""
        by_window: dict[int | None, list[int]] = {}
        for i, w in enumerate(windows):
            by_window.setdefault(w, []).append(i)
        keys = sorted(by_window, key=lambda w: (w is not None, w or 0))
        unit = math.gcd(*(len(by_window[w]) for w in keys))
        return cls(tuple(KVGroup(tuple(by_window[w]), w, len(by_window[w]) // unit)
                         for w in keys), unit)

    @classmethod
    def single(cls, num_layers: int) -> KVGroups:
        """One full-attention group over every layer (no release: today's pool)."""
        return cls((KVGroup(tuple(range(num_layers)), None, 1),), num_layers)

    @property
    def num_layers(self) -> int:
        return sum(len(g.layers) for g in self.groups)

    @property
    def has_sliding(self) -> bool:
        return any(g.is_sliding for g in self.groups)

    @property
    def units_per_page(self) -> int:
        """Units one page of every group costs (a page before anything is released)."""
        return sum(g.units_per_page for g in self.groups)

    def layer_slots(self) -> list[tuple[int, int, int]]:
        """Per model layer: ``(group, unit column, pool slot)``."""
        out: list[tuple[int, int, int]] = [(0, 0, 0)] * self.num_layers
        for g, group in enumerate(self.groups):
            for j, layer in enumerate(group.layers):
                out[layer] = (g, j // self.unit_layers, j % self.unit_layers)
        return out

    def units_held(self, num_tokens: int, block_size: int, max_chunk: int) -> int:
        """The most units one sequence of ``num_tokens`` holds at once, fed at most
        ``max_chunk`` tokens a step (a sliding group's pages from the window before the
        step's first query to its last token)."""
        pages = -(-num_tokens // block_size)
        total = 0
        for g in self.groups:
            held = pages
            if g.is_sliding:
                held = min(pages, -(-(g.window - 1 + max_chunk) // block_size) + 1)
            total += held * g.units_per_page
        return total

    def max_tokens(self, num_units: int, block_size: int, max_chunk: int) -> int:
        """The longest sequence (whole pages) whose ``units_held`` fit in ``num_units``; for
        a model with only sliding layers, any length (2**40) once a window's worth fits."""
        if all(g.is_sliding for g in self.groups):
            if self.units_held(1 << 40, block_size, max_chunk) <= num_units:
                return 1 << 40
        lo, hi = 0, num_units  # pages: each costs a full group at least one unit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.units_held(mid * block_size, block_size, max_chunk) <= num_units:
                lo = mid
            else:
                hi = mid - 1
        return lo * block_size

    def describe(self) -> str:
        """E.g. ``3 full-attention layers (1 block a page), 15 sliding (window 512) layers
        (5 blocks a page)``."""
        return ", ".join(
            f"{len(g.layers)} " + ("full-attention" if g.window is None
                                   else f"sliding (window {g.window})")
            + f" layers ({g.units_per_page} block{'s' * (g.units_per_page > 1)} a page)"
            for g in self.groups)

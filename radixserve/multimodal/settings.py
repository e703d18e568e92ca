"""Reading a Hugging Face folder's image processor settings (API process; torch-free)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["longest_edge", "preprocessor_settings", "triple"]


def preprocessor_settings(folder: Path) -> dict[str, Any]:
    """The image processor's settings: preprocessor_config.json (the releases), else the
    ``image_processor`` of processor_config.json (what transformers 5 saves), else {}."""
    path = folder / "preprocessor_config.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    path = folder / "processor_config.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8")).get("image_processor", {})
    return {}


def triple(values: Any, key: str) -> tuple[float, float, float]:
    """An image_mean / image_std: one number or three; ValueError otherwise."""
    if isinstance(values, int | float) and not isinstance(values, bool):
        return (float(values),) * 3
    if (isinstance(values, list | tuple) and len(values) == 3
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)):
        return tuple(float(v) for v in values)
    raise ValueError(f"{key} must be one number or three, got {values!r}")


def longest_edge(size: Any, key: str) -> int:
    """A ``{"longest_edge": n}`` size's n (a positive integer); ValueError otherwise."""
    edge = size.get("longest_edge") if isinstance(size, dict) else None
    if not isinstance(edge, int) or isinstance(edge, bool) or edge <= 0:
        raise ValueError(f"{key} must be {{longest_edge: positive integer}}, got {size!r}")
    return edge

"""Where a GGUF model's image encoder is: llama.cpp's ``*mmproj*.gguf`` beside it (torch-free:
the API process and the engine find the same file)."""

from __future__ import annotations

import glob
import logging
import os

logger = logging.getLogger(__name__)


def find_mmproj(model_path: str) -> str | None:
    """The ``*mmproj*.gguf`` beside a GGUF model file when there is exactly one (the model file
    itself never counts), else None (also for a folder model: its config.json says whether it
    has a vision tower). Several candidates are logged, not guessed between."""
    if os.path.isdir(model_path) or not model_path.lower().endswith(".gguf"):
        return None
    # the folder the path names (a hub cache's file is a link into its blobs), the file itself
    # by its target
    folder, model = os.path.dirname(os.path.abspath(model_path)), os.path.realpath(model_path)
    found = sorted(p for p in glob.glob(os.path.join(glob.escape(folder), "*.gguf"))
                   if "mmproj" in os.path.basename(p).lower() and os.path.realpath(p) != model)
    if len(found) > 1:
        logger.warning("several mmproj files beside %s (%s): none used; pick one with --mmproj",
                       model_path, ", ".join(os.path.basename(p) for p in found))
    return found[0] if len(found) == 1 else None

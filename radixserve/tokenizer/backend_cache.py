"""The tokenizer built from a GGUF file's metadata, cached on disk by what it is built from.

Building a ``tokenizers`` backend from a 262k SentencePiece vocabulary (Gemma 3) takes seconds:
its merges are rebuilt from the vocabulary (``gguf_vocab.spm_merges``). Its serialized form
loads in a third of the time. The key is a hash of the file's raw ``tokenizer.*`` metadata
bytes, the architecture, the code that builds the backend (``gguf_vocab.py``,
``gguf_pre_tokenizers.py``) and the ``tokenizers`` version: any change to one is a new entry,
never a stale one. Nothing is downloaded; a cache that cannot be read or written (a read-only
home) is only slower.

The folder: ``$RADIXSERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/radixserve``, else
``~/.cache/radixserve``; entries in its ``tokenizers/``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Tokenizer as HFTokenizer

logger = logging.getLogger(__name__)

__all__ = ["cache_dir", "cached_backend", "metadata_key"]

_BUILDERS = ("gguf_vocab.py", "gguf_pre_tokenizers.py")


def cache_dir() -> Path:
    root = os.environ.get("RADIXSERVE_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "radixserve"


def metadata_key(reader, architecture: str) -> str:
    """A hash of the reader's ``tokenizer.*`` fields as the file stores them (bytes, not
    parsed values), with everything else the backend depends on."""
    key = hashlib.sha256()
    here = Path(__file__).parent
    for name in _BUILDERS:
        key.update((here / name).read_bytes())
    key.update(tokenizers.__version__.encode())
    key.update(architecture.encode())
    data = memoryview(reader.data)
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            key.update(data[field.offset:field.offset + _field_bytes(field, reader.data)])
    return key.hexdigest()


def _field_bytes(field, data: np.ndarray) -> int:
    """The bytes a reader field spans in the file ``data``: a string array of `open_gguf`'s
    knows it (its parts are cut only if asked for); another field ends where its last part,
    a view of ``data``, ends (150k token types are 150k parts: their sum took 50 ms)."""
    size = getattr(field, "nbytes", None)
    if size is not None:
        return size
    last, base = field.parts[-1], data.ctypes.data
    end = last.ctypes.data + last.nbytes - base
    if last.base is None or not field.offset < end <= data.nbytes:  # not a view of data
        return sum(int(part.nbytes) for part in field.parts)
    return end - field.offset


def cached_backend(reader, architecture: str, build: Callable[[], HFTokenizer]) -> HFTokenizer:
    """The cached backend for this file's tokenizer metadata, or ``build()``'s, then cached."""
    try:
        path = cache_dir() / "tokenizers" / f"{metadata_key(reader, architecture)}.json"
    except (OSError, AttributeError, TypeError):  # a reader without raw bytes: no cache
        return build()
    try:
        return HFTokenizer.from_str(path.read_text())
    except FileNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - a damaged entry: build it again
        logger.warning("tokenizer cache entry %s unreadable (%s); rebuilding it", path, exc)
    backend = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(backend.to_str())
        os.replace(tmp, path)
    except OSError as exc:
        logger.debug("tokenizer cache not written (%s)", exc)
    return backend

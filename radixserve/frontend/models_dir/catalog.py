"""The models of a ``--models-dir`` folder: GGUF files and Hugging Face safetensors folders,
listed by name (a file's name without ``.gguf``, a folder's name). Re-read on every listing (a
``listdir`` and a few ``stat`` calls), so models copied in later appear without a restart."""

from __future__ import annotations

import os
from dataclasses import dataclass

_GGUF_MAGIC = b"GGUF"


class NotAModel(ValueError):
    """A catalog entry whose files are not a model this server can load (answered 400)."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    path: str  # the .gguf file or the model folder
    kind: str  # "gguf" | "hf"
    size_bytes: int  # the weights' files, summed

    def check(self) -> None:
        """Raise `NotAModel` (naming the file and what is wrong) unless the files look like a
        model: a GGUF file starts with the magic ``GGUF``; a folder holds ``config.json`` and
        ``*.safetensors``. Cheap: reads four bytes. Mutates nothing."""
        if self.kind == "gguf":
            try:
                with open(self.path, "rb") as f:
                    magic = f.read(4)
            except OSError as exc:
                raise NotAModel(f"model '{self.name}': cannot read {self.path}: {exc}") from None
            if magic != _GGUF_MAGIC:
                raise NotAModel(f"model '{self.name}': {self.path} is not a GGUF file (it "
                                f"starts with {magic!r}, not {_GGUF_MAGIC!r})")
            return
        names = _listdir(self.path)
        if "config.json" not in names:
            raise NotAModel(f"model '{self.name}': {self.path} has no config.json")
        if not any(n.endswith(".safetensors") for n in names):
            raise NotAModel(f"model '{self.name}': {self.path} holds no *.safetensors files")


class Catalog:
    """The models in ``folder``. ``entries()`` re-reads the folder; ``find(name)`` also
    accepts ``name:tag`` (Ollama's ``name:latest``; ``base:adapter``) for ``name``."""

    def __init__(self, folder: str) -> None:
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"--models-dir {folder}: no such folder")
        self.folder = folder

    def entries(self) -> dict[str, ModelEntry]:
        """name -> entry, sorted by name: every ``*.gguf`` file (but llama.cpp's image
        encoders, ``*mmproj*.gguf``: a model beside one takes images) and every sub-folder
        holding a ``config.json`` (a folder without ``*.safetensors`` is listed too: loading
        it answers 400 saying what is missing)."""
        found: dict[str, ModelEntry] = {}
        for name in sorted(_listdir(self.folder)):
            path = os.path.join(self.folder, name)
            if name.endswith(".gguf") and os.path.isfile(path) and not _is_mmproj(name):
                found[name.removesuffix(".gguf")] = ModelEntry(
                    name.removesuffix(".gguf"), path, "gguf", os.path.getsize(path))
            elif os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
                size = sum(os.path.getsize(os.path.join(path, f)) for f in _listdir(path)
                           if f.endswith(".safetensors"))
                found[name] = ModelEntry(name, path, "hf", size)
        return found

    def find(self, name: str) -> ModelEntry | None:
        """Also a model pulled from the hub, ``hf.co/OWNER/REPO[:QUANT]``: from the cache only
        (``radixserve pull`` fetches it; a request never downloads)."""
        entries = self.entries()
        return entries.get(name) or entries.get(name.partition(":")[0]) or _pulled(name)


def _is_mmproj(name: str) -> bool:
    return "mmproj" in name.lower()


def _pulled(name: str) -> ModelEntry | None:
    from radixserve.hub import HubError, is_hub_ref, parse_hub_ref

    if not is_hub_ref(name):
        return None
    from radixserve.hub.cache import find_pulled  # huggingface_hub: only for such a name

    try:
        ref = parse_hub_ref(name)
        pulled = find_pulled(ref)
    except HubError:
        return None
    return ModelEntry(ref.name, pulled.path, "gguf", pulled.size_bytes)


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []

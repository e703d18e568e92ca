"""A vision encoder's weights by their Hugging Face names, from a folder or an mmproj GGUF.

Both sources answer the same names: the tower's under SigLIP's ``vision_model`` (for example
``encoder.layers.0.self_attn.q_proj.weight``) and the projector's under
``multi_modal_projector.`` (for example ``multi_modal_projector.mm_input_projection_weight``) or
SmolVLM's ``connector.`` (``connector.modality_projection.proj.weight``).
``matrix(name)`` gives a weight as stored (models/vision/stored.py's `Matrix`), ``tensor(name)``
a float32 copy, ``has(name)`` whether it exists. A missing name is a ValueError naming it.
"""

from __future__ import annotations

import glob
import os

import torch
from safetensors import safe_open

from radixserve.layers.gguf_quant import dequantize
from radixserve.models.vision.stored import Matrix

# where a folder keeps the tower: releases (transformers 4.x) first, then transformers 5 saves
_TOWER_PREFIXES = ("vision_tower.vision_model.", "model.vision_tower.vision_model.",
                   "vision_tower.", "model.vision_tower.", "model.vision_model.")  # last: SmolVLM
_PROJECTOR_PREFIXES = ("", "model.")  # before "multi_modal_projector." / "connector."
_PROJECTOR = ("multi_modal_projector.", "connector.")  # Gemma 3's, SmolVLM's


def open_folder(folder: str) -> dict:
    """Each tensor name of a safetensors folder → its file, open for the load (the tensors are
    read by name, the text model's never); ValueError for a folder without one."""
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ValueError(f"no .safetensors file in {folder}")
    found = {}
    for path in files:
        handle = safe_open(path, framework="pt")
        found.update({key: handle for key in handle.keys()})  # noqa: SIM118
    return found


class PrefixedFolder:
    """A vision tower's tensors in a safetensors folder, under the first of ``prefixes``
    (the releases' and transformers 5's layouts) whose ``probe`` tensor exists; the names
    given to ``has`` / ``matrix`` / ``tensor`` go after it (``key`` says where a family
    stores one). ``has_tower`` is False where no prefix holds the probe (a text-only copy of
    a release); `require_tower` makes that a ValueError."""

    def __init__(self, folder: str, prefixes: tuple[str, ...], probe: str) -> None:
        self.folder, self._files = folder, open_folder(folder)
        found = [p for p in prefixes if p + probe in self._files]
        self.has_tower = bool(found)
        self._prefix = found[0] if found else prefixes[0]
        self._looked_for = [p + probe for p in prefixes]

    def require_tower(self, family: str) -> PrefixedFolder:
        if not self.has_tower:
            raise ValueError(f"no {family} vision tower in {self.folder} (looked for "
                             f"{self._looked_for})")
        return self

    def key(self, name: str) -> str:
        return self._prefix + name

    def has(self, name: str) -> bool:
        return self.key(name) in self._files

    def _get(self, name: str) -> torch.Tensor:
        key = self.key(name)
        if key not in self._files:
            raise ValueError(f"vision weight missing from the checkpoint: {key!r}")
        return self._files[key].get_tensor(key)

    def matrix(self, name: str) -> Matrix:
        return Matrix.from_tensor(self._get(name))

    def tensor(self, name: str) -> torch.Tensor:
        return self._get(name).float()


class HfWeights:
    """The vision tensors of a safetensors folder (the text model's are never read)."""

    def __init__(self, folder: str) -> None:
        self._files = open_folder(folder)
        tower = [p for p in _TOWER_PREFIXES if f"{p}post_layernorm.weight" in self._files]
        if not tower:
            raise ValueError(f"no vision tower in {folder} (looked for "
                             f"{[p + 'post_layernorm.weight' for p in _TOWER_PREFIXES]})")
        self._tower = tower[0]

    def _key(self, name: str) -> str | None:
        if name.startswith(_PROJECTOR):
            keys = [p + name for p in _PROJECTOR_PREFIXES]
        else:
            keys = [self._tower + name]
        return next((k for k in keys if k in self._files), None)

    def has(self, name: str) -> bool:
        return self._key(name) is not None

    def _get(self, name: str) -> torch.Tensor:
        key = self._key(name)
        if key is None:
            raise ValueError(f"vision weight missing from the checkpoint: {name!r}")
        return self._files[key].get_tensor(key)

    def matrix(self, name: str) -> Matrix:
        return Matrix.from_tensor(self._get(name))

    def tensor(self, name: str) -> torch.Tensor:
        return self._get(name).float()


def _gguf_name(name: str) -> str:
    """llama.cpp's mmproj name for a Hugging Face one (gguf-py tensor_mapping.py, MMPROJ)."""
    parts = name.split(".")
    if name.startswith("encoder.layers."):
        layer, rest = parts[2], ".".join(parts[3:])
        for hf, gguf_name in _LAYER_NAMES.items():
            if rest.startswith(hf + "."):
                return f"v.blk.{layer}.{gguf_name}{rest[len(hf):]}"
    for hf, gguf_name in _NAMES.items():
        if name.startswith(hf + ".") or name == hf:
            return gguf_name + name[len(hf):]
    raise ValueError(f"no mmproj tensor for {name!r}")


_LAYER_NAMES = {"layer_norm1": "ln1", "layer_norm2": "ln2", "self_attn.q_proj": "attn_q",
                "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.out_proj": "attn_out", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
_NAMES = {"embeddings.patch_embedding": "v.patch_embd",
          "embeddings.position_embedding": "v.position_embd", "post_layernorm": "v.post_ln",
          "multi_modal_projector.mm_soft_emb_norm": "mm.soft_emb_norm",
          "multi_modal_projector.mm_input_projection_weight": "mm.input_projection.weight",
          "connector.modality_projection.proj": "mm.model.fc"}
# llama.cpp's converter stores Gemma's ``1 + w`` norm multiplier: given back as w
_PLUS_ONE = ("mm.soft_emb_norm.weight",)


class GgufWeights:
    """The tensors of an mmproj GGUF (``reader``: radixserve.gguf_reader's) by HF name."""

    def __init__(self, reader) -> None:
        self._tensors = {t.name: t for t in reader.tensors}

    def has(self, name: str) -> bool:
        return _gguf_name(name) in self._tensors

    def _get(self, name: str):
        gguf_name = _gguf_name(name)
        if gguf_name not in self._tensors:
            raise ValueError(f"mmproj tensor missing: {gguf_name!r} (for {name!r})")
        return self._tensors[gguf_name]

    def matrix(self, name: str) -> Matrix:
        return Matrix.from_gguf(self._get(name))

    def tensor(self, name: str) -> torch.Tensor:
        t = self._get(name)
        values = dequantize(t.data, t.tensor_type, tuple(int(d) for d in reversed(t.shape)))
        return values - 1.0 if t.name in _PLUS_ONE else values

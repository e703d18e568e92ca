"""The Qwen3-VL / Qwen3.5 vision encoder from a Hugging Face folder or a ``qwen3vl_merger``
mmproj GGUF: the builders models/vision/load.py's tables name (``Qwen3VLForConditionalGeneration``
with deepstack mergers; ``Qwen3_5ForConditionalGeneration``, ``Qwen3_5MoeForConditionalGeneration``
without; ``clip.projector_type`` qwen3vl_merger, either).

A folder keeps the tower as ``model.visual.*`` (the releases and transformers 5's saves; older
layouts ``visual.*``) and its shape in ``vision_config`` (transformers' ``Qwen3VLVisionConfig``
/ ``Qwen3_5VisionConfig`` defaults fill what it leaves out: Qwen3-VL's deepstack blocks
``[8, 16, 24]``). llama.cpp's converter (conversion/qwen3vl.py) writes the shape as
``clip.vision.*`` keys (the position table's side as ``image_size / patch_size``, the
LayerNorms' eps as ``attention.layer_norm_epsilon``, ``is_deepstack_layers`` one flag a block),
renames the tensors (gguf-py's MMPROJ map: ``v.blk.N.attn_qkv``, ``mm.0`` / ``mm.2`` for the
merger's fc1 / fc2, ``v.post_ln`` for its norm, ``v.deepstack.B.{norm,fc1,fc2}`` for the
deepstack merger after block B) and cuts the Conv3d kernel into its two frames:
``v.patch_embd.weight`` and ``.weight.1`` ([hidden, C, P, P] each; only 2 frames are supported
there). Matrices are F16 or ``ftype``, the patch kernel F16 or F32, the position table and 1-D
tensors F32.
"""

from __future__ import annotations

import logging

import torch
from gguf import GGMLQuantizationType
from torch import nn

from radixserve.layers.gguf_quant import dequantize
from radixserve.models.vision.qwen3_vl import Qwen3VLConfig, Qwen3VLVisionEncoder
from radixserve.models.vision.stored import Matrix, make_linear
from radixserve.models.vision.weights import PrefixedFolder

# transformers' Qwen3_5VisionConfig defaults (Qwen3VLVisionConfig's, less deepstack)
_VISION_DEFAULTS = {"depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh",
                    "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
                    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                    "out_hidden_size": 3584, "num_position_embeddings": 2304}
_FOLDER_PREFIXES = ("model.visual.", "visual.")
_GGUF_LAYER = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out",
               "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down"}
_GGUF_TOP = {"pos_embed": "v.position_embd", "merger.norm": "v.post_ln",
             "merger.linear_fc1": "mm.0", "merger.linear_fc2": "mm.2",
             "patch_embed.proj": "v.patch_embd"}
_QWEN3_VL_DEEPSTACK = (8, 16, 24)  # Qwen3VLVisionConfig's deepstack_visual_indexes default
_GGUF_DEEPSTACK = {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}
_T = GGMLQuantizationType
_WORDS = {_T.F32: torch.int32, _T.F16: torch.int16, _T.BF16: torch.int16}  # one element

logger = logging.getLogger(__name__)


class _Parts:
    """The tower's layers from a weights source (``matrix(name)``, ``tensor(name)`` by
    transformers' names under ``visual.``) on ``device`` in ``dtype``."""

    def __init__(self, source, device: torch.device, dtype: torch.dtype) -> None:
        self.source, self.device, self.dtype = source, device, dtype

    def linear(self, name: str, n: int, k: int) -> nn.Module:
        matrix = self.source.matrix(f"{name}.weight")
        if (matrix.n, matrix.k) != (n, k):
            raise ValueError(f"vision weight {name}.weight of shape {(matrix.n, matrix.k)}, "
                             f"expected {(n, k)}")
        return make_linear(matrix, self.source.tensor(f"{name}.bias"), self.device, self.dtype)

    def tensor(self, name: str) -> torch.Tensor:
        return self.source.tensor(name).to(device=self.device, dtype=self.dtype)

    def layer_norm(self, name: str, eps: float) -> nn.LayerNorm:
        weight = self.tensor(f"{name}.weight")
        norm = nn.LayerNorm(weight.shape[0], eps=eps, device="meta")
        norm.weight = nn.Parameter(weight, requires_grad=False)
        norm.bias = nn.Parameter(self.tensor(f"{name}.bias"), requires_grad=False)
        return norm


def _gguf_name(name: str, deepstack: tuple[int, ...]) -> str:
    """llama.cpp's mmproj name of a ``visual.`` tensor (gguf-py's MMPROJ map); ``deepstack``:
    the block after which each deepstack merger runs (its mmproj names carry the block)."""
    if name.startswith("deepstack_merger_list."):
        _, merger, part, suffix = name.split(".")
        if int(merger) < len(deepstack) and part in _GGUF_DEEPSTACK:
            return f"v.deepstack.{deepstack[int(merger)]}.{_GGUF_DEEPSTACK[part]}.{suffix}"
    if name.startswith("blocks."):
        _, layer, rest = name.split(".", 2)
        base, _, suffix = rest.rpartition(".")
        if base in _GGUF_LAYER:
            return f"v.blk.{layer}.{_GGUF_LAYER[base]}.{suffix}"
    base, _, suffix = name.rpartition(".")
    if base in _GGUF_TOP:
        return f"{_GGUF_TOP[base]}.{suffix}"
    raise ValueError(f"no mmproj tensor for {name!r}")


class _GgufWeights:
    """The tensors of a ``qwen3vl_merger`` mmproj by transformers' names; the patch kernel's
    two frames put back together as the Conv3d's [hidden, C * 2 * P * P]."""

    def __init__(self, reader, in_channels: int, deepstack: tuple[int, ...]) -> None:
        self._tensors = {t.name: t for t in reader.tensors}
        self._in_channels, self._deepstack = in_channels, deepstack

    def _get(self, gguf_name: str):
        if gguf_name not in self._tensors:
            raise ValueError(f"mmproj tensor missing: {gguf_name!r}")
        return self._tensors[gguf_name]

    def matrix(self, name: str) -> Matrix:
        if name != "patch_embed.proj.weight":
            return Matrix.from_gguf(self._get(_gguf_name(name, self._deepstack)))
        frames = [Matrix.from_gguf(self._get(f"v.patch_embd.weight{s}")) for s in ("", ".1")]
        return _interleave_frames(frames, self._in_channels)

    def tensor(self, name: str) -> torch.Tensor:
        t = self._get(_gguf_name(name, self._deepstack))
        return dequantize(t.data, t.tensor_type, tuple(int(d) for d in reversed(t.shape)))


def _interleave_frames(frames: list[Matrix], channels: int) -> Matrix:
    """The Conv3d kernel rows (C, T, P, P) from one [n, C * P * P] matrix per frame; float
    types keep their bits, others become float32."""
    n, k = frames[0].n, frames[0].k
    if any((m.n, m.k) != (n, k) for m in frames) or k % channels:
        raise ValueError("the mmproj's two patch-kernel frames differ in shape")
    qtype = frames[0].qtype
    if all(m.qtype == qtype for m in frames) and qtype in _WORDS:
        word = _WORDS[qtype]
        parts = [m.raw.contiguous().view(word).view(n, channels, 1, -1) for m in frames]
        rows = torch.cat(parts, dim=2).reshape(n, -1)
        return Matrix(qtype, rows.view(torch.uint8), n, rows.shape[1])
    parts = [m.floats().view(n, channels, 1, -1) for m in frames]
    rows = torch.cat(parts, dim=2).reshape(n, -1).contiguous()
    return Matrix.from_tensor(rows)


def qwen3_vl_vision_from_hf(config: dict, folder: str, device: torch.device,
                            dtype: torch.dtype):
    """The encoder of the Qwen3-VL ``folder`` (``config``: its config.json), with its deepstack
    mergers; None, with a warning, where its weights hold no tower. ValueError for missing or
    misshapen weights."""
    v = config["vision_config"]
    deepstack = tuple(v.get("deepstack_visual_indexes", _QWEN3_VL_DEEPSTACK))
    return _from_folder(v, deepstack, folder, device, dtype)


def qwen35_vision_from_hf(config: dict, folder: str, device: torch.device,
                          dtype: torch.dtype):
    """The encoder of the Qwen3.5 ``folder`` (``config``: its config.json); None, with a
    warning, where its weights hold no tower (the text model is served alone). ValueError for
    missing or misshapen weights or deepstack mergers (Qwen3.5's tower has none)."""
    v = config["vision_config"]
    if v.get("deepstack_visual_indexes"):
        raise ValueError("a Qwen3.5 vision tower with deepstack mergers is not one; Qwen3-VL's "
                         "(Qwen3VLForConditionalGeneration) are taken")
    return _from_folder(v, (), folder, device, dtype)


def _from_folder(vision_config: dict, deepstack: tuple[int, ...], folder: str,
                 device: torch.device, dtype: torch.dtype):
    v = {**_VISION_DEFAULTS, **vision_config}
    rope = v.get("rope_parameters") or {}
    vision = Qwen3VLConfig(
        hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        num_layers=v["depth"], num_heads=v["num_heads"], patch_size=v["patch_size"],
        temporal_patch_size=v["temporal_patch_size"], merge_size=v["spatial_merge_size"],
        num_position_embeddings=v["num_position_embeddings"],
        out_hidden_size=v["out_hidden_size"], in_channels=v["in_channels"],
        rope_theta=float(rope.get("rope_theta", 10000.0)), hidden_act=v["hidden_act"],
        deepstack_indexes=tuple(int(i) for i in deepstack))
    weights = PrefixedFolder(folder, _FOLDER_PREFIXES, "pos_embed.weight")
    if not weights.has_tower:
        logger.warning("%s names a vision tower but its weights hold none (no "
                       "model.visual.*): serving text only", folder)
        return None
    return Qwen3VLVisionEncoder(vision, _Parts(weights, device, dtype), device, dtype)


def qwen3_vl_from_gguf(reader, device: torch.device, dtype: torch.dtype):
    """The encoder of a ``qwen3vl_merger`` mmproj GGUF (``reader``: radixserve.gguf_reader's):
    Qwen3-VL's where ``clip.vision.is_deepstack_layers`` flags blocks, Qwen3.5's where none.
    ValueError for missing metadata or tensors."""
    def get(key: str, default=None):
        field = reader.fields.get(key)
        if field is not None:
            return field.contents()
        if default is None:
            raise ValueError(f"mmproj metadata missing: {key}")
        return default

    patch = get("clip.vision.patch_size")
    side = get("clip.vision.image_size") // patch
    num_layers = get("clip.vision.block_count")
    flags = list(get("clip.vision.is_deepstack_layers", [False]))
    if any(flags) and len(flags) != num_layers:
        raise ValueError(f"clip.vision.is_deepstack_layers has {len(flags)} flags for "
                         f"{num_layers} blocks")
    deepstack = tuple(i for i, flag in enumerate(flags) if flag)
    vision = Qwen3VLConfig(
        hidden_size=get("clip.vision.embedding_length"),
        intermediate_size=get("clip.vision.feed_forward_length"),
        num_layers=num_layers,
        num_heads=get("clip.vision.attention.head_count"), patch_size=patch,
        temporal_patch_size=2, merge_size=get("clip.vision.spatial_merge_size", 2),
        num_position_embeddings=side * side,
        out_hidden_size=get("clip.vision.projection_dim"),
        layer_norm_eps=get("clip.vision.attention.layer_norm_epsilon", 1e-6),
        deepstack_indexes=deepstack)
    source = _GgufWeights(reader, vision.in_channels, deepstack)
    return Qwen3VLVisionEncoder(vision, _Parts(source, device, dtype), device, dtype)

"""Mistral 3's vision encoder (models/vision/pixtral.py) from a Hugging Face folder or a
``pixtral`` mmproj GGUF: the builders models/vision/load.py's tables name
(``Mistral3ForConditionalGeneration``, ``clip.projector_type`` pixtral).

Both weight sources answer the release names (``vision_tower.patch_conv.weight``,
``vision_tower.transformer.layers.0.attention.q_proj.weight``,
``multi_modal_projector.patch_merger.merging_layer.weight``, ...). A folder keeps them under
those names (the releases and transformers 5's saves) or under ``model.`` (transformers 5's
in-memory names). llama.cpp's converter (conversion/llava.py ``LlavaVisionModel``) renames
them (gguf-py's MMPROJ map: ``v.patch_embd``, ``v.pre_ln``, ``v.blk.N.attn_q`` / ``ln1`` /
``ln2`` / ``ffn_gate``, ``mm.input_norm``, ``mm.patch_merger``, ``mm.1`` / ``mm.2``), permutes
the rows of q and k for ggml's pairwise rope (undone here; rows of any stored type move
whole), writes the tower's norm epsilon (1e-5), which llama.cpp also uses for the projector's
norm, ``clip.vision.use_silu`` / ``use_gelu`` for the MLP and the merge size; the rope base is
llama.cpp's fixed 10000. Matrices are ``ftype``, the patch kernel and the merging matrix F16 in
an f16 file and F32 otherwise, 1-D tensors F32.
"""

from __future__ import annotations

import torch

from radixserve.layers.gguf_quant import dequantize
from radixserve.models.vision.pixtral import PixtralConfig
from radixserve.models.vision.stored import Matrix
from radixserve.models.vision.weights import PrefixedFolder

_FOLDER_PREFIXES = ("", "model.")  # releases and transformers 5's saves; in-memory names


_LAYER = {"attention.q_proj": "attn_q", "attention.k_proj": "attn_k",
          "attention.v_proj": "attn_v", "attention.o_proj": "attn_out",
          "attention_norm": "ln1", "ffn_norm": "ln2", "feed_forward.gate_proj": "ffn_gate",
          "feed_forward.up_proj": "ffn_up", "feed_forward.down_proj": "ffn_down"}
_TOP = {"vision_tower.patch_conv": "v.patch_embd", "vision_tower.ln_pre": "v.pre_ln",
        "multi_modal_projector.norm": "mm.input_norm",
        "multi_modal_projector.patch_merger.merging_layer": "mm.patch_merger",
        "multi_modal_projector.linear_1": "mm.1", "multi_modal_projector.linear_2": "mm.2"}
_BLOCKS = "vision_tower.transformer.layers."


def _gguf_name(name: str) -> str:
    """llama.cpp's mmproj name of a release name (module docstring)."""
    base, _, kind = name.rpartition(".")
    if base.startswith(_BLOCKS):
        layer, _, rest = base.removeprefix(_BLOCKS).partition(".")
        if rest in _LAYER:
            return f"v.blk.{layer}.{_LAYER[rest]}.{kind}"
    if base in _TOP:
        return f"{_TOP[base]}.{kind}"
    raise ValueError(f"no mmproj tensor for {name!r}")


class PixtralGgufWeights:
    """The tensors of a ``pixtral`` mmproj by their release names, q and k rows back in
    transformers' order."""

    def __init__(self, reader, num_heads: int) -> None:
        self._tensors = {t.name: t for t in reader.tensors}
        self._num_heads = num_heads

    def has(self, name: str) -> bool:
        return _gguf_name(name) in self._tensors

    def _raw(self, name: str):
        gguf_name = _gguf_name(name)
        if gguf_name not in self._tensors:
            raise ValueError(f"mmproj tensor missing: {gguf_name!r} (for {name!r})")
        return self._tensors[gguf_name]

    def matrix(self, name: str) -> Matrix:
        m = Matrix.from_gguf(self._raw(name))
        if name.endswith(("attention.q_proj.weight", "attention.k_proj.weight")):
            # llama.cpp's rows per head (d/2 pairs of 2) → transformers' (2 halves of d/2)
            order = torch.arange(m.n).view(self._num_heads, -1, 2).transpose(1, 2).reshape(-1)
            m = Matrix(m.qtype, m.raw[order], m.n, m.k)
        return m

    def tensor(self, name: str) -> torch.Tensor:
        t = self._raw(name)
        return dequantize(t.data, t.tensor_type, tuple(int(d) for d in reversed(t.shape)))


def _feature_layers(value, num_layers: int) -> int:
    """The blocks to run for transformers' ``vision_feature_layer`` (hidden_states[i]: the
    embeddings for 0, block i's output after; -1 the last). ValueError for a list (features
    of several layers side by side) or one out of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        # NOTE: ValueError as every bad checkpoint (engine/vision_setup.py catches it)
        raise ValueError(  # noqa: TRY004
            f"vision_feature_layer {value!r} is not supported (one layer only)")
    run = value if value >= 0 else num_layers + 1 + value
    if not 0 <= run <= num_layers:
        raise ValueError(f"vision_feature_layer {value} outside the tower's {num_layers} blocks")
    return run


def pixtral_from_hf(config: dict, folder: str, device: torch.device, dtype: torch.dtype):
    """The encoder of the Mistral 3 ``folder`` (``config``: its config.json). ValueError for a
    misshapen or unsupported config, or missing weights."""
    from radixserve.models.vision.pixtral import PixtralVisionEncoder

    v, text = config["vision_config"], config.get("text_config") or {}
    if v.get("model_type", "pixtral") != "pixtral":
        raise ValueError(f"vision tower {v.get('model_type')!r}; Mistral 3's is 'pixtral'")
    if config.get("projector_hidden_act", "gelu") != "gelu":
        raise ValueError(f"projector_hidden_act {config['projector_hidden_act']!r} is not "
                         f"supported (the releases' is 'gelu')")
    rope = v.get("rope_parameters") or {}
    patch, image = v.get("patch_size", 14), v.get("image_size", 1540)
    if not isinstance(patch, int) or not isinstance(image, int):
        raise ValueError(  # noqa: TRY004 - a bad checkpoint, as above
            f"patch_size {patch!r} / image_size {image!r}: expected integers")
    layers = v.get("num_hidden_layers", 24)
    hidden = v.get("hidden_size", 1024)
    cfg = PixtralConfig(
        hidden_size=hidden, intermediate_size=v.get("intermediate_size", 4096),
        num_layers=_feature_layers(config.get("vision_feature_layer", -1), layers),
        num_heads=v.get("num_attention_heads", 16),
        text_hidden_size=text.get("hidden_size", 5120), image_size=image, patch_size=patch,
        merge_size=config.get("spatial_merge_size", 2),
        hidden_act=v.get("hidden_act", "gelu"),
        rope_theta=rope.get("rope_theta", v.get("rope_theta", 10000.0)),
        projector_norm_eps=text.get("rms_norm_eps", 1e-5),
        num_channels=v.get("num_channels", 3))
    weights = PrefixedFolder(folder, _FOLDER_PREFIXES, "vision_tower.patch_conv.weight")
    return PixtralVisionEncoder(cfg, weights.require_tower("Pixtral"), device, dtype)


def pixtral_from_gguf(reader, device: torch.device, dtype: torch.dtype):
    """The encoder of a ``pixtral`` mmproj (``reader``: radixserve.gguf_reader's). ValueError
    for missing metadata or tensors, or a Pixtral without the patch merger (Pixtral 12B)."""
    from radixserve.models.vision.pixtral import PixtralVisionEncoder

    def get(key: str, default=None):
        field = reader.fields.get(key)
        if field is not None:
            return field.contents()
        if default is None:
            raise ValueError(f"mmproj metadata missing: {key}")
        return default

    if not any(t.name == "mm.patch_merger.weight" for t in reader.tensors):
        raise ValueError("this pixtral mmproj has no patch merger (Pixtral 12B); only "
                         "Mistral 3's (Mistral Small 3.1 / 3.2, Ministral 3) is supported")
    eps = float(get("clip.vision.attention.layer_norm_epsilon", 1e-5))
    act = "gelu" if get("clip.use_gelu", False) and not get("clip.use_silu", False) else "silu"
    heads = int(get("clip.vision.attention.head_count"))
    cfg = PixtralConfig(
        hidden_size=int(get("clip.vision.embedding_length")),
        intermediate_size=int(get("clip.vision.feed_forward_length")),
        num_layers=int(get("clip.vision.block_count")), num_heads=heads,
        text_hidden_size=int(get("clip.vision.projection_dim")),
        image_size=int(get("clip.vision.image_size")),
        patch_size=int(get("clip.vision.patch_size")),
        merge_size=int(get("clip.vision.spatial_merge_size", 1)), hidden_act=act,
        rope_theta=10000.0, norm_eps=eps,  # llama.cpp's, whatever the file says
        projector_norm_eps=eps)
    return PixtralVisionEncoder(cfg, PixtralGgufWeights(reader, heads), device, dtype)

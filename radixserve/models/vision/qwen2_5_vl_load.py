"""Qwen2.5-VL's vision encoder from a Hugging Face folder or a ``qwen2.5vl_merger`` mmproj GGUF:
the builders models/vision/load.py's tables name.

Both weight sources answer the tower's names as transformers has them under ``visual.``
(``patch_embed.proj.weight``, ``blocks.0.attn.qkv.weight``, ``merger.mlp.0.bias``, ...).
A folder keeps them under ``visual.`` (releases) or ``model.visual.`` (transformers 5's
save_pretrained). llama.cpp's converter (conversion/qwenvl.py) splits the Conv3d into its two
time slices (``v.patch_embd.weight`` / ``.weight.1``) and qkv into q, k, v; they are joined
back here (in the stored type where both halves share it). The mmproj writes the full-attention
blocks as a period (``clip.vision.n_wa_pattern``: block i is full where (i + 1) % n == 0) and no
window size: llama.cpp then runs the releases' 112 px, as here.
"""

from __future__ import annotations

import torch

from radixserve.layers.gguf_quant import dequantize
from radixserve.models.vision.qwen2_5_vl import Qwen25VisionConfig
from radixserve.models.vision.stored import Matrix
from radixserve.models.vision.weights import PrefixedFolder

_FOLDER_PREFIXES = ("visual.", "model.visual.")  # releases, transformers 5


_LAYER = {"norm1": "ln1", "norm2": "ln2", "attn.proj": "attn_out", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_TOP = {"merger.ln_q": "v.post_ln", "merger.mlp.0": "mm.0", "merger.mlp.2": "mm.2"}


class QwenGgufWeights:
    """The tensors of a ``qwen2.5vl_merger`` mmproj by their names under ``visual.``."""

    def __init__(self, reader) -> None:
        self._tensors = {t.name: t for t in reader.tensors}

    def _raw(self, gguf_name: str):
        if gguf_name not in self._tensors:
            raise ValueError(f"mmproj tensor missing: {gguf_name!r}")
        return self._tensors[gguf_name]

    def _names(self, name: str) -> list[str]:
        """The mmproj tensors holding ``name`` (several where the converter split it)."""
        base, _, kind = name.rpartition(".")
        parts = base.split(".")
        if base == "patch_embed.proj":
            return ["v.patch_embd.weight", "v.patch_embd.weight.1"]
        if parts[0] == "blocks":
            layer, rest = parts[1], ".".join(parts[2:])
            if rest == "attn.qkv":
                return [f"v.blk.{layer}.attn_{p}.{kind}" for p in "qkv"]
            if rest in _LAYER:
                return [f"v.blk.{layer}.{_LAYER[rest]}.{kind}"]
        if base in _TOP:
            return [f"{_TOP[base]}.{kind}"]
        raise ValueError(f"no mmproj tensor for {name!r}")

    def matrix(self, name: str) -> Matrix:
        parts = [Matrix.from_gguf(self._raw(n)) for n in self._names(name)]
        if name == "patch_embed.proj.weight":
            return _join_time_slices(parts)
        if len({m.qtype for m in parts}) != 1 or len({m.k for m in parts}) != 1:
            values = torch.cat([m.floats() for m in parts])
            return Matrix.from_tensor(values)
        return Matrix(parts[0].qtype, torch.cat([m.raw for m in parts]),
                      sum(m.n for m in parts), parts[0].k)

    def tensor(self, name: str) -> torch.Tensor:
        out = []
        for gguf_name in self._names(name):
            t = self._raw(gguf_name)
            out.append(dequantize(t.data, t.tensor_type, tuple(int(d) for d in reversed(t.shape))))
        return torch.cat(out)


def _join_time_slices(slices: list[Matrix]) -> Matrix:
    """The Conv3d [out, C, T, P, P] as one [out, C*T*P*P] matrix from its T slices
    [out, C*P*P] (in the slices' type when they share a float one: the values are exact)."""
    n, k = slices[0].n, slices[0].k
    channels = 3  # the converter's kernels are [out, 3, P, P]
    values = torch.stack([m.floats().view(n, channels, k // channels) for m in slices], dim=2)
    values = values.reshape(n, -1)
    kinds = {m.qtype.name for m in slices}
    if kinds in ({"F16"}, {"BF16"}):
        values = values.to(torch.float16 if kinds == {"F16"} else torch.bfloat16)
    return Matrix.from_tensor(values)


def qwen25_vl_from_hf(config: dict, folder: str, device: torch.device, dtype: torch.dtype):
    """The encoder of the Qwen2.5-VL ``folder`` (``config``: its config.json, flat as the
    releases or with transformers 5's ``text_config``). ValueError for a misshapen config or
    missing weights."""
    from radixserve.models.vision.qwen2_5_vl import Qwen25VisionEncoder

    v = config["vision_config"]
    text_hidden = (config.get("text_config") or config).get("hidden_size")
    out_hidden = v.get("out_hidden_size", text_hidden)
    if text_hidden is not None and out_hidden != text_hidden:
        raise ValueError(f"the vision merger gives {out_hidden} features; the text model "
                         f"takes {text_hidden}")
    rope = v.get("rope_parameters") or {}
    cfg = Qwen25VisionConfig(
        hidden_size=v.get("hidden_size", 1280), intermediate_size=v.get("intermediate_size", 3420),
        num_layers=v.get("depth", 32), num_heads=v.get("num_heads", 16),
        out_hidden_size=out_hidden,
        fullatt_layers=tuple(v.get("fullatt_block_indexes", (7, 15, 23, 31))),
        patch_size=v.get("patch_size", 14), temporal_patch_size=v.get("temporal_patch_size", 2),
        merge_size=v.get("spatial_merge_size", 2), window_size=v.get("window_size", 112),
        num_channels=v.get("in_channels", v.get("in_chans", 3)),
        rope_theta=rope.get("rope_theta", 10000.0))
    weights = PrefixedFolder(folder, _FOLDER_PREFIXES, "patch_embed.proj.weight")
    return Qwen25VisionEncoder(cfg, weights.require_tower("Qwen2.5-VL"), device, dtype)


def qwen25_vl_from_gguf(reader, device: torch.device, dtype: torch.dtype):
    """The encoder of a ``qwen2.5vl_merger`` mmproj (``reader``: radixserve.gguf_reader's).
    ValueError for missing metadata or tensors."""
    from radixserve.models.vision.qwen2_5_vl import Qwen25VisionEncoder

    def get(key: str, default=None):
        field = reader.fields.get(key)
        if field is not None:
            return field.contents()
        if default is None:
            raise ValueError(f"mmproj metadata missing: {key}")
        return default

    layers = int(get("clip.vision.block_count"))
    period = int(get("clip.vision.n_wa_pattern", 0))
    full = tuple(i for i in range(layers) if period and (i + 1) % period == 0)
    kernels = [t for t in reader.tensors if t.name.startswith("v.patch_embd.weight")]
    cfg = Qwen25VisionConfig(
        hidden_size=int(get("clip.vision.embedding_length")),
        intermediate_size=int(get("clip.vision.feed_forward_length")), num_layers=layers,
        num_heads=int(get("clip.vision.attention.head_count")),
        out_hidden_size=int(get("clip.vision.projection_dim")),
        fullatt_layers=full if period else tuple(range(layers)),
        patch_size=int(get("clip.vision.patch_size")), temporal_patch_size=max(1, len(kernels)),
        merge_size=int(get("clip.vision.spatial_merge_size", 2)),
        window_size=int(get("clip.vision.window_size", 112)),
        rms_norm_eps=float(get("clip.vision.attention.layer_norm_epsilon", 1e-6)))
    return Qwen25VisionEncoder(cfg, QwenGgufWeights(reader), device, dtype)

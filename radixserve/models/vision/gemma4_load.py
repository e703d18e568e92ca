"""Gemma 4's vision encoder from a Hugging Face folder or a ``gemma4v`` mmproj GGUF: the builders
models/vision/load.py's tables name (``Gemma4ForConditionalGeneration``, ``clip.projector_type``
gemma4v).

A folder keeps the tower as ``model.vision_tower.*`` and the embedder as ``model.embed_vision.*``
(the releases and transformers 5's saves; ``vision_tower.*`` / ``embed_vision.*`` also taken),
its shape in ``vision_config`` (transformers' ``Gemma4VisionConfig`` defaults fill what it
leaves out) and the text width in ``text_config``. llama.cpp's converter
(conversion/gemma.py ``Gemma4VisionAudioModel``) writes the shape as ``clip.vision.*`` keys
(no head dim, KV heads, rope theta or pooling: llama.cpp takes ``n_embd / n_head``, theta 100
and a 3 x 3 pool unless ``clip.vision.projector.scale_factor`` says otherwise), renames the
tensors (gguf-py's MMPROJ map: ``v.blk.N.attn_q``, ``ln1`` / ``attn_post_norm`` / ``ln2`` /
``ffn_post_norm`` for the four norms, ``mm.input_projection`` for the embedder, ``v.std_bias``
/ ``v.std_scale``), keeps the clipping bounds as 1-element ``<matrix>.input_min`` (etc.)
tensors, stores norms as they are (Gemma 4's multiply by w) and the patch kernel's columns as
(channel, row, column) instead of the checkpoint's (row, column, channel). Matrices are F16 or
``ftype``, the patch kernel F16 or F32, the position table and 1-D tensors F32.
"""

from __future__ import annotations

import logging
import math

import torch
from gguf import GGMLQuantizationType

from radixserve.layers.gguf_quant import dequantize
from radixserve.models.vision.gemma4 import ClippedLinear, Gemma4VisionConfig, Gemma4VisionEncoder
from radixserve.models.vision.stored import Matrix, make_linear
from radixserve.models.vision.weights import PrefixedFolder

logger = logging.getLogger(__name__)

# transformers' Gemma4VisionConfig defaults
_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16,
                    "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 64,
                    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
                    "pooling_kernel_size": 3, "patch_size": 16, "position_embedding_size": 10240,
                    "use_clipped_linears": False, "standardize": False}
_BOUNDS = ("input_min", "input_max", "output_min", "output_max")
_FOLDER_PREFIXES = ("model.", "")  # before vision_tower. / embed_vision.
_GGUF_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_out",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "input_layernorm": "ln1", "post_attention_layernorm": "attn_post_norm",
               "pre_feedforward_layernorm": "ln2", "post_feedforward_layernorm": "ffn_post_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GGUF_TOP = {"patch_embedder.input_proj.weight": "v.patch_embd.weight",
             "patch_embedder.position_embedding_table": "v.position_embd.weight",
             "std_bias": "v.std_bias", "std_scale": "v.std_scale",
             "embed_vision.embedding_projection.weight": "mm.input_projection.weight"}
_WORDS = {GGMLQuantizationType.F32: torch.int32, GGMLQuantizationType.F16: torch.int16,
          GGMLQuantizationType.BF16: torch.int16}


class _Parts:
    """The tower's layers from a weights source (``matrix``, ``tensor``, ``has`` by
    transformers' names) on ``device``: matrices in ``dtype`` or as stored, the rest float32."""

    def __init__(self, source, device: torch.device, dtype: torch.dtype) -> None:
        self.source, self.device, self.dtype = source, device, dtype

    def linear(self, name: str, n: int, k: int, clippable: bool = True):
        """The [n, k] bias-free layer ``name`` (a ``Gemma4ClippableLinear``'s weight is
        ``name.linear.weight``), clamped where the source has its bounds."""
        matrix = self.source.matrix(f"{name}.linear.weight" if clippable else f"{name}.weight")
        if (matrix.n, matrix.k) != (n, k):
            raise ValueError(f"vision weight {name} of shape {(matrix.n, matrix.k)}, "
                             f"expected {(n, k)}")
        layer = make_linear(matrix, None, self.device, self.dtype)
        bounds = [f"{name}.{b}" for b in _BOUNDS]
        if not clippable or not any(self.source.has(b) for b in bounds):
            return layer
        values = [float(self.source.tensor(b).reshape(-1)[0]) if self.source.has(b)
                  else math.inf * (1 if b.endswith("max") else -1) for b in bounds]
        return ClippedLinear(layer, tuple(values))

    def tensor(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        t = self.source.tensor(name)
        if tuple(t.shape) != shape:
            raise ValueError(f"vision weight {name} of shape {tuple(t.shape)}, expected {shape}")
        return t.to(device=self.device, dtype=torch.float32)

    def norm(self, name: str, size: int) -> torch.Tensor:
        return self.tensor(f"{name}.weight", (size,))


class _FolderWeights(PrefixedFolder):
    """The ``vision_tower.`` / ``embed_vision.`` tensors of a safetensors folder; ``has_tower``
    False where it has none (a text-only copy of a release)."""

    def __init__(self, folder: str) -> None:
        super().__init__(folder, _FOLDER_PREFIXES, "vision_tower.patch_embedder.input_proj.weight")

    def key(self, name: str) -> str:
        inner = name if name.startswith("embed_vision.") else f"vision_tower.{name}"
        return super().key(inner)


def _gguf_name(name: str) -> str:
    """llama.cpp's mmproj name of a transformers tower / embedder name (gguf-py's MMPROJ map)."""
    if name in _GGUF_TOP:
        return _GGUF_TOP[name]
    if name.startswith("encoder.layers."):
        _, _, layer, rest = name.split(".", 3)
        base, _, suffix = rest.rpartition(".")
        base = base.removesuffix(".linear")
        if base in _GGUF_LAYER:
            return f"v.blk.{layer}.{_GGUF_LAYER[base]}.{suffix}"
    raise ValueError(f"no mmproj tensor for {name!r}")


class _GgufWeights:
    """The tensors of a ``gemma4v`` mmproj by transformers' names; the patch kernel's columns
    put back in the pixels' (row, column, channel) order."""

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
        m = Matrix.from_gguf(self._get(name))
        return _channels_last(m) if name == "patch_embedder.input_proj.weight" else m

    def tensor(self, name: str) -> torch.Tensor:
        t = self._get(name)
        return dequantize(t.data, t.tensor_type, tuple(int(d) for d in reversed(t.shape)))


def _channels_last(m: Matrix) -> Matrix:
    """The patch kernel [n, 3 * P * P] with columns (channel, row, column) → (row, column,
    channel); float types keep their bits, others become float32."""
    side = math.isqrt(m.k // 3)
    if 3 * side * side != m.k:
        raise ValueError(f"the mmproj's patch kernel has {m.k} columns, not 3 x P x P")
    if m.qtype in _WORDS:
        words = m.raw.contiguous().view(_WORDS[m.qtype]).view(m.n, 3, side, side)
        rows = words.permute(0, 2, 3, 1).contiguous().view(m.n, -1)
        return Matrix(m.qtype, rows.view(torch.uint8), m.n, m.k)
    rows = m.floats().view(m.n, 3, side, side).permute(0, 2, 3, 1).reshape(m.n, -1)
    return Matrix.from_tensor(rows.contiguous())


def gemma4_vision_from_hf(config: dict, folder: str, device: torch.device, dtype: torch.dtype):
    """The encoder of the Gemma 4 ``folder`` (``config``: its config.json); None where the
    config has no ``vision_config``, or, with a warning, where its weights hold no tower (the text model is served alone). ValueError for
    missing or misshapen weights or an activation other than GELU-tanh."""
    if not config.get("vision_config"):
        return None  # an audio-only or text-only configuration
    v = {**_VISION_DEFAULTS, **config["vision_config"]}
    if v["hidden_activation"] != "gelu_pytorch_tanh":
        raise ValueError(f"vision activation {v['hidden_activation']!r}; supported: "
                         f"['gelu_pytorch_tanh']")
    rope = v.get("rope_parameters") or {}
    text_hidden = (config.get("text_config") or {}).get("hidden_size")
    if text_hidden is None:
        raise ValueError("config.json's text_config has no hidden_size")
    vision = Gemma4VisionConfig(
        hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        num_layers=v["num_hidden_layers"], num_heads=v["num_attention_heads"],
        num_kv_heads=v["num_key_value_heads"], head_dim=v["head_dim"],
        patch_size=v["patch_size"], pooling_kernel_size=v["pooling_kernel_size"],
        position_embedding_size=v["position_embedding_size"],
        text_hidden_size=text_hidden, rms_norm_eps=v["rms_norm_eps"],
        rope_theta=float(rope.get("rope_theta", 100.0)), standardize=bool(v["standardize"]))
    weights = _FolderWeights(folder)
    if not weights.has_tower:
        logger.warning("%s names a vision tower but its weights hold none (no "
                       "model.vision_tower.*): serving text only", folder)
        return None
    if weights.has("encoder.layers.0.layer_scalar"):
        raise ValueError("a Gemma 4 vision tower with per-layer output scales is not supported")
    return Gemma4VisionEncoder(vision, _Parts(weights, device, dtype), device, dtype)


def gemma4_vision_from_gguf(reader, device: torch.device, dtype: torch.dtype):
    """The encoder of a ``gemma4v`` mmproj GGUF (``reader``: radixserve.gguf_reader's).
    ValueError for missing metadata or tensors, or layer output scales it does not run."""
    def get(key: str, default=None):
        field = reader.fields.get(key)
        if field is not None:
            return field.contents()
        if default is None:
            raise ValueError(f"mmproj metadata missing: {key}")
        return default

    tensors = {t.name: t for t in reader.tensors}
    if "v.blk.0.out_scale.weight" in tensors:
        raise ValueError("an mmproj with per-layer output scales (v.blk.N.out_scale) is not "
                         "supported")
    for needed in ("v.blk.0.attn_q_norm.weight", "v.blk.0.attn_k.weight",
                   "v.position_embd.weight"):
        if needed not in tensors:
            raise ValueError(f"mmproj tensor missing: {needed!r}")
    hidden, heads = get("clip.vision.embedding_length"), get("clip.vision.attention.head_count")
    head_dim = int(tensors["v.blk.0.attn_q_norm.weight"].shape[0])
    kv_rows = int(tensors["v.blk.0.attn_k.weight"].shape[1])  # GGUF shapes: [k, n]
    vision = Gemma4VisionConfig(
        hidden_size=hidden, intermediate_size=get("clip.vision.feed_forward_length"),
        num_layers=get("clip.vision.block_count"), num_heads=heads,
        num_kv_heads=kv_rows // head_dim, head_dim=head_dim,
        patch_size=get("clip.vision.patch_size"),
        pooling_kernel_size=get("clip.vision.projector.scale_factor", 3),
        position_embedding_size=int(tensors["v.position_embd.weight"].shape[1]),
        text_hidden_size=get("clip.vision.projection_dim"),
        rms_norm_eps=get("clip.vision.attention.layer_norm_epsilon", 1e-6),
        standardize="v.std_bias" in tensors and "v.std_scale" in tensors)
    return Gemma4VisionEncoder(vision, _Parts(_GgufWeights(reader), device, dtype), device, dtype)

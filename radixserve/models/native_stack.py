"""The decoder layers of a Llama- or Gemma-family model as one native call each
(``decoder_layer.cpp``).

At batch 1 a decode step of the embedded model spent ~40 % of its time in the Python and
ctypes glue around its ~9 kernel calls per layer (~150 us per layer; Gemma's layers, with four
norms, q/k norms and GeGLU, ~12). Where every piece of a layer runs a native kernel — int8 or
GGUF-block linears, the ``cpu_native`` attention backend, float32 rows, a dense MLP, rope on
whole heads — the layer stack here makes one call per layer into the same kernels, in the same
order, on the same buffers: the same bits as the Python layers, which stay the path for
everything else (``PythonLayerStack``). What a layer has beyond Llama's sequence — Gemma's norms
around attention and the MLP (the layer class's ``native_norms``), q/k norms, the MLP's
``activation``, a window, a soft-cap, its own rope tables — travels in its ``_Layer`` struct. A tensor-parallel rank's layers (their o and down
projections `RowParallelLinear`) make two calls each, attention and MLP, with the sum over the
ranks after each (the same kernels again: the same bits as its Python layers).
"""

from __future__ import annotations

import ctypes
import logging

import torch
from torch import nn

from radixserve.kernels import native
from radixserve.layers.attn_backends.cpu_native import KV_DTYPE_CODES, NativeAttentionMetadata
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.block_linear import BlockLinear
from radixserve.layers.row_parallel import RowParallelLinear
from radixserve.runner.forward_context import get_forward_context

logger = logging.getLogger(__name__)
_P, _I64 = ctypes.c_void_p, ctypes.c_int64


class _Linear(ctypes.Structure):
    _fields_ = [("kind", _I64), ("in_features", _I64), ("out_features", _I64), ("packed", _P),
                ("comp", _P), ("scale", _P), ("bias", _P), ("nparts", _I64)]


_NORMS = ("input_norm", "post_norm", "attn_out_norm", "mlp_out_norm")
_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # decoder_layer.cpp's Activation


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
                *((name, _P) for name in _NORMS), ("q_norm", _P), ("k_norm", _P),
                ("cos", _P), ("sin", _P), ("k_pool", _P), ("v_pool", _P), ("kv_dtype", _I64),
                ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64), ("head_dim", _I64),
                ("intermediate", _I64), ("block_size", _I64), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("window", _I64), ("softcap", ctypes.c_float),
                ("activation", _I64)]


class _Step(ctypes.Structure):
    _fields_ = [("rows", _I64), ("positions", _P), ("slots", _P),
                ("table", _P), ("table_stride", _I64), ("row_seq", _P), ("row_len", _P),
                ("x", _P), ("residual", _P), ("h", _P), ("qkv", _P), ("att", _P),
                ("gate_up", _P), ("act", _P)]


class PythonLayerStack:
    """The layers called one by one from Python (any model, device, dtype or backend)."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.layers = layers

    def __call__(self, positions: torch.Tensor, x: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return x, residual


class NativeLayerStack:
    """One native call per layer; steps it cannot take (another attention backend, rows that
    are not float32) go through ``fallback``."""

    def __init__(self, lib: ctypes.CDLL, model: nn.Module, fallback: PythonLayerStack) -> None:
        cfg = model.config
        self._call = lib.rs_decoder_layer
        self._attention, self._mlp = lib.rs_decoder_attention, lib.rs_decoder_mlp
        o_proj = model.layers[0].self_attn.o_proj if len(model.layers) else None
        self._comm = o_proj.comm if isinstance(o_proj, RowParallelLinear) else None
        self._fallback = fallback
        self._model = model
        self._dims = (cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, cfg.q_size,
                      cfg.intermediate_size)
        rotaries = {id(layer.self_attn.rotary): layer.self_attn.rotary for layer in model.layers}
        self._rotaries = list(rotaries.values())  # Gemma: the sliding and the global layers'
        self._layers: list[_Layer] = []
        self._key: tuple | None = None
        self._kv_caches: list | None = None

    @classmethod
    def build(cls, model: nn.Module) -> NativeLayerStack | PythonLayerStack:
        """The native stack where every layer can run natively, else the Python one (the
        choice is logged, once per model)."""
        fallback = PythonLayerStack(model.layers)
        lib = native.load()
        name = model.config.architecture
        if lib is None:
            return fallback
        if not all(hasattr(layer.mlp, "gate_up_proj") for layer in model.layers):
            logger.info("decoder layers of %s: Python layers (sparse MoE blocks have no native "
                        "layer call; their linears still run native kernels)", name)
            return fallback
        if not all(_layer_ok(layer) for layer in model.layers):
            logger.info("decoder layers of %s: Python layers (a piece of a layer has no native "
                        "kernel: float linears, partial rotary or non-float32 norms)", name)
            return fallback
        logger.info("decoder layers of %s: one native call per layer (decoder_layer.cpp)", name)
        return cls(lib, model, fallback)

    def __call__(self, positions: torch.Tensor, x: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx = get_forward_context()
        meta = ctx.attn_metadata
        if not (isinstance(meta, NativeAttentionMetadata) and x.dtype == torch.float32
                and x.is_contiguous() and positions.dtype == torch.int64
                and ctx.kv_caches[0][0].dtype in KV_DTYPE_CODES):
            return self._fallback(positions, x)
        layers = self._layer_structs(ctx.kv_caches, meta.block_size)
        rows = x.shape[0]
        _, qkv_width, q_width, inter = self._dims
        buffers = {"x": x, "residual": torch.empty_like(x), "h": torch.empty_like(x),
                   "qkv": torch.empty(rows, qkv_width), "att": torch.empty(rows, q_width),
                   "gate_up": torch.empty(rows, 2 * inter), "act": torch.empty(rows, inter)}
        step = _Step(rows=rows, positions=positions.data_ptr(), slots=meta.slot_mapping.data_ptr(),
                     table=meta.block_table.data_ptr(), table_stride=meta.block_table.shape[1],
                     row_seq=meta.row_seq.data_ptr(), row_len=meta.row_len.data_ptr(),
                     **{name: t.data_ptr() for name, t in buffers.items()})
        step_ptr = ctypes.addressof(step)
        if rows:
            current = meta
            for i, layer in enumerate(layers):
                layer_meta = ctx.layer_metadata[i]
                if layer_meta is not current:  # another KV group's table (kv_groups.py)
                    step.slots = layer_meta.slot_mapping.data_ptr()
                    step.table = layer_meta.block_table.data_ptr()
                    step.table_stride = layer_meta.block_table.shape[1]
                    current = layer_meta
                layer_ptr = ctypes.addressof(layer)
                if self._comm is None:
                    if self._call(layer_ptr, step_ptr, i == 0):
                        raise RuntimeError(f"native decoder layer {i} failed (memory or shapes)")
                    continue
                # a tensor-parallel rank: sum x over the ranks after each half
                if self._attention(layer_ptr, step_ptr, i == 0):
                    raise RuntimeError(f"native decoder layer {i} failed (memory or shapes)")
                self._comm.all_reduce(x)
                if self._mlp(layer_ptr, step_ptr):
                    raise RuntimeError(f"native decoder layer {i} failed (memory)")
                self._comm.all_reduce(x)
        return x, buffers["residual"]

    def _layer_structs(self, kv_caches: list, block_size: int) -> list[_Layer]:
        """The layers' structs for this KV pool and these rope tables (a runner allocates its
        pool list once; the list is held here, so a new one is never mistaken for it; the
        engine may reset the tables, ``set_context_len``)."""
        key = (block_size, *(r.cos.data_ptr() for r in self._rotaries),
               *(r.sin.data_ptr() for r in self._rotaries))
        if kv_caches is not self._kv_caches or key != self._key:
            self._layers = [_layer_struct(layer, kv, block_size)
                            for layer, kv in zip(self._model.layers, kv_caches)]
            self._kv_caches, self._key = kv_caches, key
        return self._layers


def _layer_ok(layer: nn.Module) -> bool:
    attn, mlp = layer.self_attn, layer.mlp
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    norms = [*_norms(layer).values(), *([attn.q_norm, attn.k_norm] if attn.q_norm else [])]
    # NOTE: the native layer rotates whole heads (rs_rotary); partial rotary stays in Python.
    # It applies one eps to all the layer's norms.
    return (not attn.rotary.is_partial and attn.rotary.cos.is_cpu
            and getattr(mlp, "activation", None) in _ACTIVATIONS
            and all(_linear_ok(m) for m in linears)
            and all(n.weight.dtype == torch.float32 and n.weight.is_cpu
                    and n.eps == layer.input_layernorm.eps for n in norms))


def _norms(layer: nn.Module) -> dict[str, nn.Module]:
    """The layer's norms by their place in decoder_layer.cpp's sequence (``_NORMS``; the layer
    class names them in ``native_norms``)."""
    return {place: getattr(layer, attr) for place, attr in layer.native_norms.items()}


def _linear_ok(m: nn.Module) -> bool:
    m = m.local if isinstance(m, RowParallelLinear) else m
    return isinstance(m, BlockLinear) or (isinstance(m, Int8Linear) and m._native is not None)


def _linear_struct(m: nn.Module) -> _Linear:
    m = m.local if isinstance(m, RowParallelLinear) else m
    if isinstance(m, BlockLinear):  # the parts carry their biases
        return _Linear(1, m.in_features, m.out_features, ctypes.addressof(m.parts), None, None,
                       None, len(m.parts))
    w = m._native
    return _Linear(0, w.k, w.n, w.packed.data_ptr(), w.comp.data_ptr(), w.w_scale.data_ptr(),
                   None if w.bias is None else w.bias.data_ptr(), 0)


def _layer_struct(layer: nn.Module, kv: tuple[torch.Tensor, torch.Tensor],
                  block_size: int) -> _Layer:
    attn, mlp = layer.self_attn, layer.mlp
    k_pool, v_pool = kv
    norms = {place: n.weight.data_ptr() for place, n in _norms(layer).items()}
    qk_norms = ({} if attn.q_norm is None else
                {"q_norm": attn.q_norm.weight.data_ptr(), "k_norm": attn.k_norm.weight.data_ptr()})
    return _Layer(
        qkv=_linear_struct(attn.qkv_proj), o=_linear_struct(attn.o_proj),
        gate_up=_linear_struct(mlp.gate_up_proj), down=_linear_struct(mlp.down_proj),
        **norms, **qk_norms, cos=attn.rotary.cos.data_ptr(), sin=attn.rotary.sin.data_ptr(),
        k_pool=k_pool.data_ptr(), v_pool=v_pool.data_ptr(),
        kv_dtype=KV_DTYPE_CODES[k_pool.dtype],
        hidden=layer.input_layernorm.weight.shape[0], heads=attn.num_heads,
        kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
        intermediate=mlp.down_proj.in_features, block_size=block_size,
        eps=layer.input_layernorm.eps, scale=attn.scale, window=attn.window or 0,
        softcap=attn.softcap or 0.0, activation=_ACTIVATIONS[mlp.activation])

"""The decoder layers of a Llama-family model as one native call each (``decoder_layer.cpp``).

At batch 1 a decode step of the embedded model spent ~40 % of its time in the Python and
ctypes glue around its ~9 kernel calls per layer (~150 us per layer). Where every piece of a
layer runs a native kernel — int8 or GGUF-block linears, the ``cpu_native`` attention backend,
float32 rows, no q/k norms, rope on whole heads — the layer stack here makes one call per layer into the same
kernels, in the same order, on the same buffers: the same bits as the Python layers, which stay
the path for everything else (``PythonLayerStack``).
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
from radixserve.runner.forward_context import get_forward_context

logger = logging.getLogger(__name__)
_P, _I64 = ctypes.c_void_p, ctypes.c_int64


class _Linear(ctypes.Structure):
    _fields_ = [("kind", _I64), ("in_features", _I64), ("out_features", _I64), ("packed", _P),
                ("comp", _P), ("scale", _P), ("bias", _P), ("nparts", _I64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
                ("input_norm", _P), ("post_norm", _P), ("k_pool", _P), ("v_pool", _P),
                ("kv_dtype", _I64), ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64), ("head_dim", _I64),
                ("intermediate", _I64), ("block_size", _I64), ("eps", ctypes.c_float),
                ("scale", ctypes.c_float), ("window", _I64)]


class _Step(ctypes.Structure):
    _fields_ = [("rows", _I64), ("positions", _P), ("cos", _P), ("sin", _P), ("slots", _P),
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
        self._fallback = fallback
        self._model = model
        self._dims = (cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, cfg.q_size,
                      cfg.intermediate_size)
        self._layers: list[_Layer] = []
        self._kv_caches: list | None = None
        self._block_size = 0

    @classmethod
    def build(cls, model: nn.Module) -> NativeLayerStack | PythonLayerStack:
        """The native stack where every layer can run natively, else the Python one."""
        fallback = PythonLayerStack(model.layers)
        lib = native.load()
        if lib is not None and not all(hasattr(layer.mlp, "gate_up_proj")
                                       for layer in model.layers):
            logger.info("decoder layers: Python layers (sparse MoE blocks have no native "
                        "layer call; their linears still run native kernels)")
        ok = lib is not None and all(_layer_ok(layer) for layer in model.layers)
        return cls(lib, model, fallback) if ok else fallback

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
        rotary = self._model.rotary
        step = _Step(rows=rows, positions=positions.data_ptr(), cos=rotary.cos.data_ptr(),
                     sin=rotary.sin.data_ptr(), slots=meta.slot_mapping.data_ptr(),
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
                if self._call(ctypes.addressof(layer), step_ptr, i == 0):
                    raise RuntimeError(f"native decoder layer {i} failed (memory or shapes)")
        return x, buffers["residual"]

    def _layer_structs(self, kv_caches: list, block_size: int) -> list[_Layer]:
        """The layers' structs for this KV pool (a runner allocates its pool list once; the
        list is held here, so a new one is never mistaken for it)."""
        if kv_caches is not self._kv_caches or block_size != self._block_size:
            self._layers = [_layer_struct(layer, kv, block_size)
                            for layer, kv in zip(self._model.layers, kv_caches)]
            self._kv_caches, self._block_size = kv_caches, block_size
        return self._layers


def _layer_ok(layer: nn.Module) -> bool:
    attn, mlp = layer.self_attn, layer.mlp
    if not hasattr(mlp, "gate_up_proj"):  # a sparse MoE block (layers/moe.py): Python only
        return False
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    # NOTE: the native layer rotates whole heads (rs_rotary); partial rotary stays in Python
    return (attn.q_norm is None and not attn.rotary.is_partial
            and attn.softcap is None
            and all(_linear_ok(m) for m in linears)
            and all(w.dtype == torch.float32 and w.is_cpu for w in norms))


def _linear_ok(m: nn.Module) -> bool:
    return isinstance(m, BlockLinear) or (isinstance(m, Int8Linear) and m._native is not None)


def _linear_struct(m: nn.Module) -> _Linear:
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
    return _Layer(
        qkv=_linear_struct(attn.qkv_proj), o=_linear_struct(attn.o_proj),
        gate_up=_linear_struct(mlp.gate_up_proj), down=_linear_struct(mlp.down_proj),
        input_norm=layer.input_layernorm.weight.data_ptr(),
        post_norm=layer.post_attention_layernorm.weight.data_ptr(),
        k_pool=k_pool.data_ptr(), v_pool=v_pool.data_ptr(),
        kv_dtype=KV_DTYPE_CODES[k_pool.dtype],
        hidden=layer.input_layernorm.weight.shape[0], heads=attn.num_heads,
        kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
        intermediate=mlp.down_proj.in_features, block_size=block_size,
        eps=layer.input_layernorm.eps, scale=attn.scale, window=attn.window or 0)

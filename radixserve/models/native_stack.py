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

Which of these run is decided once per model, when its runner is built (``plan_kernels``): the
``KernelPlan`` is plain data on the model (``model.kernel_plan``), logged once, read by the
layers (their ``native`` flags), the layer stack and the engine's start-up line.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from radixserve.kernels import native, ops
from radixserve.layers.attn_backends.cpu_native import NativeAttentionMetadata
from radixserve.layers.block_linear import BlockLinear, tile_note
from radixserve.layers.int8_linear import Int8Linear
from radixserve.layers.layer_progress import layer_done
from radixserve.layers.moe import SparseMoeBlock
from radixserve.layers.norm import RMSNorm
from radixserve.layers.rotary import RotaryEmbedding
from radixserve.layers.row_parallel import RowParallelLinear
from radixserve.layers.forward_context import deepstack_hook, get_forward_context

logger = logging.getLogger(__name__)

ONE_CALL = "one native call per layer"


@dataclass(frozen=True)
class KernelPlan:
    """What computes each piece of a built model (``plan_kernels``)."""

    level: str | None  # the kernel library's level, None where the torch paths run
    linears: str  # what the linears (decoder layers, LM head) compute with
    elementwise: bool  # RMSNorm, rotary on whole heads, SiLU / GELU: the native kernels
    attention: str  # the runner's attention backend: "cpu_native" or "torch"
    python_layers: str | None  # why the layers run one by one from Python; None: ONE_CALL

    @property
    def decoder_layers(self) -> str:
        return ONE_CALL if self.python_layers is None else f"Python layers ({self.python_layers})"

    def startup_line(self, kv_dtype, threads: int) -> str:
        """The engine's one line at start (logged by engine/build.py)."""
        info = native.describe()
        kernels = (f"{info.level} ({info.reason}{', AMX tiles' if info.amx_tiles else ''}"
                   f"{'; ' + info.tuning if info.tuning else ''})"
                   if info.level else f"none ({info.reason})")
        return (f"kernels {kernels}; linears {self.linears}; attention {self.attention}, KV "
                f"cache {str(kv_dtype).removeprefix('torch.')}; decoder layers: "
                f"{self.decoder_layers}; threads {threads}")


def python_layers_reason(level: str | None, attention: str, elementwise: bool,
                         sparse_moe: bool, layers_fit: bool) -> str | None:
    """Why a model's decoder layers run as Python layers, None where one native call per
    layer runs: the one rule for the built model (``plan_kernels``) and ``radixserve env``.
    ``layers_fit``: every linear runs a native kernel (int8, blocks), rope rotates whole heads,
    the layer's norms share one eps and its activation is one decoder_layer.cpp has."""
    if level is None:
        return "no native kernels"
    if not elementwise:
        return "the model is not float32 on the CPU"
    if sparse_moe:
        return ("sparse MoE blocks have no native layer call; their linears still run native "
                "kernels")
    if not layers_fit:
        return "a piece of a layer has no native kernel: float linears or partial rotary"
    if attention != "cpu_native":
        return f"the {attention} attention backend"
    return None


def plan_kernels(model: nn.Module, attention: str) -> KernelPlan:
    """Decide, once for ``model`` (final: loaded, quantized) run with the ``attention``
    backend, what runs natively; set its layers' ``native`` flags and its layer stack, attach
    the plan as ``model.kernel_plan`` and log it (a WARNING where a CPU model falls back to the
    torch paths). Mutates ``model``; call before its first forward."""
    info = native.describe()
    weight = model.norm.weight
    elementwise = native.load() is not None and weight.dtype == torch.float32 and weight.is_cpu
    for m in model.modules():
        if isinstance(m, RotaryEmbedding):
            m.native = elementwise and not m.is_partial
        elif (isinstance(m, RMSNorm | SparseMoeBlock)
              or getattr(type(m), "activation", None) is not None):
            m.native = elementwise  # norms, MLPs (their activation), sigmoid routers
    sparse = not all(hasattr(getattr(layer, "mlp", None), "gate_up_proj")
                     for layer in model.layers)
    own = getattr(model, "layers_in_python", None)  # a family with no native layer call
    fit = not sparse and own is None and all(_layer_fits(layer) for layer in model.layers)
    reason = python_layers_reason(info.level, attention, elementwise, sparse, fit)
    plan = KernelPlan(info.level, _describe_linears(model, info.level), elementwise,
                      attention, own if own is not None and info.level else reason)
    model.kernel_plan = plan
    model._stack = NativeLayerStack.build(model)
    logger.info("kernel plan of %s: linears %s; RMSNorm, rotary, SiLU / GELU %s; attention "
                "%s; decoder layers: %s", model.config.architecture, plan.linears,
                "native" if elementwise else "torch", attention, plan.decoder_layers)
    if weight.is_cpu and not elementwise and "RADIXSERVE_NATIVE_KERNELS=0" not in info.reason:
        logger.warning("%s runs the torch paths on the CPU (%s)", model.config.architecture,
                       plan.python_layers)
    return plan


def _describe_linears(model: nn.Module, level: str | None) -> str:
    """The kinds of the model's linears (the decoder layers' and the LM head), most frequent
    block types first."""
    blocks: Counter[str] = Counter()
    kinds: list[str] = []
    for m in model.modules():
        kind = None
        if isinstance(m, BlockLinear):
            blocks.update(m.types)
        elif isinstance(m, Int8Linear):
            kind = f"int8, native ({level})" if m._native is not None else "int8 (torch)"
        elif isinstance(m, nn.Linear):
            kind = "float (torch)"
        if kind is not None and kind not in kinds:
            kinds.append(kind)
    if blocks and set(blocks) <= {"F16", "BF16"}:
        kinds.insert(0, f"16 bits as stored, float32 activations, native ({level})")
    elif blocks:
        stored = ", ".join(name for name, _ in blocks.most_common())
        kinds.insert(0, f"GGUF blocks as stored ({stored}), native ({level})"
                        f"{tile_note(list(blocks), level)}")
    return " + ".join(kinds) or "none"


class PythonLayerStack:
    """The layers called one by one from Python (any model, device, dtype or backend)."""

    def __init__(self, layers: nn.ModuleList) -> None:
        self.layers = layers

    def __call__(self, positions: torch.Tensor, x: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        residual = None
        deepstack = deepstack_hook()
        for i, layer in enumerate(self.layers):
            x, residual = layer(positions, x, residual)
            if deepstack is not None:
                deepstack(i, x)
            layer_done()
        return x, residual


class NativeLayerStack:
    """One native call per layer (two on a tensor-parallel rank); the model's plan
    guarantees every piece runs natively and the attention backend is ``cpu_native``."""

    def __init__(self, model: nn.Module) -> None:
        cfg = model.config
        o_proj = model.layers[0].self_attn.o_proj if len(model.layers) else None
        self._comm = o_proj.comm if isinstance(o_proj, RowParallelLinear) else None
        self._model = model
        self._widths = (cfg.q_size + 2 * cfg.kv_size, cfg.q_size, cfg.intermediate_size)
        rotaries = {id(layer.self_attn.rotary): layer.self_attn.rotary for layer in model.layers}
        self._rotaries = list(rotaries.values())  # Gemma: the sliding and the global layers'
        self._layers: list[ops.DecoderLayer] = []
        self._key: tuple | None = None
        self._kv_caches: list | None = None

    @classmethod
    def build(cls, model: nn.Module) -> NativeLayerStack | PythonLayerStack:
        """The stack ``model.kernel_plan`` chose (``plan_kernels`` first)."""
        native_layers = model.kernel_plan.python_layers is None
        return cls(model) if native_layers else PythonLayerStack(model.layers)

    def __call__(self, positions: torch.Tensor, x: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx = get_forward_context()
        meta = ctx.attn_metadata
        assert isinstance(meta, NativeAttentionMetadata), "the plan runs cpu_native attention"
        layers = self._layer_structs(ctx.kv_caches, meta.block_size)
        step = ops.DecoderStep(x, positions, meta, self._widths)
        deepstack = deepstack_hook()
        if x.shape[0]:
            current = meta
            for i, layer in enumerate(layers):
                layer_meta = ctx.layer_metadata[i]
                if layer_meta is not current:  # another KV group's table (kv_groups.py)
                    step.set_table(layer_meta)
                    current = layer_meta
                if self._comm is None:
                    if step.layer(layer, i == 0):
                        raise RuntimeError(f"native decoder layer {i} failed (memory or shapes)")
                    if deepstack is not None:  # (x: the layer's output, before the residual)
                        deepstack(i, x)
                    layer_done()
                    continue
                # a tensor-parallel rank: sum x over the ranks after each half
                if step.attention(layer, i == 0):
                    raise RuntimeError(f"native decoder layer {i} failed (memory or shapes)")
                self._comm.all_reduce(x)
                if step.mlp(layer):
                    raise RuntimeError(f"native decoder layer {i} failed (memory)")
                self._comm.all_reduce(x)
                layer_done()
        return x, step.residual

    def _layer_structs(self, kv_caches: list, block_size: int) -> list[ops.DecoderLayer]:
        """The layers' structs for this KV pool and these rope tables (a runner allocates its
        pool list once; the list is held here, so a new one is never mistaken for it; the
        engine may reset the tables, ``set_context_len``, which makes new tensors)."""
        key = (block_size, *(t for r in self._rotaries for t in (r.cos, r.sin)))
        if (kv_caches is not self._kv_caches or self._key is None or len(key) != len(self._key)
                or any(a is not b for a, b in zip(key, self._key))):
            self._layers = [_layer_struct(layer, kv, block_size)
                            for layer, kv in zip(self._model.layers, kv_caches)]
            self._kv_caches, self._key = kv_caches, key
        return self._layers


def _layer_fits(layer: nn.Module) -> bool:
    attn, mlp = layer.self_attn, layer.mlp
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    norms = [*_norms(layer).values(), *([attn.q_norm, attn.k_norm] if attn.q_norm else [])]
    # NOTE: the native layer rotates whole heads (rs_rotary); partial rotary stays in Python.
    # It applies one eps to all the layer's norms.
    return (not attn.rotary.is_partial and getattr(mlp, "activation", None) in ops.ACTIVATIONS
            and all(_native_weight(m) is not None for m in linears)
            and all(n.eps == layer.input_layernorm.eps for n in norms))


def _norms(layer: nn.Module) -> dict[str, nn.Module]:
    """The layer's norms by their place in decoder_layer.cpp's sequence (``ops.NORM_PLACES``;
    the layer class names them in ``native_norms``)."""
    return {place: getattr(layer, attr) for place, attr in layer.native_norms.items()}


def _native_weight(m: nn.Module) -> ops.Int8Weight | ops.BlockWeight | None:
    """The kernel handle of a linear that runs natively (int8, blocks), else None."""
    m = m.local if isinstance(m, RowParallelLinear) else m
    return m._native if isinstance(m, (BlockLinear, Int8Linear)) else None


def _layer_struct(layer: nn.Module, kv: tuple[torch.Tensor, torch.Tensor],
                  block_size: int) -> ops.DecoderLayer:
    attn, mlp = layer.self_attn, layer.mlp
    norms = {place: n.weight for place, n in _norms(layer).items()}
    if attn.q_norm is not None:
        norms.update(q_norm=attn.q_norm.weight, k_norm=attn.k_norm.weight)
    linears = {"qkv": attn.qkv_proj, "o": attn.o_proj, "gate_up": mlp.gate_up_proj,
               "down": mlp.down_proj}
    shape = {"hidden": layer.input_layernorm.weight.shape[0], "heads": attn.num_heads,
             "kv_heads": attn.num_kv_heads, "head_dim": attn.head_dim,
             "intermediate": mlp.down_proj.in_features, "block_size": block_size}
    return ops.decoder_layer({name: _native_weight(m) for name, m in linears.items()}, norms,
                             attn.rotary.cos, attn.rotary.sin, kv, shape,
                             layer.input_layernorm.eps, attn.scale, attn.window, attn.softcap,
                             mlp.activation)

"""The one boundary between tensors and the native CPU kernels (loaded by ``native.py``).

Every call into the kernel library goes through a function here, one per kernel entry the
layers use: it takes tensors (and plain numbers), checks each argument's dtype, shape, layout
and device with O(1) attribute reads (no tensor ops: this is the per-layer, per-step hot path),
raising a TypeError (dtype) or ValueError (shape, layout, device) naming the kernel and the
argument, and only then hands the raw pointers to the library. No other module takes a
``data_ptr()``. Weights are packed once into handles (``Int8Weight``, ``BlockWeight``) that
keep their tensors alive with their pointers taken once.

Whether a layer calls these at all is decided once per model when it is built
(``models/native_stack.py``, ``KernelPlan``); a call here with the kernels not loaded is a
RuntimeError.
"""

from __future__ import annotations

import ctypes

import torch

from radixserve.kernels import native

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
_F32, _I32, _I64T = torch.float32, torch.int32, torch.int64

# The pool element codes of rs_paged_attention (paged_attention.cpp).
KV_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int8: 3}


def _lib() -> ctypes.CDLL:
    lib = native.load()
    if lib is None:
        raise RuntimeError("the native CPU kernels are not loaded (radixserve env says why)")
    return lib


def _check(kernel: str, name: str, t: torch.Tensor, dtype: torch.dtype | None, dim: int,
           layout: str = "contiguous") -> None:
    """``t`` is a CPU tensor of ``dtype`` (None: any) with ``dim`` dimensions, laid out as
    ``layout`` says: "contiguous", "heads" ([T, heads, d], each row's heads contiguous, a row
    stride of its own) or "any"."""
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{kernel}: {name} must be {dtype}, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{kernel}: {name} must have {dim} dimensions, got shape "
                         f"{tuple(t.shape)}")
    if not t.is_cpu:
        raise ValueError(f"{kernel}: {name} must be on the CPU, got {t.device}")
    if layout == "contiguous" and not t.is_contiguous():
        raise ValueError(f"{kernel}: {name} must be contiguous")
    if layout == "heads" and not (t.stride(2) == 1 and t.stride(1) == t.shape[2]):
        raise ValueError(f"{kernel}: {name} must have each row's heads contiguous, got "
                         f"strides {t.stride()}")


def _same(kernel: str, what: str, got: int, want: int) -> None:
    if got != want:
        raise ValueError(f"{kernel}: {what} is {got}, expected {want}")


# -- elementwise and norms (layer_ops.cpp) ----------------------------------------------------

def glu(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(gate) * up`` of float32 rows [M, 2I] → [M, I]; ``activation`` "silu" or
    "gelu_tanh" (rs_silu_mul, rs_gelu_tanh_mul)."""
    kernel = "rs_silu_mul" if activation == "silu" else "rs_gelu_tanh_mul"
    _check(kernel, "gate_up", gate_up, _F32, 2)
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2)
    getattr(_lib(), kernel)(gate_up.data_ptr(), rows, width // 2, out.data_ptr())
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of float32 rows [M, K] (rs_rms_norm) into a new tensor."""
    _check("rs_rms_norm", "x", x, _F32, 2)
    _check("rs_rms_norm", "weight", weight, _F32, 1)
    rows, dim = x.shape
    _same("rs_rms_norm", "the weight's size", weight.shape[0], dim)
    out = torch.empty_like(x)
    _lib().rs_rms_norm(x.data_ptr(), dim, weight.data_ptr(), rows, dim, eps, out.data_ptr(), dim)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """``norm(x + residual)`` of float32 rows [M, K]; the sum is written into ``residual``
    (rs_add_rms_norm)."""
    _check("rs_add_rms_norm", "x", x, _F32, 2)
    _check("rs_add_rms_norm", "residual", residual, _F32, 2)
    _check("rs_add_rms_norm", "weight", weight, _F32, 1)
    rows, dim = x.shape
    _same("rs_add_rms_norm", "residual's shape", tuple(residual.shape), (rows, dim))
    _same("rs_add_rms_norm", "the weight's size", weight.shape[0], dim)
    out = torch.empty_like(x)
    _lib().rs_add_rms_norm(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), rows, dim, eps,
                           out.data_ptr())
    return out


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each head of float32 ``x`` [T, heads, d] (each row's heads contiguous) into
    a contiguous tensor (rs_head_rms_norm)."""
    _check("rs_head_rms_norm", "x", x, _F32, 3, "heads")
    _check("rs_head_rms_norm", "weight", weight, _F32, 1)
    rows, heads, dim = x.shape
    _same("rs_head_rms_norm", "the weight's size", weight.shape[0], dim)
    out = torch.empty(rows, heads, dim)
    _lib().rs_head_rms_norm(x.data_ptr(), x.stride(0), weight.data_ptr(), rows, heads, dim, eps,
                            out.data_ptr(), heads * dim)
    return out


def rotary_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor) -> None:
    """Rotate float32 q [T, H, d] and k [T, KVH, d] (heads contiguous) in place by the rows
    ``positions`` (int64 [T]) of the tables cos / sin [context, d] (rs_rotary). The caller
    keeps positions inside the tables (``RotaryEmbedding.check_positions``)."""
    _check("rs_rotary", "q", q, _F32, 3, "heads")
    _check("rs_rotary", "k", k, _F32, 3, "heads")
    _check("rs_rotary", "positions", positions, _I64T, 1)
    _check("rs_rotary", "cos", cos, _F32, 2)
    _check("rs_rotary", "sin", sin, _F32, 2)
    rows, heads, dim = q.shape
    _same("rs_rotary", "k's rows and head size", (k.shape[0], k.shape[2]), (rows, dim))
    _same("rs_rotary", "the number of positions", positions.shape[0], rows)
    _same("rs_rotary", "the tables' width", cos.shape[1], dim)
    _lib().rs_rotary(q.data_ptr(), q.stride(0), heads, k.data_ptr(), k.stride(0), k.shape[1],
                     rows, dim, positions.data_ptr(), cos.data_ptr(), sin.data_ptr())


def apply_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: ``logits[rows[i], t] = -inf`` where bit t of int32 ``bitmask`` row i is 0
    (rs_apply_bitmask); float32 logits [B, V], int64 rows [R], bitmask [R, words]."""
    _check("rs_apply_bitmask", "logits", logits, _F32, 2)
    _check("rs_apply_bitmask", "rows", rows, _I64T, 1)
    _check("rs_apply_bitmask", "bitmask", bitmask, _I32, 2)
    _same("rs_apply_bitmask", "the number of rows", rows.shape[0], bitmask.shape[0])
    if bitmask.shape[0]:
        _lib().rs_apply_bitmask(logits.data_ptr(), logits.shape[1], rows.data_ptr(),
                                bitmask.shape[0], bitmask.data_ptr(), bitmask.shape[1],
                                logits.shape[1])


# -- LoRA (lora.cpp) --------------------------------------------------------------------------

class LoraSlots:
    """One linear's adapter matrices per slot, pointers taken once: ``(A [r, K], B [N, r])``
    float32 contiguous (the scale folded into B), or None where that slot's adapter leaves the
    linear alone. Keeps the tensors alive while the handle is."""

    def __init__(self, slots: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        num, k, n = len(slots), None, None
        a_ptrs, b_ptrs, ranks = (ctypes.c_int64 * num)(), (ctypes.c_int64 * num)(), \
            (ctypes.c_int64 * num)()
        for s, pair in enumerate(slots):
            if pair is None:
                continue
            a, b = pair
            _check("rs_lora_shrink", "A", a, _F32, 2)
            _check("rs_lora_expand", "B", b, _F32, 2)
            k, n = k or a.shape[1], n or b.shape[0]
            _same("rs_lora_shrink", "A's width", a.shape[1], k)
            _same("rs_lora_expand", "B's shape", tuple(b.shape), (n, a.shape[0]))
            a_ptrs[s], b_ptrs[s], ranks[s] = a.data_ptr(), b.data_ptr(), a.shape[0]
        self.slots, self.num_slots = slots, num
        self.in_features, self.out_features = k, n
        self.max_rank = max(ranks, default=0)
        self.a_ptrs, self.b_ptrs, self.ranks = a_ptrs, b_ptrs, ranks


def lora_add_(x: torch.Tensor, y: torch.Tensor, row_slot: torch.Tensor,
              slots: LoraSlots) -> torch.Tensor:
    """In place: ``y[m] += B_s (A_s x[m])`` with s = ``row_slot[m]`` (int32 [M]; -1, or a slot
    that is None, leaves the row alone); float32 x [M, K], y [M, N], each row contiguous
    (rs_lora_shrink, then rs_lora_expand). A row's result does not depend on the other rows."""
    _check("rs_lora_shrink", "x", x, _F32, 2, "any")
    _check("rs_lora_expand", "y", y, _F32, 2, "any")
    _check("rs_lora_shrink", "row_slot", row_slot, _I32, 1)
    rows = x.shape[0]
    if x.stride(1) != 1 or y.stride(1) != 1:
        raise ValueError(f"rs_lora_shrink: x and y must have contiguous rows, got strides "
                         f"{x.stride()} and {y.stride()}")
    _same("rs_lora_expand", "y's rows", y.shape[0], rows)
    _same("rs_lora_shrink", "the number of row slots", row_slot.shape[0], rows)
    if slots.in_features is None or not rows:
        return y
    _same("rs_lora_shrink", "x's width", x.shape[1], slots.in_features)
    _same("rs_lora_expand", "y's width", y.shape[1], slots.out_features)
    t = torch.empty(rows, slots.max_rank)
    lib = _lib()
    lib.rs_lora_shrink(x.data_ptr(), x.stride(0), rows, x.shape[1], row_slot.data_ptr(),
                       slots.a_ptrs, slots.ranks, slots.num_slots, t.data_ptr(), slots.max_rank)
    lib.rs_lora_expand(t.data_ptr(), slots.max_rank, rows, y.shape[1], row_slot.data_ptr(),
                       slots.b_ptrs, slots.ranks, None, slots.num_slots, y.data_ptr(),
                       y.stride(0))
    return y


# -- attention (paged_attention.cpp) ----------------------------------------------------------

def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor,
                    v_pool: torch.Tensor, meta, scale: float, window: int | None,
                    softcap: float | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of float32 q [T, H, d] over the pool, after writing k / v [T, KVH, d] at
    ``meta.slot_mapping`` (rs_paged_attention) → [T, H, d]. ``meta``: the backend's
    ``NativeAttentionMetadata`` (int64 slots, block table, row sequence, length, position);
    ``sinks``: float32 [H], each head's sink logit in its softmax denominator (gpt-oss)."""
    kernel = "rs_paged_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check(kernel, name, t, _F32, 3, "heads")
    for name, t in (("k_pool", k_pool), ("v_pool", v_pool)):
        _check(kernel, name, t, None, 4)
        if t.dtype not in KV_DTYPE_CODES:
            raise TypeError(f"{kernel}: {name} must be one of {list(KV_DTYPE_CODES)}, got "
                            f"{t.dtype}")
    rows, heads, dim = q.shape
    for name, t in (("slot_mapping", meta.slot_mapping), ("row_seq", meta.row_seq),
                    ("row_len", meta.row_len), ("row_pos", meta.row_pos)):
        if t is not None:  # (row_pos: None where each row's limit is its position + 1)
            _check(kernel, name, t, _I64T, 1)
            _same(kernel, f"{name}'s length", t.shape[0], rows)
    _check(kernel, "block_table", meta.block_table, _I64T, 2)
    _same(kernel, "k's and v's rows", (k.shape[0], v.shape[0]), (rows, rows))
    if sinks is not None:
        _check(kernel, "sinks", sinks, _F32, 1)
        _same(kernel, "sinks' length", sinks.shape[0], heads)
    out = torch.empty(rows, heads, dim)
    if rows and _lib().rs_paged_attention(
            q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
            meta.slot_mapping.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(),
            KV_DTYPE_CODES[k_pool.dtype], meta.block_table.data_ptr(), meta.block_table.shape[1],
            meta.row_seq.data_ptr(), meta.row_len.data_ptr(),
            None if meta.row_pos is None else meta.row_pos.data_ptr(), rows, heads,
            k_pool.shape[2], dim,
            meta.block_size, scale, window or 0, softcap or 0.0,
            None if sinks is None else sinks.data_ptr(), out.data_ptr()):
        raise RuntimeError("native paged attention failed (shape or memory)")
    return out


# -- linears (int8_linear.cpp, block_linear.cpp) ----------------------------------------------

class Int8Weight:
    """An int8 matrix [N, K] (per-channel ``w_scale`` [N], optional float32 ``bias``) packed
    in the kernel's layout (rs_int8_pack); its pointers are taken once."""

    def __init__(self, qweight: torch.Tensor, w_scale: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        _check("rs_int8_pack", "qweight", qweight, torch.int8, 2, "any")
        n, k = qweight.shape
        n16, k64 = -(-n // 16), -(-k // 64)
        self.packed = torch.empty(n16 * k64 * 64 * 16, dtype=torch.int8)
        self.comp = torch.empty(n16 * 16, dtype=torch.int32)
        qweight = qweight.contiguous()
        _lib().rs_int8_pack(qweight.data_ptr(), n, k, self.packed.data_ptr(),
                            self.comp.data_ptr())
        self.w_scale = torch.zeros(n16 * 16, dtype=torch.float32)
        self.w_scale[:n] = w_scale
        self.bias = None if bias is None else bias.float().contiguous()
        self.n, self.k = n, k
        self.args = (self.packed.data_ptr(), self.comp.data_ptr(), self.w_scale.data_ptr(),
                     None if bias is None else self.bias.data_ptr(), n)


def int8_linear(x: torch.Tensor, weight: Int8Weight) -> torch.Tensor:
    """float32 rows ``x`` [M, K] → [M, N] (rs_int8_linear)."""
    _check("rs_int8_linear", "x", x, _F32, 2)
    _same("rs_int8_linear", "x's width", x.shape[1], weight.k)
    m = x.shape[0]
    y = torch.empty(m, weight.n, dtype=torch.float32)
    if m and _lib().rs_int8_linear(x.data_ptr(), m, weight.k, *weight.args, y.data_ptr(),
                                   weight.n):
        raise MemoryError("native int8 linear: scratch allocation failed")
    return y


class BlockPart(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int64), ("packed", ctypes.c_void_p), ("n", ctypes.c_int64),
                ("bias", ctypes.c_void_p)]


class BlockWeight:
    """The packed parts of a block linear (block_linear.cpp: one per run of one format, side
    by side in the output) and their biases, as the kernel's part descriptors."""

    def __init__(self, parts: list[tuple[int, torch.Tensor, int]], in_features: int,
                 bias: torch.Tensor | None) -> None:
        """``parts``: (format id, packed uint8 bytes, output rows) in output order; ``bias``
        float32 [sum of rows] or None."""
        structs, row = [], 0
        for fmt, packed, n in parts:
            _check("rs_block_linear", "packed", packed, torch.uint8, 1)
            bias_ptr = None if bias is None else bias[row:].data_ptr()
            structs.append(BlockPart(fmt, packed.data_ptr(), n, bias_ptr))
            row += n
        if bias is not None:
            _check("rs_block_linear", "bias", bias, _F32, 1)
            _same("rs_block_linear", "the bias's size", bias.shape[0], row)
        self.tensors = (bias, *(packed for _, packed, _ in parts))  # kept alive
        self.parts = (BlockPart * len(structs))(*structs)
        self.in_features, self.out_features = in_features, row


def block_linear(x: torch.Tensor, weight: BlockWeight) -> torch.Tensor:
    """float32 rows ``x`` [M, K] → [M, N] (rs_block_linear)."""
    _check("rs_block_linear", "x", x, _F32, 2)
    _same("rs_block_linear", "x's width", x.shape[1], weight.in_features)
    m = x.shape[0]
    y = torch.empty(m, weight.out_features, dtype=torch.float32)
    if m and _lib().rs_block_linear(x.data_ptr(), m, weight.in_features, weight.parts,
                                    len(weight.parts), y.data_ptr(), weight.out_features):
        raise MemoryError("native block linear: scratch allocation failed")
    return y


def block_pack(fmt: int, raw: torch.Tensor, k: int, out: torch.Tensor) -> torch.Tensor:
    """A matrix's GGUF blocks ``raw`` uint8 [N, bytes per row] of format id ``fmt`` → ``out``
    (uint8, rs_block_packed_bytes of them), block_linear.cpp's layout (rs_block_pack)."""
    raw = raw.contiguous()
    _check("rs_block_pack", "raw", raw, torch.uint8, 2)
    _check("rs_block_pack", "out", out, torch.uint8, 1)
    _same("rs_block_pack", "the packed size", out.numel(),
          _lib().rs_block_packed_bytes(fmt, raw.shape[0], k))
    if _lib().rs_block_pack(fmt, raw.data_ptr(), raw.shape[0], k, out.data_ptr()):
        raise ValueError(f"native block pack: format {fmt} cannot hold rows of {k} weights")
    return out


# -- the decoder layer in one call (decoder_layer.cpp) ----------------------------------------

class _Linear(ctypes.Structure):
    _fields_ = [("kind", _I64), ("in_features", _I64), ("out_features", _I64), ("packed", _P),
                ("comp", _P), ("scale", _P), ("bias", _P), ("nparts", _I64)]


NORM_PLACES = ("input_norm", "post_norm", "attn_out_norm", "mlp_out_norm")
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # decoder_layer.cpp's Activation


class DecoderLayer(ctypes.Structure):
    """One layer's weights, tables and pools as decoder_layer.cpp reads them; the tensors
    stay owned by the model and the runner's pool (built once per pool and tables)."""

    _fields_ = [("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
                *((name, _P) for name in NORM_PLACES), ("q_norm", _P), ("k_norm", _P),
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


def _linear_struct(w: Int8Weight | BlockWeight) -> _Linear:
    if isinstance(w, BlockWeight):  # the parts carry their biases
        return _Linear(1, w.in_features, w.out_features, ctypes.addressof(w.parts), None, None,
                       None, len(w.parts))
    return _Linear(0, w.k, w.n, w.packed.data_ptr(), w.comp.data_ptr(), w.w_scale.data_ptr(),
                   None if w.bias is None else w.bias.data_ptr(), 0)


def decoder_layer(linears: dict[str, Int8Weight | BlockWeight], norms: dict[str, torch.Tensor],
                  cos: torch.Tensor, sin: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                  shape: dict[str, int], eps: float, scale: float, window: int | None,
                  softcap: float | None, activation: str) -> DecoderLayer:
    """The struct of one layer: ``linears`` qkv, o, gate_up, down; ``norms`` float32 weights
    by place (``NORM_PLACES``, plus q_norm and k_norm where the layer has them); rope tables;
    the layer's (k, v) pool; ``shape``: hidden, heads, kv_heads, head_dim, intermediate,
    block_size."""
    kernel = "rs_decoder_layer"
    for name, t in norms.items():
        _check(kernel, name, t, _F32, 1)
    _check(kernel, "cos", cos, _F32, 2)
    _check(kernel, "sin", sin, _F32, 2)
    k_pool, v_pool = kv
    for name, t in (("k_pool", k_pool), ("v_pool", v_pool)):
        _check(kernel, name, t, None, 4)
    if k_pool.dtype not in KV_DTYPE_CODES or v_pool.dtype != k_pool.dtype:
        raise TypeError(f"{kernel}: the pools must be one of {list(KV_DTYPE_CODES)}, got "
                        f"{k_pool.dtype} and {v_pool.dtype}")
    return DecoderLayer(
        **{name: _linear_struct(w) for name, w in linears.items()},
        **{name: t.data_ptr() for name, t in norms.items()}, cos=cos.data_ptr(),
        sin=sin.data_ptr(), k_pool=k_pool.data_ptr(), v_pool=v_pool.data_ptr(),
        kv_dtype=KV_DTYPE_CODES[k_pool.dtype], **shape, eps=eps, scale=scale,
        window=window or 0, softcap=softcap or 0.0, activation=ACTIVATIONS[activation])


class DecoderStep:
    """One forward's rows through the native decoder layers: ``x`` float32 [rows, hidden]
    (the input, then each layer's output, in place), int64 ``positions`` [rows], the
    attention metadata ``meta`` of the first layer; the scratch buffers are allocated here."""

    def __init__(self, x: torch.Tensor, positions: torch.Tensor, meta,
                 widths: tuple[int, int, int]) -> None:
        """``widths``: the qkv output, the attention output and the MLP's intermediate size."""
        kernel = "rs_decoder_layer"
        _check(kernel, "x", x, _F32, 2)
        _check(kernel, "positions", positions, _I64T, 1)
        rows = x.shape[0]
        _same(kernel, "the number of positions", positions.shape[0], rows)
        for name, t in (("row_seq", meta.row_seq), ("row_len", meta.row_len)):
            _check(kernel, name, t, _I64T, 1)
            _same(kernel, f"{name}'s length", t.shape[0], rows)
        qkv_width, q_width, inter = widths
        self.buffers = {"x": x, "residual": torch.empty_like(x), "h": torch.empty_like(x),
                        "qkv": torch.empty(rows, qkv_width), "att": torch.empty(rows, q_width),
                        "gate_up": torch.empty(rows, 2 * inter), "act": torch.empty(rows, inter)}
        self._step = _Step(rows=rows, positions=positions.data_ptr(),
                           row_seq=meta.row_seq.data_ptr(), row_len=meta.row_len.data_ptr(),
                           **{name: t.data_ptr() for name, t in self.buffers.items()})
        self._ptr = ctypes.addressof(self._step)
        self._lib = _lib()
        self.set_table(meta)

    @property
    def residual(self) -> torch.Tensor:
        return self.buffers["residual"]

    def set_table(self, meta) -> None:
        """Read the pool through ``meta``'s slots and block table from now on (another KV
        group's, core/kv/kv_groups.py)."""
        kernel = "rs_decoder_layer"
        _check(kernel, "slot_mapping", meta.slot_mapping, _I64T, 1)
        _same(kernel, "slot_mapping's length", meta.slot_mapping.shape[0], self._step.rows)
        _check(kernel, "block_table", meta.block_table, _I64T, 2)
        self._step.slots = meta.slot_mapping.data_ptr()
        self._step.table = meta.block_table.data_ptr()
        self._step.table_stride = meta.block_table.shape[1]

    def layer(self, layer: DecoderLayer, first: bool) -> int:
        """The whole layer (rs_decoder_layer); nonzero on failure."""
        return self._lib.rs_decoder_layer(ctypes.addressof(layer), self._ptr, first)

    def attention(self, layer: DecoderLayer, first: bool) -> int:
        """Its attention half, up to the o projection (rs_decoder_attention)."""
        return self._lib.rs_decoder_attention(ctypes.addressof(layer), self._ptr, first)

    def mlp(self, layer: DecoderLayer) -> int:
        """Its MLP half (rs_decoder_mlp)."""
        return self._lib.rs_decoder_mlp(ctypes.addressof(layer), self._ptr)

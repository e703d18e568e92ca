"""One tensor-parallel rank's share of a Llama-family model (Megatron-style).

    layer input x (every rank the same) ──▶ q/k/v   column-parallel: this rank's heads' rows
                                            attention on its heads (its KV heads in its pool)
                                            o       row-parallel: the columns of its heads
                                        ◀── all-reduce (sum over the ranks)
                                            gate/up column-parallel: its slice of the MLP width
                                            down    row-parallel: the same slice's columns
                                        ◀── all-reduce

Rank r of N keeps rows ``[r n/N, (r+1) n/N)`` of q, k, v (weights and biases) and of gate and up,
and those input columns of o and down; a row-parallel bias stays on rank 0 (it must be added
once). Everything else is replicated: the embedding, the norms (Qwen3's q/k norms are per head
dim), the LM head (rank 0 samples from the full logits; a vocab split would add a gather per
step for a head that is one matrix). Quantized matrices split as stored: whole rows of any
type, input columns only at block boundaries (32 weights for Q4_0 ... Q8_0, 256 for the K-quants,
any for F16 / BF16), which ``check_tp_size`` verifies before anything loads.

``TensorShard()`` (rank 0 of 1) keeps everything: the loaders call it unconditionally.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from radixserve.model_config import ModelConfig

TP_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                    "Qwen3ForCausalLM")
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # output rows split
_ROW = ("o_proj", "down_proj")  # input columns split, summed by an all-reduce
_K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
_HALF = ("F16", "BF16", "F32", "F64")


@dataclass(frozen=True)
class TensorShard:
    """Rank ``rank`` of ``size``; ``comm`` sums a row-parallel layer's output over the ranks
    (a parallel/comm.py object; None for one rank)."""

    rank: int = 0
    size: int = 1
    comm: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def is_split(self) -> bool:
        return self.size > 1

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The shape this rank builds: its heads, KV heads and MLP width."""
        if not self.is_split:
            return cfg
        return dataclasses.replace(cfg, num_heads=cfg.num_heads // self.size,
                                   num_kv_heads=cfg.num_kv_heads // self.size,
                                   intermediate_size=cfg.intermediate_size // self.size)

    def take(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of the float tensor ``name`` (a Hugging Face name, with or without
        ``model.``): rows of a column-parallel weight or bias, columns of a row-parallel
        weight, zeros for a row-parallel bias off rank 0, else the whole tensor."""
        kind = _kind(name)
        if not self.is_split or kind is None:
            return tensor
        if kind == "row":
            if name.endswith(".bias"):
                return tensor if self.rank == 0 else torch.zeros_like(tensor)
            return tensor[:, self._part(tensor.shape[1])]
        return tensor[self._part(tensor.shape[0])]

    def take_stored(self, name: str, raw: torch.Tensor, k: int, block: int,
                    type_size: int) -> tuple[torch.Tensor, int]:
        """This rank's part of a matrix in its stored bytes ``raw`` [n, k / block * type_size]
        (``block`` weights in ``type_size`` bytes) and its input size: whole rows, or the
        columns of whole blocks."""
        kind = _kind(name)
        if not self.is_split or kind is None:
            return raw, k
        if kind == "column":
            return raw[self._part(raw.shape[0])], k
        local = k // self.size
        assert local % block == 0, f"{name}: {local} columns are not whole blocks of {block}"
        start = self.rank * local // block * type_size
        return raw[:, start:start + local // block * type_size], local

    def _part(self, n: int) -> slice:
        assert n % self.size == 0, f"{n} does not split into {self.size}"
        step = n // self.size
        return slice(self.rank * step, (self.rank + 1) * step)

    def wrap_row_parallel_(self, model: torch.nn.Module) -> torch.nn.Module:
        """Put each layer's o and down projection behind its all-reduce (after loading: the
        loaders find the linears by their names)."""
        if not self.is_split:
            return model
        from radixserve.layers.row_parallel import RowParallelLinear

        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.o_proj = RowParallelLinear(attn.o_proj, self.comm)
            mlp.down_proj = RowParallelLinear(mlp.down_proj, self.comm)
        return model


def _kind(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) < 2:
        return None
    module = parts[-2] if parts[-1] in ("weight", "bias") else parts[-1]
    return "column" if module in _COLUMN else "row" if module in _ROW else None


def valid_tp_sizes(cfg: ModelConfig, k_multiple: int = 1) -> list[int]:
    """The tensor-parallel sizes this model splits into: dividing its attention heads, KV heads
    and MLP width, with each rank's o / down input a multiple of ``k_multiple`` (the stored
    block)."""
    common = math.gcd(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size)
    return [n for n in range(1, common + 1) if common % n == 0
            and (cfg.q_size // n) % k_multiple == 0
            and (cfg.intermediate_size // n) % k_multiple == 0]


def check_tp_size(cfg: ModelConfig, size: int, reader=None) -> None:
    """ValueError unless ``size`` ranks can split this model (``reader``: its GGUF file, whose
    stored o / down blocks bound where their columns may split)."""
    if size == 1:
        return
    if cfg.architecture not in TP_ARCHITECTURES or cfg.moe is not None:
        raise ValueError(f"tensor parallel supports dense {', '.join(TP_ARCHITECTURES)} models, "
                         f"not {cfg.architecture}{' (MoE)' if cfg.moe is not None else ''}")
    if len({cfg.layer_window(i) for i in range(cfg.num_layers)}) > 1:
        # several KV groups: the step message (engine/tp/runner.py) carries one block table a seq
        raise ValueError("tensor parallel does not split a model whose layers mix sliding-"
                         "window and full attention (several KV groups)")
    block = row_parallel_block(reader)
    valid = valid_tp_sizes(cfg, block)
    if size not in valid:
        blocks = f", stored in blocks of {block} weights" if block > 1 else ""
        raise ValueError(
            f"--tensor-parallel-size {size} does not split this model ({cfg.num_heads} "
            f"attention heads, {cfg.num_kv_heads} KV heads, MLP width "
            f"{cfg.intermediate_size}{blocks}); valid sizes: {', '.join(map(str, valid))}")


def row_parallel_block(reader) -> int:
    """The block size the o / down matrices of a GGUF file are stored in (1: a float file)."""
    if reader is None:
        return 1
    block = 1
    for t in reader.tensors:
        if t.name.endswith(("attn_output.weight", "ffn_down.weight")):
            name = t.tensor_type.name
            need = 1 if name in _HALF else 256 if name in _K_QUANTS else 32
            block = max(block, need)
    return block

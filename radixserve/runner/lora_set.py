"""The runner's resident LoRA adapters, by id, and the step's `LoraBatch` built from them.

The runner starts with `NO_LORAS` (no adapter ever loaded: no per-step work at all); the first
``add`` swaps in a `LoraSet`, which hooks the model (layers/lora.py). Ids are the engine's
(engine/lora_registry.py); the scheduled sequences carry them (``ScheduledSeq.lora_id``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from radixserve.layers.forward_context import NO_LORA, get_forward_context
from radixserve.layers.lora import LoraBatch
from radixserve.models.lora import LoraAdapter, load_lora
from radixserve.models.native_stack import NativeLayerStack, PythonLayerStack

logger = logging.getLogger(__name__)

LORA_LINEARS = {"self_attn": ("qkv_proj", "o_proj"), "mlp": ("gate_up_proj", "down_proj")}


class NoLoras:
    """No adapter loaded: every step is a plain one."""

    def batch(self, seqs, device: torch.device):
        return NO_LORA


NO_LORAS = NoLoras()


class LoraSet:
    """Adapters resident in the runner; ``add`` / ``remove`` mutate it between steps."""

    def __init__(self, model: torch.nn.Module) -> None:
        install_lora_hooks(model)
        self.model = model
        self.adapters: dict[int, LoraAdapter] = {}

    def add(self, lora_id: int, path: str) -> LoraAdapter:
        """Load the adapter at ``path`` as ``lora_id``; ValueError / FileNotFoundError when it
        does not fit the model (nothing changes then)."""
        weight = self.model.norm.weight
        dtype = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) and \
            weight.is_cpu else weight.dtype
        adapter = load_lora(path, self.model.config, weight.device, dtype)
        self.adapters[lora_id] = adapter
        return adapter

    def remove(self, lora_id: int) -> None:
        self.adapters.pop(lora_id, None)

    def batch(self, seqs, device: torch.device):
        """The step's `LoraBatch` for the packed ``seqs`` (their token rows in order): one
        group per adapter present, in id order, with its token rows; `NO_LORA` when no
        sequence has one. KeyError for an id that is not resident (an engine bug)."""
        ids = [s.lora_id for s in seqs]
        present = set(ids) - {None}
        if not present:
            return NO_LORA
        q_lens = [s.num_tokens for s in seqs]
        per_row = np.repeat(np.array([-1 if i is None else i for i in ids]), q_lens)
        groups = [(self.adapters[lora_id].layers, np.flatnonzero(per_row == lora_id))
                  for lora_id in sorted(present)]
        return LoraBatch.build(groups, len(per_row), device)


class LoraLayerStack:
    """The model's layer stack once an adapter is loaded: its own stack for steps without
    adapter rows, the Python layers (with the hooks) for steps with some."""

    def __init__(self, plain: Callable, python: Callable) -> None:
        self.plain, self.python = plain, python

    def __call__(self, positions: torch.Tensor, x: torch.Tensor):
        return get_forward_context().lora.stack(self.plain, self.python)(positions, x)


def install_lora_hooks(model: nn.Module) -> None:
    """Hook every fused linear of ``model``'s layers and wrap its layer stack (once; mutates
    ``model``). ValueError for a model whose layers lack those linears (MoE experts)."""
    if getattr(model, "_lora_hooked", False):
        return
    for i, layer in enumerate(model.layers):
        for parent, names in LORA_LINEARS.items():
            for name in names:
                linear = getattr(getattr(layer, parent), name, None)
                if linear is None:
                    raise ValueError(f"LoRA is not supported for {model.config.architecture} "
                                     f"(layer {i} has no {parent}.{name})")
                linear.register_forward_hook(_hook((i, name)))
    if model._stack is None:
        model._stack = NativeLayerStack.build(model)
    python = PythonLayerStack(model.layers)
    if isinstance(model._stack, NativeLayerStack):
        logger.warning("LoRA: steps with adapter rows run the Python layers with LoRA hooks "
                       "(the native one-call-per-layer stack has no LoRA); steps without "
                       "adapter rows keep the native stack")
    else:
        logger.info("LoRA: adapters applied by hooks on the Python layers")
    model._stack = LoraLayerStack(model._stack, python)
    model._lora_hooked = True


def _hook(key: tuple[int, str]):
    def hook(module: nn.Module, args: tuple, out: torch.Tensor):
        return get_forward_context().lora.apply(key, args[0], out)
    return hook

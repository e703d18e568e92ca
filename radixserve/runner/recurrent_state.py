"""The recurrent-state tensors of a hybrid model's layers, one row per state-pool slot
(core/kv/state_pool.py), and what a step does with them before its forward.

Per recurrent layer: ``conv`` ``[slots, K - 1, channels]`` (the causal conv's window of
inputs, the model's dtype) and, where the layout has one, ``ssm`` ``[slots, *state shape]``
(Gated DeltaNet's [value heads, key dim, value dim], Mamba2's [heads, head dim, state size];
float32 whatever the model's dtype: it accumulates over the whole sequence). The shapes come
from the model's ``RecurrentLayout`` (recurrent_params.py).
The layers read them from the forward context (``ForwardContext.states``: a `StepStates`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from radixserve.core.kv.recurrent_states import ZERO
from radixserve.core.sched_output import ScheduledSeq
from radixserve.model_config import ModelConfig


def bytes_per_slot(config: ModelConfig, dtype: torch.dtype) -> int:
    """One slot's memory over every recurrent layer."""
    la = config.linear_attn
    if la is None:
        return 0
    elem = torch.tensor([], dtype=dtype).element_size()
    conv = math.prod(la.conv_state_shape) * elem
    ssm = math.prod(la.ssm_state_shape) * 4 if la.ssm_state_shape is not None else 0
    return len(la.linear_layers) * (conv + ssm)


@dataclass(slots=True)
class StepStates:
    """A step's view of the states for the packed batch: sequence b (packed order) is rows
    ``cu_seqlens[b]:cu_seqlens[b + 1]`` with its state in slot ``slots[b]``; ``snapshots``
    rows ``(b, n, dst)``: copy b's state after its first n tokens of the step to slot dst
    (None: none)."""

    conv: dict[int, torch.Tensor]  # model layer index -> its conv windows
    ssm: dict[int, torch.Tensor]  # empty where the layout has no state beside the conv
    cu_seqlens: torch.Tensor
    slots: torch.Tensor
    snapshots: torch.Tensor | None


class StateTensors:
    """Every recurrent layer's states for ``num_slots`` slots."""

    def __init__(self, config: ModelConfig, num_slots: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        la = config.linear_attn
        assert la is not None, "a model without recurrent layers has no states"
        self.num_slots = num_slots
        # empty: a slot's pages are touched when first used (a fresh state is zeroed by
        # `step`, a snapshot written before it is read), so a generous pool costs nothing idle
        self.conv = {i: torch.empty(num_slots, *la.conv_state_shape, dtype=dtype,
                                    device=device) for i in la.linear_layers}
        ssm_shape = la.ssm_state_shape
        self.ssm = {} if ssm_shape is None else {
            i: torch.empty(num_slots, *ssm_shape, dtype=torch.float32, device=device)
            for i in la.linear_layers}
        self.device = device

    def step(self, seqs: list[ScheduledSeq], q_lens: list[int]) -> StepStates:
        """Apply each sequence's start (zero its slot, or copy a prefix hit's snapshot into
        it), then the step's view; ``seqs`` in packed order, ``q_lens`` their fed tokens.
        Raises AssertionError where a sequence has no state (every one must)."""
        for seq in seqs:
            state = seq.state
            assert state is not None, f"{seq.request_id} has no recurrent state slot"
            if state.init == ZERO:
                for t in (*self.conv.values(), *self.ssm.values()):
                    t[state.slot].zero_()
            elif state.init is not None:
                for t in (*self.conv.values(), *self.ssm.values()):
                    t[state.slot].copy_(t[state.init])
        cu = [0]
        for n in q_lens:
            cu.append(cu[-1] + n)
        snaps = [(b, *s.state.snapshot) for b, s in enumerate(seqs)
                 if s.state.snapshot is not None]
        snaps += [(b, 1 + i, slot) for b, s in enumerate(seqs)
                  for i, slot in enumerate(s.state.drafts)]  # a verify step's draft states
        dev = self.device
        return StepStates(self.conv, self.ssm, torch.tensor(cu, device=dev),
                          torch.tensor([s.state.slot for s in seqs], device=dev),
                          torch.tensor(snaps, device=dev) if snaps else None)

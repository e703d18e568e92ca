"""Gemma 4's per-layer inputs (E2B / E4B): each token adds to every layer's stream a small
input of its own, ``per_layer_dim`` wide, from two parts (transformers' ``get_per_layer_inputs``
and ``project_per_layer_inputs``):

    rows = table[token] * sqrt(dim)                        table [vocab, layers x dim]
    proj = norm(projection(embedding) * hidden ** -0.5)    per layer, RMS over dim
    per_layer_input = (proj + rows) * 2 ** -0.5            [T, layers, dim]

The table is the largest tensor of the small models (E2B: 262k x 35 x 256); only the step's
rows are read. Loaded as float32 from a bf16 checkpoint it is held in bfloat16 again
(``load_table_``: only where every value is bf16-exact, so nothing changes). The modules
sit on the model under transformers' names, so every loader (float, int8, 16-bit stored)
finds them by their checkpoint names.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.layers.embedding import empty_embedding
from radixserve.layers.norm import RMSNorm
from radixserve.model_config import ModelConfig


def add_per_layer_inputs(model: nn.Module, cfg: ModelConfig) -> None:
    """Give ``model`` the table, the projection and its norm (mutates ``model``)."""
    dim, width = cfg.gemma4.per_layer_dim, cfg.num_layers * cfg.gemma4.per_layer_dim
    model.embed_tokens_per_layer = empty_embedding(cfg.gemma4.per_layer_vocab, width)
    model.per_layer_model_projection = nn.Linear(cfg.hidden_size, width, bias=False)
    model.per_layer_projection_norm = RMSNorm(dim, cfg.rms_norm_eps)


def per_layer_inputs(model: nn.Module, input_ids: torch.Tensor,
                     embeds: torch.Tensor) -> torch.Tensor:
    """[T] token ids and their scaled embeddings [T, hidden] → [T, layers, dim]."""
    cfg = model.config
    shape = (input_ids.shape[0], cfg.num_layers, cfg.gemma4.per_layer_dim)
    rows = model.embed_tokens_per_layer(input_ids).to(embeds.dtype).view(shape)
    rows = rows * torch.tensor(shape[2] ** 0.5, dtype=embeds.dtype)
    proj = model.per_layer_model_projection(embeds) * cfg.hidden_size ** -0.5
    proj = model.per_layer_projection_norm(proj.view(shape))
    return (proj + rows) * 2.0 ** -0.5


def load_table_(table: nn.Embedding, loaded: torch.Tensor) -> None:
    """Make ``loaded`` (the checkpoint's table, as the loader converted it) ``table``'s weight,
    without copying it into the built one; in bfloat16 where that loses nothing (a bf16
    checkpoint loaded as float32): half the memory, the same rows."""
    weight = loaded
    if loaded.dtype == torch.float32:
        half = loaded.to(torch.bfloat16)
        # compared a slice of rows at a time: no second float copy of the whole table
        if all(torch.equal(half[i:i + _ROWS].float(), loaded[i:i + _ROWS])
               for i in range(0, loaded.shape[0], _ROWS)):
            weight = half
    table.weight = nn.Parameter(weight, requires_grad=False)


_ROWS = 4096

"""Embedding tables built empty: every model here is built on the meta device and then loaded,
so a random fill is wasted work, and on the meta device a costly one: ``nn.Embedding``'s
``reset_parameters`` calls ``normal_``, whose meta implementation (``torch._refs``) imports
``torch._dynamo`` on its first call, about 1 s of the engine's start-up (torch 2.13, measured
on the real 1.5B model: issue 63). ``nn.Linear``'s uniform fill has no such path.
"""

from __future__ import annotations

import torch
from torch import nn


def empty_embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """An ``nn.Embedding`` whose weight is ``torch.empty`` (on the current device: meta under
    ``with torch.device("meta")``), never randomly filled: its values must be loaded."""
    return nn.Embedding(num_embeddings, embedding_dim,
                        _weight=torch.empty(num_embeddings, embedding_dim))

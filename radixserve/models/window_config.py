"""Sliding-window attention from a config.json (Gemma's is in gemma_config.py), as transformers
applies it:

- Mistral, Mixtral, Phi-3: ``sliding_window`` on every layer (None or absent: no window).
- Qwen2, Qwen2-MoE: no window unless ``use_sliding_window``; then the layers ``layer_types``
  marks ``sliding_attention`` (config.json carries it from transformers 5 on), else by
  transformers' default rule: Qwen2 from layer ``max_window_layers`` on, Qwen2-MoE the even
  layers below ``max_window_layers`` (``configuration_qwen2_moe.py``).
"""

from __future__ import annotations

_EVERY_LAYER = ("MistralForCausalLM", "MixtralForCausalLM", "Phi3ForCausalLM")
_PER_LAYER = ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM")
_SLIDING, _FULL = "sliding_attention", "full_attention"


def hf_window_fields(cfg: dict, arch: str) -> dict:
    """``sliding_window`` and ``sliding_layers`` of ``ModelConfig`` for ``arch``'s config.json.
    ValueError for a ``layer_types`` that is not one known type per layer."""
    if arch in _EVERY_LAYER:
        return {"sliding_window": cfg.get("sliding_window") or None, "sliding_layers": None}
    window = cfg.get("sliding_window")
    if arch not in _PER_LAYER or not cfg.get("use_sliding_window") or not window:
        return {"sliding_window": None, "sliding_layers": None}
    num_layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or _default_types(arch, num_layers,
                                                     cfg.get("max_window_layers", 28))
    if len(types) != num_layers or set(types) - {_SLIDING, _FULL}:
        raise ValueError(f"unsupported layer_types {types}; supported: {num_layers} of "
                         f"{[_SLIDING, _FULL]}")
    return {"sliding_window": window, "sliding_layers": tuple(t == _SLIDING for t in types)}


def _default_types(arch: str, num_layers: int, max_window_layers: int) -> list[str]:
    if arch == "Qwen2ForCausalLM":
        return [_SLIDING if i >= max_window_layers else _FULL for i in range(num_layers)]
    return [_SLIDING if (i + 1) % 2 and i < max_window_layers else _FULL
            for i in range(num_layers)]

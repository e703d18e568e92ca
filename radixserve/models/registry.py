"""Model classes by architecture name (HF ``architectures`` or GGUF ``general.architecture``)."""

from __future__ import annotations

import importlib

_LLAMA = ("radixserve.models.llama", "LlamaForCausalLM")
_MOE = ("radixserve.models.moe", "MoeForCausalLM")
_GEMMA = ("radixserve.models.gemma", "GemmaForCausalLM")
_GRANITE = ("radixserve.models.granite", "GraniteForCausalLM")
_MODELS = {
    "Gemma2ForCausalLM": _GEMMA,
    "Gemma3ForCausalLM": _GEMMA,
    "Gemma3ForConditionalGeneration": _GEMMA,  # its text model (the vision tower: models/vision/)
    "Gemma4ForCausalLM": ("radixserve.models.gemma4", "Gemma4ForCausalLM"),  # shared KV, PLE
    "Gemma4ForConditionalGeneration": ("radixserve.models.gemma4", "Gemma4ForCausalLM"),
    "LlamaForCausalLM": _LLAMA,
    "SmolVLMForConditionalGeneration": _LLAMA,  # its text model (the vision tower: models/vision/)
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": _LLAMA,
    "Qwen2_5_VLForConditionalGeneration": _LLAMA,  # Qwen2 + mRoPE (the tower: models/vision/)
    "Qwen3ForCausalLM": _LLAMA,
    "Qwen3VLForConditionalGeneration": _LLAMA,  # Qwen3 + mRoPE (the tower: models/vision/)
    "Qwen2MoeForCausalLM": _MOE,  # a shared expert beside the routed ones
    "Qwen3MoeForCausalLM": _MOE,
    "MixtralForCausalLM": _MOE,
    "Phi3ForCausalLM": _LLAMA,  # q/k/v and gate/up stored fused; longrope, partial rotary
    "Qwen3_5ForCausalLM": ("radixserve.models.qwen35", "Qwen35ForCausalLM"),  # hybrid
    "Qwen3_5MoeForCausalLM": ("radixserve.models.qwen35", "Qwen35ForCausalLM"),  # hybrid MoE
    "Qwen3NextForCausalLM": ("radixserve.models.qwen3next", "Qwen3NextForCausalLM"),  # hybrid
    "GraniteForCausalLM": _GRANITE,  # Llama with multipliers
    "GraniteMoeForCausalLM": _GRANITE,
    "GraniteMoeSharedForCausalLM": _GRANITE,
    "GraniteMoeHybridForCausalLM": _GRANITE,  # Mamba2 + attention, MoE + shared MLP
    "SmolLM3ForCausalLM": ("radixserve.models.smollm3", "SmolLM3ForCausalLM"),  # NoPE layers
    "Olmo2ForCausalLM": ("radixserve.models.olmo2", "Olmo2ForCausalLM"),  # norms after
    "Olmo3ForCausalLM": ("radixserve.models.olmo2", "Olmo2ForCausalLM"),  # + sliding layers
    "Mistral3ForConditionalGeneration": ("radixserve.models.mistral3", "Mistral3ForCausalLM"),
    "Ministral3ForCausalLM": ("radixserve.models.mistral3", "Mistral3ForCausalLM"),
    "Lfm2ForCausalLM": ("radixserve.models.lfm2", "Lfm2ForCausalLM"),  # short conv + attention
    "Lfm2MoeForCausalLM": ("radixserve.models.lfm2", "Lfm2ForCausalLM"),
    "NemotronHForCausalLM": ("radixserve.models.nemotron_h", "NemotronHForCausalLM"),  # Mamba2
    "GptOssForCausalLM": ("radixserve.models.gpt_oss", "GptOssForCausalLM"),  # sinks, MoE
    # multi-head latent attention + DeepSeek-V3 MoE
    "Glm4MoeLiteForCausalLM": ("radixserve.models.deepseek2", "Deepseek2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("radixserve.models.deepseek2", "Deepseek2ForCausalLM"),
    "DeepseekV2ForCausalLM": ("radixserve.models.deepseek2", "Deepseek2ForCausalLM"),
}
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                      "olmo2": "Olmo2ForCausalLM", "mistral3": "Mistral3ForConditionalGeneration",
                      "qwen2": "Qwen2ForCausalLM",
                      "qwen2vl": "Qwen2_5_VLForConditionalGeneration",
                      "qwen2moe": "Qwen2MoeForCausalLM", "qwen3": "Qwen3ForCausalLM",
                      "qwen3vl": "Qwen3VLForConditionalGeneration",
                      "qwen3moe": "Qwen3MoeForCausalLM",
                      "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
                      "gemma3": "Gemma3ForCausalLM", "gemma4": "Gemma4ForCausalLM",
                      "qwen35": "Qwen3_5ForCausalLM",
                      "qwen35moe": "Qwen3_5MoeForCausalLM", "qwen3next": "Qwen3NextForCausalLM",
                      "granite": "GraniteForCausalLM",
                      "granitemoe": "GraniteMoeForCausalLM",
                      "granitehybrid": "GraniteMoeHybridForCausalLM", "lfm2": "Lfm2ForCausalLM",
                      "lfm2moe": "Lfm2MoeForCausalLM", "nemotron_h": "NemotronHForCausalLM",
                      "gpt-oss": "GptOssForCausalLM",
                      "nemotron_h_moe": "NemotronHForCausalLM",
                      "deepseek2": "DeepseekV3ForCausalLM"}  # GLM-4.7-Flash too: one model
# (a GGUF "llama" file with llama.expert_count > 0 is Mixtral: models/loader.py)


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str):
    if architecture not in _MODELS:
        raise ValueError(f"unsupported model architecture {architecture!r}; supported: "
                         f"{supported_architectures()} (GGUF: {sorted(GGUF_ARCHITECTURES)})")
    module, cls = _MODELS[architecture]
    return getattr(importlib.import_module(module), cls)

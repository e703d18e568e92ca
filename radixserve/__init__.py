"""radixserve: an LLM inference engine and OpenAI-compatible server in Python."""

from __future__ import annotations

from radixserve.sampling_params import SamplingParams
from radixserve.structured.params import StructuredOutputsParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name: str):
    # Lazy: importing radixserve (e.g. for SamplingParams) must not pull in torch.
    if name == "LLM":
        from radixserve.llm import LLM
        return LLM
    if name in ("RequestOutput", "CompletionOutput"):
        from radixserve import outputs
        return getattr(outputs, name)
    raise AttributeError(name)

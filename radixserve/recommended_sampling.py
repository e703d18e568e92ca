"""The sampling a GGUF recommends for its model: llama.cpp's ``general.sampling.*`` keys,
which model makers (Qwen, Gemma, Unsloth's quants) fill with the settings they publish.
Defaults only: the CLI's explicit flags win (`cli_args.sampling_params`)."""

from __future__ import annotations

import os

from radixserve.gguf_reader import open_gguf
from radixserve.models.default import default_model_path

# GGUF key -> SamplingParams field (penalty_last_n, xtc, mirostat: no counterpart here)
_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def recommended_sampling(model_path: str | None) -> dict[str, float | int]:
    """SamplingParams fields from the GGUF's ``general.sampling.*`` keys (empty for a
    Hugging Face folder, a GGUF without them, or a path that is not a file: loading it
    reports that). ``None``: the embedded model. ValueError for a file that is no GGUF."""
    path = default_model_path() if model_path is None else os.path.expanduser(model_path)
    if not os.path.isfile(path):
        return {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return {}
    fields = open_gguf(path).fields
    found: dict[str, float | int] = {}
    for key, name in _KEYS.items():
        field = fields.get(key)
        if field is not None:
            value = field.contents()
            found[name] = int(value) if name == "top_k" else float(value)
    return found

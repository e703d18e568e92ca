"""What Ollama's model routes (/api/tags, /api/show, /api/ps) say about the served model, read
once from its files: architecture, size, quantization, context, chat template."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass, field

_GGUF_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
                    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S",
                    15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


@dataclass(frozen=True)
class OllamaModelInfo:
    name: str  # as Ollama lists it: "<served name>:latest"
    format: str  # gguf | safetensors
    family: str
    size: int  # bytes of the model's files
    modified_at: str  # RFC 3339
    digest: str  # sha256 of the files' paths, sizes and times (an identifier, not a content hash)
    parameter_size: str = ""
    quantization_level: str = ""
    info: dict = field(default_factory=dict)  # /api/show's model_info

    def details(self) -> dict:
        return {"parent_model": "", "format": self.format, "family": self.family,
                "families": [self.family], "parameter_size": self.parameter_size,
                "quantization_level": self.quantization_level}

    def names(self) -> set[str]:
        """The names a request may use for this model."""
        return {self.name, self.name.removesuffix(":latest")}


def read_model_info(path: str | None, served_name: str, max_model_len: int) -> OllamaModelInfo:
    """``path``: the GGUF file or Hugging Face folder (None: nothing known beyond the name)."""
    name = served_name if ":" in served_name else f"{served_name}:latest"
    if path is None or not os.path.exists(path):
        return OllamaModelInfo(name, "unknown", "unknown", 0, _rfc3339(0), _digest([]))
    files = ([path] if os.path.isfile(path) else
             sorted(os.path.join(path, f) for f in os.listdir(path)
                    if os.path.isfile(os.path.join(path, f))))
    stats = [(f, os.stat(f)) for f in files]
    size = sum(s.st_size for _, s in stats)
    modified = _rfc3339(max(s.st_mtime for _, s in stats))
    digest = _digest([(f, s.st_size, s.st_mtime_ns) for f, s in stats])
    if os.path.isfile(path):
        family, params, quant, info = _gguf_facts(path)
        fmt = "gguf"
    else:
        family, params, quant, info = _hf_facts(path)
        fmt = "safetensors"
    info = {"general.architecture": family, f"{family}.context_length": max_model_len, **info}
    return OllamaModelInfo(name, fmt, family, size, modified, digest, params, quant, info)


def _gguf_facts(path: str) -> tuple[str, str, str, dict]:
    from radixserve.gguf_reader import open_gguf

    fields = open_gguf(path).fields

    def get(key, default=None):
        f = fields.get(key)
        return default if f is None else f.contents()

    arch = get("general.architecture", "unknown")
    file_type = get("general.file_type")
    quant = _GGUF_FILE_TYPES.get(file_type, "" if file_type is None else f"type {file_type}")
    info = {key: f.contents() for key, f in fields.items()
            if key.startswith(f"{arch}.") and not isinstance(f.contents(), list)}
    info["general.parameter_count"] = get("general.parameter_count")
    return arch, get("general.size_label", "") or "", quant, \
        {k: v for k, v in info.items() if v is not None}


def _hf_facts(folder: str) -> tuple[str, str, str, dict]:
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    family = config.get("model_type", "unknown")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "")
    info = {f"{family}.{k}": v for k, v in config.items()
            if isinstance(v, int | float | str) and not isinstance(v, bool)}
    return family, "", {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}.get(dtype, dtype), \
        info


def _rfc3339(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).isoformat()


def _digest(parts: list) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()
